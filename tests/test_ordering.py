"""Concurrent writers with overlapping, quickly repeated writes end up with
exactly the bytes a sequential replay gives.

NBD gives no ordering between requests in flight, so a daemon that lets two
overlapping requests (a rewrite of the same block) be in flight together, or
reuses a buffer before its reply, leaves stale or foreign bytes.  The
workloads are designed so the final content is deterministic:

* test_ordering_four_writers: three processes own disjoint stripe sets and
  rewrite their own blocks many times in quick succession (tiny to whole
  stripe, unaligned); a fourth does large overlapping rewrites sequentially
  in its own region.  Only each process's own order matters.
* test_ordering_rotating_owners: four processes take turns (barrier between
  rounds) overwriting the same blocks through their own open file handles,
  never closing in between, so a round's writes are still pending when the
  next owner overwrites them.

The daemon runs with a high depth and a small request size to maximise the
number of requests in flight; the reference is a bytearray replay."""

import ctypes
import multiprocessing
import os
import random
import time

import pytest

from lib.content import assert_content
from lib.env import MiB
from lib.images import random_bytes, random_file

EXPORT = 32 * MiB
STRIPE = 256 * 1024
STRESS = ("--depth", "64", "--request-size", "64K")


def striped_ops(rng, owner, nstripes, nprocs, count):
    """Ops confined to single stripes owned by `owner`, with rewrites of
    the same block in quick succession."""
    mine = [s for s in range(nstripes) if s % nprocs == owner]
    ops = []
    while len(ops) < count:
        s = rng.choice(mine) * STRIPE
        kind = rng.random()
        if kind < 0.3:
            n = rng.randint(1, 17)
        elif kind < 0.7:
            n = rng.randint(1, 65536 + 4097)
        else:
            n = rng.randint(STRIPE // 2, STRIPE)
        off = s + rng.randint(0, STRIPE - n)
        ops.append((off, rng.randbytes(n)))
        # Rewrite the same block at once, sometimes several times, with
        # the same or a slightly different extent.
        for _ in range(rng.choice([0, 1, 1, 2, 5])):
            o2 = max(s, off - rng.randint(0, 3))
            n2 = min(s + STRIPE - o2, n + rng.randint(-min(n - 1, 3), 3))
            ops.append((o2, rng.randbytes(n2)))
    return ops


def overlapping_ops(rng, lo, hi, count):
    """Large, unaligned, overlapping rewrites in [lo, hi)."""
    ops = []
    for _ in range(count):
        n = rng.choice([rng.randint(1, 4096), rng.randint(65536, 3 * MiB + 5)])
        off = rng.randint(lo, hi - n)
        ops.append((off, rng.randbytes(n)))
        if rng.random() < 0.3:        # partially overlapping rewrite at once
            o2 = min(hi - 1, off + n // 2)
            n2 = min(hi - o2, n)
            ops.append((o2, rng.randbytes(n2)))
    return ops


def writer(path, ops, start, fsync_every=0):
    """Child process: apply ops in order through its own file handle."""
    fd = os.open(path, os.O_RDWR)
    start.wait(30)
    for i, (off, data) in enumerate(ops):
        if os.pwrite(fd, data, off) != len(data):
            os._exit(2)
        if fsync_every and i % fsync_every == fsync_every - 1:
            os.fsync(fd)
    os.close(fd)                       # raises (exit 1) if a write failed


def run_children(targets):
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=t, args=a) for t, a in targets]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    stuck = [p.pid for p in procs if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    assert not stuck, f"writers {stuck} hung"
    codes = [p.exitcode for p in procs]
    assert codes == [0] * len(procs), f"writer exit codes {codes}"


@pytest.mark.parametrize("conns", ["1", "4"])
def test_ordering_four_writers(jitter_server, mount, shm, conns):
    disk = random_file(shm / "disk.img", EXPORT)
    old = disk.read_bytes()
    srv = jitter_server(EXPORT, 20000, f"init={disk}")
    m = mount(srv, "-C", conns, "-o", "multiwriter", *STRESS)  # 4 writers
    rng = random.Random(1234)
    split = 24 * MiB
    plans = [striped_ops(rng, p, split // STRIPE, 3, 500) for p in range(3)]
    plans.append(overlapping_ops(rng, split, EXPORT, 100))

    ref = bytearray(old)
    for ops in plans:
        for off, data in ops:
            ref[off:off + len(data)] = data

    start = multiprocessing.get_context("fork").Barrier(4)
    run_children([(writer, (m.file, ops, start, 97 if i == 1 else 0))
                  for i, ops in enumerate(plans)])
    assert_content(bytes(ref), EXPORT, mount_file=m.file, uri=srv.uri,
                   what="four writers")


def rotating_writer(path, rounds, me, barrier):
    fd = os.open(path, os.O_RDWR)
    for ops in rounds:
        barrier.wait(60)
        for owner, off, data in ops:
            if owner == me and os.pwrite(fd, data, off) != len(data):
                os._exit(2)
    barrier.wait(60)
    os.close(fd)


def test_ordering_rotating_owners(jitter_server, mount, shm):
    disk = random_file(shm / "disk.img", EXPORT)
    old = disk.read_bytes()
    srv = jitter_server(EXPORT, 20000, f"init={disk}")
    m = mount(srv, "-C", "2", "-o", "multiwriter", *STRESS)   # 4 writers
    rng = random.Random(99)
    nblocks, nprocs = 16 * MiB // STRIPE, 4
    rounds = []
    for r in range(12):
        ops = []
        for b in range(nblocks):
            owner = (b + r) % nprocs
            base = b * STRIPE
            if rng.random() < 0.5:
                off, n = base, STRIPE               # the whole block
            else:
                n = rng.randint(1, STRIPE)
                off = base + rng.randint(0, STRIPE - n)
            ops.append((owner, off, rng.randbytes(n)))
        rng.shuffle(ops)
        rounds.append(ops)

    ref = bytearray(old)
    for ops in rounds:
        for _, off, data in ops:
            ref[off:off + len(data)] = data

    barrier = multiprocessing.get_context("fork").Barrier(nprocs)
    run_children([(rotating_writer, (m.file, rounds, p, barrier))
                  for p in range(nprocs)])
    assert_content(bytes(ref), EXPORT, mount_file=m.file, uri=srv.uri,
                   what="rotating owners")


# ------------------------------------------- writes versus zeroing

FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
FALLOC_FL_ZERO_RANGE = 0x10
_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64,
                            ctypes.c_int64]


def fallocate(fd, mode, off, n):
    if _libc.fallocate(fd, mode, off, n) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"fallocate(mode={mode:#x}, {n}@{off}): "
                      f"{os.strerror(e)}")


REORDER = ["jitter", "slow-write", "slow-zero"]


@pytest.fixture(params=REORDER)
def reorder_disk(request, server, jitter_server, shm):
    """An export of random bytes whose requests tend to complete out of
    order: random delays on every write and zero (jitter), or slow writes
    with fast zeroes, or the reverse.  Returns (server, old bytes)."""
    disk = random_file(shm / "disk.img", EXPORT)
    if request.param == "jitter":
        return jitter_server(EXPORT, 20000, f"init={disk}"), \
            bytearray(disk.read_bytes())
    slow = ["delay-write=40ms"] if request.param == "slow-write" else \
        ["delay-zero=40ms", "delay-trim=40ms"]
    srv = server("file", disk, *slow, filters=["delay"])
    return srv, bytearray(disk.read_bytes())


def test_ordering_writes_punches_and_zero_ranges(reorder_disk, mount):
    """A write followed at once by a punch-hole or zero-range over the same
    bytes (and the reverse) must end as the last operation says."""
    srv, ref = reorder_disk
    m = mount(srv, *STRESS)
    rng = random.Random(4321)
    fd = os.open(m.file, os.O_RDWR)
    try:
        for _ in range(150):
            n = rng.choice([1, 511, 4096, 65536 + 3, rng.randint(1, 3 * MiB)])
            off = rng.randint(0, 8 * MiB - n)          # a small area: overlap
            op = rng.random()
            if op < 0.5:
                data = rng.randbytes(n)
                assert os.pwrite(fd, data, off) == n
                ref[off:off + n] = data
            else:
                mode = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE \
                    if op < 0.75 else FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE
                fallocate(fd, mode, off, n)
                ref[off:off + n] = bytes(n)
        # Pending data then a punch over part of it, then a write inside
        # the punched range: data, zeros, data, zeros, data.
        base = 12 * MiB + 11
        first = rng.randbytes(4 * MiB)
        os.pwrite(fd, first, base)
        ref[base:base + 4 * MiB] = first
        fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                  base + MiB, 2 * MiB)
        ref[base + MiB:base + 3 * MiB] = bytes(2 * MiB)
        mid = rng.randbytes(4099)
        os.pwrite(fd, mid, base + 2 * MiB)
        ref[base + 2 * MiB:base + 2 * MiB + 4099] = mid
        os.fsync(fd)
    finally:
        os.close(fd)
    assert_content(bytes(ref), EXPORT, mount_file=m.file, uri=srv.uri,
                   what="writes, punches and zero ranges")


