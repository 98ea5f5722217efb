"""A long zeroing is visible in the status and a second stop signal ends it.

`: > MNT/nbd` on a 1 TiB export, nothing known zero (--no-extents), with
every zero request delayed 50 ms, keeps the close busy for about 50 s.
The status file shows the zeroing's progress (bytes done of bytes to
zero, done counting only acknowledged zeroing); the first SIGTERM or
SIGINT ends the session and the drain goes on; the second abandons it:
the daemon exits 1, names the range left unzeroed in its log, and the
close that was waiting fails.  On the server, what the log calls zeroed
reads as zero and what it calls left still holds the old bytes."""

import os
import re
import signal
import subprocess
import sys

import pytest

from lib.copytools import status
from lib.env import TOP, MiB, timeout
from lib.images import random_bytes
from lib.nbd import read_nbd, write_nbd
from lib.procs import run, wait_for

TiB = 1 << 40
OLD_AT = (0, 600 << 30)           # old data near the start and far in

CLOSER = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_TRUNC)
try:
    os.close(fd)
    print("ok")
except OSError as e:
    print(e.errno)
"""


def signal_pending(pid, sig):
    """sig is pending for the process (not yet delivered to a thread);
    False once it has exited (the caller's wait_for then sees the exit)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            masks = [int(line.split()[1], 16) for line in f
                     if line.startswith(("ShdPnd:", "SigPnd:"))]
    except OSError:
        return False
    return any(mask & (1 << (sig - 1)) for mask in masks)


def zeroing(m):
    return status(m)["zeroing"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT],
                         ids=["SIGTERM", "SIGINT"])
def test_second_signal_abandons_zeroing(server, mount, sig):
    srv = server("memory", "size=1T", "delay-zero=50ms", filters=["delay"])
    old = random_bytes(MiB)
    for off in OLD_AT:
        write_nbd(srv.uri, old, off)
    m = mount(srv, "--no-extents", expect_rc=1, expect_errors=True)
    assert not zeroing(m)["active"]
    closer = subprocess.Popen([sys.executable, "-c", CLOSER, str(m.file)],
                              stdout=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: zeroing(m)["bytes_done"] > 0, closer,
                 "zeroing progress in the status")
        first = zeroing(m)
        assert first["active"] and first["bytes_total"] == TiB, first
        wait_for(lambda: zeroing(m)["bytes_done"] > first["bytes_done"],
                 closer, "more zeroing progress")
        assert zeroing(m)["bytes_done"] <= TiB
        shown = run(["/usr/bin/python3", TOP / "tools" / "status" /
                     "nbdferry-status", m.mp], check=True).stdout
        assert re.search(r"zeroing .* of 1\.0 TiB \(draining", shown), shown
        m.proc.send_signal(sig)
        # Two signals sent while the first is pending would be one.
        wait_for(lambda: not signal_pending(m.pid, sig), m.proc,
                 "the first signal delivered")
        m.proc.send_signal(sig)
        rc = m.wait_exit(30)
        out, _ = closer.communicate(timeout=timeout(30))
    finally:
        if closer.poll() is None:
            closer.kill()
            closer.wait()
    assert rc == 1, f"daemon exited {rc}\n{m.stderr}"
    assert out.strip() != "ok", "the waiting close succeeded"
    left = re.findall(r"zeroing abandoned: (\d+) bytes at offset (\d+) not "
                      r"zeroed", m.stderr)
    assert len(left) == 1, m.stderr
    n, start = int(left[0][0]), int(left[0][1])
    assert start + n == TiB and 0 < start < OLD_AT[1], (start, n)
    # Zeroed below the range named, untouched in it.
    assert read_nbd(srv.uri, OLD_AT[0], MiB) == bytes(MiB)
    assert read_nbd(srv.uri, OLD_AT[1], MiB) == old
    m.check(rc)


def test_second_signal_abandons_final_drain(server, mount):
    """The truncating file still open at the first SIGTERM: the zeroing is
    the unmount's (said in the log), and a SIGINT after it gives it up."""
    srv = server("memory", "size=1T", "delay-zero=50ms", filters=["delay"])
    m = mount(srv, "--no-extents", expect_rc=1, expect_errors=True)
    fd = os.open(m.file, os.O_WRONLY | os.O_TRUNC)
    try:
        # The truncate waits for the copy's first write (fs/rawfile.c,
        # THE DEFERRED TRUNCATE): one byte carries it out.
        assert status(m)["pending_zero_bytes"] == 0
        os.pwrite(fd, b"x", 0)
        assert status(m)["pending_zero_bytes"] >= TiB - 4096
        m.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: "before exiting" in m.stderr, m.proc,
                 "the final drain's notice")
        m.proc.send_signal(signal.SIGINT)
        rc = m.wait_exit(30)
    finally:
        try:
            os.close(fd)
        except OSError:
            pass                  # the mount is gone
    assert rc == 1, f"daemon exited {rc}\n{m.stderr}"
    assert re.search(r"zeroing abandoned: \d+ bytes at offset \d+ not "
                     r"zeroed", m.stderr), m.stderr
    m.check(rc)
