"""Read-back verification (--verify-readback): after the copy the daemon
reads the disk back from the server and compares it with the inline
digest.

A good server passes after cp --sparse=always, dd and with --blkhash; a
server that lies (acknowledges a write-zeroes it only half did, or flips a
byte of a write it acknowledges) fails the copy tool's close with EIO, the
status names the differing ranges (--blkhash), and an unmount-time
verification makes the daemon exit non-zero.  A read error during the
read-back is an error, never a pass.  A mostly-empty disk costs reading
its data, not its size (block status).
"""

import errno
import json
import os
import re
import shutil

from pathlib import Path

import pytest

from lib.content import assert_content
from lib.digest import sha256_file
from lib.env import MiB, timeout
from lib.images import make_sparse_image, random_bytes
from lib.nbd import fill_random, sha256_nbd
from lib.procs import run
from lib.servers import plugin_path

BLOCK = 64 * 1024
TOOL = Path(__file__).resolve().parent.parent / "tools" / "status" / "nbdferry-status"


def need(*tools):
    gone = [t for t in tools if shutil.which(t) is None]
    if gone:
        pytest.fail("not installed: " + ", ".join(gone))


def status(m):
    with open(m.mp / ".nbdferry-status") as f:
        return json.load(f)


# A RAM disk that lies: tests/nbdkit-plugins/liar.c, built by CMake:
#   dropzero=1  a write-zeroes of 1 MiB or more zeroes only its first half
#               (the loss nbd-server 3.24 shows past 64 MiB), and succeeds;
#   flip=OFF    a write covering byte OFF lands with that byte inverted,
#               and succeeds;
#   failread=PATH  reads fail with EIO while PATH exists.
# No extents callback: everything is data, as on nbd-server.


@pytest.fixture
def liar(server, shortdir):
    """liar(size, **params) -> a running lying server."""
    plugin = plugin_path("liar")

    def start(size, log=False, **params):
        return server(plugin, f"size={size}",
                      *[f"{k}={v}" for k, v in params.items()], log=log)
    return start


def digest_opts(kind):
    return ["--blkhash"] if kind == "blkhash" else ["--digest=sha256"]


def copy(cmd):
    return run(cmd, timeout=timeout(120))


def assert_eio(r, what):
    assert r.returncode != 0, f"{what} succeeded on a lying server"
    assert os.strerror(errno.EIO) in r.stderr, \
        f"{what}: expected EIO, got: {r.stderr}"


# ----------------------------------------------------------- a good server

@pytest.mark.parametrize("kind", ["sha256", "blkhash"])
@pytest.mark.parametrize("tool", ["cp", "dd"])
def test_readback_passes_on_a_good_server(server, mount, shm, tool, kind):
    size = 96 * MiB
    srv = server("memory", f"size={size}")
    fill_random(srv.uri, size)
    img = make_sparse_image(shm / "src.img", 40 * MiB + 4097,
                            [(0, 3 * MiB + 5), (17 * MiB, 2 * MiB),
                             (40 * MiB, 4097)], seed=1)
    m = mount(srv, "--verify-readback", *digest_opts(kind))
    cmd = (["cp", "--sparse=always", img.path, m.file] if tool == "cp" else
           ["dd", f"if={img.path}", f"of={m.file}", "bs=1M", "conv=fsync",
            "status=none"])
    r = copy(cmd)
    assert r.returncode == 0, f"{tool}: {r.stderr}"
    st = status(m)
    rb = st["readback"]
    assert rb["state"] == "passed", rb
    assert rb["expected"] == rb["read_back"] == st["digest"]["value"], rb
    assert rb["verified"] == rb["total"] == size, rb
    assert rb["runs"] >= 1, rb
    r = run(["/usr/bin/python3", TOOL, m.mp], check=True)
    assert "read-back   passed" in r.stdout, r.stdout
    m.unmount()
    assert sha256_nbd(srv.uri) == sha256_file(img.path, pad_to=size)
    assert "read-back at close" in m.stderr


def test_readback_at_unmount_only(server, mount, shm):
    size = 64 * MiB
    srv = server("memory", f"size={size}")
    img = make_sparse_image(shm / "src.img", 9 * MiB + 3,
                            [(MiB, 2 * MiB), (9 * MiB, 3)], seed=2)
    m = mount(srv, "--verify-readback=unmount", "--blkhash=sha256/4k")
    r = copy(["cp", "--sparse=always", img.path, m.file])
    assert r.returncode == 0, r.stderr
    assert status(m)["readback"]["state"] == "idle"
    m.unmount()
    assert "read-back at unmount" in m.stderr, m.stderr
    assert sha256_nbd(srv.uri) == sha256_file(img.path, pad_to=size)


