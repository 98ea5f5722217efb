"""Real filesystem images copied into the mount.

An XFS image made by mkfs.xfs from a prototype file (-p) and an ext4 image
made by mke2fs -d, both holding the same tree of a few hundred files and
directories of known content, are copied with cp --sparse=always onto a
larger export full of random bytes.  Then xfs_repair -n / e2fsck -fn run on
MNT/nbd report a clean filesystem, and, where loop devices and mount work,
a read-only loop mount of MNT/nbd shows the same files with the same
digests.
"""

import hashlib
import os
import random
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from lib.content import assert_content
from lib.copytools import fill_garbage
from lib.env import MiB
from lib.procs import run

# XFS refuses filesystems under 300 MB since xfsprogs 5.19.
FS = {
    "xfs": SimpleNamespace(image=320 * MiB, export=384 * MiB,
                           tools=("mkfs.xfs", "xfs_repair"),
                           ro_opts="ro,norecovery"),
    "ext4": SimpleNamespace(image=160 * MiB, export=224 * MiB,
                            tools=("mke2fs", "e2fsck"),
                            ro_opts="ro,noload"),
}
SIZES = [0, 1, 17, 511, 4096, 4097, 65536 + 13, 200000, 1 * MiB + 5]


def make_tree(root, seed=1):
    """A tree of 24 directories (some nested) with 12 files each, of sizes
    from 0 to 1 MiB, some with holes, plus symlinks.  Returns
    SimpleNamespace(root, files {relpath: sha256}, dirs [relpath],
    links {relpath: target})."""
    rng = random.Random(seed)
    files, dirs, links = {}, [], {}
    for d in range(24):
        rel = f"d{d:02d}" if d < 16 else f"d{d % 16:02d}/sub{d:02d}"
        dirs.append(rel)
        (root / rel).mkdir(parents=True, exist_ok=True)
        for i in range(12):
            frel = f"{rel}/f{i:02d}.bin"
            size = rng.choice(SIZES)
            data = bytearray(rng.randbytes(size))
            if size > 65536 and i % 3 == 0:      # a hole in the middle
                data[4096:size - 4096] = bytes(size - 8192)
            with open(root / frel, "wb") as f:
                f.write(data)
            files[frel] = hashlib.sha256(data).hexdigest()
        lrel = f"{rel}/link"
        os.symlink(f"f{d % 12:02d}.bin", root / lrel)
        links[lrel] = f"f{d % 12:02d}.bin"
    return SimpleNamespace(root=root, files=files, dirs=dirs, links=links)


