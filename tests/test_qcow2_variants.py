"""MOUNTPOINT/nbd.qcow2 with every kind of qcow2 qemu-img makes, the
copy tools of a migration, real encrypted images and backing chains.

Variants (qemu-img convert of one disk: compat=0.10 plain and zlib, 512 B
and 2 MiB clusters, every refcount width from 1 to 64 bits, zstd with
2 MiB clusters, extended L2 with zstd, preallocation=metadata, lazy
refcounts, a persistent dirty bitmap, i.e. a header extension the view
skips) land through a pipe over random bytes; the plain image through
`tar -xOf vm.tar disk.qcow2 > MNT/nbd.qcow2` and `... | dd bs=1M
iflag=fullblock`; each time the disk (sha256 through the mount and from
the server) equals `qemu-img convert -O raw`.  The holes of a landed
image are not sent as data (nbdkit's log: no all-zero 64 KiB block of
payload, written bytes at most the image's data).  Real LUKS and AES
encrypted images, an image with an external data file and one with an
unknown incompatible feature are refused with EMEDIUMTYPE and the reason
before the disk changes.  A chain base <- mid <- top lands as base, mid,
top; after `qemu-img rebase` top lands on base alone, and after `qemu-img
commit` of top the committed mid lands on base, each equal to qemu-img's
view of the chain.

Run: /usr/bin/python3 -m pytest tests/test_qcow2_variants.py
"""

import hashlib
import os
import random
import shutil
import struct

import pytest

from lib.content import assert_content
from lib.copytools import describe, garbage_target, log_mark, traffic, \
    zero_payload
from lib.env import MiB
from lib.nbd import fill_random, sha256_nbd
from lib.procs import run

for tool in ("qemu-img", "qemu-io", "tar"):
    if not shutil.which(tool):
        raise RuntimeError(f"{tool} missing (scripts/install-deps)")

SIZE = 6 * MiB + 4608                 # not cluster-aligned
EXPORT = 8 * MiB

VARIANTS = {
    "v2": "-o compat=0.10",
    "v2-zlib": "-c -o compat=0.10",
    "c512": "-o cluster_size=512",
    "c2m": "-o cluster_size=2M",
    "rc1": "-o refcount_bits=1",
    "rc2": "-o refcount_bits=2",
    "rc4": "-o refcount_bits=4",
    "rc8": "-o refcount_bits=8",
    "rc32": "-o refcount_bits=32",
    "rc64": "-o refcount_bits=64",
    "zstd-c2m": "-c -o compression_type=zstd,cluster_size=2M",
    "extl2-zstd": "-c -o extended_l2=on,compression_type=zstd",
    "pre-metadata": "-o preallocation=metadata",
    "lazy": "-o lazy_refcounts=on",
    "bitmap": "",                     # plus a bitmap, below
}


def sh(d, script):
    r = run(["sh", "-ec", script], timeout=120, cwd=d)
    assert r.returncode == 0, r.stdout + r.stderr


def make_raw(path):
    """Random and text-like data, a run of one byte, zeros, data in the
    last partial cluster; returns the bytes of data."""
    rnd = random.Random(11)
    text = b"".join(b"row %d of a text-like disk\n" % i for i in range(30000))
    spans = [(0, rnd.randbytes(200000)), (400000, text[:600000]),
             (3 * MiB + 777, b"\xcd" * 150000),
             (5 * MiB, rnd.randbytes(65536)),
             (SIZE - 2500, rnd.randbytes(2500))]
    with open(path, "wb") as f:
        f.truncate(SIZE)
        for off, b in spans:
            f.seek(off)
            f.write(b)
    return sum(len(b) for _, b in spans)


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    d = tmp_path_factory.mktemp("qcow2variants")
    data = make_raw(d / "src.raw")
    imgs = {}
    for name, opts in VARIANTS.items():
        sh(d, f"qemu-img convert -q -f raw -O qcow2 {opts} src.raw "
              f"{name}.qcow2")
        imgs[name] = d / f"{name}.qcow2"
    sh(d, "qemu-img bitmap --add bitmap.qcow2 b0 && "
          "qemu-img info bitmap.qcow2 | grep -q 'name: b0'")
    sh(d, "qemu-img convert -q -f raw -O qcow2 src.raw plain.qcow2 && "
          "cp plain.qcow2 disk.qcow2 && tar -cf vm.tar disk.qcow2")
    imgs["plain"] = d / "plain.qcow2"
    for name, img in imgs.items():
        sh(d, f"qemu-img convert -q -O raw {img.name} {name}.ref && "
              f"cmp {name}.ref src.raw")
    return d, imgs, data


def _q(p):
    return "'" + str(p).replace("'", "'\\''") + "'"


def land(m, cmd):
    r = run(["sh", "-c", cmd], timeout=300)
    assert r.returncode == 0, (f"{cmd}: {r.stderr}\ndaemon stderr:\n"
                               f"{m.stderr[-3000:]}")


def random_export(server):
    srv = server("memory", f"size={EXPORT}")
    return srv, fill_random(srv.uri, EXPORT)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_qcow2_variant_lands_from_a_pipe(server, mount, fx, name):
    d, imgs, _ = fx
    srv, _ = random_export(server)
    m = mount(srv)
    land(m, f"cat {_q(imgs[name])} | cat > {_q(m.mp / 'nbd.qcow2')}")
    assert_content(d / "src.raw", EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=SIZE, what=name)


COPIES = {
    "tar-redirect": "cd {d} && tar -xOf vm.tar disk.qcow2 > {dst}",
    "dd-fullblock": "cat {src} | dd of={dst} bs=1M iflag=fullblock "
                    "status=none",
}


