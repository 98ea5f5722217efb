"""nbdferry-vhd, the VHD inspector: info, check, map, cat, export.

Every decode is checked by sha256 against an independent source: the
fixture README (files made by blktap, vhd-tool and qemu-img) or
`qemu-img convert -O raw` of VHDs that qemu-img/qemu-io make here.  `cat`
is run both through the random-access path and with --stream (the decoder
the nbd.vhd view uses).  Malformed files must be refused by `check` with
exit status 1 and a message naming the broken rule.

What every inspector promises (info, check and map of a good image, cat
equal to the raw source, check of a damaged header exits 1, the export
round trip, --help, --version and usage errors) is tested once for all of
them in test_inspector_contract.py; this file keeps nbdferry-vhd's own rules.

Environment: NBDFERRY_BUILD (default: build/ beside tests/) holds
tools/nbdferry-vhd.  Helpers live here on purpose (tests/lib/ belongs to
the mount tests).
"""

import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

import pytest

from lib.digest import sha256_file
from lib.env import BUILD, TESTS

FIXTURES = TESTS / "fixtures" / "vhd"
TOOL = BUILD / "tools" / "nbdferry-vhd"
MiB = 1 << 20
GiB = 1 << 30

if not TOOL.exists():
    if "NBDFERRY_BUILD" in os.environ:
        raise RuntimeError(f"{TOOL} not built")
    pytest.skip(f"{TOOL} not built", allow_module_level=True)

HAVE_QEMU = shutil.which("qemu-img") and shutil.which("qemu-io")
needs_qemu = pytest.mark.skipif(not HAVE_QEMU, reason="needs qemu-img, qemu-io")

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


# ---- helpers ----------------------------------------------------------------

def run(*args, expect=0):
    """Run the inspector; assert its exit status; return the process."""
    p = subprocess.run([str(TOOL), *map(str, args)], capture_output=True)
    assert p.returncode == expect, (
        f"{args}: exit {p.returncode}, want {expect}\n"
        f"stdout: {p.stdout.decode(errors='replace')[-2000:]}\n"
        f"stderr: {p.stderr.decode(errors='replace')}")
    return p


def fixture(name, dest_dir):
    """Decompress tests/fixtures/vhd/NAME.xz into dest_dir; check its sha."""
    out = Path(dest_dir) / name
    with open(out, "wb") as f:
        subprocess.run(["xz", "-dc", FIXTURES / f"{name}.xz"], stdout=f, check=True)
    assert sha256_file(out) == SHA[name], f"fixture {name} corrupt"
    return out


def cat_sha(vhd, tmp_path, *extra, stream=False):
    """Decode with `cat -o` (optionally --stream); return sha256 of the raw."""
    out = tmp_path / ("out-stream.raw" if stream else "out.raw")
    run("cat", vhd, "-o", out, *extra, *(["--stream"] if stream else []))
    return sha256_file(out)


def cat_stdout_sha(vhd, *extra):
    p = run("cat", vhd, *extra)
    return hashlib.sha256(p.stdout).hexdigest()


def qemu_img(*args):
    return subprocess.run(["qemu-img", *map(str, args)], check=True,
                          capture_output=True, text=True).stdout


def qemu_size(fields):
    """The size `info` predicts for the installed qemu-img: qemu 10 turned
    the creator rule round (CHS only for "vpc " and "qemu"), so info gives
    both; Debian 12 has qemu 7.2, Debian 13 qemu 10.0."""
    m = re.search(r"version (\d+)\.", qemu_img("--version"))
    assert m, "qemu-img --version: no version"
    key = "qemu 10 size" if int(m.group(1)) >= 10 else "qemu size"
    return int(fields[key].split()[0])


def qemu_io(img, fmt, *cmds):
    args = ["qemu-io", "-f", fmt]
    for c in cmds:
        args += ["-c", c]
    subprocess.run(args + [str(img)], check=True, capture_output=True)


def vpc_spec(path, force_current=True):
    """A qemu json: spec for a VPC file, with force_size_calc=current_size
    (qemu derives the size from CHS for unknown creators otherwise)."""
    spec = {"driver": "vpc", "file": {"driver": "file", "filename": str(path)}}
    if force_current:
        spec["force_size_calc"] = "current_size"
    return "json:" + json.dumps(spec)


