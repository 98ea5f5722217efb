"""Read-ahead: sequential readers of the disk are served from large NBD
reads started ahead of them, and never see bytes older than a change
acknowledged before their read began.

- cp out of a random disk behind a read delay: the bytes match, and the
  server saw a few large reads (the read-ahead's chunks), not one read per
  FUSE request.  With --readahead 0 the FUSE requests reach the server one
  by one, and the bytes still match.
- a sparse disk: holes known from block status are neither read from the
  server nor held in chunks (chunks end where a hole begins), and a reader
  that skips holes with SEEK_DATA (cp) keeps its read-ahead across them,
  however long they are.
- nbd.vhd: the VHD export reads its block data through the read-ahead.
- readers and writers at once: readers stream the file while a writer
  rewrites, punches and zeroes ranges through another handle; every byte
  a reader sees belongs to a version that was current at some moment of
  its read (never one replaced before the read began).
"""

import ctypes
import os
import random
import struct
import subprocess
import threading
import time

import pytest

from lib.copytools import log_mark, status, traffic
from lib.digest import sha256_file
from lib.env import MiB
from lib.images import make_sparse_image, random_bytes
from lib.nbd import fill_random
from lib.procs import run
from lib.vhd import qemu_img, vpc_spec

BLOCK = 4096
MAGIC = 0x5A << 56          # no stamp reads as zero
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE = 1, 2, 0x10
libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64,
                           ctypes.c_int64]


