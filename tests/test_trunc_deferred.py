"""A truncate does not change the disk until what replaces it is known.

O_TRUNC, and a truncate that shrinks the raw file, make the file that
short at once (its apparent size: reads through the mount end there),
but the old bytes stay on the disk until the copy's first change (a
write, a fallocate, a view's data), a truncate that grows the file (its
final size: the bytes between must read as zero), an fsync, or the clean
close of the handle that truncated.  A close after a refused request
(EFBIG truncate, ENOSPC write past the end) leaves the disk as it was,
its size restored, and says so in the log (docs/design/README.md, "Truncate").

Every case starts from an export of random bytes and compares the server
(a direct NBD read, before and after the unmount) with what it must hold:
- qemu-img convert of a qcow2 larger than the export (it truncates to 0,
  then to the image's size, which fails with EFBIG): the disk unchanged;
- the same with O_TRUNC, ftruncate to 0 or dd seek= past the export, and
  an O_TRUNC open whose write past the export fails (ENOSPC);
- `: > MNT/nbd` (O_TRUNC and a clean close): every byte reads zero;
- cp --sparse=always of a smaller sparse image: the source, then zero;
- fsync after O_TRUNC with nothing written: zero on the server at once;
- with a manifest holding data: a shrink after writes (rsync --inplace)
  is zeroed at the close, an O_TRUNC with nothing written at the
  release, both sent at once (not left pending until the unmount);
- a write past a truncate, and a truncate that grows: zeros between;
- an O_TRUNC open of each format view changes nothing (they wait for
  the stream's first bytes);
- the digest of the last copy stays right across a dropped truncate.

Run: /usr/bin/python3 -m pytest tests/test_trunc_deferred.py
"""

import errno
import hashlib
import json
import os

import pytest

from lib.content import assert_content
from lib.env import MiB
from lib.images import make_sparse_image, random_bytes
from lib.nbd import fill_random, read_nbd, sha256_nbd
from lib.procs import oserror_errno, run, wait_for

EXPORT = 32 * MiB
LEFT = "the disk is left as it was"


def status(m):
    return json.loads((m.mp / ".nbdferry-status").read_bytes())


@pytest.fixture
def dirty(server, mount):
    """A 32 MiB export of random bytes, mounted; (server, mount, sha)."""
    srv = server("memory", f"size={EXPORT}")
    fill_random(srv.uri, EXPORT)
    m = mount(srv, expect_errors=True)
    return srv, m, sha256_nbd(srv.uri)


def assert_unchanged(srv, m, before):
    """The server holds what it held, the file shows all of it, and so
    does the server once the mount has drained everything (unmount)."""
    assert sha256_nbd(srv.uri) == before
    assert os.stat(m.file).st_size == EXPORT
    assert hashlib.sha256(m.file.read_bytes()).hexdigest() == before
    assert m.unmount() == 0
    assert sha256_nbd(srv.uri) == before, "changed at the unmount"


def zero_sha(n=EXPORT):
    return hashlib.sha256(bytes(n)).hexdigest()


# --------------------------------------------------- refused: no change

def test_qemu_img_convert_of_an_oversize_qcow2_leaves_the_disk(dirty, shm):
    """The issue's case: qemu-img truncates its output to 0, then to the
    image's virtual size, which is larger than the export (EFBIG)."""
    srv, m, before = dirty
    img = shm / "big.qcow2"
    run(["qemu-img", "create", "-q", "-f", "qcow2", img, str(2 * EXPORT)],
        check=True)
    run(["qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 0 4M", img],
        check=True)
    r = run(["qemu-img", "convert", "-f", "qcow2", "-O", "raw", img, m.file])
    assert r.returncode != 0, r.stdout
    assert "File too large" in r.stderr or "too large" in r.stderr.lower(), \
        r.stderr
    assert f"truncate to {2 * EXPORT} bytes refused" in m.stderr
    assert_unchanged(srv, m, before)
    assert LEFT in m.stderr, m.stderr