def footer_checksum(b):
    b = bytearray(b)
    b[64:68] = b"\0\0\0\0"
    return (~sum(b)) & 0xFFFFFFFF


def header_checksum(b):
    b = bytearray(b)
    b[36:40] = b"\0\0\0\0"
    return (~sum(b)) & 0xFFFFFFFF


def info_fields(vhd):
    out = run("info", vhd).stdout.decode()
    fields = {}
    for line in out.splitlines():
        k, _, v = line.partition(":")
        fields.setdefault(k.strip(), v.strip())
    return fields


# ---- fixtures made by other tools -------------------------------------------

STANDALONE = [
    ("tap-dyn-64m.vhd", "tap-dyn-64m.raw", "dynamic", 67108864, "tap"),
    ("vhdtool-raw-100m3s.vhd", "vhdtool-raw-100m3s.raw", "dynamic", 106954752, "caml"),
    ("tap-fixed-8m.vhd", "tap-fixed-8m.raw", "fixed", 8388608, "tap"),
    ("qemu-dyn-10m.vhd", "qemu-dyn-10m.raw", "dynamic", 10514432, "qemu"),
]


@pytest.mark.parametrize("vhd,raw,kind,size,creator", STANDALONE,
                         ids=[s[0] for s in STANDALONE])
def test_fixture_decodes(tmp_path, vhd, raw, kind, size, creator):
    f = fixture(vhd, tmp_path)
    assert cat_sha(f, tmp_path) == SHA[raw]
    assert cat_sha(f, tmp_path, stream=True) == SHA[raw]
    assert cat_stdout_sha(f) == SHA[raw]
    assert os.path.getsize(tmp_path / "out.raw") == size
    # sparse output: far fewer blocks than bytes
    assert os.stat(tmp_path / "out.raw").st_blocks * 512 < size
    p = run("check", f)
    assert b": ok (" + kind.encode() in p.stdout
    fields = info_fields(f)
    assert fields["kind"] == kind
    assert fields["current size"] == str(size)
    assert fields["creator"].startswith(f'"{creator}')


def test_fixture_caml_needs_force_size(tmp_path):
    """vhd-tool's creator makes qemu use CHS; info says so."""
    f = fixture("vhdtool-raw-100m3s.vhd", tmp_path)
    fields = info_fields(f)
    assert "force_size_calc=current_size" in fields["qemu size"]
    assert fields["qemu size"].startswith("106913792 ")     # 421/16/31
    # qemu 10 and later: current_size for any creator but "vpc "/"qemu"
    assert fields["qemu 10 size"] == "106954752 (qemu 10 and later)"
    if HAVE_QEMU:
        out = qemu_img("info", "--output=json", "-f", "vpc", f)
        assert json.loads(out)["virtual-size"] == qemu_size(fields)


def test_map_out_of_order_blocks(tmp_path):
    """blktap stores blocks in allocation order 20, 0, 10, 1, 31."""
    f = fixture("tap-dyn-64m.vhd", tmp_path)
    lines = run("map", f).stdout.decode().splitlines()[1:]
    rows = [tuple(int(x) for x in l.split()[:3]) for l in lines]
    assert [r[0] for r in rows] == [0, 1, 10, 20, 31]
    by_file = [r[0] for r in sorted(rows, key=lambda r: r[2])]
    assert by_file == [20, 0, 10, 1, 31]
    partial = {int(l.split()[0]): l.split()[3] for l in lines}
    assert partial[31] == "4096/4096" and partial[20] == "8/4096"
    info = info_fields(f)
    assert info["batmap"].startswith("map at")
    assert info["allocated blocks"] == "5 of 32"


# ---- differencing chains ----------------------------------------------------

def test_chain_via_locator(tmp_path):
    fixture("tap-dyn-64m.vhd", tmp_path)
    child = fixture("tap-diff-64m.vhd", tmp_path)
    assert cat_sha(child, tmp_path) == SHA["tap-diff-64m.raw"]
    assert cat_sha(child, tmp_path, stream=True) == SHA["tap-diff-64m.raw"]
    fields = info_fields(child)
    assert fields["kind"] == "differencing"
    assert fields["parent name"] == "tap-dyn-64m.vhd"
    assert '"./tap-dyn-64m.vhd"' in run("info", child).stdout.decode()


