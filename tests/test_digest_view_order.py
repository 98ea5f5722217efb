"""The inline digest of a view landing does not depend on the number of
connections.

qemu-img convert -c writes a compressed qcow2 whose clusters the view
decodes on its decompressor threads, while clusters qemu could not
compress are placed at once (a streamOptimized VMDK's grains are
inflated on the view's threads too): within one write request the decoded data
reach the disk (and the digest) in an order that depends on timing, so
a block far behind a placed one may arrive after the digest had folded
it.  A disk of scattered data (regions far more than the digest's fold
lag apart, each with compressible and random data) is landed through
nbd.qcow2 (and as a streamOptimized VMDK through nbd.vmdk) with
--connections 1, 2 and 4, several times each: every time
the inline digest is complete and equals the blkhash of the raw source
(and nbdferry-verify's of the source), and the server's bytes are the
source's (sha256).  A qcow2 whose clusters lie in the order a guest wrote
them (qemu-io writes shuffled over the disk), far from disk order, lands
with a complete digest too.

Run: /usr/bin/python3 -m pytest tests/test_digest_view_order.py
"""

import random
import shutil

import pytest

from lib.digest import blkhash_file, sha256_file
from lib.env import BUILD, MiB
from lib.nbd import sha256_nbd
from lib.procs import run
from test_digest_inline import settled_digest

for tool in ("qemu-img", "qemu-io"):
    if not shutil.which(tool):
        raise RuntimeError(f"{tool} missing (scripts/install-deps)")
VERIFY = BUILD / "tools" / "nbdferry-verify"
if not VERIFY.exists():
    raise RuntimeError(f"{VERIFY} not built")

DISK = 1024 * MiB
# Regions of data 300 MiB apart (the digest folds blocks 256 MiB behind
# the end of the data): compressible text, then random bytes that qemu
# stores uncompressed.
REGIONS = (0, 300 * MiB, 600 * MiB, 900 * MiB)


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    d = tmp_path_factory.mktemp("digestorder")
    raw = d / "src.raw"
    rnd = random.Random(41)
    text = b"".join(b"line %d of a compressible region\n" % i
                    for i in range(200000))
    with open(raw, "wb") as f:
        f.truncate(DISK)
        for at in REGIONS:
            f.seek(at)
            f.write(text[:3 * MiB])
            f.write(rnd.randbytes(3 * MiB))
            f.write(text[:2 * MiB])
    imgs = {"qcow2": d / "src.qcow2", "vmdk": d / "src.vmdk"}
    for fmt, opts in (("qcow2", ["-c"]),
                      ("vmdk", ["-o", "subformat=streamOptimized"])):
        r = run(["qemu-img", "convert", "-q", *opts, "-f", "raw", "-O", fmt,
                 raw, imgs[fmt]], timeout=300)
        assert r.returncode == 0, r.stderr
    r = run([VERIFY, raw], timeout=300)
    assert r.returncode == 0, r.stderr
    verify = r.stdout.split()[0]
    return raw, imgs, blkhash_file(raw), verify, sha256_file(raw)


@pytest.mark.parametrize("conns", [1, 2, 4])
@pytest.mark.parametrize("fmt,rep", [("qcow2", 0), ("qcow2", 1),
                                     ("qcow2", 2), ("vmdk", 0), ("vmdk", 1)])
def test_digest_view_landing_complete_any_connections(server, mount, src,
                                                      conns, fmt, rep):
    raw, imgs, want, verify, sha = src
    srv = server("memory", f"size={DISK}")
    m = mount(srv, "--connections", str(conns))
    r = run(["cp", imgs[fmt], m.mp / f"nbd.{fmt}"], timeout=300)
    assert r.returncode == 0, (r.stderr, m.stderr[-2000:])
    d = settled_digest(m, secs=120)
    assert d["state"] == "complete", (conns, d.get("reason"), d)
    assert d["value"] == want == verify, (d, want, verify)
    assert sha256_nbd(srv.uri) == sha


@pytest.fixture(scope="module")
def vm_order(tmp_path_factory):
    """A qcow2 whose clusters lie in the order a guest wrote them, not
    in disk order: 160 writes of 256 KiB, shuffled over a 1 GiB disk."""
    d = tmp_path_factory.mktemp("vmorder")
    img = d / "vm.qcow2"
    r = run(["qemu-img", "create", "-q", "-f", "qcow2", img, str(DISK)])
    assert r.returncode == 0, r.stderr
    offs = [i * (DISK // 160) for i in range(160)]
    random.Random(6).shuffle(offs)
    argv = ["qemu-io", "-f", "qcow2"]
    for n, off in enumerate(offs):
        argv += ["-c", f"write -P {n % 255 + 1} {off} 256k"]
    r = run(argv + [img], timeout=300)
    assert r.returncode == 0, r.stderr
    raw = d / "vm.raw"
    r = run(["qemu-img", "convert", "-q", "-O", "raw", img, raw], timeout=300)
    assert r.returncode == 0, r.stderr
    return img, blkhash_file(raw), sha256_file(raw)


@pytest.mark.parametrize("conns", [1, 4])
def test_digest_view_landing_any_cluster_order(server, mount, vm_order,
                                               conns):
    """Clusters in no disk order (each 256 KiB run comes hundreds of MiB
    away from the one before): the digest still completes, below the
    view pass's state bound (a disk of 16 GiB)."""
    img, want, sha = vm_order
    srv = server("memory", f"size={DISK}")
    m = mount(srv, "--connections", str(conns))
    r = run(["cp", img, m.mp / "nbd.qcow2"], timeout=300)
    assert r.returncode == 0, (r.stderr, m.stderr[-2000:])
    d = settled_digest(m, secs=120)
    assert d["state"] == "complete", (conns, d.get("reason"), d)
    assert d["value"] == want, (d, want)
    assert sha256_nbd(srv.uri) == sha
