"""Helpers for the copy-tool tests (test_copy_*.py, test_fsimage.py,
test_sparse_efficiency.py), on top of the fixtures in conftest.py
(garbage_target takes the server and mount factories).

- ``garbage_target``: a memory export filled with random bytes, mounted,
  with a mark in the server's request log taken just before the mount, so
  the traffic a copy causes can be counted on its own.
- ``traffic``: what nbdkit's log filter saw (request counts and byte totals
  per type, and the requests themselves), from a mark on.
- ``make_mixed_image``: a source image with random data, real holes, and
  explicit all-zero data (aligned and not), ending in data.
- ``status``: the daemon's MP/.nbdferry-status as a dict.
"""

import json
import os
import random
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

from lib.digest import sha256_file
from lib.env import CHUNK, MiB, timeout
from lib.nbd import fill_random

# nbdkit log filter request lines (the reply lines start with "...").
#   connection=2 Write id=1 offset=0x0 count=0x200000 fua=0 ...
#   connection=1 Zero id=3 offset=0x0 count=0x10000 trim=1 fua=0 fast=0 ...
REQ_LINE = re.compile(
    r"connection=(\d+) (Read|Write|Zero|Trim|Flush|Extents|Cache) "
    r"id=(\d+)(.*?)\s*\.\.\.\s*$")
KV = re.compile(r"(\w+)=(\S+)")
OPS = ("Read", "Write", "Zero", "Trim", "Flush", "Extents", "Cache")


def log_mark(srv):
    """A position in the server's request log: traffic(srv, since=mark)
    counts only what came after."""
    try:
        return os.path.getsize(srv.log)
    except OSError:
        return 0


def nbd_requests(srv, since=0):
    """The requests nbdkit's log filter recorded after byte offset since,
    in order: SimpleNamespace(op, conn, id, offset, count, args)."""
    with open(srv.log, "rb") as f:
        f.seek(since)
        text = f.read().decode(errors="replace")
    reqs = []
    for line in text.splitlines():
        m = REQ_LINE.search(line)
        if not m:
            continue
        args = dict(KV.findall(m.group(4)))
        reqs.append(SimpleNamespace(
            op=m.group(2), conn=int(m.group(1)), id=int(m.group(3)),
            offset=int(args.get("offset", "0"), 0),
            count=int(args.get("count", "0"), 0), args=args))
    return reqs


def traffic(srv, since=0):
    """Totals per request type from the log filter: t.n[op] requests and
    t.bytes[op] bytes (count= summed), plus t.reqs, the requests."""
    reqs = nbd_requests(srv, since)
    n = {op: 0 for op in OPS}
    nbytes = {op: 0 for op in OPS}
    for r in reqs:
        n[r.op] += 1
        nbytes[r.op] += r.count
    return SimpleNamespace(n=n, bytes=nbytes, reqs=reqs)


def describe(t):
    """One line for assertion messages."""
    return ", ".join(f"{op} {t.n[op]}x/{t.bytes[op]}B" for op in OPS
                     if t.n[op])


def status(m):
    """The daemon's live status (MP/.nbdferry-status) as a dict."""
    return json.loads((Path(m.mp) / ".nbdferry-status").read_text())


def garbage_target(server, mount, size, *mount_opts, log=True):
    """A memory export of size bytes filled with random bytes (returned as
    .old, so expected contents can be computed), mounted.  .mark is the
    request log position after the fill and before the mount."""
    srv = server("memory", f"size={size}", log=log)
    old = fill_random(srv.uri, size)
    mark = log_mark(srv) if log else 0
    m = mount(srv, *mount_opts)
    return SimpleNamespace(srv=srv, m=m, old=old, mark=mark, size=size)


def fill_garbage(uri, size, seed=1):
    """Fill an export with nbdkit's deterministic random data (no copy of
    it held in memory, for exports too large for fill_random)."""
    r = subprocess.run(
        ["nbdcopy", "--", "[", "nbdkit", "--exit-with-parent", "-r",
         "random", f"size={size}", f"seed={seed}", "]", uri],
        capture_output=True, text=True, timeout=timeout(300))
    assert r.returncode == 0, f"nbdcopy random -> {uri}: {r.stderr}"


def write_bytes(f, n, rng, zero=False):
    while n:
        k = min(CHUNK, n)
        f.write(bytes(k) if zero else rng.randbytes(k))
        n -= k


# Layout of make_mixed_image, as fractions of a MiB grid: (offset, length,
# kind); gaps between pieces are real holes.  Odd offsets and lengths on
# purpose: copy tools and the daemon must not round them.
def mixed_layout(size):
    lay = [
        (0, MiB + 333, "rand"),                  # data from byte 0
        (5 * MiB, 4 * MiB, "zero"),              # aligned written zeros
        (9 * MiB, 100 * 1024 + 7, "rand"),
        (9 * MiB + 100 * 1024 + 7, 200 * 1024 + 5, "zero"),  # unaligned
        (9 * MiB + 300 * 1024 + 12, 3 * MiB + 1, "rand"),
    ]
    # Small data islands every 256 KiB: tiny holes between them.
    for i in range(24):
        lay.append((16 * MiB + i * 256 * 1024 + i * 17, 1000 + 97 * i, "rand"))
    lay += [
        (24 * MiB + 5, 8 * MiB, "rand"),          # a dense unaligned run
        (32 * MiB + 5, 2 * MiB, "zero"),
        (34 * MiB + 5, 3 * MiB + 4093, "rand"),
    ]
    # A long hole, then data touching the last byte.
    lay = [p for p in lay if p[0] + p[1] <= size - 5000]
    lay.append((size - 4097, 4097, "rand"))
    return lay


def make_mixed_image(path, size, seed=0):
    """A sparse source of size bytes (>= 40 MiB) following mixed_layout:
    random data, holes, and written zeros.  Returns SimpleNamespace(path,
    size, layout, alloc (allocated bytes), data (random bytes), sha256)."""
    rng = random.Random(seed)
    lay = mixed_layout(size)
    with open(path, "wb") as f:
        f.truncate(size)
        for off, n, kind in lay:
            f.seek(off)
            write_bytes(f, n, rng, zero=(kind == "zero"))
    st = os.stat(path)
    assert st.st_blocks * 512 < size // 2, "mixed image is not sparse"
    return SimpleNamespace(path=Path(path), size=size, layout=lay,
                           alloc=st.st_blocks * 512,
                           data=sum(n for _, n, k in lay if k == "rand"),
                           sha256=sha256_file(path))


def allocated(path):
    """Bytes a file occupies on its filesystem (st_blocks * 512)."""
    return os.stat(path).st_blocks * 512


ZERO_BLOCK = 64 * 1024


def zero_payload(t, expected):
    """Payload bytes the server received in 64 KiB-aligned blocks that are
    all zero in expected (bytes, indexed by disk offset) and lie wholly
    inside one Write request.  The daemon promises to send those as
    write-zeroes (or nothing), so this should be 0.  Returns (bytes,
    [first few offsets])."""
    total, where = 0, []
    zb = bytes(ZERO_BLOCK)
    for r in t.reqs:
        if r.op != "Write":
            continue
        b = -(-r.offset // ZERO_BLOCK) * ZERO_BLOCK
        while b + ZERO_BLOCK <= r.offset + r.count:
            if expected[b:b + ZERO_BLOCK] == zb:
                total += ZERO_BLOCK
                if len(where) < 5:
                    where.append(hex(b))
            b += ZERO_BLOCK
    return total, where
