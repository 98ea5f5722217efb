"""nbdferry-sync (tools/sync/): a warm migration's cutover driven by a
platform's changed-block list.  After a full pass (cp through a mount,
which builds the manifest), about 1% of the 64 KiB blocks of the source
change; nbdferry-sync, on a new mount, reads and writes only the listed
blocks.  The source is served by nbdkit with the log filter, so the bytes
read from it are counted on the server's side; every case checks the
server's bytes (the file plugin's file) against the source.

- XAPI bitmap (VDI.list_changed_blocks: base64, first block = most
  significant bit of the first byte): the server ends equal to the source,
  the source is read for at most 2% of its size.
- A list is a hint: a changed block it leaves out stays stale.
- Listed blocks that are zero in the source become zero on the server,
  with no trim.
- Malformed lists (bad base64, a bitmap shorter than the disk or with set
  bits past its end, extents past the end or negative) are refused before
  anything is written: the server's bytes and request log are unchanged.
- qemu's dirty bitmap of a qcow2 served by qemu-nbd (-B NAME).
- A plain extent list (any alignment).
- Without --changed, the whole source is read.
- The proof: the mount's whole-disk digest after a listed cutover equals
  nbdferry-verify SOURCE, and --proof exits 0; with no digest, 2.
"""

import base64
import json
import os
import random
import shutil
import subprocess

import pytest

from lib.copytools import log_mark, traffic
from lib.env import BUILD, MiB
from lib.procs import run, wait_for
from lib.warm import BLOCK, copy, make_source, sha256, verify_digest

SYNC = BUILD / "tools" / "nbdferry-sync"
SIZE = 64 * MiB
NBLOCKS = SIZE // BLOCK


@pytest.fixture
def setup(server, mount, shm):
    """A source with data, its full first pass through a mount done."""
    src = make_source(shm / "src.img", SIZE)
    disk = shm / "disk.img"
    with open(disk, "wb") as f:
        f.truncate(SIZE)
    dst = server("file", f"file={disk}", log=True)
    m = mount(dst)
    copy("cp", src, m.file)
    m.unmount()
    assert sha256(disk) == sha256(src)
    source = server("file", f"file={src}", log=True, extra=["-r"])
    return src, disk, dst, source


def change_blocks(src, blocks, seed=3):
    """Write new random bytes over each block in blocks."""
    rng = random.Random(seed)
    with open(src, "r+b") as f:
        for b in blocks:
            f.seek(b * BLOCK)
            f.write(rng.randbytes(BLOCK))


def one_percent(seed=4):
    """About 1% of the blocks, in runs of 1 to 3 (sorted)."""
    rng = random.Random(seed)
    blocks = set()
    while len(blocks) < NBLOCKS // 100:
        b = rng.randrange(0, NBLOCKS - 3)
        blocks.update(range(b, b + rng.randint(1, 3)))
    return sorted(blocks)


