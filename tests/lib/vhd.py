"""Helpers for the nbd.vhd view tests (test_vhd_view.py), on top of the
fixtures in conftest.py.

- ``SHA``, ``VIRTUAL``, ``fixture()``: the VHD fixtures made by tools no one
  here wrote (tests/fixtures/vhd/README.md), decompressed and checked.
- ``COPY_TOOLS``: the ways a user writes a VHD into MNT/nbd.vhd (cp, cp
  --sparse=always, dd bs=1M, dd conv=sparse bs=64K, cat).
- ``VhdFile`` / ``apply_vhd()``: a small independent VHD reader in Python
  (footer, header, BAT, bitmaps; no code shared with vhd/), the oracle for
  what a differencing VHD does to a disk that already holds data.
- footer/header checksums and mutators for malformed files.
- ``qemu_img``/``qemu_io``/``vpc_spec``: qemu-img interop (qemu derives the
  size of most VHDs from CHS unless force_size_calc=current_size).
- ``vhd_tool()``: the inspector, build/tools/nbdferry-vhd.
"""

import json
import shutil
import struct
import subprocess
from pathlib import Path

from lib.digest import sha256_file
from lib.env import BUILD, MiB, TESTS
from lib.procs import run

FIXTURES = TESTS / "fixtures" / "vhd"
VHD_TOOL = BUILD / "tools" / "nbdferry-vhd"
HAVE_QEMU = bool(shutil.which("qemu-img") and shutil.which("qemu-io"))
SECTOR = 512

# From tests/fixtures/vhd/README.md.
SHA = {
    "qemu-dyn-10m.raw": "9ee0e52708d59b1a9b24edeef15e05bdb672eefca5d8282530ac7828d96d0558",
    "tap-diff-64m.raw": "5078c01df7148d118cd10b25b2e686eb05f336b684ebc84a4dc18df35a709c14",
    "tap-dyn-64m.raw": "fde1cce37ce5c6cc62462a9647f5b0ab8351afb97f46614020f304efca20700e",
    "tap-fixed-8m.raw": "136994e4eb8fe10f014ecdde33b3d85b8b09c21dda2d072f433bce9fc6e5c687",
    "vhdtool-raw-100m3s.raw": "e7869e441d63678750ce6e55f9a0a5af2d1564f4891f861cff4f92e0b8932f9e",
    "qemu-dyn-10m.vhd": "a0fadc5f7c2f2863d318e72d79bc24411b387040930aaa01a7efde8a378b8a7d",
    "tap-diff-64m.vhd": "c9ed9451647a8d4dfc1df4561051308f69f6912c41190bed3f02eef591405815",
    "tap-dyn-64m.vhd": "5e4ddc69cb49b8b4407fd7dd124ca7c88a7fa0d0c947a34a40b9f7827190dc37",
    "tap-fixed-8m.vhd": "c249e8b3d265fc05269e96be1b77a1f66ec83988d1f88e0b2b9aad0ae8aa107f",
    "vhdtool-delta-64m.vhd": "d4287537163d84d6dfd404cf0857f072db2f6a7f9037f1bc465556b85f8351db",
    "vhdtool-raw-100m3s.vhd": "e59c87323cf9bf4aada7c1805c9e39bcb77be10f4ac37f6c6ed9f03bfca59d7f",
}

# Virtual disk sizes (README), i.e. the raw images' lengths.
VIRTUAL = {
    "tap-dyn-64m": 67108864,
    "tap-diff-64m": 67108864,
    "vhdtool-delta-64m": 67108864,
    "vhdtool-raw-100m3s": 106954752,
    "tap-fixed-8m": 8388608,
    "qemu-dyn-10m": 10514432,
}


def fixture(name, dest_dir):
    """Decompress tests/fixtures/vhd/NAME.xz into dest_dir (sparse enough:
    these are small); check it against the README's sha256."""
    out = Path(dest_dir) / name
    if not out.exists():
        with open(out, "wb") as f:
            subprocess.run(["xz", "-dc", str(FIXTURES / f"{name}.xz")],
                           stdout=f, check=True)
    got = sha256_file(out)
    assert got == SHA[name], f"fixture {name} corrupt: {got}"
    return out


# ------------------------------------------------------------- copy tools

def _sh(cmd):
    return ["sh", "-c", cmd]


def _q(p):
    return "'" + str(p).replace("'", "'\\''") + "'"


# name -> argv builder (src, dst).  Every one opens dst with O_TRUNC.
COPY_TOOLS = {
    "cp": lambda s, d: ["cp", s, d],
    "cp-sparse-always": lambda s, d: ["cp", "--sparse=always", s, d],
    "dd-1M": lambda s, d: ["dd", f"if={s}", f"of={d}", "bs=1M", "status=none"],
    "dd-sparse-64K": lambda s, d: ["dd", f"if={s}", f"of={d}", "bs=64K",
                                   "conv=sparse", "status=none"],
    "cat": lambda s, d: _sh(f"cat {_q(s)} > {_q(d)}"),
}


def copy_into(tool, src, dst, secs=120):
    """Run one copy tool; return the CompletedProcess (not checked)."""
    return run(COPY_TOOLS[tool](src, dst), timeout=secs)


# ------------------------------------------------- an independent VHD reader

def footer_checksum(b):
    b = bytearray(b[:512])
    b[64:68] = bytes(4)
    return (~sum(b)) & 0xFFFFFFFF


def header_checksum(b):
    b = bytearray(b[:1024])
    b[36:40] = bytes(4)
    return (~sum(b)) & 0xFFFFFFFF


