#!/usr/bin/python3
"""Write the small seed corpus for the VMDK fuzz targets.

   tests/fuzz/make-vmdk-corpus.py [DIR]      (default: tests/fuzz/corpus)

Seeds are tiny VMDKs (4 KiB grains, 16 entries per grain table, a few
sectors of overhead) covering each layout the decoder handles:
streamOptimized VMware-like (GD_AT_END, GT markers, footer), qemu-like
(directory and tables in the overhead, no footer, no end-of-stream
marker), grains out of LBA order, a short
last grain; monolithicSparse with redundant tables, grains out of file
order, a zeroed-grain entry; plus a few broken ones.

fuzz-vmdk-parse seeds are the files; fuzz-vmdk-stream seeds carry a 4-byte
prefix that drives how the file is cut into writes and holes.
"""
import struct
import sys
import zlib
from pathlib import Path

S = 512
GRAIN = 8                              # sectors
GTES = 16


def header(cap, flags, gd, overhead, desc_size, rgd=0, compress=0, version=1):
    h = struct.pack("<IIIQQQQIQQQB4sH", 0x564D444B, version, flags, cap, GRAIN,
                    1, desc_size, GTES, rgd, gd, overhead, 0, b"\n \r\n",
                    compress)
    return h.ljust(S, b"\0")


def descriptor(kind, cap, sectors=1):
    d = (f'# Disk DescriptorFile\nversion=1\nCID=12345678\nparentCID=ffffffff\n'
         f'createType="{kind}"\n\n# Extent description\nRW {cap} SPARSE "f.vmdk"\n'
         f'\n#DDB\nddb.adapterType = "ide"\n').encode()
    return d.ljust(sectors * S, b"\0")


def pad(b):
    return b + bytes(-len(b) % S)


def grain_data(i, n=GRAIN * S):
    return bytes((i * 7 + j * 13) % 251 for j in range(n))


def marker(nsec, typ):
    return struct.pack("<QII", nsec, 0, typ).ljust(S, b"\0")


def stream(cap, order, vmware=True, short_last=False):
    flags = 1 | (1 << 16) | (1 << 17)
    ngr = -(-cap // GRAIN)
    ngt = -(-ngr // GTES)
    gd_sectors = -(-ngt * 4 // S)
    gt_sectors = -(-GTES * 4 // S)
    overhead = 4 if vmware else 2 + gd_sectors + ngt * gt_sectors
    out = bytearray(header(cap, flags, 0xFFFFFFFFFFFFFFFF if vmware else 2,
                           overhead, 1, compress=1, version=3))
    out += descriptor("streamOptimized", cap)
    out += bytes(overhead * S - len(out))
    where = {}
    for g in order:
        n = GRAIN * S
        if short_last and g == ngr - 1:
            n = 4000                      # 96 bytes short of the capacity
        z = zlib.compress(grain_data(g, n))
        where[g] = len(out) // S
        out += pad(struct.pack("<QI", g * GRAIN, len(z)) + z)
    if not vmware:                        # qemu: tables in the overhead
        tables = 2 + gd_sectors
        gd = [tables + t * gt_sectors for t in range(ngt)]
        gte = [where.get(g, 0) for g in range(ngt * GTES)]
        meta = pad(struct.pack(f"<{ngt}I", *gd))
        for t in range(ngt):
            meta += pad(struct.pack(f"<{GTES}I", *gte[t * GTES:(t + 1) * GTES]))
        out[2 * S:2 * S + len(meta)] = meta
        return bytes(out)                 # and no end-of-stream marker
    if vmware:
        gd = [0] * (gd_sectors * S // 4)
        for t in range(ngt):
            ent = [where.get(t * GTES + j, 0) for j in range(GTES)]
            if any(ent):
                out += marker(1, 1)
                gd[t] = len(out) // S
                out += pad(struct.pack(f"<{GTES}I", *ent))
        out += marker(gd_sectors, 2)
        gd_at = len(out) // S
        out += struct.pack(f"<{len(gd)}I", *gd)
        out += marker(1, 3)
        out += header(cap, flags, gd_at, overhead, 1, compress=1, version=3)
    out += marker(0, 0)
    return bytes(out)


def sparse(cap, file_order, zero_gte=None):
    ngr = -(-cap // GRAIN)
    ngt = -(-ngr // GTES)
    gd_sectors = -(-ngt * 4 // S)
    gt_sectors = -(-GTES * 4 // S)
    rgd = 2
    gd = rgd + gd_sectors + ngt * gt_sectors
    overhead = gd + gd_sectors + ngt * gt_sectors
    flags = 1 | 2 | (4 if zero_gte is not None else 0)
    out = bytearray(header(cap, flags, gd, overhead, 1, rgd=rgd))
    out += descriptor("monolithicSparse", cap)
    gte = [0] * (ngt * GTES)
    sec = overhead
    for g in file_order:
        gte[g] = sec
        sec += GRAIN
    if zero_gte is not None:
        gte[zero_gte] = 1
    for base in (rgd, gd):
        tables = base + gd_sectors
        out += pad(struct.pack(f"<{ngt}I", *[tables + t * gt_sectors
                                              for t in range(ngt)]))
        for t in range(ngt):
            out += pad(struct.pack(f"<{GTES}I", *gte[t * GTES:(t + 1) * GTES]))
    assert len(out) == overhead * S
    for g in file_order:
        out += grain_data(g)
    return bytes(out)


def main():
    top = Path(sys.argv[1] if len(sys.argv) > 1 else
               Path(__file__).resolve().parent / "corpus")
    seeds = {
        "stream-vmware": stream(64, [0, 1, 3, 7]),
        "stream-qemu": stream(64, [0, 2, 5], vmware=False),
        "stream-shuffled": stream(300, [30, 2, 17, 0, 36], vmware=True),
        "stream-short-last": stream(72, [0, 8], short_last=True),
        "stream-empty": stream(40, []),
        "sparse": sparse(64, [0, 1, 2, 5]),
        "sparse-file-order": sparse(200, [20, 3, 0, 17, 24], zero_gte=5),
        "sparse-empty": sparse(24, []),
    }
    bad = bytearray(seeds["stream-vmware"])
    bad[4 * S + 40] ^= 0xFF                      # damaged deflate
    seeds["bad-deflate"] = bytes(bad)
    seeds["bad-truncated"] = seeds["sparse"][:-1000]
    for target, prefix in (("fuzz-vmdk-parse", b""),
                           ("fuzz-vmdk-stream", None)):
        d = top / target
        d.mkdir(parents=True, exist_ok=True)
        for i, (name, data) in enumerate(sorted(seeds.items())):
            p = prefix if prefix is not None else \
                struct.pack("<I", (i * 2654435761) & 0x7FFFFFFF)
            (d / name).write_bytes(p + data)


if __name__ == "__main__":
    main()
