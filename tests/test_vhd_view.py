"""MOUNTPOINT/nbd.vhd: VHDs written into the mount land on the export, and
reading it exports the disk as a dynamic VHD.

Every landing starts from an export pre-filled with random bytes (so a
stale byte shows) and checks sha256 of the disk read through the mount AND
directly from the server against an independent source: the fixture
README's digests (VHDs made by blktap, vhd-tool and qemu-img), `qemu-img
convert -O raw` of VHDs that qemu-img/qemu-io make here, or a small Python
VHD reader (tests/lib/vhd.py) for differencing VHDs applied over random
data.  Exports are checked with qemu-img and the inspector, and written
back into another mount.  Malformed VHDs must leave the disk untouched
where the stream can tell before the first placement, and fail at close
where it cannot (documented in docs/vhd-view.md).

What every view promises (a qemu-img image lands; a damaged header is
refused with the disk untouched; a cut file fails at close; a disk larger
than the export is ENOSPC; a second writer is EBUSY; O_TRUNC alone
changes nothing; the export round trip; the inline digest; the progress)
is tested once for all of them in test_view_contract.py; this file keeps
the VHD view's own rules.

Run: /usr/bin/python3 -m pytest tests/test_vhd_view.py
(NBDFERRY_BUILD selects the build tree holding daemon/nbdferry and
tools/nbdferry-vhd.)
"""

import errno
import functools
import hashlib
import json
import os
import struct

import pytest

from lib.content import assert_content
from lib.digest import sha256_file
from lib.env import GiB, MiB
from lib.images import random_bytes
from lib.nbd import read_nbd, sha256_nbd, write_nbd
from lib.formats import assert_untouched, land as land_in, random_export
from lib.procs import oserror_errno, run
from lib.vhd import (COPY_TOOLS, HAVE_QEMU, SHA, VHD_TOOL, VIRTUAL, VhdFile,
                     apply_vhd, bat_entry_offset, copy_into, fixture,
                     mutate_footers, mutate_header,
                     nonzero_blocks, qemu_img, qemu_io, qemu_size, vhd_tool,
                     vhd_tool_info, vhd_tool_map, vpc_spec)

needs_qemu = pytest.mark.skipif(not HAVE_QEMU, reason="needs qemu-img, qemu-io")

if not VHD_TOOL.exists():
    if "NBDFERRY_BUILD" in os.environ:
        raise RuntimeError(f"{VHD_TOOL} not built")
    pytest.skip(f"{VHD_TOOL} not built", allow_module_level=True)


def fixed_opts(name):
    """Mount options a VHD named so needs: fixed VHDs only on request."""
    return ("--vhd-fixed",) if "fixed" in name else ()


