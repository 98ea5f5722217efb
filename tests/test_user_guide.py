"""What docs/user-guide.md tells a user to type works as it says.

- The raw-migration line for qemu-img (taken from the guide itself, with
  disk.img and /mnt/disk replaced) onto an export full of old data: the
  guide's own `qemu-img compare` check passes and the server holds the
  source followed by zeros.
- "One writer": a second writer's bytes in a hole the mount believes zero
  are invisible through the mount, and `nbdferry-verify --zero-tail
  disk.img URI`, as the guide says, sees them.
- "A verified migration with blkhash, end to end": the guide's lines, run
  as a shell script onto an export full of old data, find the source's
  blkhash in the status and the read-back matches; with one byte of the
  export changed behind the daemon's back the read-back says so.
- Every line of "Migrate a raw disk" (cp, dd, rsync, qemu-img raw and
  qcow2), the VHD chain, the VMDK and OVA block and the Verify lines, run
  as printed (paths and the URI replaced, the build's programs on PATH)
  onto an export full of old data, each checked on the server; the "Exit
  status" block with `nbdferry --unmount`.
- "Warm migration": the first pass, a change of the source, the cutover
  with its trust line and proof, run as printed: the cutover writes at
  most 3x the changed bytes and the server holds the source.
- The README's "Using it" block from the top of the tree after the quick
  start (programs in build/, no install).
- `nbdferry --help` names the views, the status file, nbdferry-status and
  --unmount; every program answers --version with the project's version.

Run: /usr/bin/python3 -m pytest tests/test_user_guide.py
"""

import os
import re
import subprocess
from pathlib import Path

import pytest

from lib.content import assert_content
from lib.env import BUILD, MiB
from lib.images import make_sparse_image, random_bytes
from lib.mounts import is_mounted
from lib.nbd import fill_random, write_nbd
from lib.procs import run

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "user-guide.md"
EXPORT = 64 * MiB
VERIFY = next(p for p in (BUILD / "tools" / "nbdferry-verify",
                          BUILD / "nbdferry-verify") if p.exists())


def guide_line(pattern):
    """The indented command line of the guide that matches pattern."""
    for line in GUIDE.read_text().splitlines():
        if line.startswith("    ") and re.search(pattern, line):
            return line.split("  #")[0].strip()
    raise AssertionError(f"no line matching {pattern!r} in {GUIDE}")


def test_guide_qemu_img_line_leaves_no_old_tail(server, mount, shm):
    srv = server("memory", f"size={EXPORT}")
    fill_random(srv.uri, EXPORT)
    m = mount(srv)
    img = make_sparse_image(shm / "disk.img", 20 * MiB + 4096, runs=5,
                            seed=7)
    line = guide_line(r"qemu-img convert .*/mnt/disk/nbd")
    cmd = line.replace("disk.img", str(img.path)).replace("/mnt/disk",
                                                          str(m.mp))
    r = run(["sh", "-c", cmd])
    assert r.returncode == 0, (cmd, r.stderr)
    check = guide_line(r"qemu-img compare").replace(
        "disk.img", str(img.path)).replace("/mnt/disk", str(m.mp))
    r = run(["sh", "-c", check])
    assert r.returncode == 0, (check, r.stdout, r.stderr)
    assert_content(img.path, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=img.size, what="the guide's qemu-img line")


def test_one_writer_verify_against_the_server(server, mount, shm):
    """A hole of the source that the mount knows to be zero: another
    writer's bytes there stay on the server, the mount reads zeros."""
    srv = server("memory", f"size={EXPORT}")
    m = mount(srv)
    src = shm / "disk.img"
    with open(src, "wb") as f:             # data, 16 MiB hole, data
        f.write(random_bytes(8 * MiB))
        f.seek(24 * MiB)
        f.write(random_bytes(8 * MiB))
    write_nbd(srv.uri, b"\x77" * MiB, 12 * MiB)     # the other writer
    run(["cp", "--sparse=always", src, m.file], check=True)
    with open(m.file, "rb") as f:
        f.seek(12 * MiB)
        seen = f.read(MiB)
    through_mount = run([VERIFY, "--zero-tail", src, m.file])
    direct = run([VERIFY, "--zero-tail", src, srv.uri])
    # documented: the mount cannot see it (its zero map says zero) ...
    assert seen == bytes(MiB) and through_mount.returncode == 0, \
        "the mount saw the other writer: update the guide's One writer"
    # ... and the guide's check against the server does
    assert direct.returncode == 1, (direct.stdout, direct.stderr)


