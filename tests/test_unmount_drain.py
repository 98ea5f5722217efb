"""Unmounting drains every pending write and flushes the server.

The server is nbdkit's file plugin behind a delay filter, so writes stay
pending for a while; after the daemon exits, the backing file (read
directly, no NBD involved) must hold every byte, and the server's request
log must show an NBD flush after the last write."""

import os
import re
import signal
import subprocess

import pytest

from lib.digest import sha256_bytes, sha256_file
from lib.env import MiB, timeout
from lib.images import make_sparse_image, random_bytes, random_file
from lib.mounts import fusermount_u
from lib.procs import run

EXPORT = 64 * MiB


@pytest.fixture
def slow_file_server(server, shm):
    """File-backed export, random old contents, writes delayed 20 ms,
    request log on."""
    disk = random_file(shm / "disk.img", EXPORT)
    srv = server("file", disk, "wdelay=20ms", filters=["delay"], log=True)
    return srv, bytearray(disk.read_bytes())


def flushed_after_last_write(log):
    """True if the log has a Flush request after the last Write/Zero."""
    last_write = last_flush = -1
    for i, line in enumerate(open(log, errors="replace")):
        if re.search(r" (Write|Zero|Trim) id=", line):
            last_write = i
        elif re.search(r" Flush id=", line):
            last_flush = i
    return last_flush > last_write


def assert_disk(disk, expected_sha, what):
    got = sha256_file(disk)
    assert got == expected_sha, f"{what}: backing file sha256 differs"


@pytest.mark.parametrize("how", ["fusermount", "sigterm"])
def test_unmount_right_after_cp(slow_file_server, mount, shm, how):
    srv, _ = slow_file_server
    m = mount(srv, "--depth", "32")
    img = make_sparse_image(shm / "src.img", 48 * MiB + 4097, runs=10, seed=3)
    r = run(["cp", "--sparse=always", img.path, m.file])
    assert r.returncode == 0, f"cp failed: {r.stderr}"
    if how == "fusermount":
        m.unmount()                     # asserts exit 0 and a clean stderr
    else:
        m.terminate(signal.SIGTERM)
    assert_disk(srv.disk, sha256_file(img.path, pad_to=EXPORT),
                f"cp then {how}")
    assert flushed_after_last_write(srv.log), "no NBD flush after last write"


@pytest.mark.parametrize("tool", ["dd-1M", "dd-4k"])
def test_unmount_right_after_dd(slow_file_server, mount, shm, tool):
    srv, old = slow_file_server
    m = mount(srv, "--depth", "32")
    src = random_file(shm / "src.img", 20 * MiB + 123)
    bs = tool.split("-")[1]
    r = run(["dd", f"if={src}", f"of={m.file}", f"bs={bs}", "conv=notrunc",
             "status=none"])
    assert r.returncode == 0, f"dd failed: {r.stderr}"
    m.unmount()
    ref = bytearray(old)
    data = src.read_bytes()
    ref[:len(data)] = data
    assert_disk(srv.disk, sha256_bytes(bytes(ref)), tool)
    assert flushed_after_last_write(srv.log), "no NBD flush after last write"


def write_pending(path, ref, start=4 * MiB, total=32 * MiB):
    """Open, write total bytes in 1 MiB pieces, return the open fd."""
    fd = os.open(path, os.O_RDWR)
    for off in range(start, start + total, MiB):
        data = random_bytes(MiB)
        assert os.pwrite(fd, data, off) == MiB
        ref[off:off + MiB] = data
    return fd


def test_unmount_sigterm_with_file_open(slow_file_server, mount):
    """SIGTERM while the writer still holds the file open, writes pending:
    the daemon drains, flushes and exits 0."""
    srv, ref = slow_file_server
    m = mount(srv, "--pool-size", "64M", "--depth", "8")
    fd = write_pending(m.file, ref)
    try:
        m.terminate(signal.SIGTERM)
    finally:
        try:
            os.close(fd)
        except OSError:
            pass               # ENOTCONN: the daemon is gone, that is fine
    assert_disk(srv.disk, sha256_bytes(bytes(ref)), "SIGTERM, file open")
    assert flushed_after_last_write(srv.log), "no NBD flush after last write"


def test_unmount_lazy_then_close(slow_file_server, mount):
    """fusermount3 -u -z with the file open and writes pending; the daemon
    finishes when the last handle closes, with every byte on the server."""
    srv, ref = slow_file_server
    m = mount(srv, "--pool-size", "64M", "--depth", "8")
    fd = write_pending(m.file, ref)
    try:
        r = subprocess.run(["fusermount3", "-u", "-z", str(m.mp)],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    finally:
        os.close(fd)            # flush: must succeed, the daemon is alive
    rc = m.wait_exit(60)
    m.check(rc)
    assert_disk(srv.disk, sha256_bytes(bytes(ref)), "lazy unmount")
    assert flushed_after_last_write(srv.log), "no NBD flush after last write"


def test_unmount_busy_refused_then_succeeds(slow_file_server, mount):
    """A plain unmount while the file is open is refused (EBUSY) and leaves
    the mount working; after close it succeeds."""
    srv, ref = slow_file_server
    m = mount(srv)
    fd = write_pending(m.file, ref, total=4 * MiB)
    try:
        r = subprocess.run(["fusermount3", "-u", str(m.mp)],
                           capture_output=True, text=True)
        assert r.returncode != 0, "unmount succeeded with the file open"
        assert m.proc.poll() is None, "daemon exited on a refused unmount"
        more = random_bytes(MiB)
        assert os.pwrite(fd, more, 40 * MiB) == MiB
        ref[40 * MiB:41 * MiB] = more
    finally:
        os.close(fd)
    assert fusermount_u(m.mp, wait=timeout(10))
    m.check(m.wait_exit())
    assert_disk(srv.disk, sha256_bytes(bytes(ref)), "after busy unmount")
