"""nbdferry-qcow2, the qcow2 inspector: info, check, map, cat, export.

Files come from qemu-img and qemu-io (plain, compressed with zlib and with
zstd, with a backing file, with extended L2 entries, with a cluster
reused after a discard so that it lies before its L2 table); every decode
is checked by sha256 against `qemu-img convert -O raw` of the same file
(from a file and from a pipe), every map against `qemu-img map`, every
export by qemu-img check and compare.  Cut and damaged files must make
check exit 1 with the broken rule on stderr; a file that needs the spool
fails past --spool-max and says so.

What every inspector promises (info, check and map of a good image, cat
equal to the raw source, check of a damaged header exits 1, the export
round trip, --help, --version and usage errors) is tested once for all of
them in test_inspector_contract.py; this file keeps nbdferry-qcow2's own rules.

Environment: NBDFERRY_BUILD (default: build/ beside tests/) holds
tools/nbdferry-qcow2.
"""

import json
import random
import shutil
import struct
import subprocess

import pytest

from lib.digest import sha256_file
from lib.env import BUILD

TOOL = BUILD / "tools" / "nbdferry-qcow2"
MiB = 1 << 20
SIZE = 37 * MiB + 512                 # odd: the last cluster is clipped

if not TOOL.exists():
    raise RuntimeError(f"{TOOL} not built")
for prog in ("qemu-img", "qemu-io"):
    if not shutil.which(prog):
        raise RuntimeError(f"{prog} missing (scripts/install-deps)")


def tool(*args, expect=0, stdin=None):
    r = subprocess.run([str(a) for a in (TOOL, *args)], capture_output=True,
                       timeout=300, stdin=stdin)
    assert r.returncode == expect, (
        f"nbdferry-qcow2 {args}: exit {r.returncode}, want {expect}\n"
        f"{r.stdout[-2000:]!r}\n{r.stderr.decode(errors='replace')}")
    return r


def qemu_img(*args):
    subprocess.run(["qemu-img", *map(str, args)], check=True,
                   capture_output=True, timeout=120)


def qemu_io(img, *cmds):
    argv = ["qemu-io", "-d", "unmap", "-f", "qcow2"]
    for c in cmds:
        argv += ["-c", c]
    subprocess.run(argv + [str(img)], check=True, capture_output=True,
                   timeout=120)


def reference(img, d):
    """sha256 of qemu-img's own decode of img to raw."""
    out = d / (img.name + ".ref")
    qemu_img("convert", "-f", "qcow2", "-O", "raw", img, out)
    return sha256_file(out)


def merged(runs):
    """(start, len, kind, file offset) runs, adjacent equal ones merged."""
    out = []
    for s, n, k, o in runs:
        if out and out[-1][2] == k and out[-1][0] + out[-1][1] == s and (
                k != "allocated" or out[-1][3] + out[-1][1] == o):
            out[-1][1] += n
        else:
            out.append([s, n, k, o])
    return out


def tool_map(img):
    runs = []
    for line in tool("map", img).stdout.decode().splitlines():
        f = line.split()
        runs.append((int(f[0]), int(f[1]), f[2],
                     int(f[3]) if len(f) > 3 else None))
    return merged(runs)


def qemu_map(img):
    """qemu-img map of the image's own layer, in the tool's terms."""
    r = subprocess.run(["qemu-img", "map", "--output=json", "-f", "qcow2",
                        str(img)], check=True, capture_output=True, timeout=60)
    runs = []
    for e in json.loads(r.stdout):
        if e["depth"] != 0 or not e["present"]:
            k, o = "unallocated", None
        elif e["data"]:
            k, o = ("allocated", e["offset"]) if "offset" in e \
                else ("compressed", None)
        else:
            k, o = "zero", None
        runs.append((e["start"], e["length"], k, o))
    return merged(runs)