STATUS = Path(__file__).resolve().parent.parent / "tools" / "status" / "nbdferry-status"


def guide_block(first, last):
    """The guide's indented command lines from the one before the line
    matching 'first' to the one matching 'last', comments dropped."""
    lines = [l.split("  #")[0].strip() for l in
             GUIDE.read_text().splitlines() if l.startswith("    ")]
    i = next(n for n, l in enumerate(lines) if re.search(first, l))
    j = next(n for n, l in enumerate(lines) if n > i and re.search(last, l))
    return lines[i - 1:j + 1]


def test_guide_blkhash_end_to_end(server, mount, shm):
    srv = server("memory", f"size={EXPORT}")
    fill_random(srv.uri, EXPORT)
    m = mount(srv)                # the guide's line: no options
    img = make_sparse_image(shm / "disk.img", 40 * MiB + 5, runs=6, seed=19)
    block = guide_block(r"> disk.blkhash &$", r"--zero-tail")
    assert block[0].startswith("nbdferry /mnt/disk ")  # the fixture mounts
    assert block[-2] == "fusermount3 -u /mnt/disk"

    def local(line):
        uri = re.search(r"'(nbd\+unix://[^']*)'", block[0]).group(1)
        return (line.replace("nbdferry-verify", str(VERIFY))
                .replace("nbdferry-status", f"/usr/bin/python3 {STATUS}")
                .replace("disk.blkhash", str(shm / "disk.blkhash"))
                .replace("disk.img", str(img.path))
                .replace("/mnt/disk", str(m.mp))
                .replace(uri, srv.uri))

    script = "set -e\n" + "\n".join(local(l) for l in block[1:-2])
    r = run(["bash", "-c", script])
    assert r.returncode == 0, (script, r.stdout, r.stderr)
    want = (shm / "disk.blkhash").read_text().split()[0]
    assert f"complete: {want}" in r.stdout, r.stdout
    m.unmount()
    readback = ["sh", "-c", local(block[-1])]
    r = run(readback)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert_content(img.path, EXPORT, uri=srv.uri, what="the guide's blkhash "
                   "migration")
    with open(img.path, "rb") as f:            # a byte the server lost
        byte = f.read(1)
    write_nbd(srv.uri, bytes([byte[0] ^ 1]), 0)
    assert run(readback).returncode == 1


# ---- the guide's migration commands, each run as printed -------------------

from test_docs_examples import Runner, bindir, disk, qemu  # noqa: E402,F401
from lib.vhd import fixture  # noqa: E402
import shutil  # noqa: E402

README = GUIDE.parent.parent / "README.md"
def gline(pattern):
    """The guide's command line matching pattern (on the line without its
    indent and comment)."""
    for line in GUIDE.read_text().splitlines():
        cmd = line.split("  #")[0].strip()
        if line.startswith("    ") and re.search(pattern, cmd):
            return cmd
    raise AssertionError(f"no line matching {pattern!r} in {GUIDE}")


def gblock(first, last):
    """The guide's command lines from the one matching first to the next
    one matching last."""
    lines = [l.split("  #")[0].strip() for l in
             GUIDE.read_text().splitlines() if l.startswith("    ")]
    i = next(n for n, l in enumerate(lines) if re.search(first, l))
    j = next(n for n, l in enumerate(lines) if n >= i and re.search(last, l))
    return lines[i:j + 1]


RAW_LINES = [r"^cp --sparse=always disk.img", r"^dd .*conv=fsync",
             r"^dd .*conv=sparse", r"^rsync --inplace --sparse",
             r"^rsync -a --inplace --no-whole-file", r"^rsync -a -I --inplace",
             r"^truncate -s .*qemu-img"]


