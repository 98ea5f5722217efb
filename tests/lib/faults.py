"""Helpers for the reliability tests (faults, reconnect, TLS, security,
stress): a restartable nbdkit, a connection-dropping proxy, a copy judge
that tallies every fault case, and small /proc readers.  The fixtures over
them (tally, bg, kit, drop_proxy) are in conftest.py.

The judge is the heart of it: after every copy made under a fault, the
bytes on the server are compared with the source.  A copy tool that exits
0 while the server's bytes differ is *silent corruption*: the test fails
and the tally counts it.  The tally of the session is written to
tests/.fault-summary (one JSON object) and printed by scripts/test-sanitizers
and .ci/run; under pytest-xdist each worker hands its tally to the
controller, which adds them up (conftest.py).
"""

import atexit
import contextlib
import json
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from lib import env
from lib.digest import sha256_file
from lib.env import TESTS, timeout
from lib.procs import free_tcp_port, nonempty, wait_for
from lib.servers import plugin_path

SUMMARY = TESTS / ".fault-summary"
IN_WORKER = "PYTEST_XDIST_WORKER" in os.environ


# ------------------------------------------------------------------ tally

class Tally:
    """Outcomes of copies made under faults, for the whole session.

    loud:   the copy tool exited non-zero (the failure was reported)
    match:  the tool exited 0 and the server holds the source's bytes
    silent: the tool exited 0 but the bytes differ (must stay 0)
    Loud failures whose bytes happen to match anyway are counted in
    loud_but_intact too (informational)."""

    def __init__(self):
        self.cases = {}
        self.counts = {"loud": 0, "match": 0, "silent": 0,
                       "loud_but_intact": 0}

    def record(self, case, outcome, intact=None):
        self.counts[outcome] += 1
        if outcome == "loud" and intact:
            self.counts["loud_but_intact"] += 1
        c = self.cases.setdefault(case, {"loud": 0, "match": 0, "silent": 0})
        c[outcome] += 1
        self.save()

    def data(self):
        return {"copies": sum(self.counts[k] for k in ("loud", "match",
                                                        "silent")),
                "cases": len(self.cases), **self.counts,
                "build": os.environ.get("NBDFERRY_BUILD", ""),
                "by_case": self.cases}

    def merge(self, data):
        """Add a pytest-xdist worker's tally (its data()) to this one."""
        for k in self.counts:
            self.counts[k] += data.get(k, 0)
        for case, outcomes in data.get("by_case", {}).items():
            c = self.cases.setdefault(case, {"loud": 0, "match": 0,
                                             "silent": 0})
            for k, n in outcomes.items():
                c[k] += n

    def save(self):
        """Write the summary file; a pytest-xdist worker leaves that to
        the controller, which merges the workers' tallies (conftest.py)."""
        if IN_WORKER:
            return
        with contextlib.suppress(OSError):
            SUMMARY.write_text(json.dumps(self.data(), indent=1,
                                          sort_keys=True) + "\n")

    def line(self):
        c = self.counts
        return (f"fault tally: {len(self.cases)} cases, "
                f"{c['loud'] + c['match'] + c['silent']} copies: "
                f"{c['loud']} failed loudly ({c['loud_but_intact']} of them "
                f"with intact bytes anyway), {c['match']} succeeded with "
                f"matching digests, {c['silent']} silent corruption")


TALLY = Tally()          # the session's; conftest's tally fixture yields it


@atexit.register
def _print_tally():
    if TALLY.cases and not IN_WORKER:
        print("\n" + TALLY.line())


def judge(tally, case, rc, src, server_sha, mount_sha=None, stderr=""):
    """Record one copy's outcome.  src: path of the source (or its sha256
    hex); server_sha: sha256 of the same number of bytes read from the
    server (or the backing file).  Fails the test on silent corruption."""
    want = src if isinstance(src, str) and len(src) == 64 else \
        sha256_file(src)
    intact = server_sha == want and (mount_sha is None or mount_sha == want)
    if rc != 0:
        tally.record(case, "loud", intact)
        return "loud"
    if intact:
        tally.record(case, "match")
        return "match"
    tally.record(case, "silent")
    pytest.fail(f"{case}: SILENT CORRUPTION: the copy tool exited 0 but "
                f"the server's sha256 {server_sha} (mount {mount_sha}) is "
                f"not the source's {want}\n{stderr}")


def sha256_prefix(path, n):
    """sha256 of the first n bytes of a file (the backing file of a file
    plugin server: what the server really holds)."""
    return sha256_file(path, length=n)


def sha256_mount(path, n):
    try:
        return sha256_prefix(path, n)
    except OSError as e:
        return f"unreadable: {e}"


# -------------------------------------------------------------- processes

def written_bytes(pid):
    """Bytes a process has written so far (/proc/PID/io wchar)."""
    try:
        with open(f"/proc/{pid}/io") as f:
            return int(next(l for l in f if l.startswith("wchar")).split()[1])
    except (OSError, StopIteration, ValueError):
        return 0


