"""Fixtures and helpers for the nbdferry integration tests.

Everything here starts real processes: nbdkit servers (``server``) and
nbdferry FUSE mounts (``mount``).  Both fixtures are factories, so one test
can start several, and both always clean up what they started, also when the
test fails: servers are terminated, mounts are unmounted (lazily if busy) and
the daemon killed if it does not exit.

Environment:
  NBDFERRY_BUILD          build tree (default: build/ beside tests/); the daemon is
                          $NBDFERRY_BUILD/fs/nbdferry
  NBDFERRY_BIN            explicit path to the daemon (overrides the above)
  NBDFERRY_WRAPPER        command prepended to every daemon invocation, e.g.
                          "valgrind --error-exitcode=99 --leak-check=full"
  NBDFERRY_TIMEOUT_SCALE  multiply every timeout (default 1, 10 with a wrapper)

Teardown of each mount asserts that the daemon exits with the expected code
(0 unless the test says otherwise) and that its stderr has no error, warning
or sanitizer lines (unless the test expects errors).
"""

import contextlib
import errno
import hashlib
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

try:                                   # python3-libnbd (Debian package)
    import nbd as libnbd
except ImportError:                    # fall back to nbdcopy through a pipe
    libnbd = None

BUILD = Path(os.environ.get("NBDFERRY_BUILD",
                           Path(__file__).resolve().parent.parent / "build"))
NBDFERRY = Path(os.environ.get("NBDFERRY_BIN") or BUILD / "fs" / "nbdferry")
WRAPPER = shlex.split(os.environ.get("NBDFERRY_WRAPPER", ""))
SCALE = float(os.environ.get("NBDFERRY_TIMEOUT_SCALE") or (10 if WRAPPER else 1))

MiB = 1 << 20
GiB = 1 << 30

HAVE_FUSE = os.path.exists("/dev/fuse") and shutil.which("fusermount3")
HAVE_NBDKIT = shutil.which("nbdkit") is not None
HAVE_NBDCOPY = shutil.which("nbdcopy") is not None

# Lines in the daemon's stderr that fail a test unless it expects errors.
BAD_STDERR = re.compile(
    r"error|warning|AddressSanitizer|LeakSanitizer|ThreadSanitizer|"
    r"UndefinedBehaviorSanitizer|runtime error|Sanitizer", re.I)
# valgrind's own chatter ("==123== ERROR SUMMARY: 0 errors") is judged by
# --error-exitcode, not by this scan.
VALGRIND_LINE = re.compile(r"^==\d+==")


def pytest_collection_modifyitems(config, items):
    """Skip every integration test where FUSE or nbdkit is missing."""
    missing = []
    if not HAVE_FUSE:
        missing.append("/dev/fuse and fusermount3")
    if not HAVE_NBDKIT:
        missing.append("nbdkit")
    if not HAVE_NBDCOPY and libnbd is None:
        missing.append("nbdcopy or python3-libnbd")
    if not missing:
        return
    skip = pytest.mark.skip(reason="needs " + ", ".join(missing))
    for item in items:
        name = Path(str(item.fspath)).name
        uses = set(getattr(item, "fixturenames", ()))
        if name.startswith("test_mount_") or name == "test_cli.py" \
                or uses & {"mount", "server"}:
            item.add_marker(skip)


def timeout(seconds):
    """A timeout scaled for slow runs (valgrind, sanitizers)."""
    return seconds * SCALE


def daemon_cmd(*args):
    """The daemon's command line with the optional wrapper in front."""
    if not NBDFERRY.exists():
        pytest.fail(f"nbdferry binary not found at {NBDFERRY} "
                    "(build it, or set NBDFERRY_BUILD / NBDFERRY_BIN)")
    return WRAPPER + [str(NBDFERRY)] + [str(a) for a in args]


_HELP = None


def daemon_has_option(opt):
    """True if the daemon's --help mentions opt (for options beyond the
    contract, e.g. --retry-timeout, used only where present)."""
    global _HELP
    if _HELP is None:
        try:
            r = subprocess.run([str(NBDFERRY), "--help"], capture_output=True,
                               text=True, timeout=30)
            _HELP = r.stdout + r.stderr
        except (OSError, subprocess.TimeoutExpired):
            _HELP = ""
    return re.search(re.escape(opt) + r"\b", _HELP) is not None