def xapi_bitmap(blocks, nblocks=NBLOCKS):
    """VDI.list_changed_blocks's value: base64 of one bit a block, block n
    at byte n // 8, mask 0x80 >> n % 8 (xapi-project/sm's VDI.py)."""
    bits = bytearray((nblocks + 7) // 8)
    for b in blocks:
        bits[b // 8] |= 0x80 >> (b % 8)
    return base64.b64encode(bytes(bits)).decode() + "\n"


def sync(*args, expect=0):
    r = run([SYNC, "--json", *args], timeout=300)
    assert r.returncode == expect, r.stderr
    return json.loads(r.stdout) if expect == 0 else r


def block(path, b):
    with open(path, "rb") as f:
        f.seek(b * BLOCK)
        return f.read(BLOCK)


def test_sync_xapi_bitmap_cutover(setup, mount, shm):
    src, disk, dst, source = setup
    blocks = one_percent()
    change_blocks(src, blocks)
    lst = shm / "cbt.b64"
    lst.write_text(xapi_bitmap(blocks))
    m = mount(dst)
    mark, smark = log_mark(dst), log_mark(source)
    rep = sync("--changed", f"xapi:{lst}", source.uri, m.file)
    m.unmount()
    assert sha256(disk) == sha256(src)
    read = traffic(source, smark).bytes["Read"]
    assert rep["list"] == "xapi" and rep["listed_blocks"] == len(blocks)
    assert rep["read_bytes"] == read == len(blocks) * BLOCK
    assert read <= 0.02 * SIZE, f"read {read} of {SIZE} bytes"
    sent = traffic(dst, mark).bytes["Write"]
    assert sent <= len(blocks) * BLOCK
    print(f"xapi 1%: {len(blocks)} blocks listed, source read {read} B = "
          f"{100 * read / SIZE:.2f}% of {SIZE} B, server written {sent} B")


def test_sync_list_is_a_hint(setup, mount, shm):
    """A changed block the list misses is not read: it stays stale (the
    docs say what each platform guarantees)."""
    src, disk, dst, source = setup
    blocks = one_percent()
    old = block(src, blocks[0])
    change_blocks(src, blocks)
    lst = shm / "cbt.b64"
    lst.write_text(xapi_bitmap(blocks[1:]))
    m = mount(dst)
    sync("--changed", str(lst), source.uri, m.file)      # autodetected
    m.unmount()
    assert block(disk, blocks[0]) == old != block(src, blocks[0])
    for b in blocks[1:]:
        assert block(disk, b) == block(src, b)


def test_sync_zero_blocks_written_as_zero(setup, mount, shm):
    src, disk, dst, source = setup
    raw = src.read_bytes()
    data = [b for b in range(NBLOCKS)
            if raw[b * BLOCK:(b + 1) * BLOCK].strip(b"\0")][:6]
    with open(src, "r+b") as f:
        for b in data:
            f.seek(b * BLOCK)
            f.write(bytes(BLOCK))
    lst = shm / "cbt.b64"
    lst.write_text(xapi_bitmap(data))
    m = mount(dst)
    mark = log_mark(dst)
    rep = sync("--changed", f"xapi:{lst}", source.uri, m.file)
    m.unmount()
    assert rep["zero_bytes"] == len(data) * BLOCK
    assert sha256(disk) == sha256(src)
    t = traffic(dst, mark)
    assert t.n["Trim"] == 0, t.n            # write-zeroes, never a trim
    assert t.bytes["Zero"] + t.bytes["Write"] >= len(data) * BLOCK


BAD_LISTS = {
    "bad-base64": ("xapi", "gA*E=\n"),
    "base64-cut": ("xapi", "gAE\n"),
    "bitmap-short": ("xapi", base64.b64encode(bytes(NBLOCKS // 8 - 1))),
    "bits-past-end": ("xapi", base64.b64encode(bytes(NBLOCKS // 8) +
                                               b"\x01")),
    "extents-past-end": ("extents", f"0 65536\n{SIZE - 4096} 8192\n"),
    "extents-negative": ("extents", "0 65536\n-65536 65536\n"),
    "extents-garbage": ("extents", "0 65536\n65536 64K\n"),
}


def test_sync_bad_list_touches_nothing(setup, mount, shm):
    src, disk, dst, source = setup
    change_blocks(src, range(0, NBLOCKS, 7))
    before = sha256(disk)
    m = mount(dst)
    mark = log_mark(dst)
    for name, (kind, text) in BAD_LISTS.items():
        lst = shm / name
        lst.write_bytes(text if isinstance(text, bytes) else text.encode())
        r = sync("--changed", f"{kind}:{lst}", source.uri, m.file, expect=1)
        assert "refused, nothing written" in r.stderr, (name, r.stderr)
        assert r.stdout == "", name
    m.unmount()
    assert sha256(disk) == before
    t = traffic(dst, mark)
    assert t.bytes["Write"] == 0 and t.n["Zero"] == 0, t.bytes


def test_sync_extents(setup, mount, shm):
    src, disk, dst, source = setup
    raw = bytearray(src.read_bytes())
    rng = random.Random(5)
    extents = [(3 * MiB + 1000, 5000), (20 * MiB - 10, 20),
               (SIZE - 70000, 70000)]
    for off, n in extents:
        raw[off:off + n] = rng.randbytes(n)
    src.write_bytes(raw)
    lst = shm / "extents"
    lst.write_text("".join(f"{off} {hex(n)}\n" for off, n in extents))
    m = mount(dst)
    rep = sync("--changed", f"extents:{lst}", source.uri, m.file)
    m.unmount()
    assert sha256(disk) == sha256(src)
    assert rep["listed_blocks"] == 1 + 2 + 2
    assert rep["read_bytes"] == 5 * BLOCK


def test_sync_without_list_reads_everything(setup, mount):
    src, disk, dst, source = setup
    change_blocks(src, one_percent())
    m = mount(dst)
    smark = log_mark(source)
    rep = sync(source.uri, m.file)
    m.unmount()
    assert sha256(disk) == sha256(src)
    assert traffic(source, smark).bytes["Read"] == SIZE == rep["read_bytes"]


def test_sync_file_source_sizes_must_match(setup, mount, shm):
    src, disk, dst, source = setup
    small = shm / "small.img"
    shutil.copyfile(src, small)
    os.truncate(small, SIZE - BLOCK)
    m = mount(dst)
    mark = log_mark(dst)
    r = sync(small, m.file, expect=1)
    m.unmount()
    assert "sizes must be equal" in r.stderr
    assert traffic(dst, mark).bytes["Write"] == 0


def test_sync_digest_proof(setup, mount, shm):
    """The mount's whole-disk digest after a listed cutover equals the
    source's (nbdferry-verify SOURCE): the blocks not listed come from the
    manifest.  --proof exits 0 only then."""
    src, disk, dst, source = setup
    blocks = one_percent()
    change_blocks(src, blocks)
    lst = shm / "cbt.b64"
    lst.write_text(xapi_bitmap(blocks))
    m = mount(dst)
    r = run([SYNC, "--json", "--proof", "--changed", f"xapi:{lst}",
             source.uri, m.file], timeout=300)
    m.unmount()
    assert sha256(disk) == sha256(src)
    rep = json.loads(r.stdout)
    assert rep["digest"].get("value") == verify_digest(src), rep["digest"]
    assert r.returncode == 0, r.stderr


def test_sync_qemu_dirty_bitmap(server, mount, shm, shortdir):
    """qemu-img bitmap --add on a qcow2, qemu-io writes (the bitmap marks
    them), qemu-nbd -B exports it: only the dirty blocks are copied."""
    for tool in ("qemu-img", "qemu-io", "qemu-nbd"):
        assert shutil.which(tool), f"{tool} (qemu-utils) is required"
    qcow = shm / "src.qcow2"
    run(["qemu-img", "create", "-q", "-f", "qcow2", qcow, str(SIZE)],
        check=True)
    run(["qemu-io", "-f", "qcow2", "-c", "write -P 0x11 0 8M",
         "-c", "write -P 0x22 40M 4M", qcow], check=True)
    raw = shm / "src.raw"
    run(["qemu-img", "convert", "-f", "qcow2", "-O", "raw", qcow, raw],
        check=True)
    disk = shm / "disk.img"
    with open(disk, "wb") as f:
        f.truncate(SIZE)
    dst = server("file", f"file={disk}", log=True)
    m = mount(dst)
    copy("cp", raw, m.file)                          # the first pass
    m.unmount()
    run(["qemu-img", "bitmap", "--add", "--enable", qcow, "b0"], check=True)
    run(["qemu-io", "-f", "qcow2", "-c", "write -P 0x33 1M 128K",
         "-c", "write -P 0x44 10550760 4096",        # unaligned: 2 blocks
         "-c", "write -z 41M 64K", qcow], check=True)
    run(["qemu-img", "convert", "-f", "qcow2", "-O", "raw", qcow, raw],
        check=True)
    sock = shortdir / "qnbd.sock"
    qn = subprocess.Popen(["qemu-nbd", "-r", "-f", "qcow2", "-B", "b0",
                           "-k", str(sock), "-t", str(qcow)],
                          stderr=subprocess.PIPE)
    try:
        wait_for(sock.exists, qn, "qemu-nbd")
        m = mount(dst)
        rep = sync("--changed", "dirty-bitmap:b0",
                   f"nbd+unix:///?socket={sock}", m.file)
        m.unmount()
    finally:
        qn.terminate()
        qn.wait(10)
    assert sha256(disk) == sha256(raw)
    assert rep["list"] == "dirty-bitmap"
    assert rep["listed_blocks"] == 2 + 2 + 1, rep
    assert rep["read_bytes"] == 5 * BLOCK
    assert rep["zero_bytes"] == BLOCK


def test_sync_proof_needs_a_digest(setup, mount, shm):
    """--proof: copied, but no whole-disk digest to show (the mount's
    digest off) exits 2, after a complete and correct copy."""
    src, disk, dst, source = setup
    blocks = one_percent()
    change_blocks(src, blocks)
    lst = shm / "cbt.b64"
    lst.write_text(xapi_bitmap(blocks))
    m = mount(dst, "--digest=none")
    r = run([SYNC, "--proof", "--changed", f"xapi:{lst}", source.uri,
             m.file], timeout=300)
    m.unmount()
    assert r.returncode == 2, r.stderr
    assert "--proof" in r.stderr and "digest" in r.stdout
    assert sha256(disk) == sha256(src)


def test_sync_help_matches_man_page():
    import re
    from lib.env import TOP
    text = (TOP / "docs" / "nbdferry-sync.1").read_text()
    r = run([SYNC, "--help"], check=True)
    for opt in re.findall(r"--[a-z][a-z-]+", r.stdout):
        assert opt.replace("-", r"\-") in text, f"{opt} missing from man page"


def test_sync_digest_of_one_disk_of_several(server, mount, shm):
    """A mount of several disks: the digest reported is the written
    disk's, from its own entry of the status; a full copy's equals
    nbdferry-verify SOURCE."""
    src = make_source(shm / "src.img", 16 * MiB)
    disks = []
    for name in ("one", "two"):
        d = shm / f"{name}.img"
        with open(d, "wb") as f:
            f.truncate(16 * MiB)
        disks.append(server("file", f"file={d}"))
    m = mount([f"one={disks[0].uri}", f"two={disks[1].uri}"], raw="two")
    rep = sync(src, m.file)
    m.unmount()
    assert sha256(shm / "two.img") == sha256(src)
    assert rep["digest"]["state"] == "complete", rep["digest"]
    assert rep["digest"]["value"] == verify_digest(src)


def test_sync_source_stops_answering(server, mount, shm):
    """A source whose reads the delay filter holds for an hour fails the
    run after --request-timeout, with one line naming it; nothing is
    written."""
    src = make_source(shm / "src.img", 8 * MiB)
    disk = shm / "disk.img"
    with open(disk, "wb") as f:
        f.truncate(8 * MiB)
    dst = server("file", f"file={disk}", log=True)
    slow = server("file", f"file={src}", "rdelay=3600", filters=["delay"],
                  extra=["-r"])
    m = mount(dst)
    mark = log_mark(dst)
    r = run([SYNC, "--request-timeout=1", slow.uri, m.file], timeout=120)
    m.unmount()
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "answered nothing for 1 s (--request-timeout)" in r.stderr
    assert traffic(dst, mark).bytes["Write"] == 0
    assert not disk.read_bytes().strip(b"\0")       # still all zero
