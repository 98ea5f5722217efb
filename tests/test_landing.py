"""Writes received straight into their pool buffer ("landings",
fs/fuseloop.c): the receive loop reads each request with readv() into a
header buffer and the pool buffer the next write would be sent from, and
commits a write whose payload landed there without copying it.

What must hold whatever the write pattern: every byte lands where it was
written (judged by the sha256 of the export read back from the server and
of the file through the mount), requests that are not writes, writes to
the other views and writes the landing cannot take are served as before;
and for a sequential copy the payload really is received in place (the
status file's bytes_landed), so the daemon makes no user-space copy of
it."""

import os
import random
import subprocess

import pytest

from lib.content import assert_content
from lib.digest import sha256_file
from lib.env import SANITIZER, WRAPPER, MiB
from lib.faults import status_json
from lib.images import random_file
from lib.nbd import random_export
from lib.procs import run

EXPORT = 64 * MiB


def landed(m):
    st = status_json(m)
    return st["bytes_written"], st["bytes_landed"]


def assert_in_place(got, want, what):
    """got bytes landed in place, at least want: an efficiency property.
    In a sanitizer build (ASan 2-3x, TSan 5-15x slower: the flusher falls
    behind the writer, and buffers kept for a flush make a landing take
    the copying path) or under valgrind only that landings happen at
    all; the bytes on the server are checked in every build."""
    if SANITIZER or WRAPPER:
        assert got > 0, f"nothing landed in place ({what})"
    else:
        assert got >= want, f"{got} bytes landed in place, want {want}: {what}"


@pytest.fixture(params=["memory", "jitter"])
def target(request, server, jitter_server, shm):
    """A 64 MiB export full of random bytes (a stale byte shows): nbdkit
    memory, or the random-delay RAM disk (writes complete late and out of
    order, so a landing reused or sent too early shows)."""
    return random_export(request.param, server, jitter_server, shm, EXPORT,
                         3000)


def test_cp_lands_in_place(target, mount, shm):
    """cp writes 1 MiB at a time in order: its writes land in the pool
    buffer they are sent from (the first in a whole buffer, the next in
    its tail), and the disk holds the source.  Every one of them: the
    idle timer is set far out, since on a loaded machine cp may pause
    longer than the default 10 ms between two writes, the half-filled
    buffer is then sent, and the next write takes the copying path (as it
    must: the bytes before it are on their way)."""
    srv, old = target
    m = mount(srv, "--no-digest", "--idle-ms", "60000")
    src = random_file(shm / "src.img", 48 * MiB)
    r = run(["cp", str(src), m.file])
    assert r.returncode == 0, r.stderr
    written, got = landed(m)
    assert written == 48 * MiB
    # All but the write that ends the copy (it reaches the source's size:
    # served by a worker once everything before it is acknowledged, so
    # that its reply carries a failure; docs/design/README.md, "Errors").
    assert_in_place(got, written - MiB, "all but the last MiB")
    assert got <= written - MiB                   # the last one by a worker
    assert_content(src, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=48 * MiB)


