"""A server that stops answering: paused (SIGSTOP), for a moment or for
good, or answering ESHUTDOWN while it stays up.

No reply progress for --request-timeout seconds with requests outstanding:
the daemon holds new requests back and waits --retry-timeout more (it
neither resends nor closes: the server may still answer), then fails the
requests.  So close(), fsync() and unmount
never hang on a paused server: they fail with EIO, the daemon exits 1 and
names the lost ranges.  A short pause (2 s) is ridden out with the
defaults, and the bytes land right.  Every copy is judged by sha256 of
what the server holds."""

import os
import re
import signal
import time

import pytest

from lib.digest import sha256_file
from lib.env import MiB, timeout
from lib.faults import (judge, lost_ranges, sha256_mount, sha256_prefix,
                        wait_progress, written_bytes)
from lib.images import random_bytes, random_file
from lib.procs import in_thread

EXPORT = 96 * MiB
SRC = 48 * MiB


def slow_kit(kit, shm, tcp=False, filters=(), params=(), name="srv"):
    """A file-backed nbdkit (old random bytes, so a lost write shows) with
    a write delay, so a copy is still running when the test acts."""
    disk = random_file(shm / f"{name}.img", EXPORT)
    k = kit(name, ["--filter=delay", *[f"--filter={f}" for f in filters],
                   "file", disk, "wdelay=4ms", *params], tcp=tcp)
    k.disk = disk
    return k


class Paused:
    """SIGSTOP the server; SIGCONT on exit (also when the test fails, or
    the kit's teardown would wait on a stopped process)."""

    def __init__(self, k):
        self.pid = k.proc.pid

    def __enter__(self):
        os.kill(self.pid, signal.SIGSTOP)
        return self

    def __exit__(self, *exc):
        os.kill(self.pid, signal.SIGCONT)


def test_stall_short_pause_ridden_out(kit, mount, shm, bg, tally):
    """Default options; the server is paused for 2 s in the middle of a
    copy: the copy completes, the bytes are right, nothing is logged as a
    warning or error (no reconnection was needed)."""
    k = slow_kit(kit, shm)
    m = mount(k.target, "--request-size", "512K")
    src = random_file(shm / "src.img", SRC)
    cp = bg(["dd", f"if={src}", f"of={m.file}", "bs=1M", "conv=fsync"],
            shm / "cp.err")
    wait_progress(cp, written_bytes, 8 * MiB)
    with Paused(k):
        time.sleep(2)
    rc = cp.wait(180)
    out = judge(tally, "pause-2s", rc, src, sha256_prefix(k.disk, SRC),
                sha256_mount(m.file, SRC), cp.stderr)
    assert out == "match", f"rc {rc}\n{cp.stderr}\n{m.stderr}"
    assert "no reply" not in m.stderr, m.stderr
    m.unmount()                        # exit 0, no warning lines


def test_stall_past_request_timeout_cleared_by_write_replies(kit, mount,
                                                            shm, bg, tally):
    """A write-only copy (dd, no read of the disk); the server is silent
    past --request-timeout (2 s), so the connection holds new requests
    back, then answers again well before --retry-timeout (8 s more) runs
    out.  Its replies to writes end the stall: the copy completes, the
    bytes are right, and the log says the server answers again.  (Were
    only read replies to end it, this copy would stay held back and fail
    at the retry deadline.)"""
    k = slow_kit(kit, shm)
    m = mount(k.target, "--request-timeout", "2", "--retry-timeout", "8",
              "--request-size", "512K", expect_errors=True)
    src = random_file(shm / "src.img", SRC)
    cp = bg(["dd", f"if={src}", f"of={m.file}", "bs=1M", "conv=notrunc,fsync"],
            shm / "cp.err")
    wait_progress(cp, written_bytes, 8 * MiB)
    with Paused(k):
        time.sleep(4)
    rc = cp.wait(180)
    out = judge(tally, "pause-past-request-timeout-write-only", rc, src,
                sha256_prefix(k.disk, SRC), sha256_mount(m.file, SRC),
                cp.stderr)
    assert out == "match", f"rc {rc}\n{cp.stderr}\n{m.stderr}"
    assert re.search(r"no reply from the server for 2 s", m.stderr), m.stderr
    assert "the server answers again" in m.stderr, m.stderr
    assert m.unmount(check=False) == 0, m.stderr


