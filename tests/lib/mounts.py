"""nbdferry mounts: start the daemon on a fresh mountpoint, unmount it and
judge its exit (exit code, error lines in its stderr), /proc/mounts
checks, a memory sampler.

start_mount() and finish_mounts() are the body of conftest's ``mount``
fixture; the fixture owns the list of mounts."""

import contextlib
import fcntl
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from lib import env
from lib.env import daemon_cmd, timeout
from lib.procs import nonempty, tail, wait_for

# The kernel's FUSE knobs (/proc/sys/fs/fuse/*) are global to the machine
# and taken by a mount when it starts.  A test that sets one for its own
# mount (test_fuse_timeout) holds this lock exclusively while the knob is
# set; every other mount start holds it shared, so that no test's mount
# starts under a knob meant for another (a 30 s kernel request timeout,
# under which a stalled request aborts the whole mount).
KNOB_LOCK = Path("/tmp/nbdferry-tests-fuse-knobs.lock")
_knobs_held = [False]


@contextlib.contextmanager
def fuse_knobs(exclusive=False):
    """Hold the knob lock: exclusive to set a knob, shared to start a
    mount (a no-op in the process that holds it exclusively)."""
    if _knobs_held[0]:
        yield
        return
    with open(KNOB_LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        _knobs_held[0] = exclusive
        try:
            yield
        finally:
            _knobs_held[0] = False
            fcntl.flock(f, fcntl.LOCK_UN)


# Lines in the daemon's stderr that fail a test unless it expects errors.
BAD_STDERR = re.compile(
    r"error|warning|AddressSanitizer|LeakSanitizer|ThreadSanitizer|"
    r"UndefinedBehaviorSanitizer|runtime error|Sanitizer", re.I)
# valgrind's own chatter ("==123== ERROR SUMMARY: 0 errors") is judged by
# --error-exitcode, not by this scan.
VALGRIND_LINE = re.compile(r"^==\d+==")


def mounted_paths():
    with open("/proc/mounts") as f:
        return {line.split()[1].replace("\\040", " ") for line in f}


def is_mounted(mp):
    return os.path.realpath(mp) in mounted_paths()


def fusermount_u(mp, wait=10):
    """fusermount3 -u, retried while busy; lazy as the last resort.
    Returns True if the normal unmount succeeded."""
    deadline = time.monotonic() + wait * env.SCALE
    while is_mounted(mp):
        r = subprocess.run(["fusermount3", "-u", str(mp)],
                           capture_output=True, text=True)
        if r.returncode == 0:
            return True
        if time.monotonic() > deadline:
            subprocess.run(["fusermount3", "-u", "-z", str(mp)],
                           capture_output=True)
            return False
        time.sleep(0.1)
    return True



def stderr_problems(text):
    bad = []
    for line in text.splitlines():
        if VALGRIND_LINE.match(line):
            continue
        if BAD_STDERR.search(line):
            bad.append(line)
    return bad


class Mount(SimpleNamespace):
    """A running nbdferry -f.  mp (mountpoint), file (the raw file), proc,
    pid, stderr_path, expect_rc, expect_errors."""

    @property
    def stderr(self):
        return Path(self.stderr_path).read_text(errors="replace")

    def rss(self):
        """(VmRSS, VmHWM) of the daemon in bytes, or None once it is gone."""
        try:
            with open(f"/proc/{self.pid}/status") as f:
                st = dict(l.split(":", 1) for l in f if ":" in l)
            return (int(st["VmRSS"].split()[0]) * 1024,
                    int(st["VmHWM"].split()[0]) * 1024)
        except (OSError, KeyError):
            return None

    def wait_exit(self, secs=120):
        try:
            return self.proc.wait(timeout(secs))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            fusermount_u(self.mp, wait=1)
            self.checked = True
            pytest.fail(f"nbdferry (pid {self.pid}) did not exit within "
                        f"{timeout(secs):.0f}s of being unmounted; killed.\n"
                        f"stderr:\n{tail(self.stderr_path)}")

    def unmount(self, check=True, secs=120):
        """fusermount3 -u, wait for the daemon to exit; returns its rc.
        With check, asserts rc and stderr as the mount was set up to."""
        fusermount_u(self.mp)
        rc = self.wait_exit(secs)
        if check:
            self.check(rc)
        return rc

    def terminate(self, sig=signal.SIGTERM, check=True, secs=120):
        """Send a signal (SIGTERM by default) and wait for the exit."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        rc = self.wait_exit(secs)
        if check:
            self.check(rc)
        return rc

    def check(self, rc):
        self.checked = True
        msgs = []
        if is_mounted(self.mp):
            fusermount_u(self.mp, wait=1)
            msgs.append(f"{self.mp} still mounted after the daemon exited")
        if self.expect_rc is not None and rc != self.expect_rc:
            msgs.append(f"nbdferry exited {rc}, expected {self.expect_rc}")
        if not self.expect_errors:
            bad = stderr_problems(self.stderr)
            if bad:
                msgs.append("nbdferry stderr has error/warning lines:\n  "
                            + "\n  ".join(bad[:20]))
        if msgs:
            pytest.fail("\n".join(msgs) + f"\nstderr:\n{tail(self.stderr_path, 40)}")

    def finish(self):
        """Teardown: make sure nothing is left running or mounted."""
        if self.proc.poll() is None:
            self.unmount(check=not self.checked)
        else:
            if is_mounted(self.mp):
                fusermount_u(self.mp, wait=1)
            if not self.checked:
                self.check(self.proc.returncode)



def start_mount(d, mounts, target, *opts, filename=None, expect_rc=0,
                expect_errors=False, pass_fds=(), ready_timeout=30,
                raw=None):
    """Mount target on d/mntN: ``[WRAPPER] nbdferry -f -P PIDFILE OPTS
    MP[/FILENAME] TARGET``; append the Mount to mounts (before waiting, so
    a failed start is still cleaned up) and wait for the pidfile and the
    mount.  target is a server (its .uri), a URI string, or the list of
    arguments that follow MOUNTPOINT.  raw: the raw file's name when it
    is not FILENAME ("nbd"), as in a mount of several disks."""
    n = len(mounts)
    mp = d / f"mnt{n}"
    mp.mkdir()
    pidfile = d / f"mnt{n}.pid"
    stderr_path = d / f"mnt{n}.err"
    if isinstance(target, (list, tuple)):
        targs = [str(t) for t in target]
    elif isinstance(target, str):
        targs = [target]
    else:
        targs = [target.uri]
    spec = f"{mp}/{filename}" if filename else str(mp)
    cmd = daemon_cmd("-f", "-P", pidfile, *opts, spec, *targs)
    with fuse_knobs():
        with open(stderr_path, "wb") as errf:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                    stdout=errf, stderr=errf,
                                    pass_fds=pass_fds)
        m = Mount(mp=mp, file=mp / (raw or filename or "nbd"), proc=proc,
                  pid=proc.pid, pidfile=pidfile, stderr_path=stderr_path,
                  expect_rc=expect_rc, expect_errors=expect_errors,
                  checked=False, cmd=cmd)
        mounts.append(m)
        wait_for(nonempty(pidfile), proc, "nbdferry mount", ready_timeout,
                 log=stderr_path)
    assert is_mounted(mp), f"pidfile written but {mp} is not mounted"
    pid = int(pidfile.read_text().split()[0])
    assert pid == proc.pid, f"pidfile holds {pid}, daemon is {proc.pid}"
    assert m.file.exists(), f"{m.file} missing after mount"
    return m


def finish_mounts(mounts):
    """Teardown of every mount, newest first: unmount, judge the exit;
    kill and lazily unmount whatever is left.  Fails the test with every
    mount's problem at once."""
    failures = []
    for m in reversed(mounts):
        try:
            m.finish()
        except BaseException as e:          # pytest.fail raises Failed
            failures.append(f"{m.mp}: {e}")
        finally:
            if m.proc.poll() is None:
                m.proc.kill()
                m.proc.wait(10)
            if is_mounted(m.mp):
                fusermount_u(m.mp, wait=1)
    if failures:
        pytest.fail("mount teardown:\n" + "\n".join(failures))


class RssSampler:
    """Samples a process's VmRSS in a thread; .peak is the highest seen."""

    def __init__(self, mount, interval=0.05):
        self.mount = mount
        self.interval = interval
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            r = self.mount.rss()
            if r:
                self.peak = max(self.peak, r[0])
                self.samples += 1
            self._stop.wait(self.interval)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()

