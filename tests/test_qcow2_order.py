"""MOUNTPOINT/nbd.qcow2 with images whose clusters come before the L2
entry that places them, and with tables the refcounts contradict.

qemu reuses freed clusters first-free, so after a discard, a snapshot
deleted or a `qemu-img commit` into an image with freed clusters, new
data lands before an L2 table that already exists.  Three such images
made by qemu-io and qemu-img (each checked with nbdferry-qcow2 info to
need the spool) land byte-exact through cp and a pipe over random bytes
(sha256 through the mount and from the server against `qemu-img convert
-O raw`).  The spool's bounds: too small a --spool-max fails with EFBIG,
the log naming --spool-max and --spool-dir; past half of --spool-max
the spool is a file of --spool-dir (a directory gone fails naming it,
one that exists is left empty).  An L2 table that claims a cluster twice,
points into itself, the L1 table or a refcount block, past the end of
the file, or at a cluster whose refcount is 0, and an L1 table past the
end of the file are refused with EINVAL and
the rule in the log before the disk changes (sha256 of the whole export
on the server unchanged); the view lands a good image afterwards.

Run: /usr/bin/python3 -m pytest tests/test_qcow2_order.py
"""

import hashlib
import os
import random
import shutil
import struct

import pytest

from lib.content import assert_content
from lib.digest import sha256_file
from lib.env import BUILD, MiB
from lib.nbd import fill_random, sha256_nbd
from lib.procs import run

for tool in ("qemu-img", "qemu-io"):
    if not shutil.which(tool):
        raise RuntimeError(f"{tool} missing (scripts/install-deps)")
TOOL = BUILD / "tools" / "nbdferry-qcow2"
if not TOOL.exists():
    raise RuntimeError(f"{TOOL} not built")

SIZE = 8 * MiB
EXPORT = 8 * MiB


def sh(d, script):
    r = run(["sh", "-ec", script], timeout=120, cwd=d)
    assert r.returncode == 0, r.stdout + r.stderr


def spooled(img):
    """Clusters nbdferry-qcow2 info had to spool for img."""
    r = run([TOOL, "info", img])
    assert r.returncode == 0, r.stderr
    line = [l for l in r.stdout.splitlines() if l.startswith("spooled")][0]
    return int(line.split()[1])


QIO = "qemu-io -f qcow2"
C4K = "qemu-img create -q -f qcow2 -o cluster_size=4k"

# name -> shell script making NAME.qcow2 (4 KiB clusters: an L2 table per
# 2 MiB of disk, so the table of 4 MiB is allocated after the first data).
IMAGES = {
    # Discard then rewrite: the table of 4 MiB lies after the first
    # clusters, which the discard frees and the rewrite takes.
    "discard": f"""{C4K} discard.qcow2 8M
        {QIO} -c 'write -P 1 0 128k' -c 'write -P 5 4M 4k' \
              -c 'discard 0 128k' -c 'write -P 3 4100k 100k' \
              -c 'write -P 6 64k 8k' discard.qcow2 >/dev/null""",
    # A snapshot keeps the first clusters; rewriting them copies on write,
    # deleting the snapshot frees the originals for the next write.
    "snapshot": f"""{C4K} snapshot.qcow2 8M
        {QIO} -c 'write -P 1 0 256k' -c 'write -P 5 4M 4k' snapshot.qcow2 \
              >/dev/null
        qemu-img snapshot -c s1 snapshot.qcow2
        {QIO} -c 'write -P 2 0 256k' snapshot.qcow2 >/dev/null
        qemu-img snapshot -d s1 snapshot.qcow2
        {QIO} -c 'write -P 3 4100k 200k' snapshot.qcow2 >/dev/null""",
    # qemu-img commit of an overlay into a base with freed clusters: the
    # committed data takes them, before the base's table of 4 MiB.
    "commit": f"""{C4K} commit.qcow2 8M
        {QIO} -c 'write -P 1 0 128k' -c 'write -P 5 4M 4k' \
              -c 'discard 0 64k' commit.qcow2 >/dev/null
        {C4K} -b commit.qcow2 -F qcow2 top.qcow2
        {QIO} -c 'write -P 2 4100k 64k' -c 'write -P 3 100k 8k' top.qcow2 \
              >/dev/null
        qemu-img commit -q top.qcow2""",
}


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    d = tmp_path_factory.mktemp("qcow2order")
    imgs, refs = {}, {}
    for name, script in IMAGES.items():
        sh(d, script)
        imgs[name] = d / f"{name}.qcow2"
        refs[name] = d / f"{name}.raw"
        sh(d, f"qemu-img check -q {name}.qcow2 && "
              f"qemu-img convert -q -O raw {name}.qcow2 {name}.raw")
        assert spooled(imgs[name]) > 0, f"{name} does not need the spool"
    # A plain image for the damaged tables: one L2 table (64 KiB clusters)
    # before every data cluster, as qemu-img convert writes it.
    rnd = random.Random(3)
    with open(d / "src.raw", "wb") as f:
        f.truncate(6 * MiB)
        f.write(rnd.randbytes(300000))
        f.seek(4 * MiB)
        f.write(rnd.randbytes(100000))
    sh(d, "qemu-img convert -q -f raw -O qcow2 src.raw plain.qcow2")
    imgs["plain"], refs["plain"] = d / "plain.qcow2", d / "src.raw"
    return d, imgs, refs


def _q(p):
    return "'" + str(p).replace("'", "'\\''") + "'"


def copy_into(tool, src, dst):
    argv = (["cp", src, dst] if tool == "cp" else
            ["sh", "-c", f"cat {_q(src)} | cat > {_q(dst)}"])
    return run(argv, timeout=300)