# ---------------------------------------------------------------- waiting

def tail(path, n=20):
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def wait_for(pred, proc=None, what="condition", timeout=30, log=None):
    """Poll pred() until true.  Fails at once if proc exits first (showing
    the tail of log, if given), and after timeout seconds (scaled)."""
    deadline = time.monotonic() + timeout * SCALE
    delay = 0.01
    while True:
        if pred():
            return
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"{what}: process exited with {proc.returncode} "
                        f"before it was ready\n{tail(log) if log else ''}")
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not ready after {timeout * SCALE:.0f}s\n"
                        f"{tail(log) if log else ''}")
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


def nonempty(path):
    path = Path(path)
    return lambda: path.exists() and path.stat().st_size > 0


def run(cmd, timeout=120, check=False, **kw):
    """Run a command (copy tool etc.) with a hang guard; capture output."""
    try:
        r = subprocess.run([str(c) for c in cmd], stdin=subprocess.DEVNULL,
                           capture_output=True, text=True,
                           timeout=timeout * SCALE, **kw)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(map(str, cmd))}: hung for more than "
                    f"{timeout * SCALE:.0f}s")
    if check and r.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {r.returncode}:\n"
                    f"{r.stderr}")
    return r


def free_tcp_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------ directories

@pytest.fixture
def shortdir():
    """A short directory under $TMPDIR (else /tmp, also when $TMPDIR is too
    long: Unix socket paths are limited to 107 bytes, pytest's tmp_path can
    be longer)."""
    base = tempfile.gettempdir()          # $TMPDIR, else /tmp
    if len(base) > 60:                    # leave room for socket names
        base = "/tmp"
    d = tempfile.mkdtemp(prefix="nf-", dir=base)
    yield Path(d)
    # Safety net: a daemon that mounted somewhere unexpected under d (the
    # directory itself, a file) must not outlive the test.
    for p in sorted(mounted_paths(), reverse=True):
        if p == d or p.startswith(d + "/"):
            subprocess.run(["fusermount3", "-u", "-z", p], capture_output=True)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def shm():
    """A directory in RAM (/dev/shm if present) for images and disks."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    d = tempfile.mkdtemp(prefix="nftest-", dir=base)
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


# ---------------------------------------------------------------- servers

class Server(SimpleNamespace):
    """A running nbdkit.  uri, sock (or port), proc, pidfile, stderr,
    log (log filter output or None), disk (file plugin backing file)."""

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def kill(self):
        """kill -9: the server disappears mid-request."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def connections(self):
        """Number of NBD connections the log filter saw."""
        text = Path(self.log).read_text(errors="replace")
        return len(re.findall(r"connection=\d+ Connect ", text))


@pytest.fixture
def server(shortdir):
    """Factory: server(plugin, *args, filters=(), log=False, tcp=False).

    Starts ``nbdkit --exit-with-parent -f -U SOCK -P PID [--filter=log]
    [--filter=F ...] PLUGIN ARGS`` (or ``-i 127.0.0.1 -p PORT`` with tcp=True),
    waits for the pidfile, and terminates it at teardown.  Filter parameters
    go in args like plugin parameters (``wdelay=5ms``).  With log=True the
    log filter is outermost and writes to server.log."""
    started = []

    def start(plugin="memory", *args, filters=(), log=False, tcp=False,
              extra=()):
        n = len(started)
        pidfile = shortdir / f"srv{n}.pid"
        stderr = shortdir / f"srv{n}.err"
        cmd = ["nbdkit", "--exit-with-parent", "-f", "-P", str(pidfile)]
        srv = Server(pidfile=pidfile, stderr=stderr, log=None, disk=None,
                     sock=None, port=None)
        if tcp:
            srv.port = free_tcp_port()
            cmd += ["-i", "127.0.0.1", "-p", str(srv.port)]
            srv.uri = f"nbd://127.0.0.1:{srv.port}/"
        else:
            srv.sock = shortdir / f"srv{n}.sock"
            cmd += ["-U", str(srv.sock)]
            srv.uri = f"nbd+unix:///?socket={srv.sock}"
        cmd += list(extra)
        fl = (["log"] if log else []) + list(filters)
        cmd += [f"--filter={f}" for f in fl]
        cmd += [plugin] + [str(a) for a in args]
        if log:
            srv.log = shortdir / f"srv{n}.log"
            cmd.append(f"logfile={srv.log}")
        if plugin == "file":
            for a in args:
                a = str(a)
                if a.startswith("file=") or "=" not in a:
                    srv.disk = Path(a.split("=", 1)[1] if "=" in a else a)
                    break
        srv.cmd = cmd
        with open(stderr, "wb") as errf:
            srv.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                        stdout=errf, stderr=errf)
        started.append(srv)
        wait_for(nonempty(pidfile), srv.proc, "nbdkit", timeout=30, log=stderr)
        return srv

    yield start
    for srv in started:
        srv.stop()