def test_readback_reads_only_the_data(server, mount, shm):
    """A 1 GiB disk holding 6 MiB of data: block status says where the
    zeros are; only the data is read (counted by the status and by the
    server's log)."""
    size = 1024 * MiB
    srv = server("memory", f"size={size}", log=True)
    img = make_sparse_image(shm / "src.img", 700 * MiB,
                            [(0, 2 * MiB), (300 * MiB, 2 * MiB),
                             (698 * MiB, 2 * MiB)], seed=4)
    m = mount(srv, "--verify-readback", "--blkhash")
    before = read_bytes_logged(srv.log)
    r = copy(["cp", "--sparse=always", img.path, m.file])
    assert r.returncode == 0, r.stderr
    rb = status(m)["readback"]
    assert rb["state"] == "passed", rb
    data = 6 * MiB
    assert data <= rb["bytes_read"] <= data + 3 * MiB, rb
    assert rb["zero_bytes_not_read"] >= size - data - 3 * MiB, rb
    logged = read_bytes_logged(srv.log) - before
    assert data <= logged <= data + 3 * MiB, \
        f"the server was asked for {logged} bytes"
    m.unmount()
    assert sha256_nbd(srv.uri) == sha256_file(img.path, pad_to=size)


def read_bytes_logged(log):
    """Bytes the log filter saw read so far."""
    text = log.read_text(errors="replace") if log.exists() else ""
    return sum(int(c, 0) for c in
               re.findall(r"\bRead id=\d+ offset=\S+ count=(\S+)", text))


# ----------------------------------------------------------- lying servers

@pytest.mark.parametrize("kind", ["sha256", "blkhash"])
def test_readback_catches_dropped_zeroes(liar, mount, shm, kind):
    """cp --sparse=always onto a dirty disk: the holes and the tail are
    zeroed, the server does half of each large zeroing.  cp's close gets
    EIO; with blkhash the status names ranges inside the holes only."""
    size, isize = 64 * MiB, 40 * MiB + 4097
    srv = liar(size, dropzero=1)
    fill_random(srv.uri, size)
    img = make_sparse_image(shm / "src.img", isize,
                            [(0, 2 * MiB), (20 * MiB, MiB),
                             (isize - 4097, 4097)], seed=3)
    m = mount(srv, "--verify-readback", *digest_opts(kind), expect_rc=1,
              expect_errors=True)
    r = copy(["cp", "--sparse=always", img.path, m.file])
    assert_eio(r, "cp")
    rb = status(m)["readback"]
    assert rb["state"] == "failed", rb
    assert rb["expected"] != rb["read_back"], rb
    if kind == "blkhash":
        holes = [(2 * MiB, 20 * MiB), (21 * MiB, isize - 4097)]
        assert rb["ranges_known"] and rb["ranges"], rb
        for rg in rb["ranges"]:
            off, n = rg["offset"], rg["length"]
            assert off % BLOCK == 0, rg
            assert any(a <= off and off + n <= b for a, b in holes), rg
        # Both holes lost bytes: both show.
        assert any(rg["offset"] < 20 * MiB for rg in rb["ranges"]), rb
        assert any(rg["offset"] > 21 * MiB for rg in rb["ranges"]), rb
    else:
        assert rb["ranges_known"] is False, rb
        assert "--blkhash" in rb["message"], rb
    rc = m.unmount(check=False)
    assert rc == 1, f"the daemon exited {rc} after a failed read-back"
    assert "read-back" in m.stderr and "differs" in m.stderr, m.stderr


