"""A second process that only reads costs the writer nothing.

While a copy writes, another process opens the disk, reads a little and
closes it (`head -c1`, a monitoring script, a backup agent peeking at the
partition table).  Its close must not wait for the writer's data, drain
the pool, nor send the zeroes the writer's O_TRUNC left pending: those go
when the writer closes, and only for what the writer did not overwrite.
Checked with the server paused (a close that waits for the writer's data
would hang) and through the status file (pending zeroes untouched), then
every byte checked once the writer has closed.
"""

import hashlib
import json
import os
import subprocess
import sys

from lib.env import MiB, timeout
from lib.nbd import fill_random, sha256_nbd
from lib.procs import run
from lib.servers import PauseControl

EXPORT = 64 * MiB


def status(m):
    return json.loads((m.mp / ".nbdferry-status").read_bytes())


def peek(path, off):
    """A reader in another process: one byte at off, then close."""
    return run(["dd", f"if={path}", "bs=1", "count=1", f"skip={off}",
                "iflag=skip_bytes", "status=none"], timeout=timeout(30))


# The writer is a process of its own, like cp: a fork of the test process
# while it held the writer's fd would close that fd in the child, and a
# close of any copy of the writer's fd is the writer's close (FUSE flush).
WRITER = r"""
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_TRUNC)
data = sys.stdin.buffer.read(int(sys.argv[2]))
assert os.pwrite(fd, data, 0) == len(data)
os.ftruncate(fd, int(sys.argv[3]))      # cp --sparse: holes up to the end
print("written", flush=True)
sys.stdin.buffer.readline()
os.close(fd)
print("closed", flush=True)
"""


def test_reader_close_leaves_writer_alone(server, mount, shortdir):
    ctl = shortdir / "pause.ctl"
    srv = server("memory", f"size={EXPORT}", f"pause-control={ctl}",
                 filters=["pause"])
    fill_random(srv.uri, EXPORT)              # old data everywhere
    m = mount(srv)
    pause = PauseControl(ctl)
    data = os.urandom(MiB) + b"\x5a" * 4096
    w = subprocess.Popen([sys.executable, "-c", WRITER, str(m.file),
                          str(len(data)), str(EXPORT)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE)
    try:
        w.stdin.write(data)
        w.stdin.flush()
        assert w.stdout.readline() == b"written\n", "writer failed"
        with pause:                           # the writer's data is stuck
            for off in (32 * MiB, EXPORT - 1, 20 * MiB + 5):
                r = peek(m.file, off)
                assert r.returncode == 0, f"reader at {off}: {r.stderr}"
                assert r.stdout in ("\0", b"\0"), (
                    f"byte {off} after O_TRUNC reads {r.stdout!r}")
            st = status(m)
            assert st["pending_zero_bytes"] == EXPORT - len(data), (
                "a reader's close sent the writer's pending zeroes: "
                f"{st['pending_zero_bytes']} bytes still pending")
            assert st["errors"] == 0, st
        w.stdin.write(b"close\n")            # the writer's close drains
        w.stdin.flush()
        assert w.stdout.readline() == b"closed\n", "writer's close failed"
        assert w.wait(timeout(60)) == 0
    finally:
        if w.poll() is None:
            w.kill()
            w.wait()
    st = status(m)
    assert st["pending_zero_bytes"] == 0 and st["errors"] == 0, st
    want = hashlib.sha256(data + bytes(EXPORT - len(data))).hexdigest()
    assert sha256_nbd(srv.uri, EXPORT) == want, "disk differs after close"