# A RAM disk whose writes and zeroes each sleep a random time (0..maxdelay
# microseconds) before they apply, with many requests served in parallel:
# requests in flight together complete in random order.  A daemon that lets
# two overlapping requests be in flight at once loses the newer bytes here,
# where the fixed delay filter would usually keep them in order.
JITTER_PLUGIN_C = r"""
#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL

static int64_t size = 64 << 20;
static long maxdelay = 20000;                     /* microseconds */
static char *disk;
static const char *init;                          /* initial contents */
static __thread unsigned seed;

static int j_config(const char *key, const char *value)
{
  if (strcmp(key, "size") == 0) {
    size = nbdkit_parse_size(value);
    return size < 0 ? -1 : 0;
  }
  if (strcmp(key, "maxdelay") == 0) {
    maxdelay = atol(value);
    return 0;
  }
  if (strcmp(key, "init") == 0) {
    init = value;
    return 0;
  }
  nbdkit_error("unknown parameter %s", key);
  return -1;
}

static int j_get_ready(void)
{
  disk = calloc(1, size);
  if (disk == NULL)
    return -1;
  if (init) {
    FILE *f = fopen(init, "rb");
    if (f == NULL) {
      nbdkit_error("%s: %m", init);
      return -1;
    }
    size_t n = fread(disk, 1, size, f);
    (void) n;
    fclose(f);
  }
  return 0;
}

static void *j_open(int readonly) { return NBDKIT_HANDLE_NOT_NEEDED; }
static int64_t j_get_size(void *h) { return size; }
static int j_yes(void *h) { return 1; }

static void jitter(void)
{
  if (seed == 0)
    seed = (unsigned) (uintptr_t) pthread_self() ^ (unsigned) time(NULL);
  long us = maxdelay > 0 ? rand_r(&seed) % (maxdelay + 1) : 0;
  struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };
  nanosleep(&ts, NULL);
}

static int j_pread(void *h, void *buf, uint32_t n, uint64_t off,
                   uint32_t flags)
{
  memcpy(buf, disk + off, n);
  return 0;
}

static int j_pwrite(void *h, const void *buf, uint32_t n, uint64_t off,
                    uint32_t flags)
{
  jitter();
  memcpy(disk + off, buf, n);
  return 0;
}

static int j_zero(void *h, uint32_t n, uint64_t off, uint32_t flags)
{
  jitter();
  memset(disk + off, 0, n);
  return 0;
}

static int j_flush(void *h, uint32_t flags) { return 0; }

static struct nbdkit_plugin plugin = {
  .name = "jitter",
  .config = j_config,
  .get_ready = j_get_ready,
  .open = j_open,
  .get_size = j_get_size,
  .can_write = j_yes,
  .can_flush = j_yes,
  .can_trim = j_yes,
  .can_zero = j_yes,
  .can_multi_conn = j_yes,
  .pread = j_pread,
  .pwrite = j_pwrite,
  .zero = j_zero,
  .trim = j_zero,
  .flush = j_flush,
};
NBDKIT_REGISTER_PLUGIN(plugin)
"""


