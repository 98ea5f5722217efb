"""The inline digest with --blkhash: blkhash of the raw file, in any write order.

With `--blkhash[=DIGEST[/SIZE]]` the status's digest is the blkhash of the
file (what blksum, nbdcopy --blkhash and nbdferry-verify --blkhash print
for the source), computed from the writes as they come: cp, dd, rsync
--inplace, qemu-img convert -W (several writers out of order), a truncate
then writes anywhere, punched holes.  Each value is checked against the
reference implementation in test_blkhash.py; when the daemon cannot know
the file's content (part of a block rewritten after it was hashed, bytes
the pass never wrote) the status says so and shows no value.  Every case
checks the bytes that landed, through the mount and on the server."""

import os
import random
import shutil
import subprocess
import sys

import pytest

from lib.content import assert_content
from lib.env import HAVE_FUSE, HAVE_NBDKIT, MiB, daemon_cmd
from lib.images import make_sparse_image, random_bytes, random_file
from lib.nbd import fill_random
from lib.procs import punch_hole, run
from test_blkhash import DIGESTS, blkhash as reference, tail_shapes, \
    write_shape
from test_digest_inline import settled_digest

pytestmark = pytest.mark.skipif(not (HAVE_FUSE and HAVE_NBDKIT),
                                reason="needs /dev/fuse and nbdkit")

EXPORT = 64 * MiB
KiB = 1 << 10


@pytest.fixture
def target(server, mount):
    """Factory: a 64 MiB memory export full of random bytes (so a byte the
    copy did not write shows), mounted with the given options."""
    def make(*opts, size=EXPORT):
        srv = server("memory", f"size={size}")
        srv.old = fill_random(srv.uri, size)
        return srv, mount(srv, *opts)
    return make


def assert_blkhash(m, content, alg="sha256", block=64 * KiB):
    d = settled_digest(m)
    assert d["algorithm"] == f"blkhash/{alg}/{block}", d
    assert d["state"] == "complete", d
    assert d["covered"] == len(content) == d["size"], d
    assert d["value"] == reference(content, alg, block), d


@pytest.mark.parametrize("spec,alg,block", [
    ("", "sha256", 64 * KiB),
    ("=md5/4k", "md5", 4 * KiB),
    ("=sha512/1M", "sha512", MiB),
    ("=sha1/3000", "sha1", 3000),
], ids=["default", "md5-4k", "sha512-1M", "sha1-3000"])
def test_blkhash_cp_sparse_always(target, shm, spec, alg, block):
    srv, m = target(f"--blkhash{spec}")
    img = make_sparse_image(shm / "src.img", 40 * MiB + 12345, runs=12,
                            seed=block)
    run(["cp", "--sparse=always", img.path, m.file], check=True)
    content = img.path.read_bytes()
    assert_blkhash(m, content, alg, block)
    assert_content(img.path, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=img.size, what="cp --sparse=always")


def test_blkhash_equals_nbdferry_verify(target, shm):
    """The value a user compares with: nbdferry-verify --blkhash SOURCE."""
    from test_verify import VERIFY
    srv, m = target("--blkhash")
    img = make_sparse_image(shm / "src.img", 30 * MiB, runs=[(0, MiB),
                            (10 * MiB + 3, 123457)], seed=1)
    run(["dd", f"if={img.path}", f"of={m.file}", "bs=1M", "conv=sparse",
         "status=none"], check=True)
    r = run([str(VERIFY), "--blkhash", img.path], check=True)
    assert settled_digest(m)["value"] == r.stdout.split()[0]
    assert_blkhash(m, img.path.read_bytes())
    assert_content(img.path, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=img.size, what="dd conv=sparse")


def test_blkhash_rsync_inplace_without_truncate(target, shm):
    """rsync --inplace writes over the old disk from 0 and truncates at the
    end: no O_TRUNC, yet every byte of the file is known."""
    if not shutil.which("rsync"):
        pytest.fail("rsync is needed (scripts/install-deps)")
    srv, m = target("--blkhash")
    src = random_file(shm / "src.img", 21 * MiB + 777)
    run(["rsync", "--inplace", str(src), str(m.file)], check=True)
    assert_blkhash(m, src.read_bytes())
    assert_content(src, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=os.path.getsize(src), what="rsync --inplace")


