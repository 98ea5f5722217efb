"""Every EXAMPLES block of the man pages (docs/*.1) runs as the page
prints it.

Each block is taken from the page (troff escapes undone), its paths and
servers replaced by the test's (/mnt/disk by a mountpoint, the URIs and
sockets by a real nbdkit, disk.img and the other images by files the
test makes), and run with bash -e with the build's programs first on
PATH.  Every landing is checked on the server.  A page with a block no
test runs fails: when an example is added, add its case here.

Run: /usr/bin/python3 -m pytest tests/test_docs_examples.py
"""

import hashlib
import os
import shutil
import subprocess

import pytest

from lib.content import assert_content
from lib.digest import blkhash_file, sha256_file
from lib.env import BUILD, MiB, TOP
from lib.images import make_sparse_image, random_file
from lib.mounts import is_mounted
from lib.nbd import fill_random, sha256_nbd
from lib.procs import run
from lib.vhd import fixture

DOCS = TOP / "docs"
EXPORT = 48 * MiB
SIZE = 20 * MiB                       # the images' disk: whole VHD blocks

for tool in ("qemu-img", "tar", "rsync", "mountpoint"):
    if not shutil.which(tool):
        raise RuntimeError(f"{tool} missing (scripts/install-deps)")


def man_examples(page):
    """The .nf/.fi blocks of the page's EXAMPLES section, as lines."""
    text = (DOCS / page).read_text()
    sec = text.split("\n.SH EXAMPLES\n", 1)[1].split("\n.SH ", 1)[0]
    blocks, cur = [], None
    for line in sec.splitlines():
        if line == ".nf":
            cur = []
        elif line == ".fi":
            blocks.append(cur)
            cur = None
        elif cur is not None and not line.startswith((".RS", ".RE")):
            cur.append(line.replace("\\-", "-").replace("\\(aq", "'")
                       .replace("\\e", "\\"))
    return blocks


@pytest.fixture
def bindir(tmp_path):
    """A directory with the build's programs under their installed names."""
    d = tmp_path / "bin"
    d.mkdir()
    for name, path in (("nbdferry", BUILD / "daemon" / "nbdferry"),
                       ("nbdferry-verify", BUILD / "tools" / "nbdferry-verify"),
                       ("nbdferry-vhd", BUILD / "tools" / "nbdferry-vhd"),
                       ("nbdferry-vmdk", BUILD / "tools" / "nbdferry-vmdk"),
                       ("nbdferry-vhdx", BUILD / "tools" / "nbdferry-vhdx"),
                       ("nbdferry-qcow2", BUILD / "tools" / "nbdferry-qcow2"),
                       ("nbdferry-sync", BUILD / "tools" / "nbdferry-sync"),
                       ("nbdferry-status",
                        TOP / "tools" / "status" / "nbdferry-status")):
        assert path.exists(), f"{path} not built"
        (d / name).symlink_to(path)
    return d


class Runner:
    """Runs a block with substitutions, in a work directory."""

    def __init__(self, bindir, work):
        self.bindir, self.work, self.subs = bindir, work, []
        self.mps = []

    def sub(self, old, new):
        self.subs.append((old, str(new)))

    def text(self, lines):
        out = []
        for line in lines:
            for old, new in self.subs:
                line = line.replace(old, new)
            out.append(line)
        return "\n".join(out)

    def __call__(self, lines, rc=0):
        script = "set -e\n" + self.text(lines)
        env = dict(os.environ, PATH=f"{self.bindir}:{os.environ['PATH']}")
        # Output to files, not pipes: a daemon the block starts (and its
        # nbdkit) would hold a pipe open after the block ends.
        with open(self.work / ".out", "w+") as out, \
                open(self.work / ".err", "w+") as err:
            p = subprocess.run(["bash", "-c", script], cwd=self.work, env=env,
                               stdin=subprocess.DEVNULL, stdout=out,
                               stderr=err, timeout=300)
            out.seek(0)
            err.seek(0)
            r = subprocess.CompletedProcess(p.args, p.returncode, out.read(),
                                            err.read())
        assert r.returncode == rc, (script, r.returncode, r.stdout, r.stderr)
        return r

    def cleanup(self):
        for mp in self.mps:
            if is_mounted(mp):
                run(["fusermount3", "-u", "-z", str(mp)])


