"""The default digest, with no options: blkhash, equal to `nbdferry-verify
SOURCE` run with no options.

A mount given no digest option hashes the copy with blkhash (sha256 of 64
KiB blocks, as blksum and nbdcopy --blkhash compute it), whatever the
writer: cp --sparse=always, dd conv=sparse, rsync --inplace over an old
disk, qemu-img convert -n -W (several writers out of order, holes as
zeroing over old data), a rewrite of part of the file, punched holes and
zeroed ranges.  The status names the digest and says how to check it;
the value is compared with what nbdferry-verify prints for the source
with no options at all.  `--digest=sha256` (and `-o digest=sha256`) is
sha256sum's value, `--digest=none` no digest, and two options that name
different digests are refused.  Every case checks the bytes that landed,
through the mount and on the server."""

import os
import shutil

import pytest

from lib.content import assert_content
from lib.digest import blkhash_file, sha256_file
from lib.env import HAVE_FUSE, HAVE_NBDKIT, MiB, daemon_cmd
from lib.images import make_sparse_image, random_bytes, random_file
from lib.nbd import fill_random
from lib.procs import run
from test_digest_inline import settled_digest
from test_verify import VERIFY

pytestmark = pytest.mark.skipif(not (HAVE_FUSE and HAVE_NBDKIT),
                                reason="needs /dev/fuse and nbdkit")

EXPORT = 64 * MiB
DEFAULT = "blkhash/sha256/65536"


@pytest.fixture
def target(server, mount):
    """Factory: a 64 MiB export full of random bytes (a byte the copy did
    not write would show), mounted with opts (none: the defaults)."""
    def make(*opts):
        srv = server("memory", f"size={EXPORT}")
        fill_random(srv.uri, EXPORT)
        return srv, mount(srv, *opts)
    return make


def verify_digest(path):
    """nbdferry-verify SOURCE, no options: the value a user compares."""
    r = run([str(VERIFY), str(path)], check=True)
    return r.stdout.split()[0]


def assert_default_digest(m, src):
    d = settled_digest(m)
    assert d["algorithm"] == DEFAULT, d
    assert "nbdferry-verify SOURCE" in d["check"], d
    assert d["state"] == "complete", d.get("reason", d)
    want = verify_digest(src)
    assert want == blkhash_file(src)          # the reference agrees
    assert d["value"] == want, d


def test_default_cp_sparse_always(target, shm):
    srv, m = target()
    img = make_sparse_image(shm / "src.img", 40 * MiB + 12345, runs=12,
                            seed=3)
    run(["cp", "--sparse=always", img.path, m.file], check=True)
    assert_default_digest(m, img.path)
    assert_content(img.path, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=img.size, what="cp --sparse=always")


@pytest.mark.parametrize("hasher", ["lanes", "openssl"])
def test_default_digest_either_hasher(target, shm, monkeypatch, hasher):
    """The daemon and nbdferry-verify hash blkhash's blocks two at a time
    with the SHA instructions (digest/sha256x.c), or one at a time with
    OpenSSL when NBDFERRY_SHA256=openssl: the value is the same, and
    equal to an independent reference (Python's hashlib), for a file
    whose size is no multiple of the block (a short last block), with
    holes, and with an odd count of whole blocks in a write."""
    if hasher == "openssl":
        monkeypatch.setenv("NBDFERRY_SHA256", "openssl")
    srv, m = target()
    img = make_sparse_image(shm / "src.img", 23 * MiB + 65536 * 3 + 777,
                            runs=7, seed=11)
    run(["cp", "--sparse=always", img.path, m.file], check=True)
    assert_default_digest(m, img.path)
    assert_content(img.path, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=img.size, what=f"cp, {hasher}")


def test_default_dd_conv_sparse(target, shm):
    srv, m = target()
    img = make_sparse_image(shm / "src.img", 30 * MiB,
                            runs=[(0, MiB), (10 * MiB + 3, 123457)], seed=1)
    run(["dd", f"if={img.path}", f"of={m.file}", "bs=1M", "conv=sparse",
         "status=none"], check=True)
    assert_default_digest(m, img.path)
    assert_content(img.path, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=img.size, what="dd conv=sparse")


def test_default_rsync_inplace_over_old_disk(target, shm):
    """rsync --inplace writes over the old data without O_TRUNC; a second
    run with the delta algorithm rewrites only parts of blocks already
    hashed (read back from the disk to follow them)."""
    if not shutil.which("rsync"):
        pytest.fail("rsync is needed (scripts/install-deps)")
    srv, m = target()
    src = random_file(shm / "src.img", 21 * MiB + 777)
    run(["rsync", "--inplace", str(src), str(m.file)], check=True)
    assert_default_digest(m, src)
    with open(src, "r+b") as f:               # change a few places
        for off in (0, 5 * MiB + 100, 20 * MiB + 12345):
            f.seek(off)
            f.write(random_bytes(7000))
    run(["rsync", "--inplace", "--no-whole-file", "-I", str(src),
         str(m.file)], check=True)
    assert_default_digest(m, src)
    assert_content(src, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=os.path.getsize(src), what="rsync --inplace")


