"""The inline digest with --digest=sha256: a running sha256 of one forward
pass over the raw file (the default, blkhash: test_digest_blkhash.py).

After cp, dd or cat into the mount, the status's digest equals `sha256sum`
of the source (holes counted as zeros), without reading the disk back.
When the writes are not one forward pass the status says so and never shows
a value.  Every case also checks the bytes that landed, through the mount
and on the server."""

import json
import os
import time

import pytest

from lib.content import assert_content
from lib.digest import sha256_bytes
from lib.env import HAVE_FUSE, HAVE_NBDKIT, MiB, timeout
from lib.images import make_sparse_image, random_bytes, random_file
from lib.nbd import fill_random
from lib.procs import punch_hole, run

pytestmark = pytest.mark.skipif(not (HAVE_FUSE and HAVE_NBDKIT),
                                reason="needs /dev/fuse and nbdkit")

EXPORT = 64 * MiB
SETTLED = {"complete", "incomplete", "not-a-forward-pass", "abandoned",
           "write-failed", "disabled", "cannot-complete"}


def status(m):
    return json.loads((m.mp / ".nbdferry-status").read_bytes())


def settled_digest(m, secs=30):
    """The digest once the thread has caught up (it may lag the close)."""
    deadline = time.monotonic() + timeout(secs)
    while True:
        d = status(m)["digest"]
        if d["state"] in SETTLED:
            return d
        if time.monotonic() > deadline:
            pytest.fail(f"digest still {d} after {timeout(secs):.0f}s")
        time.sleep(0.05)


def sha256sum(path):
    return run(["sha256sum", path], check=True).stdout.split()[0]


@pytest.fixture
def target(server, mount):
    """A 64 MiB memory export full of random bytes (so a hole that is not
    zeroed shows), mounted."""
    srv = server("memory", f"size={EXPORT}")
    fill_random(srv.uri, EXPORT)
    return srv, mount(srv, "--digest=sha256")


def assert_digest_is(m, expected_hex, size):
    d = settled_digest(m)
    assert d["algorithm"] == "sha256"
    assert d["state"] == "complete", d
    assert d["covered"] == size and d["size"] == size, d
    assert d["value"] == expected_hex, d


@pytest.mark.parametrize("size,runs", [
    (40 * MiB + 12345, 12),
    (30 * MiB, [(0, MiB), (10 * MiB + 3, 123457)]),   # ends in a hole
    (EXPORT, 7),
], ids=["odd-size", "trailing-hole", "export-size"])
def test_digest_cp_sparse_always(target, shm, size, runs):
    srv, m = target
    img = make_sparse_image(shm / "src.img", size, runs=runs, seed=size)
    assert os.stat(img.path).st_blocks * 512 < size, "source not sparse"
    run(["cp", "--sparse=always", img.path, m.file], check=True)
    assert_digest_is(m, sha256sum(img.path), size)
    assert_content(img.path, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=size, what="cp --sparse=always")


def test_digest_dd_bs_1m(target, shm):
    srv, m = target
    src = random_file(shm / "src.img", 24 * MiB + 333)
    run(["dd", f"if={src}", f"of={m.file}", "bs=1M", "status=none"],
        check=True)
    assert_digest_is(m, sha256sum(src), os.path.getsize(src))
    assert_content(src, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=os.path.getsize(src), what="dd bs=1M")


def test_digest_dd_conv_sparse(target, shm):
    srv, m = target
    img = make_sparse_image(shm / "src.img", 20 * MiB, runs=5, seed=3)
    run(["dd", f"if={img.path}", f"of={m.file}", "bs=64k", "conv=sparse",
         "status=none"], check=True)
    assert_digest_is(m, img.sha256, img.size)
    assert_content(img.path, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=img.size, what="dd conv=sparse")


def test_digest_cat(target, shm):
    srv, m = target
    src = random_file(shm / "src.img", 9 * MiB + 4097)
    run(["sh", "-c", f'cat "{src}" > "{m.file}"'], check=True)
    assert_digest_is(m, sha256sum(src), os.path.getsize(src))
    assert_content(src, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=os.path.getsize(src), what="cat")


def test_digest_empty_file(target):
    """O_TRUNC and close: the digest of nothing."""
    srv, m = target
    os.close(os.open(m.file, os.O_WRONLY | os.O_TRUNC))
    assert_digest_is(m, sha256_bytes(b""), 0)
    assert_content(b"", EXPORT, mount_file=m.file, uri=srv.uri, mount_size=0)