@pytest.fixture
def runner(bindir, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    r = Runner(bindir, work)
    yield r
    r.cleanup()


def disk(path, size=SIZE, seed=1):
    return make_sparse_image(path, size, runs=[(0, 300000),
                             (5 * MiB + 7, 700000), (size - MiB, MiB)],
                             seed=seed).path


def qemu(src, dst, fmt, *opts):
    r = run(["qemu-img", "convert", "-q", "-f", "raw", "-O", fmt,
             *(["-o", ",".join(opts)] if opts else []), str(src), str(dst)])
    assert r.returncode == 0, r.stderr
    return dst


# ---- nbdferry(1) -------------------------------------------------------

MAIN = man_examples("nbdferry.1")


def test_every_nbdferry_example_has_a_case():
    assert len(MAIN) == 8, MAIN       # one test below per block


def test_example_progress_unix_socket(server, runner, shortdir):
    srv = server("memory", f"size={EXPORT}")
    fill_random(srv.uri, EXPORT)
    mp = shortdir / "disk"
    mp.mkdir()
    runner.mps.append(mp)
    img = disk(runner.work / "disk.img")
    runner.sub("/mnt/disk", mp)
    runner.sub("/run/nbd.sock", srv.sock)
    r = runner(MAIN[0])
    # nbdferry-verify's line and the status's: the same blkhash value
    assert r.stdout.count(blkhash_file(img)) == 2, r.stdout
    assert "digest      blkhash/sha256/65536 complete" in r.stdout, r.stdout
    assert_content(img, EXPORT, uri=srv.uri, what="nbdferry(1) example 1")


def test_example_dd_tcp_unmount_verdict(server, runner, shortdir):
    srv = server("memory", f"size={EXPORT}", tcp=True)
    fill_random(srv.uri, EXPORT)
    mp = shortdir / "disk"
    mp.mkdir()
    runner.mps.append(mp)
    dev = random_file(runner.work / "vm1.img", 9 * MiB)
    runner.sub("/mnt/disk", mp)
    runner.sub("nbd://dest.example.com/disk", srv.uri)
    runner.sub("/dev/vg/vm1", dev)
    r = runner(MAIN[1])
    assert "nbd: ok: " in r.stdout, r.stdout
    assert f"digest: blkhash/sha256/65536 {blkhash_file(dev)}" in r.stdout, \
        r.stdout
    assert not is_mounted(mp)
    assert_content(dev, EXPORT, uri=srv.uri, what="nbdferry(1) example 2")


def test_example_rsync(server, mount, runner):
    srv = server("memory", f"size={EXPORT}")
    fill_random(srv.uri, EXPORT)
    m = mount(srv)
    img = disk(runner.work / "disk.img")
    runner.sub("/mnt/disk", m.mp)
    runner(MAIN[2])
    assert_content(img, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=SIZE, what="nbdferry(1) rsync example")


def test_example_qemu_img_qcow2_on_a_dirty_disk(server, mount, runner):
    """The old data inside the image's holes and past its end must go."""
    srv = server("memory", f"size={EXPORT}")
    fill_random(srv.uri, EXPORT)
    m = mount(srv)
    img = disk(runner.work / "disk.img")
    qemu(img, runner.work / "vm.qcow2", "qcow2")
    runner.sub("/mnt/disk", m.mp)
    r = runner(MAIN[3])
    assert "Images are identical" in r.stdout, r.stdout
    assert_content(img, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=SIZE, what="nbdferry(1) qcow2 example")


def test_example_views_vhd_vmdk_ova(server, mount, runner):
    srv = server("memory", f"size={EXPORT}")
    fill_random(srv.uri, EXPORT)
    m = mount(srv)
    w = runner.work
    img = disk(w / "disk.img")
    qemu(img, w / "disk.vhd", "vpc", "subformat=dynamic", "force_size=on")
    qemu(img, w / "disk.vmdk", "vmdk", "subformat=streamOptimized")
    other = disk(w / "other.img", seed=2)
    qemu(other, w / "vm-disk1.vmdk", "vmdk", "subformat=streamOptimized")
    run(["tar", "-cf", str(w / "vm.ova"), "-C", str(w), "vm-disk1.vmdk"],
        check=True)
    (w / "vm-disk1.vmdk").unlink()        # only in the OVA
    runner.sub("/mnt/disk", m.mp)
    r = runner(MAIN[4])
    assert r.stdout.count("result       MATCH") == 2, r.stdout
    assert_content(other, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=SIZE, what="the OVA's disk")


def test_example_export_vhd_read_by_qemu(server, mount, runner):
    srv = server("memory", f"size={EXPORT}")
    m = mount(srv)
    img = disk(runner.work / "disk.img", size=SIZE + 3 * 512)  # not CHS-exact
    run(["cp", str(img), str(m.file)], check=True)
    runner.sub("/mnt/disk", m.mp)
    r = runner(MAIN[5])
    assert "Images are identical" in r.stdout, r.stdout


def test_example_nbdkit_command_and_progress_fd(runner, shortdir):
    mp = shortdir / "disk"
    mp.mkdir()
    runner.mps.append(mp)
    out = runner.work / "out.img"
    with open(out, "wb") as f:
        f.truncate(EXPORT)
    runner.sub("/mnt/disk", mp)
    runner(MAIN[6])
    assert is_mounted(mp)
    src = random_file(runner.work / "src.img", 5 * MiB)
    run(["cp", str(src), str(mp / "nbd")], check=True)
    r = run([str(runner.bindir / "nbdferry"), "--unmount", str(mp)])
    assert r.returncode == 0, (r.stdout, r.stderr)
    lines = (runner.work / "progress.log").read_text().split()
    assert lines and lines[-1] == "100/100", lines
    with open(out, "rb") as f:
        assert hashlib.sha256(f.read(5 * MiB)).hexdigest() == \
            sha256_file(src)


def test_example_several_disks_of_a_vm(server, runner, shortdir, tmp_path):
    exports = tmp_path / "exports"
    exports.mkdir()
    for n in ("disk0", "disk1", "disk2"):
        with open(exports / n, "wb") as f:
            f.truncate(EXPORT)
    srv = server("file", f"dir={exports}", tcp=True)
    mp = shortdir / "vm"
    mp.mkdir()
    runner.mps.append(mp)
    w = runner.work
    imgs = [disk(w / "disk0.img", seed=3), disk(w / "d1.img", seed=4),
            disk(w / "d2.img", seed=5)]
    qemu(imgs[1], w / "disk1.vhd", "vpc", "subformat=dynamic",
         "force_size=on")
    qemu(imgs[2], w / "disk2.vmdk", "vmdk", "subformat=streamOptimized")
    run(["tar", "-cf", str(w / "vm.ova"), "-C", str(w), "disk2.vmdk"],
        check=True)
    (w / "disk2.vmdk").unlink()           # only in the OVA
    runner.sub("/mnt/vm", mp)
    runner.sub("nbd://dest.example.com", srv.uri.rstrip("/"))
    r = runner(MAIN[7])
    for n in ("disk0", "disk1", "disk2"):
        assert f"{n}: ok: " in r.stdout, r.stdout
    assert not is_mounted(mp)
    for n, img in zip(("disk0", "disk1", "disk2"), imgs):
        assert_content(img, EXPORT, uri=f"{srv.uri.rstrip('/')}/{n}",
                       what=f"nbdferry(1) several-disk example, {n}")


# ---- nbdferry-verify(1) -------------------------------------------------

VERIFY = man_examples("nbdferry-verify.1")


def test_every_verify_example_has_a_case():
    assert len(VERIFY) == 7, VERIFY


def test_verify_example_copy_through_mount(server, mount, runner):
    srv = server("memory", f"size={SIZE}")
    fill_random(srv.uri, SIZE)
    m = mount(srv)
    disk(runner.work / "disk.img")
    runner.sub("/mnt/nbd", m.file)
    runner.sub("/run/nbd.sock", srv.sock)
    r = runner(VERIFY[0])
    assert "result       MATCH" in r.stdout, r.stdout


def test_verify_example_zero_tail(server, mount, runner):
    srv = server("memory", f"size={EXPORT}")
    m = mount(srv)
    img = disk(runner.work / "disk.img")
    run(["cp", str(img), str(m.file)], check=True)
    runner.sub("nbd://storage:10809/vm1", srv.uri)
    assert "result       MATCH" in runner(VERIFY[1]).stdout


def test_verify_example_vhd_chain(server, mount, runner):
    srv = server("memory", f"size={96 * MiB}")
    fill_random(srv.uri, 96 * MiB)
    m = mount(srv)
    w = runner.work
    shutil.copy(fixture("tap-dyn-64m.vhd", w), w / "base.vhd")
    shutil.copy(fixture("tap-diff-64m.vhd", w), w / "snapshot.vhd")
    runner.sub("nbd://storage/vm1", srv.uri)
    run(["cp", str(w / "base.vhd"), str(m.mp / "nbd.vhd")], check=True)
    assert "result       MATCH" in runner(VERIFY[2][:1]).stdout
    run(["cp", str(w / "snapshot.vhd"), str(m.mp / "nbd.vhd")], check=True)
    assert "result       MATCH" in runner(VERIFY[2][1:]).stdout
    runner(VERIFY[2][:1], rc=1)        # the base no longer matches


def test_verify_example_vmdk(server, mount, runner):
    srv = server("memory", f"size={EXPORT}")
    fill_random(srv.uri, EXPORT)
    m = mount(srv)
    w = runner.work
    img = disk(w / "disk.img")
    qemu(img, w / "disk.vmdk", "vmdk", "subformat=monolithicSparse")
    run(["cp", str(w / "disk.vmdk"), str(m.mp / "nbd.vmdk")], check=True)
    run(["cp", str(m.mp / "nbd.vmdk"), str(w / "out.vmdk")], check=True)
    runner.sub("nbd://storage/vm1", srv.uri)
    r = runner(VERIFY[3])
    assert r.stdout.count("result       MATCH") == 2, r.stdout


def test_verify_example_qcow2(server, runner):
    w = runner.work
    qemu(disk(w / "disk.img"), w / "base.qcow2", "qcow2")
    run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", "base.qcow2", "-F",
         "qcow2", str(w / "vm.qcow2"), str(SIZE)], check=True)
    run(["qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 1M 64k",
         str(w / "vm.qcow2")], check=True)
    run(["qemu-img", "convert", "-f", "qcow2", "-O", "raw",
         str(w / "vm.qcow2"), str(w / "vm.raw")], check=True)
    srv = server("file", w / "vm.raw")
    runner.sub("nbd://storage/vm1", srv.uri)
    r = runner(VERIFY[4][:1])
    assert "result       MATCH" in r.stdout, r.stdout
    r = runner(VERIFY[4][1:])
    assert r.stdout.split()[0] == blkhash_file(w / "vm.qcow2")