def test_chain_via_explicit_parent(tmp_path):
    pdir, cdir = tmp_path / "p", tmp_path / "c"
    pdir.mkdir()
    cdir.mkdir()
    parent = fixture("tap-dyn-64m.vhd", pdir)
    child = fixture("tap-diff-64m.vhd", cdir)
    p = run("cat", child, "-o", tmp_path / "x.raw", expect=2)
    assert b"cannot find the parent" in p.stderr
    assert cat_sha(child, tmp_path, "--parent", parent) == SHA["tap-diff-64m.raw"]
    assert cat_sha(child, tmp_path, "--parent", parent, stream=True) == \
        SHA["tap-diff-64m.raw"]


def test_chain_wrong_parent_refused(tmp_path):
    child = fixture("tap-diff-64m.vhd", tmp_path)
    other = fixture("qemu-dyn-10m.vhd", tmp_path)
    p = run("cat", child, "--parent", other, expect=1)
    assert b"unique id" in p.stderr


def test_chain_locator_cannot_escape_directory(tmp_path):
    """A parent named ../x is not followed even if it exists."""
    (tmp_path / "sub").mkdir()
    fixture("tap-dyn-64m.vhd", tmp_path)
    child = fixture("tap-diff-64m.vhd", tmp_path / "sub")
    data = bytearray(child.read_bytes())
    # rewrite the MacX payload (at 3072) to point one level up
    url = b"file://../tap-dyn-64m.vhd"
    data[3072:3072 + 512] = url.ljust(512, b"\0")
    struct.pack_into(">I", data, 512 + 576 + 8, len(url))
    # and drop the other locators and the name
    data[512 + 576 + 24:512 + 576 + 72] = bytes(48)
    data[512 + 64:512 + 576] = bytes(512)
    struct.pack_into(">I", data, 512 + 36, header_checksum(data[512:1536]))
    child.write_bytes(data)
    run("check", child)
    p = run("cat", child, "-o", tmp_path / "x.raw", expect=2)
    assert b"../tap-dyn-64m.vhd" in p.stderr


def test_delta_over_parent(tmp_path):
    """vhd-tool delta: its locator points at zeros; the unicode name or
    --parent finds the parent; applied over it gives the child's image."""
    parent = fixture("tap-dyn-64m.vhd", tmp_path)
    delta = fixture("vhdtool-delta-64m.vhd", tmp_path)
    run("check", delta)
    assert "(empty)" in run("info", delta).stdout.decode()
    assert cat_sha(delta, tmp_path) == SHA["tap-diff-64m.raw"]
    assert cat_sha(delta, tmp_path, "--parent", parent) == SHA["tap-diff-64m.raw"]
    assert cat_sha(delta, tmp_path, "--parent", parent, stream=True) == \
        SHA["tap-diff-64m.raw"]


def test_delta_over_raw_parent_image(tmp_path):
    """Applying the delta with --stream over the parent's *raw* image."""
    raw = fixture("tap-dyn-64m.raw", tmp_path)
    delta = fixture("vhdtool-delta-64m.vhd", tmp_path)
    # parent id is not zero, so a raw file is not an acceptable parent
    p = run("cat", delta, "--parent", raw, expect=1)
    assert b"parent" in p.stderr


# ---- VHDs made here by qemu-img / qemu-io ------------------------------------

QEMU_CASES = [
    # (subformat, force_size, size)
    ("dynamic", "off", 10 * MiB),
    ("dynamic", "on", 10 * MiB),
    ("dynamic", "off", 100 * MiB + 1536),
    ("dynamic", "on", 100 * MiB + 1536),
    ("fixed", "off", 10 * MiB),
    ("fixed", "on", 100 * MiB + 1536),
]


