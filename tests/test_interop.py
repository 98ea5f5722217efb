"""Every NBD server a user has: the interop matrix.

Servers: nbdkit (memory, file), qemu-nbd (raw and qcow2 images),
nbd-server 3.24 (Debian's; TCP, no structured replies so no block status,
no block sizes, no flush by default), and nbdkit filters that take a
capability away or constrain it: no write-zeroes, no fast zero (absent,
failing with ENOTSUP, or advertised and ignored), no multi-conn, no block
status, a small advertised maximum block size (blocksize-policy, which
fails larger reads and writes), and the blocksize filter's minimum block
size with a 1 MiB maximum.

Copy tools: `cp --sparse=always`, `dd conv=sparse`, `rsync --inplace`,
each onto a disk pre-filled with random bytes.  The image has data runs, a
38 MiB hole and ends 88 MiB before the end of the disk, so a zeroing of
the hole or the tail sent as one request would be longer than the 32 MiB
the protocol lets a silent server assume (and than the 64 MiB nbd-server
3.24 really zeroes of a longer write-zeroes, answering success).

Every cell checks the file through the mount and then sha256 of the whole
disk, read from the server's backing file (nbdkit file, qemu-nbd raw,
nbd-server) or from the server itself (nbdkit memory, qemu-nbd qcow2),
against the image followed by zeros.
"""

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from lib.content import (assert_content, describe_mismatch, file_reader,
                         nbd_reader, padded)
from lib.digest import sha256_file
from lib.env import BUILD, MiB, timeout
from lib.images import make_sparse_image
from lib.nbd import fill_random, sha256_nbd
from lib.procs import free_tcp_port, run, wait_for
from lib.servers import plugin_path

EXPORT = 160 * MiB
IMAGE = 72 * MiB + 12345
RUNS = [(0, 5 * MiB + 7), (9 * MiB, 3 * MiB), (50 * MiB + 4097, 2 * MiB),
        (IMAGE - 4097, 4097)]

TOOLS = {
    "cp": lambda src, dst: ["cp", "--sparse=always", src, dst],
    "dd": lambda src, dst: ["dd", f"if={src}", f"of={dst}", "bs=1M",
                            "conv=sparse", "status=none"],
    "rsync": lambda src, dst: ["rsync", "--inplace", src, dst],
}


def need(*tools):
    """A missing tool fails the test: the matrix must run everywhere CI
    runs (scripts/install-deps installs them)."""
    gone = [t for t in tools if shutil.which(t) is None]
    if gone:
        pytest.fail("not installed: " + ", ".join(gone) +
                    " (run scripts/install-deps)")


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    d = Path("/dev/shm") if os.path.isdir("/dev/shm") else \
        tmp_path_factory.mktemp("img")
    path = d / f"nbdferry-interop-{os.getpid()}.img"
    img = make_sparse_image(path, IMAGE, RUNS, seed=15)
    yield img
    path.unlink(missing_ok=True)


def random_disk(path, size, seed=0):
    """A dense backing file of random bytes (a disk with old data)."""
    r = subprocess.run(
        ["nbdcopy", "--", "[", "nbdkit", "--exit-with-parent", "-r",
         "random", f"size={size}", f"seed={seed}", "]", str(path)],
        capture_output=True, text=True, timeout=timeout(120))
    assert r.returncode == 0, f"nbdcopy random -> {path}: {r.stderr}"
    return path


# ------------------------------------------------------------------ servers

class Daemon:
    """A server that forks into the background (nbd-server): known by its
    pidfile, ended by that pid only."""

    def __init__(self, pidfile):
        self.pidfile = pidfile

    def pid(self):
        try:
            return int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return None

    def alive(self):
        pid = self.pid()
        if pid is None:
            return False
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    def stop(self):
        pid = self.pid()
        if pid is None or not self.alive():
            return
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.alive():
            os.kill(pid, signal.SIGKILL)


def tcp_ready(port):
    def ok():
        with socket.socket() as s:
            s.settimeout(0.5)
            return s.connect_ex(("127.0.0.1", port)) == 0
    return ok


