"""Landings through the format views are checkable, and nbdferry-verify
decodes the images the views take.

A VHD (qemu-img: dynamic and fixed), a VMDK (qemu-img: streamOptimized
and monolithicSparse; python3-vmdkstream: the OVA layout), a VHDX
(qemu-img: dynamic and fixed) or a qcow2 (qemu-img, version 3) written
into its view starts a new inline digest over the decoded disk: the
status's value equals `nbdferry-verify IMAGE` (blkhash, the default, in
any order; with --digest=sha256 where the decoded data arrive in disk
order), and `nbdferry-verify --zero-tail IMAGE URI` matches the export.
An image as DESTINATION is decoded too (the view's own export, read back
with cp).  tests/test_verify_qcow2.py has the qcow2 variants, backing
chains and damage.  An image nbdferry-verify recognises but does not
decode (a VMDK descriptor, a tar archive) is refused with the reason,
exit 2, unless --format=raw.  A VHDX not closed cleanly
(tests/unit/vhdx-build.h's log) is decoded with its log replayed, as the
view lands it; a log that writes behind itself and a file shorter than
its log says are errors naming the rule.

Run: /usr/bin/python3 -m pytest tests/test_verify_views.py
"""

import random
import shutil

import pytest

from lib.content import assert_content
from lib.env import MiB
from lib.nbd import fill_random
from lib.procs import run
from test_digest_inline import settled_digest
from test_verify import VERIFY
from test_vhdx_view import mkfile

for tool in ("qemu-img", "tar"):
    if not shutil.which(tool):
        raise RuntimeError(f"{tool} missing (scripts/install-deps)")
if run(["/usr/bin/python3", "-c", "import VMDKstream"]).returncode != 0:
    raise RuntimeError("python3-vmdkstream missing (scripts/install-deps)")

EXPORT = 48 * MiB
DISK = 20 * MiB                        # a whole number of 2 MiB VHD blocks


def make_disk(path, size=DISK, seed=3):
    """Data in scattered runs (some unaligned), zeros between."""
    rnd = random.Random(seed)
    data = bytearray(size)
    for off, n in ((0, 300000), (3 * MiB, 65536), (7 * MiB + 12345, 777777),
                   (12 * MiB, 2 * MiB), (size - MiB, MiB)):
        data[off:off + n] = rnd.randbytes(n)
    path.write_bytes(bytes(data))
    return path


def qemu(src, dst, fmt, opts):
    r = run(["qemu-img", "convert", "-q", "-f", "raw", "-O", fmt, "-o", opts,
             str(src), str(dst)])
    assert r.returncode == 0, r.stderr
    return dst


def vmdkstream(src, dst):
    r = run(["/usr/bin/python3", "-c", "import sys, VMDKstream; "
             "VMDKstream.convert_to_stream(sys.argv[1], sys.argv[2])",
             str(src), str(dst)])
    assert r.returncode == 0, r.stderr
    return dst


# name -> (view, maker, extra mount options)
IMAGES = {
    "vhd-dynamic": ("nbd.vhd", lambda s, d: qemu(
        s, d, "vpc", "subformat=dynamic,force_size=on"), ()),
    "vhd-fixed": ("nbd.vhd", lambda s, d: qemu(
        s, d, "vpc", "subformat=fixed,force_size=on"), ("--vhd-fixed",)),
    "vmdk-stream": ("nbd.vmdk", lambda s, d: qemu(
        s, d, "vmdk", "subformat=streamOptimized"), ()),
    "vmdk-sparse": ("nbd.vmdk", lambda s, d: qemu(
        s, d, "vmdk", "subformat=monolithicSparse"), ()),
    "vmdkstream": ("nbd.vmdk", vmdkstream, ()),
    "vhdx-dynamic": ("nbd.vhdx", lambda s, d: qemu(
        s, d, "vhdx", "subformat=dynamic,block_size=1M"), ()),
    "vhdx-fixed": ("nbd.vhdx", lambda s, d: qemu(
        s, d, "vhdx", "subformat=fixed"), ()),
    "qcow2": ("nbd.qcow2", lambda s, d: qemu(s, d, "qcow2", "compat=1.1"),
              ()),
}


def verify(*args, rc=0):
    r = run([str(VERIFY), *map(str, args)])
    assert r.returncode == rc, (args, r.stdout, r.stderr)
    return r


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    d = tmp_path_factory.mktemp("images")
    raw = make_disk(d / "disk.raw")
    suffix = {"nbd.vhd": ".vhd", "nbd.vmdk": ".vmdk", "nbd.vhdx": ".vhdx",
              "nbd.qcow2": ".qcow2"}
    files = {name: make(raw, d / (name + suffix[view]))
             for name, (view, make, _) in IMAGES.items()}
    return raw, files


