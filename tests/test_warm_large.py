"""The manifest on a very large export keeps its memory in proportion to
what it records, never to the export's size.

A 17 TiB export (nbdkit memory: 285 million blocks of 64 KiB), mounted
with the defaults (manifest and inline digest on), and the operations
that touch the whole of it: cp of a small file (O_TRUNC: the whole file
is cut), the same cp again on the same mount and on a new one (the
cutover), a hole punched over the whole disk, a 4 TiB zero range.  Each
once held one pending change per block (a cut settled at close, a
zeroing recorded block by block): 18 GiB before the kernel killed the
daemon, the copy failing with ECONNABORTED.  A watcher kills the daemon
past 1 GiB of memory (rather than let it take the machine) and the test
fails.  The bytes are checked on the server each time."""

import os
import signal
import threading

from lib.copytools import status
from lib.digest import sha256_bytes
from lib.env import MiB
from lib.nbd import read_nbd
from lib.procs import run

SIZE = 17 << 40
LIMIT = 1 << 30


class MemoryGuard:
    """Kills the daemon if its resident memory passes LIMIT."""

    def __init__(self, m):
        self.m, self.peak, self.killed = m, 0, False
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.watch, daemon=True)
        self.t.start()

    def watch(self):
        while True:
            rss = self.m.rss()
            if rss is None:
                return
            self.peak = max(self.peak, rss[0])
            if rss[0] > LIMIT:
                self.killed = True
                os.kill(self.m.pid, signal.SIGKILL)
                return
            if self.stop.wait(0.05):
                return

    def done(self):
        self.stop.set()
        self.t.join()
        assert not self.killed, (f"the daemon passed {LIMIT >> 20} MiB "
                                 f"(killed at {self.peak >> 20} MiB)")
        return self.peak


def guarded_cp(m, srv, src, data):
    guard = MemoryGuard(m)
    run(["cp", src, m.file], check=True)                # O_TRUNC
    peak = guard.done()
    assert os.stat(m.file).st_size == len(data)       # the apparent size
    assert sha256_bytes(read_nbd(srv.uri, 0, len(data))) == \
        sha256_bytes(data)
    assert read_nbd(srv.uri, len(data), 65536) == bytes(65536)
    return peak


def test_whole_export_operations_stay_small(server, mount, shm):
    srv = server("memory", f"size={SIZE}")
    src = shm / "src.img"
    data = os.urandom(10 * MiB + 12345)
    src.write_bytes(data)
    m = mount(srv)
    print(f"cp: peak {guarded_cp(m, srv, src, data) >> 20} MiB")
    print(f"cp again: peak {guarded_cp(m, srv, src, data) >> 20} MiB")
    m.unmount()
    m = mount(srv)                                      # the cutover
    print(f"cutover: peak {guarded_cp(m, srv, src, data) >> 20} MiB")
    assert status(m)["manifest"]["trust"] == "trusted"
    guard = MemoryGuard(m)
    run(["fallocate", "--zero-range", "--keep-size", "-o", str(1 << 40),
         "-l", str(4 << 40), m.file], check=True)
    run(["fallocate", "--punch-hole", "--keep-size", "-o", "0", "-l",
         str(SIZE), m.file], check=True)
    fd = os.open(m.file, os.O_RDWR)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    peak = guard.done()
    st = status(m)["manifest"]
    assert st["pending_blocks"] == 0, st
    assert read_nbd(srv.uri, 0, len(data)) == bytes(len(data))
    print(f"zeroing: peak {peak >> 20} MiB, manifest {st}")
    m.unmount()