def read_bytes(pid):
    try:
        with open(f"/proc/{pid}/io") as f:
            return int(next(l for l in f if l.startswith("rchar")).split()[1])
    except (OSError, StopIteration, ValueError):
        return 0


def children(pid):
    """Direct children of a process (all threads)."""
    out = []
    for t in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            out += [int(c) for c in (t / "children").read_text().split()]
    return out


def wait_progress(proc, pid_fn, nbytes, secs=60):
    """Wait until a running copy has moved nbytes (per pid_fn: written or
    read bytes); fails if it finished first."""
    deadline = time.monotonic() + secs * env.SCALE
    while pid_fn(proc.pid) < nbytes:
        if proc.poll() is not None:
            pytest.fail(f"the copy finished (rc {proc.returncode}) before "
                        f"{nbytes} bytes moved: make the server slower")
        if time.monotonic() > deadline:
            pytest.fail(f"the copy did not reach {nbytes} bytes")
        time.sleep(0.02)


class Copy:
    """A copy tool running in the background, stderr to a file."""

    def __init__(self, cmd, errpath):
        self.cmd = [str(c) for c in cmd]
        self.errpath = Path(errpath)
        with open(self.errpath, "wb") as e:
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=e)
        self.pid = self.proc.pid

    def poll(self):
        return self.proc.poll()

    @property
    def returncode(self):
        return self.proc.returncode

    def wait(self, secs=120):
        try:
            return self.proc.wait(timeout(secs))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            pytest.fail(f"{' '.join(self.cmd)}: hung for {timeout(secs):.0f}s"
                        f"\n{self.stderr}")

    @property
    def stderr(self):
        return self.errpath.read_text(errors="replace")

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


# -------------------------------------------------- a restartable nbdkit

class Kit:
    """An nbdkit that can be killed and started again on the same socket
    or port (conftest's server fixture picks a new socket per start)."""

    def __init__(self, d, name, args, tcp=False, extra=()):
        self.dir = Path(d)
        self.name = name
        self.args = [str(a) for a in args]
        self.extra = [str(a) for a in extra]
        self.sock = self.dir / f"{name}.sock"
        self.pidfile = self.dir / f"{name}.pid"
        self.port = None
        if tcp:
            self.port = free_tcp_port()
            self.uri = f"nbd://127.0.0.1:{self.port}/"
            self.target = ["--tcp", "127.0.0.1", str(self.port)]
        else:
            self.uri = f"nbd+unix:///?socket={self.sock}"
            self.target = ["--unix", str(self.sock)]
        self.proc = None
        self.starts = 0

    def start(self):
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("already running")
        # A kill -9'ed nbdkit leaves its socket and pidfile behind.
        for p in (self.sock, self.pidfile):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
        self.starts += 1
        self.stderr = self.dir / f"{self.name}.{self.starts}.err"
        cmd = ["nbdkit", "--exit-with-parent", "-f", "-P", str(self.pidfile)]
        if self.port:
            cmd += ["-i", "127.0.0.1", "-p", str(self.port)]
        else:
            cmd += ["-U", str(self.sock)]
        cmd += self.extra + self.args
        self.cmd = cmd
        with open(self.stderr, "wb") as e:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                         stdout=e, stderr=e)
        wait_for(nonempty(self.pidfile), self.proc, "nbdkit", 30,
                 log=self.stderr)
        return self

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


# ------------------------------------------------ a connection-dropping proxy