def test_default_qemu_img_convert_parallel_with_holes(target, shm):
    """qemu-img convert -n -W: eight writers out of order; the source's
    holes become zeroing requests over the old random data."""
    if not shutil.which("qemu-img"):
        pytest.fail("qemu-img is needed (scripts/install-deps)")
    srv, m = target()
    img = make_sparse_image(shm / "src.img", EXPORT, runs=20, seed=7)
    r = run(["qemu-img", "convert", "-n", "-W", "-m", "8", "-f", "raw",
             "-O", "raw", img.path, m.file])
    assert r.returncode == 0, r.stderr
    assert_default_digest(m, img.path)
    assert_content(img.path, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=EXPORT, what="qemu-img convert -n -W")


def test_default_rewrites_punches_and_zeroes(target, shm):
    """cp, then rewrites in place (dd conv=notrunc: whole blocks, and 100
    bytes inside a block hashed long ago), a punched hole and a zeroed
    range, none on a block boundary: the value follows the file."""
    srv, m = target()
    src = random_file(shm / "src.img", 24 * MiB)
    run(["cp", str(src), m.file], check=True)
    patch = random_file(shm / "patch", 2 * MiB)
    run(["dd", f"if={patch}", f"of={m.file}", "bs=64k", "seek=48",
         "conv=notrunc", "status=none"], check=True)
    run(["dd", f"if={patch}", f"of={src}", "bs=64k", "seek=48",
         "conv=notrunc", "status=none"], check=True)
    for path in (m.file, src):
        with open(path, "r+b") as f:
            f.seek(3 * MiB + 777)
            f.write(b"r" * 100)
    for how, off, n in (("--punch-hole", 8 * MiB + 4096, 3 * MiB),
                        ("--zero-range", 16 * MiB + 65536 + 512, MiB)):
        run(["fallocate", how, "-o", str(off), "-l", str(n), m.file],
            check=True)
        # the source's copy (tmpfs has no --zero-range: punch, same zeros)
        run(["fallocate", "--punch-hole", "-o", str(off), "-l", str(n),
             str(src)], check=True)
    with open(m.file, "r+b"):
        pass                                  # a close: the value now
    assert_default_digest(m, src)
    assert_content(src, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=24 * MiB, what="rewrites, punch, zero")


@pytest.mark.parametrize("opts", [["--digest=sha256"],
                                  ["-o", "digest=sha256"]],
                         ids=["option", "fuse-o"])
def test_digest_sha256_equals_sha256sum(target, shm, opts):
    srv, m = target(*opts)
    img = make_sparse_image(shm / "src.img", 12 * MiB + 5, runs=4, seed=2)
    run(["cp", "--sparse=always", img.path, m.file], check=True)
    d = settled_digest(m)
    assert d["algorithm"] == "sha256" and "sha256sum" in d["check"], d
    assert d["state"] == "complete" and d["value"] == sha256_file(img.path)
    r = run([str(VERIFY), "--digest=sha256", str(img.path)], check=True)
    assert r.stdout.split()[0] == d["value"]
    assert_content(img.path, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=img.size, what="cp, --digest=sha256")


@pytest.mark.parametrize("opts,algorithm", [
    (["--digest=none"], "none"),
    (["--no-digest"], "none"),
    (["--digest=blkhash/md5/4k"], "blkhash/md5/4096"),
    (["--blkhash=md5/4k"], "blkhash/md5/4096"),
    (["-o", "digest=blkhash"], DEFAULT),
], ids=["none", "no-digest", "blkhash-spec", "blkhash-alias", "fuse-o"])
def test_digest_option_forms(target, shm, opts, algorithm):
    srv, m = target(*opts)
    src = random_file(shm / "src.img", 3 * MiB + 1)
    run(["cp", str(src), m.file], check=True)
    d = settled_digest(m)
    assert d["algorithm"] == algorithm, d
    if algorithm == "none":
        assert d["state"] == "disabled" and "value" not in d, d
    else:
        spec = algorithm.split("/", 1)[1]
        r = run([str(VERIFY), f"--digest=blkhash/{spec}", str(src)],
                check=True)
        assert d["state"] == "complete", d
        assert d["value"] == r.stdout.split()[0], d
    assert_content(src, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=3 * MiB + 1, what=" ".join(opts))


@pytest.mark.parametrize("opts,why", [
    (["--digest=sha256", "--no-digest"], "name different digests"),
    (["--digest=none", "--blkhash"], "name different digests"),
    (["--digest=sha256", "-o", "digest=blkhash"], "name different digests"),
    (["--digest=sha512"], "not blkhash[/DIGEST[/SIZE]], sha256 or none"),
    (["--digest=blkhash/nosuchdigest"], "no such digest"),
    (["--digest=none", "--verify-readback"], "--digest=none"),
])
def test_digest_bad_options_refused(tmp_path, opts, why):
    mp = tmp_path / "mnt"
    mp.mkdir()
    r = run(daemon_cmd(*opts, mp, "nbd+unix:///?socket=/nonexistent"))
    assert r.returncode == 1 and why in r.stderr, r.stderr
    assert not os.path.ismount(mp)