def test_ordering_truncate_over_pending_writes(reorder_disk, mount):
    """ftruncate below data still in flight: the cut-off bytes must read as
    zero on the disk afterwards (the pending write must not land after the
    zeroing); writes past the new size extend the file again."""
    srv, ref = reorder_disk
    m = mount(srv, *STRESS)
    fd = os.open(m.file, os.O_RDWR)
    try:
        data = random_bytes(8 * MiB)
        assert os.pwrite(fd, data, 0) == len(data)
        ref[:len(data)] = data
        os.ftruncate(fd, 4 * MiB + 1)                  # cut pending data
        ref[4 * MiB + 1:] = bytes(EXPORT - 4 * MiB - 1)
        assert os.fstat(fd).st_size == 4 * MiB + 1
        tail_off = 6 * MiB + 5
        tail = random_bytes(100003)
        assert os.pwrite(fd, tail, tail_off) == len(tail)
        ref[tail_off:tail_off + len(tail)] = tail
        size = tail_off + len(tail)
        assert os.fstat(fd).st_size == size
    finally:
        os.close(fd)
    assert_content(bytes(ref[:size]), EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=size, what="truncate over pending writes")


def test_ordering_otrunc_reopen_while_pending(reorder_disk, mount):
    """Open with O_TRUNC while another handle's writes are in flight; the
    old handle's writes (made before) must not reappear after the
    truncation."""
    srv, ref = reorder_disk
    m = mount(srv, *STRESS)
    a = os.open(m.file, os.O_RDWR)
    try:
        old = random_bytes(6 * MiB)
        assert os.pwrite(a, old, MiB) == len(old)
        b = os.open(m.file, os.O_RDWR | os.O_TRUNC)
        try:
            assert os.fstat(b).st_size == 0
            new = random_bytes(2 * MiB + 1)
            assert os.pwrite(b, new, 0) == len(new)
        finally:
            os.close(b)
    finally:
        os.close(a)
    assert_content(new, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=len(new), what="O_TRUNC over pending writes")


