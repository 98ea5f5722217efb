"""The inline digest hashes the copy where the pool holds it.

Writes are moved once into their pool buffer and the digest hashes that
buffer in place, so a buffer must stay unchanged and out of reuse until it
is both acknowledged by the server and hashed.  A small pool (four 2 MiB
buffers) and a server that answers each write late keep every buffer busy
and reused many times over during a copy many times the pool's size: a
buffer reused early would change bytes under the hash (the digest would
differ from the source's) or on the wire (the disk would).  Every case
checks the digest, the disk read back from the server and the file read
through the mount against sha256 of the source."""

import json
import time

import pytest

from lib.digest import sha256_file
from lib.env import HAVE_FUSE, HAVE_NBDKIT, MiB, timeout
from lib.images import random_file
from lib.nbd import sha256_nbd
from lib.procs import run

pytestmark = pytest.mark.skipif(not (HAVE_FUSE and HAVE_NBDKIT),
                                reason="needs /dev/fuse and nbdkit")

SIZE = 96 * MiB + 4096 * 3 + 7      # not a multiple of any buffer size
SETTLED = {"complete", "incomplete", "not-a-forward-pass", "abandoned",
           "write-failed", "disabled"}


def settled_digest(m, secs=60):
    deadline = time.monotonic() + timeout(secs)
    while True:
        d = json.loads((m.mp / ".nbdferry-status").read_bytes())["digest"]
        if d["state"] in SETTLED:
            return d
        if time.monotonic() > deadline:
            pytest.fail(f"digest still {d} after {timeout(secs):.0f}s")
        time.sleep(0.05)


COPIES = {
    "cp": lambda s, d: ["cp", s, d],
    # 1000 KiB writes straddle the 2 MiB buffers: one write, two buffers.
    "dd-bs-1000k": lambda s, d: ["dd", f"if={s}", f"of={d}", "bs=1000k",
                                 "status=none"],
    "dd-bs-4m": lambda s, d: ["dd", f"if={s}", f"of={d}", "bs=4M",
                              "status=none"],
}


@pytest.mark.parametrize("tool", list(COPIES))
def test_digest_from_held_buffers_small_pool(server, mount, shm, tool):
    src = random_file(shm / "src.img", SIZE)
    want = sha256_file(src)
    srv = server("memory", f"size={128 * MiB}", "wdelay=1ms",
                 filters=("delay",))
    m = mount(srv, "--digest=sha256", "--pool-size=8M")
    run(COPIES[tool](str(src), str(m.file)), check=True, timeout=600)
    d = settled_digest(m)
    assert d["state"] == "complete", d
    assert d["value"] == want, d
    assert sha256_nbd(srv.uri, SIZE) == want, "the disk differs from the source"
    assert sha256_file(m.file) == want, "the file differs from the source"
    st = json.loads((m.mp / ".nbdferry-status").read_bytes())
    # the writers' four, and the digest's own two beside them
    assert st["pool_buffers"] == 4 and st["pool_hold_buffers"] == 2, st
    assert st["pool_buffers_in_use"] <= 6, st
    m.unmount()
