"""A user's mistake touches nothing: second writers, second mounts,
oversize sources, the wrong format in the raw file or a view.

Every case starts from an export of random bytes, hashes it on the server
before and after, and checks the message in the daemon's log and in the
status (docs/user-guide.md, "Mistakes it catches"):

- a process opening the disk for writing with O_TRUNC (cp, dd) or
  through a view while another writes, or any writer while such a copy
  writes, fails with EBUSY, the reason naming the other writer's pid and
  command; writers of the raw file that do not truncate (four parallel
  dd conv=notrunc seek=) share it, as with nbdfuse; readers are not
  refused; the same process may open a second writable handle;
  -o multiwriter allows truncating ones too; back-to-back copies with
  every copy tool still work;
- a second writable mount of the same export is refused, naming the
  first; a read-only one is not; a planted link as the lock file is
  refused, never followed;
- a raw copy whose source is larger than the export fails at its first
  write with ENOSPC, the disk untouched (not even truncated), counted in
  the status errors, and the progress says failed, never 100%;
- with --raw-images, a known image header written at offset 0 of the raw
  file is written and warned about, once, naming the view or command to
  use (without it the write is refused: test_raw_images.py);
- a view refuses another format with EMEDIUMTYPE and names what it is
  and what to use; --vhd-fixed refuses another format's header; a VMDK
  whose descriptor comes last (qemu-img) says so;
- a refused write into a view leaves the digest, the progress and the
  status of the last copy as they were.

Run: /usr/bin/python3 -m pytest tests/test_mistakes.py
"""

import errno
import gzip
import hashlib
import json
import lzma
import os
import subprocess
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from lib.env import MiB, daemon_cmd
from lib.images import random_bytes
from lib.mounts import fusermount_u, is_mounted
from lib.nbd import fill_random, read_nbd, sha256_nbd
from lib.procs import open_paths, oserror_errno, run, wait_for
from lib.vhd import qemu_img

EXPORT = 32 * MiB
STATUS_TOOL = (os.path.dirname(os.path.abspath(__file__)) +
               "/../tools/status/nbdferry-status")


def status(m):
    return json.loads((m.mp / ".nbdferry-status").read_bytes())


def messages(st):
    return [f["message"] for f in st["failures"] if "time" in f]


_holders = []     # processes holding a file of the mount open


@pytest.fixture
def victim(server, mount):
    """A 32 MiB export of random bytes, mounted; (server, mount, sha).
    Its teardown (before the mount's) kills what a failed test left
    holding the mount's files open, so the unmount is not kept busy."""
    def make(*opts):
        srv = server("memory", f"size={EXPORT}")
        fill_random(srv.uri, EXPORT)
        m = mount(srv, *opts, expect_errors=True)
        return srv, m, sha256_nbd(srv.uri)
    yield make
    while _holders:
        p = _holders.pop()
        if p.stdin:
            p.stdin.close()         # EOF: a forked child ends too
        if p.poll() is None:
            p.kill()
            p.wait(30)