class VhdFile:
    """The bare minimum of a VHD, read the way the spec says (for a test
    oracle, not for validation): footer at the end, dynamic header at the
    footer's data offset, BAT, and per block a sector bitmap (MSB first)."""

    def __init__(self, data):
        self.data = data = bytes(data)
        foot = data[-512:]
        assert foot[:8] == b"conectix", "not a VHD footer"
        (self.data_offset,) = struct.unpack_from(">Q", foot, 16)
        (self.size,) = struct.unpack_from(">Q", foot, 48)
        (self.disk_type,) = struct.unpack_from(">I", foot, 60)
        self.creator = foot[28:32]
        if self.disk_type == 2:
            return
        hdr = data[self.data_offset:self.data_offset + 1024]
        assert hdr[:8] == b"cxsparse"
        (self.table_offset,) = struct.unpack_from(">Q", hdr, 16)
        self.max_entries, self.block_size = struct.unpack_from(">II", hdr, 28)
        n = -(-self.size // self.block_size)
        self.bat = struct.unpack_from(f">{n}I", data, self.table_offset)
        spb = self.block_size // SECTOR
        self.bitmap_bytes = -(-(-(-spb // 8)) // SECTOR) * SECTOR

    def sectors(self):
        """Yield (virtual byte offset, 512 bytes) for every sector the
        bitmaps mark (fixed: every sector)."""
        if self.disk_type == 2:
            for off in range(0, self.size, SECTOR):
                yield off, self.data[off:off + SECTOR]
            return
        spb = self.block_size // SECTOR
        for blk, ent in enumerate(self.bat):
            if ent == 0xFFFFFFFF:
                continue
            base = ent * SECTOR
            bm = self.data[base:base + self.bitmap_bytes]
            for i in range(spb):
                voff = blk * self.block_size + i * SECTOR
                if voff >= self.size:
                    break
                if bm[i // 8] & (0x80 >> (i % 8)):
                    p = base + self.bitmap_bytes + i * SECTOR
                    yield voff, self.data[p:p + SECTOR]

    def allocated_blocks(self):
        return [i for i, e in enumerate(self.bat) if e != 0xFFFFFFFF]


def apply_vhd(vhd_path, disk):
    """What nbd.vhd promises: a fixed/dynamic VHD replaces the disk (zeros
    where it carries nothing), a differencing one is applied over it.
    disk: bytearray, modified in place and returned; marked sectors (set
    bits) as a set of virtual offsets in .marked."""
    v = VhdFile(Path(vhd_path).read_bytes())
    if v.disk_type != 4:
        disk[:] = bytes(len(disk))
    marked = set()
    for off, sec in v.sectors():
        disk[off:off + len(sec)] = sec
        marked.add(off)
    return disk, marked


def mutate_footers(data, fn, copy=True, trailing=True):
    """Apply fn to the footer copy and/or the trailing footer (bytearrays)
    and fix their checksums."""
    starts = ([0] if copy else []) + ([len(data) - 512] if trailing else [])
    for start in starts:
        f = bytearray(data[start:start + 512])
        fn(f)
        struct.pack_into(">I", f, 64, footer_checksum(f))
        data[start:start + 512] = f


def mutate_header(data, fn):
    (doff,) = struct.unpack_from(">Q", data, 16)
    h = bytearray(data[doff:doff + 1024])
    fn(h)
    struct.pack_into(">I", h, 36, header_checksum(h))
    data[doff:doff + 1024] = h


def bat_entry_offset(data, i):
    (doff,) = struct.unpack_from(">Q", data, 16)
    (table,) = struct.unpack_from(">Q", data, doff + 16)
    return table + 4 * i


# --------------------------------------------------------------- qemu-img

def qemu_img(*args, check=True):
    r = run(["qemu-img", *map(str, args)], timeout=300)
    if check:
        assert r.returncode == 0, f"qemu-img {args}: {r.stderr}"
    return r


def qemu_io(img, *cmds, fmt="vpc"):
    args = ["qemu-io", "-f", fmt]
    for c in cmds:
        args += ["-c", c]
    r = run(args + [str(img)], timeout=300)
    assert r.returncode == 0, f"qemu-io {cmds}: {r.stderr}"


def vpc_spec(path, force_current=True):
    """A qemu json: filename for a VPC file; with force_size_calc=
    current_size qemu uses the footer's current size instead of the size
    it derives from CHS geometry for most creators (not for ours, "win ")."""
    spec = {"driver": "vpc", "file": {"driver": "file", "filename": str(path)}}
    if force_current:
        spec["force_size_calc"] = "current_size"
    return "json:" + json.dumps(spec)


def qemu_size(spec):
    r = qemu_img("info", "--output=json", spec)
    return json.loads(r.stdout)["virtual-size"]


# --------------------------------------------------------------- inspector

def vhd_tool(*args, expect=0):
    r = run([VHD_TOOL, *args], timeout=300)
    assert r.returncode == expect, (
        f"nbdferry-vhd {args}: exit {r.returncode}, want {expect}\n"
        f"{r.stdout[-2000:]}\n{r.stderr}")
    return r


def vhd_tool_info(path):
    fields = {}
    for line in vhd_tool("info", path).stdout.splitlines():
        k, _, v = line.partition(":")
        fields.setdefault(k.strip(), v.strip())
    return fields


def vhd_tool_map(path):
    """Allocated blocks as listed by `nbdferry-vhd map`."""
    lines = vhd_tool("map", path).stdout.splitlines()[1:]
    return [int(l.split()[0]) for l in lines if l.strip()]


# -------------------------------------------------------------- byte checks

def nonzero_blocks(data, block=2 * MiB):
    """Indices of the block-sized pieces of data holding a non-zero byte."""
    zero = bytes(block)
    return [i for i in range(-(-len(data) // block))
            if data[i * block:(i + 1) * block] != zero[:len(data[i * block:(i + 1) * block])]]


__all__ = [n for n in dir() if not n.startswith("_")]
