"""nbdferry-verify decodes qcow2 images, as SOURCE and as DESTINATION.

Images made by qemu-img and qemu-io: version 2 (compat=0.10) and 3,
compressed clusters (zlib and zstd), 512-byte clusters (hundreds of L2
tables), extended L2 entries with
subclusters partly zero and partly unallocated (a backing file showing
through), zero clusters (`write -z`), and a backing chain of three
levels.  For each, the digest `nbdferry-verify IMAGE` prints equals that
of `qemu-img convert -O raw IMAGE` (blkhash and sha256, with and without
extents); the image compared with an nbdkit export holding that raw disk
matches, either way round; compared with an export where one byte
differs it is a mismatch (exit 1) naming the block holding that byte.
Damaged images (cut short, the L1 table past the end, cluster_bits 8
and 22, a backing chain that loops, a backing file missing or of
another format) are an error, exit 2, naming the rule.  (The inline
digest of a qcow2 landed through nbd.qcow2 equal to `nbdferry-verify
IMAGE`: tests/test_verify_views.py.)

Run: /usr/bin/python3 -m pytest tests/test_verify_qcow2.py
"""

import random
import shutil
import struct

import pytest

from lib.env import MiB
from lib.procs import run
from test_verify import VERIFY

for tool in ("qemu-img", "qemu-io", "nbdkit"):
    if not shutil.which(tool):
        raise RuntimeError(f"{tool} missing (scripts/install-deps)")

DISK = 12 * MiB


def make_disk(path, size=DISK, seed=44):
    """Data in scattered runs (some unaligned, one compressible), zeros
    between."""
    rnd = random.Random(seed)
    data = bytearray(size)
    for off, n in ((0, 300000), (2 * MiB + 4095, 70001), (5 * MiB, 2 * MiB),
                   (9 * MiB + 12345, 777777), (size - MiB, MiB)):
        data[off:off + n] = rnd.randbytes(n)
    data[8 * MiB:8 * MiB + 200000] = b"\x5a" * 200000
    path.write_bytes(bytes(data))
    return path


def qemu_img(*args):
    r = run(["qemu-img", *map(str, args)])
    assert r.returncode == 0, (args, r.stderr)


def qemu_io(img, *cmds):
    args = ["qemu-io", "-f", "qcow2"]
    for c in cmds:
        args += ["-c", c]
    r = run(args + [str(img)])
    assert r.returncode == 0 and "error" not in r.stdout.lower(), (cmds, r)


def verify(*args, rc=0):
    r = run([str(VERIFY), *map(str, args)])
    assert r.returncode == rc, (args, r.stdout, r.stderr)
    return r


def value(*args):
    return verify(*args).stdout.split()[0]


def convert(raw, img, *opts):
    qemu_img("convert", "-q", "-f", "raw", "-O", "qcow2", *opts, raw, img)
    return img


def extl2(d, raw):
    """Extended L2 entries over a base: a few KiB written into clusters
    (the rest of each cluster unallocated: the base shows through), zero
    subclusters, a discard, data past the base's end."""
    base = convert(raw, d / "extl2-base.qcow2")
    img = d / "extl2.qcow2"
    qemu_img("create", "-q", "-f", "qcow2", "-b", base.name, "-F", "qcow2",
             "-o", "extended_l2=on", img, DISK + 2 * MiB)
    qemu_io(img, "write -P 0x11 100k 3k", "write -z 2M 40k",
            "write -P 0x22 5M 2k", "write -z 5200k 8k", "discard 9M 64k",
            f"write -P 0x33 {DISK + MiB} 5k")
    return img


def zero(d, raw):
    """Zero clusters over data (v3 write -z, with and without unmap) and
    a compressed cluster among them."""
    img = convert(raw, d / "zero.qcow2")
    qemu_io(img, "write -z 0 128k", "write -z -u 5M 1M",
            "write -c -P 0x44 3M 64k")
    return img


def chain(d, raw):
    """Three levels: a compressed base, a version 2 middle, a top with
    zero clusters, each overlay larger than what it is based on."""
    base = convert(raw, d / "chain-base.qcow2", "-c")
    mid = d / "chain-mid.qcow2"
    qemu_img("create", "-q", "-f", "qcow2", "-b", base.name, "-F", "qcow2",
             "-o", "compat=0.10", mid, DISK + MiB)
    qemu_io(mid, "write -P 0x55 1M 100k", f"write -P 0x66 {DISK} 64k")
    top = d / "chain.qcow2"
    qemu_img("create", "-q", "-f", "qcow2", "-b", mid.name, "-F", "qcow2",
             top, DISK + 2 * MiB)
    qemu_io(top, "write -z 1M 64k", "write -P 0x77 6M 4k",
            f"write -P 0x88 {DISK + MiB + 4096} 4k")
    return top


MAKERS = {
    "v2": lambda d, raw: convert(raw, d / "v2.qcow2", "-o", "compat=0.10"),
    "v3": lambda d, raw: convert(raw, d / "v3.qcow2", "-o", "compat=1.1"),
    "zlib": lambda d, raw: convert(raw, d / "zlib.qcow2", "-c"),
    "zstd": lambda d, raw: convert(raw, d / "zstd.qcow2", "-c", "-o",
                                   "compression_type=zstd"),
    # 512-byte clusters: an L2 table per 32 KiB of disk, so reads and
    # extents cross hundreds of tables (the source keeps one).
    "c512": lambda d, raw: convert(raw, d / "c512.qcow2", "-o",
                                   "cluster_size=512"),
    "extl2": extl2,
    "zero": zero,
    "chain": chain,
}


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """name -> (image, qemu-img's raw of it)."""
    d = tmp_path_factory.mktemp("qcow2")
    raw = make_disk(d / "disk.raw")
    out = {}
    for name, make in MAKERS.items():
        img = make(d, raw)
        want = d / f"{name}.raw"
        qemu_img("convert", "-q", "-O", "raw", img, want)
        out[name] = (img, want)
    return out