def fallocate(fd, mode, off, length):
    if libc.fallocate(fd, mode, off, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def copy_out(m, out, name="nbd"):
    r = run(["cp", m.mp / name, out], timeout=300)
    assert r.returncode == 0, f"cp out exited {r.returncode}: {r.stderr}"


def test_copy_out_is_read_ahead(server, mount, shm):
    size = 48 * MiB + 12345
    srv = server("memory", f"size={size}", "rdelay=2ms", filters=["delay"],
                 log=True)
    old = fill_random(srv.uri, size)
    m = mount(srv)
    out = shm / "out.img"
    copy_out(m, out)
    assert out.read_bytes() == old, "out.img differs from the disk"
    t = traffic(srv)
    # cp asks for at most 1 MiB per FUSE read; read-ahead chunks are 2 MiB.
    assert t.bytes["Read"] >= size
    assert t.n["Read"] <= size // (2 * MiB) + 4, \
        f"{t.n['Read']} reads for {size} bytes: no read-ahead"
    st = status(m)
    assert st["bytes_read"] >= size
    ra = st["readahead"]
    assert ra["hit_bytes"] == size and ra["miss_bytes"] == 0, ra
    # cp has closed the file: its stream is gone, and every chunk a reply
    # was sent from (by a worker or by the receiving thread itself) has
    # been let go of and freed.
    assert ra["in_use"] == 0, ra


def test_readahead_off_reads_on_demand(server, mount, shm):
    size = 16 * MiB
    srv = server("memory", f"size={size}", log=True)
    old = fill_random(srv.uri, size)
    m = mount(srv, "--readahead", "0")
    out = shm / "out.img"
    copy_out(m, out)
    assert out.read_bytes() == old
    t = traffic(srv)
    assert t.n["Read"] >= size // MiB, "reads larger than the FUSE requests"


def sparse_copy_out(server, mount, shm, size, runs, rdelay, reader="cp"):
    """A sparse image (data in runs) on a memory export behind a read
    delay, its holes left as holes; mounted and copied out with cp
    (--sparse=auto: SEEK_DATA) or dd (every byte, 1 MiB reads).  The copy
    must equal the image.  Returns the mount, the server's traffic during
    the copy, and the bytes of data."""
    src = make_sparse_image(shm / "src.img", size, runs=runs)
    srv = server("memory", f"size={size}", f"rdelay={rdelay}",
                 filters=["delay"], log=True)
    r = run(["nbdcopy", src.path, srv.uri])     # leaves the holes
    assert r.returncode == 0, r.stderr
    mark = log_mark(srv)
    m = mount(srv)
    out = shm / "out.img"
    if reader == "cp":
        copy_out(m, out)
    else:
        r = run(["dd", f"if={m.mp / 'nbd'}", f"of={out}", "bs=1M",
                 "status=none"], timeout=300)
        assert r.returncode == 0, r.stderr
    assert sha256_file(out) == src.sha256
    return m, traffic(srv, since=mark), sum(n for _, n in runs)


def assert_read_data_only(t, data, runs):
    """The server read the data, rounded out to its block status
    granularity (nbdkit memory: 32 KiB pages) at both ends of each run; a
    chunk that ran on into a hole would read up to 2 MiB of it."""
    assert data <= t.bytes["Read"] <= data + len(runs) * 2 * 64 * 1024, \
        f"read {t.bytes['Read']} bytes of a disk with {data} bytes of data"


def test_holes_are_not_read(server, mount, shm):
    runs = [(5 * MiB + 123, 3 * MiB), (40 * MiB + 7, MiB + 5),
            (100 * MiB, 28 * MiB)]
    _, t, data = sparse_copy_out(server, mount, shm, 128 * MiB, runs, "1ms")
    assert_read_data_only(t, data, runs)


def test_reads_over_holes_and_data_take_the_data_from_chunks(server, mount,
                                                             shm):
    """A reader of every byte (dd, cp --sparse=always, sha256sum) sends
    reads that begin in a hole and go on into data.  The hole is served as
    zeros without a server read and the data from the chunk that holds it:
    the server reads the data once (no second, on-demand read of what a
    chunk already holds), and only hole bytes are misses."""
    size = 64 * MiB
    runs = [(k * MiB + 256 * 1024, 768 * 1024) for k in range(size // MiB)]
    m, t, data = sparse_copy_out(server, mount, shm, size, runs, "2ms",
                                 reader="dd")
    ra = status(m)["readahead"]
    assert ra["miss_bytes"] <= size - data, ra
    assert_read_data_only(t, data, runs)


def test_small_holes_are_read_with_the_data(server, mount, shm):
    """Data scattered in small pieces (32 KiB every 64 KiB) is still read
    in large chunks: a hole shorter than 64 KiB costs less to read than a
    request more, so chunks run across it (not one 32 KiB read each)."""
    size = 16 * MiB
    runs = [(k * 64 * 1024, 32 * 1024) for k in range(size // (64 * 1024))]
    _, t, _ = sparse_copy_out(server, mount, shm, size, runs, "1ms",
                              reader="dd")
    assert t.n["Read"] <= size // (2 * MiB) + 4, \
        f"{t.n['Read']} reads for {size} bytes in 32 KiB pieces"


def test_read_ahead_goes_on_across_long_holes(server, mount, shm):
    """cp's SEEK_DATA loop skips each hole: its next read is far ahead of
    the last (here 40 MiB, beyond the 16 MiB that counts as sequential),
    yet nothing between is data, so the stream goes on and the chunks of
    the next run are already on their way: no read of the copy waits for
    a server read of its own (no miss), and the server reads the data
    only."""
    runs = [(k * 42 * MiB + 4096 * k, 2 * MiB + 12345 * k)
            for k in range(6)]
    m, t, data = sparse_copy_out(server, mount, shm, 256 * MiB, runs, "2ms")
    ra = status(m)["readahead"]
    assert ra["miss_bytes"] == 0 and ra["hit_bytes"] >= data, ra
    assert_read_data_only(t, data, runs)


def test_window_is_bytes_of_data_not_chunks(server, mount, shm):
    """The window ahead of a reader is 16 MiB of data (8 chunks of 2 MiB),
    however the data lies: a disk 25% full in 1 MiB pieces gets 16 reads of
    1 MiB ahead, as many bytes as a dense disk, not 8 (which hid only half
    the server's latency).  Never more than 16 reads however small the
    pieces, and each holds a whole chunk's buffer of the budget."""
    size = 128 * MiB
    runs = [(k * 4 * MiB, MiB) for k in range(size // (4 * MiB))]
    src = make_sparse_image(shm / "src.img", size, runs=runs)
    srv = server("memory", f"size={size}", "rdelay=400ms",
                 filters=["delay"], log=True)
    r = run(["nbdcopy", src.path, srv.uri])
    assert r.returncode == 0, r.stderr
    with open(src.path, "rb") as f:
        first = f.read(MiB)
    m = mount(srv)
    mark = log_mark(srv)
    with open(m.mp / "nbd", "rb", buffering=0) as f:
        got = b"".join(f.read(128 * 1024) for _ in range(8))  # as cp reads
        assert got == first, "the first piece differs"
        time.sleep(1.0)                   # what was started has arrived
        ra = status(m)["readahead"]
        t = traffic(srv, since=mark)
        starts = sorted(q.offset for q in t.reqs if q.op == "Read")
        assert starts == [k * 4 * MiB for k in range(16)], starts
        assert all(q.count == MiB for q in t.reqs if q.op == "Read")
        assert ra["in_use"] == 16 * 2 * MiB, ra
    ra = status(m)["readahead"]
    assert ra["in_use"] == 0 and ra["waits"] >= 1, ra


def test_vhd_export_reads_ahead(server, mount, shm):
    size = 24 * MiB
    srv = server("memory", f"size={size}", "rdelay=2ms", filters=["delay"],
                 log=True)
    old = fill_random(srv.uri, size)
    m = mount(srv)
    mark = os.path.getsize(srv.log)
    out = shm / "out.vhd"
    copy_out(m, out, "nbd.vhd")
    raw = shm / "back.raw"
    qemu_img("convert", vpc_spec(out), "-O", "raw", raw)
    assert raw.read_bytes() == old, "nbd.vhd does not hold the disk"
    t = traffic(srv, since=mark)
    assert t.n["Read"] <= size // (2 * MiB) + 4, \
        f"{t.n['Read']} reads for the VHD of a {size}-byte disk"


# ---- readers and writers at once ----------------------------------------

def stamp(block, version):
    """A block's content at a version: (block, version) repeated; version
    0 is the initial content, None zero (punched)."""
    if version is None:
        return bytes(BLOCK)
    return struct.pack("<QQ", MAGIC | block, version) * (BLOCK // 16)


class History:
    """Per block: the writes to it, (version, t_start, t_end), in order
    (one writer, so order in time is version order)."""

    def __init__(self, nblocks):
        self.w = [[(0, 0.0, 0.0)] for _ in range(nblocks)]
        self.lock = threading.Lock()

    def start(self, first, n, version, t0):
        """Before the write is issued: a reader that checks its bytes
        while the writer is still between the write's return and its
        bookkeeping must find it (the writer thread can be descheduled
        there for as long as the machine likes)."""
        with self.lock:
            for b in range(first, first + n):
                self.w[b].append((version, t0, float("inf")))

    def done(self, first, n, t1):
        with self.lock:
            for b in range(first, first + n):
                v, t0, _ = self.w[b][-1]
                self.w[b][-1] = (v, t0, t1)

    def allowed(self, b, rs, re_):
        """Versions a read running [rs, re_] may see in block b: the last
        one finished before rs, and every one started before re_ after
        it."""
        with self.lock:
            hist = list(self.w[b])
        last_done = 0
        for i, (_, _, t1) in enumerate(hist):
            if t1 < rs:
                last_done = i
        return {v for i, (v, t0, _) in enumerate(hist)
                if i >= last_done and (i == last_done or t0 <= re_)}


def decode(block, data):
    if data == bytes(BLOCK):
        return None
    b, v = struct.unpack_from("<QQ", data)
    if b != MAGIC | block or data != stamp(block, v):
        return "torn"
    return v


def bytewise(block, data, versions):
    """A block mixing versions: each byte from one of them (a read that
    runs while a write lands may see part of it, never older bytes)."""
    cands = [stamp(block, v) for v in versions]
    return len(cands) > 1 and all(any(c[i] == x for c in cands)
                                  for i, x in enumerate(data))


def writer(path, nblocks, hist, stop, rng, errors):
    fd = os.open(path, os.O_RDWR)
    version = 0
    try:
        while not stop.is_set():
            version += 1
            n = rng.choice([1, 3, 16, 64, 300])
            first = rng.randrange(0, nblocks - n)
            kind = rng.random()
            t0 = time.monotonic()
            hist.start(first, n, version if kind < 0.85 else None, t0)
            if kind < 0.85:
                data = b"".join(stamp(b, version)
                                for b in range(first, first + n))
                assert os.pwrite(fd, data, first * BLOCK) == len(data)
            else:
                mode = (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
                        if kind < 0.93 else FALLOC_FL_ZERO_RANGE)
                fallocate(fd, mode, first * BLOCK, n * BLOCK)
            hist.done(first, n, time.monotonic())
            time.sleep(rng.random() * 0.004)
    except BaseException as e:
        errors.append(f"writer: {e!r}")
    finally:
        os.close(fd)


def reader(path, nblocks, hist, passes, rng, bad, errors):
    fd = os.open(path, os.O_RDONLY)
    try:
        for _ in range(passes):
            pos = 0
            size = nblocks * BLOCK
            step = 128 * 1024
            while pos < size:
                rs = time.monotonic()
                data = os.pread(fd, min(step, size - pos), pos)
                re_ = time.monotonic()
                assert data, f"short read at {pos}"
                for i in range(0, len(data), BLOCK):
                    b = (pos + i) // BLOCK
                    ok = hist.allowed(b, rs, re_)
                    v = decode(b, data[i:i + BLOCK])
                    if v == "torn" and bytewise(b, data[i:i + BLOCK], ok):
                        continue    # a write ran during the read
                    if v == "torn" or v not in ok:
                        bad.append((b, v, sorted(ok, key=str)))
                pos += len(data)
    except BaseException as e:
        errors.append(f"reader: {e!r}")
    finally:
        os.close(fd)


@pytest.mark.parametrize("delays", [("rdelay=2ms", "wdelay=1ms"),
                                    ("rdelay=3ms",)])
def test_readers_and_writers(server, mount, shm, delays):
    nblocks = 16 * MiB // BLOCK
    init = shm / "init.img"
    init.write_bytes(b"".join(stamp(b, 0) for b in range(nblocks)))
    srv = server("memory", f"size={nblocks * BLOCK}", *delays,
                 filters=["delay"])
    r = run(["nbdcopy", init, srv.uri])
    assert r.returncode == 0, r.stderr
    m = mount(srv, "--idle-ms", "1")
    hist = History(nblocks)
    stop = threading.Event()
    bad, errors = [], []
    w = threading.Thread(target=writer, args=(m.file, nblocks, hist, stop,
                                              random.Random(1), errors))
    rs = [threading.Thread(target=reader,
                           args=(m.file, nblocks, hist, 8, random.Random(i),
                                 bad, errors)) for i in range(2)]
    w.start()
    for t in rs:
        t.start()
    for t in rs:
        t.join(300)
    stop.set()
    w.join(60)
    assert not errors, errors
    assert not bad, f"{len(bad)} blocks with a version not current during " \
        f"the read (block, seen, allowed): {bad[:5]}"
    # The readers were served by read-ahead (else the test shows nothing):
    # their 128 KiB reads went out as larger requests.
    st = status(m)
    reads = st["requests_completed"]["read"]
    assert reads and st["bytes_read"] / reads > 256 * 1024, st
    assert st["readahead"]["hit_bytes"] > 0, st["readahead"]
    # And the final state is every block's last version.
    final = m.file.read_bytes()
    for b in range(nblocks):
        want = hist.w[b][-1][0]
        assert decode(b, final[b * BLOCK:(b + 1) * BLOCK]) == want, b


@pytest.mark.parametrize("how", ["truncate", "punch", "write"])
def test_change_ahead_of_reader(server, mount, how):
    """A reader half way through, its read-ahead covering what follows;
    another handle changes the range just ahead (truncate and extend back,
    punch a hole, overwrite); the reader goes on and must see the change
    at once."""
    size = 32 * MiB
    srv = server("memory", f"size={size}", "rdelay=1ms", filters=["delay"])
    old = fill_random(srv.uri, size)
    m = mount(srv)
    half = size // 2
    with open(m.file, "rb", buffering=0) as r:
        got = b""
        while len(got) < half:
            got += r.read(MiB)
        assert got == old[:half]
        with open(m.file, "r+b", buffering=0) as w:
            if how == "truncate":
                os.ftruncate(w.fileno(), half)
                os.ftruncate(w.fileno(), size)
                new = bytes(half)
            elif how == "punch":
                fallocate(w.fileno(),
                          FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                          half, half)
                new = bytes(half)
            else:
                new = random_bytes(half)
                w.seek(half)
                w.write(new)
        rest = b""
        while len(rest) < half:
            chunk = r.read(MiB)
            assert chunk, "short read"
            rest += chunk
    assert rest == new, f"the reader saw bytes from before the {how}"


def test_budget_shared_by_readers(server, mount, shm):
    """Six readers at once through a 6 MiB budget (three chunks): every
    copy is exact, and the chunks in use never exceed the budget."""
    size = 24 * MiB
    srv = server("memory", f"size={size}", "rdelay=1ms", filters=["delay"])
    old = fill_random(srv.uri, size)
    m = mount(srv, "--readahead", "6M")
    outs = [shm / f"out{i}.img" for i in range(6)]
    procs = [subprocess.Popen(["cp", m.file, o]) for o in outs]
    peak = 0
    while any(p.poll() is None for p in procs):
        ra = status(m)["readahead"]
        assert ra["budget"] == 6 * MiB
        peak = max(peak, ra["in_use"])
        time.sleep(0.01)
    assert all(p.wait() == 0 for p in procs)
    assert peak <= 6 * MiB
    for o in outs:
        assert o.read_bytes() == old, f"{o.name} differs from the disk"
    assert status(m)["readahead"]["hit_bytes"] > 0
