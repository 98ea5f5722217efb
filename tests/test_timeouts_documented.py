"""Every documented timeout, measured against the figure the docs give.

Each case times one deadline on real parts (nbdkit paused with SIGSTOP,
killed, replaced by a listener that never answers the handshake) and
checks it against what docs/nbdferry.1, docs/nbdferry-verify.1 and
docs/user-guide.md say.  The margin, the same for all: no earlier than
the documented time - 0.2 s (the deadline runs from the last reply or
the loss, at most a few milliseconds before the test's clock starts), no
later than the documented time + 25 % + 2 s (a loaded 2-core machine
delays a wake-up by a second at worst; a deadline missed by a whole
connect attempt, as the 118 s instead of 90 s this issue found, is far
outside it).

| deadline (docs) | case |
| --request-timeout S + --retry-timeout R: a copy onto a paused server fails (90 s with the defaults) | test_deadline_paused_server_defaults |
| --retry-timeout R after a killed server's loss (user guide: 60 s with the default) | test_deadline_killed_server |
| no connect attempt runs past the retry deadline (each capped at the time left) | test_deadline_connect_attempt_capped |
| a heal tries one connection within --request-timeout | test_deadline_heal_try |
| the block status scan waits --request-timeout for a reply, 15 s at most | test_deadline_scan |
| --list-timeout: the whole listing | test_deadline_list |
| nbdferry-verify --request-timeout | test_deadline_verify |

The 2 + 3 s paused-server case is test_stall_times.py (a tighter margin,
as it guards a regression of 0.9 s)."""

import errno
import os
import signal
import socket
import subprocess
import threading
import time

import pytest

from lib.env import MiB, NBDFERRY, daemon_cmd, timeout
from lib.faults import wait_progress, written_bytes
from lib.images import random_file
from lib.procs import run

from test_verify import VERIFY


def within(took, documented, what):
    lo, hi = documented - 0.2, documented * 1.25 + 2
    print(f"{what}: {took:.2f} s (documented {documented} s, allowed "
          f"{lo:.1f}-{hi:.1f} s)")
    assert lo <= took <= hi, (what, took, documented)


def paused_copy_fails(kit, mount, shm, bg, opts, documented, what):
    k = kit("srv", ["--filter=delay", "memory", f"size={96 * MiB}",
                    "wdelay=20ms"])
    m = mount(k.target, *opts, "--request-size", "512K", "--pool-size",
              "16M", expect_rc=1, expect_errors=True)
    src = random_file(shm / "src.img", 64 * MiB)
    cp = bg(["dd", f"if={src}", f"of={m.file}", "bs=1M",
             "conv=notrunc,fsync"], shm / "cp.err")
    wait_progress(cp, written_bytes, 24 * MiB)    # past the pool: waiting
    os.kill(k.proc.pid, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        rc = cp.wait(documented * 2 + 60)
        took = time.monotonic() - t0
    finally:
        os.kill(k.proc.pid, signal.SIGCONT)
    assert rc != 0 and "Input/output error" in cp.stderr, cp.stderr
    within(took, documented, what)
    assert m.unmount(check=True) == 1


def test_deadline_paused_server_defaults(kit, mount, shm, bg):
    """The defaults, 30 + 60 s: 90 s (118 s before: one more 30 s
    connect attempt after the server was given up on)."""
    paused_copy_fails(kit, mount, shm, bg, (), 90,
                      "paused server, default timeouts")


def killed_copy(kit, mount, shm, bg, opts):
    k = kit("srv", ["--filter=delay", "memory", f"size={64 * MiB}",
                    "wdelay=20ms"])
    m = mount(k.target, *opts, "--request-size", "512K", "-C", "1",
              "--depth", "2", expect_rc=None, expect_errors=True)
    src = random_file(shm / "src.img", 32 * MiB)
    cp = bg(["dd", f"if={src}", f"of={m.file}", "bs=1M", "conv=fsync"],
            shm / "cp.err")
    wait_progress(cp, written_bytes, 4 * MiB)
    return k, m, cp


def test_deadline_killed_server(kit, mount, shm, bg):
    """Killed (its socket left: every try is refused at once): the copy
    fails --retry-timeout after the loss."""
    k, m, cp = killed_copy(kit, mount, shm, bg,
                           ("--request-timeout", "2", "--retry-timeout", "4"))
    k.kill()
    t0 = time.monotonic()
    rc = cp.wait(60)
    took = time.monotonic() - t0
    assert rc != 0, cp.stderr
    within(took, 4, "killed server, --retry-timeout 4")


class Mute:
    """A Unix socket that accepts connections and never says a word: a
    connect succeeds, the NBD handshake never comes."""

    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX)
        self.s.bind(str(path))
        self.s.listen(64)
        self.held = []
        self.t = threading.Thread(target=self._accept, daemon=True)
        self.t.start()

    def _accept(self):
        while True:
            try:
                c, _ = self.s.accept()
            except OSError:
                return
            self.held.append(c)

    def close(self):
        self.s.close()
        for c in self.held:
            c.close()


