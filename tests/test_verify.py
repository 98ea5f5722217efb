"""nbdferry-verify: digests of a source and an NBD export (or a file).

Every test starts real nbdkit servers and checks real bytes: expected digests
come from Python's hashlib over the data the test wrote, mismatch ranges from
the offsets the test corrupted.  Helpers live here (tests/conftest.py belongs
to the mount tests); servers are always terminated, also when a test fails.

Run: /usr/bin/python3 -m pytest tests/test_verify.py
Binary: $NBDFERRY_VERIFY, else $NBDFERRY_BUILD/tools/nbdferry-verify
(NBDFERRY_BUILD defaults to /work/main/build).
"""

import hashlib
import json
import os
import random
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

BUILD = Path(os.environ.get("NBDFERRY_BUILD", "/work/main/build"))
# $NBDFERRY_VERIFY, else the CMake tree's tools/ (or its top, for a build of
# the tool alone).
VERIFY = Path(os.environ.get("NBDFERRY_VERIFY") or next(
    (p for p in (BUILD / "tools" / "nbdferry-verify", BUILD / "nbdferry-verify")
     if p.exists()), BUILD / "tools" / "nbdferry-verify"))
MiB = 1 << 20

pytestmark = pytest.mark.skipif(
    not (shutil.which("nbdkit") and shutil.which("nbdcopy")),
    reason="needs nbdkit and nbdcopy")


# ---------------------------------------------------------------- helpers