def trunc_then_too_big(path):
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        assert os.fstat(fd).st_size == 0       # the file says so at once
        assert oserror_errno(os.ftruncate, fd, 2 * EXPORT) == errno.EFBIG
    finally:
        os.close(fd)


def shrink_then_too_big(path):
    fd = os.open(path, os.O_RDWR)
    try:
        os.ftruncate(fd, 0)
        assert oserror_errno(os.ftruncate, fd, 2 * EXPORT) == errno.EFBIG
    finally:
        os.close(fd)


def trunc_then_write_past_end(path):
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        assert oserror_errno(os.pwrite, fd, b"x" * 4096,
                             EXPORT) == errno.ENOSPC
    finally:
        os.close(fd)


@pytest.mark.parametrize("how", ["O_TRUNC+EFBIG", "ftruncate0+EFBIG",
                                 "O_TRUNC+ENOSPC"])
def test_truncating_open_then_refused_leaves_the_disk(dirty, how):
    srv, m, before = dirty
    {"O_TRUNC+EFBIG": trunc_then_too_big,
     "ftruncate0+EFBIG": shrink_then_too_big,
     "O_TRUNC+ENOSPC": trunc_then_write_past_end}[how](m.file)
    assert_unchanged(srv, m, before)
    assert LEFT in m.stderr, m.stderr


def test_dd_seek_past_the_export_leaves_the_disk(dirty, shm):
    """dd seek= without conv=notrunc truncates the output to the seek."""
    srv, m, before = dirty
    src = shm / "src.raw"
    src.write_bytes(random_bytes(MiB))
    r = run(["dd", f"if={src}", f"of={m.file}", "bs=1M", "seek=40",
             "status=none"])
    assert r.returncode != 0 and "truncate" in r.stderr, r.stderr
    assert_unchanged(srv, m, before)


def test_status_and_digest_of_the_last_copy_survive_a_refused_truncate(
        dirty, shm):
    srv, m, _ = dirty
    src = shm / "good.raw"
    data = random_bytes(8 * MiB)
    src.write_bytes(data)
    assert run(["cp", src, m.file]).returncode == 0
    wait_for(lambda: status(m)["digest"]["state"] == "complete",
             what="digest complete")
    want = status(m)["digest"]["value"]
    before = sha256_nbd(srv.uri)
    trunc_then_too_big(m.file)
    assert os.stat(m.file).st_size == len(data)
    st = status(m)["digest"]
    assert st["state"] == "complete" and st["value"] == want, st
    assert sha256_nbd(srv.uri) == before
    assert m.file.read_bytes() == data


# -------------------------------------------- carried out: every byte zero

def test_empty_redirection_zeroes_the_whole_export(dirty):
    """`: > MNT/nbd`: O_TRUNC and a clean close are a copy of nothing."""
    srv, m, _ = dirty
    r = run(["sh", "-c", f": > '{m.file}'"])
    assert r.returncode == 0, r.stderr
    assert os.stat(m.file).st_size == 0
    assert sha256_nbd(srv.uri) == zero_sha()      # sent at the close
    assert LEFT not in m.stderr
    assert m.unmount() == 0
    assert sha256_nbd(srv.uri) == zero_sha()


def test_fsync_after_o_trunc_zeroes_the_disk(dirty):
    srv, m, _ = dirty
    fd = os.open(m.file, os.O_WRONLY | os.O_TRUNC)
    try:
        os.fsync(fd)
        assert sha256_nbd(srv.uri) == zero_sha()
    finally:
        os.close(fd)
    assert sha256_nbd(srv.uri) == zero_sha()
    assert os.stat(m.file).st_size == 0


