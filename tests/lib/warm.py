"""Warm migration (fs/warm.c): a source image with scattered data, a
change of about 1% of it, the copy commands of a pass, and what the
server received (its request log).  Shared by tests/test_warm_*.py."""

import hashlib
import random
import subprocess
from types import SimpleNamespace

from lib.copytools import log_mark, traffic
from lib.digest import sha256_file
from lib.env import MiB
from lib.images import random_bytes
from lib.procs import run

BLOCK = 64 << 10


def make_source(path, size, fraction=0.25, seed=1):
    """A sparse raw image: random data in runs of 256K..1M at 64K-aligned
    offsets (a few at 4K-aligned ones), fraction of size in all."""
    rng = random.Random(seed)
    with open(path, "wb") as f:
        f.truncate(size)
        want, done = int(size * fraction), 0
        while done < want:
            n = rng.choice((256, 512, 1024)) << 10
            off = rng.randrange(0, (size - n) // BLOCK) * BLOCK
            if rng.random() < 0.2:
                off += rng.randrange(1, 16) * 4096
            f.seek(off)
            f.write(random_bytes(n))
            done += n
    return path


def change_source(path, size, fraction=0.01, seed=2, unit=256 << 10):
    """Change about fraction of the image in runs of unit bytes at
    64K-aligned offsets, half over data and half anywhere; returns the
    bytes of whole 64K blocks that changed."""
    rng = random.Random(seed)
    runs = max(1, int(size * fraction) // unit)
    changed = set()
    with open(path, "r+b") as f:
        for _ in range(runs):
            off = rng.randrange(0, (size - unit) // BLOCK) * BLOCK
            f.seek(off)
            f.write(random_bytes(unit))
            changed.update(range(off // BLOCK, (off + unit) // BLOCK))
    return len(changed) * BLOCK


COPIES = {
    "cp": lambda src, dst: ["cp", "--sparse=always", str(src), str(dst)],
    "dd_notrunc": lambda src, dst: ["dd", f"if={src}", f"of={dst}", "bs=1M",
                                    "conv=notrunc", "status=none"],
    "dd_trunc": lambda src, dst: ["dd", f"if={src}", f"of={dst}", "bs=1M",
                                  "status=none"],
    "qemu_img": lambda src, dst: ["qemu-img", "convert", "-n", "-f", "raw",
                                  "-O", "raw", str(src), str(dst)],
}


def copy(tool, src, dst, timeout=600):
    r = run(COPIES[tool](src, dst), timeout=timeout)
    assert r.returncode == 0, f"{tool} failed: {r.stderr}"


def written(srv, since=0):
    """Bytes of NBD writes (payload) the server received since the mark."""
    return traffic(srv, since).bytes["Write"]


def sha256(path):
    return sha256_file(path)


def verify_digest(src):
    """nbdferry-verify SOURCE: the whole disk's blkhash, as the inline
    digest computes it."""
    from lib.env import BUILD
    r = run([BUILD / "tools" / "nbdferry-verify", src])
    assert r.returncode == 0, r.stderr
    return r.stdout.split()[0]


def inline_digest(st):
    """The status's inline digest value, or None (with its state)."""
    d = st["digest"]
    return d.get("value") if d.get("state") == "complete" else None
