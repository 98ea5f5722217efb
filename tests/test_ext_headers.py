"""NBD extended headers: 64-bit block status and write-zeroes.

Built in where libnbd has the API (>= 1.18, CMakeLists.txt); negotiated
with servers that offer them (qemu-nbd >= 8.2; nbdkit 1.42 does not).
What the test expects is decided from the build (``nbdferry --version``
says whether they are built in) and from the server's version, never
from the distribution: on Debian 12 (libnbd 1.14) it asserts the
fallback, on Debian 13 (libnbd 1.22, qemu-nbd 10) the feature, and a
build that should have it and does not fails.

- The status's server object says extended_headers: true, false, or
  "not built".
- A 17 TiB sparse export's block status scan at mount: with extended
  headers a few requests (the disk cut into as many windows as the scan
  keeps in flight) and complete; the zero map it learnt is right (a
  punch over each data run zeroes it, checked on the
  backing file).  Without them, windows of at most 4 GiB.
- A write-zeroes of more than 4 GiB over data (fallocate --zero-range on
  a mount with --no-extents, so nothing is known zero): one request with
  extended headers, several without; the range reads back as zero on the
  server and the data around it is intact (sha256).
"""

import hashlib
import os
import re
import shutil
import subprocess
from types import SimpleNamespace

import pytest

from lib.copytools import status
from lib.env import GiB, MiB, daemon_cmd
from lib.procs import run, wait_for

TiB = 1 << 40
SCAN_DEPTH = 32                 # transport/pool-scan.c


def need(*tools):
    gone = [t for t in tools if shutil.which(t) is None]
    if gone:
        pytest.fail("not installed: " + ", ".join(gone) +
                    " (run scripts/install-deps)")


def built_in():
    """Whether this build can negotiate extended headers (--version).  A
    build against libnbd 1.18 or later that says no fails: the build's
    detection is broken, and the fallback must not pass for the
    feature."""
    out = run(daemon_cmd("--version"), check=True).stdout
    m = re.search(r"^NBD extended headers: (.*)$", out, re.M)
    assert m, f"--version does not say: {out}"
    v = re.search(r"^libnbd (\d+)\.(\d+)", out, re.M)
    assert v, out
    has = m.group(1) == "built in"
    assert has == ((int(v.group(1)), int(v.group(2))) >= (1, 18)), \
        f"libnbd {v.group(1)}.{v.group(2)} but {m.group(0)!r}"
    return has


def qemu_nbd_version():
    out = run(["qemu-nbd", "--version"], check=True).stdout
    m = re.search(r"qemu-nbd (\d+)\.(\d+)", out)
    assert m, out
    return int(m.group(1)), int(m.group(2))


def expected_ext():
    """What the status must say with qemu-nbd as the server."""
    if not built_in():
        return "not built"
    return qemu_nbd_version() >= (8, 2)


@pytest.fixture
def qemu_nbd(shortdir, shm):
    """Factory: qemu_nbd(size, runs) serves a sparse raw file of size
    bytes (in RAM) holding random data at each (offset, length) of runs;
    returns SimpleNamespace(uri, disk, runs: {offset: bytes})."""
    need("qemu-nbd")
    procs = []

    def start(size, runs=()):
        disk = shm / "disk.img"
        data = {}
        with open(disk, "wb") as f:
            f.truncate(size)
            for off, n in runs:
                data[off] = os.urandom(n)
                f.seek(off)
                f.write(data[off])
        sock, pidf = shortdir / "q.sock", shortdir / "q.pid"
        errf = open(shortdir / "q.err", "wb")
        # --discard=unmap: write-zeroes may punch holes (tmpfs), so a
        # zeroed range costs no memory.
        p = subprocess.Popen(
            ["qemu-nbd", "--persistent", "--shared=8", "-f", "raw",
             "--cache=writeback", "--discard=unmap", "-k", str(sock),
             "--pid-file", str(pidf), str(disk)],
            stdin=subprocess.DEVNULL, stdout=errf, stderr=errf)
        procs.append((p, errf))
        wait_for(lambda: pidf.exists() and sock.exists(), p, "qemu-nbd",
                 timeout=30)
        return SimpleNamespace(uri=f"nbd+unix:///?socket={sock}", disk=disk,
                               runs=data)

    yield start
    for p, errf in procs:
        p.terminate()
        p.wait(10)
        errf.close()