def random_export(server):
    srv = server("memory", f"size={EXPORT}")
    return srv, fill_random(srv.uri, EXPORT)


# ---- clusters before their L2 entry -----------------------------------

@pytest.mark.parametrize("tool", ["cp", "pipe"])
@pytest.mark.parametrize("name", sorted(IMAGES))
def test_qcow2_reused_clusters_land(server, mount, fx, name, tool):
    _, imgs, refs = fx
    srv, _ = random_export(server)
    m = mount(srv)
    r = copy_into(tool, imgs[name], m.mp / "nbd.qcow2")
    assert r.returncode == 0, r.stderr + m.stderr[-2000:]
    assert_content(refs[name], EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=SIZE, what=f"{name} via {tool}")


def test_qcow2_spool_bound_names_both_options(server, mount, fx):
    """The snapshot image needs 200 KiB of spool: 8 KiB is refused with
    EFBIG, the log naming the option that raises it and where it goes."""
    _, imgs, _ = fx
    srv, _ = random_export(server)
    m = mount(srv, "--spool-max", "8K", expect_errors=True)
    r = copy_into("pipe", imgs["snapshot"], m.mp / "nbd.qcow2")
    assert r.returncode != 0 and "File too large" in r.stderr, r.stderr
    err = [l for l in m.stderr.splitlines() if "bytes of spool" in l]
    assert err and "raise --spool-max" in err[0] and \
        "--spool-dir" in err[0], m.stderr


def test_qcow2_spool_spills_to_spool_dir(server, mount, fx, tmp_path):
    """With --spool-max 256K, half stays in memory and the rest goes to an
    unnamed file of --spool-dir: a directory that went away fails naming
    it; one that exists takes it and is left empty."""
    _, imgs, refs = fx
    gone = tmp_path / "gone"
    gone.mkdir()
    srv, _ = random_export(server)
    m = mount(srv, "--spool-max", "256K", "--spool-dir", gone,
              expect_errors=True)
    gone.rmdir()
    r = copy_into("pipe", imgs["snapshot"], m.mp / "nbd.qcow2")
    assert r.returncode != 0, "the spool did not need its file"
    assert "--spool-dir" in m.stderr, m.stderr
    spool = tmp_path / "spool"
    spool.mkdir()
    srv2, _ = random_export(server)
    m2 = mount(srv2, "--spool-max", "256K", "--spool-dir", spool)
    r = copy_into("pipe", imgs["snapshot"], m2.mp / "nbd.qcow2")
    assert r.returncode == 0, r.stderr + m2.stderr[-2000:]
    assert_content(refs["snapshot"], EXPORT, mount_file=m2.file,
                   uri=srv2.uri, mount_size=SIZE, what="spooled to a file")
    assert os.listdir(spool) == []


# ---- tables the refcounts contradict ----------------------------------

def be64(b, at):
    return struct.unpack_from(">Q", b, at)[0]


def tables(b):
    """(L1 offset, first L2 table, first refcount block)."""
    l1 = be64(b, 40)
    return l1, be64(b, l1) & 0x00fffffffffffe00, be64(b, be64(b, 48))


def set_l2(b, i, off):
    _, l2, _ = tables(b)
    struct.pack_into(">Q", b, l2 + 8 * i, (1 << 63) | off)


def first_data(b):
    _, l2, _ = tables(b)
    return be64(b, l2) & 0x00fffffffffffe00


def zero_refcount(b):
    _, _, rb = tables(b)
    struct.pack_into(">H", b, rb + 2 * (first_data(b) >> 16), 0)


# case -> (mutation of the image, words the log must hold)
DAMAGED = {
    "claimed-twice": (lambda b: set_l2(b, 1, first_data(b)), "claimed twice"),
    "into-its-l2": (lambda b: set_l2(b, 2, tables(b)[1]), "claimed twice"),
    "into-l1": (lambda b: set_l2(b, 2, tables(b)[0]), "claimed twice"),
    "into-refblock": (lambda b: set_l2(b, 2, tables(b)[2]), "claimed twice"),
    "past-the-end": (lambda b: set_l2(b, 3, 1 << 40), "refcount is 0"),
    "refcount-0": (zero_refcount, "refcount is 0"),
    # The header puts the L1 table past the end of the file: no refcount
    # block covers it, refused once the refcount table has arrived.
    "l1-past-the-end": (lambda b: struct.pack_into(">Q", b, 40, 1 << 30),
                        "refcount is 0"),
}


@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_qcow2_contradicted_tables_refused(server, mount, fx, tmp_path,
                                           case):
    _, imgs, refs = fx
    fn, words = DAMAGED[case]
    b = bytearray(imgs["plain"].read_bytes())
    fn(b)
    bad = tmp_path / "bad.qcow2"
    bad.write_bytes(bytes(b))
    srv, old = random_export(server)
    m = mount(srv, expect_errors=True)
    r = copy_into("cp", bad, m.mp / "nbd.qcow2")
    assert r.returncode != 0 and "Invalid argument" in r.stderr, \
        (case, r.stderr)
    logged = [l for l in m.stderr.splitlines() if "nbd.qcow2:" in l]
    assert logged, m.stderr
    if words:
        assert words in " ".join(logged), m.stderr
    assert sha256_nbd(srv.uri) == hashlib.sha256(old).hexdigest(), \
        f"{case}: the disk changed (read from the server)"
    r = copy_into("cp", imgs["plain"], m.mp / "nbd.qcow2")
    assert r.returncode == 0, r.stderr
    assert sha256_nbd(srv.uri) == sha256_file(refs["plain"], pad_to=EXPORT)