@pytest.fixture
def runner(bindir, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    r = Runner(bindir, work)
    yield r
    r.cleanup()


@pytest.mark.parametrize("pattern", RAW_LINES)
def test_guide_raw_migration_lines(server, mount, runner, pattern):
    """Each line of "Migrate a raw disk", onto an export full of old data:
    the source then zeros, on the server."""
    srv = server("memory", f"size={EXPORT}")
    fill_random(srv.uri, EXPORT)
    m = mount(srv)
    img = disk(runner.work / "disk.img")
    runner.sub("/mnt/disk", m.mp)
    runner([gline(pattern)])
    assert_content(img, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=os.path.getsize(img), what=pattern)


def test_guide_qcow2_line_on_a_dirty_disk(server, mount, runner):
    srv = server("memory", f"size={EXPORT}")
    fill_random(srv.uri, EXPORT)
    m = mount(srv)
    img = disk(runner.work / "disk.img")
    qemu(img, runner.work / "vm.qcow2", "qcow2")
    runner.sub("/mnt/disk", m.mp)
    runner([gline(r"^qemu-img convert -f qcow2")])
    r = runner(["qemu-img compare -f qcow2 -F raw vm.qcow2 /mnt/disk/nbd"])
    assert "Images are identical" in r.stdout
    assert_content(img, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=os.path.getsize(img), what="guide qcow2 line")


def test_guide_vhd_chain(server, mount, runner):
    srv = server("memory", f"size={96 * MiB}")
    fill_random(srv.uri, 96 * MiB)
    m = mount(srv)
    w = runner.work
    shutil.copy(fixture("tap-dyn-64m.vhd", w), w / "base.vhd")
    shutil.copy(fixture("tap-diff-64m.vhd", w), w / "snap1.vhd")
    runner.sub("/mnt/disk", m.mp)
    runner(gblock(r"^cp base.vhd", r"^cp snap1.vhd"))
    want = fixture("tap-diff-64m.raw", w)
    assert_content(want, 96 * MiB, mount_file=m.file, uri=srv.uri,
                   mount_size=64 * MiB, what="the guide's VHD chain")
    # ... and the guide's verify line for it
    runner.sub("'nbd+unix:///?socket=/tmp/nbd.sock'", srv.uri)
    r = runner(["nbdferry-verify --zero-tail snap1.vhd "
                "'nbd+unix:///?socket=/tmp/nbd.sock'"])
    assert "result       MATCH" in r.stdout, r.stdout


def test_guide_vmdk_and_ova(server, mount, runner):
    srv = server("memory", f"size={EXPORT}")
    fill_random(srv.uri, EXPORT)
    m = mount(srv)
    w = runner.work
    first = disk(w / "first.img", seed=3)
    qemu(first, w / "vm-disk1.vmdk", "vmdk", "subformat=streamOptimized")
    run(["tar", "-cf", str(w / "vm.ova"), "-C", str(w), "vm-disk1.vmdk"],
        check=True)
    img = disk(w / "disk.img", seed=4)
    qemu(img, w / "disk.vmdk", "vmdk", "subformat=monolithicSparse")
    runner.sub("/mnt/disk", m.mp)
    block = gblock(r"^tar -tf vm.ova", r"^nbdferry-vmdk check")
    runner(block[:2])                  # tar -tf, tar -xOf into the view
    assert_content(first, EXPORT, uri=srv.uri, what="the OVA's disk")
    r = runner(block[2:])              # cp disk.vmdk, nbdferry-vmdk check
    assert "ok: monolithicSparse" in r.stdout, r.stdout
    assert_content(img, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=SIZE_OF(img), what="cp disk.vmdk")
    runner.sub("'nbd+unix:///?socket=/tmp/nbd.sock'", srv.uri)
    r = runner([gline(r"^nbdferry-verify --zero-tail disk.vmdk")])
    assert "result       MATCH" in r.stdout, r.stdout


def SIZE_OF(p):
    return os.path.getsize(p)


def test_guide_whole_vm(server, runner, shortdir, tmp_path):
    """"Migrating a whole VM": one mount of every export of one nbdkit, a
    raw image, a VHD chain and an OVA's VMDK copied at once, one unmount
    with a line per disk; each export holds its disk."""
    exports = tmp_path / "exports"
    exports.mkdir()
    for name, size in (("disk0", EXPORT), ("disk1", 96 * MiB),
                       ("disk2", EXPORT)):
        with open(exports / name, "wb") as f:
            f.truncate(size)
    srv = server("file", f"dir={exports}", tcp=True)
    mp = shortdir / "vm"
    mp.mkdir()
    runner.mps.append(mp)
    w = runner.work
    raw = disk(w / "vm-disk0.img", seed=5)
    shutil.copy(fixture("tap-dyn-64m.vhd", w), w / "base.vhd")
    shutil.copy(fixture("tap-diff-64m.vhd", w), w / "snap1.vhd")
    third = disk(w / "third.img", seed=6)
    qemu(third, w / "vm-disk2.vmdk", "vmdk", "subformat=streamOptimized")
    run(["tar", "-cf", str(w / "vm.ova"), "-C", str(w), "vm-disk2.vmdk"],
        check=True)
    (w / "vm-disk2.vmdk").unlink()        # only in the OVA
    runner.sub("/mnt/vm", mp)
    runner.sub("nbd://dest.example.com", srv.uri.rstrip("/"))
    r = runner(gblock(r"^nbdferry /mnt/vm --all-exports",
                      r"^nbdferry --unmount /mnt/vm"))
    for n in ("disk0", "disk1", "disk2"):
        assert f"{n}: ok: " in r.stdout, r.stdout
    base = srv.uri.rstrip("/")
    assert_content(raw, EXPORT, uri=f"{base}/disk0", what="guide VM disk0")
    assert_content(fixture("tap-diff-64m.raw", w), 96 * MiB,
                   uri=f"{base}/disk1", what="guide VM disk1 (VHD chain)")
    assert_content(third, EXPORT, uri=f"{base}/disk2",
                   what="guide VM disk2 (OVA)")


def test_guide_verify_lines(server, mount, runner):
    srv = server("memory", f"size={EXPORT}")
    m = mount(srv)
    img = disk(runner.work / "disk.img")
    run(["cp", "--sparse=always", str(img), str(m.file)], check=True)
    runner.sub("'nbd+unix:///?socket=/tmp/nbd.sock'", srv.uri)
    runner.sub("/mnt/disk", m.mp)
    for pattern in (r"^nbdferry-verify --zero-tail disk.img 'nbd",
                    r"^nbdferry-verify disk.img /mnt/disk/nbd"):
        r = runner([gline(pattern)])
        assert "result       MATCH" in r.stdout, (pattern, r.stdout)


def test_guide_verify_qcow2_line(server, runner):
    """A qcow2 over its backing file, decoded: its disk matches an export
    holding qemu-img's raw of it."""
    w = runner.work
    qemu(disk(w / "disk.img"), w / "base.qcow2", "qcow2")
    run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", "base.qcow2", "-F",
         "qcow2", str(w / "top.qcow2")], check=True)
    run(["qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 64k 64k",
         str(w / "top.qcow2")], check=True)
    run(["qemu-img", "convert", "-f", "qcow2", "-O", "raw",
         str(w / "top.qcow2"), str(w / "top.raw")], check=True)
    srv = server("file", w / "top.raw")
    runner.sub("'nbd+unix:///?socket=/tmp/nbd.sock'", srv.uri)
    r = runner([gline(r"^nbdferry-verify top.qcow2 ")])
    assert "result       MATCH" in r.stdout, r.stdout


