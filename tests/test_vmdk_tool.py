"""nbdferry-vmdk, the VMDK inspector: info, check, map, cat, export.

Files come from qemu-img and python3-vmdkstream; every decode is checked
by sha256 against the raw source, every export by qemu-img and vmdkinfo.
Damaged files must make check exit 1 with the broken rule on stderr.

What every inspector promises (info, check and map of a good image, cat
equal to the raw source, check of a damaged header exits 1, the export
round trip, --help, --version and usage errors) is tested once for all of
them in test_inspector_contract.py; this file keeps nbdferry-vmdk's own rules.

Environment: NBDFERRY_BUILD (default: build/ beside tests/) holds
tools/nbdferry-vmdk.
"""

import hashlib
import random
import shutil
import struct
import subprocess

import pytest

from lib.digest import sha256_file
from lib.env import BUILD

TOOL = BUILD / "tools" / "nbdferry-vmdk"
MiB = 1 << 20
GRAIN = 65536
RAW_SIZE = 3 * MiB + 4608

if not TOOL.exists():
    raise RuntimeError(f"{TOOL} not built")
for t in ("qemu-img", "vmdkinfo"):
    if not shutil.which(t):
        raise RuntimeError(f"{t} missing (scripts/install-deps)")


def run(args, **kw):
    return subprocess.run([str(a) for a in args], capture_output=True,
                          timeout=300, **kw)


