"""Fault-injection suite: real nbdkit filters between the
daemon and a file-backed disk of old random bytes.

For every case the copy tool's exit status is judged against the bytes on
the server (lib.faults.judge): exit 0 with different bytes is silent
corruption and fails the test; every outcome is tallied in
tests/.fault-summary.  Error injection uses the error filter's per-request
rates; an error-file flag turns injection on, so the verification reads
afterwards (direct from the server) see no injected errors.

Write errors reach the copy tool (the last section): nbdkit's error
filter fails NBD writes (and write-zeroes) on an export of its own.  A
failed write reaches the tool as a failing write, close or fsync, so the
tool exits non-zero; whenever a tool exits 0, the server holds exactly
the source's bytes; a dead server gives an error, not a hang.  The
daemon's own exit code and stderr are not judged there beyond "it
exits" (errors are expected), except that it must log the failure."""

import errno
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from lib.content import assert_content
from lib.digest import sha256_bytes, sha256_file
from lib.env import SANITIZER, MiB, daemon_has_option, timeout
from lib.faults import (flushfail_server, judge, lost_ranges, sha256_mount,
                        sha256_prefix, status_json, wait_progress,
                        written_bytes)
from lib.images import make_sparse_image, random_bytes, random_file
from lib.mounts import RssSampler
from lib.nbd import fill_random, read_nbd
from lib.procs import run, tail
from lib.servers import PauseControl

EXPORT = 32 * MiB
SRC = 16 * MiB


def touch(p):
    Path(p).write_bytes(b"")


def error_server(server, shm, flag, *errargs, filters=("error",),
                 disk_size=EXPORT):
    """A file server with the error filter armed by flag (created now)."""
    disk = random_file(shm / "disk.img", disk_size)
    srv = server("file", disk, *errargs, f"error-file={flag}",
                 filters=list(filters))
    touch(flag)
    srv.disk = disk
    return srv


TOOLS = {
    "cp": lambda s, d: ["cp", s, d],
    "dd-64k-fsync": lambda s, d: ["dd", f"if={s}", f"of={d}", "bs=64k",
                                  "conv=fsync", "status=none"],
    "cp-sparse": lambda s, d: ["cp", "--sparse=always", s, d],
}


def copy_and_judge(tally, case, srv, m, src, tool, flag):
    r = run(TOOLS[tool](src, m.file), timeout=180)
    Path(flag).unlink(missing_ok=True)            # stop injecting
    n = os.path.getsize(src)
    out = judge(tally, case, r.returncode, src, sha256_prefix(srv.disk, n),
                sha256_mount(m.file, n) if r.returncode == 0 else None,
                r.stderr)
    if out == "loud":
        assert r.stderr.strip(), f"{tool} failed without a message"
    return out, r


# ------------------------------------------------------------ error rates

@pytest.mark.parametrize("rate", ["2%", "20%", "100%"])
@pytest.mark.parametrize("tool", ["cp", "dd-64k-fsync"])
def test_fault_pwrite_rate(server, mount, shm, shortdir, tally, rate, tool):
    flag = shortdir / "inject"
    srv = error_server(server, shm, flag, "error-pwrite=EIO",
                       f"error-pwrite-rate={rate}")
    m = mount(srv, "--request-size", "256K", expect_rc=None,
              expect_errors=True)
    src = random_file(shm / "src.img", SRC)
    out, r = copy_and_judge(tally, f"pwrite-{rate}-{tool}", srv, m, src,
                            tool, flag)
    if rate == "100%":
        assert out == "loud"
    if out == "loud":
        assert lost_ranges(m.stderr), m.stderr
        st = status_json(m)
        assert st is None or st.get("errors", 1) > 0, st


@pytest.mark.parametrize("rate", ["10%", "100%"])
def test_fault_zero_rate(server, mount, shm, shortdir, tally, rate):
    """cp --sparse=always of a sparse image onto a disk of random bytes:
    the holes become write-zeroes, which fail at rate."""
    flag = shortdir / "inject"
    srv = error_server(server, shm, flag, "error-zero=EIO",
                       f"error-zero-rate={rate}", "error-trim=EIO",
                       f"error-trim-rate={rate}")
    m = mount(srv, "--request-size", "256K", expect_rc=None,
              expect_errors=True)
    img = make_sparse_image(shm / "sparse.img", SRC, 24, seed=7)
    out, r = copy_and_judge(tally, f"zero-{rate}", srv, m, img.path,
                            "cp-sparse", flag)
    if rate == "100%":
        assert out == "loud", "every write-zeroes failed, cp exited 0"


