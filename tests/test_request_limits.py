"""No request longer than the server takes.

A server that advertises no maximum block size may refuse anything over
32 MiB, or silently mishandle it (nbd-server 3.24 answers a 256 MiB
write-zeroes with success after zeroing only its first 64 MiB), so the
NBD protocol tells clients to assume 32 MiB.  nbdferry holds every request
of every kind (write, write-zeroes, read, block status) to 32 MiB then, and
to the advertised maximum when there is one.  nbdferry-verify does the
same for its reads and block status.

Checked on nbdkit's request log, every request: a copy with holes and a
tail far longer than the limit onto a random-filled disk, a punched hole,
reads through the mount, the block status scan at mount, and a verify run.
The scan keeps many requests in flight to stay cheap on large disks; a
server answering each with a short reply must still be asked for the rest.
The advertised case uses the blocksize-policy filter, which also fails
oversized reads and writes with EINVAL (it lets zeroes and block status
through, hence the log check).
"""

import os
import subprocess
from pathlib import Path

import pytest

from lib.content import assert_content
from lib.copytools import describe, log_mark, nbd_requests, status, traffic
from lib.digest import sha256_bytes, sha256_file
from lib.env import BUILD, MiB, timeout
from lib.images import make_sparse_image, random_file
from lib.procs import punch_hole, run
from lib.servers import plugin_path

VERIFY = Path(os.environ.get("NBDFERRY_VERIFY") or
              BUILD / "tools" / "nbdferry-verify")
DEFAULT_LIMIT = 32 * MiB
# Twice the default limit plus change: a single request for a hole, the
# tail or the block status scan would be longer than 32 MiB.
EXPORT = 2 * DEFAULT_LIMIT + 37 * MiB + 4096
IMAGE = 2 * DEFAULT_LIMIT + 5 * MiB + 12345


def oversized(srv, limit, since=0):
    return [r for r in nbd_requests(srv, since) if r.count > limit]


@pytest.mark.parametrize("advertised", [None, MiB], ids=["none", "1M"])
def test_no_request_exceeds_the_limit(server, mount, shm, advertised):
    limit = advertised or DEFAULT_LIMIT
    params, filters = (), ()
    if advertised:
        filters = ("blocksize-policy",)
        params = (f"blocksize-maximum={advertised}",
                  "blocksize-error-policy=error")
    # The file plugin, so the bytes are checked in its backing file: a
    # reader of the server would add its own requests to the log.
    disk = random_file(shm / "disk.img", EXPORT)
    srv = server("file", disk, *params, filters=filters, log=True)
    mark = log_mark(srv)

    m = mount(srv, "--no-digest")
    # Data, a 40 MiB hole, data, a hole of about 2x the limit... the tail.
    img = make_sparse_image(shm / "src.img", IMAGE,
                            [(0, 3 * MiB + 7), (43 * MiB, 2 * MiB),
                             (IMAGE - 4097, 4097)])
    r = run(["cp", "--sparse=always", img.path, m.file],
            timeout=timeout(120))
    assert r.returncode == 0, f"cp: {r.stderr}"
    assert_content(img.path, EXPORT, mount_file=m.file, mount_size=IMAGE,
                   what="cp --sparse=always")
    assert sha256_file(disk) == sha256_file(img.path, pad_to=EXPORT), \
        "backing file differs from the image after cp"

    # A punched hole longer than the limit becomes several zero requests.
    with open(m.file, "r+b") as f:
        punch_hole(f.fileno(), MiB, DEFAULT_LIMIT + 3 * MiB)
        os.fsync(f.fileno())
    expect = bytearray(img.path.read_bytes())
    expect[MiB:MiB + DEFAULT_LIMIT + 3 * MiB] = bytes(DEFAULT_LIMIT + 3 * MiB)
    assert_content(bytes(expect), EXPORT, mount_file=m.file,
                   mount_size=IMAGE, what="after punch-hole")
    assert sha256_file(disk) == sha256_bytes(bytes(expect), pad_to=EXPORT), \
        "backing file differs after punch-hole"
    m.unmount()

    t = traffic(srv, mark)
    assert t.n["Write"] and t.n["Zero"] and t.n["Read"], describe(t)
    assert t.n["Extents"], "no block status scan at mount: " + describe(t)
    big = oversized(srv, limit, mark)
    assert not big, (f"{len(big)} requests over {limit} bytes, first: "
                     f"{big[0].op} {big[0].count}@{big[0].offset}")
    # The zeroing really is split at the limit, not done in tiny pieces.
    assert max(r.count for r in t.reqs if r.op == "Zero") == limit, \
        describe(t)

    # A verify run: reads and block status from the tool, same limit.
    mark = log_mark(srv)
    if not VERIFY.exists():
        pytest.fail(f"{VERIFY} not built (set NBDFERRY_BUILD)")
    v = subprocess.run([str(VERIFY), "--zero-tail", str(img.path), srv.uri],
                       capture_output=True, text=True, timeout=timeout(120))
    # The punched hole makes the export differ from the image: exit 1,
    # with the range named.
    assert v.returncode == 1, v.stdout + v.stderr
    t = traffic(srv, mark)
    assert t.n["Read"], describe(t)
    big = oversized(srv, limit, mark)
    assert not big, (f"verify: {len(big)} requests over {limit} bytes, "
                     f"first: {big[0].op} {big[0].count}@{big[0].offset}")


# tests/nbdkit-plugins/shortext.c (built by CMake): a 64 MiB RAM disk of
# zeros whose block status answers one extent of at most 1 MiB per request.


def test_scan_asks_again_after_a_short_block_status_reply(server, mount,
                                                          shortdir):
    """The scan at mount asks for 32 MiB windows, many in flight; a reply
    that covers only part of its window is followed by a request for the
    rest, so every extent the server reports is learnt."""
    srv = server(plugin_path("shortext"), log=True)
    m = mount(srv, "--no-digest")
    st = status(m)
    assert st["known_zero_bytes"] == 32 * MiB, st
    with open(m.file, "rb") as f:
        fd = f.fileno()
        assert os.lseek(fd, 0, os.SEEK_DATA) == MiB
        assert os.lseek(fd, MiB, os.SEEK_HOLE) == 2 * MiB
        assert os.lseek(fd, 62 * MiB, os.SEEK_DATA) == 63 * MiB
    m.unmount()
    ext = [r for r in nbd_requests(srv) if r.op == "Extents"]
    assert len(ext) >= 64, f"{len(ext)} block status requests"
    assert all(r.count <= DEFAULT_LIMIT for r in ext)
