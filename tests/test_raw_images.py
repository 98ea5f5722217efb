"""An image file copied into the raw file is refused before the disk
changes, unless the mount takes image files as raw bytes (--raw-images).

`cp disk.qcow2 MNT/nbd` (or an OVA, a VHDX, a dynamic VHD, a VMDK, a
gzip/xz/zstd file) would replace the disk with the container's bytes.  The
write of the image's first sector is refused with EMEDIUMTYPE before it is
queued, every later write of that handle too, and the log and the status
name the view to use with the real mountpoint and --raw-images.  Each case
starts from an export of random bytes (a dirty disk) and checks, on the
server, that it is byte-identical afterwards:

- a non-truncating writer (python open r+b, dd conv=notrunc): the first
  write fails with EMEDIUMTYPE, so does a later one at another offset;
- `cp IMAGE MNT/nbd`: cp fails naming the medium type error; the disk is
  byte-identical too (cp's O_TRUNC open must not zero it before the
  refused write: this holds once the truncate is deferred to the first
  write, fs/rawfile.c);
- with --raw-images the same cp lands the image's bytes exactly;
- a raw disk that begins with an MBR is a disk, written as usual.

Run: /usr/bin/python3 -m pytest tests/test_raw_images.py
"""

import errno
import gzip
import hashlib
import json
import lzma
import os
import tarfile

import pytest

from lib.env import MiB
from lib.images import random_bytes
from lib.nbd import fill_random, read_nbd, sha256_nbd
from lib.procs import run
from lib.vhd import qemu_img

EXPORT = 32 * MiB
MEDIUM = os.strerror(errno.EMEDIUMTYPE)          # "Wrong medium type"

# kind: (what the log calls it, the advice after the mountpoint)
KINDS = {
    "qcow2": ("a qcow2 image", "write it into {mp}/nbd.qcow2"),
    "vhdx": ("a VHDX image", "write it into {mp}/nbd.vhdx"),
    "vhd-dynamic": ("a VHD image", "write it into {mp}/nbd.vhd"),
    "vmdk-sparse": ("a VMDK image", "write it into {mp}/nbd.vmdk"),
    "vmdk-stream": ("a VMDK image", "write it into {mp}/nbd.vmdk"),
    "ova": ("a tar archive (an OVA?)",
            "tar -xOf FILE.ova DISK.vmdk > {mp}/nbd.vmdk"),
    "gzip": ("a gzip stream",
             "decompress it on the way: gunzip -c FILE.gz > {mp}/nbd"),
    "xz": ("an xz stream",
           "decompress it on the way: xz -dc FILE.xz > {mp}/nbd"),
    "zstd": ("a zstd stream",
             "decompress it on the way: zstd -dc FILE.zst > {mp}/nbd"),
}


def make_image(shm, kind):
    """A small image file of kind, from 2 MiB of random bytes."""
    raw = shm / "disk.raw"
    if not raw.exists():
        raw.write_bytes(random_bytes(2 * MiB))
    out = shm / f"disk.{kind}"
    if out.exists():
        return out
    qemu = {"qcow2": ("qcow2",), "vhdx": ("vhdx",),
            "vhd-dynamic": ("vpc", "-o", "subformat=dynamic"),
            "vmdk-sparse": ("vmdk", "-o", "subformat=monolithicSparse"),
            "vmdk-stream": ("vmdk", "-o", "subformat=streamOptimized")}
    if kind in qemu:
        fmt, *opts = qemu[kind]
        qemu_img("convert", "-f", "raw", "-O", fmt, *opts, raw, out)
    elif kind == "ova":
        with tarfile.open(out, "w", format=tarfile.USTAR_FORMAT) as t:
            t.add(make_image(shm, "vmdk-stream"), arcname="disk1.vmdk")
    elif kind == "gzip":
        out.write_bytes(gzip.compress(raw.read_bytes()))
    elif kind == "xz":
        out.write_bytes(lzma.compress(raw.read_bytes()))
    elif kind == "zstd":
        run(["zstd", "-q", "-o", out, raw], check=True)
    return out


def status(m):
    return json.loads((m.mp / ".nbdferry-status").read_bytes())


def messages(st):
    return [f["message"] for f in st["failures"] if "time" in f]


