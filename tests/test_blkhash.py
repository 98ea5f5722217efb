"""nbdferry-verify --blkhash: block-based digests against a reference.

The reference below is the definition (blksum's, libblkhash's, nbdcopy
--blkhash's): DIGEST of each BLOCK-byte block, then DIGEST over those
digests in order and the length as a little-endian 64-bit integer.  It is
a few lines over hashlib, independent of digest/blkhash.c, which both the
tool and the mount's inline digest use (so comparing those two with each
other could not see a wrong construction).  The tool must agree with it on
random sparse images of odd lengths for every digest and block size tried,
on the shapes of the last block that the construction treats specially
(short, all zero, written or a hole; TAIL_SHAPES, also used by
test_digest_blkhash.py for the inline digest) for every fixed-size digest
and every form of block size the option takes, whatever the operand (file,
NBD URI, stdin as a file or a pipe, a VHD decoded to its virtual disk),
and agree with the published check values.  Helpers and the nbdkit fixture come from
test_verify.py.

Run: /usr/bin/python3 -m pytest tests/test_blkhash.py
"""

import hashlib
import json
import os
import random
import shutil
import subprocess

import pytest

from test_verify import (MiB, VERIFY, assert_one_error_line, kits,  # noqa: F401
                         vhd_fixture, verify)

KiB = 1 << 10


def blkhash(data, alg="sha256", block=64 * KiB):
    """The reference: D(D(block 0) || ... || D(block n-1) || le64(len))."""
    outer = hashlib.new(alg)
    for off in range(0, len(data), block):
        outer.update(hashlib.new(alg, data[off:off + block]).digest())
    outer.update(len(data).to_bytes(8, "little"))
    return outer.hexdigest()


# --blkhash=DIGEST: OpenSSL's name -> hashlib's, every fixed-size digest
# both always have (not the XOFs, which the option refuses).
DIGESTS = {"md5": "md5", "sha1": "sha1", "sha224": "sha224",
           "sha256": "sha256", "sha384": "sha384", "sha512": "sha512",
           "sha512-224": "sha512_224", "sha512-256": "sha512_256",
           "sha3-224": "sha3_224", "sha3-256": "sha3_256",
           "sha3-384": "sha3_384", "sha3-512": "sha3_512",
           "blake2b512": "blake2b", "blake2s256": "blake2s"}
# --blkhash=sha256/SIZE: every way of writing a size, smallest to largest.
BLOCK_FORMS = [("1", 1), ("511", 511), ("4k", 4 * KiB), ("4K", 4 * KiB),
               ("64k", 64 * KiB), ("1m", MiB), ("1M", MiB),
               ("64M", 64 * MiB)]


