"""Copying the disk out of the mount.

SEEK_DATA/SEEK_HOLE and st_blocks come from what the daemon knows reads as
zero (block status at mount, its own zeroing), so cp --sparse=auto takes
its SEEK_DATA path and out.img is sparse: its allocated size is close to
the data, not the export's size.  qemu-img compare and cmp agree with the
sha256 comparison.
"""

import shutil

import pytest

from lib.content import assert_content
from lib.copytools import allocated, garbage_target
from lib.digest import sha256_file
from lib.env import MiB
from lib.images import make_sparse_image
from lib.procs import run

EXPORT = 128 * MiB
SRC_SIZE = 120 * MiB + 4096 * 5 + 7


@pytest.mark.parametrize("where", ["same-mount", "fresh-mount"])
def test_copy_out_cp_sparse_auto_is_sparse(server, mount, shm, where):
    t = garbage_target(server, mount, EXPORT)
    src = make_sparse_image(shm / "src.img", SRC_SIZE, runs=20, seed=11)
    data = allocated(src.path)
    assert data < SRC_SIZE // 2, "source image is not sparse"
    r = run(["cp", "--sparse=always", src.path, t.m.file])
    assert r.returncode == 0, f"cp in exited {r.returncode}: {r.stderr}"
    m, size = t.m, SRC_SIZE
    if where == "fresh-mount":
        # Zero map from the server's block status only; the file is the
        # whole export again.
        t.m.unmount()
        m, size = mount(t.srv), EXPORT
    assert_content(src.path, EXPORT, mount_file=m.file, uri=t.srv.uri,
                   mount_size=size, what="after cp in")

    out = shm / "out.img"
    r = run(["cp", "--sparse=auto", m.file, out])
    assert r.returncode == 0, f"cp out exited {r.returncode}: {r.stderr}"
    assert out.stat().st_size == size
    assert sha256_file(out) == sha256_file(src.path, pad_to=size), \
        "out.img differs from the source"
    # Sparse: allocated about the data (block status granularity may round
    # each of the 20 runs out a little), far from the file size.
    assert allocated(out) <= data + 20 * 128 * 1024, \
        f"out.img allocates {allocated(out)} bytes for {data} bytes of " \
        f"data (size {size}): holes were copied as data"

    r = run(["cmp", out, m.file])
    assert r.returncode == 0, f"cmp: {r.stdout}{r.stderr}"
    if shutil.which("qemu-img"):
        r = run(["qemu-img", "compare", "-f", "raw", "-F", "raw", out, m.file])
        assert r.returncode == 0, f"qemu-img compare out.img: {r.stdout}{r.stderr}"
        # The shorter source against the disk: qemu-img compare wants the
        # extra bytes of the larger image to read as zero.
        r = run(["qemu-img", "compare", "-f", "raw", "-F", "raw", src.path,
                 m.file])
        assert r.returncode == 0, f"qemu-img compare src: {r.stdout}{r.stderr}"
