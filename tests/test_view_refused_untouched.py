"""A refused image leaves the disk byte for byte as it was, in every view.

The promise: nothing changes the disk until what is being written is
known to be valid and to replace it.  A format's table (qcow2 L2 table,
VHD BAT, VMDK grain table, VHDX BAT) whose entries hold a good entry (a
zero cluster or grain, a data block) ahead of a damaged one must be
refused whole, before the view's begin() replaces the disk: a zero entry
applied while the table is parsed used to zero the disk, and then the
next entry was refused (the qcow2 view did; cp saw the error over a
wiped disk).

Each case: a 16 MiB export, random bytes landed through the mount (a
dirty disk: cp of a random file into MNT/nbd, checked on the server),
then an image made by qemu-img/qemu-io and damaged here (a good entry
first, a bad one after; for qcow2 also an overlay, whose zero clusters
are zeros written over the disk) copied with cp into MNT/nbd.<fmt>.  cp must fail,
the daemon must log the rule for that view, and the export must read the
same (sha256 on the server and through the mount), its size unchanged.

Run: /usr/bin/python3 -m pytest tests/test_view_refused_untouched.py
"""

import os
import struct

import pytest

from lib.digest import sha256_file
from lib.env import MiB
from lib.images import random_bytes
from lib.nbd import sha256_nbd
from lib.vhd import copy_into, qemu_img, qemu_io

EXPORT = 16 * MiB
QMASK = 0x00FFFFFFFFFFFE00
COPIED = 1 << 63
# 2DC27766-F623-4200-9D64-115E9BFD4A08, as VHDX stores it.
VHDX_BAT_GUID = bytes([0x66, 0x77, 0xC2, 0x2D, 0x23, 0xF6, 0x00, 0x42,
                       0x9D, 0x64, 0x11, 0x5E, 0x9B, 0xFD, 0x4A, 0x08])


def be64(b, off):
    return struct.unpack_from(">Q", b, off)[0]


# ---- qcow2: L2 entry 0 a zero cluster, entry 1 damaged ---------------------

def qcow2_zero_first(d, overlay=False):
    p = d / "zd.qcow2"
    if overlay:                   # its zero clusters are zeros written
        qemu_img("create", "-f", "qcow2", d / "base.qcow2", "4M")
        qemu_img("create", "-f", "qcow2", "-b", "base.qcow2", "-F", "qcow2",
                 p)
    else:
        qemu_img("create", "-f", "qcow2", p, "4M")
    qemu_io(p, "write -z 0 64k", "write -P 0x5a 64k 64k",
            "write -P 0x6b 1M 64k", fmt="qcow2")
    b = bytearray(p.read_bytes())
    l1 = be64(b, 40)
    l2 = be64(b, l1) & QMASK
    assert be64(b, l2) == 1, "entry 0 is not a zero cluster"
    e1 = be64(b, l2 + 8)
    assert e1 & QMASK and not e1 & 1, "entry 1 is not a data cluster"
    return b, l1, l2, e1


def qcow2_refcount_0(d):
    b, _, _, e1 = qcow2_zero_first(d)
    rb = be64(b, be64(b, 48))                       # refcount block 0
    i = rb + ((e1 & QMASK) >> 16) * 2               # 16-bit refcounts
    b[i:i + 2] = bytes(2)
    return bytes(b)


def qcow2_into_l1(d):
    b, l1, l2, _ = qcow2_zero_first(d)
    struct.pack_into(">Q", b, l2 + 8, COPIED | l1)
    return bytes(b)


def qcow2_unaligned(d, overlay=False):
    b, _, l2, e1 = qcow2_zero_first(d, overlay)
    struct.pack_into(">Q", b, l2 + 8, e1 + 512)
    return bytes(b)


def qcow2_overlay_unaligned(d):
    return qcow2_unaligned(d, overlay=True)


# ---- VHD: BAT entry 0 a data block, entry 1 inside the BAT ------------------

