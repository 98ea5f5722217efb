#!/usr/bin/python3
"""Write the small seed corpus for the VHD fuzz targets.

   tests/fuzz/make-corpus.py [DIR]      (default: tests/fuzz/corpus)

Seeds are tiny VHDs covering each layout the decoders handle: fixed,
dynamic (qemu-like, back to back, all-ones bitmaps), blktap-like (batmap,
partial bitmaps, 4 KiB-aligned data, blocks out of BAT order, BAT larger
than needed), vhd-tool-like (BAT at 2048, blocks in order), differencing
with MacX/W2ku/W2ru locators, a delta whose locator points at zeros, plus
a few broken ones.  Blocks are 4 KiB so files stay a few KiB.

fuzz-vhd-parse seeds are the files; fuzz-vhd-stream seeds carry a 4-byte
prefix that drives how the file is cut into writes and holes.
"""
import struct
import sys
from pathlib import Path

SECTOR = 512


def csum(b, off):
    b = bytearray(b)
    b[off:off + 4] = bytes(4)
    return (~sum(b)) & 0xFFFFFFFF


def geometry(size):
    total = min(size // 512, 65535 * 16 * 255)
    if total >= 65535 * 16 * 63:
        spt, heads = 255, 16
        cth = total // spt
    else:
        spt = 17
        cth = total // spt
        heads = max(4, (cth + 1023) // 1024)
        if cth >= heads * 1024 or heads > 16:
            spt, heads = 31, 16
            cth = total // spt
        if cth >= heads * 1024:
            spt, heads = 63, 16
            cth = total // spt
    return cth // heads, heads, spt


def footer(size, disk_type, creator=b"qemu", cver=0x00050003, uuid=b"U" * 16):
    c, h, s = geometry(size)
    f = bytearray(512)
    struct.pack_into(">8sIIQI4sIIQQHBBII16sB", f, 0, b"conectix", 2, 0x10000,
                     0xFFFFFFFFFFFFFFFF if disk_type == 2 else 512, 0, creator,
                     cver, 0, size, size, c, h, s, disk_type, 0, uuid, 0)
    struct.pack_into(">I", f, 64, csum(f, 64))
    return bytes(f)


def header(table_off, entries, block, parent_uuid=bytes(16), name="", locs=()):
    h = bytearray(1024)
    struct.pack_into(">8sQQIIII16sI", h, 0, b"cxsparse", 0xFFFFFFFFFFFFFFFF,
                     table_off, 0x10000, entries, block, 0, parent_uuid, 0)
    n = name.encode("utf-16-be")
    h[64:64 + len(n)] = n
    for i, (code, space, length, off) in enumerate(locs):
        struct.pack_into(">IIIIQ", h, 576 + 24 * i, code, space, length, 0, off)
    struct.pack_into(">I", h, 36, csum(h, 36))
    return bytes(h)


def pad(n):
    return (n + SECTOR - 1) // SECTOR * SECTOR


def sector_text(tag, v):
    line = f"<{tag}> vsec {v:010d}\n".encode()
    return (line * (SECTOR // len(line) + 1))[:SECTOR]


def dynamic(size, block, placements, *, disk_type=3, bat_off=1536,
            entries=None, extra=b"", align=0, partial=None, creator=b"qemu",
            cver=0x00050003, parent=None, tag="Q"):
    """placements: block indices in file order."""
    nb = (size + block - 1) // block
    entries = entries or nb
    spb = block // SECTOR
    bm_bytes = pad((spb + 7) // 8)
    bat_bytes = pad(4 * entries)
    meta_end = max(bat_off + bat_bytes, 1536)
    body = bytearray(meta_end)
    body[meta_end:] = b""
    body += extra
    bat = [0xFFFFFFFF] * entries
    for b in placements:
        pos = len(body)
        if align:
            data_at = (pos + bm_bytes + align - 1) // align * align
            pos = data_at - bm_bytes
            body += bytes(pos - len(body))
        bat[b] = pos // SECTOR
        bits = bytearray(b"\xff" * ((spb + 7) // 8))
        if partial and b in partial:
            bits = bytearray((spb + 7) // 8)
            for j in partial[b]:
                bits[j // 8] |= 0x80 >> (j % 8)
        body += bytes(bits).ljust(bm_bytes, b"\0")
        for j in range(spb):
            body += sector_text(tag, b * spb + j)
    puuid, name, locs = parent or (bytes(16), "", ())
    f = footer(size, disk_type, creator, cver)
    body[0:512] = f
    body[512:1536] = header(bat_off, entries, block, puuid, name, locs)
    for i, v in enumerate(bat):
        struct.pack_into(">I", body, bat_off + 4 * i, v)
    if bat_off + bat_bytes > bat_off + 4 * entries:
        fill = b"\0" if creator == b"tap\0" else b"\xff"
        body[bat_off + 4 * entries:bat_off + bat_bytes] = fill * (bat_bytes - 4 * entries)
    return bytes(body) + f


def batmap(entries, blocks, map_off):
    m = bytearray(512)
    for b in blocks:
        m[b // 8] |= 0x80 >> (b % 8)
    h = bytearray(512)
    struct.pack_into(">8sQIII", h, 0, b"tdbatmap", map_off, 1, 0x10002,
                     (~sum(m)) & 0xFFFFFFFF)
    return bytes(h) + bytes(m)


def seeds():
    K = 1024
    out = {}
    # fixed: 8 KiB of text + footer
    data = b"".join(sector_text("F", i) for i in range(16))
    out["fixed-8k"] = data + footer(len(data), 2, b"tap\0", 0x00010003)
    # qemu-like dynamic: back to back, out of order
    out["dyn-qemu"] = dynamic(40 * K, 4 * K, [7, 0, 3])
    # partial last block (size not a multiple of the block)
    out["dyn-partial-last"] = dynamic(18 * K + 512, 4 * K, [4, 1])
    # vhd-tool-like: BAT at 2048, in order, creator caml
    out["dyn-vhdtool"] = dynamic(32 * K, 4 * K, [0, 2, 5], bat_off=2048,
                                 creator=b"caml", cver=1, tag="V")
    # blktap-like: BAT bigger than needed, batmap, partial bitmaps, 4K aligned
    nb, entries = 10, 20
    bm = batmap(entries, [6], 1536 + 512 + 512)
    out["dyn-tap"] = dynamic(nb * 4 * K, 4 * K, [6, 0, 3], entries=entries,
                             extra=bm, align=4096, creator=b"tap\0",
                             cver=0x00010003, partial={0: [0, 1, 5], 3: [7]},
                             tag="T")
    # differencing with three locators (MacX, W2ku, W2ru) after the BAT
    url = b"file://./parent.vhd"
    w = ".\\parent.vhd".encode("utf-16-le")
    locs = ((0x4D616358, 1, len(url), 2048), (0x57326B75, 1, len(w), 2560),
            (0x57327275, 1, len(w), 3072))
    extra = url.ljust(512, b"\0") + w.ljust(512, b"\0") + w.ljust(512, b"\0")
    out["diff-tap"] = dynamic(40 * K, 4 * K, [2, 9], disk_type=4, extra=extra,
                              creator=b"tap\0", cver=0x00010003,
                              partial={2: [1, 2], 9: [0, 7]},
                              parent=(b"P" * 16, "parent.vhd", locs), tag="D")
    # vhd-tool delta: MacX locator points at a zero sector before the BAT
    out["diff-delta"] = dynamic(40 * K, 4 * K, [1, 4], disk_type=4,
                                bat_off=2048, creator=b"caml", cver=1,
                                parent=(b"P" * 16, "./parent.vhd",
                                        ((0x4D616358, 1, 24, 1536),)), tag="X")
    # broken: BAT entry into the header; truncated; footer mismatch
    d = bytearray(out["dyn-qemu"])
    struct.pack_into(">I", d, 1536 + 8, 1)
    out["bad-bat-clobber"] = bytes(d)
    out["bad-truncated"] = out["dyn-qemu"][:3000]
    d = bytearray(out["dyn-qemu"])
    d[-512 + 24] ^= 1
    out["bad-footer-mismatch"] = bytes(d)
    out["bad-empty-first-sector"] = bytes(512) + out["dyn-qemu"][512:]
    return out


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else
                Path(__file__).resolve().parent / "corpus")
    parse, stream = root / "fuzz-vhd-parse", root / "fuzz-vhd-stream"
    parse.mkdir(parents=True, exist_ok=True)
    stream.mkdir(parents=True, exist_ok=True)
    # little-endian seed; the second has bit 31 set: fix checksums first
    prefixes = [b"\x01\x10\x00\x07", b"\x01\x03\x02\x81"]
    for name, data in seeds().items():
        (parse / name).write_bytes(data)
        for i, p in enumerate(prefixes):
            (stream / f"{name}-{i}").write_bytes(p + data)


if __name__ == "__main__":
    main()
