"""Write errors reach the copy tool; a dead server gives an error, not a
hang.

nbdkit's error filter fails NBD writes (and write-zeroes).  The contract:
a failed write reaches the tool as a failing write, close or fsync, so the
tool exits non-zero; whenever a tool exits 0, the server holds exactly the
source's bytes.  The daemon's own exit code and stderr are not judged here
beyond "it exits" (errors are expected), except that it must log the
failure."""

import errno
import os
import subprocess
import threading
import time

import pytest

from lib.content import assert_content
from lib.env import MiB, daemon_has_option, timeout
from lib.images import make_sparse_image, random_file
from lib.nbd import fill_random, read_nbd
from lib.procs import run, tail

EXPORT = 64 * MiB
SRC = 16 * MiB

TOOLS = {
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


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_fault_every_write_fails(server, mount, shm, tool):
    """All writes fail: the tool must exit non-zero."""
    srv = server("memory", f"size={EXPORT}", *ERR_ALL, filters=["error"])
    m = mount(srv, expect_rc=None, expect_errors=True)
    src = random_file(shm / "src.img", SRC)
    r = run(TOOLS[tool](src, m.file))
    assert r.returncode != 0, (f"{tool} exited 0 although every NBD write "
                               f"failed; stderr: {r.stderr!r}")
    assert "Input/output error" in r.stderr, r.stderr
    assert daemon_logged_failure(m), ("daemon did not log the failed write:\n"
                                      + m.stderr)


@pytest.mark.parametrize("tool", ["cp", "dd-4k", "dd-fsync"])
def test_fault_high_error_rate_fails(server, mount, shm, tool):
    """Half of the (many, small) requests fail: never a silent success."""
    srv = server("memory", f"size={EXPORT}", "error-pwrite=EIO",
                 "error-pwrite-rate=50%", filters=["error"])
    m = mount(srv, "--request-size", "256K", expect_rc=None,
              expect_errors=True)
    src = random_file(shm / "src.img", SRC)
    r = run(TOOLS[tool](src, m.file))
    assert r.returncode != 0, (f"{tool} exited 0 with 50% of writes "
                               "failing")
    assert "Input/output error" in r.stderr, r.stderr


@pytest.mark.parametrize("tool", ["cp", "dd-1M", "dd-fsync"])
def test_fault_low_error_rate_never_wrong_bytes(server, mount, shm, tool):
    """With a few failing writes the tool may succeed or fail, but if it
    says success the server has exactly the source."""
    disk = random_file(shm / "disk.img", EXPORT)       # old random bytes
    srv = server("file", disk, "error-pwrite=EIO", "error-pwrite-rate=3%",
                 filters=["error"])
    m = mount(srv, "--request-size", "512K", expect_rc=None,
              expect_errors=True)
    outcomes = []
    for trial in range(3):
        src = random_file(shm / f"src{trial}.img", SRC)
        r = run(TOOLS[tool](src, m.file))
        outcomes.append(r.returncode)
        if r.returncode == 0:
            assert_content(src, EXPORT, uri=srv.uri,
                           what=f"{tool} exited 0 (trial {trial})")
        else:
            assert "Input/output error" in r.stderr, r.stderr
    assert len(outcomes) == 3


def touch(path):
    open(path, "w").close()


@pytest.mark.parametrize("surface", ["fsync", "close"])
def test_fault_error_reaches_fsync_or_close(server, mount, shortdir, surface):
    """Writes that fail after being accepted (write-back) are reported by
    the next fsync or close, with EIO."""
    flag = shortdir / "inject"
    srv = server("memory", f"size={EXPORT}", "error-pwrite=EIO",
                 "error-pwrite-rate=100%", f"error-pwrite-file={flag}",
                 filters=["error"])
    m = mount(srv, expect_rc=None, expect_errors=True)
    good = os.urandom(8 * MiB)
    bad = os.urandom(8 * MiB)
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
    assert read_back(srv.uri, 0, len(good)) == good, \
        "the acknowledged writes before the fault are not on the server"
    assert daemon_logged_failure(m), m.stderr


def read_back(uri, off, n):
    return read_nbd(uri, off, n)


def test_fault_punch_hole_error_reported(server, mount, shortdir):
    """fallocate --punch-hole becomes write-zeroes; its failure is reported
    (by fallocate itself or the following fsync)."""
    flag = shortdir / "inject"
    srv = server("memory", f"size={EXPORT}", "error-zero=EIO",
                 "error-zero-rate=100%", f"error-zero-file={flag}",
                 "error-trim=EIO", "error-trim-rate=100%",
                 f"error-trim-file={flag}", filters=["error"])
    old = fill_random(srv.uri, EXPORT)
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
    assert read_back(srv.uri, 0, 4 * MiB) == old[:4 * MiB]
    assert read_back(srv.uri, 8 * MiB, 4 * MiB) == old[8 * MiB:12 * MiB]


def written_bytes(pid):
    try:
        with open(f"/proc/{pid}/io") as f:
            return int(next(l for l in f if l.startswith("wchar")).split()[1])
    except (OSError, StopIteration):
        return 0


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
    cmd = [str(c) for c in TOOLS[tool](src, m.file)]
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
    srv = server("memory", f"size={EXPORT}", "wdelay=200ms",
                 "error-pwrite=EIO", "error-pwrite-rate=100%",
                 f"error-pwrite-file={flag}", filters=["delay", "error"])
    m = mount(srv, "--pool-size", "32M", expect_rc=None, expect_errors=True)
    fd = os.open(m.file, os.O_RDWR)
    try:
        touch(flag)
        for i in range(4):
            try:
                os.pwrite(fd, os.urandom(MiB), i * MiB)
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
    srv = server("memory", f"size={EXPORT}", "error-zero=EIO",
                 "error-zero-rate=100%", "error-trim=EIO",
                 "error-trim-rate=100%", filters=["error"])
    fill_random(srv.uri, EXPORT)
    m = mount(srv, expect_rc=None, expect_errors=True)
    img = make_sparse_image(shm / "src.img", 40 * MiB + 512, runs=8, seed=11)
    r = run(TOOLS[tool](img.path, m.file))
    if r.returncode == 0:
        assert_content(img.path, EXPORT, uri=srv.uri,
                       what=f"{tool} exited 0 although zeroing failed")
    else:
        assert "Input/output error" in r.stderr, r.stderr
