"""Child processes: spawn, wait with a timeout and rusage, clean up.

Every process and mount the bench starts is registered here, and
cleanup() (atexit and on SIGINT/SIGTERM) unmounts and kills exactly those,
by pid, never by name.
"""

import atexit
import os
import signal
import subprocess
import sys
import threading
import time

_live = {}          # pid -> argv[0], processes we started and not reaped
_mounts = set()     # mountpoints we may have left mounted
CLK_TCK = os.sysconf("SC_CLK_TCK")


class Timeout(Exception):
    pass


def spawn(argv, log=None, stdout=None):
    """Start argv; stderr (and stdout unless given) go to the file 'log'."""
    out = open(log, "ab") if log else subprocess.DEVNULL
    try:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                             stdout=stdout if stdout is not None else out,
                             stderr=out, close_fds=True)
    finally:
        if log:
            out.close()
    _live[p.pid] = argv[0]
    return p


def wait4(p, timeout):
    """Reap p; return (exit code, rusage).  Raises Timeout after 'timeout' s
    (p is left running; the caller decides whether to kill it).  One reaper
    thread per process, so a later call after a Timeout picks up its result."""
    t = getattr(p, "_reaper", None)
    if t is None:
        box = p._reaped = {}

        def reap():
            try:
                box["r"] = os.wait4(p.pid, 0)
            except ChildProcessError as e:
                box["err"] = e

        t = p._reaper = threading.Thread(target=reap, daemon=True)
        t.start()
    t.join(timeout)
    if t.is_alive():
        raise Timeout(f"{p.args[0]} (pid {p.pid}) still running after "
                      f"{timeout:.0f} s")
    _live.pop(p.pid, None)
    if "err" in p._reaped:
        return (p.returncode if p.returncode is not None else -1), None
    _, status, ru = p._reaped["r"]
    p.returncode = os.waitstatus_to_exitcode(status)   # keep Popen quiet
    return p.returncode, ru


def kill(p, sig=signal.SIGTERM, grace=5.0):
    """Stop p (ours) and reap it; returns rusage or None."""
    if p.returncode is not None:
        return None
    try:
        os.kill(p.pid, sig)
    except ProcessLookupError:
        pass
    try:
        return wait4(p, grace)[1]
    except Timeout:
        os.kill(p.pid, signal.SIGKILL)
        return wait4(p, grace)[1]


class Daemon:
    """A server that forks into the background (nbd-server): known by the
    pid in its pidfile, stopped by that pid only.  Looks enough like a
    Popen for proc_cpu_seconds() and kill()."""

    def __init__(self, pid, name):
        self.pid = pid
        self.args = [name]
        self.returncode = None
        _live[pid] = name

    def alive(self):
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False


def stop_daemon(d, grace=5.0):
    """SIGTERM, then SIGKILL after grace seconds; d is not our child, so
    poll /proc instead of waiting."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(d.pid, sig)
        except ProcessLookupError:
            break
        end = time.monotonic() + grace
        while d.alive() and time.monotonic() < end:
            time.sleep(0.02)
        if not d.alive():
            break
    d.returncode = 0
    _live.pop(d.pid, None)


def cpu_seconds(ru):
    return ru.ru_utime + ru.ru_stime if ru else None


def proc_cpu_seconds(pid):
    """utime+stime of a live process from /proc/PID/stat (all threads),
    plus its children: the reaped ones (cutime+cstime) and the live ones
    (a forking server such as nbd-server serves each client in a child)."""
    def stat(p):
        with open(f"/proc/{p}/stat") as f:
            s = f.read()
        return s[s.rfind(")") + 2:].split()
    try:
        fields = stat(pid)
    except OSError:
        return None
    total = sum(int(x) for x in fields[11:15])
    for d in os.listdir("/proc"):
        if d.isdigit() and d != str(pid):
            try:
                f = stat(d)
            except OSError:
                continue
            if f[1] == str(pid):
                total += int(f[11]) + int(f[12])
    return total / CLK_TCK


def system_busy_seconds():
    """CPU seconds all CPUs have spent not idle since boot (/proc/stat)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)       # idle + iowait
    return (sum(v[:8]) - idle) / CLK_TCK            # guest is inside user


def wait_for_file(path, p, timeout, what):
    """Wait until 'path' is non-empty; fail early if p exits."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if os.path.exists(path) and os.path.getsize(path) > 0:
            return
        if p.poll() is not None:
            _live.pop(p.pid, None)
            raise RuntimeError(f"{what} exited with status {p.returncode} "
                               f"before it was ready")
        time.sleep(0.01)
    raise Timeout(f"{what} not ready after {timeout:.0f} s")


def add_mount(mnt):
    _mounts.add(mnt)


def unmount(mnt, lazy=False):
    argv = ["fusermount3", "-u"] + (["-z"] if lazy else []) + [mnt]
    r = subprocess.run(argv, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if r.returncode == 0:
        _mounts.discard(mnt)
    return r.returncode, r.stderr.decode(errors="replace").strip()


def is_mounted(mnt):
    mnt = os.path.realpath(mnt)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == mnt for line in f)


def cleanup():
    for mnt in list(_mounts):
        if is_mounted(mnt):
            unmount(mnt, lazy=True)
        _mounts.discard(mnt)
    for pid in list(_live):
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        _live.pop(pid, None)


def _on_signal(signum, frame):
    cleanup()
    sys.exit(128 + signum)


def install_cleanup():
    atexit.register(cleanup)
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