def test_blkhash_qemu_img_convert_parallel(target, shm):
    """qemu-img convert -n -W: eight coroutines write out of order, holes
    of the source become zeroing requests over the old data."""
    if not shutil.which("qemu-img"):
        pytest.fail("qemu-img is needed (scripts/install-deps)")
    srv, m = target("--blkhash", "--pool-size", "16M")
    img = make_sparse_image(shm / "src.img", EXPORT, runs=20, seed=7)
    r = run(["qemu-img", "convert", "-n", "-W", "-m", "8", "-f", "raw",
             "-O", "raw", img.path, m.file])
    assert r.returncode == 0, r.stderr
    assert_blkhash(m, img.path.read_bytes())
    assert_content(img.path, EXPORT, mount_file=m.file, uri=srv.uri,
                   what="qemu-img convert -W")


def test_blkhash_truncate_then_writes_in_any_order(target):
    """O_TRUNC, then unaligned pieces in random order from one descriptor,
    and halfway a hole punched where no piece goes (what qemu-img does
    with a source's holes): the value is the final content's."""
    srv, m = target("--blkhash=sha256/64k")
    rng = random.Random(5)
    size = 9 * MiB + 4321
    hole = (MiB + 99, MiB + 99 + 300 * KiB)
    content = bytearray(rng.randbytes(size))
    content[hole[0]:hole[1]] = bytes(hole[1] - hole[0])
    cuts = sorted(set(rng.sample(range(1, size), 300)) | set(hole))
    pieces = [(a, b) for a, b in zip([0] + cuts, cuts + [size])
              if b <= hole[0] or a >= hole[1]]
    rng.shuffle(pieces)
    fd = os.open(m.file, os.O_WRONLY | os.O_TRUNC)
    try:
        for i, (a, b) in enumerate(pieces):
            assert os.pwrite(fd, content[a:b], a) == b - a
            if i == len(pieces) // 2:
                punch_hole(fd, hole[0], hole[1] - hole[0])
    finally:
        os.close(fd)
    assert_blkhash(m, bytes(content))
    assert_content(bytes(content), EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=size, what="shuffled pwrite")


@pytest.mark.parametrize("spec", [
    "", "=md5/1", "=sha3-256/511", "=blake2s256/4K", "=sha384/4k",
    "=sha512-256/1m", "=sha1/64M"])
def test_blkhash_tail_shapes(target, shm, spec):
    """The last block's shapes (short, all zero; test_blkhash.tail_shapes)
    written as data and left as holes by cp --sparse=always, one pass
    each: the inline value is the reference's, for digests and each form
    of block size (the verifier's tests take every digest)."""
    alg, _, size = spec.lstrip("=").partition("/")
    alg = alg or "sha256"
    block = {"": 64 * KiB, "1": 1, "511": 511, "4K": 4 * KiB,
             "4k": 4 * KiB, "1m": MiB, "64M": 64 * MiB}[size]
    srv, m = target(f"--blkhash{spec}", size=4 * MiB)
    for name, data in tail_shapes(block, seed=block + len(alg)).items():
        src = shm / name
        write_shape(src, data, sparse=True)
        with open(m.file, "wb") as f:         # O_TRUNC: zeros written
            f.write(data)
        d = settled_digest(m)
        assert d["value"] == reference(data, DIGESTS[alg], block), \
            (name, "written", d)
        run(["cp", "--sparse=always", src, m.file], check=True)
        d = settled_digest(m)
        assert d["algorithm"] == f"blkhash/{alg}/{block}", d
        assert d["state"] == "complete" and d["size"] == len(data), d
        assert d["value"] == reference(data, DIGESTS[alg], block), \
            (name, "cp --sparse=always", d)
        assert_content(data, 4 * MiB, mount_file=m.file, uri=srv.uri,
                       mount_size=len(data), what=name)