@pytest.fixture
def victim(server, mount):
    """A 32 MiB export of random bytes, mounted; (server, mount, sha)."""
    def make(*opts):
        srv = server("memory", f"size={EXPORT}")
        fill_random(srv.uri, EXPORT)
        m = mount(srv, *opts, expect_errors=True)
        return srv, m, sha256_nbd(srv.uri)
    return make


def assert_refusal_said(m, kind, count=1):
    """The log and the status name the kind, the view under the real
    mountpoint and --raw-images."""
    name, advice = KINDS[kind]
    advice = advice.format(mp=m.mp)
    said = f"{m.mp}/nbd: it is {name}: {advice}"
    lines = [l for l in m.stderr.splitlines() if said in l]
    assert len(lines) == count, m.stderr
    assert all("error: " in l and "--raw-images to store image files as "
               "raw bytes" in l and "EMEDIUMTYPE" in l for l in lines), lines
    st = status(m)
    assert st["errors"] == count
    assert any(said in s for s in messages(st)), messages(st)


@pytest.mark.parametrize("kind", KINDS)
def test_image_into_raw_file_refused_at_its_first_sector(victim, shm, kind):
    """Without O_TRUNC: the disk is byte-identical whatever the truncate
    does.  The handle refuses every later write too."""
    srv, m, before = victim()
    data = make_image(shm, kind).read_bytes()
    with open(m.file, "r+b", buffering=0) as f:
        with pytest.raises(OSError) as e:
            f.write(data[:MiB])
        assert e.value.errno == errno.EMEDIUMTYPE
        f.seek(MiB)                              # the rest of the copy
        with pytest.raises(OSError) as e:
            f.write(random_bytes(MiB))
        assert e.value.errno == errno.EMEDIUMTYPE
    assert sha256_nbd(srv.uri) == before
    r = run(["dd", f"if={shm / f'disk.{kind}'}", f"of={m.file}", "bs=1M",
             "conv=notrunc", "status=none"])
    assert r.returncode != 0 and MEDIUM in r.stderr, r.stderr
    assert sha256_nbd(srv.uri) == before
    assert_refusal_said(m, kind, count=2)


@pytest.mark.parametrize("kind", ["qcow2", "vhdx", "vhd-dynamic",
                                  "vmdk-sparse", "vmdk-stream", "ova",
                                  "gzip"])
def test_cp_image_into_raw_file_fails_disk_untouched(victim, shm, kind):
    """cp opens with O_TRUNC: it fails with the medium type error and the
    disk is byte-identical (needs the truncate deferred to the first
    write as well as the refusal)."""
    srv, m, before = victim()
    img = make_image(shm, kind)
    r = run(["cp", img, m.file])
    assert r.returncode != 0 and MEDIUM in r.stderr, r.stderr
    assert_refusal_said(m, kind)
    assert sha256_nbd(srv.uri) == before


def test_raw_images_lands_image_bytes(victim, shm):
    """--raw-images: each image file is stored as its bytes, the tail of
    the disk zero (cp truncated), a warning naming what it is."""
    srv, m, _ = victim("--raw-images")
    for kind in KINDS:
        data = make_image(shm, kind).read_bytes()
        r = run(["cp", shm / f"disk.{kind}", m.file])
        assert r.returncode == 0, r.stderr
        assert sha256_nbd(srv.uri, len(data)) == \
            hashlib.sha256(data).hexdigest(), kind
        assert read_nbd(srv.uri, EXPORT - MiB, MiB) == bytes(MiB)
    assert "written as asked, but it is a qcow2 image" in m.stderr
    assert " error: " not in m.stderr, m.stderr


def test_raw_disk_with_mbr_is_written(victim, shm):
    """A raw disk is not an image file: one that begins with a boot
    sector (an MBR's 55 aa) is written as asked, without a word."""
    srv, m, _ = victim()
    disk = bytearray(random_bytes(4 * MiB))
    disk[0:3] = b"\xeb\x63\x90"                  # a boot loader's jump
    disk[510:512] = b"\x55\xaa"
    (shm / "mbr.raw").write_bytes(disk)
    r = run(["cp", shm / "mbr.raw", m.file])
    assert r.returncode == 0, r.stderr
    assert read_nbd(srv.uri, 0, len(disk)) == bytes(disk)
    assert "EMEDIUMTYPE" not in m.stderr and "written as asked" \
        not in m.stderr
