"""nbdferry-verify --blkhash on many threads: the same value as on one.

Data blocks go to a pool of hasher threads (--threads, default: the online
CPUs) in jobs of about 1 MiB, while the side's own thread reads ahead and
skips holes and zero blocks; a file hashed on its own is read by the
workers themselves, each job's range into its own buffer.  Whatever the number of threads, the operand
(file, block device, NBD URI, stdin as a file or a pipe) and the block
size, the value must equal the reference in test_blkhash.py; a failure in
the middle of the stream must end the run with one error line, not a hang
or a digest.

Run: /usr/bin/python3 -m pytest tests/test_blkhash_threads.py
"""

import os
import random
import shutil
import subprocess

import pytest

from test_blkhash import blkhash, one
from test_verify import (MiB, assert_one_error_line, kits,  # noqa: F401
                         verify)

KiB = 1 << 10
THREADS = ["--threads=1", "--threads=2", "--threads=7", "--threads=64"]


@pytest.fixture(autouse=True)
def tools_present():
    for t in ("nbdkit", "nbdcopy", "losetup"):
        if not shutil.which(t):
            pytest.fail(f"{t} is needed")


def busy_image(path, size, seed):
    """Mostly data, so that every hasher has jobs queued: random runs of
    1 byte..3 MiB at unaligned offsets, separated by short holes, with
    zero blocks written as data inside some runs.  Returns the content."""
    rng = random.Random(seed)
    content = bytearray(size)
    with open(path, "wb") as f:
        f.truncate(size)
        off = rng.randrange(64 * KiB)
        while off < size:
            n = min(rng.choice([1, 4095, 70000, MiB + 3, 3 * MiB]), size - off)
            run = bytearray(rng.randbytes(n))
            if n > 200 * KiB and rng.random() < 0.5:
                z = rng.randrange(n - 130 * KiB)
                run[z:z + 130 * KiB] = bytes(130 * KiB)   # zeros as data
            os.pwrite(f.fileno(), run, off)
            content[off:off + n] = run
            off += n + rng.choice([0, 1, 4096, 64 * KiB, 300 * KiB])
    assert os.path.getsize(path) == size
    return bytes(content)


@pytest.mark.parametrize("spec,alg,block", [
    ("sha256/4k", "sha256", 4 * KiB),
    ("sha256", "sha256", 64 * KiB),
    ("md5/12345", "md5", 12345),
    ("sha512/2M", "sha512", 2 * MiB),
], ids=["sha256-4k", "sha256-64k", "md5-12345", "sha512-2M"])
def test_blkhash_threads_agree_on_file(tmp_path, spec, alg, block):
    for i, size in enumerate([40 * MiB + 4097, 24 * MiB]):
        img = tmp_path / f"img{i}"
        want = blkhash(busy_image(img, size, seed=size + block), alg, block)
        for t in THREADS:
            assert one(f"--blkhash={spec}", t, img) == want, t
        assert one(f"--blkhash={spec}", "--threads=64", "--no-extents",
                   img) == want


def test_blkhash_threads_agree_on_stdin(tmp_path):
    img = tmp_path / "img"
    want = blkhash(busy_image(img, 33 * MiB + 1, seed=3), "sha1", 8 * KiB)
    for t in THREADS:
        with open(img, "rb") as f:              # stdin is the file
            assert one("--blkhash=sha1/8k", t, "-", stdin=f) == want, t
        cat = subprocess.Popen(["cat", str(img)], stdout=subprocess.PIPE)
        assert one("--blkhash=sha1/8k", t, "-", stdin=cat.stdout) == want, t
        cat.stdout.close()
        assert cat.wait() == 0


def test_blkhash_threads_agree_on_nbd(tmp_path, kits):
    img = tmp_path / "img"
    data = busy_image(img, 37 * MiB + 511, seed=4)
    kit = kits.memory_with(img)
    want = blkhash(data)
    for t in THREADS:
        assert one("--blkhash", t, kit.uri) == want, t
        assert one("--blkhash", t, "--requests=3", "--request-size=64k",
                   kit.uri) == want, t
    p = verify("--blkhash", "--threads=64", "--json", img, kit.uri)
    assert p.returncode == 0, p.stderr


@pytest.fixture
def loop_device(tmp_path):
    """Factory: a read-only loop device over a file, detached at teardown."""
    devs = []

    def attach(path):
        p = subprocess.run(["losetup", "--find", "--show", "--read-only",
                            str(path)], capture_output=True, text=True)
        if p.returncode != 0:
            pytest.fail(f"losetup: {p.stderr.strip()}")
        devs.append(p.stdout.strip())
        return devs[-1]

    yield attach
    for d in devs:
        subprocess.run(["losetup", "-d", d], check=False)


def test_blkhash_block_device(tmp_path, loop_device):
    img = tmp_path / "img"
    size = 21 * MiB + 3 * 512                  # a loop device has 512-byte sectors
    data = busy_image(img, size, seed=6)
    dev = loop_device(img)
    for spec, alg, block in (("", "sha256", 64 * KiB),
                             ("=md5/3000", "md5", 3000)):
        want = blkhash(data, alg, block)
        for t in ("--threads=1", "--threads=64"):
            assert one(f"--blkhash{spec}", t, dev) == want, (spec, t)
        with open(dev, "rb") as f:             # stdin is the device
            assert one(f"--blkhash{spec}", "-", stdin=f) == want
    p = verify("--blkhash", "--json", img, dev)
    assert p.returncode == 0, p.stderr


FAILING_SERVER = r"""#!/bin/sh
# nbdkit sh plugin: the bytes of {file}, but reads at or past {fail_at}
# fail with EIO.
case "$1" in
  get_size) stat -c %s '{file}' ;;
  pread)
    if [ "$4" -ge {fail_at} ]; then echo "EIO injected" >&2; exit 1; fi
    dd if='{file}' iflag=skip_bytes,count_bytes skip="$4" count="$3" \
       status=none ;;
  can_write|can_flush|can_trim|can_zero) exit 3 ;;
  *) exit 2 ;;
esac
"""


def test_blkhash_read_error_mid_stream_is_one_line_exit_2(tmp_path, kits):
    """The hashers are busy with earlier blocks when a read fails: the run
    ends with exit 2 and one line naming the read, and prints no digest."""
    img = tmp_path / "img"
    busy_image(img, 24 * MiB, seed=7)
    script = tmp_path / "failing.sh"
    script.write_text(FAILING_SERVER.format(file=img, fail_at=17 * MiB))
    script.chmod(0o755)
    kit = kits.start("sh", script)
    assert one("--blkhash", "--size=16M", kit.uri) == \
        blkhash(img.read_bytes()[:16 * MiB])    # the server itself works
    for t in ("--threads=1", "--threads=64"):
        line = assert_one_error_line(verify("--blkhash=sha256/4k", t,
                                            kit.uri))
        assert "read" in line, line
        line = assert_one_error_line(verify("--blkhash", t, img, kit.uri))
        assert "read" in line, line


def test_blkhash_threads_file_prefix(tmp_path):
    """--size cuts the stream inside a data run and inside a block: the
    workers that read the file themselves must stop at the prefix."""
    img = tmp_path / "img"
    data = busy_image(img, 30 * MiB, seed=8)
    for n in (12345679, 16 * MiB, 1):
        for t in ("--threads=1", "--threads=64"):
            assert one("--blkhash=sha256/4k", t, f"--size={n}", img) == \
                blkhash(data[:n], "sha256", 4 * KiB), (n, t)