def test_verify_example_digest_of_an_export(server, runner):
    srv = server("memory", f"size={SIZE}")
    fill_random(srv.uri, SIZE)
    runner.sub("nbd://storage/vm1", srv.uri)
    r = runner(VERIFY[5])
    assert r.stdout.split()[0] == sha256_nbd(srv.uri), r.stdout


def test_verify_example_request_timeout(server, runner):
    """Against a server whose reads the delay filter holds for an hour;
    the timeout is cut to 1 s to keep the test short."""
    srv = server("memory", f"size={SIZE}", "rdelay=3600",
                 filters=["delay"])
    fill_random(srv.uri, SIZE)
    disk(runner.work / "disk.img")
    runner.sub("nbd://storage/vm1", srv.uri)
    runner.sub("--request-timeout=10", "--request-timeout=1")
    r = runner(VERIFY[6], rc=2)
    assert f"{srv.uri}: no reply from the server for 1 s" in r.stderr, \
        r.stderr


# ---- nbdferry-vhd(1), nbdferry-vmdk(1) -----------------------------------

VHD = man_examples("nbdferry-vhd.1")
VMDK = man_examples("nbdferry-vmdk.1")
VHD_RAW_SHA = "5078c01df7148d118cd10b25b2e686eb05f336b684ebc84a4dc18df35a709c14"