@pytest.mark.parametrize("blkhash", [False, True], ids=["sha256", "blkhash"])
@pytest.mark.parametrize("name", list(IMAGES))
def test_view_landing_digest_equals_verify(server, mount, images, name,
                                           blkhash):
    raw, files = images
    view, _, opts = IMAGES[name]
    img = files[name]
    srv = server("memory", f"size={EXPORT}")
    fill_random(srv.uri, EXPORT)           # a stale byte would show
    digest_opt = ["--blkhash"] if blkhash else ["--digest=sha256"]
    m = mount(srv, *opts, *digest_opt)
    r = run(["cp", str(img), str(m.mp / view)])
    assert r.returncode == 0, (r.stderr, m.stderr[-2000:])
    want = verify(*digest_opt, img).stdout.split()[0]
    assert want == verify(*digest_opt, raw).stdout.split()[0]
    d = settled_digest(m)
    # streamOptimized grains are placed as they inflate, on several
    # threads: sha256 holds the early ones until their request is done.
    assert d["state"] == "complete", d
    assert d["value"] == want and d["covered"] == DISK, d
    # The export holds the disk, then zeros (nothing stale past it).
    verify(*digest_opt, "--zero-tail", img, srv.uri)
    assert_content(raw, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=DISK, what=f"cp {name} into {view}")


@pytest.mark.parametrize("view,suffix", [("nbd.vhd", ".vhd"),
                                         ("nbd.vmdk", ".vmdk"),
                                         ("nbd.qcow2", ".qcow2")])
def test_exported_image_as_destination(server, mount, images, shm, view,
                                       suffix):
    """`cp MNT/nbd.vhd out.vhd`: the VHD (VMDK, qcow2) is decoded as
    DESTINATION and compared with the raw SOURCE."""
    raw, _ = images
    srv = server("memory", f"size={EXPORT}")
    m = mount(srv)
    run(["cp", str(raw), str(m.file)], check=True)
    out = shm / ("out" + suffix)
    run(["cp", str(m.mp / view), str(out)], check=True)
    r = verify(raw, out)
    assert "MATCH" in r.stdout and "MISMATCH" not in r.stdout, r.stdout
    kind = suffix[1:]
    assert f"{out} ({kind}, {DISK} bytes)" in r.stdout, r.stdout
    # A changed byte of the decoded disk is found as a mismatch.
    bad = bytearray(raw.read_bytes())
    bad[7 * MiB + 20000] ^= 0xFF
    other = shm / "bad.raw"
    other.write_bytes(bytes(bad))
    r = verify(other, out, rc=1)
    assert "MISMATCH" in r.stdout, r.stdout


@pytest.mark.parametrize("kind", ["vmdk-descriptor", "tar"])
def test_unknown_container_refused(server, images, shm, kind):
    """`nbdferry-verify vm.ova URI`: refused, never hashed as raw."""
    raw, files = images
    if kind == "tar":
        img = shm / "vm.ova"
        run(["tar", "-cf", str(img), "-C", str(files["vmdk-stream"].parent),
             files["vmdk-stream"].name], check=True)
        reason = "tar archive"
    else:
        img = qemu(raw, shm / "disk.vmdk", "vmdk", "subformat=monolithicFlat")
        reason = "VMDK descriptor"
    srv = server("memory", f"size={DISK}")
    for args in ([img, srv.uri], [img], [raw, img]):
        r = verify(*args, rc=2)
        assert r.stdout == "", r.stdout
        assert f"{img}: a {reason}" in r.stderr, r.stderr
        assert "--format=raw" in r.stderr, r.stderr
    # Forced: the file's own bytes, as sha256sum sees them.
    want = run(["sha256sum", str(img)], check=True).stdout.split()[0]
    assert verify("--digest=sha256", "--format=raw", img).stdout.split()[0] \
        == want
    assert verify("-d", "sha256", "--raw", img).stdout.split()[0] == want


def test_format_option(images):
    raw, files = images
    want = verify(raw).stdout.split()[0]
    assert verify("--format=vmdk", files["vmdk-sparse"]).stdout.split()[0] \
        == want
    assert verify("--format=vhd", files["vhd-dynamic"]).stdout.split()[0] \
        == want
    r = verify("--format=vhd", files["vmdk-stream"], rc=2)
    assert "--format=vhd, but this is a VMDK" in r.stderr, r.stderr
    r = verify("--format=vmdk", raw, rc=2)
    assert "not a VMDK" in r.stderr, r.stderr
    assert verify("--format=vhdx", files["vhdx-dynamic"]).stdout.split()[0] \
        == want
    r = verify("--format=vhdx", files["vhd-dynamic"], rc=2)
    assert "--format=vhdx, but this is a VHD" in r.stderr, r.stderr
    assert verify("--format=qcow2", files["qcow2"]).stdout.split()[0] == want
    r = verify("--format=qcow2", raw, rc=2)
    assert "--format=qcow2, but this is not a qcow2 image" in r.stderr, \
        r.stderr
    r = verify("--format=qcow2", files["vhdx-dynamic"], rc=2)
    assert "--format=qcow2, but this is a VHDX image" in r.stderr, r.stderr
    r = verify("--format=qcow3", raw, rc=2)
    assert "unknown format" in r.stderr, r.stderr