def test_guide_unmount_and_exit_status_block(server, runner, shortdir):
    """"Exit status": mount, copy, nbdferry --unmount && echo."""
    srv = server("memory", f"size={EXPORT}")
    mp = shortdir / "disk"
    mp.mkdir()
    runner.mps.append(mp)
    img = disk(runner.work / "disk.img")
    runner.sub("/mnt/disk", mp)
    runner.sub("'nbd+unix:///?socket=/tmp/nbd.sock'", srv.uri)
    block = gblock(r"^nbdferry --unmount /mnt/disk &&", r".")
    lines = [l.split("  #")[0].strip() for l in
             GUIDE.read_text().splitlines() if l.startswith("    ")]
    j = lines.index(block[0])
    block = lines[j - 2:j + 1]
    assert block[0].startswith("nbdferry /mnt/disk 'nbd+unix"), block
    assert block[1].startswith("cp "), block
    r = runner(block)
    assert "all acknowledged and flushed" in r.stdout, r.stdout
    assert_content(img, EXPORT, uri=srv.uri, what="the guide's --unmount")


def test_readme_using_it_after_the_quick_start(server, tmp_path, shortdir):
    """The README's "Using it" block, from the top of the tree, with the
    build tree the quick start leaves (build/): no install needed."""
    text = README.read_text()
    sec = text.split("## Using it", 1)[1]
    block = sec.split("```sh\n", 1)[1].split("```", 1)[0].splitlines()
    lines = [l.split("  #")[0].strip() for l in block]
    assert lines[0].startswith("export PATH=") and "build/daemon" in lines[0]
    srv = server("memory", f"size={EXPORT}")
    mp = shortdir / "MNT"
    mp.mkdir()
    img = disk(tmp_path / "disk.img")
    script = "set -e\n" + "\n".join(
        l.replace("$PWD/build", str(BUILD)).replace("MNT", str(mp))
         .replace("nbd+unix:///?socket=/run/nbd.sock", srv.uri)
         .replace("disk.img", str(img)) for l in lines)
    env = dict(os.environ, PATH="/usr/bin:/bin:/usr/sbin:/sbin")
    try:
        r = subprocess.run(["bash", "-c", script], cwd=GUIDE.parent.parent,
                           env=env, stdin=subprocess.DEVNULL,
                           stdout=open(tmp_path / "out", "w"),
                           stderr=open(tmp_path / "err", "w"), timeout=120)
    finally:
        if is_mounted(mp):
            run(["fusermount3", "-u", "-z", str(mp)])
    out = (tmp_path / "out").read_text()
    assert r.returncode == 0, (script, out, (tmp_path / "err").read_text())
    assert "nbd: ok:" in out and "progress" in out, out
    assert_content(img, EXPORT, uri=srv.uri, what="README Using it")


