"""The digest never takes the pipeline's buffers.

The inline digest hashes writes where the pool holds them, but only up to
its own budget of pool buffers, kept apart from --pool-size; past it a
write is copied into the digest's own bounded queue and its buffer given
back at once, and past that the writer waits for the hash (counted in the
status's copy_waited_s, shown by nbdferry-status).  So with a hasher made
slow on purpose (NBDFERRY_DEBUG_DIGEST_DELAY_US) and a server slow enough
that the pool fills, the writes in flight still reach --depth x
connections, as with no digest at all; the digest still completes with
the right value, and the bytes land.  A digest that held pool buffers
without a bound of its own (as before: up to half the pool) would cap the
writes in flight at the buffers left."""

import json
import os

import pytest

from lib.content import assert_content
from lib.digest import blkhash_file
from lib.env import HAVE_FUSE, HAVE_NBDKIT, MiB, TOP
from lib.images import random_file
from lib.procs import run
from test_digest_inline import settled_digest

pytestmark = pytest.mark.skipif(not (HAVE_FUSE and HAVE_NBDKIT),
                                reason="needs /dev/fuse and nbdkit")

EXPORT = 64 * MiB
# 18 buffers of 1 MiB for a window of 4 connections x depth 4 (16): two
# spare for the buffer being filled and the FUSE landing.
WINDOW = ["--pool-size", "18M", "--request-size", "1M", "-C", "4",
          "--depth", "4"]
STATUS = TOP / "tools" / "status" / "nbdferry-status"


def status(m):
    return json.loads((m.mp / ".nbdferry-status").read_bytes())


@pytest.mark.parametrize("opts", [[], ["--digest=sha256"]],
                         ids=["blkhash", "sha256"])
def test_slow_hasher_leaves_the_window_full(server, mount, shm, monkeypatch,
                                            opts):
    """A first write that the slow hasher still holds once the server
    has answered it, then a burst: the burst still fills the window."""
    # 300 ms a write on the server: the burst fills the window if the
    # writer lands 16 MiB in 300 ms (53 MiB/s, which a loaded 2-core
    # machine still does; at 100 ms it needed 160 MiB/s and the suite's
    # load once held the peak at 12).  The hasher as slow, so that it
    # still holds the first write once the server has answered it.
    monkeypatch.setenv("NBDFERRY_DEBUG_DIGEST_DELAY_US", "300000")
    srv = server("memory", f"size={EXPORT}", "wdelay=300ms",
                 filters=("delay",))
    m = mount(srv, *WINDOW, *opts)
    assert status(m)["connections"] == 4, "the server offers multi-conn"
    src = random_file(shm / "src.img", 24 * MiB)
    fd = os.open(m.file, os.O_WRONLY | os.O_TRUNC)
    try:
        with open(src, "rb") as f:
            first = f.read(4 * MiB)
            rest = f.read()
        for off in range(0, len(first), MiB):
            os.pwrite(fd, first[off:off + MiB], off)
        os.fsync(fd)                # answered; the hasher is still at it
        st = status(m)
        assert st["in_flight_peak"] < 16, st     # the burst must fill it
        assert st["digest"]["state"] == "computing", st["digest"]
        for off in range(0, len(rest), MiB):
            os.pwrite(fd, rest[off:off + MiB], len(first) + off)
        os.fsync(fd)
    finally:
        os.close(fd)
    st = status(m)
    assert st["in_flight_peak"] == 16, st           # depth x connections
    d = settled_digest(m, secs=120)
    assert d["state"] == "complete", d
    assert d["held_bytes"] <= d["hold_limit"] == 3 * MiB, d
    assert d["copied_bytes"] > 0, d                 # the budget was spent
    want = blkhash_file(src) if not opts else run(
        ["sha256sum", src], check=True).stdout.split()[0]
    assert d["value"] == want, d
    assert_content(src, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=24 * MiB, what="writes under a slow hasher")


def test_copy_waits_on_the_digest_counted(server, mount, shm, monkeypatch):
    """A hasher slower than everything: once its holds and its queue are
    full the writer waits for it, and the status counts the seconds.
    The hasher takes nothing until a writer finds the queue full
    (NBDFERRY_DEBUG_DIGEST_GATE): 48 MiB against 3 MiB of holds and a
    32 MiB queue, so the writer waits however fast or loaded the machine
    (a hasher only slowed lost the race to a slow writer: waited 0.0).
    Fails if the wait is not counted, or if the queue has no bound (the
    writer never waits, the gate opens only at the settle)."""
    monkeypatch.setenv("NBDFERRY_DEBUG_DIGEST_GATE", "1")
    monkeypatch.setenv("NBDFERRY_DEBUG_DIGEST_DELAY_US", "20000")
    srv = server("memory", f"size={EXPORT}")
    m = mount(srv, *WINDOW)
    src = random_file(shm / "src.img", 48 * MiB)
    run(["dd", f"if={src}", f"of={m.file}", "bs=1M", "status=none"],
        check=True, timeout=300)
    d = settled_digest(m, secs=120)
    assert d["state"] == "complete" and d["value"] == blkhash_file(src), d
    assert d["copy_waited_s"] > 0, d
    assert d["queued_bytes"] == 0 and d["held_bytes"] == 0, d
    out = run(["/usr/bin/python3", STATUS, m.mp], check=True).stdout
    assert "the copy waited" in out and "for the hash" in out, out
    assert_content(src, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=48 * MiB, what="dd, copy waiting on the hash")


def test_sha256_hashes_zeros_from_the_zero_page(server, mount, shm,
                                                monkeypatch):
    """--digest=sha256 over a sparse copy whose zeros are written (dd
    without conv=sparse) and skipped (holes): no zero byte is held in a
    pool buffer or copied, so even a slow hasher (slowed only for data)
    neither holds nor copies them, and the value is sha256sum's."""
    monkeypatch.setenv("NBDFERRY_DEBUG_DIGEST_DELAY_US", "100000")
    srv = server("memory", f"size={EXPORT}")
    m = mount(srv, *WINDOW, "--digest=sha256")
    src = shm / "src.img"
    with open(src, "wb") as f:
        f.write(b"\1" * 4096)           # one data item, then 40 MiB zeros
        f.write(bytes(40 * MiB))
        f.truncate(48 * MiB)            # and a hole at the end
    run(["dd", f"if={src}", f"of={m.file}", "bs=1M", "status=none"],
        check=True, timeout=300)
    d = settled_digest(m, secs=120)
    want = run(["sha256sum", src], check=True).stdout.split()[0]
    assert d["state"] == "complete" and d["value"] == want, d
    assert d["copied_bytes"] == 0, d
    assert d["copy_waited_s"] == 0, d
    assert_content(src, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=48 * MiB, what="dd of zeros, sha256")
