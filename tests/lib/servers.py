"""nbdkit servers: start one on a Unix socket or TCP port, the test
plugins built from tests/nbdkit-plugins/, the pause filter's control.

start_server() is the body of conftest's ``server`` fixture; the fixture
owns the list of started servers and stops them at teardown."""

import re
import socket
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from lib.env import BUILD
from lib.procs import free_tcp_port, nonempty, wait_for

PLUGINS = BUILD / "tests" / "nbdkit-plugins"


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



def start_server(d, started, plugin="memory", *args, filters=(), log=False,
                 tcp=False, extra=()):
    """Start ``nbdkit --exit-with-parent -f -U SOCK -P PID [--filter=log]
    [--filter=F ...] PLUGIN ARGS`` (or ``-i 127.0.0.1 -p PORT`` with
    tcp=True) with its files in directory d, append it to started (before
    waiting, so a failed start is still stopped) and wait for its pidfile."""
    n = len(started)
    pidfile = d / f"srv{n}.pid"
    stderr = d / f"srv{n}.err"
    cmd = ["nbdkit", "--exit-with-parent", "-f", "-P", str(pidfile)]
    srv = Server(pidfile=pidfile, stderr=stderr, log=None, disk=None,
                 sock=None, port=None)
    if tcp:
        srv.port = free_tcp_port()
        cmd += ["-i", "127.0.0.1", "-p", str(srv.port)]
        srv.uri = f"nbd://127.0.0.1:{srv.port}/"
    else:
        srv.sock = d / f"srv{n}.sock"
        cmd += ["-U", str(srv.sock)]
        srv.uri = f"nbd+unix:///?socket={srv.sock}"
    cmd += list(extra)
    fl = (["log"] if log else []) + list(filters)
    cmd += [f"--filter={f}" for f in fl]
    cmd += [str(plugin)] + [str(a) for a in args]
    if log:
        srv.log = d / f"srv{n}.log"
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


def plugin_path(name):
    """Path of nbdkit-NAME-plugin.so built from tests/nbdkit-plugins/NAME.c.
    A missing plugin is a build problem: the test fails."""
    path = PLUGINS / f"nbdkit-{name}-plugin.so"
    if not path.exists():
        pytest.fail(f"{path} not built (needs nbdkit-plugin-dev; build with "
                    "scripts/build, or set NBDFERRY_BUILD)")
    return path


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

