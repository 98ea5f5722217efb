"""The FUSE receive loop: one thread reads every request and serves the
writes itself; everything else goes to workers.  A write that waits (for
a pool buffer, while the server is paused) must not hold up the other
requests: a spare reader takes over while it waits.  Every copy is judged
by the sha256 of what the server holds."""

import os
import threading
import time

from lib.env import MiB
from lib.faults import (judge, sha256_mount, sha256_prefix, status_json,
                        wait_progress, written_bytes)
from lib.images import random_file
from lib.procs import in_thread
from test_stall import Paused, slow_kit

SRC = 48 * MiB


def test_status_and_stat_served_while_a_write_waits(kit, mount, shm, bg,
                                                     tally):
    """dd writes into a small pool; the server is paused, so the pool
    fills and dd's write waits inside the daemon (a request timeout far
    longer than the test, so it keeps waiting).  Meanwhile the status file
    is read and the file stat'ed, both answered while dd is still stuck;
    the status says the pool is full.  After the server resumes, dd
    completes and the server holds the source's bytes."""
    k = slow_kit(kit, shm)
    m = mount(k.target, "--pool-size", "8M", "--request-size", "1M",
              "--request-timeout", "600", "--retry-timeout", "600")
    src = random_file(shm / "src.img", SRC)
    cp = bg(["dd", f"if={src}", f"of={m.file}", "bs=1M", "conv=fsync"],
            shm / "cp.err")
    wait_progress(cp, written_bytes, 4 * MiB)
    with Paused(k):
        stuck = threading.Event()

        def full_pool():
            # Polls until every buffer is taken: the writer then waits.
            while not stuck.is_set():
                st = status_json(m)
                if st and st["pool_buffers_in_use"] >= st["pool_buffers"]:
                    return st
                time.sleep(0.05)
        state, st = in_thread(full_pool, 60)
        stuck.set()
        assert state == "done", \
            "the status file did not answer while the pool filled"
        time.sleep(0.5)                # dd's next write now waits
        before = written_bytes(cp.pid)
        # dd is stuck in a write now; these must still be served.
        state, st2 = in_thread(lambda: status_json(m), 60)
        assert state == "done" and st2, \
            "the status file hung behind a waiting write"
        state, size = in_thread(lambda: os.stat(m.file).st_size, 60)
        assert state == "done", "stat hung behind a waiting write"
        assert cp.poll() is None and written_bytes(cp.pid) == before, \
            "dd was not waiting: the test did not test anything"
    rc = cp.wait(300)
    out = judge(tally, "write-waits-status-served", rc, src,
                sha256_prefix(k.disk, SRC), sha256_mount(m.file, SRC),
                cp.stderr)
    assert out == "match", f"rc {rc}\n{cp.stderr}\n{m.stderr}"
    m.unmount()


def test_open_after_close_never_finds_the_old_handle(server, mount):
    """close() returns before the kernel's RELEASE of the handle reaches
    the daemon, and the next open() of the file can be the very next
    request.  The VHD and VMDK views take one writer at a time, so if the
    release were served after that open (two workers, either order), the
    open would fail with EBUSY although the writer before it had closed.
    Over many rounds, with a reader of the status file keeping workers
    busy, every open must succeed."""
    srv = server("memory", f"size={16 * MiB}")
    m = mount(srv, "--no-digest")
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            status_json(m)
    t = threading.Thread(target=reader, daemon=True)
    t.start()
    try:
        for view in ("nbd.vhd", "nbd.vmdk"):
            path = m.mp / view
            for i in range(300):
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
                except OSError as e:
                    raise AssertionError(
                        f"round {i}: open of {view} after the last close "
                        f"failed: {e}") from e
                os.close(fd)
    finally:
        stop.set()
        t.join(10)