@pytest.mark.parametrize("kind", ["sha256", "blkhash"])
def test_readback_catches_a_flipped_byte(liar, mount, shm, kind):
    size = 32 * MiB
    flip = 5 * MiB + 12345
    srv = liar(size, flip=flip)
    img = make_sparse_image(shm / "src.img", 8 * MiB, [(0, 8 * MiB)], seed=5)
    m = mount(srv, "--verify-readback", *digest_opts(kind), expect_rc=1,
              expect_errors=True)
    r = copy(["dd", f"if={img.path}", f"of={m.file}", "bs=1M",
              "conv=fsync", "status=none"])
    assert_eio(r, "dd")
    rb = status(m)["readback"]
    assert rb["state"] == "failed", rb
    if kind == "blkhash":
        assert rb["ranges"] == [{"offset": flip // BLOCK * BLOCK,
                                 "length": BLOCK}], rb
        assert rb["differing_ranges"] == 1, rb
        # nbdferry-status names it too.
        r = run(["/usr/bin/python3", TOOL, m.mp], check=True)
        assert "read-back   failed" in r.stdout, r.stdout
        assert (f"differs: {BLOCK} bytes at offset {flip // BLOCK * BLOCK}"
                in r.stdout), r.stdout
    assert m.unmount(check=False) == 1


def test_readback_catches_dirty_tail(liar, mount, shm):
    """The bytes past the file's end must read as zero: a server that
    drops half of the tail's zeroing fails it even when the file itself
    matches."""
    size = 48 * MiB
    srv = liar(size, dropzero=1)
    fill_random(srv.uri, size)
    img = make_sparse_image(shm / "src.img", 4 * MiB, [(0, 4 * MiB)], seed=6)
    m = mount(srv, "--verify-readback", "--blkhash", expect_rc=1,
              expect_errors=True)
    r = copy(["cp", "--sparse=always", img.path, m.file])
    assert_eio(r, "cp")
    rb = status(m)["readback"]
    assert rb["state"] == "failed", rb
    assert rb["expected"] == rb["read_back"], rb
    assert rb["tail_nonzero_offset"] >= 4 * MiB, rb
    assert m.unmount(check=False) == 1


def test_readback_server_error_is_not_a_pass(liar, mount, shm, shortdir):
    """Reads failing during the read-back fail the close with EIO and show
    as an error; once the server reads again, the unmount verifies and
    the daemon exits 0."""
    size = 32 * MiB
    flag = shortdir / "failread"
    srv = liar(size, failread=flag)
    img = make_sparse_image(shm / "src.img", 6 * MiB, [(0, 6 * MiB)], seed=7)
    data = img.path.read_bytes()
    m = mount(srv, "--verify-readback", "--blkhash", expect_errors=True)
    fd = os.open(m.file, os.O_WRONLY | os.O_TRUNC)
    os.write(fd, data)
    os.fsync(fd)                  # not closed: nothing to verify yet
    flag.write_text("")
    with pytest.raises(OSError) as e:
        os.close(fd)
    assert e.value.errno == errno.EIO
    rb = status(m)["readback"]
    assert rb["state"] == "error", rb
    assert "failed" in rb["message"], rb
    flag.unlink()
    assert m.unmount(check=False) == 0
    assert "read-back at unmount" in m.stderr, m.stderr
    assert_content(data, size, uri=srv.uri, what="after the read-back")


def test_readback_names_a_block_folded_long_ago(liar, mount, shm):
    """Past 256 MiB the inline blkhash folds the blocks behind the data
    into its value and keeps only region fingerprints: a flipped byte
    near the start is still named to its block."""
    size, isize = 384 * MiB, 360 * MiB
    flip = 3 * MiB + 777
    srv = liar(size, flip=flip)
    img = make_sparse_image(shm / "src.img", isize, [(0, isize)], seed=8)
    m = mount(srv, "--verify-readback", "--blkhash", expect_rc=1,
              expect_errors=True)
    r = copy(["cp", img.path, m.file])
    assert_eio(r, "cp")
    rb = status(m)["readback"]
    assert rb["state"] == "failed", rb
    assert rb["ranges"] == [{"offset": flip // BLOCK * BLOCK,
                             "length": BLOCK}], rb
    assert m.unmount(check=False) == 1


# ------------------------------------ what the daemon touched is read back