def tool(*args, expect=0, stdin=None):
    r = run([TOOL, *args], stdin=stdin)
    assert r.returncode == expect, (
        f"nbdferry-vmdk {args}: exit {r.returncode}, want {expect}\n"
        f"{r.stdout[-2000:]!r}\n{r.stderr.decode(errors='replace')}")
    return r


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    d = tmp_path_factory.mktemp("vmdktool")
    rnd = random.Random(5)
    raw = bytearray(RAW_SIZE)
    for g in range(0, RAW_SIZE, GRAIN):
        if (g // GRAIN) % 3 != 1:
            raw[g:g + GRAIN] = rnd.randbytes(min(GRAIN, RAW_SIZE - g))
    src = d / "src.raw"
    src.write_bytes(bytes(raw))
    files = {}
    for sub in ("streamOptimized", "monolithicSparse"):
        files[sub] = d / f"{sub}.vmdk"
        r = run(["qemu-img", "convert", "-q", "-f", "raw", "-O", "vmdk",
                 "-o", f"subformat={sub}", src, files[sub]])
        assert r.returncode == 0, r.stderr
    files["vmdkstream"] = d / "vs.vmdk"
    r = run(["/usr/bin/python3", "-c", "import sys, VMDKstream; "
             "VMDKstream.convert_to_stream(sys.argv[1], sys.argv[2])",
             src, files["vmdkstream"]])
    assert r.returncode == 0, r.stderr
    return d, src, bytes(raw), files


def ok_line(r):
    """check's verdict (warnings may precede it)."""
    lines = [l for l in r.stdout.decode().splitlines() if l.startswith("ok:")]
    assert len(lines) == 1, r.stdout
    return lines[0]


def fields(out):
    f = {}
    for line in out.decode().splitlines():
        k, _, v = line.partition(":")
        f.setdefault(k.strip(), v.strip())
    return f


@pytest.mark.parametrize("name", ["streamOptimized", "monolithicSparse",
                                  "vmdkstream"])
def test_info_check_map_cat(fx, name, tmp_path):
    d, src, raw, files = fx
    f = files[name]
    info = fields(tool("info", f).stdout)
    kind = "monolithicSparse" if name == "monolithicSparse" else "streamOptimized"
    assert info["kind"] == kind and info["create type"] == kind
    assert info["capacity"] == f"{RAW_SIZE} bytes ({RAW_SIZE // 512} sectors)"
    assert info["grain size"] == "65536 bytes"
    out = ok_line(tool("check", f))
    assert out.startswith(f"ok: {kind}, capacity {RAW_SIZE} bytes"), out
    nonzero = [g for g in range(0, RAW_SIZE, GRAIN) if any(raw[g:g + GRAIN])]
    assert tool("map", f).stdout.decode().split() == [str(g) for g in nonzero]
    tool("cat", f, "-o", tmp_path / "out.raw")
    assert sha256_file(tmp_path / "out.raw") == sha256_file(src)
    # from a pipe to a pipe
    with open(f, "rb") as inp:
        r = tool("cat", "-", stdin=inp)
    assert hashlib.sha256(r.stdout).hexdigest() == sha256_file(src)
    with open(f, "rb") as inp:
        ok_line(tool("check", "-", stdin=inp))


def test_check_refuses_damage(fx, tmp_path):
    d, src, raw, files = fx
    data = files["vmdkstream"].read_bytes()
    cases = {
        "magic": (data[:0] + b"XDMV" + data[4:], "magic"),
        "truncated": (data[:len(data) // 2], "ended"),
        "deflate": (data[:65536 + 300] + bytes([data[65536 + 300] ^ 0xFF]) +
                    data[65536 + 301:], "deflate data corrupt"),
    }
    for case, (bad, message) in cases.items():
        p = tmp_path / f"{case}.vmdk"
        p.write_bytes(bad)
        r = tool("check", p, expect=1)
        assert message in r.stderr.decode(), (case, r.stderr)
    r = tool("info", tmp_path / "magic.vmdk", expect=1)
    assert b"magic" in r.stderr


def test_export(fx, tmp_path):
    """export writes the same kind of file nbd.vmdk gives: qemu-img and
    vmdkinfo read it as the source; holes become unallocated grains."""
    d, src, raw, files = fx
    sparse = tmp_path / "sparse.raw"
    with open(sparse, "wb") as f:
        f.truncate(8 * MiB)
        f.seek(5 * MiB)
        f.write(raw[:GRAIN] + b"x" * 10)
    for source in (src, sparse):
        out = tmp_path / "out.vmdk"
        tool("export", source, "-o", out)
        r = run(["qemu-img", "compare", "-f", "raw", "-F", "vmdk", source, out])
        assert r.returncode == 0, r.stdout + r.stderr
        r = run(["vmdkinfo", out])
        assert r.returncode == 0 and b"Stream optimized" in r.stdout, r.stdout
        assert ok_line(tool("check", out)).startswith("ok: streamOptimized")
    assert tool("map", out).stdout.decode().split() == \
        [str(5 * MiB), str(5 * MiB + GRAIN)]


def test_check_cross_checks_tables(fx, tmp_path):
    """check also reads the file the way qemu does (directory and tables):
    a table entry that points at another grain's marker, or one missing,
    means qemu would read another disk, and check says so (exit 1)."""
    d, src, raw, files = fx
    data = bytearray(files["vmdkstream"].read_bytes())
    footer = len(data) - 1024                 # footer marker, footer, EOS
    gd = struct.unpack_from("<Q", data, footer + 56)[0]
    gt = struct.unpack_from("<I", data, gd * 512)[0]
    e0, e2 = struct.unpack_from("<I", data, gt * 512)[0], \
        struct.unpack_from("<I", data, gt * 512 + 8)[0]
    assert e0 and e2
    swapped = bytearray(data)
    struct.pack_into("<I", swapped, gt * 512, e2)
    p = tmp_path / "swapped.vmdk"
    p.write_bytes(bytes(swapped))
    r = tool("check", p, expect=1)
    assert b"not its grain marker" in r.stderr, r.stderr
    missing = bytearray(data)
    struct.pack_into("<I", missing, gt * 512, 0)
    p.write_bytes(bytes(missing))
    r = tool("check", p, expect=1)
    assert b"grain tables list" in r.stderr, r.stderr
    # the stream itself decodes either way: the view would take it
    with open(p, "rb") as inp:
        tool("check", "-", stdin=inp)