def test_jumping_writer_lands(target, mount, shm):
    """A writer that skips holes (cp --sparse on a disk of scattered
    data) starts nearly every write somewhere new.  Each such write is
    taken by a whole free buffer, not by the tail of the last write's
    buffer, which takes only the write right after it (that was the old
    guess: fewer than half the bytes of a 25%-data copy landed).  Here
    every write jumps: 1 MiB blocks, no two adjacent, in a random order
    over the pre-sized file, with a rewrite of an earlier block among
    them; all but the first write land, and the disk holds exactly what
    was written over the old bytes."""
    srv, old = target
    # A pool that holds the whole copy: buffers kept for a flush (the
    # resend after a reconnect) never make a landing wait for one.
    m = mount(srv, "--no-digest", "--idle-ms", "60000", "--pool-size", "256M")
    rng = random.Random(31)
    blocks = list(range(0, EXPORT // MiB, 2))
    rng.shuffle(blocks)
    blocks.append(blocks[3])           # a rewrite, still a jump
    want = bytearray(old)
    fd = os.open(m.file, os.O_WRONLY)
    try:
        for b in blocks:
            data = rng.randbytes(MiB)
            assert os.pwrite(fd, data, b * MiB) == MiB
            want[b * MiB:(b + 1) * MiB] = data
        os.fsync(fd)
    finally:
        os.close(fd)
    written, got = landed(m)
    assert written == len(blocks) * MiB
    assert_in_place(got, written - MiB, "all but one write")
    assert_content(bytes(want), EXPORT, mount_file=m.file, uri=srv.uri)


@pytest.mark.parametrize("bs", ["4k", "64k", "1536k", "3M", "1000000"])
def test_dd_block_sizes(target, mount, shm, bs):
    """dd's block sizes: small (many writes per buffer), not dividing the
    buffer (a write that would cross it lands in a whole buffer of its
    own), larger than a FUSE request (the kernel splits it), odd.  The
    inline digest hashes the landed buffers in place, and must equal the
    source's sha256."""
    srv, old = target
    m = mount(srv, "--digest=sha256")
    src = random_file(shm / "src.img", 24 * MiB + 4096 * 3)
    r = run(["dd", f"if={src}", f"of={m.file}", f"bs={bs}", "status=none"])
    assert r.returncode == 0, r.stderr
    written, got = landed(m)
    assert written == os.path.getsize(src)
    assert_in_place(got, written // 2 + 1, "more than half")
    assert_content(src, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=os.path.getsize(src))
    d = status_json(m)["digest"]
    assert d["state"] == "complete" and d["value"] == sha256_file(src), d


def test_interleaved_writers_and_readers(target, mount, shm):
    """Four writers at once, each through its own handle, at random
    offsets and sizes (so the landing prepared for one is taken by
    another, or by nobody), while readers and fsyncs go on: the disk ends
    up as a model of the writes says, byte for byte."""
    srv, old = target
    m = mount(srv, "--no-digest", "-o", "multiwriter")  # four processes
    rng = random.Random(7)
    model = bytearray(old)
    plans = []
    for w in range(4):
        ops = []
        for _ in range(60):
            # Disjoint stripes per writer: the outcome does not depend on
            # how the writers interleave.
            off = w * 16 * MiB + rng.randrange(0, 15 * MiB)
            n = rng.choice([4096, 65536, 1 << 20, 1 << 20, 1536 * 1024,
                            rng.randrange(1, 2 << 20)])
            n = min(n, (w + 1) * 16 * MiB - off)
            data = rng.randbytes(n)
            if rng.random() < 0.2:
                data = bytes(n)           # zero runs: write-zeroes
            ops.append((off, data))
            model[off:off + n] = data
        plans.append(ops)
    plan_files = []
    for w, ops in enumerate(plans):
        p = shm / f"plan{w}"
        with open(p, "wb") as f:
            for off, data in ops:
                f.write(off.to_bytes(8, "little") + len(data).to_bytes(8, "little"))
                f.write(data)
        plan_files.append(p)
    writer = (
        "import os, sys\n"
        "fd = os.open(sys.argv[1], os.O_WRONLY)\n"
        "with open(sys.argv[2], 'rb') as f:\n"
        "    i = 0\n"
        "    while True:\n"
        "        h = f.read(16)\n"
        "        if not h: break\n"
        "        off = int.from_bytes(h[:8], 'little'); n = int.from_bytes(h[8:], 'little')\n"
        "        d = f.read(n)\n"
        "        assert os.pwrite(fd, d, off) == n\n"
        "        i += 1\n"
        "        if i % 17 == 0: os.fsync(fd)\n"
        "os.close(fd)\n")
    reader = (
        "import os, sys\n"
        "for i in range(200):\n"
        "    fd = os.open(sys.argv[1], os.O_RDONLY)\n"
        "    os.pread(fd, 1 << 20, (i * 7919 * 4096) % (63 << 20))\n"
        "    os.close(fd)\n")
    procs = [subprocess.Popen(["/usr/bin/python3", "-c", writer, m.file,
                               str(p)]) for p in plan_files]
    procs += [subprocess.Popen(["/usr/bin/python3", "-c", reader, m.file])
              for _ in range(2)]
    for p in procs:
        assert p.wait(300) == 0
    assert_content(bytes(model), EXPORT, mount_file=m.file, uri=srv.uri)


def test_views_and_other_requests_unharmed(server, mount, shm):
    """Writes to the VHD view never land (the decoder takes them): they
    are served as before, the raw file's writes land again after them,
    and the status file is read between writes."""
    srv = server("memory", f"size={EXPORT}")
    m = mount(srv, "--no-digest")
    raw = random_file(shm / "raw.img", 8 * MiB)
    vhd = shm / "src.vhd"
    r = run(["qemu-img", "convert", "-f", "raw", "-O", "vpc", "-o",
             "subformat=dynamic", str(raw), str(vhd)])
    assert r.returncode == 0, r.stderr
    r = run(["cp", str(vhd), str(m.mp / "nbd.vhd")])
    assert r.returncode == 0, r.stderr
    written, got = landed(m)
    assert got == 0
    assert_content(raw, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=os.stat(m.file).st_size)
    tail = random_file(shm / "tail.img", 4 * MiB)
    r = run(["dd", f"if={tail}", f"of={m.file}", "bs=1M", "seek=16",
             "conv=notrunc", "status=none"])
    assert r.returncode == 0, r.stderr
    _, got = landed(m)
    assert_in_place(got, MiB, "the raw file's writes no longer land")
    expected = bytearray(raw.read_bytes()) + bytes(16 * MiB - 8 * MiB)
    expected += tail.read_bytes()
    assert_content(bytes(expected), EXPORT, uri=srv.uri)


def test_write_past_end_through_landing(server, mount, shm):
    """A write that starts past the export's end is refused (ENOSPC) on
    the landing path as on the other; one that straddles it is short."""
    srv = server("memory", f"size={8 * MiB}")
    m = mount(srv, "--no-digest", expect_errors=True)
    src = random_file(shm / "src.img", 10 * MiB)
    # From a pipe: dd has no source file the daemon could see (one it
    # sees refuses the copy before any write, tests/test_mistakes.py).
    r = run(["sh", "-c", f"cat '{src}' | dd of='{m.file}' bs=1M "
             "iflag=fullblock status=none"])
    assert r.returncode != 0
    assert "No space left on device" in r.stderr
    assert_content(src.read_bytes()[:8 * MiB], 8 * MiB, uri=srv.uri)


def test_small_requests_do_not_land(server, mount, shm):
    """With NBD requests smaller than a FUSE write, a landing could not
    take most writes: none is prepared, and the copy is exact."""
    srv = server("memory", f"size={EXPORT}")
    m = mount(srv, "--no-digest", "--request-size", "256k")
    src = random_file(shm / "src.img", 16 * MiB)
    r = run(["cp", str(src), m.file])
    assert r.returncode == 0, r.stderr
    written, got = landed(m)
    assert written == 16 * MiB and got == 0
    assert_content(src, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=16 * MiB)
