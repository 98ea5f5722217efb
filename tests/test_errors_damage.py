"""No error is lost to a close that nobody checks.

A failed write or zero leaves its range *damaged* until a later request
over it succeeds (a rewrite, or a truncate's zeroing landing); a failed
NBD flush is damage until a flush succeeds; and the writes a server
acknowledged but no flush covered become damage when the daemon has to
reconnect (a volatile server may have restarted without them).  While any
damage is left, every close and every fsync of every handle of the raw
file and of the views fails, not only the first one to ask: a shell's
redirection and dd's dup2 make a close whose error nobody reads.

Here: the two cases that used to exit 0 with old bytes on the disk (cat
through a shell redirection, dd conv=sparse,fsync), repair by a rewrite
(the status and the daemon's exit 0 say so), EIO retried before it counts,
a failed zero forgotten by the known-zero map, two and three handles open
when a write, a zero and a flush fail (and the same with a view), and a
memory server restarted mid-copy.  Every copy is judged against the bytes
on the server."""

import hashlib
import os
import re
import time
from pathlib import Path

import pytest

from lib.digest import sha256_file
from lib.env import MiB
from lib.faults import judge, status_json
from lib.images import make_sparse_image, random_bytes, random_file
from lib.nbd import sha256_nbd
from lib.procs import run
from lib.servers import plugin_path

EXPORT = 16 * MiB
IMAGE = 4 * MiB


def touch(p):
    Path(p).write_bytes(b"")


def error_disk(server, shm, flag, *errargs, delay=None):
    """A file server over random bytes with nbdkit's error filter armed by
    flag (created now)."""
    disk = random_file(shm / "disk.img", EXPORT)
    filters = ["error"] + (["delay"] if delay else [])
    args = list(errargs) + ([f"wdelay={delay}", f"delay-zero={delay}"]
                            if delay else [])
    srv = server("file", disk, *args, filters=filters)
    touch(flag)
    srv.disk = disk
    return srv


def zero_fails(server, shm, flag, **kw):
    return error_disk(server, shm, flag, "error-zero=EIO",
                      "error-zero-rate=100%", f"error-zero-file={flag}", **kw)


def write_fails(server, shm, flag, **kw):
    return error_disk(server, shm, flag, "error-pwrite=EIO",
                      "error-pwrite-rate=100%", f"error-pwrite-file={flag}",
                      **kw)


def flush_fails(server, shm, flag, once=False):
    """tests/nbdkit-plugins/flushfail.c over random bytes: while flag
    exists every flush fails (once: the first write and zero at each
    offset fail, and every other flush)."""
    disk = random_file(shm / "disk.img", EXPORT)
    srv = server(plugin_path("flushfail"), f"file={disk}", f"flag={flag}",
                 *(["fail-once=1"] if once else []))
    touch(flag)
    srv.disk = disk
    return srv


def sparse_image(shm, size=IMAGE):
    return make_sparse_image(shm / "src.img", size,
                             [(0, 300_000), (1 * MiB, 200_000),
                              (3 * MiB, size - 3 * MiB)], seed=7)


def sh(cmd):
    return run(["sh", "-c", cmd], timeout=120)


def damage(m):
    st = status_json(m)
    assert st is not None, "no status"
    return st["damage"], st


# ------------------------------------------ the two cases of the old bug

@pytest.mark.parametrize("transient", [False, True],
                         ids=["permanent", "transient"])
def test_cat_redirect_zeroing_fails(server, mount, shm, shortdir, tally,
                                    transient):
    """`sh -c 'cat disk.img > MNT/nbd'`: the shell's O_TRUNC schedules
    zeroing of the old disk, its close (after dup2) drains it and ignores
    the failure; cat's own close must fail too, since the bytes past the
    image still hold the old data.  Transient: the zeroing fails while
    the flag exists, and nothing zeroes those bytes again."""
    flag = shortdir / "zero.flag"
    srv = zero_fails(server, shm, flag)
    m = mount(srv, expect_rc=1, expect_errors=True)
    img = sparse_image(shm)
    if transient:
        # The shell's close after its dup2 drains the zeroing, which
        # fails; the flag goes before cat writes: nothing fails after.
        r = sh(f"{{ rm -f {flag}; cat {img.path}; }} > {m.file}")
    else:
        r = sh(f"cat {img.path} > {m.file}")
    flag.unlink(missing_ok=True)
    want = sha256_file(img.path, pad_to=EXPORT)
    out = judge(tally, f"cat-redirect-zero-{'t' if transient else 'p'}",
                r.returncode, want, sha256_file(srv.disk), None, r.stderr)
    assert out == "loud", "the zeroing failed: the disk cannot be exact"
    d, st = damage(m)
    assert d["unrepaired"] and d["bytes"] >= EXPORT - IMAGE, d
    assert any(f.get("kind") == "zero" and not f["repaired"]
               for f in st["failures"]), st["failures"]
    assert "digest" in st and st["digest"]["state"] != "complete"
    m.unmount()                                  # expect_rc=1
    assert re.search(r"were not repaired", m.stderr), m.stderr