def qemu_vs_ours(tmp_path, vhd, fmt_spec):
    """Our decode (random access and stream) equals qemu-img convert."""
    ref = tmp_path / "qemu.raw"
    subprocess.run(["qemu-img", "convert", "-O", "raw", fmt_spec, str(ref)]
                   if fmt_spec.startswith("json:") else
                   ["qemu-img", "convert", "-f", "vpc", "-O", "raw", str(vhd), str(ref)],
                   check=True, capture_output=True)
    want = sha256_file(ref)
    assert cat_sha(vhd, tmp_path) == want
    assert cat_sha(vhd, tmp_path, stream=True) == want
    assert os.path.getsize(tmp_path / "out.raw") == os.path.getsize(ref)
    return want


@needs_qemu
@pytest.mark.parametrize("subformat,force,size", QEMU_CASES,
                         ids=[f"{a}-force{b}-{c}" for a, b, c in QEMU_CASES])
def test_qemu_made(tmp_path, subformat, force, size):
    vhd = tmp_path / "q.vhd"
    qemu_img("create", "-f", "vpc", "-o",
             f"subformat={subformat},force_size={force}", vhd, str(size))
    # data at the start, across a block boundary, and in the last sector
    qemu_io(vhd, "vpc", "write -P 0x11 0 4k", "write -P 0x22 2044k 8k",
            f"write -P 0x33 {size // 512 * 512 - 4096} 512")
    run("check", vhd)
    fields = info_fields(vhd)
    cur = int(fields["current size"])
    if force == "on":
        assert cur == size // 512 * 512
        assert fields["creator"].startswith('"qem2"')
    else:
        assert cur >= size               # rounded up to a CHS-exact size
        assert fields["creator"].startswith('"qemu"')
    assert fields["kind"] == subformat
    qemu_vs_ours(tmp_path, vhd, vpc_spec(vhd))
    out = (tmp_path / "out.raw").read_bytes()
    assert out[0:4096] == b"\x11" * 4096
    assert out[2044 * 1024:2052 * 1024] == b"\x22" * 8192
    last = size // 512 * 512 - 4096
    assert out[last:last + 512] == b"\x33" * 512


@needs_qemu
def test_qemu_1g_sparse_known_offsets(tmp_path):
    vhd = tmp_path / "big.vhd"
    qemu_img("create", "-f", "vpc", vhd, "1G")
    offsets = {0: 0x41, 300 * MiB + 512: 0x42, 512 * MiB - 4096: 0x43,
               700 * MiB + 12345 * 512: 0x44, GiB - 2 * MiB: 0x45}
    qemu_io(vhd, "vpc", *[f"write -P {p} {o} 64k" for o, p in offsets.items()])
    want = qemu_vs_ours(tmp_path, vhd, vpc_spec(vhd))
    with open(tmp_path / "out.raw", "rb") as f:
        for o, p in offsets.items():
            f.seek(o)
            assert f.read(65536) == bytes([p]) * 65536
            f.seek(o + 65536)
            assert f.read(512) == bytes(512)
    assert want == sha256_file(tmp_path / "out-stream.raw")
    lines = run("map", vhd).stdout.decode().splitlines()[1:]
    # blocks 0, 150, 255 and 256 (that write straddles them), 353, 511
    assert [int(l.split()[0]) for l in lines] == [0, 150, 255, 256, 353, 511]


@needs_qemu
def test_qemu_blocks_written_out_of_order(tmp_path):
    vhd = tmp_path / "ooo.vhd"
    qemu_img("create", "-f", "vpc", vhd, "64M")
    order = [20, 0, 10, 31, 15, 5]
    qemu_io(vhd, "vpc", *[f"write -P {0x50 + b} {b * 2 * MiB + 4096} 4k"
                          for b in order])
    lines = run("map", vhd).stdout.decode().splitlines()[1:]
    rows = [tuple(int(x) for x in l.split()[:3]) for l in lines]
    assert [r[0] for r in sorted(rows, key=lambda r: r[2])] == order
    qemu_vs_ours(tmp_path, vhd, vpc_spec(vhd))
    out = (tmp_path / "out.raw").read_bytes()
    for b in order:
        o = b * 2 * MiB + 4096
        assert out[o:o + 4096] == bytes([0x50 + b]) * 4096