def check_backing(disk, off, length, expect):
    """The server's bytes of [off, off+length), read from its backing
    file where it holds data (holes read as zero): expect(o, n) gives the
    bytes that must be there.  Returns the allocated bytes read."""
    read = 0
    with open(disk, "rb") as f:
        fd, pos, end = f.fileno(), off, off + length
        while pos < end:
            try:
                d = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError:           # ENXIO: no data after pos
                break
            if d >= end:
                break
            h = min(os.lseek(fd, d, os.SEEK_HOLE), end)
            while d < h:
                n = min(h - d, 8 * MiB)
                got = os.pread(fd, n, d)
                want = expect(d, n)
                assert got == want, (f"server bytes at {d}+{n} differ "
                                     "from what was written")
                read += n
                d += n
            pos = h
    return read


def sha256_of(disk, off, n):
    with open(disk, "rb") as f:
        return hashlib.sha256(os.pread(f.fileno(), n, off)).hexdigest()


def test_ext_headers_status_says_what_build_has(qemu_nbd, mount):
    srv = qemu_nbd(64 * MiB, [(0, MiB)])
    m = mount(srv)
    assert status(m)["server"]["extended_headers"] == expected_ext()
    with open(m.file, "rb") as f:
        assert f.read(MiB) == srv.runs[0]


def test_ext_headers_scan_of_17tib(qemu_nbd, mount):
    size = 17 * TiB
    runs = [(0, MiB), (5 * TiB + 3 * MiB, MiB), (9 * TiB - 4096, 8192),
            (size - 2 * MiB, MiB)]
    srv = qemu_nbd(size, runs)
    m = mount(srv)
    st = status(m)
    ext = expected_ext()
    assert st["server"]["extended_headers"] == ext
    bs = st["nbd_requests"]["block_status"]
    if ext is not True:
        # Windows of at most 4 GiB (2 GiB: SCAN_MAX_LEN): 17 TiB takes at
        # least 4352 of them, more than the scan sends in its 10 s budget
        # on this machine or not, but never as few as with the feature.
        assert bs > 2 * SCAN_DEPTH, st
        return
    assert st["block_status_scan"] == "complete", st
    # One window per slot, plus a few re-asks of partial replies.
    assert bs <= 2 * SCAN_DEPTH, st
    # The zero map is right: a punch over each data run and 64 MiB either
    # side skips what is known zero and must still zero the run.  (A
    # punch of the whole disk: tests/test_warm_large.py.)
    pad = 64 * MiB
    for off, n in runs:
        lo = max(off - pad, 0)
        r = run(["fallocate", "--punch-hole", "--keep-size", "-o", str(lo),
                 "-l", str(min(off + n + pad, size) - lo), m.file])
        assert r.returncode == 0, r.stderr
    fd = os.open(m.file, os.O_RDWR)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    st2 = status(m)
    zeros = st2["nbd_requests"]["zero"] - st["nbd_requests"]["zero"]
    assert len(runs) <= zeros <= len(runs) * 2, st2
    assert m.unmount() == 0
    for off, data in srv.runs.items():
        assert check_backing(srv.disk, off - 4096 if off else 0,
                             len(data) + 8192, lambda o, n: bytes(n)) >= 0
    assert os.path.getsize(srv.disk) == size


def test_ext_headers_zero_over_4gib(qemu_nbd, mount):
    size = 6 * GiB
    zoff, zlen = 512 * MiB, 4 * GiB + 64 * MiB      # > 4 GiB in one call
    before, after = (zoff - MiB, MiB), (zoff + zlen, MiB)
    inside = [(zoff + i * 256 * MiB + 4096, 64 * 1024)
              for i in range(zlen // (256 * MiB))] + [(zoff, 4096),
                                                      (zoff + zlen - 4096,
                                                       4096)]
    srv = qemu_nbd(size, [before, after] + inside)
    # --no-extents: nothing known zero, so the whole range is zeroed.
    m = mount(srv, "--no-extents")
    ext = expected_ext()
    assert status(m)["server"]["extended_headers"] == ext
    z0 = status(m)["nbd_requests"]["zero"]
    r = run(["fallocate", "--zero-range", "--keep-size", "-o", str(zoff),
             "-l", str(zlen), m.file])
    assert r.returncode == 0, r.stderr
    fd = os.open(m.file, os.O_RDWR)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    zeros = status(m)["nbd_requests"]["zero"] - z0
    if ext is True:
        assert zeros == 1, f"{zeros} write-zeroes for {zlen} bytes"
    else:
        # Cut at 4 GiB or less (32 MiB: qemu-nbd's maximum block size).
        assert zeros >= -(-zlen // (4 * GiB)), zeros
    assert m.unmount() == 0
    # On the server: the range reads as zero, the data around it is
    # intact.
    check_backing(srv.disk, zoff, zlen, lambda o, n: bytes(n))
    for off, n in (before, after):
        assert sha256_of(srv.disk, off, n) == \
            hashlib.sha256(srv.runs[off]).hexdigest()
    assert os.path.getsize(srv.disk) == size
