"""MOUNTPOINT/nbd.vmdk: VMDKs written into the mount land on the export,
and reading it exports the disk as a streamOptimized VMDK.

The VMDKs come from two independent writers, both Debian packages:
qemu-img (streamOptimized and monolithicSparse) and python3-vmdkstream
(VMDKstream.convert_to_stream, the OVA-style layout with GD_AT_END and a
footer).  The source disk has random grains, all-zero grains, a half-zero
grain and a size that is not a multiple of the 64 KiB grain.  Every
landing starts from an export full of random bytes (so a stale byte
shows) and compares sha256 of the disk, read through the mount and
directly from the server, with the raw source followed by zeros.  Exports
are read back by qemu-img and vmdkinfo (libvmdk) and landed again.
Malformed VMDKs must leave the disk untouched where the header, the
descriptor or the grain map is wrong, and fail at close where the stream
ends early or a grain is damaged.

What every view promises (a qemu-img image lands; a damaged header is
refused with the disk untouched; a cut file fails at close; a disk larger
than the export is ENOSPC; a second writer is EBUSY; O_TRUNC alone
changes nothing; the export round trip; the inline digest; the progress)
is tested once for all of them in test_view_contract.py; this file keeps
the VMDK view's own rules.

Run: /usr/bin/python3 -m pytest tests/test_vmdk_view.py
"""

import errno
import functools
import hashlib
import os
import random
import shutil
import struct

import pytest

from lib.content import assert_content
from lib.digest import sha256_file
from lib.env import MiB
from lib.nbd import read_nbd, sha256_nbd
from lib.formats import (COPY_TOOLS, assert_untouched, copy_into,
                         land as land_in, random_export)
from lib.procs import oserror_errno, run

for tool in ("qemu-img", "vmdkinfo", "tar"):
    if not shutil.which(tool):
        raise RuntimeError(f"{tool} missing (scripts/install-deps)")
if run(["/usr/bin/python3", "-c", "import VMDKstream"]).returncode != 0:
    raise RuntimeError("python3-vmdkstream missing (scripts/install-deps)")

GRAIN = 64 * 1024
RAW_SIZE = 6 * MiB + 12800              # 512-aligned, not grain-aligned


