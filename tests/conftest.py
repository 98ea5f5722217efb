"""Fixtures for the nbdferry integration tests; the helpers behind them are
in tests/lib/ (see lib/__init__.py), which tests import directly.

Everything here starts real processes: nbdkit servers (``server``) and
nbdferry FUSE mounts (``mount``).  Both fixtures are factories, so one test
can start several, and both always clean up what they started, also when the
test fails: servers are terminated, mounts are unmounted (lazily if busy) and
the daemon killed if it does not exit.  The environment variables that
choose the build tree, the daemon and the timeouts are described in
lib/env.py.

Teardown of each mount asserts that the daemon exits with the expected code
(0 unless the test says otherwise) and that its stderr has no error, warning
or sanitizer lines (unless the test expects errors).
"""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from lib.env import HAVE_FUSE, HAVE_NBDCOPY, HAVE_NBDKIT, libnbd
from lib.faults import TALLY, Copy, DropProxy, Kit
from lib.mounts import finish_mounts, mounted_paths, start_mount
from lib.servers import plugin_path, start_server


# Files whose tests mount without the mount or server fixture (they start
# the daemon themselves), as test_mountpoint_*.py do.
MOUNTS_ITSELF = ("test_cli.py", "test_scan_timeout.py")


def pytest_collection_modifyitems(config, items):
    """Where FUSE or nbdkit is missing, every integration test is marked
    skipped, with the reason (and so fails: see below)."""
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
        if name.startswith("test_mountpoint_") or name in MOUNTS_ITSELF \
                or uses & {"mount", "server"}:
            item.add_marker(skip)


# A test that cannot run (a missing tool, an unbuilt binary, a kernel
# feature absent) is a failure, not a pass in disguise: every skip is
# reported as failed, with its reason.  NBDFERRY_ALLOW_SKIP=1 lets a
# developer on a machine without some tool see skips as skips.
ALLOW_SKIP = os.environ.get("NBDFERRY_ALLOW_SKIP") == "1"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if ALLOW_SKIP or not rep.skipped or hasattr(rep, "wasxfail"):
        return
    reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) \
        else str(rep.longrepr)
    rep.outcome = "failed"
    rep.longrepr = (f"{item.nodeid}: could not run ({reason}); a skipped "
                    "test fails (NBDFERRY_ALLOW_SKIP=1 allows it)")


# ------------------------------------------------------------ directories

@pytest.fixture(autouse=True)
def state_dir(monkeypatch, tmp_path):
    """Each test's own state directory (the manifests, fs/warm.h): the
    daemons it starts inherit NBDFERRY_STATE_DIR, so no test reads or
    leaves a manifest in /var/lib/nbdferry or another test's."""
    d = tmp_path / "state"
    monkeypatch.setenv("NBDFERRY_STATE_DIR", str(d))
    return d


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

@pytest.fixture
def server(shortdir):
    """Factory: server(plugin, *args, filters=(), log=False, tcp=False,
    extra=()) -> Server.

    Starts ``nbdkit --exit-with-parent -f -U SOCK -P PID [--filter=log]
    [--filter=F ...] PLUGIN ARGS`` (or ``-i 127.0.0.1 -p PORT`` with tcp=True),
    waits for the pidfile, and terminates it at teardown.  Filter parameters
    go in args like plugin parameters (``wdelay=5ms``).  With log=True the
    log filter is outermost and writes to server.log."""
    started = []

    def start(plugin="memory", *args, **kw):
        return start_server(shortdir, started, plugin, *args, **kw)

    yield start
    for srv in started:
        srv.stop()


@pytest.fixture
def jitter_server(server):
    """Factory: jitter_server(size, maxdelay_us=20000, *args, **kw) starts
    the random-delay RAM disk (tests/nbdkit-plugins/jitter.c: writes and
    zeroes sleep 0..maxdelay_us each, in parallel, so requests in flight
    together complete in random order).  Extra args/kw go to server();
    "init=PATH" loads the initial contents from a file."""
    def start(size, maxdelay_us=20000, *args, **kw):
        return server(plugin_path("jitter"), f"size={size}",
                      f"maxdelay={maxdelay_us}", *args, **kw)
    return start


# ----------------------------------------------------------------- mounts

@pytest.fixture
def mount(shortdir):
    """Factory: mount(target, *opts, filename=None, expect_rc=0,
    expect_errors=False, pass_fds=(), ready_timeout=30, raw=None) -> Mount.

    target is a server (its .uri is used), a URI string, or a list of
    arguments that follow MOUNTPOINT (["--unix", SOCK], ["[", "nbdkit", ...,
    "]"], ["--command", ...], ["--tcp", HOST, PORT], ["--fd", N]).
    Runs ``[WRAPPER] nbdferry -f -P PIDFILE OPTS MP[/FILENAME] TARGET`` and
    waits for the pidfile and the mount.  Teardown unmounts with fusermount3
    -u (retrying while busy, lazily at last), waits for the daemon and asserts
    its exit code (expect_rc; None means any) and, unless expect_errors, that
    its stderr holds no error/warning/sanitizer line.  raw names the
    raw file when it is not FILENAME (a mount of several disks: NAME)."""
    mounts = []

    def do_mount(target, *opts, **kw):
        return start_mount(shortdir, mounts, target, *opts, **kw)

    yield do_mount
    finish_mounts(mounts)


# ------------------------------------------------- faults (lib/faults.py)

@pytest.fixture(scope="session")
def tally():
    """The session's tally of copies made under faults."""
    yield TALLY
    TALLY.save()


def pytest_sessionfinish(session):
    """A pytest-xdist worker sends its tally to the controller."""
    out = getattr(session.config, "workeroutput", None)
    if out is not None:
        out["fault_tally"] = TALLY.data()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """The controller adds up each worker's tally as the worker ends."""
    data = getattr(node, "workeroutput", {}).get("fault_tally")
    if data:
        TALLY.merge(data)
        TALLY.save()


@pytest.fixture
def bg():
    """Factory: bg(cmd, errpath) -> Copy; killed at teardown if running."""
    started = []

    def start(cmd, errpath):
        c = Copy(cmd, errpath)
        started.append(c)
        return c
    yield start
    for c in started:
        c.kill()


@pytest.fixture
def kit(shortdir):
    """Factory: kit(name, args, tcp=False, extra=()) -> started Kit (an
    nbdkit that can be killed and started again on the same socket)."""
    kits = []

    def start(name, args, tcp=False, extra=()):
        k = Kit(shortdir, name, args, tcp=tcp, extra=extra)
        kits.append(k)
        return k.start()
    yield start
    for k in kits:
        k.stop()


@pytest.fixture
def drop_proxy(shortdir):
    """Factory: drop_proxy(target_sock, limit, direction="up", drops=4)."""
    made = []

    def start(target_sock, limit, direction="up", drops=4):
        p = DropProxy(shortdir / f"proxy{len(made)}.sock", target_sock,
                      limit, direction, drops)
        made.append(p)
        return p
    yield start
    for p in made:
        p.close()
