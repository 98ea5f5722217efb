"""nbdferry-vhdx, the VHDX inspector: info, check, map, cat, export.

Files come from qemu-img (and, for a log to replay, tests/unit/vhdx-build.h
through vhdx-mkfile); every decode is checked by sha256 against the raw
source (from a file and from a pipe), every export by qemu-img check and
compare.  Damaged and foreign files must make check exit 1 with the broken
rule on stderr; a file whose tables come after its data needs the spool,
and past --spool-max says so.

What every inspector promises (info, check and map of a good image, cat
equal to the raw source, check of a damaged header exits 1, the export
round trip, --help, --version and usage errors) is tested once for all of
them in test_inspector_contract.py; this file keeps nbdferry-vhdx's own rules.

Environment: NBDFERRY_BUILD (default: build/ beside tests/) holds
tools/nbdferry-vhdx.
"""

import random
import shutil
import struct
import subprocess

import pytest

from lib.env import BUILD

TOOL = BUILD / "tools" / "nbdferry-vhdx"
MiB = 1 << 20

if not TOOL.exists():
    raise RuntimeError(f"{TOOL} not built")
if not shutil.which("qemu-img"):
    raise RuntimeError("qemu-img missing (scripts/install-deps)")


def tool(*args, expect=0, stdin=None):
    r = subprocess.run([str(a) for a in (TOOL, *args)], capture_output=True,
                       timeout=300, stdin=stdin)
    assert r.returncode == expect, (
        f"nbdferry-vhdx {args}: exit {r.returncode}, want {expect}\n"
        f"{r.stdout[-2000:]!r}\n{r.stderr.decode(errors='replace')}")
    return r


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    d = tmp_path_factory.mktemp("vhdxtool")
    rnd = random.Random(3)
    raw = d / "disk.raw"
    with open(raw, "wb") as f:            # data, holes, zeros; odd size
        f.truncate(37 * MiB + 512)
        for off in (0, 9 * MiB + 4096, 20 * MiB, 37 * MiB - 4096):
            f.seek(off)
            f.write(rnd.randbytes(4096 if off else 3 * MiB))
    vhdx = d / "disk.vhdx"
    subprocess.run(["qemu-img", "convert", "-q", "-f", "raw", "-O", "vhdx",
                    "-o", "block_size=1M", raw, vhdx], check=True)
    return d, raw, vhdx


def test_vhdx_tool_check_info_map(fx):
    d, raw, vhdx = fx
    out = tool("check", vhdx).stdout.decode()
    assert out.startswith("ok: dynamic VHDX, virtual size 38797824"), out
    info = tool("info", vhdx).stdout.decode()
    assert "block size             1048576" in info, info
    lines = tool("map", vhdx).stdout.decode().splitlines()
    present = [l for l in lines if " present " in l]
    # Blocks 0-2 (3 MiB of data), 9, 20 and the last hold data.
    starts = [int(l.split()[0]) for l in present]
    assert starts[0] == 0 and 9 * MiB in starts and 20 * MiB in starts, lines
    assert sum(int(l.split()[1]) for l in lines) == 37 * MiB + 512


def test_vhdx_tool_cat_from_a_pipe(fx):
    """cat of a file: test_inspector_contract.py; here from standard input."""
    d, raw, vhdx = fx
    with open(vhdx, "rb") as src:
        piped = tool("cat", "-", stdin=src).stdout
    assert len(piped) == raw.stat().st_size
    assert piped == raw.read_bytes()


def test_vhdx_tool_export_stores_no_holes(fx):
    """export's round trip: test_inspector_contract.py; here its size."""
    d, raw, vhdx = fx
    out = d / "export.vhdx"
    tool("export", raw, "-o", out)
    # Holes are not stored: 6 data blocks of 2 MiB plus 4 MiB of metadata.
    assert out.stat().st_size <= 4 * MiB + 6 * 2 * MiB, out.stat().st_size