def tail_shapes(block, seed):
    """{name: bytes}: contents whose last block the construction treats
    specially, for this block size.  u is a block, or 64 KiB of one."""
    rng = random.Random(seed)
    u = min(block, 64 * KiB)
    return {
        "short-zero-tail": rng.randbytes(2 * u) + bytes(u // 3 + 1),
        "short-data-tail": rng.randbytes(2 * u + u // 3 + 1),
        "full-zero-tail": rng.randbytes(u) + bytes(u),
        "all-zero-odd": bytes(2 * u + 7),
        "one-byte": rng.randbytes(1),
    }


def write_shape(path, data, sparse):
    """data at path; with sparse, its zero runs of 4 KiB or more (and its
    zero tail) are holes, never written."""
    with open(path, "wb") as f:
        f.truncate(len(data))
        if not sparse:
            f.write(data)
            return
        for off in range(0, len(data), 4 * KiB):
            piece = data[off:off + 4 * KiB]
            if piece.count(0) != len(piece) or len(piece) < 4 * KiB:
                os.pwrite(f.fileno(), piece, off)


@pytest.fixture(autouse=True)
def tools_present():
    for t in ("nbdkit", "nbdcopy", "xz"):
        if not shutil.which(t):
            pytest.fail(f"{t} is needed")


def sparse_image(path, size, seed):
    """A sparse file: holes, random data runs (some with zero bytes or zero
    blocks inside), at unaligned offsets.  Returns its content."""
    rng = random.Random(seed)
    content = bytearray(size)
    with open(path, "wb") as f:
        f.truncate(size)
        for _ in range(12):
            off = rng.randrange(size)
            n = min(rng.randrange(1, 600 * KiB), size - off)
            run = bytearray(rng.randbytes(n))
            if rng.random() < 0.5:              # zeros written as data
                z = rng.randrange(n)
                zl = min(rng.randrange(1, 200 * KiB), n - z)
                run[z:z + zl] = bytes(zl)
            os.pwrite(f.fileno(), run, off)
            content[off:off + n] = run
    assert os.path.getsize(path) == size
    return bytes(content)


def one(*args, stdin=None):
    """The digest printed for one operand (exit 0, nothing on stderr)."""
    p = subprocess.run([str(VERIFY), *map(str, args)], capture_output=True,
                       stdin=stdin, timeout=120)
    assert p.returncode == 0 and p.stderr == b"", p.stderr
    hexd, name = p.stdout.decode().rstrip("\n").split("  ", 1)
    assert name == str(args[-1])
    return hexd


# ---------------------------------------------------------------- values

def test_blkhash_public_check_values(tmp_path):
    empty, hello = tmp_path / "empty", tmp_path / "hello"
    empty.write_bytes(b"")
    hello.write_bytes(b"hello")
    assert one("--blkhash", empty) == \
        "af5570f5a1810b7af78caf4bc70a660f0df51e42baf91d4de5b2328de0e83dfc"
    assert one("--blkhash", hello) == \
        "337355feb53a5309d5aba92796223c2c84ffab930e706c01fef573a2722545e6"
    assert one("--blkhash=sha256/64k", hello) == one("--blkhash=sha256", hello)
    assert one("--blkhash=md5/4", hello) == "8262896de34125dec173722c920e8bd0"
    # the reference agrees with the same values
    assert blkhash(b"") == one("--blkhash", empty)
    assert blkhash(b"hello", "md5", 4) == "8262896de34125dec173722c920e8bd0"


@pytest.mark.parametrize("alg", ["sha256", "md5", "sha1", "sha512"])
@pytest.mark.parametrize("spec_block", [("4k", 4 * KiB), ("", 64 * KiB),
                                        ("1M", MiB), ("12345", 12345)])
def test_blkhash_matches_reference_on_sparse_images(tmp_path, alg, spec_block):
    spec, block = spec_block
    opt = f"--blkhash={alg}/{spec}" if spec else f"--blkhash={alg}"
    for i, size in enumerate([3 * MiB + 4097, 2 * MiB, 12345 * 7 + 1, 1]):
        img = tmp_path / f"img{i}"
        data = sparse_image(img, size, seed=size + block + len(alg))
        want = blkhash(data, alg, block)
        assert one(opt, img) == want
        assert one(opt, "--threads=1", img) == want
        assert one(opt, "--no-extents", img) == want
    # and it is not the plain digest
    assert want != hashlib.new(alg, data).hexdigest()


def test_blkhash_all_zero_and_holes(tmp_path):
    img = tmp_path / "zero"
    with open(img, "wb") as f:
        f.truncate(64 * MiB + 3)                 # all hole, short last block
    assert one("--blkhash", img) == blkhash(bytes(64 * MiB + 3))
    with open(img, "r+b") as f:
        f.write(bytes(5 * MiB))                  # zeros written as data
    assert one("--blkhash=sha1/1M", img) == blkhash(bytes(64 * MiB + 3),
                                                    "sha1", MiB)


@pytest.mark.parametrize("digest", sorted(DIGESTS))
def test_blkhash_tail_shapes_every_digest(tmp_path, digest):
    """Short and all-zero last blocks, written or holes, for every digest:
    a short zero block is hashed at its length, and the length is in."""
    for name, data in tail_shapes(4 * KiB, seed=len(digest)).items():
        want = blkhash(data, DIGESTS[digest], 4 * KiB)
        for sparse in (False, True):
            img = tmp_path / f"{name}-{sparse}"
            write_shape(img, data, sparse)
            assert one(f"--blkhash={digest}/4k", img) == want, (name, sparse)
    # the digest of the default block size too (one operand is enough)
    data = tail_shapes(64 * KiB, seed=3)["short-zero-tail"]
    img = tmp_path / "default-block"
    write_shape(img, data, True)
    assert one(f"--blkhash={digest}", img) == blkhash(data, DIGESTS[digest])


@pytest.mark.parametrize("spec,block", BLOCK_FORMS,
                         ids=[f for f, _ in BLOCK_FORMS])
def test_blkhash_tail_shapes_every_block_form(tmp_path, spec, block):
    for name, data in tail_shapes(block, seed=block).items():
        want = blkhash(data, "sha256", block)
        for sparse in (False, True):
            img = tmp_path / f"{name}-{sparse}"
            write_shape(img, data, sparse)
            assert one(f"--blkhash=sha256/{spec}", img) == want, \
                (name, sparse)


def test_blkhash_tail_shapes_over_nbd(tmp_path, kits):
    """The NBD reader (block status: a hole at the end is never read)."""
    for name, data in tail_shapes(64 * KiB, seed=8).items():
        img = tmp_path / name
        write_shape(img, data, True)
        kit = kits.memory_with(img)
        assert one("--blkhash", kit.uri) == blkhash(data), name
        assert one("--blkhash=sha1/4k", kit.uri) == \
            blkhash(data, "sha1", 4 * KiB), name


# ---------------------------------------------------------------- operands

def test_blkhash_file_nbd_stdin_agree(tmp_path, kits):
    img = tmp_path / "img"
    data = sparse_image(img, 9 * MiB + 511, seed=5)
    kit = kits.memory_with(img)
    for opt, want in (("--blkhash", blkhash(data)),
                      ("--blkhash=sha512/256k", blkhash(data, "sha512", 256 * KiB)),
                      ("--blkhash=md5/4096", blkhash(data, "md5", 4096))):
        assert one(opt, img) == want
        assert one(opt, kit.uri) == want
        assert one(opt, "--no-extents", kit.uri) == want
        with open(img, "rb") as f:               # stdin is the file itself
            assert one(opt, "-", stdin=f) == want
        cat = subprocess.Popen(["cat", str(img)], stdout=subprocess.PIPE)
        assert one(opt, "-", stdin=cat.stdout) == want   # stdin is a pipe
        cat.stdout.close()
        assert cat.wait() == 0


def test_blkhash_pipe_with_size_hashes_a_prefix(tmp_path):
    img = tmp_path / "img"
    data = sparse_image(img, 3 * MiB, seed=9)
    cat = subprocess.Popen(["cat", str(img)], stdout=subprocess.PIPE)
    assert one("--blkhash", "--size=1000000", "-", stdin=cat.stdout) == \
        blkhash(data[:1000000])
    cat.stdout.close()
    cat.wait()
    with open(img, "rb") as f:                   # a pipe shorter than --size
        cat = subprocess.Popen(["cat"], stdin=f, stdout=subprocess.PIPE)
        p = subprocess.run([str(VERIFY), "--blkhash", "--size=4M", "-"],
                           stdin=cat.stdout, capture_output=True, text=True)
        cat.stdout.close()
        cat.wait()
    assert_one_error_line(p)


@pytest.mark.parametrize("name", ["tap-dyn-64m", "qemu-dyn-10m"])
def test_blkhash_vhd_source_is_its_virtual_disk(tmp_path, kits, name):
    vhd = vhd_fixture(f"{name}.vhd", tmp_path)
    raw = vhd_fixture(f"{name}.raw", tmp_path)
    want = blkhash(raw.read_bytes())
    assert one("--blkhash", vhd) == want
    assert one("--blkhash", raw) == want
    with open(vhd, "rb") as f:
        assert one("--blkhash", "-", stdin=f) == want
    # the container itself hashes differently
    assert one("--blkhash", "--raw", vhd) == blkhash(vhd.read_bytes())
    kit = kits.memory_with(raw)
    p = verify("--blkhash", "--json", vhd, kit.uri)
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["algorithm"] == "blkhash-sha256/64K"
    assert rep["source"]["digest"] == rep["destination"]["digest"] == want


# ---------------------------------------------------------------- compare

def test_blkhash_compare_names_the_differing_range(tmp_path, kits):
    img = tmp_path / "img"
    data = sparse_image(img, 16 * MiB + 77, seed=11)
    kit = kits.memory_with(img)
    p = verify("--blkhash=sha1/4k", "--json", img, kit.uri)
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["result"] == "match"
    assert rep["source"]["digest"] == blkhash(data, "sha1", 4096)
    # one byte changed on the destination
    off = 10 * MiB + 12345
    changed = bytearray(data)
    changed[off] ^= 0x5a
    dst = tmp_path / "dst"
    dst.write_bytes(changed)
    kit = kits.memory_with(dst)
    p = verify("--blkhash", "--json", "--block-size=64k", img, kit.uri)
    assert p.returncode == 1, p.stderr
    rep = json.loads(p.stdout)
    assert rep["destination"]["digest"] == blkhash(bytes(changed))
    assert [(r["offset"], r["length"]) for r in rep["mismatch_ranges"]] == \
        [(off // (64 * KiB) * 64 * KiB, 64 * KiB)]
    p = verify("--blkhash", img, kit.uri)         # text report
    assert p.returncode == 1 and "blkhash-sha256/64K" in p.stdout


# ---------------------------------------------------------------- options

@pytest.mark.parametrize("args", [
    ["--blkhash=nosuchdigest"], ["--blkhash=shake128"], ["--blkhash=sha256/0"],
    ["--blkhash=sha256/65M"], ["--blkhash=sha256/"], ["--blkhash=/64k"],
    ["--blkhash=sha256/4q"], ["--blkhash", "--digest=md5"],
    ["--blkhash", "--threads=0"],
])
def test_blkhash_bad_options_exit_2(tmp_path, args):
    f = tmp_path / "f"
    f.write_bytes(b"x")
    assert_one_error_line(verify(*args, f))


def test_blkhash_pipe_cannot_be_compared(tmp_path):
    f = tmp_path / "f"
    f.write_bytes(b"x")
    p = subprocess.run(f"echo x | {VERIFY} --blkhash - {f}", shell=True,
                       capture_output=True, text=True)
    assert "pipe" in assert_one_error_line(p)