def manifest_holds_data(srv, m):
    """Write 4 MiB and fsync: the mount's manifest (warm migration) holds
    data, so the deferred truncate's manifest rules apply."""
    data = random_bytes(4 * MiB)
    fd = os.open(m.file, os.O_WRONLY)
    try:
        os.pwrite(fd, data, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    mf = status(m)["manifest"]
    assert mf and mf["data_blocks"] > 0, mf
    return data


def test_shrink_after_writes_zeroes_at_the_close_with_a_manifest(dirty):
    """rsync --inplace: writes, then ftruncate to the source's size, then
    a close.  With a manifest that holds data, the close must still send
    the zeroing of what lies past the size (it once stayed pending until
    the unmount: the server held the old bytes while the copy had ended
    with success)."""
    srv, m, _ = dirty
    data = random_bytes(6 * MiB)
    fd = os.open(m.file, os.O_WRONLY)
    try:
        os.pwrite(fd, data, 0)
        os.fsync(fd)              # as the pool's flusher does in a long copy
        mf = status(m)["manifest"]
        assert mf and mf["data_blocks"] > 0, mf
        os.ftruncate(fd, 5 * MiB + 123)
    finally:
        os.close(fd)
    # Read from the server first: a read through the mount could send
    # what was pending.
    assert_content(data[:5 * MiB + 123], EXPORT, uri=srv.uri)
    assert status(m)["pending_zero_bytes"] == 0
    assert_content(data[:5 * MiB + 123], EXPORT, mount_file=m.file,
                   uri=srv.uri, mount_size=5 * MiB + 123)


def test_o_trunc_with_nothing_written_is_sent_at_the_release(dirty):
    """With a manifest that holds data, a close with nothing written keeps
    an O_TRUNC deferred (dd closes its first descriptor at once); the
    release carries it out, and sends it: the disk reads zero on the
    server without waiting for anybody's next close."""
    srv, m, _ = dirty
    manifest_holds_data(srv, m)
    fd = os.open(m.file, os.O_WRONLY | os.O_TRUNC)
    os.close(fd)
    wait_for(lambda: status(m)["pending_zero_bytes"] == 0
             and os.stat(m.file).st_size == 0, m.proc,
             "the release's zeroing sent", 30)
    assert sha256_nbd(srv.uri) == zero_sha()


def test_cp_sparse_of_a_smaller_image_over_a_dirty_disk(dirty, shm):
    srv, m, _ = dirty
    src = shm / "sparse.img"
    make_sparse_image(src, 12 * MiB + 4096,
                      [(MiB, 2 * MiB), (7 * MiB, 64 * 1024),
                       (12 * MiB, 4096)], seed=7)
    r = run(["cp", "--sparse=always", src, m.file])
    assert r.returncode == 0, r.stderr
    assert_content(src, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=12 * MiB + 4096)


def test_write_after_o_trunc_reads_zero_before_and_after_it(dirty):
    srv, m, _ = dirty
    data = random_bytes(MiB)
    fd = os.open(m.file, os.O_RDWR | os.O_TRUNC)
    try:
        assert os.pread(fd, 4096, 0) == b""          # old bytes hidden
        assert os.pwrite(fd, data, 3 * MiB) == MiB
        assert os.pread(fd, 4 * MiB, 0) == bytes(3 * MiB) + data
        os.ftruncate(fd, 8 * MiB)                     # grows: zeros
        assert os.pread(fd, 8 * MiB, 0) == \
            bytes(3 * MiB) + data + bytes(4 * MiB)
    finally:
        os.close(fd)
    assert_content(bytes(3 * MiB) + data, EXPORT, mount_file=m.file,
                   uri=srv.uri, mount_size=8 * MiB)


def test_truncate_that_grows_after_o_trunc_reads_zero(dirty):
    srv, m, _ = dirty
    fd = os.open(m.file, os.O_RDWR | os.O_TRUNC)
    try:
        os.ftruncate(fd, 4 * MiB)
        assert os.pread(fd, 4 * MiB, 0) == bytes(4 * MiB)
    finally:
        os.close(fd)
    assert sha256_nbd(srv.uri) == zero_sha()


# ------------------------------------------------------------- the views

@pytest.mark.parametrize("view", ["nbd.vhd", "nbd.vmdk", "nbd.qcow2"])
def test_o_trunc_of_a_view_changes_nothing(dirty, view):
    srv, m, before = dirty
    fd = os.open(m.mp / view, os.O_WRONLY | os.O_TRUNC)
    os.close(fd)
    assert_unchanged(srv, m, before)