@pytest.mark.parametrize("tcp", [False, True], ids=["unix", "tcp"])
def test_stall_paused_for_good_fsync_fails(kit, mount, shm, bg, tally, tcp):
    """The server is paused for good mid-copy (dd conv=fsync): dd fails
    (EIO) instead of hanging, the log says why and names the lost ranges,
    unmount completes and the daemon exits 1."""
    k = slow_kit(kit, shm, tcp=tcp)
    m = mount(k.target, "--request-timeout", "2", "--retry-timeout", "3",
              "--request-size", "512K", expect_rc=1, expect_errors=True)
    src = random_file(shm / "src.img", SRC)
    cp = bg(["dd", f"if={src}", f"of={m.file}", "bs=1M", "conv=fsync"],
            shm / "cp.err")
    wait_progress(cp, written_bytes, 8 * MiB)
    with Paused(k):
        rc = cp.wait(120)              # fails the test if dd hangs
        judge(tally, f"paused-for-good-{'tcp' if tcp else 'unix'}", rc, src,
              sha256_prefix(k.disk, SRC), None, cp.stderr)
        assert rc != 0, f"dd exited 0 on a paused server\n{m.stderr}"
        assert re.search(r"Input/output error", cp.stderr), cp.stderr
        text = m.stderr
        assert re.search(r"no reply from the server for 2 s", text), text
        assert re.search(r"no reply from the server for 5 s "
                         r"\(--request-timeout 2 s \+ --retry-timeout 3 s\)",
                         text), text
        assert lost_ranges(text), f"no lost range named:\n{text}"
        assert m.unmount(check=True) == 1


def test_stall_close_and_unmount_on_paused_server(kit, mount, shm, tally):
    """Writes accepted into the pool, then the server pauses: close()
    returns EIO within bounded time (not never), and so does a later
    fsync through another handle; unmount completes and the daemon exits
    1 naming the lost range."""
    k = slow_kit(kit, shm)
    m = mount(k.target, "--request-timeout", "2", "--retry-timeout", "2",
              expect_rc=1, expect_errors=True)
    data = random_bytes(8 * MiB)
    fd = os.open(m.file, os.O_WRONLY)
    with Paused(k):
        os.pwrite(fd, data, 0)         # write-back: the pool takes it

        def close_it():
            try:
                os.close(fd)
                return 0
            except OSError as e:
                return e.errno
        state, err = in_thread(close_it, 120)
        assert state == "done", "close() hung on a paused server"
        assert err == 5, f"close() returned errno {err}, not EIO"

        def fsync_new():
            fd2 = os.open(m.file, os.O_WRONLY)
            try:
                os.fsync(fd2)
                return 0
            except OSError as e:
                return e.errno
            finally:
                try:
                    os.close(fd2)
                except OSError:
                    pass
        state, err = in_thread(fsync_new, 120)
        assert state == "done", "fsync() hung on a paused server"
        assert err == 5, f"fsync() returned errno {err}, not EIO"
        tally.record("paused-close", "loud")
        assert m.unmount(check=True) == 1
        text = m.stderr
        assert lost_ranges(text), f"no lost range named:\n{text}"
        assert re.search(r"request\(s\) failed during this mount", text), text


def test_stall_unmount_after_clean_copy_on_paused_server(kit, mount, shm,
                                                        tally):
    """Everything written was flushed, then the server pauses: unmount
    completes (the polite disconnect does not wait forever for the server
    to close) and the daemon exits 0 without a warning: nothing was
    lost."""
    k = slow_kit(kit, shm)
    m = mount(k.target, "--request-timeout", "2")
    data = random_bytes(8 * MiB)
    with open(m.file, "r+b") as f:
        f.write(data)
        os.fsync(f.fileno())
    with Paused(k):
        assert m.unmount(check=True) == 0
    want = sha256_file(_write(shm / "d", data))
    judge(tally, "paused-after-fsync", 0, want, sha256_prefix(k.disk, len(data)))