def test_dd_sparse_fsync_zeroing_fails(server, mount, shm, shortdir, tally):
    """dd conv=sparse,fsync with every write-zeroes failing: the failure
    reaches dd's first close (the dup2), which dd ignores; its fsync and
    its last close must fail as well: the holes keep old data."""
    flag = shortdir / "zero.flag"
    srv = zero_fails(server, shm, flag)
    m = mount(srv, expect_rc=1, expect_errors=True)
    img = sparse_image(shm)
    r = run(["dd", f"if={img.path}", f"of={m.file}", "bs=64k",
             "conv=sparse,fsync", "status=none"], timeout=120)
    flag.unlink()
    out = judge(tally, "dd-sparse-fsync-zero", r.returncode,
                sha256_file(img.path, pad_to=EXPORT), sha256_file(srv.disk),
                None, r.stderr)
    assert out == "loud", r.stderr


# ------------------------------------------------------------- repair

def test_rewrite_repairs(server, mount, shm, shortdir, tally):
    """A copy fails while the zeroing fails; the same copy made again once
    the server works lands, exits 0, and repairs: the status marks each
    failure repaired, the damage is empty, every close succeeds again and
    the daemon exits 0 with a notice, not an error."""
    flag = shortdir / "zero.flag"
    srv = zero_fails(server, shm, flag)
    m = mount(srv, expect_rc=0, expect_errors=True)
    img = sparse_image(shm)
    r = sh(f"cat {img.path} > {m.file}")
    assert r.returncode != 0, "cat exited 0 with the zeroing failing"
    d, _ = damage(m)
    assert d["unrepaired"], d
    # Still failed: a later close that changes nothing fails too.
    fd = os.open(m.file, os.O_RDONLY)
    with pytest.raises(OSError) as ei:
        os.close(fd)
    assert ei.value.errno == 5
    flag.unlink()
    r = sh(f"cat {img.path} > {m.file}")
    want = sha256_file(img.path, pad_to=EXPORT)
    out = judge(tally, "rewrite-repairs", r.returncode, want,
                sha256_file(srv.disk), None, r.stderr)
    assert out == "match", r.stderr
    d, st = damage(m)
    assert not d["unrepaired"] and d["bytes"] == 0 and d["repaired"] > 0, d
    nbd = [f for f in st["failures"] if "offset" in f]
    assert nbd and all(f["repaired"] and "repaired_time" in f for f in nbd)
    m.unmount()
    assert re.search(r"notice: .*written again successfully", m.stderr), \
        m.stderr


def test_failed_zero_leaves_known_zero(server, mount, shm, shortdir, tally):
    """The zero requests of a truncate join the known-zero map when they
    are queued; a failed one must leave it, or the next truncate would
    skip the zeroing that is needed now."""
    flag = shortdir / "zero.flag"
    srv = zero_fails(server, shm, flag)
    m = mount(srv, expect_rc=0, expect_errors=True)
    fd = os.open(m.file, os.O_WRONLY | os.O_TRUNC)
    assert errno_of(os.close, fd) == 5, "the zeroing failed, close said 0"
    flag.unlink()
    fd = os.open(m.file, os.O_WRONLY | os.O_TRUNC)
    assert errno_of(os.close, fd) == 0
    assert sha256_file(srv.disk) == sha256_file(srv.disk, length=0,
                                                pad_to=EXPORT), \
        "the second truncate skipped zeroing what the first failed to"
    assert not damage(m)[0]["unrepaired"]


# ------------------------------------------------------------- retries