def test_every_vhd_and_vmdk_example_has_a_case():
    assert len(VHD) == 3 and len(VMDK) == 1, (VHD, VMDK)


def test_vhd_example_snapshot_over_its_parent(runner):
    w = runner.work
    shutil.copy(fixture("tap-diff-64m.vhd", w), w / "child.vhd")
    fixture("tap-dyn-64m.vhd", w)        # the parent its locators name
    r = runner(VHD[0])
    assert "ok" in r.stdout, r.stdout
    assert sha256_file(w / "disk.raw") == VHD_RAW_SHA


def test_vhd_example_delta_over_base(runner):
    w = runner.work
    shutil.copy(fixture("vhdtool-delta-64m.vhd", w), w / "delta.vhd")
    shutil.copy(fixture("tap-dyn-64m.vhd", w), w / "base.vhd")
    runner(VHD[1])
    assert sha256_file(w / "disk.raw") == VHD_RAW_SHA


def test_vhd_example_export_compared_by_qemu(runner):
    disk(runner.work / "disk.raw", size=SIZE + 3 * 512)   # not CHS-exact
    r = runner(VHD[2])
    assert r.stdout.count("Images are identical") == 2, r.stdout


def test_vmdk_example(server, mount, runner):
    srv = server("memory", f"size={EXPORT}")
    fill_random(srv.uri, EXPORT)
    m = mount(srv)
    w = runner.work
    first = disk(w / "first.img", seed=5)
    qemu(first, w / "disk1.vmdk", "vmdk", "subformat=streamOptimized")
    other = disk(w / "other.img", seed=6)
    qemu(other, w / "vm-disk1.vmdk", "vmdk", "subformat=streamOptimized")
    run(["tar", "-cf", str(w / "vm.ova"), "-C", str(w), "vm-disk1.vmdk"],
        check=True)
    (w / "vm-disk1.vmdk").unlink()
    runner.sub("/mnt/disk", m.mp)
    runner(VMDK[0])
    assert_content(first, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=SIZE, what="nbdferry-vmdk(1) example")
    assert sha256_file(w / "disk.raw") == sha256_file(other)
    back = w / "back.raw"
    r = run(["qemu-img", "convert", "-f", "vmdk", "-O", "raw",
             str(w / "disk.vmdk"), str(back)])
    assert r.returncode == 0 and sha256_file(back) == sha256_file(other)