@pytest.mark.parametrize("rate", ["50%", "100%"])
@pytest.mark.parametrize("tool", ["cp", "dd-64k-fsync"])
def test_fault_flush_rate(server, mount, shm, shortdir, tally, rate, tool):
    """NBD flush fails (a cc plugin: the error filter of nbdkit 1.32
    cannot fail flush): fsync (dd conv=fsync) reports it; cp (no fsync)
    may succeed, then the bytes must be there, and the daemon's final
    flush at unmount fails: exit 1."""
    flag = shortdir / "inject"
    disk = random_file(shm / "disk.img", EXPORT)
    srv = flushfail_server(server, shortdir, disk, flag, rate.rstrip("%"))
    m = mount(srv, expect_rc=None, expect_errors=True)
    src = random_file(shm / "src.img", SRC)
    touch(flag)
    r = run(TOOLS[tool](src, m.file), timeout=180)
    n = SRC
    out = judge(tally, f"flush-{rate}-{tool}", r.returncode, src,
                sha256_prefix(srv.disk, n),
                sha256_mount(m.file, n) if r.returncode == 0 else None,
                r.stderr)
    if rate == "100%" and tool.endswith("fsync"):
        assert out == "loud", "fsync succeeded although every flush failed"
    if rate == "100%":
        rc = m.unmount(check=False)           # final flush fails too
        m.checked = True
        assert rc == 1, f"daemon exited {rc} after its final flush failed"
    Path(flag).unlink(missing_ok=True)


@pytest.mark.parametrize("rate", ["5%", "50%"])
def test_fault_pread_rate(server, mount, shm, shortdir, tally, rate):
    """Copying the disk out while reads fail: cp fails or the copy is the
    disk, byte for byte."""
    flag = shortdir / "inject"
    srv = error_server(server, shm, flag, "error-pread=EIO",
                       f"error-pread-rate={rate}")
    m = mount(srv, expect_rc=None, expect_errors=True)
    out_img = shm / "out.img"
    r = run(["cp", m.file, out_img], timeout=180)
    flag.unlink()
    judge(tally, f"pread-{rate}", r.returncode, sha256_file(srv.disk),
          sha256_file(out_img) if out_img.exists() else "missing", None,
          r.stderr)
    if rate == "50%":
        assert r.returncode != 0


def test_fault_error_file_toggled_mid_copy(server, mount, shm, shortdir,
                                           bg, tally):
    """Writes start failing in the middle of a copy and stop again: that
    copy fails loudly (or, if no failing request hit it, matches); a copy
    made afterwards through a new open succeeds."""
    flag = shortdir / "inject"
    srv = error_server(server, shm, flag, "error-pwrite=EIO",
                       "error-pwrite-rate=100%", "error-zero=EIO",
                       "error-zero-rate=100%", "wdelay=2ms",
                       filters=("error", "delay"))
    flag.unlink()                                   # off at first
    m = mount(srv, "--request-size", "256K", expect_rc=None,
              expect_errors=True)
    src = random_file(shm / "src.img", SRC)
    cp = bg(["dd", f"if={src}", f"of={m.file}", "bs=256k", "conv=fsync"],
            shm / "cp.err")
    wait_progress(cp, written_bytes, 4 * MiB)
    touch(flag)
    time.sleep(0.3)
    flag.unlink()
    rc = cp.wait(120)
    judge(tally, "error-file-toggled", rc, src, sha256_prefix(srv.disk, SRC),
          sha256_mount(m.file, SRC) if rc == 0 else None, cp.stderr)
    # The fault is over: a fresh copy must work and land.
    src2 = random_file(shm / "src2.img", SRC)
    r = run(["dd", f"if={src2}", f"of={m.file}", "bs=1M", "conv=fsync",
             "status=none"], timeout=120)
    out = judge(tally, "after-toggle", r.returncode, src2,
                sha256_prefix(srv.disk, SRC), sha256_mount(m.file, SRC),
                r.stderr)
    assert out == "match", f"copy after the fault ended failed: {r.stderr}"


