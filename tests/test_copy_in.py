"""Copy tools into the mount land exactly the source's bytes.

Every case starts from an export pre-filled with random bytes, so a stale
byte anywhere shows, and checks sha256 of the source against the file read
back through the mount AND the export read directly from the server.

The last section copies with every tool onto an export that already
holds data: the source (make_mixed_image) is smaller than the export and
holds random data, real holes, and written zeros, aligned and not.

What each tool does to the old data (docs/copy-tools.md):
- cp (every --sparse mode), dd without notrunc, cat >, rsync --inplace:
  open with O_TRUNC (or truncate), so the disk ends up as the source
  followed by zeros;
- qemu-img convert -n: writes the source's range only, the old data beyond
  it stays;
- dd conv=sparse,notrunc: skipped all-zero blocks keep the old data.
"""

import errno
import os
import random
import shutil

import pytest

from lib.content import assert_content
from lib.copytools import (describe, garbage_target, make_mixed_image, traffic,
                           zero_payload)
from lib.env import MiB
from lib.images import make_sparse_image, random_bytes, random_file
from lib.nbd import random_export, read_nbd
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
            data = random_bytes(n)
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


# ------------------------------------------ onto an export holding data

USED_EXPORT = 96 * MiB
SRC_SIZE = 80 * MiB + 12345          # smaller than the export, odd


@pytest.fixture
def used_target(server, mount):
    return garbage_target(server, mount, USED_EXPORT)


@pytest.fixture
def mixed(shm):
    return make_mixed_image(shm / "src.img", SRC_SIZE, seed=3)


def sh(script, *args):
    return ["sh", "-c", script, "sh"] + [str(a) for a in args]


# Tools whose result is "the source, then zeros to the end of the disk".
TRUNCATING = {
    "cp-sparse-always": lambda s, d: ["cp", "--sparse=always", s, d],
    "cp-sparse-auto": lambda s, d: ["cp", "--sparse=auto", s, d],
    "cp-sparse-never": lambda s, d: ["cp", "--sparse=never", s, d],
    "dd-sparse-1M": lambda s, d: ["dd", f"if={s}", f"of={d}", "bs=1M",
                                  "conv=sparse", "status=none"],
    "cat": lambda s, d: sh('cat "$1" > "$2"', s, d),
    "rsync-inplace-sparse": lambda s, d: ["rsync", "--inplace", "--sparse",
                                          s, d],
}


def need(tool):
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} not installed")


@pytest.mark.parametrize("tool", list(TRUNCATING))
def test_copy_tool_mixed_image_onto_garbage(used_target, mixed, tool):
    need(TRUNCATING[tool]("a", "b")[0])
    t = used_target
    r = run(TRUNCATING[tool](mixed.path, t.m.file))
    assert r.returncode == 0, f"{tool} exited {r.returncode}: {r.stderr}"
    # Through the mount: exactly the source.  On the server: the source,
    # then zeros where the old random bytes were.
    assert_content(mixed.path, USED_EXPORT, mount_file=t.m.file, uri=t.srv.uri,
                   mount_size=SRC_SIZE, what=tool)
    t.m.unmount()
    tr = traffic(t.srv, t.mark)
    assert tr.n["Trim"] == 0, f"{tool}: trim sent (zeroing must not trim): " \
        + describe(tr)
    # Written zeros (cp --sparse=never, cat, dd) become write-zeroes, not
    # payload: no aligned all-zero 64 KiB block travels as data.
    zp, where = zero_payload(tr, mixed.path.read_bytes())
    assert zp == 0, f"{tool}: {zp} bytes of zeros sent as payload (64 KiB " \
        f"blocks at {', '.join(where)}...); " + describe(tr)
    # The old bytes beyond the data had to be zeroed, by write-zeroes.
    assert tr.bytes["Zero"] >= USED_EXPORT - SRC_SIZE, describe(tr)


def test_copy_dd_fsync_dense_image(used_target, shm):
    t = used_target
    src = random_file(shm / "dense.img", SRC_SIZE)
    r = run(["dd", f"if={src}", f"of={t.m.file}", "bs=4M", "conv=fsync",
             "status=none"])
    assert r.returncode == 0, f"dd exited {r.returncode}: {r.stderr}"
    assert_content(src, USED_EXPORT, mount_file=t.m.file, uri=t.srv.uri,
                   mount_size=SRC_SIZE, what="dd conv=fsync bs=4M")
    t.m.unmount()
    tr = traffic(t.srv, t.mark)
    assert tr.n["Flush"] >= 1, "conv=fsync sent no NBD flush: " + describe(tr)
    assert tr.n["Trim"] == 0, describe(tr)