def make_raw(path, seed):
    """Random and compressible data, holes, a run of one byte."""
    rnd = random.Random(seed)
    text = b"".join(b"line %d of a compressible file\n" % i
                    for i in range(60000))
    with open(path, "wb") as f:
        f.truncate(SIZE)
        f.write(rnd.randbytes(MiB))
        f.write(text[:2 * MiB])
        f.seek(9 * MiB + 4096)
        f.write(rnd.randbytes(4096))
        f.seek(12 * MiB)
        f.write(b"\xab" * (256 * 1024))
        f.seek(20 * MiB)
        f.write(text[:MiB])
        f.seek(SIZE - 4096 - 100)
        f.write(rnd.randbytes(4096 + 100))
    return path


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    d = tmp_path_factory.mktemp("qcow2tool")
    raw = make_raw(d / "disk.raw", 3)
    imgs = {}
    for name, opts in (("plain", []), ("zlib", ["-c"]),
                       ("zstd", ["-c", "-o", "compression_type=zstd"])):
        imgs[name] = d / f"{name}.qcow2"
        qemu_img("convert", "-q", "-f", "raw", "-O", "qcow2", *opts, raw,
                 imgs[name])
    # Extended L2 entries: only the subclusters written are allocated.
    x = imgs["extl2"] = d / "extl2.qcow2"
    qemu_img("create", "-q", "-f", "qcow2", "-o",
             "extended_l2=on,cluster_size=64k", x, SIZE)
    qemu_io(x, "write -P 0x11 4096 4096", f"write -P 0x22 {5 * MiB} 2048",
            f"write -P 0x33 {5 * MiB + 40960} 10k", f"write -z {6 * MiB} 8k",
            f"write -P 0x44 {6 * MiB + 8192} 2k",
            f"write -P 0x55 {SIZE - 2048} 2048")
    # A cluster discarded and reused: the new data lies before its table
    # (4 KiB clusters: an L2 table maps 2 MiB).
    r = imgs["reused"] = d / "reused.qcow2"
    qemu_img("create", "-q", "-f", "qcow2", "-o", "cluster_size=4k", r,
             "8M")
    qemu_io(r, "write -P 1 0 4k", f"write -P 2 {4 * MiB} 4k",
            "discard 0 4k", f"write -P 3 {4 * MiB + 4096} 4k")
    # An overlay: changes over plain.qcow2, one of them a zero cluster.
    o = imgs["overlay"] = d / "overlay.qcow2"
    qemu_img("create", "-q", "-f", "qcow2", "-b", imgs["plain"].name,
             "-F", "qcow2", o)
    qemu_io(o, "write -P 0x5a 1M 64k", "write -z 20M 64k")
    return d, raw, imgs


@pytest.mark.parametrize("name", ["plain", "zlib", "zstd", "extl2",
                                  "reused"])
def test_qcow2_tool_cat_file_and_pipe(fx, name):
    d, raw, imgs = fx
    img = imgs[name]
    want = reference(img, d)
    out = d / f"{name}.cat"
    tool("cat", img, "-o", out)
    assert sha256_file(out) == want
    pipe = d / f"{name}.pipe"
    if name == "reused":
        # The reused cluster lands when its table arrives, after data
        # further on the disk: a pipe out cannot take that order.
        with open(img, "rb") as src:
            r = tool("cat", "-", stdin=src, expect=2)
        assert b"out of disk order" in r.stderr, r.stderr
        with open(img, "rb") as src:
            tool("cat", "-", "-o", pipe, stdin=src)
    else:
        with open(img, "rb") as src:
            pipe.write_bytes(tool("cat", "-", stdin=src).stdout)
    assert sha256_file(pipe) == want
    if name in ("plain", "zlib", "zstd"):
        assert want == sha256_file(raw)


def test_qcow2_tool_check_info(fx):
    d, raw, imgs = fx
    out = tool("check", imgs["plain"]).stdout.decode()
    assert out.startswith("ok: qcow2 version 3, virtual size %d" % SIZE), out
    for name, comp in (("zlib", "zlib"), ("zstd", "zstd")):
        info = tool("info", imgs[name]).stdout.decode()
        assert f"compression type       {comp}" in info, info
        n = int(info.split("clusters", 1)[1].split("data, ")[1].split()[0])
        assert n > 0, f"{name}: no compressed cluster\n{info}"
    info = tool("info", imgs["extl2"]).stdout.decode()
    assert "extended L2            yes (32 subclusters of 2048" in info, info
    assert "refcount width         16 bits" in info, info
    info = tool("info", imgs["overlay"]).stdout.decode()
    assert "backing file           plain.qcow2 (format qcow2)" in info, info
    assert "internal snapshots     0" in info, info


@pytest.mark.parametrize("name", ["plain", "zlib", "zstd", "extl2",
                                  "reused", "overlay"])
def test_qcow2_tool_map_matches_qemu(fx, name):
    d, raw, imgs = fx
    mine = tool_map(imgs[name])
    assert mine == qemu_map(imgs[name]), mine
    kinds = {r[2] for r in mine}
    want = {"plain": {"allocated"}, "zlib": {"compressed"},
            "zstd": {"compressed"}, "extl2": {"allocated", "zero"},
            "reused": {"allocated", "zero"},
            "overlay": {"allocated", "zero"}}[name]
    assert want <= kinds, (name, kinds)


def test_qcow2_tool_snapshots_reported(fx):
    d, raw, imgs = fx
    s = d / "snap.qcow2"
    shutil.copy(imgs["plain"], s)
    qemu_img("snapshot", "-c", "one", s)
    qemu_io(s, "write -P 0x77 0 64k")
    info = tool("info", s).stdout.decode()
    assert "internal snapshots     1 (not landed" in info, info
    r = tool("cat", s, "-o", d / "snap.raw")
    assert b"1 internal snapshot not landed" not in r.stdout
    assert sha256_file(d / "snap.raw") == reference(s, d)