@pytest.mark.parametrize("digest", ["blkhash", "sha256"])
def test_verify_vhdx_log_is_replayed(tmp_path, digest):
    """The log restores the BAT's first sector (all zeros in place: without
    the replay every block there reads as zero) and zeros a block's first
    64 KiB: the value is that of the disk after the replay, the one the
    view lands (tests/test_vhdx_view.py), and the image matches that disk
    as SOURCE and as DESTINATION."""
    vhdx, want = mkfile(tmp_path, "log", 8 * MiB + 4096, flags="l")
    opt = f"--digest={digest}"
    value = verify(opt, want).stdout.split()[0]
    assert verify(opt, vhdx).stdout.split()[0] == value
    verify(opt, vhdx, want)
    verify(opt, want, vhdx)


def test_verify_vhdx_bad_log_is_an_error(tmp_path):
    behind, _ = mkfile(tmp_path, "behind", 4 * MiB, flags="lb")
    r = verify(behind, rc=2)
    assert "writes into the header section" in r.stderr, r.stderr
    assert "qemu-img check -r all" in r.stderr, r.stderr
    cut, _ = mkfile(tmp_path, "cut", 4 * MiB, flags="lc")
    r = verify(cut, rc=2)
    assert "cut short: its log says it was at least" in r.stderr, r.stderr


def test_views_export_the_raw_file_size(server, mount, shm):
    """A 1 GiB image copied onto a 4 GiB export: nbd is 1 GiB, and so are
    the disks of nbd.vhd and nbd.vmdk, which qemu-img reads at that size
    without options (a VHD read by CHS geometry would lose the last 256
    KiB, where a GPT keeps its backup header)."""
    GiB = 1 << 30
    src = shm / "disk.img"
    with open(src, "wb") as f:
        f.truncate(GiB)
        for off in (0, 300 * MiB + 5, GiB - 4096):
            f.seek(off)
            f.write(random.Random(off).randbytes(4096))
    srv = server("memory", f"size={4 * GiB}")
    m = mount(srv)
    run(["cp", "--sparse=always", str(src), str(m.file)], check=True)
    assert (m.mp / "nbd").stat().st_size == GiB
    for view, fmt in (("nbd.vhd", "vpc"), ("nbd.vmdk", "vmdk"),
                      ("nbd.vhdx", "vhdx")):
        out = shm / ("out." + fmt)
        run(["cp", str(m.mp / view), str(out)], check=True)
        r = run(["qemu-img", "info", "--output=json", str(out)], check=True)
        assert f'"virtual-size": {GiB},' in r.stdout, r.stdout
        r = run(["qemu-img", "compare", "-f", "raw", "-F", fmt, str(src),
                 str(out)])
        assert r.returncode == 0 and "identical" in r.stdout, r
        assert verify(src, out).returncode == 0
        out.unlink()


def test_image_on_a_pipe_refused(images):
    """`tar -xOf vm.ova disk.vmdk | nbdferry-verify -`: a pipe cannot be
    decoded, so a VMDK there is refused, not hashed as its container."""
    raw, files = images
    for name in ("vmdk-stream", "vhd-dynamic"):
        img = files[name]
        r = run(["sh", "-c", f"cat '{img}' | '{VERIFY}' -"])
        assert r.returncode == 2 and r.stdout == "", (r.stdout, r.stderr)
        assert "on a pipe" in r.stderr and "--format=raw" in r.stderr, r.stderr
        r = run(["sh", "-c", f"cat '{img}' | '{VERIFY}' --digest=sha256 "
                 f"--format=raw -"])
        assert r.returncode == 0, r.stderr
        want = run(["sha256sum", str(img)], check=True).stdout.split()[0]
        assert r.stdout.split()[0] == want
    r = run(["sh", "-c", f"cat '{raw}' | '{VERIFY}' -"])
    assert r.returncode == 0 and r.stdout.split()[0] == \
        verify(raw).stdout.split()[0]


def test_damaged_vmdk_is_an_error(images, shm):
    """A corrupt grain or a cut file: exit 2 naming the rule, no digest."""
    _, files = images
    data = bytearray(files["vmdk-stream"].read_bytes())
    bad = shm / "bad.vmdk"
    data[70000] ^= 0xFF                  # inside the first grain's deflate
    bad.write_bytes(bytes(data))
    r = verify(bad, rc=2)
    assert r.stdout == "" and "grain for LBA" in r.stderr, r.stderr
    cut = shm / "cut.vmdk"
    cut.write_bytes(files["vmdk-sparse"].read_bytes()[:300000])
    r = verify(cut, rc=2)
    assert r.stdout == "" and "past the end of the file" in r.stderr, r.stderr
