"""FUSE over io_uring (--fuse-io-uring; docs/design/README.md, "FUSE over
io_uring").

With the option, a libfuse that can (3.18 or later, built with liburing)
and a kernel that allows it (/sys/module/fuse/parameters/enable_uring Y,
set here for the test and restored), libfuse's loop serves the mount and
its rings carry every request: the status's fuse_transport says
"io_uring".  Anything less (Debian 12's libfuse 3.14, a libfuse built
without liburing as Debian unstable's 3.18.3 is, a kernel with the
parameter off) falls back to /dev/fuse: the log says why, the status says
"/dev/fuse".  Which one this machine must give is worked out from the
libfuse the daemon loads, not from the test's own wish: where io_uring
can serve and does not, the test fails.

Every promise holds either way: a cp lands byte-exact (the sha256 of the
export on the server), a cp out of the mount reads it back, a failed
write reaches the copy tool, and the daemon unmounts cleanly."""

import fcntl
import hashlib
import os
import re
import tempfile
from pathlib import Path

import pytest

from lib.digest import sha256_file
from lib.env import BUILD, MiB
from lib.faults import status_json
from lib.images import random_file
from lib.procs import run

PARAM = Path("/sys/module/fuse/parameters/enable_uring")
EXPORT = 64 * MiB
DAEMON = Path(BUILD) / "daemon" / "nbdferry"


def libfuse_loaded():
    """(libfuse's minor version, whether it loads liburing) for the
    daemon as built: ldd names what the dynamic loader brings in."""
    out = run(["ldd", str(DAEMON)]).stdout
    m = re.search(r"libfuse3\.so\.\d+ => (\S+)", out)
    assert m, f"the daemon links no libfuse3:\n{out}"
    fuse = Path(m.group(1)).resolve()
    v = re.search(r"libfuse3\.so\.3\.(\d+)", fuse.name)
    assert v, f"cannot tell libfuse's version from {fuse}"
    uring = "liburing" in run(["ldd", str(fuse)]).stdout
    return int(v.group(1)), uring


def expected_transport(kernel_on):
    """("io_uring", None) where this build, libfuse and kernel can serve
    over io_uring, else ("/dev/fuse", the log's reason)."""
    minor, uring = libfuse_loaded()
    if minor < 18:
        return "/dev/fuse", "this build's libfuse has no io_uring"
    if not kernel_on:
        return "/dev/fuse", "the kernel's fuse module has io_uring off"
    if not uring:
        return "/dev/fuse", "this libfuse was built without io_uring"
    return "io_uring", None


@pytest.fixture(params=[True, False], ids=["kernel-on", "kernel-off"])
def kernel(request):
    """enable_uring set as the param says for the test, restored after;
    one test at a time holds it (a lock file), so that parallel workers
    do not undo each other's setting.  Only a mount that asks for
    io_uring looks at it."""
    assert PARAM.exists(), (f"{PARAM} missing: this kernel has no FUSE "
                            "over io_uring (6.14 or later has)")
    assert os.geteuid() == 0, "setting enable_uring needs root"
    lock = open(Path(tempfile.gettempdir()) / "nbdferry-enable-uring.lock",
                "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    old = PARAM.read_text().strip()
    PARAM.write_text("Y" if request.param else "N")
    try:
        yield request.param
    finally:
        PARAM.write_text(old)
        lock.close()


def mount_uring(mount, srv, kernel_on):
    m = mount(srv, "--fuse-io-uring", "--no-digest")
    want, why = expected_transport(kernel_on)
    got = status_json(m)["fuse_transport"]
    assert got == want, (f"fuse_transport {got!r}, want {want!r} "
                         f"({why or 'io_uring can serve here'})\n{m.stderr}")
    if why:
        assert why in m.stderr, f"no reason {why!r} in the log:\n{m.stderr}"
    return m


def test_fuse_io_uring_copy_in_and_out(kernel, server, mount, shm):
    """cp --sparse=always into the mount lands byte-exact on the server,
    cp out of it reads the same bytes, over whichever transport the
    status names."""
    disk = shm / "disk.img"
    with open(disk, "wb") as f:
        f.truncate(EXPORT)
    srv = server("file", disk)
    m = mount_uring(mount, srv, kernel)
    src = shm / "src.img"
    with open(src, "wb") as f:            # data, a hole, data
        f.write(os.urandom(20 * MiB))
        f.seek(40 * MiB)
        f.write(os.urandom(24 * MiB - 4096))
    r = run(["cp", "--sparse=always", str(src), str(m.file)])
    assert r.returncode == 0, r.stderr
    with open(disk, "rb") as f:
        got = f.read(os.path.getsize(src))
    assert sha256_file(src) == hashlib.sha256(got).hexdigest()
    out = shm / "out.img"
    r = run(["cp", str(m.file), str(out)])
    assert r.returncode == 0, r.stderr
    with open(out, "rb") as f:
        assert f.read(os.path.getsize(src)) == got
    assert m.unmount() == 0


def test_fuse_io_uring_write_error_reaches_close(kernel, server, mount, shm):
    """A server that fails every write: cp fails (at a write or at
    close), over whichever transport the status names, and the status
    counts the failure."""
    disk = random_file(shm / "disk.img", EXPORT)
    flag = shm / "fail"
    flag.write_bytes(b"")
    srv = server("file", disk, "error-pwrite=EIO", "error-pwrite-rate=100%",
                 f"error-pwrite-file={flag}", filters=["error"])
    m = mount(srv, "--fuse-io-uring", "--no-digest", "--retry-timeout", "0",
              expect_errors=True, expect_rc=None)
    want, _ = expected_transport(kernel)
    assert status_json(m)["fuse_transport"] == want
    src = random_file(shm / "src.img", 8 * MiB)
    r = run(["cp", str(src), str(m.file)], timeout=120)
    assert r.returncode != 0, "cp succeeded though every write failed"
    assert "Input/output error" in r.stderr, r.stderr
    assert status_json(m)["errors"] > 0