def verify(*args, timeout=120):
    """Run nbdferry-verify; returns CompletedProcess (text)."""
    if not VERIFY.exists():
        pytest.fail(f"{VERIFY} not built (set NBDFERRY_BUILD)")
    return subprocess.run([str(VERIFY), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)


def verify_json(*args):
    p = verify("--json", *args)
    assert p.returncode in (0, 1), p.stderr
    assert p.stderr == ""
    return p.returncode, json.loads(p.stdout)


def assert_one_error_line(p):
    """Exit 2, nothing on stdout, exactly one line on stderr."""
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert p.stdout == ""
    lines = p.stderr.splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("nbdferry-verify: ")
    return lines[0]


def digest(data, alg="sha256"):
    return hashlib.new(alg, data).hexdigest()


def write_sparse(path, size, runs):
    """A sparse file of `size` bytes with data runs [(offset, bytes)].
    Returns its full content."""
    content = bytearray(size)
    with open(path, "wb") as f:
        f.truncate(size)
        for off, data in runs:
            os.pwrite(f.fileno(), data, off)
            content[off:off + len(data)] = data
    return bytes(content)


def scattered_runs(size, count, rng, min_len=1, max_len=3 * MiB):
    """Non-overlapping data runs at arbitrary (unaligned) offsets."""
    runs, taken = [], []
    while len(runs) < count:
        ln = rng.randrange(min_len, max_len)
        off = rng.randrange(0, size - ln)
        if any(off < e and s < off + ln for s, e in taken):
            continue
        taken.append((off, off + ln))
        runs.append((off, rng.randbytes(ln)))
    return runs


def json_ranges(report):
    return [(r["offset"], r["length"]) for r in report["mismatch_ranges"]]


@pytest.fixture
def kits():
    """Factory: kits.start(plugin args..., filters=[...]) -> server with
    .uri, .sock, .log.  Every server started is terminated at teardown."""
    procs = []
    sockdir = tempfile.mkdtemp(prefix="nv", dir="/tmp")  # short for sun_path

    def start(*args, filters=(), log=False):
        n = len(procs)
        sock = os.path.join(sockdir, f"s{n}")
        pid = os.path.join(sockdir, f"p{n}")
        logf = os.path.join(sockdir, f"log{n}")
        cmd = ["nbdkit", "--exit-with-parent", "-U", sock, "-P", pid]
        if log:
            cmd.append("--filter=log")              # outermost: sees requests
        cmd += [f"--filter={f}" for f in filters] + [str(a) for a in args]
        if log:
            cmd.append(f"logfile={logf}")
        proc = subprocess.Popen(cmd, stderr=subprocess.PIPE)
        procs.append(proc)
        deadline = time.monotonic() + 30
        while not os.path.exists(pid):
            if proc.poll() is not None:
                pytest.fail(f"nbdkit exited: {proc.stderr.read().decode()}")
            if time.monotonic() > deadline:
                pytest.fail("nbdkit did not write its pidfile")
            time.sleep(0.01)
        return SimpleNamespace(uri=f"nbd+unix:///?socket={sock}", sock=sock,
                               log=logf, proc=proc)

    def memory_with(path, size=None):
        """nbdkit memory of the file's size (or `size`), loaded with nbdcopy
        (holes are not written, so the export stays sparse)."""
        size = os.path.getsize(path) if size is None else size
        kit = start("memory", f"size={size}")
        subprocess.run(["nbdcopy", str(path), kit.uri], check=True)
        return kit

    try:
        yield SimpleNamespace(start=start, memory_with=memory_with)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(sockdir, ignore_errors=True)


# ---------------------------------------------------------------- matches

def test_verify_dense_odd_size_matches(tmp_path, kits):
    size = 5 * MiB + 12345                        # not a block multiple
    data = random.Random(1).randbytes(size)
    src = tmp_path / "src.img"
    src.write_bytes(data)
    kit = kits.memory_with(src)

    p = verify(src, kit.uri)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stderr == ""
    assert re.search(r"^result\s+MATCH$", p.stdout, re.M)
    assert p.stdout.count(digest(data)) == 2
    assert re.search(rf"^compared\s+{size} bytes", p.stdout, re.M)


def test_verify_sparse_unaligned_runs_match(tmp_path, kits):
    size = 64 * MiB + 777
    runs = scattered_runs(size, 40, random.Random(2))
    runs.append((size - 100, b"\x5a" * 100))      # data in the last bytes
    src = tmp_path / "src.img"
    data = write_sparse(src, size, runs)
    kit = kits.memory_with(src)

    rc, rep = verify_json(src, kit.uri)
    assert rc == 0 and rep["result"] == "match"
    for side in ("source", "destination"):
        assert rep[side]["digest"] == digest(data)
        assert rep[side]["bytes_read"] + rep[side]["bytes_zero"] == size
        assert rep[side]["bytes_zero"] > size // 4  # holes were not read
    assert rep["compared_bytes"] == size
    assert rep["mismatch_ranges"] == []


def test_verify_empty_export_matches(tmp_path, kits):
    src = tmp_path / "empty.img"
    src.write_bytes(b"")
    kit = kits.start("memory", "size=0")
    rc, rep = verify_json(src, kit.uri)
    assert rc == 0
    assert rep["destination"]["digest"] == digest(b"")


def test_verify_all_zero_export_matches_without_reading(tmp_path, kits):
    size = 32 * MiB
    src = tmp_path / "zero.img"
    with open(src, "wb") as f:
        f.truncate(size)
    kit = kits.start("memory", f"size={size}")
    rc, rep = verify_json(src, kit.uri)
    assert rc == 0
    assert rep["destination"]["digest"] == digest(bytes(size))
    assert rep["destination"]["bytes_read"] == 0
    assert rep["source"]["bytes_read"] == 0


# ---------------------------------------------------------------- mismatches

@pytest.fixture
def export_256m(tmp_path, kits):
    """256 MiB sparse source (25% data) and a file-plugin export holding a
    copy of it, so a test can change single bytes on the export side."""
    size = 256 * MiB
    rng = random.Random(3)
    runs = [(i * 4 * MiB + rng.randrange(0, 3 * MiB), rng.randbytes(MiB))
            for i in range(64)]
    src = tmp_path / "src.img"
    data = write_sparse(src, size, runs)
    disk = tmp_path / "disk.img"
    with open(disk, "wb") as f:
        f.truncate(size)
    kit = kits.start("file", disk)
    subprocess.run(["nbdcopy", str(src), kit.uri], check=True)
    return SimpleNamespace(src=src, disk=disk, data=data, uri=kit.uri,
                           size=size, runs=runs)


def poke(path, offset, byte):
    with open(path, "r+b") as f:
        os.pwrite(f.fileno(), bytes([byte]), offset)


def test_verify_single_flipped_byte_in_256m_export_is_located(export_256m):
    e = export_256m
    assert verify(e.src, e.uri).returncode == 0   # the copy is good
    off = e.runs[37][0] + 123457                  # inside a data run
    poke(e.disk, off, e.data[off] ^ 0x01)

    p = verify(e.src, e.uri)
    assert p.returncode == 1, p.stdout + p.stderr
    block = off // MiB * MiB
    assert re.search(r"^result\s+MISMATCH$", p.stdout, re.M)
    assert re.findall(r"^differ\s+offset (\d+) length (\d+)$", p.stdout,
                      re.M) == [(str(block), str(MiB))]

    rc, rep = verify_json("--block-size", "4K", e.src, e.uri)
    assert rc == 1
    assert json_ranges(rep) == [(off // 4096 * 4096, 4096)]
    assert rep["source"]["digest"] == digest(e.data)
    flipped = bytearray(e.data)
    flipped[off] ^= 0x01
    assert rep["destination"]["digest"] == digest(flipped)


def test_verify_byte_in_a_source_hole_is_located(export_256m):
    e = export_256m
    off = e.size - 3                              # a hole in the source
    assert e.data[off] == 0
    poke(e.disk, off, 0xFF)
    rc, rep = verify_json("--block-size", "64K", e.src, e.uri)
    assert rc == 1
    last = (e.size - 1) // 65536 * 65536
    assert json_ranges(rep) == [(last, e.size - last)]


def test_verify_ranges_are_merged_and_limited(export_256m):
    e = export_256m
    # three adjacent blocks (one range) and four separate ones
    for off in (10 * MiB + 5, 11 * MiB + 5, 12 * MiB + 5,
                50 * MiB, 70 * MiB, 90 * MiB, 110 * MiB):
        poke(e.disk, off, e.data[off] ^ 0x80)
    rc, rep = verify_json("--max-ranges", "3", e.src, e.uri)
    assert rc == 1
    assert json_ranges(rep) == [(10 * MiB, 3 * MiB), (50 * MiB, MiB),
                                (70 * MiB, MiB)]
    assert rep["mismatch_ranges_total"] == 5
    assert rep["mismatch_bytes"] == 7 * MiB
    p = verify("--max-ranges", "0", e.src, e.uri)
    assert len(re.findall(r"^differ\s+offset", p.stdout, re.M)) == 5


def swap(path, a, b, n):
    with open(path, "r+b") as f:
        sa, sb = os.pread(f.fileno(), n, a), os.pread(f.fileno(), n, b)
        assert sa != sb
        os.pwrite(f.fileno(), sb, a)
        os.pwrite(f.fileno(), sa, b)


@pytest.mark.parametrize("dist,n", [(512, 512), (8, 8), (8192, 4096),
                                    (3 * 8192 + 8, 8)])
def test_verify_swapped_data_within_a_block_is_located(export_256m, dist, n):
    """Same bytes, wrong places (what a buffer reused too early produces):
    sectors, words, pages, inside one block."""
    e = export_256m
    r = e.runs[5][0]                              # 1 MiB of data at r
    a = (r + 8191) // 8192 * 8192 + 8192
    if (a + 65536) // MiB != a // MiB:            # keep it inside one block
        a = (a // MiB + 1) * MiB + 8192
    assert r <= a and a + 65536 <= r + MiB
    swap(e.disk, a, a + dist, n)
    rc, rep = verify_json(e.src, e.uri)
    assert rc == 1
    assert json_ranges(rep) == [(a // MiB * MiB, MiB)]


def test_verify_misplaced_block_is_located(export_256m):
    """Block N+1's bytes written at block N's offset."""
    e = export_256m
    n = e.runs[9][0] // MiB
    with open(e.disk, "r+b") as f:
        nxt = os.pread(f.fileno(), MiB, (n + 1) * MiB)
        assert nxt != os.pread(f.fileno(), MiB, n * MiB)
        os.pwrite(f.fileno(), nxt, n * MiB)
    rc, rep = verify_json(e.src, e.uri)
    assert rc == 1
    assert json_ranges(rep) == [(n * MiB, MiB)]


# ---------------------------------------------------------------- digests

@pytest.mark.parametrize("alg", ["md5", "sha1", "sha256", "sha512"])
def test_verify_digest_options_agree_with_hashlib(tmp_path, kits, alg):
    size = 3 * MiB + 511
    runs = scattered_runs(size, 6, random.Random(4), max_len=300000)
    src = tmp_path / "src.img"
    data = write_sparse(src, size, runs)
    kit = kits.memory_with(src)
    want = digest(data, alg)

    p = verify("--digest", alg, src, kit.uri)
    assert p.returncode == 0, p.stderr
    assert re.search(rf"^source\s+{alg} {want}$", p.stdout, re.M)
    assert re.search(rf"^destination\s+{alg} {want}$", p.stdout, re.M)
    # one operand: sha256sum's format, for a file and for an export
    for operand in (src, kit.uri):
        p = verify("-d", alg, operand)
        assert p.returncode == 0 and p.stdout == f"{want}  {operand}\n"


def test_verify_default_digest_is_sha256(tmp_path):
    src = tmp_path / "a"
    src.write_bytes(b"hello\n")
    p = verify(src)
    assert p.stdout.split()[0] == hashlib.sha256(b"hello\n").hexdigest()


# ---------------------------------------------------------------- paths

def test_verify_file_destination(tmp_path):
    size = 20 * MiB + 3
    runs = scattered_runs(size, 10, random.Random(5), max_len=MiB)
    src, dst = tmp_path / "src.img", tmp_path / "dst.img"
    data = write_sparse(src, size, runs)
    dst.write_bytes(data)                         # dense copy of sparse src
    rc, rep = verify_json(src, dst)
    assert rc == 0
    assert rep["destination"]["kind"] == "file"
    assert rep["destination"]["digest"] == digest(data)
    assert rep["destination"]["bytes_zero"] == 0  # it has no holes
    poke(dst, 17 * MiB + 9, data[17 * MiB + 9] ^ 4)
    rc, rep = verify_json(src, dst)
    assert rc == 1 and json_ranges(rep) == [(17 * MiB, MiB)]


def test_verify_nbd_as_source_and_destination(tmp_path, kits):
    size = 6 * MiB
    data = random.Random(6).randbytes(size)
    src = tmp_path / "src.img"
    src.write_bytes(data)
    a, b = kits.memory_with(src), kits.memory_with(src)
    rc, rep = verify_json(a.uri, b.uri)
    assert rc == 0 and rep["source"]["digest"] == digest(data)


# ---------------------------------------------------------------- sizes

@pytest.fixture
def two_sizes(tmp_path, kits):
    """A 4 MiB + 100 source and an 8 MiB export holding it, zero tail."""
    data = random.Random(7).randbytes(4 * MiB + 100)
    src = tmp_path / "src.img"
    src.write_bytes(data)
    kit = kits.start("memory", f"size={8 * MiB}")
    subprocess.run(["nbdcopy", str(src), kit.uri], check=True)
    return SimpleNamespace(src=src, data=data, uri=kit.uri)


def test_verify_size_difference_is_a_mismatch_by_default(two_sizes):
    t = two_sizes
    rc, rep = verify_json(t.src, t.uri)
    assert rc == 1
    assert "sizes differ" in rep["size_problem"]
    assert rep["source"]["digest"] is None        # nothing was read
    p = verify(t.src, t.uri)
    assert p.returncode == 1
    assert re.search(r"^result\s+MISMATCH: sizes differ", p.stdout, re.M)


def test_verify_zero_tail_accepts_larger_zero_destination(two_sizes):
    t = two_sizes
    rc, rep = verify_json("--zero-tail", t.src, t.uri)
    assert rc == 0
    assert rep["compared_bytes"] == len(t.data)
    assert rep["destination"]["digest"] == digest(t.data)
    assert rep["tail_nonzero_offset"] is None


def test_verify_zero_tail_rejects_data_in_the_tail(tmp_path, kits, two_sizes):
    t = two_sizes
    tail_off = 6 * MiB + 4097
    dst = tmp_path / "dst.img"
    write_sparse(dst, 8 * MiB, [(0, t.data), (tail_off, b"\x01")])
    kit = kits.memory_with(dst)
    rc, rep = verify_json("--zero-tail", t.src, kit.uri)
    assert rc == 1
    assert rep["tail_nonzero_offset"] == tail_off
    assert rep["destination"]["digest"] == digest(t.data)  # prefix still ok
    assert rep["mismatch_ranges"] == []
    p = verify("--zero-tail", t.src, kit.uri)
    assert re.search(rf"^tail\s+not zero: destination byte {tail_off} ", p.stdout, re.M)


def test_verify_zero_tail_rejects_smaller_destination(tmp_path, kits, two_sizes):
    t = two_sizes
    small = kits.start("memory", f"size={MiB}")
    rc, rep = verify_json("--zero-tail", t.src, small.uri)
    assert rc == 1 and "smaller" in rep["size_problem"]


def test_verify_size_compares_a_prefix(two_sizes):
    t = two_sizes
    n = 3 * MiB + 5
    rc, rep = verify_json("--size", n, t.src, t.uri)
    assert rc == 0 and rep["compared_bytes"] == n
    assert rep["source"]["digest"] == digest(t.data[:n])
    # longer than the source: a mismatch, named
    rc, rep = verify_json("--size", "5M", t.src, t.uri)
    assert rc == 1 and "source has" in rep["size_problem"]


def test_verify_size_and_zero_tail_together_is_an_error(two_sizes):
    assert_one_error_line(verify("--size", "1M", "--zero-tail",
                                 two_sizes.src, two_sizes.uri))


# ---------------------------------------------------------------- errors

def test_verify_unreachable_server_is_one_line_exit_2(tmp_path):
    line = assert_one_error_line(
        verify(tmp_path / "x", "nbd+unix:///?socket=/nonexistent/sock"))
    # the source does not exist either: the first failure is reported
    assert "x" in line
    src = tmp_path / "src.img"
    src.write_bytes(b"x" * 4096)
    line = assert_one_error_line(
        verify(src, "nbd+unix:///?socket=/nonexistent/sock"))
    assert "nonexistent" in line
    with socket.socket() as s:                    # a closed TCP port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert_one_error_line(verify(src, f"nbd://127.0.0.1:{port}"))


def test_verify_read_error_is_one_line_exit_2(tmp_path, kits):
    data = random.Random(8).randbytes(8 * MiB)
    src = tmp_path / "src.img"
    src.write_bytes(data)
    good = kits.memory_with(src)
    bad = kits.start("nbd", f"socket={good.sock}", "error-pread=EIO",
                     "error-pread-rate=100%", filters=["error"])
    line = assert_one_error_line(verify(src, bad.uri))
    assert "read" in line


def test_verify_unreadable_source_is_one_line_exit_2(tmp_path, kits):
    kit = kits.start("memory", "size=1M")
    assert_one_error_line(verify(tmp_path / "missing.img", kit.uri))
    assert_one_error_line(verify(tmp_path, kit.uri))      # a directory


@pytest.mark.parametrize("args", [
    [], ["a", "b", "c"], ["--digest", "sha3", "a", "b"], ["--digest"],
    ["--bogus", "a", "b"], ["-x", "a", "b"], ["--block-size", "1000", "a", "b"],
    ["--size", "12Q", "a", "b"], ["--requests", "0", "a", "b"],
    ["--size", "-1", "a", "b"],
])
def test_verify_bad_options_exit_2(args):
    assert_one_error_line(verify(*args))


def test_verify_help_and_version():
    p = verify("--help")
    assert p.returncode == 0 and p.stdout.startswith("Usage: nbdferry-verify")
    for opt in ("--digest", "--size", "--zero-tail", "--block-size",
                "--max-ranges", "--json", "--quiet", "--raw", "--no-extents",
                "--requests", "--request-size", "--connections"):
        assert opt in p.stdout
    p = verify("--version")
    assert p.returncode == 0 and p.stdout.startswith("nbdferry-verify ")


def test_verify_help_matches_man_page():
    man = Path(__file__).resolve().parent.parent / "docs" / "nbdferry-verify.1"
    text = man.read_text()
    for opt in re.findall(r"--[a-z][a-z-]+", verify("--help").stdout):
        assert opt.replace("-", r"\-") in text, f"{opt} missing from man page"


def test_verify_quiet_prints_nothing(two_sizes):
    p = verify("-q", "--zero-tail", two_sizes.src, two_sizes.uri)
    assert p.returncode == 0 and p.stdout == "" and p.stderr == ""


# ---------------------------------------------------------------- reading

def read_depth(logfile):
    """Most NBD reads in flight at once, from nbdkit's log filter."""
    depth = peak = 0
    for line in Path(logfile).read_text().splitlines():
        if re.search(r" Read id=\d+ offset=", line):
            depth += 1
            peak = max(peak, depth)
        elif re.search(r"\.\.\.Read id=\d+", line):
            depth -= 1
    return peak


def test_verify_reads_are_pipelined_and_holes_skipped(tmp_path, kits):
    """16 reads of 1 MiB, each held 250 ms by the server: a pipelined client
    has them all submitted long before the first reply, however slow or
    loaded the machine is; a serial one would show depth 1."""
    size = 32 * MiB
    src = tmp_path / "src.img"
    data = write_sparse(src, size, [(0, random.Random(9).randbytes(16 * MiB))])
    mem = kits.memory_with(src)
    slow = kits.start("nbd", f"socket={mem.sock}", "rdelay=250ms",
                      filters=["delay"], log=True)
    rc, rep = verify_json("--request-size", "1M", src, slow.uri)
    assert rc == 0 and rep["destination"]["digest"] == digest(data)
    assert read_depth(slow.log) >= 8       # nbdkit serves 16 at a time
    log = Path(slow.log).read_text()
    # only the data half was transferred: no read beyond 16 MiB
    offsets = [int(m, 16) for m in re.findall(r" Read id=\d+ offset=(0x[0-9a-f]+)", log)]
    assert offsets and max(offsets) < 16 * MiB


def test_verify_no_extents_reads_everything(tmp_path, kits):
    size = 16 * MiB
    src = tmp_path / "src.img"
    data = write_sparse(src, size, [(5 * MiB, b"abc" * 1000)])
    kit = kits.memory_with(src)
    rc, rep = verify_json("--no-extents", src, kit.uri)
    assert rc == 0 and rep["destination"]["digest"] == digest(data)
    assert rep["destination"]["bytes_read"] == size
    assert rep["source"]["bytes_read"] == size


def test_verify_server_without_block_status(tmp_path, kits):
    size = 16 * MiB + 1
    src = tmp_path / "src.img"
    data = write_sparse(src, size, scattered_runs(size, 5, random.Random(10),
                                                  max_len=MiB))
    mem = kits.memory_with(src)
    plain = kits.start("nbd", f"socket={mem.sock}", filters=["noextents"])
    rc, rep = verify_json(src, plain.uri)
    assert rc == 0 and rep["destination"]["digest"] == digest(data)
    assert rep["destination"]["bytes_zero"] == 0


def test_verify_many_small_extents(tmp_path, kits):
    """Alternating 4 KiB .. 192 KiB data and holes: thousands of extents,
    small holes read as data, large ones skipped, all in order."""
    size = 48 * MiB
    rng = random.Random(11)
    runs, off = [], 0
    while off < size - 256 * 1024:
        ln = rng.randrange(1, 48) * 4096
        runs.append((off, rng.randbytes(ln)))
        off += ln + rng.randrange(1, 48) * 4096
    src = tmp_path / "src.img"
    data = write_sparse(src, size, runs)
    kit = kits.memory_with(src)
    for extra in ([], ["--requests", "3", "--request-size", "64K"]):
        rc, rep = verify_json(*extra, src, kit.uri)
        assert rc == 0, extra
        assert rep["destination"]["digest"] == digest(data)


def test_verify_multi_conn(tmp_path, kits):
    size = 24 * MiB
    src = tmp_path / "src.img"
    data = write_sparse(src, size, scattered_runs(size, 12, random.Random(12)))
    kit = kits.memory_with(src)
    slow = kits.start("nbd", f"socket={kit.sock}", "rdelay=5ms",
                      filters=["delay"], log=True)
    rc, rep = verify_json("--connections", "4", src, slow.uri)
    assert rc == 0 and rep["destination"]["digest"] == digest(data)
    conns = set(re.findall(r"connection=(\d+) Read", Path(slow.log).read_text()))
    assert len(conns) == 4


# ---------------------------------------------------------------- VHD

def test_verify_vhd_source_is_refused_until_decoding_exists(tmp_path, kits):
    img = bytearray(random.Random(13).randbytes(MiB))
    img[-512:-504] = b"conectix"                  # a fixed VHD's footer
    src = tmp_path / "disk.vhd"
    src.write_bytes(bytes(img))
    kit = kits.memory_with(src)
    line = assert_one_error_line(verify(src, kit.uri))
    assert "VHD" in line and "--raw" in line
    rc, rep = verify_json("--raw", src, kit.uri)  # the container as bytes
    assert rc == 0 and rep["source"]["digest"] == digest(bytes(img))