# ---- --help and --version ------------------------------------------------------

def test_help_names_the_views_the_status_and_nbdferry_status(bindir):
    out = run([str(bindir / "nbdferry"), "--help"], check=True).stdout
    for word in ("FILENAME.vhd", "FILENAME.vmdk", ".nbdferry-status",
                 "nbdferry-status", "--unmount"):
        assert word in out, word


def test_every_program_answers_version(bindir):
    version = re.search(r"project\(nbdferry VERSION ([0-9.]+)",
                        (GUIDE.parent.parent / "CMakeLists.txt").read_text()
                        ).group(1)
    for name in ("nbdferry", "nbdferry-verify", "nbdferry-vhd",
                 "nbdferry-vmdk", "nbdferry-status"):
        r = run([str(bindir / name), "--version"])
        assert r.returncode == 0, (name, r.stderr)
        assert r.stdout.startswith(f"{name} {version}"), (name, r.stdout)


# ---- the guide's warm migration, run as printed ------------------------------

def test_guide_warm_migration(server, shortdir, shm, state_dir):
    """"Warm migration": the first pass, a change of the source (the VM
    ran on), the cutover with its checks and proof, each block run as a
    shell script (the daemons started by its own lines, in the test's
    scratch directory); the cutover sends far less than the first pass
    and the server holds the source."""
    from lib.copytools import log_mark, traffic
    from lib.warm import change_source, make_source
    from lib.digest import sha256_file
    disk = shm / "dest.img"
    with open(disk, "wb") as f:
        f.truncate(EXPORT)
    srv = server("file", f"file={disk}", log=True)
    img = make_source(shm / "disk.img", EXPORT)
    mp = shortdir / "mnt"
    mp.mkdir()
    first = gblock(r"^nbdferry --state-dir", r"^nbdferry --unmount /mnt/disk$")
    lines = [l.split("  #")[0].strip() for l in GUIDE.read_text().splitlines()
             if l.startswith("    ")]
    i = [n for n, l in enumerate(lines) if l.startswith("nbdferry --state-dir")]
    assert len(i) == 2, lines
    j = next(n for n in range(i[1], len(lines))
             if lines[n] == "nbdferry --unmount /mnt/disk")
    cutover = lines[i[1]:j + 1]
    bins = f"{BUILD / 'daemon'}:{BUILD / 'tools'}:{STATUS.parent}"

    def script(block):
        uri = re.search(r"'(nbd\+unix://[^']*)'", block[0]).group(1)
        text = "\n".join(l.replace("/var/lib/nbdferry", str(state_dir))
                         .replace("/mnt/disk", str(mp))
                         .replace("disk.blkhash", str(shm / "disk.blkhash"))
                         .replace("disk.img", str(img))
                         .replace(uri, srv.uri) for l in block)
        return ["bash", "-c", f"set -e\nexport PATH={bins}:$PATH\n{text}"]

    def run_block(block):
        mark = log_mark(srv)
        r = run(script(block), timeout=300)
        if is_mounted(mp):
            subprocess.run(["fusermount3", "-u", "-z", str(mp)])
        assert r.returncode == 0, (block, r.stdout, r.stderr)
        return traffic(srv, mark).bytes["Write"], r

    full, _ = run_block(first)
    assert sha256_file(disk) == sha256_file(img)
    changed = change_source(img, EXPORT)
    cut, r = run_block(cutover)
    assert "complete:" in r.stdout and "manifest    trusted" in r.stdout
    assert sha256_file(disk) == sha256_file(img)
    assert cut <= 3 * changed + MiB, (cut, changed, full)
