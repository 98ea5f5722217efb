"""MOUNTPOINT/nbd.qcow2: qcow2 images written into the mount land on the
export, and reading it exports the disk as a qcow2 v3.

The images come from qemu-img and qemu-io: plain, compressed with zlib
and with zstd (decompressed on the view's threads), with extended L2
entries (subclusters), with a cluster reused after a discard (it lies
before its L2 table: the spool), and an overlay with a backing file
(applied over the disk that holds its base).  Every landing starts from
an export full of random bytes (so a stale byte shows) and compares
sha256 of the disk, read through the mount and directly from the server,
with `qemu-img convert -O raw` of the same image followed by zeros.
Images refused by their header or L1 table leave the disk untouched
(EMEDIUMTYPE or EINVAL, one log line with the reason); a cut image or a
damaged compressed cluster fails the copy.  Exports pass qemu-img check
and compare and land again.

What every view promises (a qemu-img image lands; a damaged header is
refused with the disk untouched; a cut file fails at close; a disk larger
than the export is ENOSPC; a second writer is EBUSY; O_TRUNC alone
changes nothing; the export round trip; the inline digest; the progress)
is tested once for all of them in test_view_contract.py; this file keeps
the qcow2 view's own rules.

Run: /usr/bin/python3 -m pytest tests/test_qcow2_view.py
"""

import functools
import hashlib
import json
import os
import random
import shutil
import struct

import pytest

from lib import formats
from lib.content import assert_content
from lib.digest import blkhash_file, sha256_file
from lib.env import MiB
from lib.nbd import read_nbd, sha256_nbd
from lib.formats import assert_untouched, copy_into, land as land_in
from lib.procs import run
from test_digest_inline import settled_digest

for tool in ("qemu-img", "qemu-io"):
    if not shutil.which(tool):
        raise RuntimeError(f"{tool} missing (scripts/install-deps)")

SIZE = 6 * MiB + 4608                 # not cluster-aligned
EXPORT = 8 * MiB


def qemu_img(*args):
    r = run(["qemu-img", *map(str, args)], timeout=120)
    assert r.returncode == 0, r.stderr
    return r