def test_blkhash_second_pass_and_empty_file(target, shm):
    """Each O_TRUNC starts a new pass; an empty file has the empty value."""
    srv, m = target("--blkhash")
    a = random_file(shm / "a.img", 5 * MiB + 1)
    run(["cp", a, m.file], check=True)
    assert_blkhash(m, a.read_bytes())
    os.close(os.open(m.file, os.O_WRONLY | os.O_TRUNC))
    assert_blkhash(m, b"")
    assert_content(b"", EXPORT, mount_file=m.file, uri=srv.uri, mount_size=0)


def test_blkhash_part_of_hashed_block_rewritten(target):
    """A whole block is hashed and its bytes let go; rewriting 10 bytes of
    it: the daemon reads the block back from the disk and the value
    follows the rewrite."""
    srv, m = target("--blkhash")
    data = bytearray(random_bytes(4 * MiB))
    with open(m.file, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
        f.seek(MiB + 100)
        f.write(b"x" * 10)
    data[MiB + 100:MiB + 110] = b"x" * 10
    assert_blkhash(m, bytes(data))
    assert_content(bytes(data), EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=len(data), what="rewrite")


def test_blkhash_old_data_left_is_incomplete(target):
    """No O_TRUNC and a prefix written: the rest of the file is older data."""
    srv, m = target("--blkhash")
    data = random_bytes(3 * MiB)
    fd = os.open(m.file, os.O_WRONLY)
    try:
        os.pwrite(fd, data, 0)
    finally:
        os.close(fd)
    d = settled_digest(m)
    assert d["state"] == "incomplete" and "value" not in d, d
    assert f"bytes from {len(data)}" in d["reason"], d
    expected = data + srv.old[len(data):]
    assert_content(expected, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=EXPORT, what="prefix")


@pytest.mark.parametrize("opts,why", [
    (["--blkhash=nosuchdigest"], "no such digest"),
    (["--blkhash=sha256/0"], "bad block size"),
    (["--blkhash=shake128"], "variable length"),
    (["--blkhash", "--no-digest"], "name different digests"),
], ids=["unknown", "size-0", "xof", "no-digest"])
def test_blkhash_bad_option_refused(tmp_path, opts, why):
    """Refused on the command line, before anything is mounted."""
    mp = tmp_path / "mnt"
    mp.mkdir()
    r = run(daemon_cmd(*opts, mp, "nbd+unix:///?socket=/nonexistent"))
    assert r.returncode == 1 and "--blkhash" in r.stderr, r.stderr
    assert why in r.stderr, r.stderr
    assert not os.path.ismount(mp)


def test_blkhash_two_writers_and_a_reader(target):
    """After a truncate, two processes write the two halves at once, each
    in its own order, while a third reads the file: the last close gives
    the value of the whole; the reader's closes change nothing."""
    srv, m = target("--blkhash=sha256/128k", "-o", "multiwriter")
    size = 24 * MiB + 1000
    content = random_bytes(size)
    os.truncate(m.file, 0)
    os.truncate(m.file, size)
    script = ("import os, random, sys\n"
              "f, a, b, seed = sys.argv[1], *map(int, sys.argv[2:5])\n"
              "data = open(sys.argv[5], 'rb').read()\n"
              "offs = list(range(a, b, 300000))\n"
              "random.Random(seed).shuffle(offs)\n"
              "fd = os.open(f, os.O_WRONLY)\n"
              "for o in offs:\n"
              "    n = min(300000, b - o)\n"
              "    os.pwrite(fd, data[o:o + n], o)\n"
              "os.close(fd)\n")
    src = m.mp.parent / "src.bin"
    src.write_bytes(content)
    half = size // 2
    writers = [subprocess.Popen([sys.executable, "-c", script, str(m.file),
                                 str(a), str(b), str(a), str(src)])
               for a, b in ((0, half), (half, size))]
    reads = 0
    while any(w.poll() is None for w in writers):
        with open(m.file, "rb") as f:
            while f.read(MiB):
                pass
        reads += 1
    assert all(w.wait() == 0 for w in writers)
    assert reads > 0
    assert_blkhash(m, content, "sha256", 128 * KiB)
    assert_content(content, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=size, what="two writers")