@pytest.fixture
def servers(server, shortdir, shm):
    """Factory: servers(kind[, make_disk]) starts one server of the matrix
    with a random-filled disk (or the one make_disk(path, size) writes;
    nbdkit file and qemu-nbd) and returns SimpleNamespace(uri, check) where
    check(expected) compares the whole disk with the expected bytes."""
    stops = []

    def nbdkit(plugin_args, filters=(), params=()):
        return server(*plugin_args, *params, filters=filters)

    def start(kind, make_disk=None):
        disk = shm / "disk.img"
        make_disk = make_disk or random_disk
        if kind == "nbdkit-memory":
            srv = nbdkit(("memory", f"size={EXPORT}"))
            fill_random(srv.uri, EXPORT)
            return SimpleNamespace(uri=srv.uri, backing=None, read_uri=True)
        if kind.startswith("nbdkit-"):
            filters, params = NBDKIT_FILTERS[kind]
            make_disk(disk, EXPORT)
            srv = nbdkit(("file", disk), filters, params)
            return SimpleNamespace(uri=srv.uri, backing=disk, read_uri=False)
        if kind.startswith("qemu-nbd-"):
            need("qemu-nbd", "qemu-img")
            fmt = kind.split("-")[-1]
            make_disk(disk, EXPORT)
            if fmt == "qcow2":
                q = shm / "disk.qcow2"
                run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2",
                     disk, q], check=True)
                disk.unlink()
                disk = q
            sock, pidf = shortdir / "q.sock", shortdir / "q.pid"
            errf = open(shortdir / "q.err", "wb")
            p = subprocess.Popen(
                ["qemu-nbd", "--persistent", "--shared=8", "-f", fmt,
                 "--cache=writeback", "--discard=unmap", "-k", str(sock),
                 "--pid-file", str(pidf), str(disk)],
                stdin=subprocess.DEVNULL, stdout=errf, stderr=errf)
            stops.append(lambda: (p.terminate(), p.wait(10), errf.close()))
            wait_for(lambda: pidf.exists() and sock.exists(), p, "qemu-nbd",
                     timeout=30)
            return SimpleNamespace(uri=f"nbd+unix:///?socket={sock}",
                                   backing=disk if fmt == "raw" else None,
                                   read_uri=fmt != "raw")
        if kind == "nbd-server":
            need("nbd-server")
            random_disk(disk, EXPORT)
            port = free_tcp_port()
            cfg, pidf = shortdir / "nbd-server.conf", shortdir / "nbds.pid"
            # Defaults otherwise: no flush, no trim, no block sizes.
            cfg.write_text(f"[generic]\n    port = {port}\n"
                           f"    allowlist = false\n"
                           f"[disk]\n    exportname = {disk}\n")
            d = Daemon(pidf)
            stops.append(d.stop)
            r = run(["nbd-server", "-C", cfg, "-p", pidf], check=False)
            assert r.returncode == 0, f"nbd-server: {r.stderr}"
            wait_for(tcp_ready(port), None, "nbd-server", timeout=30)
            return SimpleNamespace(uri=f"nbd://127.0.0.1:{port}/disk",
                                   backing=disk, read_uri=False)
        raise ValueError(kind)

    yield start
    for s in reversed(stops):
        s()


# nbdkit file plugin with filters: (filters, parameters).
NBDKIT_FILTERS = {
    "nbdkit-file": ((), ()),
    "nbdkit-nozero": (("nozero",), ("zeromode=none",)),
    "nbdkit-fastzero-none": (("nozero",),
                             ("zeromode=plugin", "fastzeromode=none")),
    "nbdkit-fastzero-slow": (("nozero",),
                             ("zeromode=plugin", "fastzeromode=slow")),
    "nbdkit-fastzero-ignore": (("nozero",),
                               ("zeromode=plugin", "fastzeromode=ignore")),
    "nbdkit-no-multi-conn": (("multi-conn",), ("multi-conn-mode=disable",)),
    "nbdkit-noextents": (("noextents",), ()),
    "nbdkit-max-1M": (("blocksize-policy",),
                      ("blocksize-maximum=1M", "blocksize-error-policy=error")),
    "nbdkit-blocksize-4k-1M": (("blocksize",),
                               ("minblock=4k", "maxdata=1M", "maxlen=1M")),
}

