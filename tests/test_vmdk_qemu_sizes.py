"""qemu-img's streamOptimized files at many sizes, and where a stream ends.

qemu-img (block/vmdk.c) writes no end-of-stream marker and no footer: it
fills the grain tables it preallocated in the overhead and truncates the
file to a sector after the last grain.  When that grain compresses well, a
zero sector follows it (qemu zero-fills each new 64 KiB cluster before it
writes the compressed grain over it) and looks like an end-of-stream
marker; when it does not (random data), the file simply ends.  Both kinds
must land: a sweep of sizes (every MiB 1..12 and odd sizes, random and
compressible data) is copied with cp into nbd.vmdk on a real nbdkit memory
export filled with random bytes, and the export's sha256 must equal the
raw source followed by zeros; nbdferry-vmdk cat must decode the same bytes
from the file and from a pipe.

A stream that really stops short must still fail: qemu-img's files and
python3-vmdkstream's (footer, GD_AT_END) cut inside the header, at grain
boundaries, inside the last grain, its padding, the footer and the
end-of-stream marker fail the copy with EINVAL at close, the daemon logs
why, and the status file reports the failure to a monitor.

Run: /usr/bin/python3 -m pytest tests/test_vmdk_qemu_sizes.py
"""

import json
import random
import shutil
import struct
import subprocess

import pytest

from lib.content import assert_content
from lib.digest import sha256_file
from lib.env import BUILD, MiB
from lib.nbd import fill_random
from lib.procs import run

TOOL = BUILD / "tools" / "nbdferry-vmdk"
GRAIN = 64 * 1024
EXPORT = 13 * MiB

for t in ("qemu-img",):
    if not shutil.which(t):
        raise RuntimeError(f"{t} missing (scripts/install-deps)")
if not TOOL.exists():
    raise RuntimeError(f"{TOOL} not built")
if run(["/usr/bin/python3", "-c", "import VMDKstream"]).returncode != 0:
    raise RuntimeError("python3-vmdkstream missing (scripts/install-deps)")


def compressible(rnd, n):
    """Text-like bytes that deflate well, with some all-zero grains."""
    words = [rnd.randbytes(rnd.randrange(2, 9)).hex().encode()
             for _ in range(200)]
    out = bytearray()
    while len(out) < n:
        if rnd.random() < 0.1:
            out += bytes(GRAIN)
        else:
            out += b" ".join(rnd.choice(words) for _ in range(64)) + b"\n"
    return bytes(out[:n])


# name -> (size, kind)
SIZES = {f"random-{n}M": (n * MiB, "random") for n in range(1, 13)}
SIZES.update({
    "random-64K": (GRAIN, "random"),
    "random-64K+512": (GRAIN + 512, "random"),
    "random-1M+512": (MiB + 512, "random"),
    "random-5M-512": (5 * MiB - 512, "random"),
    "random-3M+12800": (3 * MiB + 12800, "random"),
    "random-7M+1024": (7 * MiB + 1024, "random"),
    "text-1M": (MiB, "text"),
    "text-5M": (5 * MiB, "text"),
    "text-6M+4608": (6 * MiB + 4608, "text"),
    "mixed-5M": (5 * MiB, "mixed"),       # text, last grain random
    "mixed-6M": (6 * MiB, "mixed2"),      # random, last grain text
    "zeros-2M": (2 * MiB, "zeros"),       # no grain at all
})


def run_stdin(args, path):
    """Run args with the file at path as standard input (a pipe-like,
    unseekable read is what cat - does with it anyway)."""
    with open(path, "rb") as f:
        return subprocess.run([str(a) for a in args], stdin=f,
                              capture_output=True, text=True, timeout=300)


def make_raw(path, size, kind, seed):
    rnd = random.Random(seed)
    if kind == "random":
        data = rnd.randbytes(size)
    elif kind == "text":
        data = compressible(rnd, size)
    elif kind == "mixed":
        data = compressible(rnd, size - GRAIN) + rnd.randbytes(GRAIN)
    elif kind == "mixed2":
        data = rnd.randbytes(size - GRAIN) + compressible(rnd, GRAIN)
    else:
        data = bytes(size)
    path.write_bytes(data)
    return path