def test_ordering_rewrite_after_idle_send(jitter_server, mount, shm):
    """A block rewritten after a pause long enough for the daemon to have
    sent the first version (idle timer, or the writer moving elsewhere)
    while that request is still in flight at a slow, reordering server."""
    disk = random_file(shm / "disk.img", EXPORT)
    ref = bytearray(disk.read_bytes())
    srv = jitter_server(EXPORT, 30000, f"init={disk}")
    m = mount(srv, *STRESS)
    rng = random.Random(77)
    fd = os.open(m.file, os.O_RDWR)
    try:
        for i in range(60):
            off = rng.randrange(0, 4 * MiB)
            n = rng.choice([1, 4096, 65536, 300001])
            n = min(n, EXPORT - off)
            for _ in range(3):
                data = rng.randbytes(n)
                assert os.pwrite(fd, data, off) == n
                ref[off:off + n] = data
                if rng.random() < 0.5:             # move elsewhere
                    o2 = rng.randrange(16 * MiB, EXPORT - 4096)
                    d2 = rng.randbytes(4096)
                    os.pwrite(fd, d2, o2)
                    ref[o2:o2 + 4096] = d2
                else:                              # or go idle
                    time.sleep(rng.choice([0.005, 0.015, 0.03]))
    finally:
        os.close(fd)
    assert_content(bytes(ref), EXPORT, mount_file=m.file, uri=srv.uri,
                   what="rewrites after idle sends")