def test_eio_retried_leaves_the_file_healthy(server, mount, shm, shortdir,
                                             tally):
    """The first write and zero at each offset fail with EIO, and every
    other flush: each is sent again and succeeds, so the copy exits 0,
    the bytes are right, no failure is recorded and the daemon exits 0."""
    flag = shortdir / "once.flag"
    srv = flush_fails(server, shm, flag, once=True)
    m = mount(srv, "--request-size", "256K", expect_rc=0, expect_errors=True)
    img = sparse_image(shm)
    r = run(["dd", f"if={img.path}", f"of={m.file}", "bs=64k",
             "conv=sparse,fsync", "status=none"], timeout=120)
    out = judge(tally, "eio-retried", r.returncode,
                sha256_file(img.path, pad_to=EXPORT), sha256_file(srv.disk),
                None, r.stderr)
    assert out == "match", f"{r.stderr}\n{m.stderr}"
    st = status_json(m)
    assert st["damage"]["unrepaired"] is False
    assert not [f for f in st["failures"] if "offset" in f], st["failures"]
    m.unmount()
    text = m.stderr
    assert re.search(r"write of \d+ bytes at offset \d+ failed: .*sending it "
                     r"again", text), text
    assert re.search(r"zero of \d+ bytes .*sending it again", text), text
    assert re.search(r"flush failed: .*sending it again", text), text


# ------------------------------------------------ every handle is told

def handles(m, view=None):
    """A writer, a reader and a handle that only fsyncs, of the raw file
    (or of view for the reader and the fsync-only handle)."""
    other = Path(m.mp) / view if view else m.file
    w = os.open(m.file, os.O_WRONLY)
    r = os.open(other, os.O_RDONLY)
    s = os.open(other, os.O_RDONLY)
    return w, r, s


def errno_of(fn, *a):
    try:
        fn(*a)
        return 0
    except OSError as e:
        return e.errno


@pytest.mark.parametrize("view", [None, "nbd.vhd"], ids=["raw", "vhd-view"])
@pytest.mark.parametrize("kind", ["write", "zero", "flush"])
def test_every_handle_is_told(server, mount, shm, shortdir, kind, view):
    """Three handles open (a writer, a reader, one that only fsyncs; with
    a view, the reader and the fsync-only handle are of nbd.vhd) when a
    write, a zero or a flush fails.  What each is told:
      - the writer: its fsync fails (EIO), and again at each later fsync;
      - the fsync-only handle: every fsync fails, although it wrote
        nothing, the first as well as the second;
      - the reader: its reads work (they read the server; of a view:
        they fail, the disk changed since its open), its close fails;
      - a handle opened after the failure: its close fails too;
    until the range is written again successfully: then every fsync and
    close succeeds again and the daemon exits 0; but a handle that was
    open at the failure and not told before the repair is told once."""
    flag = shortdir / "flag"
    srv = {"write": write_fails, "zero": zero_fails,
           "flush": lambda *a: flush_fails(*a)}[kind](server, shm, flag)
    m = mount(srv, expect_rc=0, expect_errors=True)
    fds = handles(m, view)
    try:
        told_and_repaired(m, srv, flag, kind, *fds, view=view)
    finally:
        for fd in fds:
            errno_of(os.close, fd)              # EBADF: closed already
    m.unmount()


def told_and_repaired(m, srv, flag, kind, w, r, s, view=None):
    data = random_bytes(256 << 10)
    # A fourth handle, open when the request fails and left alone until
    # the damage is repaired: it is still told, once (errseq), however
    # often the other handles were told meanwhile.
    q = os.open(m.file, os.O_RDONLY)
    if kind == "zero":
        os.ftruncate(w, 0)                      # pending zeroes: all of it
        os.ftruncate(w, EXPORT)
    else:
        os.pwrite(w, data, MiB)
    assert errno_of(os.fsync, w) == 5, "writer's fsync"
    assert errno_of(os.fsync, w) == 5, "writer's second fsync"
    assert errno_of(os.fsync, s) == 5, "fsync-only handle"
    assert errno_of(os.fsync, s) == 5, "fsync-only handle, again"
    if view:
        # A view reads the disk as it was at its open, or fails: the raw
        # file was changed since (the failed write or truncate began).
        assert errno_of(os.pread, r, 4096, 0) == 5, "a view read after a change"
    else:
        assert len(os.pread(r, 4096, 0)) == 4096, "reads go on"
    assert errno_of(os.close, r) == 5, "reader's close"
    late = os.open(m.file, os.O_RDONLY)
    assert errno_of(os.close, late) == 5, "a later handle's close"
    d, _ = damage(m)
    assert d["unrepaired"] and (d["flush_failed"] if kind == "flush"
                                else d["bytes"] > 0), d
    # Repair: the server works again, the range is written again.  The
    # writer is told first of the failures since it was last told (the
    # fsync-only handle's flushes failed after): until then its writes
    # fail at once.
    flag.unlink()
    errno_of(os.fsync, w)
    if kind == "zero":
        os.ftruncate(w, 0)
        os.ftruncate(w, EXPORT)
    else:
        os.pwrite(w, data, MiB)
    assert errno_of(os.fsync, w) == 0, "writer's fsync after the repair"
    assert errno_of(os.fsync, s) == 0, "fsync-only after the repair"
    assert errno_of(os.close, s) == 0
    assert errno_of(os.close, w) == 0
    assert errno_of(os.fsync, q) == 5, "a handle not told yet, after the repair"
    assert errno_of(os.fsync, q) == 0, "... told once"
    assert errno_of(os.close, q) == 0
    assert not damage(m)[0]["unrepaired"]
    with open(srv.disk, "rb") as f:
        if kind == "zero":
            assert f.read() == bytes(EXPORT)
        else:
            f.seek(MiB)
            assert f.read(len(data)) == data


