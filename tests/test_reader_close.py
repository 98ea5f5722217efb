"""A second process that only reads costs the writer nothing.

While a copy writes, another process opens the disk, reads a little and
closes it (`head -c1`, a monitoring script, a backup agent peeking at the
partition table).  Its close must not wait for the writer's data, drain
the pool, nor send the zeroes the writer's O_TRUNC left pending: those go
when the writer closes, and only for what the writer did not overwrite.
Checked with the server paused (a close that waits for the writer's data
would hang) and through the status file (pending zeroes untouched), then
every byte checked once the writer has closed.

In the middle of a cp (the last section), a reader that never wrote,
opening and closing the file, must not zero or drain anything.

cp opens the target with O_TRUNC: every byte of the used disk becomes
"pending zero", to be zeroed at the end only where cp did not write.  If
a reader's close (``head -c1 MNT/nbd``) materialised the pending zeroes,
the part of the disk cp has not reached yet would be zeroed on the server
and then overwritten: twice the traffic on a real migration, and a window
in which the disk is neither old nor new.

The copy is made deterministic by feeding cp from a FIFO: the test writes
the first part, waits until the file has grown to it, runs the reader,
then writes the rest.  The nbdkit log filter records every request: no
zero (or trim) request may touch the range cp writes, and the bytes on
the server and through the mount must equal the source (sha256), with the
tail of the export past the source reading as zero.
"""

import hashlib
import json
import os
import subprocess
import sys
import threading

import pytest

from lib.content import assert_content
from lib.copytools import log_mark, nbd_requests
from lib.env import MiB, timeout
from lib.images import random_bytes
from lib.nbd import fill_random, sha256_nbd
from lib.procs import run, wait_for
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
    data = random_bytes(MiB) + b"\x5a" * 4096
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


# ------------------------------------------------ a reader in the middle of cp

COPY_EXPORT = 32 * MiB
SRC_SIZE = 20 * MiB + 12345
FIRST = 8 * MiB + 4097           # bytes fed to cp before the reader runs


def feed(fifo, data, first, go, errors):
    """Thread: write data[:first] into the FIFO, wait for go, write the
    rest, close (cp sees end of file)."""
    try:
        with open(fifo, "wb") as f:
            f.write(data[:first])
            f.flush()
            if not go.wait(timeout(120)):
                errors.append("never told to go on")
            f.write(data[first:])
    except OSError as e:
        errors.append(str(e))


@pytest.mark.parametrize("reader", [["head", "-c1"],
                                    ["dd", "bs=4096", "count=1",
                                     "status=none", "iflag=direct"]],
                         ids=["head", "dd-direct"])
def test_reader_close_mid_copy_zeroes_nothing(server, mount, shortdir,
                                              reader):
    srv = server("memory", f"size={COPY_EXPORT}", "delay-write=2ms",
                 filters=["delay"], log=True)
    fill_random(srv.uri, COPY_EXPORT)                      # a used disk
    src = random_bytes(SRC_SIZE)
    m = mount(srv)
    mark = log_mark(srv)

    fifo = shortdir / "src.fifo"
    os.mkfifo(fifo)
    go, errors = threading.Event(), []
    t = threading.Thread(target=feed, args=(fifo, src, FIRST, go, errors),
                         daemon=True)
    t.start()
    cp = subprocess.Popen(["cp", str(fifo), str(m.file)],
                          stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
    try:
        # Truncated by cp's O_TRUNC and grown by exactly the first part
        # (before the O_TRUNC it is the export size).
        wait_for(lambda: os.stat(m.file).st_size == FIRST, cp,
                 "cp writing the first part", 60)
        size_before = FIRST
        r = subprocess.run(reader + [f"if={m.file}" if reader[0] == "dd"
                                     else str(m.file)],
                           stdin=subprocess.DEVNULL, capture_output=True,
                           timeout=timeout(60))
        assert r.returncode == 0, f"{reader[0]} failed: {r.stderr!r}"
        reader_mark = log_mark(srv)
    finally:
        go.set()
        t.join(timeout(120))
    try:
        _, err = cp.communicate(timeout=timeout(120))
    except subprocess.TimeoutExpired:
        cp.kill()
        cp.wait()
        pytest.fail("cp hung")
    assert not errors, errors
    assert cp.returncode == 0, f"cp exited {cp.returncode}: {err}"
    expect = src[:1] if reader[0] == "head" else src[:4096]
    assert r.stdout == expect, \
        f"{reader[0]} read other bytes than cp wrote there"

    zeroes = [q for q in nbd_requests(srv, mark)
              if q.op in ("Zero", "Trim") and q.offset < SRC_SIZE]
    assert not zeroes, (
        f"{len(zeroes)} zero/trim requests hit the range cp writes "
        f"[0, {SRC_SIZE}); the reader closed at file size {size_before}, "
        f"log offset {reader_mark}; first: " + ", ".join(
            f"{q.op} {q.count}@{q.offset}" for q in zeroes[:8]))
    assert_content(src, COPY_EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=SRC_SIZE, what=f"cp with {reader[0]} mid-copy")