# ---- nbdferry-vhdx(1), nbdferry-status(1) --------------------------------

VHDX = man_examples("nbdferry-vhdx.1")
STATUS = man_examples("nbdferry-status.1")


def test_every_vhdx_and_status_example_has_a_case():
    assert len(VHDX) == 1 and len(STATUS) == 1, (VHDX, STATUS)


def test_vhdx_example(runner):
    w = runner.work
    src = disk(w / "src.raw", seed=8)
    qemu(src, w / "disk.vhdx", "vhdx")
    r = runner(VHDX[0])
    assert r.stdout.startswith("ok: dynamic VHDX"), r.stdout
    for out in ("disk.raw", "disk2.raw"):
        assert sha256_file(w / out) == sha256_file(src), out
    # export wrote disk.vhdx again from disk.raw, checked by qemu-img
    back = w / "back.raw"
    r = run(["qemu-img", "convert", "-f", "vhdx", "-O", "raw",
             str(w / "disk.vhdx"), str(back)])
    assert r.returncode == 0 and sha256_file(back) == sha256_file(src)


# ---- nbdferry-qcow2(1) --------------------------------------------------

QCOW2 = man_examples("nbdferry-qcow2.1")


def test_every_qcow2_example_has_a_case():
    assert len(QCOW2) == 1, QCOW2