@needs_qemu
def test_qemu_dense_copy_as_cp_sparse_always(tmp_path):
    """A dense copy of a sparse qemu VHD decodes the same (zeros as data)."""
    vhd = tmp_path / "s.vhd"
    qemu_img("create", "-f", "vpc", vhd, "16M")
    qemu_io(vhd, "vpc", "write -P 0x61 4M 1M", "write -z 4M 4k")
    dense = tmp_path / "dense.vhd"
    subprocess.run(["cp", "--sparse=never", vhd, dense], check=True)
    want = qemu_vs_ours(tmp_path, vhd, vpc_spec(vhd))
    assert cat_sha(dense, tmp_path, stream=True) == want
    assert cat_sha(dense, tmp_path) == want


# ---- export (the synthesizer) -----------------------------------------------

@needs_qemu
@pytest.mark.parametrize("size", [10 * MiB, 64 * MiB + 1536, 5 * MiB - 100])
def test_export_readable_by_qemu(tmp_path, size):
    raw = tmp_path / "disk.raw"
    with open(raw, "wb") as f:
        f.truncate(size)
        for i, o in enumerate([0, 3 * MiB + 7, size - 300, size // 2]):
            f.seek(o)
            f.write(bytes([0x70 + i]) * min(5000, size - o))
    vhd = tmp_path / "disk.vhd"
    run("export", raw, "-o", vhd)
    run("check", vhd)
    cur = (size + 511) // 512 * 512
    fields = info_fields(vhd)
    assert fields["current size"] == str(cur)
    assert fields["creator"].startswith('"win "')
    # our own decoders
    padded = raw.read_bytes() + bytes(cur - size)
    want = hashlib.sha256(padded).hexdigest()
    assert cat_sha(vhd, tmp_path) == want
    assert cat_sha(vhd, tmp_path, stream=True) == want
    # qemu: exact with force_size_calc=current_size ...
    padded_raw = tmp_path / "padded.raw"
    padded_raw.write_bytes(padded)
    subprocess.run(["qemu-img", "compare", "-f", "raw", str(padded_raw),
                    vpc_spec(vhd)], check=True, capture_output=True)
    info = json.loads(qemu_img("info", "--output=json", vpc_spec(vhd)))
    assert info["virtual-size"] == cur
    # ... and without it: the creator "win " makes qemu read current_size
    plain = json.loads(qemu_img("info", "--output=json", "-f", "vpc", vhd))
    assert plain["virtual-size"] == qemu_size(fields)
    assert plain["virtual-size"] == cur
    subprocess.run(["qemu-img", "compare", "-f", "raw", "-F", "vpc",
                    str(padded_raw), str(vhd)], check=True,
                   capture_output=True)


def test_export_allocation_follows_holes(tmp_path):
    raw = tmp_path / "holey.raw"
    with open(raw, "wb") as f:
        f.truncate(32 * MiB)
        f.seek(9 * MiB)
        f.write(b"x" * 100)
    vhd = tmp_path / "holey.vhd"
    run("export", raw, "-o", vhd)
    lines = run("map", vhd).stdout.decode().splitlines()[1:]
    assert [int(l.split()[0]) for l in lines] == [4]
    assert lines[0].split()[3] == "4096/4096"
    assert os.path.getsize(vhd) == 512 + 1024 + 512 + (512 + 2 * MiB) + 512


# ---- malformed files ------------------------------------------------------------

def mutate_footer(data, fn):
    """Apply fn to both footers (as bytearrays) and fix their checksums."""
    for start in (0, len(data) - 512):
        f = bytearray(data[start:start + 512])
        fn(f)
        struct.pack_into(">I", f, 64, footer_checksum(f))
        data[start:start + 512] = f


def mutate_header(data, fn):
    h = bytearray(data[512:1536])
    fn(h)
    struct.pack_into(">I", h, 36, header_checksum(h))
    data[512:1536] = h


def bat_set(i, v):
    def fn(d):
        struct.pack_into(">I", d, 1536 + 4 * i, v)
    return fn


MALFORMED = {
    "bad-cookie": (lambda d: d.__setitem__(slice(0, 8), b"connectx") or
                   d.__setitem__(slice(len(d) - 512, len(d) - 504), b"connectx"),
                   "bad footer cookie"),
    "poisoned": (lambda d: d.__setitem__(slice(len(d) - 512, len(d) - 504), b"v_poison"),
                 "v_poison"),
    "bad-checksum": (lambda d: d.__setitem__(len(d) - 400, d[len(d) - 400] ^ 1),
                     "footer checksum mismatch"),
    "disk-type-5": (lambda d: mutate_footer(d, lambda f: struct.pack_into(">I", f, 60, 5)),
                    "unsupported disk type 5"),
    "absurd-size": (lambda d: mutate_footer(d, lambda f: struct.pack_into(">Q", f, 48, 1 << 60)),
                    "exceeds the VHD limit"),
    "odd-size": (lambda d: mutate_footer(d, lambda f: struct.pack_into(">Q", f, 48, 10514433)),
                 "not a multiple of 512"),
    "copy-differs": (lambda d: d.__setitem__(slice(0, 512), d[0:24] + b"\0\0\0\1" + d[28:512]),
                     "footer copy at offset 0 is invalid"),
    "header-checksum": (lambda d: d.__setitem__(600, d[600] ^ 4),
                        "dynamic header checksum mismatch"),
    "header-cookie": (lambda d: mutate_header(d, lambda h: h.__setitem__(slice(0, 8), b"cxsparsf")),
                      "bad dynamic header cookie"),
    "block-size": (lambda d: mutate_header(d, lambda h: struct.pack_into(">I", h, 32, 3 * MiB)),
                   "not a power of two"),
    "bat-too-small": (lambda d: mutate_header(d, lambda h: struct.pack_into(">I", h, 28, 2)),
                      "BAT has 2 entries"),
    "bat-entry-past-end": (bat_set(5, 0x100000), "extends past the trailing footer"),
    "bat-entry-in-metadata": (bat_set(5, 2), "clobbers the metadata"),
    "bat-entries-overlap": (bat_set(5, 4 + 1), "overlap"),
    "truncated": (lambda d: d.__delitem__(slice(len(d) - 4096, len(d))),
                  "bad footer cookie"),
    "tail-chopped": (lambda d: d.__delitem__(slice(len(d) - 100, len(d))),
                     "not a multiple of 512"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_check_rejects(tmp_path, case):
    good = fixture("qemu-dyn-10m.vhd", tmp_path)
    data = bytearray(good.read_bytes())
    fn, message = MALFORMED[case]
    fn(data)
    bad = tmp_path / "bad.vhd"
    bad.write_bytes(data)
    p = run("check", bad, expect=1)
    assert message.encode() in p.stderr, p.stderr
    assert b"invalid" in p.stderr
    run("cat", bad, "-o", tmp_path / "x.raw", expect=1)
    run("info", bad, expect=1)


def test_stream_rejects_what_it_cannot_place(tmp_path):
    """A BAT entry into the trailing footer: the image parser says so, the
    stream decoder (cat --stream) finds the block never arrives."""
    good = fixture("qemu-dyn-10m.vhd", tmp_path)
    data = bytearray(good.read_bytes())
    bat_set(5, (len(data) - 512) // 512)(data)
    bad = tmp_path / "bad.vhd"
    bad.write_bytes(data)
    p = run("check", bad, expect=1)
    assert b"extends past the trailing footer" in p.stderr


# ---- usage --------------------------------------------------------------------

def test_usage_errors(tmp_path):
    """No command, an unknown one, a missing file, --help:
    test_inspector_contract.py."""
    f = fixture("qemu-dyn-10m.vhd", tmp_path)
    run("cat", f, "--stream", expect=2)                    # needs -o
    run("info", f, "--parent", f, expect=2)
    run("export", f, expect=2)                              # needs -o
    run("check", tmp_path, expect=2)                        # a directory
    # ... also on tmpfs (Debian 13's /tmp), where a directory's size is a
    # few bytes: refused as a directory, not read as a too-short image
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        p = run("check", d, expect=2)
        assert b"Is a directory" in p.stderr, p.stderr
    empty = tmp_path / "empty.vhd"
    empty.write_bytes(b"")
    assert b"shorter than" in run("check", empty, expect=1).stderr
