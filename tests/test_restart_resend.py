"""A restarted server is survived.

The daemon keeps every acknowledged write's buffer until an NBD flush
covers it, flushes by itself (every 10 s and every GiB while writing,
and whenever half the pool waits for a flush), and after a reconnect sends
again every write no flush covered yet.  So:

- nbdkit file killed (-9) and restarted on the same socket in the middle
  of a long cp: cp exits 0 and the server's file is the source;
- nbdkit memory (a RAM disk: a restart loses everything) killed before
  the first flush: the resend repairs all of it, cp exits 0, the disk is
  the source; killed after flushes: what they covered is gone and nothing
  can repair it: the samples of flushed data read back after the
  reconnect differ, the copy fails loudly, and a copy made again on the
  same mount repairs the disk;
- a long copy with no close or fsync sees NBD flushes on the server
  (nbdkit's log filter) every 10 s.

Every copy is judged by lib.faults.judge(): exit status against the
sha256 of the bytes on the server."""

import json
import re
import sys
import time

from lib.env import MiB
from lib.faults import (judge, sha256_mount, sha256_prefix, status_json,
                        wait_progress, written_bytes)
from lib.images import random_file
from lib.nbd import sha256_nbd


def flushes_in(log):
    """NBD flushes the nbdkit log filter recorded (requests, not replies)."""
    try:
        text = log.read_text()
    except FileNotFoundError:
        return 0
    return len(re.findall(r" connection=\d+ Flush id=\d+ \.\.\.$", text,
                          re.M))


def test_file_server_restarted_mid_cp(kit, mount, shm, bg, tally):
    """kill -9 nbdkit file 64 MiB into a 320 MiB cp, start it again on the
    same socket a second later: the copy goes on and cp exits 0; every
    byte on the server is the source's; the status counts what was
    resent."""
    size = 320 * MiB
    disk = random_file(shm / "disk.img", size)     # old bytes show
    k = kit("srv", ["--filter=delay", "file", disk, "wdelay=5ms"])
    m = mount(k.target, expect_errors=True)        # warnings: reconnected
    src = random_file(shm / "src.img", size)
    cp = bg(["cp", str(src), str(m.file)], shm / "cp.err")
    wait_progress(cp, written_bytes, 64 * MiB)
    k.kill()
    time.sleep(1)
    k.start()
    rc = cp.wait(600)
    out = judge(tally, "resend-file-restart", rc, src,
                sha256_prefix(disk, size), sha256_mount(m.file, size),
                cp.stderr)
    assert out == "match", f"cp failed after a restart\n{cp.stderr}"
    st = status_json(m)
    assert st["bytes_resent"] > 0, st
    assert not [f for f in st["failures"] if "offset" in f], st
    assert not st["damage"]["unrepaired"], st
    assert not re.search(r"may be lost", m.stderr), m.stderr
    m.unmount()
    assert sha256_prefix(disk, size) == sha256_prefix(src, size)


def memory_kit(kit, size, wdelay="5ms"):
    return kit("mem", ["--filter=delay", "memory", f"size={size}",
                       f"wdelay={wdelay}"])


def test_memory_server_restarted_before_any_flush(kit, mount, shm, bg,
                                                  tally):
    """A RAM disk killed before the first flush (a large pool: none is
    needed for it): everything it had acknowledged is resent to the empty
    restarted server, cp exits 0 and the server holds the source."""
    size = 96 * MiB
    k = memory_kit(kit, size)
    m = mount(k.target, "--pool-size", "256M", expect_errors=True)
    src = random_file(shm / "src.img", size)
    cp = bg(["cp", str(src), str(m.file)], shm / "cp.err")
    wait_progress(cp, written_bytes, 8 * MiB)
    before = status_json(m)
    k.kill()
    time.sleep(1)
    k.start()
    rc = cp.wait(600)
    flushed = before["nbd_requests"]["flush"] > 0 or before["pool_flushes"]
    out = judge(tally, "resend-memory-restart-unflushed", rc, src,
                sha256_nbd(k.uri, size), None, cp.stderr)
    if flushed:
        # A loaded machine took 10 s to write 8 MiB: the periodic flush
        # came first, and the loss of what it covered must be loud.
        assert out == "loud", before
        return
    assert out == "match", f"the resend did not repair\n{m.stderr}"
    st = status_json(m)
    assert st["bytes_resent"] >= 8 * MiB, st
    assert not [f for f in st["failures"] if "offset" in f], st