SERVERS = (["nbdkit-memory"] + list(NBDKIT_FILTERS) +
           ["qemu-nbd-raw", "qemu-nbd-qcow2", "nbd-server"])


@pytest.mark.parametrize("tool", list(TOOLS))
@pytest.mark.parametrize("kind", SERVERS)
def test_interop_copy_onto_dirty_disk(servers, mount, image, kind, tool):
    need(TOOLS[tool]("", "")[0], "nbdcopy")
    t = servers(kind)
    m = mount(t.uri)
    r = run(TOOLS[tool](str(image.path), m.file), timeout=timeout(120))
    assert r.returncode == 0, f"{tool} exited {r.returncode}: {r.stderr}"
    assert_content(image.path, EXPORT, mount_file=m.file,
                   mount_size=IMAGE, what=f"{tool} onto {kind}, mount")
    m.unmount()
    want = sha256_file(image.path, pad_to=EXPORT)
    if t.read_uri:
        got, actual = sha256_nbd(t.uri, EXPORT), nbd_reader(t.uri)
    else:
        got, actual = sha256_file(t.backing), file_reader(t.backing)
    assert got == want, (
        f"{tool} onto {kind}: the disk's sha256 {got[:16]} differs from "
        f"the image's {want[:16]}:\n" + describe_mismatch(
            padded(file_reader(image.path), IMAGE), actual, EXPORT))


# ---------------------------------------------------- a server that lies

# The lying RAM disk (tests/nbdkit-plugins/liar.c, built by CMake) with
# dropzero=1 acknowledges every write-zeroes but zeroes only the first half
# of any request of 1 MiB or more: the kind of silent loss nbd-server 3.24
# shows for requests over 64 MiB.  It has no extents callback: nbdkit
# reports everything as data, as nbd-server (no block status) does.


def test_readback_catches_a_server_that_drops_zeroes(server, mount, shm,
                                                      shortdir):
    """What read-back verification is for (docs/servers.md): a server
    that acknowledges a zeroing it did not do.  The copy succeeds and
    the mount reads back what was meant (it knows those ranges are zero
    and does not ask the server), so neither can see the loss; reading the
    disk back from the server, as nbdferry-verify does, catches it and
    names the ranges."""
    size, isize = 64 * MiB, 40 * MiB + 4097
    srv = server(plugin_path("liar"), f"size={size}", "dropzero=1")
    fill_random(srv.uri, size)
    img = make_sparse_image(shm / "src.img", isize,
                            [(0, 2 * MiB), (20 * MiB, MiB),
                             (isize - 4097, 4097)], seed=3)
    m = mount(srv, "--no-digest")
    r = run(["cp", "--sparse=always", img.path, m.file], timeout=timeout(60))
    assert r.returncode == 0, f"cp: {r.stderr}"
    assert_content(img.path, size, mount_file=m.file, mount_size=isize,
                   what="through the mount")
    m.unmount()

    verify = BUILD / "tools" / "nbdferry-verify"
    if not verify.exists():
        pytest.fail(f"{verify} not built")
    v = run([verify, "--json", "--zero-tail", img.path, srv.uri],
            timeout=timeout(60))
    assert v.returncode == 1, \
        f"read-back found no difference:\n{v.stdout}{v.stderr}"
    rep = json.loads(v.stdout)
    # The stale bytes are in the holes and the tail, nowhere else.
    holes = [(2 * MiB, 20 * MiB), (21 * MiB, isize - 4097)]
    assert rep["mismatch_ranges"], rep
    for rg in rep["mismatch_ranges"]:
        off, n = rg["offset"], rg["length"]
        assert any(a <= off and off + n <= b for a, b in holes), (rg, holes)
    assert rep["tail_nonzero_offset"] is not None, rep


# ------------------------------------------- reads answered with holes