@pytest.mark.parametrize("how", sorted(COPIES))
def test_qcow2_lands_through_tar_and_dd(server, mount, fx, how):
    d, imgs, _ = fx
    srv, _ = random_export(server)
    m = mount(srv)
    land(m, COPIES[how].format(d=_q(d), src=_q(imgs["plain"]),
                               dst=_q(m.mp / "nbd.qcow2")))
    assert_content(d / "src.raw", EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=SIZE, what=how)


def test_qcow2_holes_are_not_sent_as_data(server, mount, fx):
    """Over random bytes the disk's zeros must be written, as write-zeroes
    (or nothing, where the daemon knows), never as payload."""
    d, imgs, data = fx
    g = garbage_target(server, mount, EXPORT)
    mark = log_mark(g.srv)
    land(g.m, f"cp {_q(imgs['zstd-c2m'])} {_q(g.m.mp / 'nbd.qcow2')}")
    assert sha256_nbd(g.srv.uri) == hashlib.sha256(
        (d / "src.raw").read_bytes() + bytes(EXPORT - SIZE)).hexdigest()
    t = traffic(g.srv, since=mark)
    expected = (d / "src.raw").read_bytes()
    zeros, where = zero_payload(t, expected + bytes(EXPORT - SIZE))
    assert zeros == 0, (where, describe(t))
    # Payload: the data, rounded out to the 64 KiB zero blocks it touches.
    assert t.bytes["Write"] <= data + 6 * 65536, describe(t)


# ---- refused before the disk changes -----------------------------------

REAL = {
    # qemu-img times the LUKS key derivation and may give up on a loaded
    # machine ("Unable to get accurate CPU usage"): try a few times.
    "luks": ("for i in 1 2 3 4 5 6 7 8; do qemu-img create -q -f qcow2 "
             "--object secret,id=s,data=x -o encrypt.format=luks,"
             "encrypt.key-secret=s,encrypt.iter-time=10 luks.qcow2 1M "
             "2>/dev/null && break; sleep 0.2; done; test -s luks.qcow2",
             "LUKS"),
    "aes": ("qemu-img create -q -f qcow2 --object secret,id=s,data=x -o "
            "encrypt.format=aes,encrypt.key-secret=s aes.qcow2 1M", "AES"),
    "data-file": ("qemu-img create -q -f qcow2 -o data_file=data.raw "
                  "data-file.qcow2 1M", "external data file"),
    "unknown-feature": ("qemu-img convert -q -f raw -O qcow2 src.raw "
                        "unknown-feature.qcow2", "bit 9"),
}


@pytest.mark.parametrize("case", sorted(REAL))
def test_qcow2_real_refusals_touch_nothing(server, mount, fx, case):
    d, imgs, _ = fx
    script, reason = REAL[case]
    sh(d, script)
    img = d / f"{case}.qcow2"
    if case == "unknown-feature":
        b = bytearray(img.read_bytes())
        struct.pack_into(">Q", b, 72, struct.unpack_from(">Q", b, 72)[0] |
                         1 << 9)
        img.write_bytes(bytes(b))
    srv, old = random_export(server)
    m = mount(srv, expect_errors=True)
    r = run(["cp", img, m.mp / "nbd.qcow2"])
    assert r.returncode != 0 and "Wrong medium type" in r.stderr, r.stderr
    errs = [l for l in m.stderr.splitlines() if "nbd.qcow2:" in l]
    assert errs and reason in " ".join(errs), m.stderr
    assert sha256_nbd(srv.uri) == hashlib.sha256(old).hexdigest(), \
        "the disk changed (read from the server)"
    assert os.stat(m.file).st_size == EXPORT


# ---- backing chains ----------------------------------------------------

@pytest.fixture(scope="module")
def chain(fx):
    """base <- mid <- top, then a rebased copy of top (onto base) and mid
    after committing top into it, with qemu-img's raw view of each."""
    d, imgs, _ = fx
    sh(d, """
        qemu-img convert -q -f raw -O qcow2 src.raw base.qcow2
        qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 mid.qcow2
        qemu-io -f qcow2 -c 'write -P 0x21 0 1M' -c 'write -z 2M 64k' \
            mid.qcow2 >/dev/null
        qemu-img create -q -f qcow2 -b mid.qcow2 -F qcow2 top.qcow2
        qemu-io -f qcow2 -c 'write -P 0x42 512k 1M' -c 'write -z 4M 4k' \
            -c 'write -P 0x43 5M 100k' top.qcow2 >/dev/null
        qemu-img convert -q -O raw top.qcow2 top.ref
        cp top.qcow2 rebased.qcow2
        qemu-img rebase -q -b base.qcow2 -F qcow2 rebased.qcow2
        qemu-img convert -q -O raw rebased.qcow2 rebased.ref
        cmp top.ref rebased.ref
        cp mid.qcow2 committed.qcow2
        cp top.qcow2 top2.qcow2
        qemu-img rebase -q -u -b committed.qcow2 -F qcow2 top2.qcow2
        qemu-img commit -q top2.qcow2
        qemu-img convert -q -O raw committed.qcow2 committed.ref
        cmp top.ref committed.ref
    """)
    return d


@pytest.mark.parametrize("steps", [("base", "mid", "top"),
                                   ("base", "rebased"),
                                   ("base", "committed")],
                         ids=["base-mid-top", "rebased", "committed"])
def test_qcow2_chain_lands_in_order(server, mount, chain, steps):
    srv, _ = random_export(server)
    m = mount(srv)
    for s in steps:
        land(m, f"cat {_q(chain / (s + '.qcow2'))} | "
                f"cat > {_q(m.mp / 'nbd.qcow2')}")
    assert_content(chain / "top.ref", EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=SIZE, what=" then ".join(steps))