def regions_after_data(vhdx, out):
    """The same file with its BAT and metadata moved after the blocks
    (the region tables re-pointed and re-checksummed)."""
    b = bytearray(vhdx.read_bytes())
    end = (len(b) + MiB - 1) // MiB * MiB
    b.extend(bytes(end - len(b)))
    rt = 192 * 1024
    for t in (rt, rt + 64 * 1024):
        n = struct.unpack_from("<I", b, t + 8)[0]
        for i in range(n):
            e = t + 16 + 32 * i
            off, ln = struct.unpack_from("<QI", b, e + 16)
            region = bytes(b[off:off + ln])
            if t == rt:
                b[off:off + ln] = bytes(ln)
                moved = len(b)
                b.extend(region)
            else:
                moved = struct.unpack_from("<Q", b, rt + 16 + 32 * i + 16)[0]
            struct.pack_into("<Q", b, e + 16, moved)
        struct.pack_into("<I", b, t + 4, 0)
        struct.pack_into("<I", b, t + 4, crc32c(bytes(b[t:t + 65536])))
    out.write_bytes(bytes(b))


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def test_vhdx_tool_regions_after_data_spool(fx):
    d, raw, vhdx = fx
    late = d / "late.vhdx"
    regions_after_data(vhdx, late)
    subprocess.run(["qemu-img", "check", "-q", "-f", "vhdx", late], check=True)
    info = tool("info", late).stdout.decode()
    assert "spooled" in info and "(peak 0)" not in info, info
    with open(late, "rb") as src:
        assert tool("cat", "-", stdin=src).stdout == raw.read_bytes()
    r = tool("--spool-max", "1M", "check", late, expect=1)
    assert b"raise --spool-max" in r.stderr, r.stderr


@pytest.mark.parametrize("damage", ["foreign", "bat", "cut"])
def test_vhdx_tool_check_refuses(fx, damage):
    d, raw, vhdx = fx
    b = bytearray(vhdx.read_bytes())
    want = {"foreign": b"not a VHDX", "bat": b"overlaps",
            "cut": b"cut short"}[damage]
    if damage == "foreign":
        b[:8] = b"QFI\xfb\0\0\0\3"
    elif damage == "bat":
        t = 192 * 1024
        for i in range(2):
            guid, off = b[t + 16 + 32 * i:t + 32 + 32 * i], \
                struct.unpack_from("<Q", b, t + 32 + 32 * i)[0]
            if guid[:4] == bytes.fromhex("6677c22d"):
                struct.pack_into("<Q", b, off, (1 << 20) | 6)   # into the log
    else:
        del b[len(b) - MiB // 2:]
    bad = d / f"bad-{damage}.vhdx"
    bad.write_bytes(bytes(b))
    r = tool("check", bad, expect=1)
    assert want in r.stderr, r.stderr


def test_vhdx_tool_replays_a_log(fx, tmp_path):
    """A file not closed cleanly: info says its log was replayed, cat gives
    the disk after the replay, and a log that writes behind itself makes
    check fail with how to clean the file."""
    mk = BUILD / "tests" / "vhdx-mkfile"
    size = 6 * MiB
    for flags in ("l", "lb"):
        subprocess.run([mk, tmp_path / f"{flags}.vhdx", tmp_path / f"{flags}.raw",
                        "-", str(size), str(MiB), "512", flags, "7"],
                       check=True)
    info = tool("info", tmp_path / "l.vhdx").stdout.decode()
    assert "log replayed           1 entries, 2 writes" in info, info
    with open(tmp_path / "l.vhdx", "rb") as src:
        out = tool("cat", "-", stdin=src).stdout
    assert out == (tmp_path / "l.raw").read_bytes()
    r = tool("check", tmp_path / "lb.vhdx", expect=1)
    assert b"qemu-img check -r all" in r.stderr, r.stderr
