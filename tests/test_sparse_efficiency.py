"""Holes cost nothing: measured from nbdkit's request log.

- A 4 GiB image with 10% data in scattered 2 MiB runs, copied onto a fresh
  4 GiB memory export (reads as zero, block status says so): the server
  receives about the data bytes as payload and no zeroing at all.
- A 1 TiB export (nbdkit memory is sparse): O_TRUNC then a small copy.  The
  bytes beyond the copy must read as zero, but zeroing 1 TiB is not the way:
  only what the server reported as data is zeroed.  Asserted on request
  counts and bytes, not on time.
"""

import hashlib
import os
import random
import shutil
import tempfile
from types import SimpleNamespace

import pytest

from lib.content import assert_content
from lib.copytools import describe, log_mark, status, traffic
from lib.digest import sha256_file, update_zeros
from lib.env import GiB, MiB, libnbd
from lib.images import random_bytes, random_file
from lib.nbd import read_nbd, sha256_nbd, write_nbd
from lib.procs import run

BIG = 4 * GiB
RUN = 2 * MiB


def make_runs_image(path, size, fraction, seed):
    """A sparse image with random data in 2 MiB runs at scattered 4 KiB
    aligned offsets (never touching each other), fraction of the size in
    all.  The sha256 is computed while writing (no 4 GiB re-read)."""
    rng = random.Random(seed)
    slots = size // RUN
    count = int(slots * fraction)
    # Every other slot at most, so a run shifted into the next slot never
    # meets another run.
    chosen = sorted(rng.sample(range(0, slots - 1, 2), count))
    runs = [(s * RUN + rng.randrange(0, RUN // 4096) * 4096, RUN)
            for s in chosen]
    h = hashlib.sha256()
    pos = 0
    with open(path, "wb") as f:
        f.truncate(size)
        for off, n in runs:
            data = random_bytes(n)
            f.seek(off)
            f.write(data)
            update_zeros(h, off - pos)
            h.update(data)
            pos = off + n
    update_zeros(h, size - pos)
    return SimpleNamespace(path=path, size=size, runs=runs,
                           data=count * RUN, sha256=h.hexdigest())


@pytest.fixture(scope="module")
def big_image():
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    d = tempfile.mkdtemp(prefix="nfeff-", dir=base)
    try:
        yield make_runs_image(os.path.join(d, "big.img"), BIG, 0.10, seed=5)
    finally:
        shutil.rmtree(d, ignore_errors=True)


TOOLS = {
    "cp-sparse-always": lambda s, d: ["cp", "--sparse=always", s, d],
    "dd-sparse-1M": lambda s, d: ["dd", f"if={s}", f"of={d}", "bs=1M",
                                  "conv=sparse", "status=none"],
    "qemu-img-convert-n": lambda s, d: ["qemu-img", "convert", "-n", "-f",
                                        "raw", "-O", "raw", s, d],
}


@pytest.mark.parametrize("tool", list(TOOLS))
def test_sparse_4g_holes_cost_nothing(server, mount, big_image, tool):
    cmd = TOOLS[tool](big_image.path, "X")
    if shutil.which(cmd[0]) is None:
        pytest.skip(f"{cmd[0]} not installed")
    img = big_image
    srv = server("memory", f"size={BIG}", log=True)
    mark = log_mark(srv)
    m = mount(srv)
    r = run(TOOLS[tool](img.path, m.file), timeout=300)
    assert r.returncode == 0, f"{tool} exited {r.returncode}: {r.stderr}"
    assert os.path.getsize(m.file) == BIG
    assert_content(img.path, BIG, mount_file=m.file, uri=srv.uri, what=tool)
    m.unmount()
    t = traffic(srv, mark)
    # Payload: the data and nothing else (holes are not sent as zeros).
    # dd writes whole 1 MiB blocks, zeros around each run included; the
    # daemon drops the aligned 64 KiB zero blocks among them, the partial
    # ones at each run's two edges may travel.
    slack = len(img.runs) * 128 * 1024 if tool.startswith("dd") else 0
    slack += img.data // 100
    assert img.data <= t.bytes["Write"] <= img.data + slack, \
        f"{t.bytes['Write']} payload bytes for {img.data} data bytes: " \
        + describe(t)
    # No redundant zeroing: the fresh export already reads as zero.
    assert t.n["Zero"] == 0 and t.n["Trim"] == 0, \
        "zeroing sent to an export that reads as zero: " + describe(t)


TIB = 1 << 40
OLD = [(0, MiB), (300 * GiB + 12345, MiB), (700 * GiB, 3 * MiB + 5),
       (TIB - MiB, MiB)]


@pytest.mark.parametrize("old", [False, True], ids=["fresh", "old-data"])
def test_sparse_1t_truncate_then_small_copy(server, mount, shm, old):
    """cp (O_TRUNC, then 8 MiB of data, then close) onto a 1 TiB export.
    Fresh, nothing needs zeroing; with old data in a few places, only
    those places are zeroed."""
    if libnbd is None:
        pytest.skip("needs python3-libnbd (offset reads and writes on a "
                    "1 TiB export)")
    srv = server("memory", "size=1T", log=True)
    if old:
        for off, n in OLD:
            write_nbd(srv.uri, random_bytes(n), off)
    mark = log_mark(srv)
    m = mount(srv)
    assert os.path.getsize(m.file) == TIB
    src = random_file(shm / "small.img", 8 * MiB + 5)
    r = run(["cp", src, m.file])
    assert r.returncode == 0, f"cp exited {r.returncode}: {r.stderr}"
    assert os.path.getsize(m.file) == 8 * MiB + 5
    assert sha256_file(m.file) == sha256_file(src)
    # cp's close returned: the lazy zeroing is done, nothing failed.
    st = status(m)
    assert st["pending_zero_bytes"] == 0 and st["errors"] == 0, st
    # On the server: the source, zeros after it, and zeros where the old
    # data was.
    assert sha256_nbd(srv.uri, 16 * MiB) == sha256_file(src, pad_to=16 * MiB)
    for off, n in OLD:
        if off >= 8 * MiB + 5:
            got = read_nbd(srv.uri, off, n)
            assert got == bytes(n), \
                f"old data at {off:#x} not zeroed ({n - got.count(0)} " \
                f"non-zero bytes)"
    m.unmount()
    t = traffic(srv, mark)
    assert 8 * MiB + 5 <= t.bytes["Write"] <= 9 * MiB, describe(t)
    must = sum(n for off, n in OLD if off >= 8 * MiB) if old else 0
    # Zeroing covers what held data (block status granularity may round
    # each place out to 64 KiB), never the terabyte.
    assert must <= t.bytes["Zero"] <= must + len(OLD) * 256 * 1024, \
        f"zeroed {t.bytes['Zero']} bytes, {must} needed: " + describe(t)
    assert t.n["Zero"] <= 4 * len(OLD) and t.n["Trim"] == 0, describe(t)