@pytest.fixture
def jitter_server(server, shortdir):
    """Factory: jitter_server(size, maxdelay_us=20000, *args, **kw) starts
    the random-delay RAM disk above (nbdkit cc plugin; skips if it cannot
    be compiled).  Extra args/kw go to server(); "init=PATH" loads the
    initial contents from a file."""
    def start(size, maxdelay_us=20000, *args, **kw):
        if not Path("/usr/include/nbdkit-plugin.h").exists() or \
                subprocess.run(["nbdkit", "cc", "--dump-plugin"],
                               capture_output=True).returncode != 0:
            pytest.skip("needs nbdkit's cc plugin and nbdkit-plugin-dev")
        src = shortdir / "jitter.c"
        src.write_text(JITTER_PLUGIN_C)
        return server("cc", src, f"size={size}", f"maxdelay={maxdelay_us}",
                      *args, **kw)
    return start


# ----------------------------------------------------------------- mounts

def mounted_paths():
    with open("/proc/mounts") as f:
        return {line.split()[1].replace("\\040", " ") for line in f}


def is_mounted(mp):
    return os.path.realpath(mp) in mounted_paths()


def fusermount_u(mp, wait=10):
    """fusermount3 -u, retried while busy; lazy as the last resort.
    Returns True if the normal unmount succeeded."""
    deadline = time.monotonic() + wait * SCALE
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