def roundup(n, m):
    return -(-n // m) * m


def make_raw(path, size=RAW_SIZE, seed=1):
    rnd = random.Random(seed)
    data = bytearray(size)
    for g in range(roundup(size, GRAIN) // GRAIN):
        if g % 5 == 2 or g in (7, 8):
            continue                    # all-zero grains
        start = g * GRAIN + (GRAIN // 2 if g == 11 else 0)
        end = min((g + 1) * GRAIN, size)
        data[start:end] = rnd.randbytes(end - start)
    path.write_bytes(bytes(data))
    return path


def vmdkstream(src, dst):
    r = run(["/usr/bin/python3", "-c",
             "import sys, VMDKstream; VMDKstream.convert_to_stream(sys.argv[1], sys.argv[2])",
             str(src), str(dst)])
    assert r.returncode == 0, r.stderr
    return dst


def qemu_vmdk(src, dst, subformat):
    r = run(["qemu-img", "convert", "-q", "-f", "raw", "-O", "vmdk", "-o",
             f"subformat={subformat}", str(src), str(dst)])
    assert r.returncode == 0, r.stderr
    return dst


def qemu_raw(vmdk, out):
    r = run(["qemu-img", "convert", "-q", "-f", "vmdk", "-O", "raw",
             str(vmdk), str(out)])
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    """The source disk and its VMDKs, made once for the module."""
    d = tmp_path_factory.mktemp("vmdk")
    raw = make_raw(d / "src.raw")
    files = {
        "qemu-stream": qemu_vmdk(raw, d / "qemu-stream.vmdk", "streamOptimized"),
        "qemu-sparse": qemu_vmdk(raw, d / "qemu-sparse.vmdk", "monolithicSparse"),
        "vmdkstream": vmdkstream(raw, d / "vmdkstream.vmdk"),
    }
    # Both writers' files decode to the source with qemu-img.
    for name, f in files.items():
        back = qemu_raw(f, d / f"{name}.back")
        assert sha256_file(back) == sha256_file(raw), name
        back.unlink()
    return d, raw, files


land = functools.partial(land_in, view="nbd.vmdk")


# ---- landing: each writer's file, each way of writing it -----------------

@pytest.mark.parametrize("tool", list(COPY_TOOLS))
@pytest.mark.parametrize("name", ["qemu-sparse", "vmdkstream"])
def test_fixture_lands(server, mount, fx, name, tool):
    """The decoded disk replaces random bytes; the rest of the export reads
    as zero; the raw file's size becomes the VMDK's capacity.  (qemu-img's
    streamOptimized file: test_view_contract.py.)"""
    _, raw, files = fx
    export = roundup(RAW_SIZE, MiB) + 3 * MiB + 512
    srv, _ = random_export(server, export)
    m = mount(srv)
    land(m, files[name], tool)
    assert_content(raw, export, mount_file=m.file, uri=srv.uri,
                   mount_size=RAW_SIZE, what=f"{name} via {tool}")


def test_exact_size_export_and_second_vmdk_replaces_first(server, mount, fx,
                                                          tmp_path):
    """A VMDK exactly as large as the export lands; a smaller second one
    replaces it and the rest reads as zero."""
    _, raw, files = fx
    srv, _ = random_export(server, RAW_SIZE)
    m = mount(srv)
    land(m, files["qemu-sparse"], "cp")
    assert sha256_nbd(srv.uri) == sha256_file(raw)
    small = make_raw(tmp_path / "small.raw", 2 * MiB + 4096, seed=7)
    land(m, vmdkstream(small, tmp_path / "small.vmdk"), "dd-1M")
    assert_content(small, RAW_SIZE, mount_file=m.file, uri=srv.uri,
                   mount_size=2 * MiB + 4096)


@pytest.mark.parametrize("name", ["qemu-stream", "vmdkstream"])
def test_ova_tar_xO(server, mount, fx, tmp_path, name):
    """tar -xOf vm.ova disk.vmdk > MNT/nbd.vmdk: no temporary copy."""
    _, raw, files = fx
    ova_dir = tmp_path / "ova"
    ova_dir.mkdir()
    (ova_dir / "vm.ovf").write_text("<Envelope/>\n")
    shutil.copy(files[name], ova_dir / "vm-disk1.vmdk")
    ova = tmp_path / "vm.ova"
    r = run(["tar", "-cf", ova, "-C", ova_dir, "vm.ovf", "vm-disk1.vmdk"])
    assert r.returncode == 0, r.stderr
    srv, _ = random_export(server, 8 * MiB)
    m = mount(srv)
    r = run(["sh", "-c", 'tar -xOf "$1" vm-disk1.vmdk > "$2"', "sh", ova,
             m.mp / "nbd.vmdk"], timeout=300)
    assert r.returncode == 0, r.stderr + m.stderr
    assert_content(raw, 8 * MiB, mount_file=m.file, uri=srv.uri,
                   mount_size=RAW_SIZE)


# ---- streamOptimized surgery (an independent reader/writer) -------------

def split_stream(data):
    """(head, grains, meta): the bytes before the overhead's end, a list of
    (lba, record bytes) for the grain markers, and the rest."""
    overhead = struct.unpack_from("<Q", data, 0x40)[0] * 512
    pos, grains = overhead, []
    while True:
        lba, size = struct.unpack_from("<QI", data, pos)
        if size == 0:
            break
        n = roundup(12 + size, 512)
        grains.append((lba, data[pos:pos + n]))
        pos += n
    return data[:overhead], grains, data[pos:]


def stream_meta_len(meta):
    """Bytes of the metadata markers up to and including EOS."""
    pos = 0
    while True:
        n, size, typ = struct.unpack_from("<QII", meta, pos)
        assert size == 0
        pos += 512 + n * 512
        if typ == 0:
            return pos


def build_stream(head, grains, capacity, gtes=512):
    """A streamOptimized file like VMware's: header with GD_AT_END, grains
    in the given order, GT markers, GD marker, footer, EOS; the tables
    point at where the grains are (so qemu-img can check the result)."""
    out = bytearray(head)
    where = {}
    for lba, rec in grains:
        where[lba // 128] = len(out) // 512
        out += rec
    ngrains = roundup(capacity, 128) // 128
    ngts = roundup(ngrains, gtes) // gtes
    gd = [0] * roundup(ngts, 128)
    for t in range(ngts):
        entries = [where.get(t * gtes + j, 0) for j in range(gtes)]
        if any(entries):
            out += struct.pack("<QII", gtes * 4 // 512, 0, 1).ljust(512, b"\0")
            gd[t] = len(out) // 512
            out += struct.pack(f"<{gtes}I", *entries)
    out += struct.pack("<QII", len(gd) * 4 // 512, 0, 2).ljust(512, b"\0")
    gd_at = len(out) // 512
    out += struct.pack(f"<{len(gd)}I", *gd)
    out += struct.pack("<QII", 1, 0, 3).ljust(512, b"\0")
    footer = bytearray(head[:512])
    struct.pack_into("<Q", footer, 56, gd_at)
    out += footer
    out += bytes(512)                   # EOS
    return bytes(out)


def test_grains_out_of_lba_order(server, mount, fx, tmp_path):
    """Grains in shuffled LBA order (tables consistent, so qemu-img reads
    the file as the same disk) land as the disk."""
    _, raw, files = fx
    data = files["vmdkstream"].read_bytes()
    head, grains, _ = split_stream(data)
    assert len(grains) > 20
    random.Random(3).shuffle(grains)
    cap = struct.unpack_from("<Q", data, 12)[0]
    shuffled = tmp_path / "shuffled.vmdk"
    shuffled.write_bytes(build_stream(head, grains, cap))
    assert sha256_file(qemu_raw(shuffled, tmp_path / "s.raw")) == \
        sha256_file(raw)
    srv, _ = random_export(server, 8 * MiB)
    m = mount(srv)
    land(m, shuffled, "pipe")
    assert_content(raw, 8 * MiB, mount_file=m.file, uri=srv.uri,
                   mount_size=RAW_SIZE)


def test_all_zero_disk(server, mount, tmp_path):
    """A VMDK with no grains at all zeroes the disk."""
    zero = tmp_path / "zero.raw"
    with open(zero, "wb") as f:
        f.truncate(3 * MiB)
    for f in (vmdkstream(zero, tmp_path / "z1.vmdk"),
              qemu_vmdk(zero, tmp_path / "z2.vmdk", "monolithicSparse")):
        srv, _ = random_export(server, 4 * MiB)
        m = mount(srv)
        land(m, f, "cp")
        assert sha256_nbd(srv.uri) == sha256_file(zero, pad_to=4 * MiB)
        assert os.stat(m.file).st_size == 3 * MiB


# ---- refusals and failures ------------------------------------------------

@pytest.fixture
def victim(server, mount):
    srv, old = random_export(server, 16 * MiB)
    m = mount(srv, expect_errors=True)
    return srv, m, old


def patch(data, off, b):
    d = bytearray(data)
    d[off:off + len(b)] = b
    return bytes(d)


def desc_patch(data, old, new):
    assert len(old) == len(new)
    i = data.index(old, 512)
    return data[:i] + new + data[i + len(old):]


def sparse_gte(data, i):
    gd = struct.unpack_from("<Q", data, 0x38)[0]
    gt = struct.unpack_from("<I", data, gd * 512)[0]
    return gt * 512 + 4 * i


# case -> (file, mutation, message in the daemon's log)
REFUSED = {
    "magic": ("vmdkstream", lambda d: patch(d, 0, b"XDMV"), "magic"),
    "newline": ("vmdkstream", lambda d: patch(d, 75, b"\n"), "newline test"),
    "version": ("qemu-stream", lambda d: patch(d, 4, struct.pack("<I", 9)),
                "version 9"),
    "grain-size": ("qemu-sparse", lambda d: patch(d, 20, struct.pack("<Q", 96)),
                   "power of two"),
    "create-type": ("qemu-sparse", lambda d: desc_patch(
        d, b'createType="monolithicSparse"', b'createType="vmfsSparse"      '),
        'createType "vmfsSparse"'),
    "delta-disk": ("qemu-stream", lambda d: desc_patch(
        d, b"parentCID=ffffffff", b"parentCID=12345678"), "delta disk"),
    "extent-size": ("vmdkstream", lambda d: desc_patch(
        d, b"RDONLY 12313 SPARSE", b"RDONLY 12312 SPARSE"),
        "header capacity 12313"),
    "grain-in-overhead": ("qemu-sparse", lambda d: patch(
        d, sparse_gte(d, 3), struct.pack("<I", 5)), "inside the overhead"),
    "grains-overlap": ("qemu-sparse", lambda d: patch(
        d, sparse_gte(d, 1),
        struct.pack("<I", struct.unpack_from("<I", d, sparse_gte(d, 0))[0] + 8)),
        "overlap in the file"),
}


@pytest.mark.parametrize("tool", ["cp", "pipe"])
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_malformed_refused_disk_untouched(victim, fx, tmp_path, case, tool):
    """A header, descriptor or grain map that breaks a rule is refused
    before anything reaches the disk; the view works afterwards."""
    srv, m, old = victim
    _, raw, files = fx
    name, fn, message = REFUSED[case]
    bad = tmp_path / "bad.vmdk"
    bad.write_bytes(fn(files[name].read_bytes()))
    r = copy_into(tool, bad, m.mp / "nbd.vmdk")
    assert r.returncode != 0, f"{tool} accepted a VMDK with {case}"
    errs = [l for l in m.stderr.splitlines() if "nbd.vmdk:" in l]
    assert len(errs) == 1 and message in errs[0], m.stderr
    assert_untouched(srv, m, old)
    land(m, files["qemu-stream"], "cp")
    assert sha256_nbd(srv.uri) == sha256_file(raw, pad_to=16 * MiB)


CUTS = [300, 4096, 65536 + 100, 1 << 20, -600, -1]


@pytest.mark.parametrize("cut", CUTS)
@pytest.mark.parametrize("name", ["qemu-stream", "qemu-sparse", "vmdkstream"])
def test_truncated_fails_at_close(victim, fx, tmp_path, name, cut):
    """A VMDK that ends early: the copy fails (EINVAL at close); if it
    ended inside the header or metadata, the disk is untouched."""
    srv, m, old = victim
    data = fx[2][name].read_bytes()
    end = len(data)
    if name != "qemu-sparse":           # qemu-img pads after the EOS marker
        head, grains, meta = split_stream(data)
        end = len(head) + sum(len(g) for _, g in grains) + stream_meta_len(meta)
    n = cut if cut > 0 else end + cut
    if name == "qemu-sparse" and cut == -1:
        n = len(data) - 70000           # inside the last grain
    bad = tmp_path / "cut.vmdk"
    bad.write_bytes(data[:n])
    r = copy_into("pipe", bad, m.mp / "nbd.vmdk")
    assert r.returncode != 0, f"a VMDK cut at {n} was accepted"
    assert "Invalid argument" in r.stderr, r.stderr
    errs = [l for l in m.stderr.splitlines() if "nbd.vmdk:" in l and "ended" in l]
    assert len(errs) == 1, m.stderr
    if n < 65536:
        assert_untouched(srv, m, old)


def test_damaged_grain_fails(victim, fx, tmp_path):
    """A grain whose deflate data is damaged fails the copy."""
    srv, m, old = victim
    data = fx[2]["vmdkstream"].read_bytes()
    head, grains, _ = split_stream(data)
    off = len(head) + sum(len(g[1]) for g in grains[:5]) + 200
    bad = tmp_path / "bad.vmdk"
    bad.write_bytes(patch(data, off, bytes([data[off] ^ 0x5A])))
    r = copy_into("cp", bad, m.mp / "nbd.vmdk")
    assert r.returncode != 0 and "Invalid argument" in r.stderr, r.stderr
    assert "deflate data corrupt" in m.stderr


# ---- export: reading nbd.vmdk --------------------------------------------

def export_checks(m, srv, tmp_path, export):
    """cp MNT/nbd.vmdk out; qemu-img and vmdkinfo read it as the disk up
    to the raw file's size (the size the views export; past it the export
    reads as zero).  Returns (out.vmdk, disk bytes up to that size)."""
    whole = read_nbd(srv.uri)
    export = os.stat(m.file).st_size
    disk = whole[:export]
    assert whole[export:] == bytes(len(whole) - export)
    out = tmp_path / "out.vmdk"
    r = run(["cp", m.mp / "nbd.vmdk", out])
    assert r.returncode == 0, r.stderr
    assert os.path.getsize(out) == os.stat(m.mp / "nbd.vmdk").st_size
    assert sha256_file(m.mp / "nbd.vmdk") == sha256_file(out)
    back = qemu_raw(out, tmp_path / "back.raw")
    assert sha256_file(back) == \
        hashlib.sha256(disk + bytes(roundup(export, 512) - export)).hexdigest()
    r = run(["qemu-img", "check", "-f", "vmdk", out])
    assert r.returncode == 0, r.stdout + r.stderr
    r = run(["qemu-img", "info", out])
    assert "create type: streamOptimized" in r.stdout, r.stdout
    r = run(["vmdkinfo", out])
    assert r.returncode == 0 and "Stream optimized" in r.stdout, r.stdout + r.stderr
    assert f"({roundup(export, 512)} bytes)" in r.stdout, r.stdout
    return out, disk


def test_export_after_landing_and_round_trip(server, mount, fx, tmp_path):
    _, raw, files = fx
    export = 8 * MiB + 1536
    srv, _ = random_export(server, export)
    m = mount(srv)
    land(m, files["qemu-sparse"], "cp")
    out, disk = export_checks(m, srv, tmp_path, export)
    # only grains that hold data (and at most the source's) are in the file
    _, grains, _ = split_stream(out.read_bytes())
    nonzero = {g for g in range(roundup(RAW_SIZE, GRAIN) // GRAIN)
               if any(disk[g * GRAIN:(g + 1) * GRAIN])}
    assert {lba // 128 for lba, _ in grains} >= nonzero
    assert len(grains) <= roundup(RAW_SIZE, GRAIN) // GRAIN
    srv2, _ = random_export(server, export)
    m2 = mount(srv2)
    land(m2, out, "pipe")
    assert sha256_nbd(srv2.uri) == hashlib.sha256(
        disk + bytes(export - len(disk))).hexdigest()
    assert sha256_nbd(srv2.uri, RAW_SIZE) == sha256_file(raw)


def test_export_follows_zero_maps(server, mount, tmp_path):
    """An empty export gives a VMDK with no grains; one written grain gives
    one grain."""
    export = 16 * MiB
    srv = server("memory", f"size={export}")
    m = mount(srv)
    out, _ = export_checks(m, srv, tmp_path, export)
    assert split_stream(out.read_bytes())[1] == []
    with open(m.file, "r+b") as f:
        f.seek(9 * MiB + 100)
        f.write(b"x" * 1000)
    out, _ = export_checks(m, srv, tmp_path, export)
    assert [lba for lba, _ in split_stream(out.read_bytes())[1]] == \
        [9 * MiB // 512]


def test_export_size_with_fragmented_data(server, mount, tmp_path):
    """The size stat reports (counted from the zero maps) equals the file
    read, with extents sharing grains and crossing grain-table bounds."""
    export = 80 * MiB
    srv = server("memory", f"size={export}")
    m = mount(srv)
    spots = [100, 1000, 70000, 32 * MiB - 10, 64 * MiB - 3, 70 * MiB]
    with open(m.file, "r+b") as f:
        for off in spots:
            f.seek(off)
            f.write(b"y" * 20)
    out, disk = export_checks(m, srv, tmp_path, export)
    lbas = sorted({off // GRAIN for o in spots for off in (o, o + 19)})
    assert [lba // 128 for lba, _ in split_stream(out.read_bytes())[1]] == lbas


def test_export_size_not_sector_multiple_round_trip(server, mount, tmp_path):
    """An export that ends mid-sector: its VMDK's capacity is rounded up
    to whole sectors, and it lands back (the rounding bytes are zero);
    a VMDK with data in those bytes does not fit."""
    export = 3 * MiB + 100
    srv, old = random_export(server, export)
    m = mount(srv)
    out, disk = export_checks(m, srv, tmp_path, export)
    assert disk == old
    srv2, _ = random_export(server, export)
    m2 = mount(srv2, expect_errors=True)
    land(m2, out, "cp")
    assert sha256_nbd(srv2.uri) == hashlib.sha256(old).hexdigest()
    assert os.stat(m2.file).st_size == export
    # A disk with non-zero bytes in the rounding: refused at that grain.
    big = tmp_path / "big.raw"
    big.write_bytes(old + b"z" * 412)
    r = copy_into("cp", vmdkstream(big, tmp_path / "big.vmdk"),
                  m2.mp / "nbd.vmdk")
    assert r.returncode != 0 and "No space left" in r.stderr, r.stderr


def test_export_over_vmdk_limit_refused(server, mount, tmp_path):
    """A disk of more than 2^28 grains (16 TiB) is not synthesized: stat
    says 0 bytes, opening for reading fails with EFBIG and the daemon says
    why; the raw file is unaffected."""
    # No block status scan: 17 TiB takes 4352 requests of 4 GiB (8 s on a
    # loaded machine, past the mount's 30 s readiness under TSan), and the
    # view's refusal does not depend on it.
    srv = server("memory", "size=17T")
    m = mount(srv, "--no-extents", expect_errors=True)
    view = m.mp / "nbd.vmdk"
    assert os.stat(view).st_size == 0
    assert oserror_errno(lambda: open(view, "rb").close()) == errno.EFBIG
    assert any("more than" in l and "grains" in l
               for l in m.stderr.splitlines() if "nbd.vmdk:" in l), m.stderr
    assert os.stat(m.file).st_size == 17 << 40