def fine_sparse_disk(path, size):
    """Data and holes every 64-512 KiB: most 256 KiB and 2 MiB reads hold
    both, so a server that answers holes as such (qemu-nbd) sends data and
    hole chunks in one reply.  Different layouts at the same place of
    successive 2 MiB chunks: a reused read buffer holds old data exactly
    where the next read has a hole."""
    rng = random.Random(21)
    with open(path, "wb") as f:
        f.truncate(size)
        pos = 0
        while pos < size:
            n = min(rng.choice((1, 2, 3, 4, 8)) * 64 * 1024, size - pos)
            if rng.random() < 0.5:
                f.seek(pos)
                f.write(rng.randbytes(n))
            pos += n
    return path


def hole_chunks(uri, off, length):
    """Hole chunks in the server's answer to one read, as libnbd hands
    them to a chunked read (nbd_pread_structured, in libnbd 1.14 as in
    1.22 and with extended headers).  Not from LIBNBD_DEBUG's state
    names: Debian 13's libnbd 1.22 logs no state transitions."""
    env = dict(os.environ, PATH="/usr/bin:" + os.environ.get("PATH", ""))
    code = f"""
holes = 0
def chunk(subbuf, offset, status, err):
    global holes
    holes += status == nbd.READ_HOLE
    return 0
h.pread_structured({length}, {off}, chunk)
print(holes)
"""
    r = subprocess.run(["nbdsh", "-u", uri, "-c", code],
                       capture_output=True, text=True, env=env,
                       timeout=timeout(60))
    assert r.returncode == 0, r.stderr
    return int(r.stdout)


@pytest.mark.parametrize("kind", ["qemu-nbd-raw", "qemu-nbd-qcow2"])
def test_reads_answered_with_holes_read_zeros(servers, mount, shm, kind):
    """The daemon lets libnbd skip zeroing each read buffer (a memset of
    every byte read): a hole chunk in a reply must still read as zeros,
    never as what the buffer held before.  qemu-nbd answers a read over a
    hole with a hole chunk; the layout puts holes inside almost every
    request and where earlier chunks had data.  Read three ways: cp (the
    read-ahead's reused chunk buffers), dd at 64 KiB in a shuffled order
    (direct reads), nbdferry-verify (its own read ring)."""
    need("qemu-nbd", "qemu-img", "nbdsh")
    t = servers(kind, fine_sparse_disk)
    ref = shm / "ref.img"
    fine_sparse_disk(ref, EXPORT)
    want = sha256_file(ref)
    assert hole_chunks(t.uri, 0, 4 * MiB) > 0, \
        f"{kind} sent no hole chunk: the test would not test anything"
    m = mount(t.uri, "--no-digest")

    out = shm / "out.img"
    r = run(["cp", m.file, out], timeout=timeout(120))
    assert r.returncode == 0, f"cp out: {r.stderr}"
    assert sha256_file(out) == want, "cp out: " + describe_mismatch(
        file_reader(ref), file_reader(out), EXPORT)
    st = json.loads((Path(m.mp) / ".nbdferry-status").read_text())
    assert st["readahead"]["hit_bytes"] > EXPORT // 2, st["readahead"]

    blocks = list(range(EXPORT // (64 * 1024)))
    random.Random(5).shuffle(blocks)
    got = bytearray(EXPORT)
    fd = os.open(m.file, os.O_RDONLY)
    try:
        for b in blocks:
            got[b * 64 * 1024:(b + 1) * 64 * 1024] = \
                os.pread(fd, 64 * 1024, b * 64 * 1024)
    finally:
        os.close(fd)
    out.write_bytes(got)
    assert sha256_file(out) == want, "shuffled reads: " + describe_mismatch(
        file_reader(ref), file_reader(out), EXPORT)
    m.unmount()

    verify = BUILD / "tools" / "nbdferry-verify"
    if not verify.exists():
        pytest.fail(f"{verify} not built")
    v = run([verify, ref, t.uri], timeout=timeout(60))
    assert v.returncode == 0, f"nbdferry-verify: {v.stdout}{v.stderr}"