def test_memory_server_lost_flushed_data_is_loud(kit, mount, shm, bg,
                                                 tally):
    """A RAM disk killed after flushes covered part of the copy (a small
    pool flushes often): that part is gone with the server and no resend
    can bring it back.  The samples of flushed data read back after the
    reconnect differ: the copy fails loudly (never exit 0 over a wrong
    disk), the log says the server lost flushed data.  Copying again on
    the same mount rewrites everything: exit 0, the server holds the
    source, and the daemon exits 0 (every failure repaired)."""
    size = 96 * MiB
    k = memory_kit(kit, size)
    m = mount(k.target, "--pool-size", "16M", expect_errors=True)
    src = random_file(shm / "src.img", size)
    cp = bg(["cp", str(src), str(m.file)], shm / "cp.err")
    wait_progress(cp, written_bytes, 48 * MiB)
    deadline = time.monotonic() + 60
    while (status_json(m) or {}).get("pool_flushes", 0) < 1:
        assert time.monotonic() < deadline, "no flush in 60 s"
        time.sleep(0.05)
    k.kill()
    time.sleep(1)
    k.start()
    rc = cp.wait(600)
    out = judge(tally, "resend-memory-restart-flushed", rc, src,
                sha256_nbd(k.uri, size), None, cp.stderr)
    assert out == "loud", cp.stderr
    assert re.search(r"the server lost data an NBD flush had covered",
                     m.stderr), m.stderr
    st = status_json(m)
    assert st["damage"]["unrepaired"], st["damage"]
    assert any(f.get("lost_at_reconnect") for f in st["failures"]), st
    # The same copy again, on the same mount: repaired.
    cp2 = bg(["cp", str(src), str(m.file)], shm / "cp2.err")
    rc = cp2.wait(600)
    out = judge(tally, "resend-memory-copy-again", rc, src,
                sha256_nbd(k.uri, size), None, cp2.stderr)
    assert out == "match", cp2.stderr


# Writes 256 KiB every 0.1 s and never closes until told (a file appears).
SLOW_WRITER = r"""
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY)
stop, src = sys.argv[2], open(sys.argv[3], "rb")
n = 0
while not os.path.exists(stop):
    chunk = src.read(256 << 10)
    if not chunk:
        src.seek(0)
        continue
    os.pwrite(fd, chunk, n % (48 << 20))
    n += len(chunk)
    time.sleep(0.1)
print("closing", flush=True)
os.close(fd)
"""


def test_periodic_flush_while_writing(kit, mount, shm, bg):
    """A copy that never closes or fsyncs still gets NBD flushes, at
    least every 10 s while it writes: the server's log (nbdkit's log
    filter) shows two while the file is still open.  The pool is large
    (4096 buffers): no flush is needed to free buffers, only the clock
    asks for them."""
    size = 64 * MiB
    disk = random_file(shm / "disk.img", size)
    log = shm / "nbdkit.log"
    k = kit("srv", ["--filter=log", "file", disk, f"logfile={log}"])
    m = mount(k.target, "--pool-size", "1G", "--request-size", "256K",
              "--no-manifest")    # the pool's own flushes alone
    src = random_file(shm / "src.img", 4 * MiB)
    t0 = time.monotonic()
    stop = shm / "stop"
    w = bg([sys.executable, "-c", SLOW_WRITER, str(m.file), str(stop),
            str(src)], shm / "w.err")
    deadline = time.monotonic() + 90
    while flushes_in(log) < 2:
        assert w.poll() is None, "the writer stopped"
        assert time.monotonic() < deadline, \
            f"{flushes_in(log)} flushes in 90 s of writing"
        time.sleep(0.2)
    st = status_json(m)
    assert w.poll() is None                        # still open
    assert st["pool_flushes"] >= 2, json.dumps(st)
    # by the clock: not before two intervals had passed
    assert time.monotonic() - t0 >= 19, time.monotonic() - t0
    stop.touch()
    assert w.wait(60) == 0
    m.unmount()