def test_qcow2_tool_cat_refuses_a_backing_file(fx):
    d, raw, imgs = fx
    out = d / "overlay.raw"
    r = tool("cat", imgs["overlay"], "-o", out, expect=2)
    assert b"backing file (plain.qcow2)" in r.stderr, r.stderr
    assert out.stat().st_size == 0
    out = tool("check", imgs["overlay"]).stdout.decode()
    assert "with a backing file" in out, out


def test_qcow2_tool_spool_bound(fx):
    d, raw, imgs = fx
    info = tool("info", imgs["reused"]).stdout.decode()
    assert "spooled                1 clusters (peak 4096 bytes)" in info, info
    r = tool("--spool-max", "2K", "check", imgs["reused"], expect=1)
    assert b"raise --spool-max" in r.stderr, r.stderr
    tool("--spool-max", "4K", "check", imgs["reused"])


def test_qcow2_tool_export_stores_no_holes(fx):
    """export's round trip: test_inspector_contract.py; here its size, and
    cat from a pipe."""
    d, raw, imgs = fx
    out = d / "export.qcow2"
    tool("export", raw, "-o", out)
    # Holes are not stored: the data of disk.raw is about 6.3 MiB in 64 KiB
    # clusters, and the metadata a few clusters.
    assert out.stat().st_size <= 7 * MiB, out.stat().st_size
    with open(out, "rb") as src:
        assert tool("cat", "-", stdin=src).stdout == raw.read_bytes()


def l2_offset(b):
    """File offset of the first L2 table (L1 entry 0)."""
    l1 = struct.unpack_from(">Q", b, 40)[0]
    return struct.unpack_from(">Q", b, l1)[0] & 0x00fffffffffffe00


@pytest.mark.parametrize("damage", ["foreign", "dirty", "reserved",
                                    "refcount", "twice", "cut"])
def test_qcow2_tool_check_refuses(fx, damage):
    d, raw, imgs = fx
    b = bytearray(imgs["plain"].read_bytes())
    l2 = l2_offset(b)
    e0 = struct.unpack_from(">Q", b, l2)[0]
    want = {"foreign": b"not a qcow2 image: its first sector is a VMDK image",
            "dirty": b"dirty",
            "reserved": b"reserved bits", "refcount": b"refcount",
            "twice": b"claimed twice", "cut": b"ended at byte"}[damage]
    if damage == "foreign":
        b[:4] = b"KDMV"
    elif damage == "dirty":
        b[79] |= 1                        # incompatible bit 0
    elif damage == "reserved":
        struct.pack_into(">Q", b, l2, e0 | 2)
    elif damage == "refcount":
        # The first data cluster's refcount (16-bit, first block) to 0.
        rt = struct.unpack_from(">Q", b, 48)[0]
        rb = struct.unpack_from(">Q", b, rt)[0]
        struct.pack_into(">H", b, rb + 2 * ((e0 & 0x00fffffffffffe00) >> 16),
                         0)
    elif damage == "twice":
        struct.pack_into(">Q", b, l2 + 8, e0)     # two disk clusters, one host
    else:
        del b[len(b) - 3 * 65536:]        # whole data clusters
    bad = d / f"bad-{damage}.qcow2"
    bad.write_bytes(bytes(b))
    r = tool("check", bad, expect=1)
    assert want in r.stderr, r.stderr
    out = d / f"bad-{damage}.raw"
    tool("cat", bad, "-o", out, expect=1)


@pytest.mark.parametrize("cmd", ["info", "check", "map"])
def test_qcow2_tool_reads_a_stream_as_a_file(fx, cmd):
    """info, check and map from a pipe (FILE -) say what they say of the
    file, for a compressed image and one that needs the spool."""
    d, raw, imgs = fx
    for name in ("zstd", "reused"):
        with open(imgs[name], "rb") as src:
            piped = tool(cmd, "-", stdin=src).stdout
        assert piped == tool(cmd, imgs[name]).stdout, (cmd, name)


@pytest.mark.parametrize("size", ["512", "4K", "2M"])
def test_qcow2_tool_export_cluster_size(fx, tmp_path, size):
    """export --cluster-size: qemu-img info says that size, check is
    clean and compare equal; other values are a usage error."""
    d, raw, imgs = fx
    out = tmp_path / "out.qcow2"
    tool("export", "--cluster-size", size, raw, "-o", out)
    want = {"512": 512, "4K": 4096, "2M": 2 << 20}[size]
    info = json.loads(subprocess.run(
        ["qemu-img", "info", "--output=json", "-f", "qcow2", str(out)],
        capture_output=True, text=True, check=True).stdout)
    assert info["cluster-size"] == want, info
    subprocess.run(["qemu-img", "check", "-q", "-f", "qcow2", str(out)],
                   check=True)
    subprocess.run(["qemu-img", "compare", "-q", "-f", "qcow2", "-F", "raw",
                    str(out), str(raw)], check=True)
    for bad in ("3000", "256", "4M"):
        r = tool("export", "--cluster-size", bad, raw, "-o", out, expect=2)
        assert b"--cluster-size" in r.stderr, r.stderr