def test_deadline_connect_attempt_capped(kit, mount, shm, bg):
    """The server is killed and its socket taken by one that accepts and
    never answers: each reconnect's handshake would wait
    --request-timeout (30 s), but the copy still fails --retry-timeout
    (3 s) after the loss: an attempt is cut at the time left."""
    k, m, cp = killed_copy(kit, mount, shm, bg,
                           ("--request-timeout", "30", "--retry-timeout",
                            "3"))
    k.kill()
    t0 = time.monotonic()
    k.sock.unlink()
    mute = Mute(k.sock)
    try:
        rc = cp.wait(120)
        took = time.monotonic() - t0
    finally:
        mute.close()
    assert rc != 0, cp.stderr
    assert mute.held, "no reconnect attempt reached the mute socket"
    within(took, 3, "handshake never answered, --retry-timeout 3")


def test_deadline_heal_try(kit, mount, shm, bg):
    """Given up on, the server stays paused: the next write tries one
    connection, which waits --request-timeout for the handshake, then
    fails with EIO."""
    k, m, cp = killed_copy(kit, mount, shm, bg,
                           ("--request-timeout", "3", "--retry-timeout", "1"))
    os.kill(k.proc.pid, signal.SIGSTOP)
    try:
        assert cp.wait(60) != 0, cp.stderr
        fd = os.open(m.file, os.O_WRONLY)
        t0 = time.monotonic()
        try:
            os.pwrite(fd, b"x" * 4096, 0)
            os.fsync(fd)
            raise AssertionError("a write succeeded on a paused server")
        except OSError as e:
            took = time.monotonic() - t0
            assert e.errno == errno.EIO, e
        finally:
            try:
                os.close(fd)
            except OSError:
                pass
    finally:
        os.kill(k.proc.pid, signal.SIGCONT)
    within(took, 3, "a heal try on a paused server, --request-timeout 3")


@pytest.mark.parametrize("req_t,documented", [(2, 2), (None, 15)],
                         ids=["request-timeout-2", "default-15s-cap"])
def test_deadline_scan(server, shortdir, req_t, documented):
    """Block status that never answers: the mount is ready once the scan
    gave it up, --request-timeout later, 15 s at most (the default
    request timeout is 30 s)."""
    srv = server("memory", f"size={64 * MiB}", "delay-extents=3600",
                 filters=["delay"])
    mp = shortdir / "mp"
    mp.mkdir()
    pidfile = shortdir / "pid"
    opts = ["--request-timeout", str(req_t)] if req_t else []
    t0 = time.monotonic()
    p = subprocess.Popen(daemon_cmd("-f", "-P", pidfile, *opts, mp,
                                    srv.uri),
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    try:
        while not (pidfile.exists() and pidfile.read_text().strip()):
            assert p.poll() is None, p.stderr.read()
            assert time.monotonic() - t0 < timeout(120), "never ready"
            time.sleep(0.02)
        took = time.monotonic() - t0
    finally:
        subprocess.run(["fusermount3", "-u", str(mp)])
        p.wait(60)
    within(took, documented, f"block status scan, --request-timeout "
                             f"{req_t or 'default'}")


def test_deadline_list(server, tmp_path):
    """--list over a server that takes 1 s per export: done at the
    listing's deadline, --list-timeout 3."""
    d = tmp_path / "disks"
    d.mkdir()
    for i in range(10):
        with open(d / f"disk{i}", "wb") as f:
            f.truncate(MiB)
    srv = server("file", f"dir={d}", "delay-open=1", filters=["delay"])
    t0 = time.monotonic()
    r = run([NBDFERRY, "--list-timeout", "3", "--list", srv.uri],
            timeout=60)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    within(took, 3, "--list-timeout 3")


def test_deadline_verify(server):
    """nbdferry-verify against a server that holds every read: exit 2
    --request-timeout after the last byte."""
    srv = server("data", "data=1 2 3 @1048575 4", "rdelay=3600",
                 filters=["delay"])
    t0 = time.monotonic()
    p = subprocess.run([str(VERIFY), "--request-timeout=2", srv.uri],
                       capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    assert p.returncode == 2, p.stderr
    within(took, 2, "nbdferry-verify --request-timeout=2")