# ------------------------------------- a volatile server restarted mid-copy

def test_memory_server_restarted_mid_copy(kit, mount, shm, bg, tally):
    """nbdkit memory killed and restarted within the retry window while
    dd conv=fsync copies: the writes it acknowledged before the kill and
    no flush covered are gone with it, but the daemon kept them and sends
    them again: dd exits 0, the server holds the source, the status
    counts the bytes resent, the digest is complete and the daemon exits
    0.  (Before the resend this copy failed, every such write counted as
    lost.)  Had a flush come before the kill (the 10 s clock on a loaded
    machine), what it covered is gone for good: then the copy must fail
    loudly (tests/test_restart_resend.py tests that case on purpose).

    dd reads a FIFO the test feeds, so the kill lands mid-copy however
    loaded the machine is: half the image, then (once some of it has been
    acknowledged) the kill and restart, then the rest."""
    size = 32 * MiB
    k = kit("mem", ["--filter=delay", "memory", f"size={size}", "wdelay=2ms"])
    m = mount(k.target, "--request-size", "256K", expect_rc=None,
              expect_errors=True)
    src = random_file(shm / "src.img", 24 * MiB)
    data = src.read_bytes()
    fifo = shm / "feed"
    os.mkfifo(fifo)
    cp = bg(["dd", f"if={fifo}", f"of={m.file}", "bs=256k", "iflag=fullblock",
             "conv=fsync"], shm / "cp.err")
    feed = open(fifo, "wb")
    before = None
    try:
        feed.write(data[:12 * MiB])
        feed.flush()
        deadline = time.monotonic() + 60
        while (status_json(m) or {}).get("bytes_acknowledged", 0) < 4 * MiB:
            assert time.monotonic() < deadline, status_json(m)
            time.sleep(0.01)
        before = status_json(m)
        k.kill()
        time.sleep(0.5)
        k.start()
        feed.write(data[12 * MiB:])
        feed.close()
    except BrokenPipeError:
        pass              # dd stopped at a failed write: loud, as it must
    finally:
        try:
            feed.close()
        except OSError:
            pass
    rc = cp.wait(120)
    out = judge(tally, "memory-restarted", rc,
                sha256_file(src, pad_to=size), sha256_nbd(k.uri), None,
                cp.stderr)
    st = status_json(m)
    if before["nbd_requests"]["flush"] or before["pool_flushes"]:
        assert out == "loud", "flushed data lost, and dd exited 0"
        assert st["damage"]["unrepaired"], st["damage"]
        assert st["digest"]["state"] != "complete", st["digest"]
        return
    assert out == "match", f"the resend did not repair\n{m.stderr}"
    assert st["bytes_resent"] >= 4 * MiB, st
    assert not st["damage"]["unrepaired"], st["damage"]
    assert st["digest"]["state"] == "complete", st["digest"]
    assert m.unmount() == 0, m.stderr
    assert not re.search(r"may be lost", m.stderr), m.stderr