# ----------------------------------------------------------- pause, slow

def test_fault_pause_then_resume(server, mount, shm, shortdir, bg, tally):
    """The pause filter freezes the server mid-copy: writers wait (the
    pool is full), nothing fails; after resume the copy completes with
    the right bytes."""
    ctl = shortdir / "pause.ctl"
    disk = random_file(shm / "disk.img", EXPORT)
    srv = server("file", disk, f"pause-control={ctl}", "wdelay=1ms",
                 filters=["pause", "delay"])
    m = mount(srv, "--pool-size", "4M", "--request-size", "256K")
    src = random_file(shm / "src.img", SRC)
    # dd reads a pipe fed half first, the rest only once the pause holds:
    # it cannot finish before the server is frozen, however late a loaded
    # machine runs this thread (it once finished all 16 MiB between the
    # 2 MiB mark and the pause).
    fifo = shm / "src.fifo"
    os.mkfifo(fifo)
    cp = bg(["dd", f"if={fifo}", f"of={m.file}", "bs=1M", "iflag=fullblock",
             "conv=fsync"], shm / "cp.err")
    data = src.read_bytes()
    rest = threading.Event()

    def feed():
        try:
            with open(fifo, "wb") as f:
                f.write(data[:SRC // 2])
                f.flush()
                rest.wait()
                f.write(data[SRC // 2:])
        except BrokenPipeError:
            pass                                   # dd gone: the test fails
    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    wait_progress(cp, written_bytes, 2 * MiB)
    pc = PauseControl(ctl)
    with pc:
        rest.set()
        time.sleep(2)
        st = status_json(m)                        # readable while frozen
        assert cp.poll() is None, "dd finished while the server was paused"
    rc = cp.wait(120)
    feeder.join(timeout(60))
    out = judge(tally, "pause-resume", rc, src, sha256_prefix(disk, SRC),
                sha256_mount(m.file, SRC), cp.stderr)
    assert out == "match", cp.stderr
    assert st is None or isinstance(st, dict)


def test_fault_slow_server_tiny_pool_memory_bounded(server, mount, shm,
                                                    tally):
    """A slow server and a 1 MiB pool: copying 96 MiB must not grow the
    daemon's peak RSS (VmHWM) by more than the pool plus a fixed slack."""
    disk = shm / "disk.img"
    with open(disk, "wb") as f:
        f.truncate(128 * MiB)
    srv = server("file", disk, "wdelay=3ms", filters=["delay"])
    m = mount(srv, "--pool-size", "1M", "--request-size", "256K",
              "--no-digest")
    base_rss, base_hwm = m.rss()
    src = random_file(shm / "src.img", 96 * MiB)
    with RssSampler(m) as s:
        r = run(["cp", src, m.file], timeout=300)
    rss, hwm = m.rss()
    judge(tally, "slow-tiny-pool", r.returncode, src,
          sha256_prefix(disk, 96 * MiB), sha256_mount(m.file, 96 * MiB),
          r.stderr)
    assert r.returncode == 0, r.stderr
    growth = hwm - base_hwm
    print(f"VmHWM {base_hwm >> 20} -> {hwm >> 20} MiB (peak VmRSS sampled "
          f"{s.peak >> 20} MiB) copying 96 MiB through a 1 MiB pool")
    # 5 MiB measured in a plain build.  ASan keeps freed memory in its
    # quarantine and gives every thread fake stacks (13-28 MiB measured on
    # a loaded machine): its own memory, not the daemon's, so more slack;
    # a buffer per request (96 MiB) is far outside either bound.
    bound = (48 if SANITIZER == "address" else 24) * MiB
    assert growth < bound, (f"peak RSS grew by {growth >> 20} MiB copying "
                            "96 MiB through a 1 MiB pool")


# ------------------------------------------------ stopping during a copy

def dd_bytes_out(stderr, bs):
    """dd's 'N+M records out' (full records) times bs."""
    import re
    m = re.search(r"(\d+)\+(\d+) records out", stderr)
    return int(m.group(1)) * bs if m else 0


def test_fault_sigterm_during_copy(server, mount, shm, tally):
    """SIGTERM while a writer is busy: the daemon unmounts, drains and
    flushes what it accepted, and exits 0; the writer's next write fails;
    every byte a write() accepted is on the server."""
    disk = random_file(shm / "disk.img", 64 * MiB)
    srv = server("file", disk, "wdelay=3ms", filters=["delay"])
    m = mount(srv, "--request-size", "256K", expect_rc=0,
              expect_errors=False)
    src = random_bytes(48 * MiB)
    box = {"n": 0, "err": None}

    def writer():
        fd = os.open(m.file, os.O_WRONLY)
        try:
            for off in range(0, len(src), 64 * 1024):
                os.pwrite(fd, src[off:off + 64 * 1024], off)
                box["n"] = off + 64 * 1024
        except OSError as e:
            box["err"] = e
        try:
            os.close(fd)
        except OSError as e:
            box["close"] = e
    t = threading.Thread(target=writer, daemon=True)
    t.start()
    deadline = time.monotonic() + timeout(60)
    while box["n"] < 8 * MiB and t.is_alive() and \
            time.monotonic() < deadline:
        time.sleep(0.02)
    assert t.is_alive(), "the writer finished before SIGTERM"
    m.terminate(signal.SIGTERM, check=True)
    t.join(timeout(60))
    assert not t.is_alive(), "the writer hung after the daemon stopped"
    n = box["n"]
    rc = 0 if box["err"] is None and "close" not in box else 1
    judge(tally, "sigterm", rc, sha256_bytes(src),
          sha256_prefix(disk, len(src)), None, str(box))
    assert box["err"] is not None, "every write succeeded after SIGTERM?"
    # Drained and flushed: everything write() accepted is on the disk.
    assert sha256_prefix(disk, n) == sha256_bytes(src[:n]), (
        f"the first {n} bytes accepted before SIGTERM are not on the server")
    print(f"SIGTERM after {n >> 20} MiB: writer got {box['err']!r}")


def test_fault_lazy_unmount_during_copy(server, mount, shm, bg, tally):
    """fusermount3 -u while dd has the file open fails with EBUSY; the
    lazy fusermount3 -u -z detaches the mount, dd keeps writing through
    its open file to the end, and the daemon drains, flushes and exits 0
    when it closes."""
    disk = random_file(shm / "disk.img", 64 * MiB)
    srv = server("file", disk, "wdelay=3ms", filters=["delay"])
    m = mount(srv, "--request-size", "256K")
    src = random_file(shm / "src.img", 32 * MiB)
    cp = bg(["dd", f"if={src}", f"of={m.file}", "bs=64k", "conv=fsync"],
            shm / "cp.err")
    wait_progress(cp, written_bytes, 4 * MiB)
    r = subprocess.run(["fusermount3", "-u", str(m.mp)], capture_output=True,
                       text=True)
    busy = r.returncode != 0
    if busy:
        subprocess.run(["fusermount3", "-u", "-z", str(m.mp)], check=True)
    rc = cp.wait(120)
    rc_daemon = m.wait_exit(120)
    m.check(rc_daemon)
    judge(tally, "unmount-during-copy", rc, src,
          sha256_prefix(disk, 32 * MiB), None, cp.stderr)
    if rc == 0:
        assert sha256_prefix(disk, 32 * MiB) == sha256_file(src)
    print(f"plain unmount during the copy: {'EBUSY' if busy else 'ok'}; "
          f"dd rc {rc}")


# ------------------------------------------------------ many at once

def test_fault_many_mounts_concurrent_copies(server, mount, shm, tally):
    """4 servers, 4 mounts, 2 copies into each at once (two halves of
    the disk, dd conv=notrunc,fsync): every copy succeeds and lands."""
    jobs = []
    for i in range(4):
        disk = random_file(shm / f"disk{i}.img", EXPORT)
        srv = server("file", disk, "wdelay=1ms", filters=["delay"])
        # Two dd per mount at once, on disjoint halves: -o multiwriter.
        m = mount(srv, "--request-size", "256K", "--pool-size", "8M", "-o",
                  "multiwriter")
        for half in range(2):
            src = random_file(shm / f"src{i}-{half}.img", EXPORT // 2)
            cmd = ["dd", f"if={src}", f"of={m.file}", "bs=128k",
                   f"seek={half * (EXPORT // 2) // (128 * 1024)}",
                   "conv=notrunc,fsync", "status=none"]
            jobs.append((i, half, disk, m, src, cmd))
    procs = []
    for j in jobs:
        err = shm / f"dd{j[0]}-{j[1]}.err"
        procs.append((j, subprocess.Popen([str(c) for c in j[5]],
                                          stderr=open(err, "wb")), err))
    failed = []
    for (i, half, disk, m, src, _), p, err in procs:
        try:
            rc = p.wait(timeout(300))
        except subprocess.TimeoutExpired:
            p.kill()
            pytest.fail(f"dd {i}/{half} hung")
        off = half * (EXPORT // 2)
        with open(disk, "rb") as f:
            f.seek(off)
            import hashlib
            got = hashlib.sha256(f.read(EXPORT // 2)).hexdigest()
        out = judge(tally, "many-mounts", rc, src, got, None,
                    err.read_text())
        if out != "match":
            failed.append((i, half, rc, err.read_text()))
    assert not failed, failed


# ------------------------------------------- write errors reach the copy tool

WRITE_EXPORT = 64 * MiB

WRITE_TOOLS = {
    "cp": lambda s, d: ["cp", s, d],
    "cp-sparse": lambda s, d: ["cp", "--sparse=always", s, d],
    "dd-1M": lambda s, d: ["dd", f"if={s}", f"of={d}", "bs=1M", "status=none"],
    "dd-4k": lambda s, d: ["dd", f"if={s}", f"of={d}", "bs=4k", "status=none"],
    "dd-fsync": lambda s, d: ["dd", f"if={s}", f"of={d}", "bs=1M",
                              "conv=fsync", "status=none"],
}

ERR_ALL = ("error-pwrite=EIO", "error-pwrite-rate=100%",
           "error-zero=EIO", "error-zero-rate=100%")


def daemon_logged_failure(m):
    text = m.stderr.lower()
    return any(w in text for w in ("error", "eio", "input/output"))


@pytest.mark.parametrize("tool", sorted(WRITE_TOOLS))
def test_fault_every_write_fails(server, mount, shm, tool):
    """All writes fail: the tool must exit non-zero."""
    srv = server("memory", f"size={WRITE_EXPORT}", *ERR_ALL, filters=["error"])
    m = mount(srv, expect_rc=None, expect_errors=True)
    src = random_file(shm / "src.img", SRC)
    r = run(WRITE_TOOLS[tool](src, m.file))
    assert r.returncode != 0, (f"{tool} exited 0 although every NBD write "
                               f"failed; stderr: {r.stderr!r}")
    assert "Input/output error" in r.stderr, r.stderr
    assert daemon_logged_failure(m), ("daemon did not log the failed write:\n"
                                      + m.stderr)


@pytest.mark.parametrize("tool", ["cp", "dd-4k", "dd-fsync"])
def test_fault_high_error_rate_fails(server, mount, shm, tool):
    """Half of the (many, small) requests fail: never a silent success."""
    srv = server("memory", f"size={WRITE_EXPORT}", "error-pwrite=EIO",
                 "error-pwrite-rate=50%", filters=["error"])
    m = mount(srv, "--request-size", "256K", expect_rc=None,
              expect_errors=True)
    src = random_file(shm / "src.img", SRC)
    r = run(WRITE_TOOLS[tool](src, m.file))
    assert r.returncode != 0, (f"{tool} exited 0 with 50% of writes "
                               "failing")
    assert "Input/output error" in r.stderr, r.stderr


@pytest.mark.parametrize("tool", ["cp", "dd-1M", "dd-fsync"])
def test_fault_low_error_rate_never_wrong_bytes(server, mount, shm, tool):
    """With a few failing writes the tool may succeed or fail, but if it
    says success the server has exactly the source."""
    disk = random_file(shm / "disk.img", WRITE_EXPORT)       # old random bytes
    srv = server("file", disk, "error-pwrite=EIO", "error-pwrite-rate=3%",
                 filters=["error"])
    m = mount(srv, "--request-size", "512K", expect_rc=None,
              expect_errors=True)
    outcomes = []
    for trial in range(3):
        src = random_file(shm / f"src{trial}.img", SRC)
        r = run(WRITE_TOOLS[tool](src, m.file))
        outcomes.append(r.returncode)
        if r.returncode == 0:
            assert_content(src, WRITE_EXPORT, uri=srv.uri,
                           what=f"{tool} exited 0 (trial {trial})")
        else:
            assert "Input/output error" in r.stderr, r.stderr
    assert len(outcomes) == 3


@pytest.mark.parametrize("surface", ["fsync", "close"])
def test_fault_error_reaches_fsync_or_close(server, mount, shortdir, surface):
    """Writes that fail after being accepted (write-back) are reported by
    the next fsync or close, with EIO."""
    flag = shortdir / "inject"
    srv = server("memory", f"size={WRITE_EXPORT}", "error-pwrite=EIO",
                 "error-pwrite-rate=100%", f"error-pwrite-file={flag}",
                 filters=["error"])
    m = mount(srv, expect_rc=None, expect_errors=True)
    good = random_bytes(8 * MiB)
    bad = random_bytes(8 * MiB)
    fd = os.open(m.file, os.O_RDWR)
    errors = []
    try:
        os.pwrite(fd, good, 0)
        os.fsync(fd)                                   # no errors yet
        touch(flag)
        for i in range(0, len(bad), MiB):
            try:
                os.pwrite(fd, bad[i:i + MiB], 16 * MiB + i)
            except OSError as e:
                errors.append(("write", e.errno))
                break
        if surface == "fsync":
            try:
                os.fsync(fd)
            except OSError as e:
                errors.append(("fsync", e.errno))
    finally:
        try:
            os.close(fd)
        except OSError as e:
            errors.append(("close", e.errno))
        flag.unlink(missing_ok=True)
    assert errors, "no write, fsync or close reported the failed writes"
    assert all(e == errno.EIO for _, e in errors), errors
    if surface == "fsync":
        assert any(w in ("write", "fsync") for w, _ in errors), \
            f"fsync did not report the failed writes: {errors}"
    assert read_nbd(srv.uri, 0, len(good)) == good, \
        "the acknowledged writes before the fault are not on the server"
    assert daemon_logged_failure(m), m.stderr


def test_fault_punch_hole_error_reported(server, mount, shortdir):
    """fallocate --punch-hole becomes write-zeroes; its failure is reported
    (by fallocate itself or the following fsync)."""
    flag = shortdir / "inject"
    srv = server("memory", f"size={WRITE_EXPORT}", "error-zero=EIO",
                 "error-zero-rate=100%", f"error-zero-file={flag}",
                 "error-trim=EIO", "error-trim-rate=100%",
                 f"error-trim-file={flag}", filters=["error"])
    old = fill_random(srv.uri, WRITE_EXPORT)
    m = mount(srv, expect_rc=None, expect_errors=True)
    touch(flag)
    r = run(["fallocate", "--punch-hole", "--keep-size", "-o", str(4 * MiB),
             "-l", str(4 * MiB), m.file])
    fsync_err = 0
    if r.returncode == 0:
        fd = os.open(m.file, os.O_RDWR)
        try:
            os.fsync(fd)
        except OSError as e:
            fsync_err = e.errno
        finally:
            try:
                os.close(fd)
            except OSError as e:
                fsync_err = fsync_err or e.errno
    flag.unlink()
    assert r.returncode != 0 or fsync_err == errno.EIO, (
        f"failed write-zeroes not reported: fallocate rc {r.returncode} "
        f"({r.stderr.strip()}), fsync errno {fsync_err}")
    # Nothing outside the punched range changed.
    assert read_nbd(srv.uri, 0, 4 * MiB) == old[:4 * MiB]
    assert read_nbd(srv.uri, 8 * MiB, 4 * MiB) == old[8 * MiB:12 * MiB]


@pytest.mark.parametrize("tool", ["dd-1M", "dd-fsync"])
def test_fault_server_killed_mid_copy(server, mount, shm, tool):
    """kill -9 the server while a slow dd is copying: dd exits non-zero in
    bounded time, reads error out, the daemon exits when unmounted."""
    # Slow enough (2 requests of 2 MiB per 0.5 s) that dd is certainly
    # still copying, blocked on the full pool, when the server dies.
    srv = server("memory", "size=256M", "wdelay=500ms", filters=["delay"])
    # A daemon that reconnects after a connection failure would wait for
    # the dead server; keep that wait short where it can be configured.
    opts = ["--retry-timeout", "2"] if daemon_has_option("--retry-timeout") \
        else []
    m = mount(srv, "-C", "1", "--depth", "2", "--request-size", "2M",
              "--pool-size", "16M", *opts, expect_rc=None, expect_errors=True)
    src = random_file(shm / "src.img", 128 * MiB)
    cmd = [str(c) for c in WRITE_TOOLS[tool](src, m.file)]
    with open(shm / "dd.err", "wb") as err:
        dd = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + timeout(60)
        while written_bytes(dd.pid) < 8 * MiB and dd.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.02)
        assert dd.poll() is None, "dd finished before the server was killed"
        srv.kill()
        try:
            rc = dd.wait(timeout(90))
        except subprocess.TimeoutExpired:
            pytest.fail(f"{tool} hung after the server was killed")
    finally:
        if dd.poll() is None:
            dd.kill()
            dd.wait()
    assert rc != 0, f"{tool} exited 0 although the server died mid-copy"
    assert (shm / "dd.err").read_text().strip(), "dd printed no error"

    # Reading the file now fails (or returns) but does not hang.
    box = {}

    def reader():
        try:
            with open(m.file, "rb") as f:
                f.read(MiB)
            box["r"] = "ok"
        except OSError as e:
            box["r"] = e.errno
    t = threading.Thread(target=reader, daemon=True)
    t.start()
    t.join(timeout(60))
    assert not t.is_alive(), "read from the mount hung after server death"
    # The daemon must still exit when unmounted; data was lost, so it must
    # not claim success.
    rc = m.unmount(check=False)
    m.checked = True
    assert rc != 0, ("daemon exited 0 after losing writes to a dead server"
                     f"\n{tail(m.stderr_path)}")


def test_fault_sigterm_with_failing_pending_writes(server, mount, shortdir):
    """Writes accepted (write-back) but failing at the server while the
    daemon drains on SIGTERM, never reported to any close or fsync: that
    is lost data, so the daemon must exit non-zero and say so."""
    flag = shortdir / "inject"
    srv = server("memory", f"size={WRITE_EXPORT}", "wdelay=200ms",
                 "error-pwrite=EIO", "error-pwrite-rate=100%",
                 f"error-pwrite-file={flag}", filters=["delay", "error"])
    m = mount(srv, "--pool-size", "32M", expect_rc=None, expect_errors=True)
    fd = os.open(m.file, os.O_RDWR)
    try:
        touch(flag)
        for i in range(4):
            try:
                os.pwrite(fd, random_bytes(MiB), i * MiB)
            except OSError:
                break
        rc = m.terminate(check=False)
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
    assert rc != 0, ("daemon exited 0 although writes it had accepted "
                     "failed while draining")
    assert daemon_logged_failure(m), m.stderr


@pytest.mark.parametrize("tool", ["cp-sparse", "dd-1M", "dd-fsync"])
def test_fault_zeroing_fails(server, mount, shm, tool):
    """Write-zeroes (for holes, O_TRUNC and the tail beyond the new size)
    fail at the server while payload writes succeed.  The old random bytes
    then survive where zeros belong, so the tool must not exit 0 unless
    the daemon zeroed some other way and the server is right."""
    srv = server("memory", f"size={WRITE_EXPORT}", "error-zero=EIO",
                 "error-zero-rate=100%", "error-trim=EIO",
                 "error-trim-rate=100%", filters=["error"])
    fill_random(srv.uri, WRITE_EXPORT)
    m = mount(srv, expect_rc=None, expect_errors=True)
    img = make_sparse_image(shm / "src.img", 40 * MiB + 512, runs=8, seed=11)
    r = run(WRITE_TOOLS[tool](img.path, m.file))
    if r.returncode == 0:
        assert_content(img.path, WRITE_EXPORT, uri=srv.uri,
                       what=f"{tool} exited 0 although zeroing failed")
    else:
        assert "Input/output error" in r.stderr, r.stderr