# ------------------------------------------------------------ ESHUTDOWN

def eshutdown_kit(kit, shm, flag):
    """nbdkit's error filter answers every write with ESHUTDOWN while the
    file flag exists; the connection itself stays up."""
    return slow_kit(kit, shm, filters=["error"], params=[
        "error=ESHUTDOWN", "error-pwrite-rate=100%", f"error-file={flag}"])


def test_stall_eshutdown_for_a_while_then_success(kit, mount, shm, bg,
                                                  tally):
    """Writes answered with ESHUTDOWN for a few seconds: the daemon drops
    the connection, reconnects and resends; once the server accepts
    writes again the copy completes with the right bytes."""
    flag = shm / "eshutdown"
    k = eshutdown_kit(kit, shm, flag)
    m = mount(k.target, "--request-size", "512K", "-C", "1",
              expect_rc=0, expect_errors=True)
    src = random_file(shm / "src.img", SRC)
    flag.touch()
    cp = bg(["dd", f"if={src}", f"of={m.file}", "bs=1M", "conv=fsync"],
            shm / "cp.err")
    deadline = time.monotonic() + timeout(60)
    while not re.search(r"the server answered write .* transport "
                        r"endpoint shutdown; reconnecting", m.stderr):
        assert time.monotonic() < deadline, f"no ESHUTDOWN seen\n{m.stderr}"
        assert cp.poll() is None, "the copy ended before any ESHUTDOWN"
        time.sleep(0.05)
    time.sleep(3)
    flag.unlink()
    rc = cp.wait(180)
    out = judge(tally, "eshutdown-a-while", rc, src,
                sha256_prefix(k.disk, SRC), sha256_mount(m.file, SRC),
                cp.stderr)
    assert out == "match", f"rc {rc}\n{cp.stderr}\n{m.stderr}"
    assert "reconnected" in m.stderr, m.stderr


def test_stall_eshutdown_for_good_fails_loudly(kit, mount, shm, bg, tally):
    """Writes answered with ESHUTDOWN for good: the copy fails (it does
    not hang on a request parked for a reconnection that never comes),
    the daemon exits 1."""
    flag = shm / "eshutdown"
    flag.touch()
    k = eshutdown_kit(kit, shm, flag)
    m = mount(k.target, "--request-size", "512K", "--retry-timeout", "3",
              expect_rc=1, expect_errors=True)
    src = random_file(shm / "src.img", SRC)
    cp = bg(["dd", f"if={src}", f"of={m.file}", "bs=1M", "conv=fsync"],
            shm / "cp.err")
    rc = cp.wait(120)
    judge(tally, "eshutdown-for-good", rc, src, sha256_prefix(k.disk, SRC),
          None, cp.stderr)
    assert rc != 0, f"dd exited 0 although every write failed\n{m.stderr}"
    assert re.search(r"could not reconnect within 3 s", m.stderr), m.stderr
    assert lost_ranges(m.stderr), m.stderr
    assert m.unmount(check=True) == 1


# ------------------------------------------------------------ TCP keepalive

def test_stall_tcp_keepalive_set(kit, mount, shm):
    """TCP connections carry keepalive probes (ss shows the keepalive
    timer on every one of the daemon's connections), so a partition is
    noticed even on an idle connection."""
    import subprocess
    k = slow_kit(kit, shm, tcp=True)
    m = mount(k.target, "-C", "2")
    r = subprocess.run(["ss", "-tnoH", "state", "established",
                        f"dport = :{k.port}"], capture_output=True,
                       text=True, check=True)
    lines = [l for l in r.stdout.splitlines() if l.strip()]
    assert len(lines) == 2, r.stdout
    for l in lines:
        assert "timer:(keepalive" in l, r.stdout
    data = random_bytes(4 * MiB)
    with open(m.file, "r+b") as f:
        f.write(data)
        os.fsync(f.fileno())
    assert sha256_prefix(k.disk, len(data)) == \
        sha256_file(_write(shm / "d", data))
    m.unmount()


def _write(path, data):
    path.write_bytes(data)
    return path
