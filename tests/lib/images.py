"""Source images on disk: dense random files and sparse images whose data
runs and holes are known."""

import os
import random
from pathlib import Path
from types import SimpleNamespace

from lib.digest import sha256_file
from lib.env import CHUNK

try:
    import numpy
except ImportError:         # scripts/install-deps installs python3-numpy
    numpy = None

_TILE = 1 << 20


def random_bytes(n):
    """n bytes that no other offset nor earlier content repeats: as
    os.urandom(n) does for a test (a stale, shifted or misplaced byte
    shows), and three to four times faster for large n.  Past the first MiB,
    each MiB is one fresh random MiB XOR a fresh random 64-bit word per
    MiB, so no two MiB are alike and none compresses (the format tests
    need incompressible data).  The tests' setup spent more time in
    os.urandom (450 MB/s here) than in some of the copies it fed."""
    if numpy is None or n <= 2 * _TILE:
        return os.urandom(n)
    words = (n + 7) // 8
    tile = numpy.frombuffer(os.urandom(_TILE), dtype=numpy.uint64)
    keys = numpy.frombuffer(os.urandom(8 * (words // len(tile) + 1)),
                            dtype=numpy.uint64)
    out = numpy.empty(words, dtype=numpy.uint64)
    for i, start in enumerate(range(0, words, len(tile))):
        end = min(start + len(tile), words)
        numpy.bitwise_xor(tile[:end - start], keys[i], out=out[start:end])
    b = out.tobytes()
    return b if len(b) == n else b[:n]


def random_file(path, size):
    """A dense file of random bytes; returns its path."""
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(CHUNK, left)
            f.write(random_bytes(n))
            left -= n
    return Path(path)


def make_sparse_image(path, size, runs, seed=None):
    """A sparse image of size bytes: random data in runs, holes elsewhere.

    runs is a list of (offset, length) or a count of random runs (unaligned
    offsets and lengths, never overlapping, with one run touching the end
    so the last byte is data).  Holes are made with ftruncate, so the image
    is really sparse.  Returns SimpleNamespace(path, size, runs, sha256)."""
    rng = random.Random(seed)
    if isinstance(runs, int):
        count, runs = runs, []
        slot = size // max(count, 1)
        for i in range(count):
            length = rng.randint(1, max(1, slot // 2))
            if rng.random() < 0.5:             # sometimes a large run
                length = rng.randint(slot // 4, max(slot // 4, slot - 1))
            start = i * slot + rng.randint(0, slot - length)
            runs.append((start, length))
        if runs:                               # data right at the end
            s, _ = runs[-1]
            runs[-1] = (s, size - s)
    with open(path, "wb") as f:
        f.truncate(size)
        for off, length in runs:
            assert 0 <= off and off + length <= size
            f.seek(off)
            left = length
            while left:
                n = min(CHUNK, left)
                f.write(random_bytes(n))
                left -= n
    return SimpleNamespace(path=Path(path), size=size, runs=runs,
                           sha256=sha256_file(path))