def write_proto(tree, path):
    """mkfs.xfs prototype file (see mkfs.xfs(8)) for the tree."""
    lines = ["nbdferry-test", "0 0", "d--755 0 0"]

    def walk(d, depth):
        ind = "  " * depth
        for e in sorted(d.iterdir()):
            if e.is_symlink():
                lines.append(f"{ind}{e.name} l--777 0 0 {os.readlink(e)}")
            elif e.is_dir():
                lines.append(f"{ind}{e.name} d--755 0 0")
                walk(e, depth + 1)
            else:
                lines.append(f"{ind}{e.name} ---644 0 0 {e}")
        lines.append(f"{ind}$")
    walk(tree.root, 1)
    Path(path).write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def images():
    """Both images, built once for the module in RAM."""
    for fs in FS.values():
        for tool in fs.tools:
            if shutil.which(tool) is None:
                pytest.skip(f"{tool} not installed")
    base = tempfile.mkdtemp(prefix="nffs-", dir="/dev/shm"
                            if os.path.isdir("/dev/shm") else None)
    base = Path(base)
    try:
        tree = make_tree(base / "tree")
        assert len(tree.files) + len(tree.dirs) >= 300
        xfs = base / "xfs.img"
        with open(xfs, "wb") as f:
            f.truncate(FS["xfs"].image)
        write_proto(tree, base / "proto")
        r = subprocess.run(["mkfs.xfs", "-q", "-f", "-p", base / "proto", xfs],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"mkfs.xfs -p failed here: {r.stderr.strip()}")
        ext4 = base / "ext4.img"
        r = subprocess.run(["mke2fs", "-q", "-F", "-t", "ext4", "-d",
                            tree.root, ext4, str(FS["ext4"].image // 1024)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"mke2fs -d failed here: {r.stderr.strip()}")
        yield SimpleNamespace(tree=tree, xfs=xfs, ext4=ext4)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def copied(server, mount, images, fstype):
    """The image copied with cp --sparse=always onto a larger export full
    of random bytes; content checked through the mount and on the
    server (the old bytes beyond the image read as zero)."""
    fs = FS[fstype]
    img = getattr(images, fstype)
    assert os.stat(img).st_blocks * 512 < fs.image // 2, "image not sparse"
    srv = server("memory", f"size={fs.export}")
    fill_garbage(srv.uri, fs.export, seed=len(fstype))
    m = mount(srv)
    r = run(["cp", "--sparse=always", img, m.file])
    assert r.returncode == 0, f"cp exited {r.returncode}: {r.stderr}"
    assert os.path.getsize(img) == fs.image
    assert_content(img, fs.export, mount_file=m.file, uri=srv.uri,
                   mount_size=fs.image, what=f"{fstype} image")
    return srv, m, img


@pytest.mark.parametrize("fstype", list(FS))
def test_fsimage_fsck_clean(server, mount, images, fstype):
    srv, m, img = copied(server, mount, images, fstype)
    if fstype == "xfs":
        r = run(["xfs_repair", "-n", "-f", m.file])
    else:
        r = run(["e2fsck", "-f", "-n", m.file])
    assert r.returncode == 0, \
        f"{r.args[0]} on MNT/nbd exited {r.returncode}:\n{r.stdout}{r.stderr}"
    # The check only read: the disk still equals the image.
    assert_content(img, FS[fstype].export, mount_file=m.file, uri=srv.uri,
                   mount_size=FS[fstype].image, what="after fsck")


def digests(root):
    """{relpath: sha256} of the regular files and {relpath: target} of
    the symlinks under root (the top lost+found ignored)."""
    files, links = {}, {}
    for dirpath, dirnames, filenames in os.walk(root):
        if dirpath == str(root) and "lost+found" in dirnames:
            dirnames.remove("lost+found")
        for n in filenames:
            p = Path(dirpath) / n
            rel = str(p.relative_to(root))
            if p.is_symlink():
                links[rel] = os.readlink(p)
            else:
                files[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return files, links


@pytest.mark.parametrize("fstype", list(FS))
def test_fsimage_loop_mount_same_files(server, mount, images, fstype,
                                       shortdir):
    if not (os.path.exists("/dev/loop-control") and shutil.which("losetup")):
        pytest.skip("no loop devices (/dev/loop-control, losetup)")
    srv, m, img = copied(server, mount, images, fstype)
    r = run(["losetup", "-f", "--show", "-r", m.file])
    if r.returncode != 0:
        pytest.skip(f"losetup on a FUSE file failed: {r.stderr.strip()}")
    dev = r.stdout.strip()
    mnt = shortdir / "loopmnt"
    mnt.mkdir()
    try:
        r = run(["mount", "-t", fstype, "-o", FS[fstype].ro_opts, dev, mnt])
        if r.returncode != 0:
            pytest.skip(f"mount -t {fstype} of {dev} failed: "
                        f"{r.stderr.strip()}")
        try:
            files, links = digests(mnt)
        finally:
            run(["umount", mnt], check=True)
    finally:
        run(["losetup", "-d", dev])
    tree = images.tree
    missing = sorted(set(tree.files) - set(files))
    extra = sorted(set(files) - set(tree.files))
    wrong = sorted(k for k in tree.files if k in files
                   and files[k] != tree.files[k])
    assert not (missing or extra or wrong), \
        f"{fstype} via loop: missing {missing[:5]}, extra {extra[:5]}, " \
        f"wrong content {wrong[:5]}"
    assert links == tree.links
