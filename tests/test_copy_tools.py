"""Copy tools into the mount, onto an export that already holds data.

Every case starts from an export filled with random bytes, so a stale byte
anywhere shows, and ends by comparing sha256 of what the source promises
against the file read through the mount AND the export read directly from
the server.  The source (make_mixed_image) is smaller than the export and
holds random data, real holes, and written zeros, aligned and not.

What each tool does to the old data (docs/copy-tools.md):
- cp (every --sparse mode), dd without notrunc, cat >, rsync --inplace:
  open with O_TRUNC (or truncate), so the disk ends up as the source
  followed by zeros;
- qemu-img convert -n: writes the source's range only, the old data beyond
  it stays;
- dd conv=sparse,notrunc: skipped all-zero blocks keep the old data.
"""

import os
import shutil

import pytest

from lib.content import assert_content
from lib.copytools import (describe, garbage_target, make_mixed_image, traffic,
                           zero_payload)
from lib.env import MiB
from lib.images import random_file
from lib.nbd import read_nbd
from lib.procs import run

EXPORT = 96 * MiB
SRC_SIZE = 80 * MiB + 12345          # smaller than the export, odd


@pytest.fixture
def target(server, mount):
    return garbage_target(server, mount, EXPORT)


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
def test_copy_tool_mixed_image_onto_garbage(target, mixed, tool):
    need(TRUNCATING[tool]("a", "b")[0])
    t = target
    r = run(TRUNCATING[tool](mixed.path, t.m.file))
    assert r.returncode == 0, f"{tool} exited {r.returncode}: {r.stderr}"
    # Through the mount: exactly the source.  On the server: the source,
    # then zeros where the old random bytes were.
    assert_content(mixed.path, EXPORT, mount_file=t.m.file, uri=t.srv.uri,
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
    assert tr.bytes["Zero"] >= EXPORT - SRC_SIZE, describe(tr)


def test_copy_dd_fsync_dense_image(target, shm):
    t = target
    src = random_file(shm / "dense.img", SRC_SIZE)
    r = run(["dd", f"if={src}", f"of={t.m.file}", "bs=4M", "conv=fsync",
             "status=none"])
    assert r.returncode == 0, f"dd exited {r.returncode}: {r.stderr}"
    assert_content(src, EXPORT, mount_file=t.m.file, uri=t.srv.uri,
                   mount_size=SRC_SIZE, what="dd conv=fsync bs=4M")
    t.m.unmount()
    tr = traffic(t.srv, t.mark)
    assert tr.n["Flush"] >= 1, "conv=fsync sent no NBD flush: " + describe(tr)
    assert tr.n["Trim"] == 0, describe(tr)


def test_copy_qemu_img_convert_n(target, mixed):
    """qemu-img convert -n writes the source's range and leaves the rest
    of the destination alone: the old bytes beyond the source stay.  qemu
    sees a raw file as a whole number of 512-byte sectors, so it writes
    zeros from the source's odd end to the next multiple of 512."""
    need("qemu-img")
    t = target
    r = run(["qemu-img", "convert", "-n", "-f", "raw", "-O", "raw",
             mixed.path, t.m.file])
    assert r.returncode == 0, f"qemu-img exited {r.returncode}: {r.stderr}"
    end = -(-SRC_SIZE // 512) * 512
    expected = mixed.path.read_bytes() + bytes(end - SRC_SIZE) + t.old[end:]
    assert_content(expected, EXPORT, mount_file=t.m.file, uri=t.srv.uri,
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


def test_copy_dd_sparse_notrunc_keeps_old_data(target, mixed):
    """Documents dd's semantics, not a daemon bug: with notrunc, the zeros
    of the source are not written, and the old data stays there."""
    t = target
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
    assert_content(expected, EXPORT, mount_file=t.m.file, uri=t.srv.uri,
                   what="dd conv=sparse,notrunc")


def test_copy_smaller_dense_source_tail_reads_zero(server, mount, shm):
    """A small source: the whole rest of the disk, old random bytes, reads
    as zero afterwards, also after a fresh mount (so the zeroing reached
    the server, not only the daemon's map)."""
    t = garbage_target(server, mount, EXPORT)
    src = random_file(shm / "small.img", 5 * MiB + 1)
    r = run(["cp", src, t.m.file])
    assert r.returncode == 0, f"cp exited {r.returncode}: {r.stderr}"
    assert_content(src, EXPORT, mount_file=t.m.file, uri=t.srv.uri,
                   mount_size=5 * MiB + 1, what="cp small source")
    t.m.unmount()
    m2 = mount(t.srv)
    # A fresh mount starts at the export's size: source, then zeros.
    assert_content(src, EXPORT, mount_file=m2.file, uri=t.srv.uri,
                   what="after remount")
    tr = traffic(t.srv, t.mark)
    assert tr.n["Trim"] == 0, describe(tr)


def test_copy_source_larger_than_export_enospc(target, shm):
    """cp of a source larger than the export fails with ENOSPC, names the
    error, and the disk is left as it was (the refusal comes before the
    first write and the open's truncate)."""
    t = target
    t.m.expect_errors = True
    old = read_nbd(t.srv.uri)
    src = random_file(shm / "big.img", EXPORT + 3 * MiB + 7)
    r = run(["cp", src, t.m.file])
    assert r.returncode != 0, "cp of a too large source succeeded"
    assert "No space left on device" in r.stderr, \
        f"cp's message does not say ENOSPC: {r.stderr!r}"
    assert_content(old, EXPORT, mount_file=t.m.file, uri=t.srv.uri,
                   what="cp larger source")
    assert os.path.getsize(t.m.file) == EXPORT
