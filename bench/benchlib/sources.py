"""Source images, made once per invocation on tmpfs, with their sha256.

dense     pseudo-random bytes (fixed seed: the same image every time; no
          tool on the path compresses, so PRNG bytes are as good as
          /dev/urandom and 5x faster to make)
sparse25  the same, in 1 MiB extents covering 25% of the image chosen at
          random; the rest are holes (cp --sparse=always sees them)
sparse10  the same, in 2 MiB runs covering 10% of the image chosen at
          random (the sparse case: a 4 GiB image onto a zero export)
fsimage   an ext4 filesystem built by mke2fs -d from a system tree (the
          largest of FS_TREES that fills at most half of it): a real mix of
          data, metadata and free space
vmdk25    a streamOptimized VMDK (qemu-img) of a disk with 25% data in 1 MiB
          extents, half compressible text-like bytes and half random; the
          sha256 is the disk's (the .raw beside it), which the export must
          hold after the copy
qcow2-25  a qcow2 (qemu-img convert) of such a disk; qcow2z-25 the same
          with zlib-compressed clusters (-c); the sha256 is the .raw's
vhdx25    a dynamic VHDX (qemu-img) of the same kind of disk, the same way
"""

import os
import random
import subprocess

from lib.digest import sha256_file

from .matrix import MiB

CHUNK = 4 * MiB
NOTES = {}          # source name -> how it was made (for the report)


def make(src, directory):
    """Create src in directory unless present; return (path, sha256 hex of
    what the export must hold afterwards)."""
    ext, maker = IMAGES.get(src.kind, (".img", None))
    path = os.path.join(directory, src.name + ext)
    if not os.path.exists(path):
        tmp = path + ".part"
        note = maker(tmp, src.size) if maker else {"dense": make_dense, "sparse25": make_sparse25,
                "sparse10": make_sparse10, "thin": make_thin,
                "fsimage": make_fsimage,
                }[src.kind](tmp, src.size)
        os.rename(tmp, path)
        if note:
            NOTES[src.name] = note
    return path, sha256_file(disk_path(src, path))


def disk_path(src, path):
    """The raw disk a source stands for: an image file's .raw beside it."""
    return path + ".raw" if src.kind in IMAGES else path


def make_image25(path, size, fmt, opts, what, seed=20240604):
    """An image of a 25%-data disk (mixed25_raw), made by qemu-img convert
    -O fmt opts; path ends in .part, the disk goes to the final name +
    .raw.  Returns the source's note."""
    raw = path[:-len(".part")] + ".raw"
    data = mixed25_raw(raw, size, seed)
    subprocess.run(["qemu-img", "convert", "-q", "-f", "raw", "-O", fmt,
                    *opts, raw, path], check=True)
    return (f"{what} of {os.path.getsize(path) >> 20} MiB made by qemu-img "
            f"convert {' '.join(opts)} from a {size >> 20} MiB disk with "
            f"{data} MiB of data").replace("  ", " ")


def make_vmdk25(path, size):
    return make_image25(path, size, "vmdk",
                        ("-o", "subformat=streamOptimized"),
                        "streamOptimized VMDK")


def make_vhdx25(path, size):
    return make_image25(path, size, "vhdx", ("-o", "subformat=dynamic"),
                        "dynamic VHDX")


def make_dense(path, size):
    rng = random.Random(20240601)
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(CHUNK, left)
            f.write(rng.randbytes(n))
            left -= n


def make_sparse25(path, size):
    rng = random.Random(20240602)
    blocks = size // MiB
    data = set(rng.sample(range(blocks), blocks // 4))
    with open(path, "wb") as f:
        for b in sorted(data):
            f.seek(b * MiB)
            f.write(rng.randbytes(MiB))
        f.truncate(size)


def make_sparse10(path, size):
    rng = random.Random(20240603)
    run = 2 * MiB
    runs = size // run
    data = sorted(rng.sample(range(runs), max(1, round(runs / 10))))
    with open(path, "wb") as f:
        for b in data:
            f.seek(b * run)
            f.write(rng.randbytes(run))
        f.truncate(size)
    return (f"{len(data)} runs of 2 MiB ({len(data) * 2} MiB of data) at "
            f"random places among {runs}, the rest holes")


def make_thin(path, size):
    """1/64 of the image data, in 2 MiB runs at random places: a thin VM
    disk (16 GiB holding 256 MiB)."""
    rng = random.Random(20240604)
    run = 2 * MiB
    runs = size // run
    data = sorted(rng.sample(range(runs), max(1, runs // 64)))
    with open(path, "wb") as f:
        for b in data:
            f.seek(b * run)
            f.write(rng.randbytes(run))
        f.truncate(size)
    return (f"{len(data)} runs of 2 MiB ({len(data) * 2} MiB of data) at "
            f"random places in {size >> 30} GiB, the rest holes")


FS_TREES = ["/usr/lib/python3", "/usr/share", "/usr/lib/gcc", "/usr/include",
            "/usr/share/doc", "/usr/share/man", "/usr/bin", "/etc"]


def du_bytes(path):
    r = subprocess.run(["du", "-sb", path], capture_output=True, text=True)
    return int(r.stdout.split()[0]) if r.returncode == 0 and r.stdout else 0


def make_fsimage(path, size):
    """ext4 of the largest candidate tree filling at most half the image."""
    fits = [(du_bytes(t), t) for t in FS_TREES if os.path.isdir(t)]
    fits = [(n, t) for n, t in fits if 0 < n <= size // 2]
    if not fits:
        raise RuntimeError("no tree small enough for an ext4 source image")
    tree = max(fits)[1]
    subprocess.run(["mke2fs", "-q", "-F", "-t", "ext4", "-E",
                    "root_owner=0:0", "-d", tree, path, str(size // 1024)],
                   check=True, stdout=subprocess.DEVNULL)
    if os.path.getsize(path) != size:
        os.truncate(path, size)
    return f"ext4 made by mke2fs -d {tree}"


# Image sources: kind -> (extension, maker); the disk is the file + ".raw".
IMAGES = {"vmdk25": (".vmdk", make_vmdk25)}


# ---- qcow2 sources ------------------------------------------------------

def mixed25_raw(raw, size, seed):
    """The disk of vmdk25's recipe: 25% data in 1 MiB extents, half
    text-like (deflate gets about 1.3:1), half random, the rest holes."""
    rng = random.Random(seed)
    words = [bytes(rng.choice(b"abcdefghijklmnopqrstuvwxyz")
                   for _ in range(rng.randint(2, 9))) for _ in range(5000)]
    text = b" ".join(rng.choice(words) for _ in range(700000))[:4 * MiB]
    blocks = size // MiB
    with open(raw, "wb") as f:
        for b in sorted(rng.sample(range(blocks), blocks // 4)):
            f.seek(b * MiB)
            if b % 2:
                f.write(rng.randbytes(MiB))
            else:
                at = (b * 7919) % (len(text) - MiB)
                f.write(text[at:at + MiB])
        f.truncate(size)
    return blocks // 4


def make_qcow2(path, size, opts=(), what="qcow2"):
    return make_image25(path, size, "qcow2", opts, what, seed=20240607)


IMAGES["qcow2-25"] = (".qcow2", make_qcow2)
IMAGES["qcow2z-25"] = (".qcow2", lambda p, s: make_qcow2(
    p, s, ("-c",), "zlib-compressed qcow2"))
IMAGES["vhdx25"] = (".vhdx", make_vhdx25)