def qemu_io(img, *cmds):
    argv = ["qemu-io", "-d", "unmap", "-f", "qcow2"]
    for c in cmds:
        argv += ["-c", c]
    r = run(argv + [str(img)], timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def to_raw(img, out):
    qemu_img("convert", "-q", "-O", "raw", img, out)
    return out


def make_raw(path, seed=1):
    """Random and compressible data, all-zero clusters, a run of one
    byte, data in the last partial cluster."""
    rnd = random.Random(seed)
    text = b"".join(b"line %d of a compressible disk\n" % i
                    for i in range(40000))
    with open(path, "wb") as f:
        f.truncate(SIZE)
        f.write(rnd.randbytes(300000))
        f.write(text[:MiB])
        f.seek(3 * MiB + 5000)
        f.write(b"\xab" * 200000)
        f.seek(5 * MiB)
        f.write(rnd.randbytes(70000))
        f.seek(SIZE - 3000)
        f.write(rnd.randbytes(3000))
    return path


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    """The source disk and its images, and each image's raw decode by
    qemu-img, made once for the module."""
    d = tmp_path_factory.mktemp("qcow2view")
    raw = make_raw(d / "src.raw")
    imgs = {}
    for name, opts in (("plain", []), ("zlib", ["-c"]),
                       ("zstd", ["-c", "-o", "compression_type=zstd"])):
        imgs[name] = d / f"{name}.qcow2"
        qemu_img("convert", "-q", "-f", "raw", "-O", "qcow2", *opts, raw,
                 imgs[name])
    x = imgs["extl2"] = d / "extl2.qcow2"
    qemu_img("create", "-q", "-f", "qcow2", "-o",
             "extended_l2=on,cluster_size=64k", x, SIZE)
    qemu_io(x, "write -P 0x11 4096 4096", f"write -P 0x22 {MiB} 2048",
            f"write -P 0x33 {MiB + 40960} 10k", f"write -z {2 * MiB} 8k",
            f"write -P 0x44 {2 * MiB + 8192} 2k",
            f"write -P 0x55 {SIZE - 2048} 2048")
    r = imgs["reused"] = d / "reused.qcow2"
    qemu_img("create", "-q", "-f", "qcow2", "-o", "cluster_size=4k", r, SIZE)
    qemu_io(r, "write -P 1 0 4k", f"write -P 2 {4 * MiB} 4k",
            "discard 0 4k", f"write -P 3 {4 * MiB + 4096} 4k")
    o = imgs["overlay"] = d / "overlay.qcow2"
    qemu_img("create", "-q", "-f", "qcow2", "-b", imgs["plain"].name,
             "-F", "qcow2", o)
    qemu_io(o, "write -P 0x5a 100000 64k", f"write -z {5 * MiB} 64k",
            f"write -P 0 {3 * MiB + 65536} 64k")
    refs = {n: to_raw(i, d / f"{n}.ref") for n, i in imgs.items()}
    for n in ("plain", "zlib", "zstd"):
        assert sha256_file(refs[n]) == sha256_file(raw), n
    return d, raw, imgs, refs


land = functools.partial(land_in, view="nbd.qcow2")


def random_export(server, size=EXPORT):
    return formats.random_export(server, size)


# ---- landing -----------------------------------------------------------

@pytest.mark.parametrize("name,tool", [
    ("zlib", "cp"), ("zlib", "pipe"), ("zstd", "dd-sparse-64K"),
    ("extl2", "cp"), ("extl2", "pipe"), ("reused", "pipe")])
def test_qcow2_lands(server, mount, fx, name, tool):
    """The decoded disk replaces random bytes, holes read as zero; the raw
    file's size becomes the image's virtual size."""
    _, raw, imgs, refs = fx
    srv, _ = random_export(server)
    m = mount(srv)
    land(m, imgs[name], tool)
    assert_content(refs[name], EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=SIZE, what=f"{name} via {tool}")


@pytest.mark.parametrize("name,digest", [
    ("plain", "default"), ("zlib", "default"), ("extl2", "default"),
    ("plain", "sha256"), ("extl2", "sha256")])
def test_qcow2_inline_digest_is_the_decoded_disks(server, mount, fx, name,
                                                  digest):
    """The inline digest of a landing (the default blkhash, and sha256,
    which needs the decoded bytes in disk order) is that of the decoded
    disk: decoded bytes are hashed where the pool holds them, from the
    receiving thread and from the decompressor threads.  (qemu-img -c
    writes compressed clusters out of disk order: sha256 cannot follow
    those, blkhash can.)"""
    _, raw, imgs, refs = fx
    srv, _ = random_export(server)
    m = mount(srv, *(["--digest=sha256"] if digest == "sha256" else []))
    land(m, imgs[name])
    d = settled_digest(m)
    assert d["state"] == "complete", (d.get("reason"), d)
    want = (sha256_file if digest == "sha256" else blkhash_file)(refs[name])
    assert d["value"] == want, d
    assert_content(refs[name], EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=SIZE, what=f"{name} via cp")


def test_qcow2_spool_bound(server, mount, fx):
    """The reused cluster arrives before its L2 table: it lands through
    the spool, and a spool bound smaller than a cluster refuses it with
    the option to raise (after begin: the disk was already taken)."""
    _, raw, imgs, refs = fx
    srv, old = random_export(server)
    m = mount(srv, "--spool-max", "2K", expect_errors=True)
    r = copy_into("pipe", imgs["reused"], m.mp / "nbd.qcow2")
    assert r.returncode != 0 and "File too large" in r.stderr, r.stderr
    assert "raise --spool-max" in m.stderr, m.stderr
    srv2, _ = random_export(server)
    m2 = mount(srv2, "--spool-max", "4K")
    land(m2, imgs["reused"], "pipe")
    assert_content(refs["reused"], EXPORT, mount_file=m2.file, uri=srv2.uri,
                   mount_size=SIZE, what="reused via the spool")


def test_qcow2_overlay_over_its_base(server, mount, fx):
    """base then overlay: the disk is the overlay's view of its chain
    (its zero cluster and its all-zero data cover the base's bytes)."""
    _, raw, imgs, refs = fx
    srv, _ = random_export(server)
    m = mount(srv)
    land(m, imgs["plain"], "cp")
    land(m, imgs["overlay"], "pipe")
    assert_content(refs["overlay"], EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=SIZE, what="base + overlay")


def test_qcow2_snapshot_not_landed_is_warned(server, mount, fx, tmp_path):
    """An image with an internal snapshot lands its active disk; the log
    and the status warn that the snapshot was left out."""
    d, raw, imgs, refs = fx
    s = tmp_path / "snap.qcow2"
    shutil.copy(imgs["plain"], s)
    qemu_img("snapshot", "-c", "before", s)
    qemu_io(s, "write -P 0x77 0 64k")
    srv, _ = random_export(server)
    m = mount(srv, expect_errors=True)
    land(m, s, "cp")
    assert_content(to_raw(s, tmp_path / "snap.raw"), EXPORT,
                   mount_file=m.file, uri=srv.uri, mount_size=SIZE,
                   what="the active disk of an image with a snapshot")
    warns = [l for l in m.stderr.splitlines() if "warning" in l]
    assert len(warns) == 1 and \
        "nbd.qcow2: 1 internal snapshot not landed" in warns[0], m.stderr
    st = json.loads((m.mp / ".nbdferry-status").read_text())
    assert st["warnings"] == 1, st


# ---- refusals and failures ----------------------------------------------

@pytest.fixture
def victim(server, mount):
    srv, old = random_export(server)
    m = mount(srv, expect_errors=True)
    return srv, m, old


def l1_offset(b):
    return struct.unpack_from(">Q", b, 40)[0]


# case -> (mutation, errno text, message in the daemon's log)
REFUSED = {
    "vmdk": (lambda b: b"KDMV" + b[4:], "Wrong medium type",
             "write it into MNT/nbd.vmdk"),
    "dirty": (lambda b: b[:79] + bytes([b[79] | 1]) + b[80:],
              "Wrong medium type", "dirty"),
    "aes": (lambda b: b[:32] + struct.pack(">I", 1) + b[36:],
            "Wrong medium type", "AES"),
    "data-file": (lambda b: b[:79] + bytes([b[79] | 4]) + b[80:],
                  "Wrong medium type", "external data file"),
    "cluster-bits": (lambda b: b[:20] + struct.pack(">I", 23) + b[24:],
                     "Invalid argument", "cluster_bits 23"),
    "l1-reserved": (lambda b: b[:l1_offset(b)] + bytes([b[l1_offset(b)] | 1])
                    + b[l1_offset(b) + 1:], "Invalid argument", "reserved"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_qcow2_refused_disk_untouched(victim, fx, tmp_path, case):
    """A header or L1 table that breaks a rule is refused before anything
    reaches the disk, with the reason; the view works afterwards."""
    srv, m, old = victim
    _, raw, imgs, refs = fx
    fn, errtext, message = REFUSED[case]
    message = message.replace("MNT", str(m.mp))     # the real mountpoint
    bad = tmp_path / "bad.qcow2"
    bad.write_bytes(fn(imgs["plain"].read_bytes()))
    r = copy_into("cp", bad, m.mp / "nbd.qcow2")
    assert r.returncode != 0, f"cp accepted a qcow2 with {case}"
    assert errtext in r.stderr, r.stderr
    errs = [l for l in m.stderr.splitlines() if "nbd.qcow2:" in l and
            ("error" in l.lower() or "refus" in l.lower() or message in l)]
    assert errs and message in " ".join(errs), m.stderr
    assert_untouched(srv, m, old)
    land(m, imgs["zlib"], "cp")
    assert sha256_nbd(srv.uri) == sha256_file(raw, pad_to=EXPORT)


def test_qcow2_damaged_compressed_cluster_fails(victim, fx, tmp_path):
    """Damaged deflate data fails the copy (found on a worker thread)."""
    srv, m, old = victim
    data = bytearray(fx[2]["zlib"].read_bytes())
    # The first L2 table's first compressed entry.
    l2 = struct.unpack_from(">Q", data, l1_offset(data))[0] & 0x00fffffffffffe00
    for i in range(8192):
        e = struct.unpack_from(">Q", data, l2 + 8 * i)[0]
        if e & (1 << 62):
            break
    else:
        raise AssertionError("no compressed cluster in zlib.qcow2")
    off = e & ((1 << 54) - 1)
    for k in range(16):
        data[off + 8 + k] ^= 0x5a
    bad = tmp_path / "bad.qcow2"
    bad.write_bytes(bytes(data))
    r = copy_into("cp", bad, m.mp / "nbd.qcow2")
    assert r.returncode != 0 and "Invalid argument" in r.stderr, r.stderr


def test_qcow2_last_compressed_cluster_placed_before_close(server, mount,
                                                           tmp_path):
    """A compressed cluster that ends the file inside its last sector is
    handed over only when the stream finishes: it is placed (the sha256
    digest, in disk order, is complete) before close() answers, and when
    it is damaged, close() fails."""
    one = tmp_path / "one.qcow2"
    qemu_img("create", "-q", "-f", "qcow2", one, MiB)
    qemu_io(one, "write -c -P 0x61 0 64k")
    data = one.read_bytes()
    assert len(data) % 512, "the compressed cluster must end mid-sector"
    want = b"a" * 65536 + bytes(MiB - 65536)
    srv, _ = random_export(server)
    m = mount(srv, "--digest=sha256", expect_errors=True)
    land(m, one)
    d = settled_digest(m)
    assert d["state"] == "complete", (d.get("reason"), d)
    assert d["value"] == hashlib.sha256(want).hexdigest()
    assert read_nbd(srv.uri, 0, MiB) == want
    bad = tmp_path / "bad.qcow2"
    bad.write_bytes(data[:-60] + b"\xff" * 60)
    r = copy_into("cp", bad, m.mp / "nbd.qcow2")
    assert r.returncode != 0 and "Invalid argument" in r.stderr, r.stderr
    assert "not a valid deflate stream" in m.stderr, m.stderr


# ---- export: reading nbd.qcow2 ------------------------------------------

def export_checks(m, srv, tmp_path):
    """cp MNT/nbd.qcow2 out: qemu-img check passes, and compare finds it
    equal to the disk up to the raw file's size (read from the server)."""
    size = os.stat(m.file).st_size
    disk = read_nbd(srv.uri)[:size]
    (tmp_path / "disk.raw").write_bytes(disk)
    out = tmp_path / "out.qcow2"
    r = run(["cp", m.mp / "nbd.qcow2", out])
    assert r.returncode == 0, r.stderr
    assert os.path.getsize(out) == os.stat(m.mp / "nbd.qcow2").st_size
    r = run(["qemu-img", "check", "-f", "qcow2", out])
    assert r.returncode == 0, r.stdout + r.stderr
    r = run(["qemu-img", "compare", "-f", "qcow2", "-F", "raw", out,
             tmp_path / "disk.raw"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert sha256_file(to_raw(out, tmp_path / "back.raw")) == \
        hashlib.sha256(disk).hexdigest()
    return out, disk


def test_qcow2_export_after_landing_and_round_trip(server, mount, fx,
                                                   tmp_path):
    _, raw, imgs, refs = fx
    srv, _ = random_export(server)
    m = mount(srv)
    land(m, imgs["zstd"], "cp")
    out, disk = export_checks(m, srv, tmp_path)
    assert hashlib.sha256(disk).hexdigest() == sha256_file(raw)
    # Holes are not stored: the source's data is under 2 MiB.
    assert os.path.getsize(out) < 3 * MiB, os.path.getsize(out)
    srv2, _ = random_export(server)
    m2 = mount(srv2)
    land(m2, out, "pipe")
    assert_content(raw, EXPORT, mount_file=m2.file, uri=srv2.uri,
                   mount_size=SIZE, what="nbd.qcow2 landed again")


def test_qcow2_export_size_with_fragmented_data(server, mount, tmp_path):
    """The size stat reports (counted from the zero maps, without a
    synthesizer) equals the file read, with extents sharing clusters and
    crossing an L2 table's 512 MiB; qemu-img compares it with the server."""
    export = 640 * MiB
    srv = server("memory", f"size={export}")
    m = mount(srv)
    spots = [100, 1000, 70000, 512 * MiB - 10, 512 * MiB + 65530,
             600 * MiB]
    with open(m.file, "r+b") as f:
        for off in spots:
            f.seek(off)
            f.write(b"y" * 20)
    out = tmp_path / "out.qcow2"
    r = run(["cp", m.mp / "nbd.qcow2", out])
    assert r.returncode == 0, r.stderr
    assert os.path.getsize(out) == os.stat(m.mp / "nbd.qcow2").st_size
    r = run(["qemu-img", "check", "-f", "qcow2", out])
    assert r.returncode == 0, r.stdout + r.stderr
    r = run(["qemu-img", "compare", "-f", "qcow2", "-F", "raw", out, srv.uri])
    assert r.returncode == 0, r.stdout + r.stderr
    # 64 KiB clusters: 0 (two spots), 1, 8191 and 8192 (across 512 MiB),
    # 8193 (the spot across 512 MiB + 64 KiB shares 8192) and 9600.
    r = run(["qemu-img", "map", "--output=json", "-f", "qcow2", out])
    data = sum(e["length"] for e in json.loads(r.stdout)
               if e["data"])
    assert data == 6 * 65536, r.stdout