def test_digest_descending_writes_not_forward(target):
    """pwrite at descending offsets: never a value, state says why."""
    srv, m = target
    data = random_bytes(8 * MiB)
    fd = os.open(m.file, os.O_WRONLY | os.O_TRUNC)
    try:
        for off in range(len(data) - MiB, -1, -MiB):
            assert os.pwrite(fd, data[off:off + MiB], off) == MiB
            assert "value" not in status(m)["digest"]
    finally:
        os.close(fd)
    d = settled_digest(m)
    assert d["state"] == "not-a-forward-pass", d
    assert "value" not in d and "before the position" in d["reason"], d
    assert_content(data, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=len(data), what="descending pwrite")


def test_digest_rewrite_behind_position(target):
    """A forward pass, then one rewrite of its start: no value."""
    srv, m = target
    data = bytearray(random_bytes(4 * MiB))
    with open(m.file, "wb") as f:
        f.write(data)
        f.seek(100)
        f.write(b"x" * 10)
    data[100:110] = b"x" * 10
    assert settled_digest(m)["state"] == "not-a-forward-pass"
    assert_content(bytes(data), EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=len(data), what="rewrite")


def test_digest_gap_without_truncate_is_old_data(target):
    """No O_TRUNC: skipping bytes leaves old data there, so no value."""
    srv, m = target
    fd = os.open(m.file, os.O_WRONLY)
    try:
        os.pwrite(fd, b"a" * 4096, 0)
        os.pwrite(fd, b"b" * 4096, MiB)
    finally:
        os.close(fd)
    d = settled_digest(m)
    assert d["state"] == "not-a-forward-pass" and "older data" in d["reason"]


def test_digest_notrunc_whole_export_and_prefix(target, shm):
    """dd conv=notrunc from 0 over the whole export covers the file; over a
    prefix it does not ("incomplete": the rest is older data)."""
    srv, m = target
    src = random_file(shm / "full.img", EXPORT)
    run(["dd", f"if={src}", f"of={m.file}", "bs=1M", "conv=notrunc",
         "status=none"], check=True)
    assert_digest_is(m, sha256sum(src), EXPORT)
    assert_content(src, EXPORT, mount_file=m.file, uri=srv.uri)

    small = random_file(shm / "small.img", 3 * MiB)
    run(["dd", f"if={small}", f"of={m.file}", "bs=1M", "conv=notrunc",
         "status=none"], check=True)
    d = settled_digest(m)
    # The second dd rewrote [0, 3 MiB) behind the first pass's position.
    assert d["state"] == "not-a-forward-pass" and "value" not in d, d


def test_digest_second_pass_restarts(target, shm):
    """A new O_TRUNC copy starts a new pass."""
    srv, m = target
    a = random_file(shm / "a.img", 5 * MiB)
    b = random_file(shm / "b.img", 3 * MiB + 1)
    run(["cp", a, m.file], check=True)
    assert_digest_is(m, sha256sum(a), 5 * MiB)
    run(["cp", b, m.file], check=True)
    assert_digest_is(m, sha256sum(b), 3 * MiB + 1)
    assert_content(b, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=3 * MiB + 1)


def test_digest_punch_at_position(target, shm):
    """fallocate --punch-hole at the position advances it as zeros (what
    cp --sparse=always does on some coreutils versions)."""
    srv, m = target
    head = random_bytes(MiB + 5)
    tail = random_bytes(4096)
    with open(m.file, "wb") as f:
        f.write(head)
        f.flush()
        os.fsync(f.fileno())
        punch_hole(f.fileno(), len(head), 2 * MiB)
        f.seek(len(head) + 2 * MiB)
        f.write(tail)
    expect = head + bytes(2 * MiB) + tail
    assert_digest_is(m, sha256_bytes(expect), len(expect))
    assert_content(expect, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=len(expect))


def test_digest_disabled(server, mount, shm):
    srv = server("memory", f"size={EXPORT}")
    m = mount(srv, "--no-digest")
    src = random_file(shm / "src.img", 2 * MiB)
    run(["cp", src, m.file], check=True)
    d = status(m)["digest"]
    assert d["state"] == "disabled" and "value" not in d
    assert_content(src, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=2 * MiB)