class DropProxy:
    """Unix-socket proxy in front of an NBD server that cuts each
    connection once `limit` bytes have passed in the direction `direction`
    ("up": client to server, i.e. requests and write payloads; "down":
    replies and read payloads), usually in the middle of a request.  After
    `drops` connections have been cut it forwards without limits, so a
    daemon that reconnects always finishes.  New connections are always
    accepted: the server stays up, only connections die.

    The cut is the client's alone (its socket shut down both ways, as a
    network or a server restart would cut it).  The server's side is
    retired as the daemon retires a connection it gives up on: nothing
    more is forwarded to it, its replies to what it already holds are read
    and dropped, and only once it has been quiet for QUIET seconds is its
    socket shut down.  Closing it at once, with replies pending, makes
    Debian 12's nbdkit 1.32 abort (raw_send_socket: assertion 'sock >=
    0'), and every later reconnect is refused: a failure of the test's
    own making, not the daemon's."""

    QUIET = 1.0                          # s without a reply: retire
    TICK = 0.1                           # s between looks at the cut

    def __init__(self, path, target_sock, limit, direction="up", drops=4):
        self.path = str(path)
        self.target = str(target_sock)
        self.limit = limit
        self.direction = direction
        self.drops_left = drops
        self.dropped = 0
        self.accepted = 0
        self.lock = threading.Lock()
        self.stopping = False
        self.socks = []
        self.errors = []
        self.ls = socket.socket(socket.AF_UNIX)
        self.ls.bind(self.path)
        self.ls.listen(64)
        self.t = threading.Thread(target=self._accept, daemon=True)
        self.t.start()

    def _accept(self):
        # Never stop accepting before close(): a proxy that stopped would
        # look like a server that refuses connections (the daemon's
        # reconnect fails, "Connection refused"), a failure of the test's
        # own making.  Errors are kept in self.errors for the report.
        while not self.stopping:
            try:
                c, _ = self.ls.accept()
            except OSError as e:
                if self.stopping:
                    return
                self.errors.append(f"accept: {e}")
                time.sleep(0.01)
                continue
            try:
                self._serve(c)
            except Exception as e:       # a thread that would not start
                self.errors.append(f"serve: {e!r}")
                with contextlib.suppress(OSError):
                    c.close()

    def _serve(self, c):
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(self.target)
        except OSError as e:
            self.errors.append(f"connect to the server: {e}")
            c.close()
            return
        c.settimeout(self.TICK)
        s.settimeout(self.TICK)
        with self.lock:
            self.accepted += 1
            limited = self.drops_left > 0
            if limited:
                self.drops_left -= 1
            self.socks += [c, s]
        st = {"n": 0, "cut": False}
        for src, dst, d in ((c, s, "up"), (s, c, "down")):
            threading.Thread(target=self._pump,
                             args=(src, dst, limited and
                                   d == self.direction, st, c, s),
                             daemon=True).start()

    def _cut(self, st, c):
        """Cut the client's side (once)."""
        with self.lock:
            if st["cut"]:
                return
            st["cut"] = True
            self.dropped += 1
        with contextlib.suppress(OSError):
            c.shutdown(socket.SHUT_RDWR)

    def _pump(self, src, dst, counted, st, c, s):
        try:
            while not self.stopping:
                try:
                    b = src.recv(256 * 1024)
                except socket.timeout:
                    if st["cut"]:
                        break
                    continue
                if not b:
                    break
                if st["cut"]:
                    break
                if counted:
                    room = self.limit - st["n"]
                    if len(b) >= room:
                        dst.sendall(b[:max(room, 0)])
                        st["n"] = self.limit
                        self._cut(st, c)
                        break
                    st["n"] += len(b)
                dst.sendall(b)
        except OSError:
            pass
        if not st["cut"]:
            # An end closed by its owner (the daemon's unmount, the
            # server's exit): pass the close on.
            for x in (c, s):
                with contextlib.suppress(OSError):
                    x.shutdown(socket.SHUT_RDWR)
            return
        with contextlib.suppress(OSError):
            c.shutdown(socket.SHUT_RDWR)
        if src is s:
            self._retire(s)

    def _retire(self, s):
        """Read and drop the server's replies until it has been quiet for
        QUIET seconds (or closed), then shut its socket down."""
        quiet = time.monotonic()
        try:
            while not self.stopping and \
                    time.monotonic() - quiet < self.QUIET:
                try:
                    b = s.recv(256 * 1024)
                except socket.timeout:
                    continue
                if not b:
                    break
                quiet = time.monotonic()
        except OSError:
            pass
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)

    def close(self):
        self.stopping = True
        with contextlib.suppress(OSError):
            self.ls.close()
        for x in self.socks:
            with contextlib.suppress(OSError):
                x.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)


# ------------------------------------------------------------- the daemon

def status_json(m):
    """The mount's live status (MP/.nbdferry-status) as a dict, or None."""
    try:
        return json.loads((Path(m.mp) / ".nbdferry-status").read_text())
    except (OSError, ValueError):
        return None


def lost_ranges(text):
    """(kind, length, offset) of every 'KIND of N bytes at offset X
    failed' line in the daemon's log."""
    import re
    return [(k, int(n), int(o)) for k, n, o in re.findall(
        r"(write|zero|flush|read) of (\d+) bytes at offset (\d+) failed",
        text)]


def is_sanitized(binary):
    """True if the binary links a sanitizer runtime (no valgrind then)."""
    r = subprocess.run(["ldd", str(binary)], capture_output=True, text=True)
    return any(s in r.stdout for s in ("libasan", "libtsan", "libubsan"))


__all__ = [n for n in dir() if not n.startswith("_")]


# ------------------------------------------- a disk whose flush can fail

def flushfail_server(server, d, disk, flag, rate):
    """server(...) running tests/nbdkit-plugins/flushfail.c on disk: while
    the file flag exists, each flush fails with EIO with probability rate
    percent (nbdkit 1.32's error filter cannot fail NBD flush).  d is
    unused (kept for the callers)."""
    srv = server(plugin_path("flushfail"), f"file={disk}", f"flag={flag}",
                 f"flush-error-rate={rate}")
    srv.disk = disk
    return srv