def roundup(n, m):
    return -(-n // m) * m


land = functools.partial(land_in, view="nbd.vhd")


def vhd_errors(m):
    """The daemon's one-line failure reports about the VHD view."""
    return [l for l in m.stderr.splitlines() if "nbd.vhd:" in l]


def sectors_are(actual, allowed, what, limit=5):
    """Every 512-byte sector of actual equals the same sector of one of the
    byte strings in allowed (None in allowed: an all-zero sector)."""
    bad = []
    zero = bytes(512)
    for off in range(0, len(actual), 512):
        s = actual[off:off + 512]
        ok = any((s == zero[:len(s)]) if a is None else
                 (s == a[off:off + len(s)]) for a in allowed)
        if not ok:
            bad.append(off)
            if len(bad) >= limit:
                break
    assert not bad, f"{what}: unexpected bytes in sectors at {bad}"


# ---- 1. fixtures made by other tools, each copy tool ------------------------

STANDALONE = ["tap-dyn-64m", "tap-fixed-8m", "qemu-dyn-10m",
              "vhdtool-raw-100m3s"]


@pytest.mark.parametrize("tool", list(COPY_TOOLS))
@pytest.mark.parametrize("name", STANDALONE)
def test_fixture_lands(server, mount, shm, name, tool):
    """The decoded disk replaces random bytes; the rest of the export
    reads as zero (through the mount and on the server)."""
    vhd = fixture(f"{name}.vhd", shm)
    raw = fixture(f"{name}.raw", shm)
    virt = VIRTUAL[name]
    export = roundup(virt, MiB) + 3 * MiB + 512
    srv, _ = random_export(server, export)
    m = mount(srv, *fixed_opts(name))
    land(m, vhd, tool)
    # the raw file is the VHD's disk; the server holds it, then zeros
    assert_content(raw, export, mount_file=m.file, uri=srv.uri,
                   mount_size=virt, what=f"{name} via {tool}")
    assert sha256_file(m.file) == SHA[f"{name}.raw"]
    assert not vhd_errors(m), m.stderr


@pytest.mark.parametrize("name", STANDALONE)
def test_fixture_lands_on_exact_size_export(server, mount, shm, name):
    vhd = fixture(f"{name}.vhd", shm)
    raw = fixture(f"{name}.raw", shm)
    srv, _ = random_export(server, VIRTUAL[name])
    m = mount(srv, *fixed_opts(name))
    land(m, vhd, "cp-sparse-always")
    assert sha256_nbd(srv.uri) == SHA[f"{name}.raw"]
    assert_content(raw, VIRTUAL[name], mount_file=m.file, uri=srv.uri)


def test_second_vhd_replaces_first(server, mount, shm):
    """A dynamic VHD replaces what an earlier, larger one left."""
    srv, _ = random_export(server, 112 * MiB)
    m = mount(srv)
    land(m, fixture("vhdtool-raw-100m3s.vhd", shm), "cp")
    land(m, fixture("qemu-dyn-10m.vhd", shm), "dd-1M")
    assert_content(fixture("qemu-dyn-10m.raw", shm), 112 * MiB,
                   mount_file=m.file, uri=srv.uri,
                   mount_size=VIRTUAL["qemu-dyn-10m"])


def test_large_export_ingest(server, mount, shm):
    """Landing on a 3 TiB sparse export: the disk lands, far bytes are 0."""
    srv = server("memory", "size=3T")
    write_nbd(srv.uri, random_bytes(MiB), 2 * 1024 * GiB)
    write_nbd(srv.uri, random_bytes(MiB), 0)
    m = mount(srv, expect_errors=True)     # reading nbd.vhd is refused
    land(m, fixture("qemu-dyn-10m.vhd", shm), "cp")
    virt = VIRTUAL["qemu-dyn-10m"]
    assert sha256_nbd(srv.uri, virt) == SHA["qemu-dyn-10m.raw"]
    assert sha256_file(m.file) == SHA["qemu-dyn-10m.raw"]
    assert read_nbd(srv.uri, 2 * 1024 * GiB, MiB) == bytes(MiB)
    assert read_nbd(srv.uri, virt, MiB) == bytes(MiB)


# ---- 2. chains and deltas ----------------------------------------------------

@pytest.mark.parametrize("child,tool", [("tap-diff-64m", "cp"),
                                        ("vhdtool-delta-64m", "dd-sparse-64K"),
                                        ("tap-diff-64m", "cat")])
def test_chain_base_then_child(server, mount, shm, child, tool):
    base = fixture("tap-dyn-64m.vhd", shm)
    kid = fixture(f"{child}.vhd", shm)
    export = 66 * MiB
    srv, _ = random_export(server, export)
    m = mount(srv)
    land(m, base, "cp-sparse-always")
    assert sha256_nbd(srv.uri, 64 * MiB) == SHA["tap-dyn-64m.raw"]
    land(m, kid, tool)
    assert_content(fixture("tap-diff-64m.raw", shm), export,
                   mount_file=m.file, uri=srv.uri, mount_size=64 * MiB,
                   what=f"tap-dyn-64m then {child}")
    assert sha256_file(m.file) == SHA["tap-diff-64m.raw"]


@pytest.mark.parametrize("child", ["tap-diff-64m", "vhdtool-delta-64m"])
def test_diff_over_random_keeps_clear_sectors(server, mount, shm, child):
    """A differencing VHD changes only the sectors its bitmaps mark."""
    kid = fixture(f"{child}.vhd", shm)
    # the oracle first: over the parent's image it gives the README digest
    parent = bytearray(fixture("tap-dyn-64m.raw", shm).read_bytes())
    want, marked = apply_vhd(kid, parent)
    assert hashlib.sha256(want).hexdigest() == SHA["tap-diff-64m.raw"]

    export = 64 * MiB
    srv, old = random_export(server, export)
    m = mount(srv)
    land(m, kid, "cp")
    expected, marked = apply_vhd(kid, bytearray(old))
    assert_content(bytes(expected), export, mount_file=m.file, uri=srv.uri,
                   what=f"{child} over random")
    # spot checks: inside an allocated block, clear bits keep the random
    # bytes and set bits carry the child's sectors
    v = VhdFile(kid.read_bytes())
    child_raw = fixture("tap-diff-64m.raw", shm).read_bytes()
    got = read_nbd(srv.uri)
    kept = changed = 0
    for blk in v.allocated_blocks():
        for i in (0, 1, 7, 8, 9, 100, 4095):
            off = blk * v.block_size + i * 512
            sec = got[off:off + 512]
            if off in marked:
                assert sec == child_raw[off:off + 512], f"sector {off}"
                changed += 1
            else:
                assert sec == old[off:off + 512], f"sector {off} lost random"
                kept += 1
    assert changed
    if child == "tap-diff-64m":      # partial bitmaps (vhd-tool: all ones)
        assert kept
    # outside the allocated blocks, nothing moved
    first_free = next(b for b in range(32) if b not in v.allocated_blocks())
    o = first_free * v.block_size
    assert got[o:o + v.block_size] == old[o:o + v.block_size]


# ---- 3. VHDs made here with qemu-img / qemu-io -----------------------------

def qemu_reference(vhd, shm):
    """(raw bytes, current size, qemu's CHS size) of a VHD per qemu-img."""
    ref = shm / "qemu.raw"
    qemu_img("convert", "-O", "raw", vpc_spec(vhd), ref)
    cur = qemu_size(vpc_spec(vhd))
    chs = qemu_size(vpc_spec(vhd, force_current=False))
    assert os.path.getsize(ref) == cur
    plain = shm / "qemu-chs.raw"
    qemu_img("convert", "-f", "vpc", "-O", "raw", vhd, plain)
    pb, rb = plain.read_bytes(), ref.read_bytes()
    n = min(len(pb), len(rb))
    # qemu's two readings agree on the common part; either tail is zero
    assert pb[:n] == rb[:n] and not pb[n:].strip(b"\0")
    plain.unlink()
    return ref, cur, chs


QEMU_CASES = [
    # subformat, force_size, size, copy tool
    ("dynamic", "off", 5 * MiB + 3072, "cp"),
    ("dynamic", "on", 33 * MiB + 512, "cp-sparse-always"),
    ("dynamic", "off", 3 * MiB - 512, "cat"),
    ("fixed", "off", 7 * MiB + 1024, "dd-1M"),
    ("fixed", "on", 9 * MiB + 1536, "dd-sparse-64K"),
]


@needs_qemu
@pytest.mark.parametrize("subformat,force,size,tool", QEMU_CASES,
                         ids=[f"{a}-force{b}-{c}-{d}" for a, b, c, d in QEMU_CASES])
def test_qemu_made(server, mount, shm, subformat, force, size, tool):
    vhd = shm / "q.vhd"
    qemu_img("create", "-f", "vpc", "-o",
             f"subformat={subformat},force_size={force}", vhd, size)
    last = size // 512 * 512 - 512
    cmds = ["write -P 0x11 0 4k", f"write -P 0x33 {last} 512"]
    if size > 2052 * 1024:
        cmds.append("write -P 0x22 2044k 8k")      # across a block boundary
    qemu_io(vhd, *cmds)
    ref, cur, chs = qemu_reference(vhd, shm)
    if force == "on":
        assert cur == size // 512 * 512
    else:
        assert cur >= size                 # CHS-rounded by qemu
    export = roundup(cur, MiB) + MiB
    srv, _ = random_export(server, export)
    m = mount(srv, *fixed_opts(subformat))
    land(m, vhd, tool)
    assert_content(ref, export, mount_file=m.file, uri=srv.uri,
                   mount_size=cur, what=f"{subformat} force_size={force}")
    got = read_nbd(srv.uri, 0, cur)
    assert got[:4096] == b"\x11" * 4096
    assert got[last:last + 512] == b"\x33" * 512


@needs_qemu
def test_qemu_1g_sparse_known_offsets(server, mount, shm):
    vhd = shm / "big.vhd"
    qemu_img("create", "-f", "vpc", vhd, "1G")
    offsets = {0: 0x41, 300 * MiB + 512: 0x42, 512 * MiB - 4096: 0x43,
               700 * MiB + 12345 * 512: 0x44, GiB - 2 * MiB: 0x45}
    qemu_io(vhd, *[f"write -P {p} {o} 64k" for o, p in offsets.items()])
    ref, cur, _ = qemu_reference(vhd, shm)
    export = roundup(cur, MiB) + MiB
    srv = server("memory", f"size={export}")
    # random bytes around every written range and in between, not 1 GiB
    spots = sorted({o // MiB * MiB for o in offsets} |
                   {100 * MiB, 600 * MiB, export - MiB, cur // MiB * MiB})
    for o in spots:
        write_nbd(srv.uri, random_bytes(min(MiB, export - o)), o)
    m = mount(srv)
    land(m, vhd, "cp-sparse-always")
    for o, p in offsets.items():
        assert read_nbd(srv.uri, o, 65536) == bytes([p]) * 65536
        assert read_nbd(srv.uri, o + 65536, 512) == bytes(512)
    with open(ref, "rb") as f:
        for o in spots:
            n = min(MiB, export - o)
            f.seek(o)
            want = f.read(n) if o < cur else b""
            assert read_nbd(srv.uri, o, n) == want + bytes(n - len(want)), o
    assert_content(ref, export, mount_file=m.file, uri=srv.uri,
                   mount_size=cur, what="1 GiB sparse")


@needs_qemu
def test_qemu_blocks_out_of_order(server, mount, shm):
    vhd = shm / "ooo.vhd"
    qemu_img("create", "-f", "vpc", vhd, "64M")
    order = [20, 0, 10, 31, 15, 5]
    qemu_io(vhd, *[f"write -P {0x50 + b} {b * 2 * MiB + 4096} 4k"
                   for b in order])
    # file order differs from BAT order
    v = VhdFile(vhd.read_bytes())
    by_file = sorted(v.allocated_blocks(), key=lambda b: v.bat[b])
    assert by_file == order
    ref, cur, _ = qemu_reference(vhd, shm)
    export = roundup(cur, MiB) + MiB
    srv, _ = random_export(server, export)
    m = mount(srv)
    land(m, vhd, "dd-1M")
    assert_content(ref, export, mount_file=m.file, uri=srv.uri,
                   mount_size=cur, what="blocks out of order")
    for b in order:
        o = b * 2 * MiB + 4096
        assert read_nbd(srv.uri, o, 4096) == bytes([0x50 + b]) * 4096


# ---- 4. export: reading nbd.vhd --------------------------------------------

def export_checks(m, srv, shm, export):
    """cp MNT/nbd.vhd out; check it with qemu-img and the inspector against
    the disk read from the server, up to the raw file's size (the size the
    views export; past it the export reads as zero).  Returns (out.vhd,
    disk bytes up to that size)."""
    whole = read_nbd(srv.uri)
    export = os.stat(m.file).st_size
    disk = whole[:export]
    assert whole[export:] == bytes(len(whole) - export)
    raw = shm / "disk.raw"
    raw.write_bytes(disk)
    out = shm / "out.vhd"
    r = run(["cp", m.mp / "nbd.vhd", out])
    assert r.returncode == 0, r.stderr
    assert os.path.getsize(out) == os.stat(m.mp / "nbd.vhd").st_size
    # re-reading within a mount gives the same bytes
    assert sha256_file(m.mp / "nbd.vhd") == sha256_file(out)
    cur = roundup(export, 512)
    fields = vhd_tool_info(out)
    assert fields["kind"] == "dynamic"
    assert fields["current size"] == str(cur)
    assert fields["creator"].startswith('"win "')
    vhd_tool("check", out)
    cat = shm / "cat.raw"
    vhd_tool("cat", out, "-o", cat)
    assert sha256_file(cat) == hashlib.sha256(disk + bytes(cur - export)).hexdigest()
    cat.unlink()
    # unallocated blocks only where the disk reads as zero
    allocated = set(vhd_tool_map(out))
    assert set(nonzero_blocks(disk)) <= allocated
    # our own reader agrees
    v = VhdFile(out.read_bytes())
    assert v.size == cur and v.creator == b"win "
    if HAVE_QEMU:
        info = json.loads(qemu_img("info", "--output=json", out).stdout)
        assert info["format"] == "vpc"
        assert qemu_size(vpc_spec(out)) == cur
        r = qemu_img("compare", "-f", "raw", raw, vpc_spec(out), check=False)
        assert r.returncode == 0 and "identical" in r.stdout, (r.stdout, r.stderr)
        # without options too (the creator "win ": current_size)
        assert qemu_size(vpc_spec(out, force_current=False)) == cur
    raw.unlink()
    return out, disk


@pytest.mark.parametrize("name", ["qemu-dyn-10m", "tap-dyn-64m"])
def test_export_after_landing_and_round_trip(server, mount, shm, name):
    export = roundup(VIRTUAL[name], MiB) + 2 * MiB + 1536   # not CHS-exact
    srv, _ = random_export(server, export)
    m = mount(srv)
    land(m, fixture(f"{name}.vhd", shm), "cp")
    out, disk = export_checks(m, srv, shm, export)
    # sparse export: only the VHD's allocated blocks (at most) carry data
    src_alloc = VhdFile(fixture(f"{name}.vhd", shm).read_bytes()).allocated_blocks()
    assert set(vhd_tool_map(out)) <= set(src_alloc)
    # round trip into another random-filled export
    srv2, _ = random_export(server, export)
    m2 = mount(srv2)
    land(m2, out, "cp-sparse-always")
    assert sha256_nbd(srv2.uri) == hashlib.sha256(
        disk + bytes(export - len(disk))).hexdigest()
    assert sha256_nbd(srv2.uri, VIRTUAL[name]) == SHA[f"{name}.raw"]


def test_export_after_raw_writes_follows_zero_maps(server, mount, shm):
    """Allocation follows what was written since the mount."""
    export = 16 * MiB
    srv = server("memory", f"size={export}")
    m = mount(srv)
    with open(m.file, "r+b") as f:
        f.seek(9 * MiB + 100)
        f.write(b"x" * 1000)
    out, disk = export_checks(m, srv, shm, export)
    assert vhd_tool_map(out) == [4]


def test_export_over_vhd_limit_refused(server, mount, shm):
    """A 3 TiB disk cannot be a VHD (2040 GiB limit): opening nbd.vhd for
    reading fails with EFBIG and the daemon says why."""
    srv = server("memory", "size=3T")
    m = mount(srv, expect_errors=True)
    view = m.mp / "nbd.vhd"
    st = os.stat(view)                  # stat works; the size says nothing
    assert st.st_size == 0
    assert oserror_errno(lambda: open(view, "rb").close()) == errno.EFBIG
    r = run(["cp", view, shm / "out.vhd"])
    assert r.returncode != 0 and "too large" in r.stderr.lower(), r.stderr
    assert any("exceeds the VHD limit" in l for l in vhd_errors(m)), m.stderr
    # the raw file is unaffected
    assert os.stat(m.file).st_size == 3 << 40


# ---- 5. malformed VHDs ---------------------------------------------------------

BASE = "qemu-dyn-10m"            # BAT: block 0 at 2048, 1 at 2099712, 4 at ...


def bat_set(i, v):
    def fn(d):
        struct.pack_into(">I", d, bat_entry_offset(d, i), v)
    return fn


def bat_overlap(d):
    (b1,) = struct.unpack_from(">I", d, bat_entry_offset(d, 1))
    bat_set(5, b1 + 1)(d)


def footers(fn, **kw):
    return lambda d: mutate_footers(d, fn, **kw)


def put(off, val):
    def fn(d):
        o = off if off >= 0 else len(d) + off
        d[o:o + len(val)] = val
    return fn


def flip(off):
    def fn(d):
        d[off] ^= 0x04
    return fn


# Refused before anything touches the disk: (mutation, daemon message[,
# strerror the copy tool prints; default EINVAL's]).
REFUSED = {
    "copy-bad-checksum": (flip(100), "footer checksum mismatch"),
    "copy-poisoned": (footers(lambda f: f.__setitem__(slice(0, 8), b"v_poison"),
                              trailing=False), "v_poison"),
    "disk-type-5": (footers(lambda f: struct.pack_into(">I", f, 60, 5)),
                    "unsupported disk type 5"),
    "format-version": (footers(lambda f: struct.pack_into(">I", f, 12, 0x20000)),
                       "unsupported footer format version"),
    "size-over-limit": (footers(lambda f: struct.pack_into(">Q", f, 48, 1 << 60)),
                        "exceeds the VHD limit", "File too large"),
    "size-overflows": (footers(lambda f: struct.pack_into(">Q", f, 48, (1 << 64) - 512)),
                       "exceeds the VHD limit", "File too large"),
    "size-odd": (footers(lambda f: struct.pack_into(">Q", f, 48, 10514433)),
                 "not a multiple of 512"),
    "size-zero": (footers(lambda f: struct.pack_into(">Q", f, 48, 0)),
                  "current size is 0"),
    "data-offset": (footers(lambda f: struct.pack_into(">Q", f, 16, 0x300)),
                    "not a valid dynamic header offset"),
    "header-checksum": (flip(600), "dynamic header checksum mismatch"),
    "header-cookie": (lambda d: mutate_header(
        d, lambda h: h.__setitem__(slice(0, 8), b"cxsparsf")),
        "bad dynamic header cookie"),
    "block-size": (lambda d: mutate_header(
        d, lambda h: struct.pack_into(">I", h, 32, 3 * MiB)),
        "not a power of two"),
    "bat-too-small": (lambda d: mutate_header(
        d, lambda h: struct.pack_into(">I", h, 28, 2)), "BAT has 2 entries"),
    "bat-entry-in-metadata": (bat_set(5, 2), "clobbers the metadata"),
    "bat-entries-overlap": (bat_overlap, "overlap"),
}


@pytest.fixture
def victim(server, mount, shm):
    """A 16 MiB random export, mounted, plus the base VHD's bytes."""
    srv, old = random_export(server, 16 * MiB)
    m = mount(srv, expect_errors=True)
    good = fixture(f"{BASE}.vhd", shm)
    return srv, m, old, bytearray(good.read_bytes())


def write_bad(shm, data, name="bad.vhd"):
    p = shm / name
    p.write_bytes(bytes(data))
    return p


@pytest.mark.parametrize("tool", ["cp", "dd-1M"])
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_malformed_refused_disk_untouched(victim, shm, case, tool):
    srv, m, old, data = victim
    fn, message, *why = REFUSED[case]
    fn(data)
    bad = write_bad(shm, data)
    r = copy_into(tool, bad, m.mp / "nbd.vhd")
    assert r.returncode != 0, f"{tool} accepted a VHD with {case}"
    assert (why or ["Invalid argument"])[0] in r.stderr, r.stderr
    errs = vhd_errors(m)
    assert len(errs) == 1 and message in errs[0], m.stderr
    assert_untouched(srv, m, old)
    # the view is usable afterwards: a good VHD lands
    land(m, fixture(f"{BASE}.vhd", shm), "cp")
    assert sha256_nbd(srv.uri) == sha256_file(fixture(f"{BASE}.raw", shm),
                                              pad_to=16 * MiB)


def test_fixed_vhd_larger_than_export_fails(server, mount, shm):
    """A fixed VHD says its size only in its last sector: the overflow is
    seen when the data reaches the end of the export.  Documented limit:
    the part that fit is on the disk; nothing past the export."""
    srv, old = random_export(server, 4 * MiB)
    m = mount(srv, "--vhd-fixed", expect_errors=True)
    raw = fixture("tap-fixed-8m.raw", shm).read_bytes()
    r = copy_into("cp", fixture("tap-fixed-8m.vhd", shm), m.mp / "nbd.vhd")
    assert r.returncode != 0, "a fixed VHD larger than the export landed"
    assert vhd_errors(m), m.stderr
    sectors_are(read_nbd(srv.uri), [raw, None, old], "fixed overflow")


def assert_partial_decode(srv, raw, virt, export_old=None):
    """After a failed landing of a dynamic VHD: every sector of the disk is
    the VHD's data or zero (never stale, never misplaced), and the export
    past the VHD's disk reads zero."""
    got = read_nbd(srv.uri)
    sectors_are(got[:virt], [raw, None], "partly landed disk")
    assert not got[virt:].strip(b"\0"), "bytes past the VHD's disk"


# Fail at close: the stream cannot know before the end.  (mutation, message,
# True if the whole disk was received and must equal the raw image)
AT_CLOSE = {
    "truncated-mid-block": (lambda d: d.__delitem__(slice(4 * MiB + 1000, None)),
                            "file ended at", False),
    "truncated-before-footer": (lambda d: d.__delitem__(slice(len(d) - 512, None)),
                                "without a trailing footer", True),
    "bat-entry-past-end": (bat_set(5, 0x100000), "before block 5", True),
    "trailing-footer-differs": (footers(lambda f: f.__setitem__(68, f[68] ^ 1),
                                        copy=False),
                                "trailing footer differs", True),
}


@pytest.mark.parametrize("tool", ["cp", "cat"])
@pytest.mark.parametrize("case", sorted(AT_CLOSE))
def test_malformed_fails_at_close(victim, shm, case, tool):
    srv, m, old, data = victim
    fn, message, complete = AT_CLOSE[case]
    fn(data)
    r = copy_into(tool, write_bad(shm, data), m.mp / "nbd.vhd")
    assert r.returncode != 0, f"{tool} accepted a VHD with {case}"
    errs = vhd_errors(m)
    assert len(errs) == 1 and message in errs[0], m.stderr
    raw = fixture(f"{BASE}.raw", shm).read_bytes()
    virt = VIRTUAL[BASE]
    assert_partial_decode(srv, raw, virt)
    if complete:      # everything but the end arrived: the disk is whole
        assert sha256_nbd(srv.uri, virt) == SHA[f"{BASE}.raw"]


def test_bad_cookie_in_copy_fails(victim, shm):
    """A footer copy whose cookie alone is wrong is refused at the first
    write (it is neither a VHD nor plausibly fixed-VHD data)."""
    srv, m, old, data = victim
    data[0:8] = b"connectx"
    r = copy_into("cp", write_bad(shm, data), m.mp / "nbd.vhd")
    assert r.returncode != 0, "a VHD with a bad footer-copy cookie landed"
    errs = vhd_errors(m)
    assert len(errs) == 1 and "bad cookie" in errs[0], m.stderr
    assert_untouched(srv, m, old)


def test_garbage_with_fixed_enabled_fails_at_close(server, mount, shm):
    """With --vhd-fixed, bytes without a footer copy are taken for a fixed
    VHD (data first, footer last) and fail at close; what landed is the
    file's own bytes (documented in docs/vhd-view.md)."""
    srv, old = random_export(server, 16 * MiB)
    m = mount(srv, "--vhd-fixed", expect_errors=True)
    data = random_bytes(3 * MiB)
    r = copy_into("cp", write_bad(shm, data), m.mp / "nbd.vhd")
    assert r.returncode != 0, "garbage landed as a fixed VHD"
    errs = vhd_errors(m)
    assert len(errs) == 1 and "not a valid footer" in errs[0], m.stderr
    sectors_are(read_nbd(srv.uri), [data, None, old], "garbage as fixed")


@pytest.mark.parametrize("fix_checksum", [False, True])
def test_bad_cookie_in_copy_leaves_disk_untouched(victim, shm, fix_checksum):
    srv, m, old, data = victim
    if fix_checksum:        # a footer in every way but its cookie
        mutate_footers(data, lambda f: f.__setitem__(slice(0, 8), b"connectx"),
                       trailing=False)
    else:
        data[0:8] = b"connectx"
    r = copy_into("cp", write_bad(shm, data), m.mp / "nbd.vhd")
    assert r.returncode != 0
    assert_untouched(srv, m, old)


def test_writes_out_of_order_second_mib_first(victim, shm):
    """Python writes the first sector and the second MiB of a VHD, then
    the rest of the first: EINVAL, and nothing but the VHD's own bytes (or
    zeros) lands anywhere.  (Starting at the second MiB is refused at once:
    the skipped first sector reads as zeros, not a VHD.)"""
    srv, m, old, _ = victim
    vhd = fixture(f"{BASE}.vhd", shm).read_bytes()
    fd = os.open(m.mp / "nbd.vhd", os.O_WRONLY | os.O_TRUNC)
    try:
        os.pwrite(fd, vhd[:4096], 0)
        os.pwrite(fd, vhd[MiB:2 * MiB], MiB)
        e = oserror_errno(os.pwrite, fd, vhd[4096:MiB], 4096)
        assert e == errno.EINVAL, f"backwards write: errno {e}"
    finally:
        e = oserror_errno(os.close, fd)
    assert e == errno.EINVAL, f"close after a failed ingest: errno {e}"
    errs = vhd_errors(m)
    assert len(errs) == 1 and "goes backwards" in errs[0], m.stderr
    raw = fixture(f"{BASE}.raw", shm).read_bytes()
    assert_partial_decode(srv, raw, VIRTUAL[BASE])


def test_writes_out_of_order_dynamic(victim, shm):
    """Metadata in order, then a later block, then back to an earlier one:
    EINVAL; the disk holds only the VHD's data or zeros, nothing past it."""
    srv, m, old, data = victim
    v = VhdFile(bytes(data))
    b1 = v.bat[1] * 512                 # block 1 (file order: 0, 1, 4)
    b4 = v.bat[4] * 512
    fd = os.open(m.mp / "nbd.vhd", os.O_WRONLY | os.O_TRUNC)
    try:
        os.pwrite(fd, bytes(data[:b1]), 0)               # through block 0
        os.pwrite(fd, bytes(data[b4:b4 + MiB]), b4)       # skip block 1
        e = oserror_errno(os.pwrite, fd, bytes(data[b1:b1 + MiB]), b1)
        assert e == errno.EINVAL, f"backwards write: errno {e}"
    finally:
        e = oserror_errno(os.close, fd)
    assert e == errno.EINVAL
    errs = vhd_errors(m)
    assert len(errs) == 1 and "goes backwards" in errs[0], m.stderr
    raw = fixture(f"{BASE}.raw", shm).read_bytes()
    assert_partial_decode(srv, raw, VIRTUAL[BASE])
    # block 0 arrived whole
    assert read_nbd(srv.uri, 0, 2 * MiB) == raw[:2 * MiB]

