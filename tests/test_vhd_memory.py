"""The VHD view's memory is bounded by configuration, not by what readers
or a VHD ask for; stats of nbd.vhd do not flood the log.

- 300 opens of nbd.vhd held at once on a fragmented 1 TiB export share one
  synthesized description (one per disk state, rebuilt only when the disk
  changes): the daemon's peak RSS (VmHWM) stays below pool + 64 MiB.
- A VHD whose BAT has 8M entries, all used, written into nbd.vhd: the
  decoder holds the BAT and 4 bytes per block, not 20x the BAT.
- A dynamic VHD describing a 2000 GiB disk (8M-entry BAT) onto a small
  export: refused at its first sector, before anything is allocated.
- 1000 stats of nbd.vhd on an export the VHD format cannot describe: one
  log line, not one per stat.
- Repeated refusals are rate-limited with a count.

Run: /usr/bin/python3 -m pytest tests/test_vhd_memory.py
"""

import errno
import os
import struct


from lib.env import MiB
from lib.images import random_bytes
from lib.nbd import nbd_handle, sha256_nbd
from lib.procs import oserror_errno
from lib.vhd import footer_checksum, header_checksum, qemu_img

POOL = 64 * MiB                  # the daemon's default --pool-size
BOUND = POOL + 64 * MiB


def scatter(uri, export, step):
    """4 KiB of data every step bytes: a fragmented allocation map."""
    with nbd_handle(uri) as h:
        for off in range(0, export, step):
            h.pwrite(random_bytes(4096), off)


def test_many_opens_share_one_description(server, mount):
    export = 1 << 40
    srv = server("memory", f"size={export}")
    scatter(srv.uri, export, 512 * MiB)             # 2048 runs
    m = mount(srv)
    view = m.mp / "nbd.vhd"
    size = os.stat(view).st_size
    files = [open(view, "rb") for _ in range(300)]
    try:
        heads = {f.read(512) for f in files[:3]}
        assert len(heads) == 1                      # one consistent file
        for _ in range(100):
            assert os.stat(view).st_size == size
        _, hwm = m.rss()
    finally:
        for f in files:
            f.close()
    print(f"300 opens: VmHWM {hwm >> 20} MiB")
    assert hwm < BOUND, f"VmHWM {hwm >> 20} MiB with 300 opens of nbd.vhd"
    # the description follows the disk: a write changes the view's size
    with open(m.file, "r+b") as f:
        f.seek(export - 3 * MiB)
        f.write(random_bytes(4096))
    assert os.stat(view).st_size > size, "the view did not see the write"


def dynamic_vhd_head(size, block, entries):
    """Footer copy, dynamic header at 512 and a BAT at 1536 whose entries
    place blocks back to back after it (all used)."""
    foot = bytearray(512)
    foot[0:8] = b"conectix"
    struct.pack_into(">IIQI", foot, 8, 2, 0x10000, 512, 0)
    foot[28:32] = b"nbdt"
    struct.pack_into(">IIQQ", foot, 32, 0x10000, 0, size, size)
    struct.pack_into(">HBBI", foot, 56, 65535, 16, 255, 3)
    struct.pack_into(">I", foot, 64, footer_checksum(foot))
    head = bytearray(1024)
    head[0:8] = b"cxsparse"
    struct.pack_into(">QQIII", head, 8, (1 << 64) - 1, 1536, 0x10000,
                     entries, block)
    struct.pack_into(">I", head, 36, header_checksum(head))
    bat_bytes = -(-4 * entries // 512) * 512
    first = (1536 + bat_bytes) // 512
    per = (512 + block) // 512
    bat = bytearray(b"\xff" * bat_bytes)
    struct.pack_into(f">{entries}I", bat, 0,
                     *range(first, first + per * entries, per))
    return bytes(foot + head + bat)


def test_huge_bat_costs_what_it_needs(server, mount):
    """8M used entries of 512-byte blocks (a 4 GiB disk): the BAT is 32 MiB
    of input; the decoder may hold about twice that, not 20x."""
    entries, block = 1 << 23, 512
    export = entries * block
    srv = server("memory", f"size={export}")
    with nbd_handle(srv.uri) as h:
        h.pwrite(b"\x5a" * MiB, 0)
    before = sha256_nbd(srv.uri, 2 * MiB)
    m = mount(srv, expect_errors=True)
    data = dynamic_vhd_head(export, block, entries)
    fd = os.open(m.mp / "nbd.vhd", os.O_WRONLY | os.O_TRUNC)
    try:
        for off in range(0, len(data), MiB):
            os.pwrite(fd, data[off:off + MiB], off)
        _, hwm = m.rss()
    finally:
        e = oserror_errno(os.close, fd)
    assert e == errno.EINVAL, f"close of a VHD without its blocks: {e}"
    print(f"8M-entry BAT: VmHWM {hwm >> 20} MiB")
    assert hwm < BOUND, f"VmHWM {hwm >> 20} MiB for a 32 MiB BAT"
    assert "file ended" in m.stderr, m.stderr
    # the VHD was valid up to its blocks: the disk was replaced (zeros)
    assert sha256_nbd(srv.uri, 2 * MiB) != before


def test_vhd_larger_than_export_allocates_nothing(server, mount, shm):
    srv = server("memory", f"size={64 * MiB}")
    m = mount(srv, expect_errors=True)
    vhd = shm / "huge.vhd"
    qemu_img("create", "-f", "vpc", "-o", "force_size=on", vhd, "2000G")
    data = vhd.read_bytes()
    fd = os.open(m.mp / "nbd.vhd", os.O_WRONLY | os.O_TRUNC)
    try:
        e = oserror_errno(os.write, fd, data[:4 * MiB])
        assert e == errno.ENOSPC, f"errno {e}"
        _, hwm = m.rss()
    finally:
        oserror_errno(os.close, fd)
    assert hwm < BOUND, f"VmHWM {hwm >> 20} MiB"
    assert "larger than the export" in m.stderr


def test_stats_do_not_flood_the_log(server, mount):
    """A 3 TiB export cannot be a VHD: each stat used to log why."""
    srv = server("memory", "size=3T")
    m = mount(srv, expect_errors=True)
    view = m.mp / "nbd.vhd"
    for _ in range(1000):
        assert os.stat(view).st_size == 0
    m.unmount(check=False)
    lines = [l for l in m.stderr.splitlines() if "VHD limit" in l]
    assert 1 <= len(lines) <= 5, f"{len(lines)} lines for 1000 stats"


def test_repeated_refusals_rate_limited(server, mount):
    """1000 refused creates: a few lines, then one line with the count."""
    srv = server("memory", f"size={64 * MiB}")
    m = mount(srv)
    for i in range(1000):
        assert oserror_errno(os.open, m.mp / f"x{i}",
                             os.O_WRONLY | os.O_CREAT) == errno.EPERM
    m.unmount()
    err = m.stderr.splitlines()
    shown = [l for l in err if "refused" in l and "rate limit" not in l]
    # five per ten seconds: a bound that holds on any machine
    assert 1 <= len(shown) <= 50, f"{len(shown)} lines for 1000 refusals"
    counts = [l for l in err if "rate limit" in l]
    assert counts and sum(int(l.split()[2]) for l in counts) == \
        1000 - len(shown), counts