def holder(path, trunc=False):
    """A dd that has path open for writing (with O_TRUNC if trunc) and
    waits on its stdin (it writes nothing until fed); stop it with
    close_holder().  Its /proc entries are read while it may exit (open
    refused): that fails here with its exit status, it never raises from
    /proc nor hangs."""
    conv = [] if trunc else ["conv=notrunc"]
    p = subprocess.Popen(["dd", f"of={path}", *conv, "bs=1M",
                          "status=none"], stdin=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    _holders.append(p)
    want = os.path.realpath(path)
    wait_for(lambda: want in open_paths(p.pid), p, "dd opening the file")
    return p


def close_holder(p):
    p.stdin.close()
    assert p.wait(30) == 0, p.stderr.read()


# ---------------------------------------------------------------- writers

@pytest.mark.parametrize("second", ["nbd", "nbd.vhd", "nbd.vmdk"])
def test_second_writer_refused_with_ebusy_naming_the_first(victim, shm,
                                                           second):
    srv, m, before = victim()
    src = shm / "src.raw"
    src.write_bytes(random_bytes(4 * MiB))
    dd = holder(m.file)
    cp = run(["cp", src, m.mp / second])
    # Readers are never refused, while a writer has the disk.
    assert hashlib.sha256((m.mp / "nbd").read_bytes()).hexdigest() == before
    close_holder(dd)
    assert cp.returncode != 0
    assert "Device or resource busy" in cp.stderr
    assert sha256_nbd(srv.uri) == before
    want = (f"{second}: a second writer refused: pid ", f"(cp) opens {second}",
            f"pid {dd.pid} (dd) has nbd open for writing", "-o multiwriter")
    line = [l for l in m.stderr.splitlines() if "second writer" in l]
    assert len(line) == 1 and all(w in line[0] for w in want), m.stderr
    st = status(m)
    assert st["errors"] >= 1
    assert any(all(w in msg for w in want) for msg in messages(st))


def test_second_writer_of_a_view_refused_while_raw_is_written(victim, shm):
    """The other way round: the view is being written, the raw file is
    refused."""
    srv, m, before = victim()
    dd = holder(m.mp / "nbd.vmdk")
    r = run(["dd", f"of={m.file}", "bs=1M", "count=1", "if=/dev/urandom",
             "status=none"])
    close_holder(dd)          # nothing written: the VMDK view keeps the disk
    assert r.returncode != 0 and "busy" in r.stderr
    assert sha256_nbd(srv.uri) == before
    assert f"pid {dd.pid} (dd) has nbd.vmdk open for writing" in m.stderr


def test_parallel_notrunc_writers_share_the_disk(victim, shm):
    """libnbd's nbdfuse test-parallel, without O_TRUNC: four dd
    conv=notrunc seek=K of disjoint 1 MiB regions at once (beside a fifth
    that holds the file open, so that they overlap) all succeed, and the
    server holds exactly their bytes there and the old ones elsewhere."""
    srv, m, _ = victim()
    old = read_nbd(srv.uri, 0, EXPORT)
    dd = holder(m.file)
    srcs = []
    for i in range(4):
        srcs.append(shm / f"part{i}")
        srcs[-1].write_bytes(random_bytes(MiB))
    procs = [subprocess.Popen(["dd", f"if={p}", f"of={m.file}", "bs=1M",
                               f"seek={3 * i + 1}", "conv=notrunc",
                               "status=none"], stderr=subprocess.PIPE)
             for i, p in enumerate(srcs)]
    assert [p.wait(60) for p in procs] == [0] * 4, \
        [p.stderr.read() for p in procs]
    close_holder(dd)
    want = bytearray(old)
    for i, p in enumerate(srcs):
        want[(3 * i + 1) * MiB:(3 * i + 2) * MiB] = p.read_bytes()
    assert read_nbd(srv.uri, 0, EXPORT) == bytes(want)
    assert "second writer" not in m.stderr


def test_writer_refused_beside_a_truncating_copy(victim, shm):
    """A copy opened with O_TRUNC has the disk alone: a conv=notrunc
    writer is refused, and writes nothing; the copy's own close (dd's
    dup2 closes its first descriptor at once) carries out its truncate:
    a copy of nothing, every byte zero."""
    srv, m, _ = victim()
    dd = holder(m.file, trunc=True)
    src = shm / "src.raw"
    src.write_bytes(random_bytes(MiB))
    try:
        r = run(["dd", f"if={src}", f"of={m.file}", "bs=1M", "seek=2",
                 "conv=notrunc", "status=none"])
        assert r.returncode != 0 and "busy" in r.stderr, r.stderr
        # dd tries O_RDWR, then O_WRONLY: both refused.
        lines = [l for l in m.stderr.splitlines() if "second writer" in l]
        assert lines and all(
            f"pid {dd.pid} (dd) has nbd open for writing with O_TRUNC" in l
            for l in lines), m.stderr
    finally:
        close_holder(dd)
    assert sha256_nbd(srv.uri) == hashlib.sha256(bytes(EXPORT)).hexdigest()


def test_same_process_may_open_a_second_writable_handle(victim):
    srv, m, _ = victim()
    a, b = random_bytes(MiB), random_bytes(MiB)
    with open(m.file, "r+b") as f, open(m.file, "r+b") as g:
        f.write(a)
        g.seek(MiB)
        g.write(b)
    assert read_nbd(srv.uri, 0, 2 * MiB) == a + b
    assert "second writer" not in m.stderr


def test_a_closed_writer_of_a_live_process_lets_the_next_copy_in(victim,
                                                                 shm):
    """A script writes the file, closes it and runs cp at once: the
    kernel's release of the script's handle may not have arrived when cp
    opens, and the script is still alive; cp is let in (its release is
    waited for), many times over."""
    srv, m, _ = victim()
    for i in range(20):
        head, data = random_bytes(4096), random_bytes(MiB)
        with open(m.file, "r+b") as f:
            f.write(head)
        src = shm / "src.raw"
        src.write_bytes(data)
        r = run(["dd", f"if={src}", f"of={m.file}", "bs=1M", "seek=1",
                 "conv=notrunc", "status=none"])
        assert r.returncode == 0, (i, r.stderr)
        assert read_nbd(srv.uri, 0, 4096) == head
        assert read_nbd(srv.uri, MiB, MiB) == data
    assert "second writer" not in m.stderr


# A truncating writer that forks and exits; its child keeps writing
# through the inherited descriptor.  Driven over stdin/stdout: "ready"
# once the parent is gone and the child has written, "go" to finish.
FORKED_WRITER = r"""
import os, sys
path, a, b, c = sys.argv[1:5]
fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
os.pwrite(fd, open(a, "rb").read(), 0)
parent = os.getpid()
if os.fork():
    os._exit(0)                     # the opening process is gone
while os.getppid() == parent:       # its exit (and its close) is over
    pass
os.pwrite(fd, open(b, "rb").read(), 1 << 20)
print("ready", flush=True)
sys.stdin.readline()
os.pwrite(fd, open(c, "rb").read(), 2 << 20)
os.close(fd)
print("done", flush=True)
"""


def test_forked_writer_keeps_the_disk_while_its_child_writes(victim, shm):
    """A process opens the raw file with O_TRUNC, writes, forks and
    exits; the child keeps writing through the inherited descriptor.
    The opening process is gone, but the copy is not over: a second
    truncating writer is refused with EBUSY while the child holds the
    file, and every byte of the child lands on the server."""
    srv, m, before = victim()
    parts = [shm / n for n in ("a", "b", "c")]
    for p in parts:
        p.write_bytes(random_bytes(MiB))
    w = subprocess.Popen(["/usr/bin/python3", "-c", FORKED_WRITER, m.file,
                          *parts], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    _holders.append(w)              # (the parent: the child is found below)
    assert w.wait(60) == 0, w.stderr.read()
    assert w.stdout.readline() == "ready\n", w.stderr.read()
    r = oserror_errno(lambda: os.close(
        os.open(m.file, os.O_WRONLY | os.O_TRUNC)))
    w.stdin.write("go\n")
    w.stdin.flush()
    assert w.stdout.readline() == "done\n", w.stderr.read()
    w.stdin.close()
    assert r == errno.EBUSY, os.strerror(r) if r else "admitted"
    assert "second writer refused" in m.stderr
    data = b"".join(p.read_bytes() for p in parts)
    assert read_nbd(srv.uri, 0, 3 * MiB) == data
    want = hashlib.sha256(data + bytes(EXPORT - 3 * MiB)).hexdigest()
    assert sha256_nbd(srv.uri) == want != before


def test_multiwriter_allows_parallel_writers(victim, shm):
    """Even beside a copy opened with O_TRUNC (its truncate is carried
    out by the first write, before the writers' bytes)."""
    srv, m, _ = victim("-o", "multiwriter")
    halves = [shm / "a", shm / "b"]
    for h in halves:
        h.write_bytes(random_bytes(8 * MiB))
    dd = holder(m.file, trunc=True)
    procs = [subprocess.Popen(["dd", f"if={h}", f"of={m.file}", "bs=1M",
                               f"seek={8 * i}", "conv=notrunc",
                               "status=none"]) for i, h in enumerate(halves)]
    assert [p.wait(60) for p in procs] == [0, 0]
    close_holder(dd)
    data = read_nbd(srv.uri, 0, EXPORT)
    assert data == (halves[0].read_bytes() + halves[1].read_bytes() +
                    bytes(EXPORT - 16 * MiB))
    assert "second writer" not in m.stderr


def test_back_to_back_copies_with_every_tool_are_one_writer_each(
        server, mount, shm):
    """Each tool's usual single copy (some open the file more than once,
    or close it in one process while the release is still on its way)
    runs right after the one before: none is taken for a second writer."""
    srv = server("memory", f"size={EXPORT}")
    fill_random(srv.uri, EXPORT)
    m = mount(srv)
    dst = m.file
    tools = [
        ["cp", "{src}", "{dst}"],
        ["dd", "if={src}", "of={dst}", "bs=1M", "status=none"],
        ["sh", "-c", "cat '{src}' > '{dst}'"],
        ["sh", "-c", "tee '{dst}' < '{src}' > /dev/null"],
        ["rsync", "--inplace", "-I", "{src}", "{dst}"],   # -I: same mtime
        ["qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", "{src}",
         "{dst}"],
        ["qemu-img", "convert", "-n", "-W", "-f", "raw", "-O", "raw",
         "{src}", "{dst}"],
        ["cp", "--sparse=always", "{src}", "{dst}"],
    ]
    for i, tool in enumerate(tools):
        src = shm / f"src{i}.raw"
        data = random_bytes(6 * MiB)
        src.write_bytes(data)
        r = run([a.format(src=src, dst=dst) for a in tool])
        assert r.returncode == 0, (tool, r.stderr)
        assert read_nbd(srv.uri, 0, len(data)) == data, tool
    assert "second writer" not in m.stderr


# ----------------------------------------------------------------- mounts

def second_mount(shortdir, srv, *opts):
    mp = shortdir / "second"
    mp.mkdir(exist_ok=True)
    r = subprocess.run(daemon_cmd(*opts, mp, srv.uri), capture_output=True,
                       text=True, timeout=60)
    mounted = is_mounted(mp)
    if mounted:
        fusermount_u(mp)
    return r, mounted


def test_second_writable_mount_of_an_export_refused(server, mount,
                                                    shortdir):
    srv = server("memory", f"size={EXPORT}")
    fill_random(srv.uri, EXPORT)
    before = sha256_nbd(srv.uri)
    m = mount(srv)
    r, mounted = second_mount(shortdir, srv)
    assert r.returncode != 0 and not mounted
    assert (f"already mounted for writing on this host, by pid {m.pid} on "
            f"{m.mp}") in r.stderr
    assert "-o multiwriter" in r.stderr
    # Read-only, or with -o multiwriter: no lock, no refusal.
    for opts in (["-r"], ["-o", "multiwriter"]):
        r, mounted = second_mount(shortdir, srv, *opts)
        assert r.returncode == 0 and mounted, (opts, r.stderr)
    assert sha256_nbd(srv.uri) == before
    # The lock goes with the first mount.
    assert m.unmount() == 0
    r, mounted = second_mount(shortdir, srv)
    assert r.returncode == 0 and mounted, r.stderr


def lock_path(key):
    """The lock file of an export's key (daemon/mountlock.h)."""
    name = hashlib.sha256(key.encode()).hexdigest()[:32]
    return Path(f"/run/lock/nbdferry-{name}.lock")


def unix_key(sock, export=""):
    """A Unix socket's key: its canonical path, not its inode (which the
    file system gives the next file once the socket is removed)."""
    return f"unix-path:{os.path.realpath(sock)}|{export}"


def test_mount_lock_never_follows_a_planted_link(server, shortdir):
    """The lock file is named by a hash of the export's key: a link planted
    there is refused (O_NOFOLLOW), its target untouched."""
    srv = server("memory", f"size={EXPORT}")
    lock = lock_path(unix_key(srv.sock))
    target = shortdir / "victim"
    target.write_text("keep\n")
    os.symlink(target, lock)
    try:
        r, mounted = second_mount(shortdir, srv)
    finally:
        os.unlink(lock)
    assert r.returncode != 0 and not mounted
    assert "cannot lock the export" in r.stderr
    assert target.read_text() == "keep\n"


def refused_second(shortdir, srv, first_pid, first_mp, *target):
    """A second writable mount, spelled otherwise: refused naming the
    first, nothing mounted, the export unchanged."""
    before = sha256_nbd(srv.uri)
    mp = shortdir / "second"
    mp.mkdir(exist_ok=True)
    r = subprocess.run(daemon_cmd(mp, *target), capture_output=True,
                       text=True, timeout=60)
    mounted = is_mounted(mp)
    if mounted:
        fusermount_u(mp)
    assert r.returncode != 0 and not mounted, (target, r.stderr)
    assert (f"already mounted for writing on this host, by pid {first_pid} "
            f"on {first_mp}") in r.stderr, r.stderr
    assert sha256_nbd(srv.uri) == before


@pytest.mark.parametrize("first,second", [
    ("127.0.0.1", "localhost"), ("localhost", "127.0.0.1"),
    ("127.0.0.1", "tcp-localhost"), ("LOCALHOST", "127.0.0.1"),
])
def test_second_writable_mount_refused_whatever_the_host_spelling(
        server, mount, shortdir, first, second):
    """The lock is the address actually connected, not its spelling."""
    srv = server("memory", f"size={EXPORT}", tcp=True)
    fill_random(srv.uri, EXPORT)
    m = mount(f"nbd://{first}:{srv.port}/")
    target = (["--tcp", "localhost", str(srv.port)]
              if second == "tcp-localhost"
              else [f"nbd://{second}:{srv.port}/"])
    refused_second(shortdir, srv, m.pid, m.mp, *target)
    assert m.unmount() == 0


@pytest.mark.parametrize("first", ["unix", "uri", "link"])
def test_second_writable_mount_refused_whatever_the_socket_spelling(
        server, mount, shortdir, first):
    """--unix SOCKET, nbd+unix:///?socket=SOCKET and a link to the socket
    are one export."""
    srv = server("memory", f"size={EXPORT}")
    fill_random(srv.uri, EXPORT)
    link = shortdir / "link.sock"
    os.symlink(srv.sock, link)
    spell = {"unix": ["--unix", str(srv.sock)], "uri": [srv.uri],
             "link": [f"nbd+unix:///?socket={link}"]}
    m = mount(spell[first])
    for other, target in spell.items():
        if other != first:
            refused_second(shortdir, srv, m.pid, m.mp, *target)
    assert m.unmount() == 0


def test_second_writable_mount_refused_after_the_server_restarted(
        kit, mount, shortdir):
    """The server restarted on the same socket path (a new socket file,
    another inode) while the first mount lives: the first mount reconnects
    there, so a second writable mount of that path is still refused.  (A
    lock keyed on the socket's inode let it in, and could refuse an
    unrelated socket that was given a recycled inode number.)"""
    k = kit("srv", ["memory", f"size={EXPORT}"])
    m = mount(k.target, expect_errors=True)
    ino = os.stat(k.sock).st_ino
    k.kill()
    k.start()
    assert os.stat(k.sock).st_ino != ino
    fill_random(k.uri, EXPORT)
    srv = SimpleNamespace(uri=k.uri)
    for target in (k.target, [k.uri]):
        refused_second(shortdir, srv, m.pid, m.mp, *target)
    # The first mount is on the restarted server: what it writes lands.
    data = os.urandom(1 * MiB)
    with open(m.file, "r+b") as f:
        f.write(data)
        os.fsync(f.fileno())
    assert sha256_nbd(k.uri, len(data)) == \
        hashlib.sha256(data).hexdigest()
    assert m.unmount() == 0


def test_second_writable_mount_refused_percent_encoded_export(
        server, mount, shortdir, tmp_path):
    """An export name percent-encoded is the same export."""
    d = tmp_path / "exports"
    d.mkdir()
    (d / "disk0").write_bytes(os.urandom(4 * MiB))
    srv = server("file", f"dir={d}")
    plain = f"nbd+unix:///disk0?socket={srv.sock}"
    enc = f"nbd+unix:///%64isk%30?socket={srv.sock}"
    srv.uri = plain                      # what refused_second digests
    m = mount(plain)
    refused_second(shortdir, srv, m.pid, m.mp, enc)
    assert m.unmount() == 0
    m = mount(enc)
    refused_second(shortdir, srv, m.pid, m.mp, plain)
    assert m.unmount() == 0


def test_mount_lock_file_removed_when_the_mount_ends(server, mount,
                                                     shortdir):
    """The lock file goes with its mount (they used to pile up in the
    thousands), and the next writable mount takes the lock again."""
    srv = server("memory", f"size={EXPORT}")
    lock = lock_path(unix_key(srv.sock))
    m = mount(srv)
    assert lock.exists()
    st = lock.stat()
    assert st.st_mode & 0o7777 == 0o644
    assert m.unmount() == 0
    assert not lock.exists()
    m = mount(srv)
    assert lock.exists()
    refused_second(shortdir, srv, m.pid, m.mp, srv.uri)
    assert m.unmount() == 0
    assert not lock.exists()


# --------------------------------------------------------- oversize source

@pytest.mark.parametrize("tool", ["cp", "dd"])
def test_source_larger_than_export_fails_before_the_disk_changes(
        victim, shm, tool):
    srv, m, before = victim()
    src = shm / "big.raw"
    src.write_bytes(random_bytes(48 * MiB))
    cmd = {"cp": ["cp", src, m.file],
           "dd": ["dd", f"if={src}", f"of={m.file}", "bs=1M",
                  "status=none"]}[tool]
    r = run(cmd)
    assert r.returncode != 0 and "No space left on device" in r.stderr
    assert sha256_nbd(srv.uri) == before      # not even truncated
    want = (f"reads {src}, {48 * MiB} bytes, larger than the export "
            f"({EXPORT} bytes)")
    assert want in m.stderr
    st = status(m)
    assert st["errors"] >= 1 and any(want in s for s in messages(st))
    pg = st["progress"]
    assert pg["failed"] and not pg["settled"] and pg["percent"] < 100
    assert pg["total"] == 48 * MiB and pg["total_from"] == "source"
    shown = run(["/usr/bin/python3", STATUS_TOOL, m.mp], check=True).stdout
    assert "FAILED" in shown and "larger than the export" in shown, shown
    # The next copy, of the right size, works and is not failed.
    good = shm / "good.raw"
    good.write_bytes(random_bytes(EXPORT))
    assert run(["cp", good, m.file]).returncode == 0
    assert sha256_nbd(srv.uri) == hashlib.sha256(good.read_bytes()).hexdigest()
    wait_for(lambda: status(m)["progress"]["settled"], what="settled")
    pg = status(m)["progress"]
    assert not pg["failed"] and pg["percent"] == 100


def test_container_source_larger_than_export_is_converted(victim, shm):
    """A qcow2 file larger than the export whose disk fits (preallocated:
    metadata on top of the whole disk) is the converter's business."""
    srv, m, _ = victim()
    raw = shm / "disk.raw"
    raw.write_bytes(random_bytes(EXPORT))
    img = shm / "full.qcow2"
    qemu_img("convert", "-f", "raw", "-O", "qcow2", "-o",
             "preallocation=full", raw, img)
    assert img.stat().st_size > EXPORT
    qemu_img("convert", "-n", "-f", "qcow2", "-O", "raw", img, m.file)
    assert sha256_nbd(srv.uri) == hashlib.sha256(raw.read_bytes()).hexdigest()
    assert "larger than the export" not in m.stderr


def test_write_past_the_export_is_counted_and_fails_the_progress(victim):
    """ENOSPC at the end of the export is an error of the copy: counted,
    and the progress of that copy is failed."""
    srv, m, before = victim()
    with open(m.file, "r+b", buffering=0) as f:
        assert oserror_errno(os.pwrite, f.fileno(), b"x" * 4096,
                             EXPORT) == errno.ENOSPC
    assert sha256_nbd(srv.uri) == before
    st = status(m)
    assert st["errors"] >= 1
    assert any("past the end of the export" in s for s in messages(st))
    assert st["progress"]["failed"] and not st["progress"]["settled"]


# ------------------------------------------------- headers in the raw file

def make_image(shm, kind):
    """A small file of one kind the daemon recognizes."""
    raw = shm / "disk.raw"
    if not raw.exists():
        raw.write_bytes(random_bytes(2 * MiB))
    out = shm / f"disk.{kind}"
    if out.exists():
        return out
    if kind in ("qcow2", "vhdx", "vmdk", "vpc"):
        opts = ["-o", "subformat=dynamic"] if kind == "vpc" else []
        qemu_img("convert", "-f", "raw", "-O", kind, *opts, raw, out)
    elif kind == "tar":
        with tarfile.open(out, "w", format=tarfile.USTAR_FORMAT) as t:
            t.add(make_image(shm, "vmdk"), arcname="disk1.vmdk")
    elif kind == "gzip":
        out.write_bytes(gzip.compress(raw.read_bytes()))
    elif kind == "xz":
        out.write_bytes(lzma.compress(raw.read_bytes()))
    return out


RAW_ADVICE = {
    "qcow2": ("a qcow2 image", "write it into MNT/nbd.qcow2"),
    "vhdx": ("a VHDX image", "write it into MNT/nbd.vhdx"),
    "vmdk": ("a VMDK image", "write it into MNT/nbd.vmdk"),
    "vpc": ("a VHD image", "write it into MNT/nbd.vhd"),
    "tar": ("a tar archive (an OVA?)",
            "tar -xOf FILE.ova DISK.vmdk > MNT/nbd.vmdk"),
    "gzip": ("a gzip stream", "gunzip -c FILE.gz > MNT/nbd"),
    "xz": ("an xz stream", "xz -dc FILE.xz > MNT/nbd"),
}


@pytest.mark.parametrize("kind", RAW_ADVICE)
def test_image_header_in_the_raw_file_is_written_and_warned_once(victim,
                                                                 shm, kind):
    srv, m, _ = victim("--raw-images")      # else refused: test_raw_images
    name, advice = RAW_ADVICE[kind]
    advice = advice.replace("MNT", str(m.mp))       # the real mountpoint
    img = make_image(shm, kind)
    data = img.read_bytes()
    for _ in range(2):                        # two copies: two warnings
        assert run(["cp", img, m.file]).returncode == 0
    assert sha256_nbd(srv.uri, len(data)) == hashlib.sha256(data).hexdigest()
    assert read_nbd(srv.uri, len(data), MiB) == bytes(MiB)   # cp truncated
    # One copy that writes the header twice: one warning.
    with open(m.file, "r+b", buffering=0) as f:
        f.write(data[:4096])
        f.seek(0)
        f.write(data[:4096])
    # A raw disk is not warned about.
    plain = shm / "plain.raw"
    plain.write_bytes(random_bytes(MiB))
    assert run(["cp", plain, m.file]).returncode == 0
    assert read_nbd(srv.uri, 0, MiB) == plain.read_bytes()
    lines = [l for l in m.stderr.splitlines() if "written as asked" in l]
    assert len(lines) == 3, m.stderr
    assert all(f"warning: nbd: written as asked, but it is {name}: the "
               f"disk now holds the image file" in l and advice in l
               for l in lines), lines
    st = status(m)
    assert st["warnings"] == 3 and st["errors"] == 0
    assert any(f"it is {name}" in s and advice in s for s in messages(st))


# --------------------------------------------------------- the wrong view

VIEW_CASES = {
    "nbd.vhd": [
        ("vhdx", "a VHDX image", "write it into MNT/nbd.vhdx"),
        ("qcow2", "a qcow2 image", "write it into MNT/nbd.qcow2"),
        ("tar", "a tar archive (an OVA?)",
         "tar -xOf FILE.ova DISK.vmdk > MNT/nbd.vmdk"),
        ("vmdk", "a VMDK image", "write it into MNT/nbd.vmdk"),
    ],
    "nbd.vmdk": [
        ("vhdx", "a VHDX image", "write it into MNT/nbd.vhdx"),
        ("qcow2", "a qcow2 image", "write it into MNT/nbd.qcow2"),
        ("tar", "a tar archive (an OVA?)",
         "tar -xOf FILE.ova DISK.vmdk > MNT/nbd.vmdk"),
        ("vpc", "a VHD image", "write it into MNT/nbd.vhd"),
    ],
    "nbd.qcow2": [
        ("vhdx", "a VHDX image", "write it into MNT/nbd.vhdx"),
        ("vmdk", "a VMDK image", "write it into MNT/nbd.vmdk"),
        ("tar", "a tar archive (an OVA?)",
         "tar -xOf FILE.ova DISK.vmdk > MNT/nbd.vmdk"),
        ("vpc", "a VHD image", "write it into MNT/nbd.vhd"),
    ],
}


# One mount per view: the views share the skeleton's refusal line, which
# the log's rate limit lets through 5 times in 10 s.
@pytest.mark.parametrize("view", sorted(VIEW_CASES))
@pytest.mark.parametrize("fixed", [False, True], ids=["", "vhd-fixed"])
def test_view_refuses_another_format_naming_it(victim, shm, fixed, view):
    srv, m, before = victim(*(["--vhd-fixed"] if fixed else []))
    for kind, name, advice in VIEW_CASES[view]:
        advice = advice.replace("MNT", str(m.mp))   # the real mountpoint
        n = len(m.stderr.splitlines())
        r = run(["cp", make_image(shm, kind), m.mp / view])
        assert r.returncode != 0, (view, kind)
        assert "Wrong medium type" in r.stderr, (view, kind, r.stderr)
        assert sha256_nbd(srv.uri) == before, (view, kind)
        new = "\n".join(m.stderr.splitlines()[n:])
        assert f"{view}: not a " in new and f"its first sector is {name}" \
            in new and advice in new, (view, kind, new)
        assert "magic 0x" not in new and "--vhd-fixed" not in new
    assert status(m)["errors"] >= len(VIEW_CASES[view])


@pytest.mark.parametrize("view,fmt,what", [
    ("nbd.vmdk", "vmdk", "the descriptor is empty (zeros)"),
    ("nbd.vhd", "vpc", "the dynamic header is empty (zeros)"),
])
def test_qemu_img_writing_into_a_view_says_why(victim, shm, view, fmt, what):
    """qemu-img writes a VMDK's descriptor or a VHD's dynamic header after
    the rest, seeking back: a view (file order) cannot take it, and says
    so; the disk is untouched."""
    srv, m, before = victim()
    raw = shm / "disk.raw"
    raw.write_bytes(random_bytes(2 * MiB))
    r = qemu_img("convert", "-f", "raw", "-O", fmt, raw, m.mp / view,
                 check=False)
    assert r.returncode != 0
    assert sha256_nbd(srv.uri) == before
    assert f"{view}: {what}" in m.stderr
    assert f"qemu-img convert -n -O raw SRC {m.mp}/nbd" in m.stderr
    assert "no createType" not in m.stderr and "cookie" not in m.stderr


# ------------------------------------- a refusal leaves the last copy alone

@pytest.mark.parametrize("view", ["nbd.vhd", "nbd.vmdk"])
def test_refused_view_write_keeps_digest_progress_and_status(victim, shm,
                                                            view):
    srv, m, _ = victim()
    src = shm / "src.raw"
    src.write_bytes(random_bytes(EXPORT))
    assert run(["cp", src, m.file]).returncode == 0
    wait_for(lambda: status(m)["digest"]["state"] == "complete" and
             status(m)["progress"]["settled"], what="the copy settled")
    before = status(m)
    sha = sha256_nbd(srv.uri)
    bad = shm / "bad.bin"
    bad.write_bytes(b"QFI\xfb" + random_bytes(MiB))
    r = run(["cp", bad, m.mp / view])
    assert r.returncode != 0 and "Wrong medium type" in r.stderr
    after = status(m)
    assert sha256_nbd(srv.uri) == sha
    assert after["digest"] == before["digest"]
    for k in ("done", "total", "total_from", "percent", "frontier",
              "settled", "failed"):
        assert after["progress"][k] == before["progress"][k], k
    assert any(s.startswith(f"{view}: not a ") for s in messages(after))