def copy_through_restart(k, m, shm, bg, src):
    """dd conv=fsync of src from a FIFO; once 4 MiB were acknowledged,
    the server is killed and started again; then the rest.  Returns dd's
    exit status."""
    data = src.read_bytes()
    fifo = shm / "feed2"
    os.mkfifo(fifo)
    cp = bg(["dd", f"if={fifo}", f"of={m.file}", "bs=256k", "iflag=fullblock",
             "conv=fsync"], shm / "cp2.err")
    feed = open(fifo, "wb")
    try:
        feed.write(data[:12 * MiB])
        feed.flush()
        deadline = time.monotonic() + 60
        while (status_json(m) or {}).get("bytes_acknowledged", 0) < 4 * MiB:
            assert time.monotonic() < deadline, status_json(m)
            time.sleep(0.01)
        k.kill()
        time.sleep(0.5)
        k.start()
        feed.write(data[12 * MiB:])
    except BrokenPipeError:
        pass                  # dd stopped at a failed write
    finally:
        try:
            feed.close()
        except OSError:
            pass
    return cp.wait(120)


def test_lost_writes_forgiven_when_the_readback_finds_them(kit, mount, shm,
                                                           bg):
    """A persistent server that offers no NBD flush (the flushfail test
    plugin, no-flush=1), restarted mid-copy: no flush can ever cover a
    write, so nothing is kept to resend and the writes it acknowledged
    before the restart are counted lost (NBD cannot tell it from a RAM
    disk), so dd fails; with --verify-readback the unmount reads the disk
    back, finds every byte written and exits 0."""
    disk = shm / "disk.img"
    with open(disk, "wb") as f:
        f.truncate(32 * MiB)
    k = kit("file", ["--filter=delay", plugin_path("flushfail"),
                     f"file={disk}", f"flag={shm / 'never'}", "no-flush=1",
                     "wdelay=2ms"])
    m = mount(k.target, "--request-size", "256K", "--verify-readback=unmount",
              expect_rc=0, expect_errors=True)
    src = random_file(shm / "src.img", 24 * MiB)
    rc = copy_through_restart(k, m, shm, bg, src)
    assert rc != 0, "dd did not see the writes counted lost"
    size = os.stat(m.file).st_size
    assert m.unmount() == 0, m.stderr
    assert re.search(r"the read-back found every byte written on the disk",
                     m.stderr), m.stderr
    assert disk.read_bytes()[:size] == src.read_bytes()[:size]


def test_lost_writes_not_forgiven_when_the_readback_misses_them(kit, mount,
                                                                 shm, bg):
    """nbdkit memory restarted mid-copy after flushes (a 2 MiB pool
    flushes every MiB) really loses what they covered: no resend can
    bring it back, the copy fails, the read-back at unmount says so and
    the daemon exits 1."""
    k = kit("mem", ["--filter=delay", "memory", f"size={32 * MiB}",
                    "wdelay=2ms"])
    m = mount(k.target, "--request-size", "256K", "--pool-size", "2M",
              "--verify-readback=unmount", expect_rc=1, expect_errors=True)
    src = random_file(shm / "src.img", 24 * MiB)
    assert copy_through_restart(k, m, shm, bg, src) != 0
    assert m.unmount() == 1
    assert re.search(r"read-back: the disk does not hold what was written",
                     m.stderr), m.stderr


@pytest.mark.parametrize("qemu_opts", [[], ["-W"]])
def test_qemu_img_last_write_carries_the_failure(server, mount, shm,
                                                  shortdir, tally, qemu_opts):
    """qemu-img convert never fsyncs its output (cache mode "unsafe") and
    ignores close()'s error: when its writes are all accepted before the
    server's first failure comes back (writes take 1.5 s here, the copy a
    fraction of that), the reply to the write that ends the copy is where
    the failure must show.  qemu-img must exit non-zero."""
    flag = shortdir / "fail"
    srv = write_fails(server, shm, flag, delay="1500ms")
    m = mount(srv, expect_rc=1, expect_errors=True)
    src = random_file(shm / "src.img", 6 * MiB)
    r = run(["qemu-img", "convert", "-n", *qemu_opts, "-f", "raw", "-O",
             "raw", str(src), str(m.file)], timeout=120)
    with open(srv.disk, "rb") as f:
        landed = hashlib.sha256(f.read(src.stat().st_size)).hexdigest()
    judge(tally, "qemu-img-last-write", r.returncode, sha256_file(src),
          landed, None, r.stderr)
    assert r.returncode != 0, "qemu-img exited 0 over writes that failed"
