"""The benchmark's nbdkit filter (bench/nbdkit-filters/usdelay.c): wdelay
delays writes, zeroes and trims, rdelay delays reads, with microsecond
resolution; data passes through unchanged.  Only lower bounds are checked
(a sleep never ends early), never how fast anything runs."""
import hashlib
import time

import pytest

from lib.env import BUILD, MiB, libnbd
from lib.images import random_bytes

FILTER = BUILD / "bench" / "nbdkit-filters" / "nbdkit-usdelay-filter.so"


def filter_path():
    if not FILTER.exists():
        pytest.fail(f"{FILTER} not built (scripts/build)")
    if libnbd is None:
        pytest.fail("python3-libnbd missing (scripts/install-deps)")
    return FILTER


def connect(uri):
    h = libnbd.NBD()
    h.connect_uri(uri)
    return h


@pytest.mark.parametrize("key", ["rdelay", "wdelay"])
def test_usdelay_delays_and_passes_data(server, key):
    srv = server("memory", "size=8M", f"{key}=20000us",
                 filters=[filter_path()])
    h = connect(srv.uri)
    data = random_bytes(MiB)
    t0 = time.monotonic()
    for i in range(4):
        h.pwrite(data, i * MiB)
    writes = time.monotonic() - t0
    t0 = time.monotonic()
    got = b"".join(h.pread(MiB, i * MiB) for i in range(4))
    reads = time.monotonic() - t0
    h.shutdown()
    assert hashlib.sha256(got).digest() == hashlib.sha256(data * 4).digest()
    # Four requests one after another, each sleeping at least 20 ms.
    slow = reads if key == "rdelay" else writes
    assert slow >= 4 * 0.020, (key, writes, reads)


def test_usdelay_rejects_a_bad_unit(server):
    with pytest.raises(pytest.fail.Exception, match="unknown unit"):
        server("memory", "size=8M", "rdelay=5parsecs",
               filters=[filter_path()])
