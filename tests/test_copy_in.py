"""Copy tools into the mount land exactly the source's bytes.

Every case starts from an export pre-filled with random bytes, so a stale
byte anywhere shows, and checks sha256 of the source against the file read
back through the mount AND the export read directly from the server."""

import errno
import os
import random

import pytest

from lib.content import assert_content
from lib.env import MiB
from lib.images import make_sparse_image, random_file
from lib.nbd import random_export
from lib.procs import run

EXPORT = 64 * MiB


@pytest.fixture(params=["memory", "jitter"])
def target(request, server, jitter_server, mount, shm):
    """A 64 MiB export full of random bytes, mounted: nbdkit memory, or the
    random-delay RAM disk (writes complete late and out of order, so a
    buffer reused before its reply or a misordered request shows)."""
    srv, old = random_export(request.param, server, jitter_server, shm,
                             EXPORT, 5000)
    m = mount(srv, expect_errors=request.node.name.startswith(
        ("test_cp_source_larger", "test_write_past_export")))
    return srv, m, old


@pytest.mark.parametrize("size", [EXPORT, 48 * MiB, 40 * MiB + 12345],
                         ids=["same-size", "smaller", "smaller-odd"])
def test_cp_sparse_always_image_with_holes(target, shm, size):
    srv, m, _ = target
    img = make_sparse_image(shm / "src.img", size, runs=12, seed=size)
    # The image really has holes (else the test would not test them).
    assert os.stat(img.path).st_blocks * 512 < size
    r = run(["cp", "--sparse=always", img.path, m.file])
    assert r.returncode == 0, f"cp failed: {r.stderr}"
    # Through the mount the file is exactly the source; on the server the
    # source is followed by zeros up to the export size.
    assert_content(img.path, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=size, what="cp --sparse=always")


@pytest.mark.parametrize("bs", ["1M", "4k"])
def test_dd_dense_image(target, shm, bs):
    srv, m, _ = target
    src = random_file(shm / "src.img", 24 * MiB + (4096 if bs == "4k" else 0))
    r = run(["dd", f"if={src}", f"of={m.file}", f"bs={bs}", "status=none"])
    assert r.returncode == 0, f"dd failed: {r.stderr}"
    assert_content(src, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=os.path.getsize(src), what=f"dd bs={bs}")


def test_dd_notrunc_unaligned_seek(target, shm):
    """dd conv=notrunc at an odd byte offset keeps the old bytes around."""
    srv, m, old = target
    src = random_file(shm / "src.img", 5 * MiB + 333)
    seek = 3 * MiB + 12345
    r = run(["dd", f"if={src}", f"of={m.file}", "bs=64k", "oflag=seek_bytes",
             f"seek={seek}", "conv=notrunc,fsync", "status=none"])
    assert r.returncode == 0, f"dd failed: {r.stderr}"
    ref = bytearray(old)
    data = src.read_bytes()
    ref[seek:seek + len(data)] = data
    assert_content(bytes(ref), EXPORT, mount_file=m.file, uri=srv.uri,
                   what="dd conv=notrunc seek")


def odd_writes(size, rng):
    """(offset, length) pairs: edges, odd sizes, writes that straddle 2 MiB
    request boundaries, descending order, and overlapping rewrites."""
    ws = [(0, 1), (size - 1, 1), (513, 511), (4095, 4097),
          (MiB - 1, 2 * MiB + 3), (2 * MiB - 7, 14), (size - 4099, 4099)]
    # Backwards through a region: no two writes are contiguous in order.
    ws += [(20 * MiB + i * 65537, 65531) for i in range(15, -1, -1)]
    # Overlapping rewrites of one area, small and large.
    base = 40 * MiB + 777
    ws += [(base, 3 * MiB + 1), (base + 1000, 10), (base + 5, 2 * MiB),
           (base + MiB, 1), (base - 333, 4096)]
    for _ in range(40):
        n = rng.choice([1, 3, 511, 4097, 65535, 131073, 1000003])
        ws.append((rng.randrange(0, size - n), n))
    return ws


def test_pwrite_odd_sizes_and_offsets(target):
    srv, m, old = target
    rng = random.Random(7)
    ref = bytearray(old)
    fd = os.open(m.file, os.O_RDWR)
    try:
        for off, n in odd_writes(EXPORT, rng):
            data = os.urandom(n)
            assert os.pwrite(fd, data, off) == n, f"short write {n}@{off}"
            ref[off:off + n] = data
    finally:
        os.close(fd)
    assert_content(bytes(ref), EXPORT, mount_file=m.file, uri=srv.uri,
                   what="pwrite at odd offsets")


def test_write_past_export_size_is_enospc(target):
    srv, m, old = target
    fd = os.open(m.file, os.O_RDWR)
    try:
        with pytest.raises(OSError) as e:
            os.pwrite(fd, b"x" * 4096, EXPORT)
        assert e.value.errno == errno.ENOSPC
        with pytest.raises(OSError) as e:
            os.pwrite(fd, b"x", EXPORT + 10 * MiB)
        assert e.value.errno == errno.ENOSPC
    finally:
        os.close(fd)
    assert_content(old, EXPORT, mount_file=m.file, uri=srv.uri,
                   what="after refused writes")


def test_cp_source_larger_than_export(target, shm):
    """cp of a source larger than the export fails (ENOSPC) at its first
    write and says so, before the disk changes (not even truncated)."""
    srv, m, old = target
    src = random_file(shm / "big.img", EXPORT + MiB + 5)
    r = run(["cp", src, m.file])
    assert r.returncode != 0, "cp of a too-large source exited 0"
    assert "No space left on device" in r.stderr, r.stderr
    assert "larger than the export" in m.stderr
    assert_content(old, EXPORT, uri=srv.uri, what="the refused copy's disk")
