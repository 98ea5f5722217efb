"""nbdferry-verify --request-timeout: a server that stops answering fails
the run (exit 2, one line naming the server) instead of hanging it.

Real nbdkit servers: the delay filter holds every read for an hour (the
server is alive, its socket open, it never replies), and a server stopped
with SIGSTOP accepts connections (the kernel does) but never answers the
handshake.  The timeouts are 1 s, so each case takes about a second; the
subprocess limit only catches a hang (the bug: before the option there
was no limit at all).
"""

import os
import signal
import subprocess

from lib.env import MiB
from test_verify import VERIFY, assert_one_error_line, digest

# Data at both ends of 1 MiB, so that block status leaves reads to do.
DATA = "data=1 2 3 @1048575 4"
HANG = 60          # far longer than any case takes; reached only by a hang


def run_verify(*args):
    return subprocess.run([str(VERIFY), *map(str, args)], capture_output=True,
                          text=True, timeout=HANG)


def expected_sha256():
    data = bytearray(MiB)
    data[0:3] = b"\x01\x02\x03"
    data[MiB - 1] = 4
    return digest(bytes(data))


def test_verify_request_timeout_fails_a_silent_server(server):
    srv = server("data", DATA, "rdelay=3600", filters=["delay"])
    p = run_verify("--request-timeout=1", srv.uri)
    line = assert_one_error_line(p)
    assert srv.uri in line, line
    assert "no reply from the server for 1 s" in line, line
    assert "--request-timeout" in line, line


def test_verify_request_timeout_fails_the_destination_side(server, tmp_path):
    """SOURCE is a file that hashes fine; DESTINATION never answers: the
    comparison is an error (2), not a mismatch (1) and not a match."""
    src = tmp_path / "src.img"
    src.write_bytes(b"\x01\x02\x03" + bytes(MiB - 4) + b"\x04")
    srv = server("data", DATA, "rdelay=3600", filters=["delay"])
    p = run_verify("--digest=sha256", "--request-timeout=1", src, srv.uri)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert f"{srv.uri}: no reply from the server" in p.stderr, p.stderr


def test_verify_request_timeout_fails_a_stopped_handshake(server):
    srv = server("data", DATA)
    pid = int(srv.pidfile.read_text())
    os.kill(pid, signal.SIGSTOP)
    try:
        p = run_verify("--request-timeout=1", srv.uri)
    finally:
        os.kill(pid, signal.SIGCONT)
    line = assert_one_error_line(p)
    assert f"{srv.uri}: no answer to the handshake within 1 s" in line, line


def test_verify_request_timeout_slow_but_moving_server_passes(server):
    """Replies that come, later than nothing but within the timeout, are
    not a stall: the digest is the data's (0 turns the timeout off)."""
    srv = server("data", DATA, "rdelay=100ms", filters=["delay"])
    for opt in ("--request-timeout=10", "--request-timeout=0"):
        p = run_verify("--digest=sha256", opt, srv.uri)
        assert p.returncode == 0, (opt, p.stderr)
        assert p.stdout.split()[0] == expected_sha256(), p.stdout


def test_verify_request_timeout_bad_values_refused():
    for bad in ("-1", "x", "1s", "86401", ""):
        p = run_verify(f"--request-timeout={bad}", "nbd://localhost/")
        line = assert_one_error_line(p)
        assert "--request-timeout: bad value" in line, line
