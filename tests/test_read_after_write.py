"""Reads see every earlier write, including writes the server has not
acknowledged yet.

Two servers hold writes back: the delay filter (every write waits seconds,
reads do not) and the pause filter (nothing is served until resumed, so the
only place the data can come from is the daemon's write-back buffers).
Reads use a second file handle opened with O_DIRECT, so they reach the
daemon instead of being answered from the kernel's page cache."""

import mmap
import os
import random
import threading
import pytest

from lib.content import assert_content
from lib.env import MiB, timeout
from lib.images import random_bytes, random_file
from lib.procs import in_thread
from lib.servers import PauseControl

EXPORT = 32 * MiB
PAGE = 4096


def read_direct(path, off, n):
    """n bytes at off through an O_DIRECT handle (aligned superset read).
    Falls back to dropping the page cache if O_DIRECT is refused."""
    lo = off - off % PAGE
    hi = -(-(off + n) // PAGE) * PAGE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        fd = None
    if fd is not None:
        buf = mmap.mmap(-1, hi - lo)
        try:
            got = os.preadv(fd, [buf], lo)
            data = bytes(buf[:got])
        except OSError as e:
            if e.errno != 22:                        # EINVAL: no O_DIRECT
                raise
            data = None
        finally:
            os.close(fd)
            buf.close()
        if data is not None:
            return data[off - lo:off - lo + n]
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return os.pread(fd, n, off)
    finally:
        os.close(fd)


def check_read(path, ref, off, n, what):
    got = read_direct(path, off, n)
    if got != bytes(ref[off:off + n]):
        diff = next((i for i in range(min(len(got), n))
                     if got[i] != ref[off + i]), min(len(got), n))
        pytest.fail(f"{what}: read {n}@{off} differs from the pending "
                    f"writes at byte {off + diff} (got {len(got)} bytes)")


@pytest.fixture
def slow_disk(server, shm):
    """A file-backed export, random contents, every write delayed 2 s."""
    disk = random_file(shm / "disk.img", EXPORT)
    srv = server("file", disk, "wdelay=2", filters=["delay"])
    return srv, bytearray(disk.read_bytes())


def test_read_after_write_pending_on_slow_server(slow_disk, mount):
    srv, ref = slow_disk
    m = mount(srv, "--pool-size", "64M", "--depth", "16")
    rng = random.Random(5)
    fd = os.open(m.file, os.O_RDWR)
    try:
        writes = [(3 * MiB + 17, 2 * MiB + 5), (9 * MiB, 1), (9 * MiB + 2, 3),
                  (12 * MiB - 100, 200), (20 * MiB + 4095, 3 * MiB)]
        for off, n in writes:
            data = rng.randbytes(n)
            assert os.pwrite(fd, data, off) == n
            ref[off:off + n] = data
            # Exactly the write, and a window that mixes pending bytes with
            # bytes only the server has.
            check_read(m.file, ref, off, n, "pending write")
            check_read(m.file, ref, max(0, off - 5000), n + 10000,
                       "pending write and old data")
            assert os.pread(fd, n, off) == data, "same-handle read"
        # Rewrite a pending range at once; the newest bytes must win.
        off, n = 3 * MiB + 1000, MiB
        data = rng.randbytes(n)
        assert os.pwrite(fd, data, off) == n
        ref[off:off + n] = data
        check_read(m.file, ref, 3 * MiB, 3 * MiB, "rewrite of pending data")
        # A sweep over everything, still before close.
        check_read(m.file, ref, 0, EXPORT, "whole disk before close")
    finally:
        os.close(fd)
    assert_content(bytes(ref), EXPORT, mount_file=m.file, uri=srv.uri,
                   what="after close")
    assert srv.disk.read_bytes() == bytes(ref), "backing file differs"


def test_read_after_write_while_server_paused(server, mount, shm, shortdir):
    """Writes made while the server is paused are acknowledged at once
    (write-back); reads of them issued while the writes are still stuck in
    flight may wait for the server, but once it resumes they must return
    the new bytes, never the old ones (a read racing its overlapping write
    at the server would)."""
    disk = random_file(shm / "disk.img", EXPORT)
    ctl = shortdir / "pause.ctl"
    srv = server("file", disk, f"pause-control={ctl}", filters=["pause"])
    m = mount(srv, "--pool-size", "32M")
    pause = PauseControl(ctl)
    ref = bytearray(disk.read_bytes())
    off, n = 8 * MiB, 8 * MiB
    data = random_bytes(n)
    ref[off:off + n] = data
    # Pending data, pending data mixed with old bytes, tiny and unaligned.
    ranges = [(off + 3 * MiB, MiB), (off + 3 * MiB + 123, 4567),
              (off + 4 * MiB - 1, 2), (off - 100000, 300000),
              (off + n - 5000, 10000)]
    results = {}

    def reader(roff, rn):
        try:
            results[roff] = read_direct(m.file, roff, rn)
        except OSError as e:
            results[roff] = e

    readers = [threading.Thread(target=reader, args=r, daemon=True)
               for r in ranges]
    fd = os.open(m.file, os.O_RDWR)
    try:
        pause.pause()
        try:
            def write_all():
                for i in range(0, n, MiB):
                    assert os.pwrite(fd, data[i:i + MiB], off + i) == MiB
            r, _ = in_thread(write_all, 30)
            assert r != "hung", ("write() blocked while the server was "
                                 "paused: writes are not write-back")
            for t in readers:
                t.start()
            for t in readers:
                t.join(0.5)          # give them time to reach the daemon
        finally:
            pause.resume()
        for t in readers:
            t.join(timeout(60))
        assert not any(t.is_alive() for t in readers), \
            "reads still blocked after the server resumed"
    finally:
        os.close(fd)
    for roff, rn in ranges:
        got = results[roff]
        assert not isinstance(got, Exception), f"read {rn}@{roff}: {got}"
        if got != bytes(ref[roff:roff + rn]):
            bad = next(i for i in range(min(len(got), rn))
                       if got[i] != ref[roff + i])
            pytest.fail(f"read {rn}@{roff} issued while its writes were in "
                        f"flight differs at byte {roff + bad}")
    assert_content(bytes(ref), EXPORT, mount_file=m.file, uri=srv.uri,
                   what="after resume and close")


@pytest.mark.parametrize("conns", ["1", "4"])
def test_read_after_write_random_on_reordering_server(jitter_server, mount,
                                                      shm, conns):
    """Many writes then immediate reads of overlapping ranges, while writes
    complete late and out of order across connections: every read returns
    what the writes made before it say."""
    disk = random_file(shm / "disk.img", EXPORT)
    ref = bytearray(disk.read_bytes())
    srv = jitter_server(EXPORT, 20000, f"init={disk}")
    m = mount(srv, "-C", conns, "--depth", "32", "--request-size", "128K")
    rng = random.Random(int(conns))
    fd = os.open(m.file, os.O_RDWR)
    try:
        for i in range(120):
            n = rng.choice([1, 777, 4096, 65536, 200001, MiB + 3])
            off = rng.randrange(0, 6 * MiB - n)
            data = rng.randbytes(n)
            assert os.pwrite(fd, data, off) == n
            ref[off:off + n] = data
            roff = max(0, off + rng.randint(-70000, 70000))
            rn = rng.randint(1, 400000)
            check_read(m.file, ref, roff, min(rn, EXPORT - roff),
                       f"read after write {i}")
    finally:
        os.close(fd)
    assert_content(bytes(ref), EXPORT, mount_file=m.file, uri=srv.uri,
                   what="random read-after-write")