def test_copy_qemu_img_convert_n(used_target, mixed):
    """qemu-img convert -n writes the source's range and leaves the rest
    of the destination alone: the old bytes beyond the source stay.  qemu
    sees a raw file as a whole number of 512-byte sectors, so it writes
    zeros from the source's odd end to the next multiple of 512."""
    need("qemu-img")
    t = used_target
    r = run(["qemu-img", "convert", "-n", "-f", "raw", "-O", "raw",
             mixed.path, t.m.file])
    assert r.returncode == 0, f"qemu-img exited {r.returncode}: {r.stderr}"
    end = -(-SRC_SIZE // 512) * 512
    expected = mixed.path.read_bytes() + bytes(end - SRC_SIZE) + t.old[end:]
    assert_content(expected, USED_EXPORT, mount_file=t.m.file, uri=t.srv.uri,
                   what="qemu-img convert -n")
    t.m.unmount()
    tr = traffic(t.srv, t.mark)
    assert tr.n["Trim"] == 0, describe(tr)
    zp, where = zero_payload(tr, expected)
    assert zp == 0, f"{zp} bytes of zeros sent as payload (64 KiB blocks " \
        f"at {', '.join(where)}...); " + describe(tr)


def test_copy_qemu_img_convert_n_same_size(server, mount, shm):
    """The usual migration: source and export of one size, every old byte
    replaced (holes and zeros of the source read as zero).  Disk sizes
    are whole sectors; qemu-img would round an odd one up and hit ENOSPC."""
    need("qemu-img")
    size = SRC_SIZE // 4096 * 4096
    t = garbage_target(server, mount, size)
    img = make_mixed_image(shm / "same.img", size, seed=9)
    r = run(["qemu-img", "convert", "-n", "-f", "raw", "-O", "raw",
             img.path, t.m.file])
    assert r.returncode == 0, f"qemu-img exited {r.returncode}: {r.stderr}"
    assert_content(img.path, size, mount_file=t.m.file, uri=t.srv.uri,
                   what="qemu-img convert -n, same size")


def sparse_notrunc_expected(old, src_bytes, bs):
    """dd conv=sparse,notrunc: every bs block of the source that is all
    zero is skipped (lseek), so the destination keeps its old bytes there;
    every other block is written.  Beyond the source: old bytes."""
    out = bytearray(old)
    for off in range(0, len(src_bytes), bs):
        blk = src_bytes[off:off + bs]
        if blk.count(0) != len(blk):
            out[off:off + len(blk)] = blk
    return bytes(out)


def test_copy_dd_sparse_notrunc_keeps_old_data(used_target, mixed):
    """Documents dd's semantics, not a daemon bug: with notrunc, the zeros
    of the source are not written, and the old data stays there."""
    t = used_target
    bs = 64 * 1024
    r = run(["dd", f"if={mixed.path}", f"of={t.m.file}", f"bs={bs}",
             "conv=sparse,notrunc", "status=none"])
    assert r.returncode == 0, f"dd exited {r.returncode}: {r.stderr}"
    src = mixed.path.read_bytes()
    expected = sparse_notrunc_expected(t.old, src, bs)
    # The old data really is there: the 4 MiB of written zeros at 5 MiB in
    # the source (16 whole blocks) still hold the old random bytes.
    assert expected[5 * MiB:9 * MiB] == t.old[5 * MiB:9 * MiB]
    assert src[5 * MiB:9 * MiB] == bytes(4 * MiB)
    assert_content(expected, USED_EXPORT, mount_file=t.m.file, uri=t.srv.uri,
                   what="dd conv=sparse,notrunc")


def test_copy_smaller_dense_source_tail_reads_zero(server, mount, shm):
    """A small source: the whole rest of the disk, old random bytes, reads
    as zero afterwards, also after a fresh mount (so the zeroing reached
    the server, not only the daemon's map)."""
    t = garbage_target(server, mount, USED_EXPORT)
    src = random_file(shm / "small.img", 5 * MiB + 1)
    r = run(["cp", src, t.m.file])
    assert r.returncode == 0, f"cp exited {r.returncode}: {r.stderr}"
    assert_content(src, USED_EXPORT, mount_file=t.m.file, uri=t.srv.uri,
                   mount_size=5 * MiB + 1, what="cp small source")
    t.m.unmount()
    m2 = mount(t.srv)
    # A fresh mount starts at the export's size: source, then zeros.
    assert_content(src, USED_EXPORT, mount_file=m2.file, uri=t.srv.uri,
                   what="after remount")
    tr = traffic(t.srv, t.mark)
    assert tr.n["Trim"] == 0, describe(tr)


def test_copy_source_larger_than_export_enospc(used_target, shm):
    """cp of a source larger than the export fails with ENOSPC, names the
    error, and the disk is left as it was (the refusal comes before the
    first write and the open's truncate)."""
    t = used_target
    t.m.expect_errors = True
    old = read_nbd(t.srv.uri)
    src = random_file(shm / "big.img", USED_EXPORT + 3 * MiB + 7)
    r = run(["cp", src, t.m.file])
    assert r.returncode != 0, "cp of a too large source succeeded"
    assert "No space left on device" in r.stderr, \
        f"cp's message does not say ENOSPC: {r.stderr!r}"
    assert_content(old, USED_EXPORT, mount_file=t.m.file, uri=t.srv.uri,
                   what="cp larger source")
    assert os.path.getsize(t.m.file) == USED_EXPORT
