"""Pipeline stress (run against the TSan build by
scripts/test-sanitizers): many writer threads rewriting overlapping ranges
and punching holes at once, small requests, deep pipelines, several
connections, against a RAM disk that completes requests in random order.

Overlapping operations from different threads are ordered by a lock per
64 KiB block held across the system call, so the expected final bytes are
well defined: the model applies each operation while the lock is held.
After fsync the file through the mount and the export read directly must
both equal the model."""

import ctypes
import os
import random
import threading

import pytest

from lib.content import assert_content
from lib.env import MiB, timeout

REGION = 8 * MiB
BLOCK = 64 * 1024
PUNCH, KEEP = 0x02, 0x01

_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64,
                            ctypes.c_int64]


def punch(fd, off, n):
    if _libc.fallocate(fd, PUNCH | KEEP, off, n) == -1:
        raise OSError(ctypes.get_errno(), "fallocate")


def hammer(path, model, locks, seed, ops, errors):
    rng = random.Random(seed)
    fd = os.open(path, os.O_RDWR)
    try:
        for _ in range(ops):
            off = rng.randrange(0, REGION - 1)
            n = min(rng.choice((1, 17, 512, 4096, 5000, 65536, 100000)),
                    REGION - off)
            first, last = off // BLOCK, (off + n - 1) // BLOCK
            held = locks[first:last + 1]
            for lk in held:
                lk.acquire()
            try:
                if rng.random() < 0.1:
                    punch(fd, off, n)
                    model[off:off + n] = bytes(n)
                else:
                    data = rng.randbytes(n) if rng.random() < 0.8 \
                        else bytes(n)             # all-zero payloads too
                    assert os.pwrite(fd, data, off) == n
                    model[off:off + n] = data
                if rng.random() < 0.05:           # read-after-write
                    got = os.pread(fd, n, off)
                    if got != bytes(model[off:off + n]):
                        errors.append(f"read back {n}@{off} differs")
            finally:
                for lk in reversed(held):
                    lk.release()
        os.fsync(fd)
    except BaseException as e:                    # reported by the test
        errors.append(repr(e))
    finally:
        os.close(fd)


@pytest.mark.parametrize("conns,depth,reqsize,pool", [
    (4, 64, "4K", "256K"),
    (2, 16, "64K", "1M"),
    (1, 256, "4K", "64K"),
])
def test_stress_overlapping_writers(jitter_server, mount, conns, depth,
                                    reqsize, pool):
    srv = jitter_server(REGION, 2000)
    m = mount(srv, "-C", conns, "--depth", depth, "--request-size", reqsize,
              "--pool-size", pool, "--idle-ms", "1")
    model = bytearray(REGION)
    locks = [threading.Lock() for _ in range(REGION // BLOCK)]
    errors = []
    ops = int(os.environ.get("NBDFERRY_STRESS_OPS", "400"))
    threads = [threading.Thread(target=hammer,
                                args=(m.file, model, locks, 1000 + i, ops,
                                      errors))
               for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout(600))
        assert not t.is_alive(), "a writer hung"
    assert not errors, errors[:5]
    assert_content(bytes(model), REGION, mount_file=m.file, uri=srv.uri,
                   what=f"C{conns} depth {depth} rs {reqsize} pool {pool}")
    m.unmount()
    assert_content(bytes(model), REGION, uri=srv.uri, what="after unmount")
