"""Processes and waiting: poll for a condition, run a command with a hang
guard, run a call in a thread with a time limit, small /proc checks.
Every limit here is scaled by NBDFERRY_TIMEOUT_SCALE."""

import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from lib import env


def tail(path, n=20):
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def wait_for(pred, proc=None, what="condition", timeout=30, log=None):
    """Poll pred() until true.  Fails at once if proc exits first (showing
    the tail of log, if given), and after timeout seconds (scaled)."""
    deadline = time.monotonic() + timeout * env.SCALE
    delay = 0.002           # a daemon is ready in 10-30 ms: poll finely
    while True:
        if pred():
            return
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"{what}: process exited with {proc.returncode} "
                        f"before it was ready\n{tail(log) if log else ''}")
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not ready after {timeout * env.SCALE:.0f}s\n"
                        f"{tail(log) if log else ''}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.05)


def nonempty(path):
    path = Path(path)
    return lambda: path.exists() and path.stat().st_size > 0


def run(cmd, timeout=120, check=False, **kw):
    """Run a command (copy tool etc.) with a hang guard; capture output."""
    try:
        r = subprocess.run([str(c) for c in cmd], stdin=subprocess.DEVNULL,
                           capture_output=True, text=True,
                           timeout=timeout * env.SCALE, **kw)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(map(str, cmd))}: hung for more than "
                    f"{timeout * env.SCALE:.0f}s")
    if check and r.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {r.returncode}:\n"
                    f"{r.stderr}")
    return r


# TCP ports for servers the tests start: each pytest-xdist worker (gwN)
# takes them from its own block below the kernel's ephemeral range, so two
# workers never pick the same free port between the probe and the
# server's bind (the kernel's bind(0) is no such promise).
PORT_BASE, PORT_BLOCK = 12000, 2000
_next_port = [None]


def free_tcp_port():
    """A TCP port on 127.0.0.1 that nothing is bound to, from this
    worker's block (cycled; a port still bound or in TIME_WAIT is passed
    over)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    n = int(worker[2:]) if worker[2:].isdigit() else 0
    lo = PORT_BASE + (n % 10) * PORT_BLOCK
    if _next_port[0] is None:
        _next_port[0] = os.getpid() % PORT_BLOCK
    for _ in range(PORT_BLOCK):
        port = lo + _next_port[0]
        _next_port[0] = (_next_port[0] + 1) % PORT_BLOCK
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    pytest.fail(f"no free TCP port in {lo}-{lo + PORT_BLOCK - 1}")


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def in_thread(fn, secs):
    """Run fn in a daemon thread for at most secs (scaled).  Returns
    ("hung", None) if it is still running, else ("done", its result);
    re-raises its exception."""
    box = {}

    def body():
        try:
            box["ok"] = fn()
        except BaseException as e:              # re-raised below
            box["err"] = e
    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join(secs * env.SCALE)
    if t.is_alive():
        return "hung", t
    if "err" in box:
        raise box["err"]
    return "done", box.get("ok")


def open_paths(pid):
    """The paths a process has open (its /proc/PID/fd links).  A process
    may exit, or close a descriptor, while they are read: what is gone is
    left out (empty once it has exited), never an error."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return set()
    out = set()
    for fd in fds:
        try:
            out.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass
    return out


def oserror_errno(fn, *args):
    """Call fn; return 0 on success or the OSError's errno."""
    try:
        fn(*args)
        return 0
    except OSError as e:
        return e.errno


def punch_hole(fd, offset, length):
    """fallocate(fd, PUNCH_HOLE | KEEP_SIZE, offset, length) through this
    process's own descriptor, as cp --sparse=always does (the fallocate(1)
    tool would be a second process opening the file for writing, which
    the mount refuses while this one writes)."""
    import ctypes
    import ctypes.util
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64,
                               ctypes.c_int64]
    if libc.fallocate(fd, 0x02 | 0x01, offset, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