def test_qcow2_example(runner):
    w = runner.work
    src = disk(w / "src.raw", seed=10)
    qemu(src, w / "vm.qcow2", "qcow2")
    r = runner(QCOW2[0])
    assert r.stdout.startswith("ok: qcow2 version 3"), r.stdout
    assert " allocated " in r.stdout and " unallocated" in r.stdout, r.stdout
    for out in ("disk.raw", "disk2.raw"):
        assert sha256_file(w / out) == sha256_file(src), out
    # export wrote vm.qcow2 again from disk.raw, checked by qemu-img
    back = w / "back.raw"
    r = run(["qemu-img", "convert", "-f", "qcow2", "-O", "raw",
             str(w / "vm.qcow2"), str(back)])
    assert r.returncode == 0 and sha256_file(back) == sha256_file(src)


def test_status_example(server, runner, shortdir):
    srv = server("memory", f"size={EXPORT}", tcp=True)
    fill_random(srv.uri, EXPORT)
    mp = shortdir / "disk"
    mp.mkdir()
    runner.mps.append(mp)
    img = disk(runner.work / "vm1.img", seed=9)
    runner.sub("/mnt/disk", mp)
    runner.sub("nbd://dest.example.com/vm1", srv.uri)
    r = runner(STATUS[0])
    assert "mount" in r.stdout or "written" in r.stdout, r.stdout
    import json
    doc = json.loads((runner.work / "status.json").read_text())
    assert doc["progress"]["written"] >= 0, doc
    assert not is_mounted(mp)
    assert_content(img, EXPORT, uri=srv.uri, mount_size=SIZE,
                   what="nbdferry-status(1) example")


def test_every_man_page_with_examples_is_here():
    covered = {"nbdferry.1", "nbdferry-verify.1", "nbdferry-vhd.1",
               "nbdferry-vmdk.1", "nbdferry-vhdx.1", "nbdferry-qcow2.1",
               "nbdferry-status.1", "nbdferry-sync.1"}
    pages = {p.name for p in DOCS.glob("*.1")
             if "\n.SH EXAMPLES\n" in p.read_text()}
    assert pages == covered, pages ^ covered


# ---- nbdferry-sync(1) ---------------------------------------------------

SYNC = man_examples("nbdferry-sync.1")


def test_every_sync_example_has_a_case():
    assert len(SYNC) == 2, SYNC


def test_sync_example_xapi(server, mount, runner):
    import base64
    img = disk(runner.work / "disk.img")
    dest = server("memory", f"size={SIZE}")
    m = mount(dest)
    run(["cp", str(img), str(m.file)], check=True)      # the base copy
    m.unmount()
    with open(img, "r+b") as f:                         # blocks 3 and 9
        for b in (3, 9):
            f.seek(b * 65536)
            f.write(os.urandom(65536))
    bits = bytearray(SIZE // 65536 // 8)
    bits[0] = 0x80 >> 3
    bits[1] = 0x80 >> 1
    (runner.work / "cbt.b64").write_text(base64.b64encode(bits).decode())
    src = server("file", f"file={img}", extra=["-r"])
    m = mount(dest)
    runner.sub("nbd://xenhost/snapshot", src.uri)
    runner.sub("/mnt/disk", m.mp)
    r = runner(SYNC[0])
    assert "2 blocks of 64 KiB listed" in r.stdout, r.stdout
    m.unmount()
    assert sha256_nbd(dest.uri, SIZE) == sha256_file(img)


def test_sync_example_dirty_bitmap(server, mount, runner):
    w = runner.work
    raw = disk(w / "disk.img")
    qemu(raw, w / "disk.qcow2", "qcow2")
    dest = server("memory", f"size={SIZE}")
    m = mount(dest)
    run(["cp", str(raw), str(m.file)], check=True)      # the base copy
    m.unmount()
    run(["qemu-img", "bitmap", "--add", "--enable", w / "disk.qcow2", "b0"],
        check=True)
    run(["qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 2M 64K",
         w / "disk.qcow2"], check=True)
    run(["qemu-img", "convert", "-f", "qcow2", "-O", "raw", w / "disk.qcow2",
         raw], check=True)
    m = mount(dest)
    runner.sub("/run/src.sock", w / "src.sock")
    runner.sub("/mnt/disk", m.mp)
    r = runner(SYNC[1])
    assert "1 block of 64 KiB listed" in r.stdout, r.stdout
    m.unmount()
    assert sha256_nbd(dest.uri, SIZE) == sha256_file(raw)