def qemu_stream(raw, dst):
    r = run(["qemu-img", "convert", "-q", "-f", "raw", "-O", "vmdk", "-o",
             "subformat=streamOptimized", str(raw), str(dst)])
    assert r.returncode == 0, r.stderr
    return dst


def vmdkstream(raw, dst):
    r = run(["/usr/bin/python3", "-c",
             "import sys, VMDKstream; "
             "VMDKstream.convert_to_stream(sys.argv[1], sys.argv[2])",
             str(raw), str(dst)])
    assert r.returncode == 0, r.stderr
    return dst


def walk(data):
    """(markers, end): markers are (offset, kind, length) for each grain
    ('grain') or metadata marker ('eos', 'gt', 'gd', 'footer') after the
    overhead; end is the offset after the EOS marker, or where the walk
    ran out of file."""
    overhead = struct.unpack_from("<Q", data, 64)[0] * 512
    pos, markers = overhead, []
    while pos + 16 <= len(data):
        lba, size = struct.unpack_from("<QI", data, pos)
        if size:
            n = -(-(12 + size) // 512) * 512
            markers.append((pos, "grain", n))
        else:
            typ = struct.unpack_from("<I", data, pos + 12)[0]
            name = {0: "eos", 1: "gt", 2: "gd", 3: "footer"}[typ]
            n = 512 + lba * 512
            markers.append((pos, name, n))
            if typ == 0:
                return markers, pos + 512
        pos += n
    return markers, pos


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("vmdk-sizes")
    out = {}
    for i, (name, (size, kind)) in enumerate(sorted(SIZES.items())):
        raw = make_raw(d / f"{name}.raw", size, kind, seed=i + 1)
        out[name] = (raw, qemu_stream(raw, d / f"{name}.vmdk"))
    return d, out


def test_sweep_has_files_without_eos(files):
    """The sweep covers both endings: files that stop right after a grain
    (random data) and files whose last grain leaves zero sectors."""
    _, out = files
    no_eos = [n for n, (_, v) in out.items()
              if not any(k == "eos" for _, k, _ in walk(v.read_bytes())[0])]
    assert "random-5M" in no_eos and "random-6M" in no_eos, no_eos
    assert "text-5M" not in no_eos, no_eos
    for name, (_, v) in out.items():
        data = v.read_bytes()
        assert not any(k in ("footer", "gd", "gt")
                       for _, k, _ in walk(data)[0]), name
        assert struct.unpack_from("<Q", data, 56)[0] != 2**64 - 1, name


def status_errors(m):
    """Error messages the live status file reports to a monitor."""
    st = json.loads((m.mp / ".nbdferry-status").read_bytes())
    return [f.get("message", "") for f in st["failures"]
            if f["kind"] == "error"]


@pytest.mark.parametrize("name", sorted(SIZES))
def test_qemu_stream_lands(server, mount, files, name):
    _, out = files
    raw, vmdk = out[name]
    srv = server("memory", f"size={EXPORT}")
    fill_random(srv.uri, EXPORT)
    m = mount(srv)
    r = run(["cp", str(vmdk), str(m.mp / "nbd.vmdk")], timeout=300)
    assert r.returncode == 0, (r.stderr, m.stderr[-2000:])
    size = SIZES[name][0]
    assert_content(raw, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=size, what=name)


@pytest.mark.parametrize("name", sorted(SIZES))
def test_tool_decodes(files, tmp_path, name):
    _, out = files
    raw, vmdk = out[name]
    r = run([str(TOOL), "check", str(vmdk)])
    assert r.returncode == 0, r.stderr
    assert "tables: agree" in r.stdout, r.stdout
    dec = tmp_path / "dec.raw"
    r = run([str(TOOL), "cat", str(vmdk), "-o", str(dec)])
    assert r.returncode == 0, r.stderr
    assert sha256_file(dec) == sha256_file(raw)
    r = run_stdin([TOOL, "cat", "-", "-o", dec], vmdk)
    assert r.returncode == 0, r.stderr
    assert sha256_file(dec) == sha256_file(raw)


# ---- truncation ----------------------------------------------------------

def cuts_for(data):
    """name -> length: where to cut a stream so that it really stops short."""
    markers, end = walk(data)
    grains = [(o, n) for o, k, n in markers if k == "grain"]
    overhead = markers[0][0]
    first, last = grains[0], grains[-1]
    cuts = {
        "header": 300,
        "overhead-end": overhead,
        "after-first-grain": first[0] + first[1],
        "before-last-grain": last[0],
        "inside-last-grain": last[0] + 700,
        "last-grain-end-minus-1": last[0] + last[1] - 1,
        "last-grain-marker": last[0] + 6,
    }
    for o, k, n in markers:
        if k == "footer":
            cuts["inside-footer"] = o + 512 + 100
            cuts["after-footer-marker"] = o + 512
        if k == "eos":
            cuts["inside-eos"] = o + 100
            cuts["before-eos"] = o
        if k == "gd":
            cuts["inside-gd"] = o + 512 + 4
    return cuts


def cut_cases():
    cases = []
    for src in ("qemu-random-5M", "qemu-text-5M", "vmdkstream-3M"):
        for c in ("header", "overhead-end", "after-first-grain",
                  "before-last-grain", "inside-last-grain",
                  "last-grain-end-minus-1", "last-grain-marker"):
            cases.append((src, c))
    cases += [("vmdkstream-3M", c) for c in
              ("inside-footer", "after-footer-marker", "inside-eos",
               "before-eos", "inside-gd")]
    return cases


@pytest.fixture(scope="module")
def cut_sources(files):
    d, out = files
    raw = make_raw(d / "vs.raw", 3 * MiB + 12800, "random", seed=99)
    return {
        "qemu-random-5M": out["random-5M"][1],
        "qemu-text-5M": out["text-5M"][1],
        "vmdkstream-3M": vmdkstream(raw, d / "vs.vmdk"),
    }


@pytest.mark.parametrize("src,cut", cut_cases())
def test_tool_refuses_cut(cut_sources, tmp_path, src, cut):
    data = cut_sources[src].read_bytes()
    n = cuts_for(data)[cut]
    bad = tmp_path / "cut.vmdk"
    bad.write_bytes(data[:n])
    for stdin in (None, bad):
        args = [str(TOOL), "cat", "-" if stdin else str(bad),
                "-o", str(tmp_path / "o.raw")]
        r = run_stdin(args, stdin) if stdin else run(args)
        assert r.returncode == 1, (cut, n, r.stderr)
        assert "ended" in r.stderr, r.stderr


@pytest.mark.parametrize("src,cut", [
    ("qemu-random-5M", "before-last-grain"),
    ("qemu-random-5M", "inside-last-grain"),
    ("qemu-random-5M", "last-grain-end-minus-1"),
    ("qemu-text-5M", "after-first-grain"),
    ("vmdkstream-3M", "inside-footer"),
    ("vmdkstream-3M", "before-eos"),
])
def test_cut_fails_at_close(server, mount, cut_sources, tmp_path, src, cut):
    """The copy fails with EINVAL, the daemon says where the file ended,
    and the status file reports the failure to a monitor."""
    data = cut_sources[src].read_bytes()
    n = cuts_for(data)[cut]
    bad = tmp_path / "cut.vmdk"
    bad.write_bytes(data[:n])
    srv = server("memory", f"size={EXPORT}")
    fill_random(srv.uri, EXPORT)
    m = mount(srv, expect_errors=True)
    r = run(["cp", str(bad), str(m.mp / "nbd.vmdk")], timeout=300)
    assert r.returncode != 0, f"a VMDK cut at {n} ({cut}) was accepted"
    assert "Invalid argument" in r.stderr, r.stderr
    errs = [l for l in m.stderr.splitlines()
            if "nbd.vmdk:" in l and "ended" in l]
    assert len(errs) == 1, m.stderr
    reported = status_errors(m)
    assert any("nbd.vmdk" in e and "ended" in e for e in reported), reported


def test_whole_file_reports_no_error(server, mount, cut_sources):
    """The other side of the check above: a whole file reports no error."""
    srv = server("memory", f"size={EXPORT}")
    m = mount(srv)
    r = run(["cp", str(cut_sources["qemu-random-5M"]),
             str(m.mp / "nbd.vmdk")], timeout=300)
    assert r.returncode == 0, r.stderr
    assert status_errors(m) == []