def vhd_bat_in_metadata(d):
    raw = d / "src.raw"
    raw.write_bytes(random_bytes(4 * MiB))
    p = d / "d.vhd"
    qemu_img("convert", "-f", "raw", "-O", "vpc", "-o", "subformat=dynamic",
             raw, p)
    b = bytearray(p.read_bytes())
    hdr = be64(b, 16)                               # footer copy: data offset
    bat = be64(b, hdr + 16)                         # header: table offset
    assert struct.unpack_from(">I", b, bat)[0] != 0xFFFFFFFF
    struct.pack_into(">I", b, bat + 4, bat // 512)  # block 1 on the BAT
    return bytes(b)


# ---- VMDK: GTE 0 a zero grain, GTE 16 inside the overhead --------------------

def vmdk_gte_in_overhead(d):
    p = d / "zg.vmdk"
    qemu_img("create", "-f", "vmdk", "-o", "zeroed_grain=on", p, "4M")
    qemu_io(p, "write -z 0 64k", "write -P 0x5a 64k 64k",
            "write -P 0x6b 1M 64k", fmt="vmdk")
    b = bytearray(p.read_bytes())
    gd = struct.unpack_from("<Q", b, 0x38)[0]
    gt0 = struct.unpack_from("<I", b, gd * 512)[0]
    assert struct.unpack_from("<I", b, gt0 * 512)[0] == 1, "no zero grain"
    assert struct.unpack_from("<I", b, gt0 * 512 + 64)[0] > 1
    struct.pack_into("<I", b, gt0 * 512 + 64, 3)    # grain 16 at sector 3
    return bytes(b)


# ---- VHDX: BAT entry 0 a data block, entry 1 on the BAT -----------------------

def vhdx_bat_on_bat(d):
    raw = d / "src.raw"
    raw.write_bytes(random_bytes(4 * MiB))
    p = d / "d.vhdx"
    qemu_img("convert", "-f", "raw", "-O", "vhdx", "-o", "block_size=1M",
             raw, p)
    b = bytearray(p.read_bytes())
    rt = 192 * 1024
    n = struct.unpack_from("<I", b, rt + 8)[0]
    bat = next(struct.unpack_from("<Q", b, rt + 16 + 32 * i + 16)[0]
               for i in range(n)
               if b[rt + 16 + 32 * i:rt + 32 + 32 * i] == VHDX_BAT_GUID)
    assert struct.unpack_from("<Q", b, bat)[0] & 7 == 6, "block 0 not present"
    struct.pack_into("<Q", b, bat + 8, bat | 6)     # block 1 on the BAT
    return bytes(b)


CASES = {
    # name: (view, image maker, what the daemon's log line says)
    "qcow2-zero-then-refcount-0": ("qcow2", qcow2_refcount_0, "refcount is 0"),
    "qcow2-zero-then-into-l1": ("qcow2", qcow2_into_l1, "claimed twice"),
    "qcow2-zero-then-unaligned": ("qcow2", qcow2_unaligned,
                                  "not cluster-aligned"),
    "qcow2-overlay-zero-then-unaligned": ("qcow2", qcow2_overlay_unaligned,
                                          "not cluster-aligned"),
    "vhd-block-then-bat-in-metadata": ("vhd", vhd_bat_in_metadata,
                                       "clobbers"),
    "vmdk-zero-grain-then-overhead": ("vmdk", vmdk_gte_in_overhead,
                                      "inside the overhead"),
    "vhdx-block-then-bat-on-bat": ("vhdx", vhdx_bat_on_bat,
                                   "overlaps the BAT"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_refused_image_leaves_disk_untouched(server, mount, shm, case):
    view, make, needle = CASES[case]
    srv = server("memory", f"size={EXPORT}")
    m = mount(srv, expect_errors=True)
    dirty = shm / "dirty.raw"
    dirty.write_bytes(random_bytes(EXPORT))
    r = copy_into("cp", dirty, m.file)
    assert r.returncode == 0, r.stderr
    before = sha256_file(dirty)
    assert sha256_nbd(srv.uri) == before, "the dirty disk did not land"

    img = shm / f"bad.{view}"
    img.write_bytes(make(shm))
    r = copy_into("cp", img, m.mp / f"nbd.{view}")
    assert r.returncode != 0, f"cp of {case} into nbd.{view} succeeded"

    assert sha256_nbd(srv.uri) == before, f"{case}: the disk changed (server)"
    assert os.stat(m.file).st_size == EXPORT
    assert sha256_file(m.file) == before, f"{case}: the disk changed (mount)"
    errs = [ln for ln in m.stderr.splitlines() if f"nbd.{view}:" in ln]
    assert errs and needle in errs[0], m.stderr