def test_readback_reads_the_ranges_it_zeroed(liar, mount, shm):
    """A server that acknowledges write-zeroes without doing them and then
    reports those ranges as zero in block status (zerolie): cp
    --sparse=always onto a dirty disk leaves the old bytes in the holes.
    The read-back reads every range the daemon wrote or zeroed instead of
    trusting block status there: cp's close fails with EIO, the status
    says failed, the daemon exits 1."""
    size, isize = 64 * MiB, 24 * MiB + 4097
    srv = liar(size, zerolie=1)
    fill_random(srv.uri, size)
    img = make_sparse_image(shm / "src.img", isize,
                            [(0, 2 * MiB), (10 * MiB, MiB),
                             (isize - 4097, 4097)], seed=9)
    m = mount(srv, "--verify-readback", "--blkhash", expect_rc=1,
              expect_errors=True)
    r = copy(["cp", "--sparse=always", img.path, m.file])
    assert_eio(r, "cp")
    rb = status(m)["readback"]
    assert rb["state"] == "failed", rb
    # The truncate zeroed the whole export: nothing is taken on trust.
    assert rb["zero_bytes_not_read"] == 0 and rb["bytes_read"] == size, rb
    holes = [(2 * MiB, 10 * MiB), (11 * MiB, isize - 4097)]
    for rg in rb["ranges"]:
        assert any(a <= rg["offset"] < b for a, b in holes), rg
    out = run(["/usr/bin/python3", TOOL, m.mp], check=True).stdout
    assert "read-back   failed" in out and "passed" not in out, out
    assert m.unmount(check=False) == 1
    # The server did lie: its bytes are not the image's.
    assert sha256_nbd(srv.uri) != sha256_file(img.path, pad_to=size)


def test_readback_no_extents_reads_everything(server, mount, shm):
    """With --no-extents block status is never trusted: even the ranges
    the daemon skipped (--destination-is-zero: it zeroes nothing) are read
    back."""
    size = 32 * MiB
    srv = server("memory", f"size={size}")
    img = make_sparse_image(shm / "src.img", 8 * MiB,
                            [(0, MiB), (8 * MiB - 5, 5)], seed=10)
    m = mount(srv, "--verify-readback", "--no-extents",
              "--destination-is-zero")
    r = copy(["cp", "--sparse=always", img.path, m.file])
    assert r.returncode == 0, r.stderr
    rb = status(m)["readback"]
    assert rb["state"] == "passed", rb
    assert rb["zero_bytes_not_read"] == 0 and rb["bytes_read"] == size, rb
    m.unmount()
    assert sha256_nbd(srv.uri) == sha256_file(img.path, pad_to=size)


def test_readback_after_a_failed_write_fails_close(liar, mount, shortdir):
    """A read-back that cannot run is no pass: after a write the server
    failed, the close of that writer and of every later writer fail with
    EIO (the digest cannot vouch for the disk), the status says skipped
    with the reason, never passed."""
    size = 16 * MiB
    flag = shortdir / "failwrite"
    srv = liar(size, failwrite=flag)
    m = mount(srv, "--verify-readback", expect_rc=1, expect_errors=True)
    data = random_bytes(2 * MiB)
    fd = os.open(m.file, os.O_WRONLY | os.O_TRUNC)
    flag.write_text("")
    os.write(fd, data)
    with pytest.raises(OSError) as e:
        os.fsync(fd)                  # the write's own error
    assert e.value.errno == errno.EIO
    flag.unlink()
    with pytest.raises(OSError) as e:
        os.close(fd)                  # the error was reported: the check
    assert e.value.errno == errno.EIO
    fd = os.open(m.file, os.O_WRONLY | os.O_TRUNC)
    os.write(fd, data)
    with pytest.raises(OSError) as e:
        os.close(fd)                  # a new writer, the server fine now
    assert e.value.errno == errno.EIO
    rb = status(m)["readback"]
    assert rb["state"] == "skipped", rb
    assert "could not verify" in rb["message"], rb
    assert "request failed" in rb["message"], rb
    assert m.unmount(check=False) == 1


def test_readback_not_a_forward_pass_fails_close(server, mount, shm):
    """sha256 needs one forward pass: a writer that wrote out of order
    cannot be verified, and its close says so (EIO) instead of passing;
    the daemon exits 1.  The bytes still land."""
    size = 16 * MiB
    srv = server("memory", f"size={size}")
    m = mount(srv, "--verify-readback", "--digest=sha256", expect_rc=1,
              expect_errors=True)
    a, b = random_bytes(MiB), random_bytes(MiB)
    fd = os.open(m.file, os.O_WRONLY | os.O_TRUNC)
    os.pwrite(fd, b, MiB)
    os.pwrite(fd, a, 0)
    with pytest.raises(OSError) as e:
        os.close(fd)
    assert e.value.errno == errno.EIO
    rb = status(m)["readback"]
    assert rb["state"] == "skipped" and "--blkhash" in rb["message"], rb
    assert m.unmount(check=False) == 1
    assert "could not verify" in m.stderr, m.stderr
    assert_content(a + b, size, uri=srv.uri, what="out of order")
