"""nbdferry-verify: digests of a source and an NBD export (or a file).

Every test starts real nbdkit servers and checks real bytes: expected digests
come from Python's hashlib over the data the test wrote, mismatch ranges from
the offsets the test corrupted.  Helpers live here (tests/lib/ belongs
to the mount tests); servers are always terminated, also when a test fails.

Run: /usr/bin/python3 -m pytest tests/test_verify.py
Binary: $NBDFERRY_VERIFY, else $NBDFERRY_BUILD/tools/nbdferry-verify
(NBDFERRY_BUILD defaults to build/ beside tests/).
"""

import hashlib
import json
import os
import random
import re
import shutil
import struct
import subprocess
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from lib.digest import blkhash_bytes, sha256_file
from lib.env import BUILD
from lib.images import random_bytes
from lib.procs import free_tcp_port

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

DIGEST_OPTS = ("-d", "--digest", "--blkhash")


def verify(*args, timeout=120, default=False):
    """Run nbdferry-verify; returns CompletedProcess (text).  The tests
    here compare with hashlib's sha256 unless they name a digest, so
    --digest=sha256 is added, unless one is named or default is true
    (nbdferry-verify's own default, blkhash)."""
    if not VERIFY.exists():
        pytest.fail(f"{VERIFY} not built (set NBDFERRY_BUILD)")
    named = any(str(a).split("=")[0] in DIGEST_OPTS for a in args)
    opts = [] if named or default else ["--digest=sha256"]
    return subprocess.run([str(VERIFY), *opts, *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


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
    base = tempfile.gettempdir()          # $TMPDIR, else /tmp
    if len(base) > 60:                    # short enough for sun_path
        base = "/tmp"
    sockdir = tempfile.mkdtemp(prefix="nv", dir=base)

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


def test_verify_default_digest_is_blkhash(tmp_path):
    """With no options: blkhash-sha256/64K, the value an nbdferry mount
    shows by default (and blksum prints)."""
    src = tmp_path / "a"
    src.write_bytes(b"hello\n")
    p = verify(src, default=True)
    assert p.stdout.split()[0] == blkhash_bytes(b"hello\n")
    p = verify(src, src, default=True)
    assert "blkhash-sha256/64K" in p.stdout, p.stdout


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


def test_verify_zero_tail_stop_leaves_the_server_alive(tmp_path, kits,
                                                      two_sizes):
    """A non-zero tail stops the run with reads still in flight (a tail of
    data, slow reads): the verifier reads their replies before closing, so
    Debian's nbdkit 1.32 (which aborts when a client closes while read
    replies are being sent) still serves afterwards."""
    t = two_sizes
    dst = tmp_path / "dst.img"
    dst.write_bytes(t.data + random_bytes(64 * MiB))
    kit = kits.start("file", dst, "rdelay=20ms", filters=["delay"])
    rc, rep = verify_json("--zero-tail", t.src, kit.uri)
    assert rc == 1
    assert rep["tail_nonzero_offset"] == len(t.data)
    time.sleep(1)                          # replies sent after the close
    assert kit.proc.poll() is None, kit.proc.stderr.read().decode()
    rc, rep = verify_json("--size", str(len(t.data)), t.src, kit.uri)
    assert rc == 0, rep                    # still serving, same bytes


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
    port = free_tcp_port()                        # a closed TCP port
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

def test_verify_vhd_malformed_footer_is_refused_with_raw_hint(tmp_path, kits):
    """Random bytes that end in a "conectix" cookie: routed to the VHD
    decoder, refused (the footer is garbage), and --raw hashes the file."""
    img = bytearray(random.Random(13).randbytes(MiB))
    img[-512:-504] = b"conectix"                  # a fixed VHD's footer
    src = tmp_path / "disk.vhd"
    src.write_bytes(bytes(img))
    kit = kits.memory_with(src)
    line = assert_one_error_line(verify(src, kit.uri))
    assert "VHD" in line and "--raw" in line
    rc, rep = verify_json("--raw", src, kit.uri)  # the container as bytes
    assert rc == 0 and rep["source"]["digest"] == digest(bytes(img))


# VHD fixtures made by other tools (tests/fixtures/vhd/README.md): each
# decodes to its .raw; the verifier must hash the VHD as that raw disk.
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "vhd"
VHD_SHA = {
    "qemu-dyn-10m.raw": "9ee0e52708d59b1a9b24edeef15e05bdb672eefca5d8282530ac7828d96d0558",
    "tap-diff-64m.raw": "5078c01df7148d118cd10b25b2e686eb05f336b684ebc84a4dc18df35a709c14",
    "tap-dyn-64m.raw": "fde1cce37ce5c6cc62462a9647f5b0ab8351afb97f46614020f304efca20700e",
    "tap-fixed-8m.raw": "136994e4eb8fe10f014ecdde33b3d85b8b09c21dda2d072f433bce9fc6e5c687",
    "vhdtool-raw-100m3s.raw": "e7869e441d63678750ce6e55f9a0a5af2d1564f4891f861cff4f92e0b8932f9e",
}
VHD_STANDALONE = ["tap-fixed-8m", "tap-dyn-64m", "qemu-dyn-10m",
                  "vhdtool-raw-100m3s"]
needs_qemu = pytest.mark.skipif(
    not (shutil.which("qemu-img") and shutil.which("qemu-io")),
    reason="needs qemu-img and qemu-io")


def vhd_fixture(name, dest_dir):
    """Decompress tests/fixtures/vhd/NAME.xz into dest_dir."""
    out = Path(dest_dir) / name
    with open(out, "wb") as f:
        subprocess.run(["xz", "-dc", FIXTURES / f"{name}.xz"], stdout=f,
                       check=True)
    return out


def xor_bytes(path, offset, n=1, mask=0xFF):
    with open(path, "r+b") as f:
        b = bytes(x ^ mask for x in os.pread(f.fileno(), n, offset))
        os.pwrite(f.fileno(), b, offset)


def assert_vhd_match(rep, raw_sha, size):
    assert rep["result"] == "match"
    assert rep["source"]["kind"] == "vhd"
    assert rep["source"]["size"] == size
    assert rep["source"]["digest"] == raw_sha
    assert rep["destination"]["digest"] == raw_sha


@pytest.mark.parametrize("name", VHD_STANDALONE)
def test_verify_vhd_fixture_matches_its_raw_export(tmp_path, kits, name):
    vhd = vhd_fixture(f"{name}.vhd", tmp_path)
    raw = vhd_fixture(f"{name}.raw", tmp_path)
    want = VHD_SHA[f"{name}.raw"]
    assert sha256_file(raw) == want, "fixture corrupt"
    size = os.path.getsize(raw)
    kit = kits.memory_with(raw)
    rc, rep = verify_json(vhd, kit.uri)
    assert rc == 0, rep
    assert_vhd_match(rep, want, size)
    src = rep["source"]
    assert src["bytes_read"] + src["bytes_zero"] == size
    if name != "tap-fixed-8m":
        # unallocated blocks and clear bitmap bits are never read; what is
        # read is at most the allocated blocks
        assert src["bytes_zero"] > 0
        assert src["bytes_read"] <= os.path.getsize(vhd)
    # digest mode, and --no-extents (holes read through the read path)
    p = verify(vhd)
    assert p.returncode == 0 and p.stdout == f"{want}  {vhd}\n", p.stderr
    rc, rep = verify_json("--no-extents", vhd, kit.uri)
    assert rc == 0 and rep["source"]["digest"] == want
    assert rep["source"]["bytes_read"] == size


def diff_chain(tmp_path, parent_dir=None):
    """tap-diff-64m.vhd in tmp_path/c, its parent tap-dyn-64m.vhd in
    parent_dir (default: beside it, where its locators point)."""
    cdir = tmp_path / "c"
    cdir.mkdir()
    child = vhd_fixture("tap-diff-64m.vhd", cdir)
    pdir = parent_dir or cdir
    pdir.mkdir(exist_ok=True)
    parent = vhd_fixture("tap-dyn-64m.vhd", pdir)
    raw = vhd_fixture("tap-diff-64m.raw", tmp_path)
    return SimpleNamespace(child=child, parent=parent, raw=raw,
                           sha=VHD_SHA["tap-diff-64m.raw"],
                           size=os.path.getsize(raw))


def test_verify_vhd_differencing_parent_through_locator(tmp_path, kits):
    c = diff_chain(tmp_path)
    kit = kits.memory_with(c.raw)
    rc, rep = verify_json(c.child, kit.uri)
    assert rc == 0, rep
    assert_vhd_match(rep, c.sha, c.size)
    assert rep["source"]["bytes_zero"] > 0          # holes in both levels
    rc, rep = verify_json("--no-extents", c.child, kit.uri)
    assert rc == 0 and rep["source"]["digest"] == c.sha


def test_verify_vhd_differencing_explicit_parent(tmp_path, kits):
    c = diff_chain(tmp_path, parent_dir=tmp_path / "elsewhere")
    kit = kits.memory_with(c.raw)
    line = assert_one_error_line(verify(c.child, kit.uri))
    assert "cannot find the parent" in line and "--parent" in line
    rc, rep = verify_json("--parent", c.parent, c.child, kit.uri)
    assert rc == 0, rep
    assert_vhd_match(rep, c.sha, c.size)
    # the vhd-tool delta of the same change, applied over the same parent
    delta = vhd_fixture("vhdtool-delta-64m.vhd", tmp_path)
    rc, rep = verify_json("--parent", c.parent, delta, kit.uri)
    assert rc == 0 and rep["source"]["digest"] == c.sha


def test_verify_vhd_differencing_parent_mistakes(tmp_path, kits):
    c = diff_chain(tmp_path)
    kit = kits.memory_with(c.raw)
    other = vhd_fixture("qemu-dyn-10m.vhd", tmp_path)
    line = assert_one_error_line(verify("--parent", other, c.child, kit.uri))
    assert "unique id" in line                      # not the child's parent
    line = assert_one_error_line(verify("--parent", c.parent, "--parent",
                                        other, c.child, kit.uri))
    assert "2 --parent" in line                     # the chain has 1 level
    line = assert_one_error_line(verify("--parent", c.parent, c.raw, kit.uri))
    assert "not a VHD" in line
    assert_one_error_line(verify("--raw", "--parent", c.parent, c.child,
                                 kit.uri))


def test_verify_vhd_flipped_byte_in_export_is_located(tmp_path, kits):
    vhd = vhd_fixture("tap-dyn-64m.vhd", tmp_path)
    raw = vhd_fixture("tap-dyn-64m.raw", tmp_path)
    data = raw.read_bytes()
    # one byte of written data, one byte in an unallocated block (a hole
    # of the VHD, never read on the source side)
    written = next(i for i, b in enumerate(data[8 * MiB:], 8 * MiB) if b) + 100
    hole = 50 * MiB + 777                      # block 25: not allocated
    assert data[hole] == 0 and any(data[written:written + 1])
    for off in (written, hole):
        xor_bytes(raw, off, mask=0x10)
        kit = kits.memory_with(raw)
        rc, rep = verify_json(vhd, kit.uri)
        assert rc == 1 and rep["result"] == "mismatch"
        assert rep["source"]["digest"] == VHD_SHA["tap-dyn-64m.raw"]
        assert json_ranges(rep) == [(off // MiB * MiB, MiB)]
        assert rep["mismatch_bytes"] == MiB
        p = verify(vhd, kit.uri)
        assert p.returncode == 1
        assert f"offset {off // MiB * MiB} length {MiB}" in p.stdout
        xor_bytes(raw, off, mask=0x10)


def test_verify_vhd_export_larger_than_virtual_size(tmp_path, kits):
    vhd = vhd_fixture("qemu-dyn-10m.vhd", tmp_path)
    raw = vhd_fixture("qemu-dyn-10m.raw", tmp_path)
    size = os.path.getsize(raw)
    kit = kits.memory_with(raw, size=size + 3 * MiB)
    rc, rep = verify_json(vhd, kit.uri)
    assert rc == 1 and "sizes differ" in rep["size_problem"]
    assert str(size) in rep["size_problem"]          # current_size compared
    rc, rep = verify_json("--zero-tail", vhd, kit.uri)
    assert rc == 0 and rep["compared_bytes"] == size
    assert rep["destination"]["digest"] == VHD_SHA["qemu-dyn-10m.raw"]
    rc, rep = verify_json("--size", "5M", vhd, kit.uri)
    assert rc == 0 and rep["source"]["digest"] == digest(raw.read_bytes()[:5 * MiB])


@needs_qemu
@pytest.mark.parametrize("subformat", ["dynamic", "fixed"])
def test_verify_vhd_made_by_qemu(tmp_path, kits, subformat):
    vhd = tmp_path / "q.vhd"
    subprocess.run(["qemu-img", "create", "-f", "vpc", "-o",
                    f"subformat={subformat}", str(vhd), "64M"],
                   check=True, capture_output=True)
    subprocess.run(["qemu-io", "-f", "vpc", "-c", "write -P 0x5a 3M 1M",
                    str(vhd)], check=True, capture_output=True)
    ref = tmp_path / "q.raw"
    subprocess.run(["qemu-img", "convert", "-f", "vpc", "-O", "raw", str(vhd),
                    str(ref)], check=True, capture_output=True)
    data = ref.read_bytes()
    assert data[3 * MiB:4 * MiB] == b"\x5a" * MiB
    kit = kits.memory_with(ref)
    rc, rep = verify_json(vhd, kit.uri)
    assert rc == 0, rep
    assert_vhd_match(rep, digest(data), len(data))
    if subformat == "dynamic":
        # only the one allocated 2 MiB block is read (qemu sets all of its
        # bitmap bits); the other 31 blocks are known zero
        assert rep["source"]["bytes_read"] == 2 * MiB
        assert rep["source"]["bytes_zero"] == len(data) - 2 * MiB


@pytest.mark.parametrize("name,where", [
    ("tap-fixed-8m.vhd", "footer"),
    ("tap-dyn-64m.vhd", "footer"),
    ("tap-dyn-64m.vhd", "header"),
])
def test_verify_vhd_malformed_is_one_line_exit_2(tmp_path, kits, name, where):
    vhd = vhd_fixture(name, tmp_path)
    size = os.path.getsize(vhd)
    if where == "footer":
        xor_bytes(vhd, size - 512 + 64, 4)          # trailing footer checksum
    else:
        head = struct.unpack_from(">Q", vhd.read_bytes(), 16)[0]
        xor_bytes(vhd, head + 36, 4)                # dynamic header checksum
    kit = kits.start("memory", "size=64M")
    line = assert_one_error_line(verify(vhd, kit.uri))
    assert "invalid VHD" in line and "checksum" in line, line
    assert str(vhd) in line
    assert_one_error_line(verify(vhd))              # digest mode too
    rc, rep = verify_json("--raw", vhd)             # the container as bytes
    assert rc == 0 and rep["digest"] == sha256_file(vhd)