@pytest.mark.parametrize("name", list(MAKERS))
def test_digest_equals_qemu_raw(images, name):
    img, raw = images[name]
    for opts in ([], ["--digest=sha256"], ["--no-extents"],
                 ["--blkhash=sha256/4K"]):
        assert value(*opts, img) == value(*opts, raw), (name, opts)
    r = verify("--format=qcow2", img)
    assert r.stdout == f"{value(raw)}  {img}\n"


@pytest.mark.parametrize("name", list(MAKERS))
def test_compare_with_export(server, images, shm, name):
    img, raw = images[name]
    srv = server("file", raw, extra=("-r",))
    r = verify(img, srv.uri)
    assert "result       MATCH" in r.stdout, r.stdout
    assert f"{img} (qcow2, {raw.stat().st_size} bytes)" in r.stdout
    verify(srv.uri, img)
    # One byte changed on the export: a mismatch naming its block.
    data = bytearray(raw.read_bytes())
    at = 9 * MiB + 20000 if name != "extl2" else 5 * MiB + 100
    data[at] ^= 0x01
    bad = shm / "bad.raw"
    bad.write_bytes(bytes(data))
    other = server("file", bad, extra=("-r",))
    for args in ((img, other.uri), (other.uri, img)):
        r = verify("--block-size=4K", *args, rc=1)
        assert "result       MISMATCH" in r.stdout, r.stdout
        assert f"differ       offset {at - at % 4096} length 4096" in \
            r.stdout, r.stdout


# ---------------------------------------------------------------- damage

def one_error(r):
    assert r.stdout == "", r.stdout
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


def patched(src, dst, at, fmt, v):
    b = bytearray(src.read_bytes())
    struct.pack_into(fmt, b, at, v)
    dst.write_bytes(bytes(b))
    return dst


def test_damaged_images_are_errors(images, shm):
    img, _ = images["v3"]
    cut = shm / "cut.qcow2"
    cut.write_bytes(img.read_bytes()[:400000])
    msg = one_error(verify(cut, rc=2))
    assert f"{cut}: " in msg and "past the end of the file" in msg, msg
    far = patched(img, shm / "l1.qcow2", 40, ">Q", 1 << 30)
    msg = one_error(verify(far, rc=2))
    assert "the L1 table at byte 1073741824" in msg, msg
    assert "past the end of the file" in msg, msg
    for bits in (8, 22, 30):
        bad = patched(img, shm / f"cb{bits}.qcow2", 20, ">I", bits)
        msg = one_error(verify(bad, rc=2))
        assert f"cluster_bits {bits} (must be 9..21" in msg, msg
    # As DESTINATION too.
    msg = one_error(verify(images["v3"][1], far, rc=2))
    assert "the L1 table at byte" in msg, msg


def test_backing_chain_errors(shm):
    a, b = shm / "a.qcow2", shm / "b.qcow2"
    qemu_img("create", "-q", "-f", "qcow2", b, "1M")
    qemu_img("create", "-q", "-f", "qcow2", "-b", b.name, "-F", "qcow2", a,
             "1M")
    zeros = shm / "zeros.raw"
    zeros.write_bytes(bytes(MiB))
    assert value(a) == value(zeros)
    qemu_img("rebase", "-u", "-b", a.name, "-F", "qcow2", b)
    msg = one_error(verify(a, rc=2))
    assert "the backing chain loops" in msg and str(b) in msg, msg
    qemu_img("rebase", "-u", "-b", a.name, "-F", "qcow2", a)
    msg = one_error(verify(a, rc=2))
    assert "the backing chain loops" in msg, msg
    qemu_img("rebase", "-u", "-b", "missing.qcow2", "-F", "qcow2", a)
    msg = one_error(verify(a, rc=2))
    assert "backing file" in msg and "missing.qcow2" in msg, msg
    assert "No such file" in msg, msg
    vmdk = shm / "v.vmdk"
    qemu_img("create", "-q", "-f", "vmdk", vmdk, "1M")
    qemu_img("rebase", "-u", "-b", vmdk.name, "-F", "vmdk", a)
    msg = one_error(verify(a, rc=2))
    assert "of format vmdk: only qcow2 and raw backing files" in msg, msg
    qemu_img("rebase", "-u", "-b", "nbd://localhost/x", "-F", "raw", a)
    msg = one_error(verify(a, rc=2))
    assert "is not a local file" in msg, msg


def test_deep_chain_is_refused(shm):
    """More levels than the chain cap (32): refused, not followed."""
    prev = None
    for i in range(34):
        img = shm / f"l{i}.qcow2"
        args = ["-b", prev.name, "-F", "qcow2"] if prev else []
        qemu_img("create", "-q", "-f", "qcow2", *args, img, "1M")
        prev = img
    msg = one_error(verify(prev, rc=2))
    assert "deeper than 32 levels" in msg, msg


def test_raw_backing_file(shm):
    """A raw backing file (-F raw), shorter than its overlay: past its end
    the disk reads as zero."""
    raw = make_disk(shm / "base.raw", size=3 * MiB, seed=5)
    top = shm / "top.qcow2"
    qemu_img("create", "-q", "-f", "qcow2", "-b", raw.name, "-F", "raw",
             top, 5 * MiB)
    qemu_io(top, "write -P 0x99 1M 64k", "write -P 0x98 4M 4k")
    want = shm / "want.raw"
    qemu_img("convert", "-q", "-O", "raw", top, want)
    assert value(top) == value(want)
    verify(top, want)