@pytest.fixture
def mount(shortdir):
    """Factory: mount(target, *opts, filename=None, expect_rc=0,
    expect_errors=False, pass_fds=(), ready_timeout=30) -> Mount.

    target is a server (its .uri is used), a URI string, or a list of
    arguments that follow MOUNTPOINT (["--unix", SOCK], ["[", "nbdkit", ...,
    "]"], ["--command", ...], ["--tcp", HOST, PORT], ["--fd", N]).
    Runs ``[WRAPPER] nbdferry -f -P PIDFILE OPTS MP[/FILENAME] TARGET`` and
    waits for the pidfile and the mount.  Teardown unmounts with fusermount3
    -u (retrying while busy, lazily at last), waits for the daemon and asserts
    its exit code (expect_rc; None means any) and, unless expect_errors, that
    its stderr holds no error/warning/sanitizer line."""
    mounts = []

    def do_mount(target, *opts, filename=None, expect_rc=0,
                 expect_errors=False, pass_fds=(), ready_timeout=30):
        n = len(mounts)
        mp = shortdir / f"mnt{n}"
        mp.mkdir()
        pidfile = shortdir / f"mnt{n}.pid"
        stderr_path = shortdir / f"mnt{n}.err"
        if isinstance(target, (list, tuple)):
            targs = [str(t) for t in target]
        elif isinstance(target, str):
            targs = [target]
        else:
            targs = [target.uri]
        spec = f"{mp}/{filename}" if filename else str(mp)
        cmd = daemon_cmd("-f", "-P", pidfile, *opts, spec, *targs)
        with open(stderr_path, "wb") as errf:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                    stdout=errf, stderr=errf,
                                    pass_fds=pass_fds)
        m = Mount(mp=mp, file=mp / (filename or "nbd"), proc=proc,
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

    yield do_mount
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


# ------------------------------------------------------------- digesting

CHUNK = 4 * MiB


def sha256_file(path, pad_to=None):
    """sha256 of a file's bytes, followed by zeros up to pad_to bytes."""
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        while True:
            b = f.read(CHUNK)
            if not b:
                break
            h.update(b)
            n += len(b)
    if pad_to is not None:
        assert n <= pad_to, f"{path}: {n} bytes, more than {pad_to}"
        update_zeros(h, pad_to - n)
    return h.hexdigest()


def sha256_bytes(data, pad_to=None):
    h = hashlib.sha256(data)
    if pad_to is not None:
        update_zeros(h, pad_to - len(data))
    return h.hexdigest()


def update_zeros(h, n):
    z = bytes(min(n, CHUNK))
    while n > 0:
        k = min(n, CHUNK)
        h.update(z[:k])
        n -= k


@contextlib.contextmanager
def nbd_handle(uri):
    h = libnbd.NBD()
    h.connect_uri(uri)
    try:
        yield h
    finally:
        with contextlib.suppress(Exception):
            h.shutdown()


def nbd_size(uri):
    if libnbd is not None:
        with nbd_handle(uri) as h:
            return h.get_size()
    r = run(["nbdinfo", "--size", uri], check=True)
    return int(r.stdout)


def sha256_nbd(uri, size=None):
    """sha256 of the first size bytes (default: all) of an export, read
    directly from the server (libnbd if available, else nbdcopy URI -)."""
    h = hashlib.sha256()
    if libnbd is not None:
        with nbd_handle(uri) as nh:
            total = nh.get_size() if size is None else size
            off = 0
            while off < total:
                n = min(CHUNK, total - off)
                h.update(nh.pread(n, off))
                off += n
        return h.hexdigest()
    p = subprocess.Popen(["nbdcopy", uri, "-"], stdout=subprocess.PIPE)
    left = size
    while left is None or left > 0:
        b = p.stdout.read(CHUNK if left is None else min(CHUNK, left))
        if not b:
            break
        h.update(b)
        if left is not None:
            left -= len(b)
    p.stdout.close()
    p.kill()
    p.wait()
    assert not left, f"{uri}: short read, {left} bytes missing"
    return h.hexdigest()


def read_nbd(uri, offset=0, length=None):
    """Bytes of an export read directly from the server."""
    if libnbd is not None:
        with nbd_handle(uri) as nh:
            if length is None:
                length = nh.get_size() - offset
            out = bytearray()
            while len(out) < length:
                n = min(CHUNK, length - len(out))
                out += nh.pread(n, offset + len(out))
            return bytes(out)
    r = subprocess.run(["nbdcopy", uri, "-"], stdout=subprocess.PIPE,
                       check=True)
    end = None if length is None else offset + length
    return r.stdout[offset:end]


def write_nbd(uri, data, offset=0):
    """Write bytes to an export directly (not through the mount)."""
    if libnbd is not None:
        with nbd_handle(uri) as nh:
            pos = 0
            while pos < len(data):
                n = min(CHUNK, len(data) - pos)
                nh.pwrite(data[pos:pos + n], offset + pos)
                pos += n
            nh.flush()
        return
    assert offset == 0, "offset writes need python3-libnbd"
    run(["nbdcopy", "-", uri], check=True, input=data, text=False)


def fill_random(uri, size=None):
    """Pre-fill an export with random bytes via nbdcopy (so a stale byte
    anywhere shows).  Returns the bytes written."""
    if size is None:
        size = nbd_size(uri)
    data = os.urandom(size)
    try:
        r = subprocess.run(["nbdcopy", "-", uri], input=data,
                           capture_output=True, timeout=timeout(120))
        assert r.returncode == 0, f"nbdcopy - {uri}: {r.stderr!r}"
    except FileNotFoundError:
        write_nbd(uri, data)
    return data


def random_file(path, size):
    """A dense file of random bytes; returns its path."""
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(CHUNK, left)
            f.write(os.urandom(n))
            left -= n
    return Path(path)


def make_sparse_image(path, size, runs, seed=None):
    """A sparse image of size bytes: random data in runs, holes elsewhere.

    runs is a list of (offset, length) or a count of random runs (unaligned
    offsets and lengths, never overlapping, with one run touching the end
    so the last byte is data).  Holes are made with ftruncate, so the image
    is really sparse.  Returns SimpleNamespace(path, size, runs, sha256)."""
    rng = random.Random(seed)
    if isinstance(runs, int):
        count, runs = runs, []
        slot = size // max(count, 1)
        for i in range(count):
            length = rng.randint(1, max(1, slot // 2))
            if rng.random() < 0.5:             # sometimes a large run
                length = rng.randint(slot // 4, max(slot // 4, slot - 1))
            start = i * slot + rng.randint(0, slot - length)
            runs.append((start, length))
        if runs:                               # data right at the end
            s, _ = runs[-1]
            runs[-1] = (s, size - s)
    with open(path, "wb") as f:
        f.truncate(size)
        for off, length in runs:
            assert 0 <= off and off + length <= size
            f.seek(off)
            left = length
            while left:
                n = min(CHUNK, left)
                f.write(os.urandom(n))
                left -= n
    return SimpleNamespace(path=Path(path), size=size, runs=runs,
                           sha256=sha256_file(path))


# ------------------------------------------------------- content checking

def file_reader(path):
    def rd(off, n):
        with open(path, "rb") as f:
            f.seek(off)
            return f.read(n)
    return rd


def bytes_reader(data):
    return lambda off, n: bytes(data[off:off + n])


def nbd_reader(uri):
    def rd(off, n):
        return read_nbd(uri, off, n)
    return rd


def padded(reader, real_size):
    """A reader that returns zeros beyond real_size."""
    def rd(off, n):
        b = reader(off, max(0, min(n, real_size - off))) if off < real_size else b""
        return b + bytes(n - len(b))
    return rd


def describe_mismatch(expected, actual, size, limit=8):
    """Human-readable list of differing MiB chunks between two readers."""
    out = []
    off = 0
    while off < size and len(out) < limit:
        n = min(MiB, size - off)
        a, b = expected(off, n), actual(off, n)
        if a != b:
            if len(b) < len(a):
                out.append(f"  short read at {off + len(b)}")
                break
            first = next(i for i in range(n) if a[i] != b[i])
            last = max(i for i in range(n) if a[i] != b[i])
            zero = b[first:last + 1].count(0) == last + 1 - first
            out.append(f"  bytes {off + first}..{off + last} differ"
                       f"{' (read as zero)' if zero else ''}")
        off += n
    return "\n".join(out) or f"  (first {size} bytes equal)"


def assert_content(expected, size, mount_file=None, uri=None,
                   mount_size=None, what=""):
    """Assert that the file through the mount and/or the export read
    directly from the server hold the expected bytes.

    expected: bytes, or a path whose bytes are followed by zeros up to size.
    size: bytes to compare on the server (usually the export size).
    mount_size: expected length of the file through the mount (default size).
    """
    if isinstance(expected, (bytes, bytearray)):
        exp_reader = padded(bytes_reader(expected), len(expected))
        exp_len = len(expected)
    else:
        exp_len = os.path.getsize(expected)
        exp_reader = padded(file_reader(expected), exp_len)

    def exp_sha(n):
        if isinstance(expected, (bytes, bytearray)):
            return sha256_bytes(bytes(expected[:n]), pad_to=n)
        return sha256_file(expected, pad_to=n) if n >= exp_len else \
            hashlib.sha256(exp_reader(0, n)).hexdigest()

    problems = []
    if mount_file is not None:
        msize = size if mount_size is None else mount_size
        st = os.stat(mount_file)
        if st.st_size != msize:
            problems.append(f"{mount_file}: size {st.st_size}, expected {msize}")
        if sha256_file(mount_file) != exp_sha(msize):
            problems.append(
                f"{mount_file}: sha256 differs from the source; read through "
                f"the mount:\n" + describe_mismatch(
                    exp_reader, padded(file_reader(mount_file), st.st_size),
                    msize))
    if uri is not None:
        if sha256_nbd(uri, size) != exp_sha(size):
            problems.append(
                "server: sha256 differs from the source; read directly from "
                "the server:\n" + describe_mismatch(exp_reader,
                                                    nbd_reader(uri), size))
    if problems:
        pytest.fail((what + ": " if what else "") + "\n".join(problems))


# --------------------------------------------------------------- helpers

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


class PauseControl:
    """nbdkit pause filter's control socket: pause() sends 'p' and returns
    once requests already received have finished ('P'); resume() sends 'r'.
    Usable as a context manager: paused inside, always resumed after."""

    def __init__(self, path):
        self.path = str(path)

    def _cmd(self, c):
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(30)
            s.connect(self.path)
            s.sendall(c)
            got = s.recv(1)
            assert got == c.upper(), f"pause filter answered {got!r} to {c!r}"

    def pause(self):
        self._cmd(b"p")

    def resume(self):
        self._cmd(b"r")

    def __enter__(self):
        self.pause()
        return self

    def __exit__(self, *exc):
        self.resume()


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
    t.join(secs * SCALE)
    if t.is_alive():
        return "hung", t
    if "err" in box:
        raise box["err"]
    return "done", box.get("ok")


def oserror_errno(fn, *args):
    """Call fn; return 0 on success or the OSError's errno."""
    try:
        fn(*args)
        return 0
    except OSError as e:
        return e.errno


__all__ = [n for n in dir() if not n.startswith("_")] + ["errno", "signal"]
