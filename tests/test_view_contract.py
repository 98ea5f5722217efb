"""The contract every image view keeps (MNT/nbd.vhd, nbd.vmdk, nbd.vhdx,
nbd.qcow2), one case per promise, run for every format of the table in
tests/lib/formats.py.  The per-format files (test_vhd_view.py ...) keep
only each format's own rules.

The source disk is random data with all-zero MiBs, of 6 MiB + 12800
bytes; its image is made by qemu-img (dynamic VHD, streamOptimized VMDK,
dynamic VHDX, qcow2 v3).  Every export starts full of random bytes, so a
stale byte shows, and every case judges the bytes on the server (sha256,
read directly from nbdkit) against the raw source, or against the disk as
it was:

- lands: IMAGE copied into MNT/nbd.FMT by cp, cp --sparse=always, dd
  (bs=1M, and conv=sparse bs=64K), cat and a pipe; the disk is the source then zeros (through
  the mount and on the server), the raw file's size the image's disk.
- a damaged header is refused: the copy fails, the daemon names the rule
  once, the disk is untouched (server and mount) at its size, and a good
  image lands after it.
- an image cut short fails at close: the copy fails, the log and the
  status say so, the progress shows the copy failed and counts what was
  acknowledged before the end.
- an image whose disk is larger than the export: ENOSPC, said once, the
  disk untouched.
- a second writer while one ingests: EBUSY (write and read-write); the
  first lands whole.
- O_TRUNC open and close without data (open(2), the shell's `: >`,
  truncate -s 0): the disk untouched, no error.
- export round trip: cp MNT/nbd.FMT out of an odd-sized random disk;
  qemu-img compares it equal to the disk and decodes it to the same bytes
  (and checks it, for formats qemu-img checks); it lands on another
  random export byte-exact.
- inline digest (the default blkhash, and sha256): the status's digest
  of a landing equals nbdferry-verify of the raw source, covering its
  length.
- progress: dd from a pipe, half the image first: the status counts that
  half acknowledged (below 100%), then 100% of the image's length once dd
  has closed and the pool settled.

Run: /usr/bin/python3 -m pytest -n 2 tests/test_view_contract.py
"""

import errno
import hashlib
import json
import os
import shutil
import subprocess

import pytest

from lib.content import assert_content
from lib.digest import sha256_file
from lib.env import MiB, timeout
from lib.formats import (COPY_TOOLS, FORMATS, RAW_SIZE, assert_untouched,
                         contract_raw, copy_into, cut_short, damaged, land,
                         make_image, qemu_compare, random_export, to_raw)
from lib.nbd import read_nbd, sha256_nbd
from lib.procs import oserror_errno, run, wait_for
from lib.warm import verify_digest
from test_digest_inline import settled_digest, status

for _tool in ("qemu-img", "dd", "truncate"):
    if not shutil.which(_tool):
        raise RuntimeError(f"{_tool} missing (scripts/install-deps)")

EXPORT = 8 * MiB
BS = 64 * 1024

fmts = pytest.mark.parametrize("fmt", list(FORMATS))


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    """The raw source and its image in every format, made once."""
    d = tmp_path_factory.mktemp("contract")
    raw = contract_raw(d / "src.raw")
    images = {n: make_image(f, raw, d / f"src.{n}") for n, f in
              FORMATS.items()}
    return raw, images


def copy(src_path, m, fmt):
    return copy_into("cp", src_path, m.mp / FORMATS[fmt].view)


def view_lines(m, fmt):
    """The daemon's log lines about the view."""
    return [l for l in m.stderr.splitlines() if f"{FORMATS[fmt].view}:" in l]


def landed_raw(srv, raw, export=EXPORT):
    assert sha256_nbd(srv.uri) == sha256_file(raw, pad_to=export), \
        "the disk is not the source then zeros (on the server)"


# ------------------------------------------------------------------ landing


@pytest.mark.parametrize("tool", list(COPY_TOOLS))
@fmts
def test_lands(server, mount, src, fmt, tool):
    raw, images = src
    srv, _ = random_export(server, EXPORT)
    m = mount(srv)
    land(m, images[fmt], tool, view=FORMATS[fmt].view)
    assert_content(raw, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=RAW_SIZE, what=f"{tool} into {FORMATS[fmt].view}")


# ------------------------------------------------------- refusals, failures


@fmts
def test_damaged_header_refused_disk_untouched(server, mount, src, tmp_path,
                                               fmt):
    raw, images = src
    f = FORMATS[fmt]
    srv, old = random_export(server, EXPORT)
    m = mount(srv, expect_errors=True)
    bad = damaged(f, images[fmt], tmp_path / f"bad.{fmt}")
    r = copy(bad, m, fmt)
    assert r.returncode != 0, f"cp accepted a {fmt} with a damaged header"
    lines = view_lines(m, fmt)
    assert len(lines) == 1 and f.refused in lines[0], m.stderr[-3000:]
    assert_untouched(srv, m, old)
    # The view is not left in a state: a good image lands after it.
    land(m, images[fmt], view=FORMATS[fmt].view)
    landed_raw(srv, raw)


@fmts
def test_cut_short_fails_at_close(server, mount, src, tmp_path, fmt):
    raw, images = src
    f = FORMATS[fmt]
    srv, _ = random_export(server, EXPORT)
    m = mount(srv, expect_errors=True)
    cut = cut_short(images[fmt], tmp_path / f"cut.{fmt}")
    r = copy(cut, m, fmt)
    assert r.returncode != 0, f"cp of a {fmt} cut short succeeded"
    assert "cp: " in r.stderr, r.stderr
    assert any(f.cut in l for l in view_lines(m, fmt)), m.stderr[-3000:]
    # The status says why, and that the copy failed.
    st = status(m)
    msgs = [x["message"] for x in st["failures"] if "time" in x]
    assert any(f"{f.view}: " in x and f.cut in x for x in msgs), msgs
    assert st["progress"]["failed"], json.dumps(st, indent=1)
    # What landed before the end is counted, as acknowledged.
    assert st["bytes_acknowledged"] == st["progress"]["acknowledged"] > 0, \
        json.dumps(st, indent=1)


@fmts
def test_larger_than_export_enospc(server, mount, src, fmt):
    raw, images = src
    srv, old = random_export(server, 4 * MiB)
    m = mount(srv, expect_errors=True)
    r = copy(images[fmt], m, fmt)
    assert r.returncode != 0 and "No space left on device" in r.stderr, \
        r.stderr
    lines = view_lines(m, fmt)
    assert len(lines) == 1 and "larger than the export" in lines[0], \
        m.stderr[-3000:]
    assert_untouched(srv, m, old)


@fmts
def test_second_writer_ebusy_while_ingesting(server, mount, src, fmt):
    raw, images = src
    srv, _ = random_export(server, EXPORT)
    m = mount(srv)
    path = m.mp / FORMATS[fmt].view
    data = images[fmt].read_bytes()
    half = len(data) // 2 // BS * BS
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.pwrite(fd, data[:half], 0)
        assert oserror_errno(os.open, path, os.O_WRONLY) == errno.EBUSY
        assert oserror_errno(os.open, path, os.O_RDWR) == errno.EBUSY
        os.pwrite(fd, data[half:], half)
    finally:
        os.close(fd)
    landed_raw(srv, raw)


@fmts
def test_truncate_without_data_leaves_disk(server, mount, fmt):
    srv, old = random_export(server, EXPORT)
    m = mount(srv)
    view = m.mp / FORMATS[fmt].view
    os.close(os.open(view, os.O_WRONLY | os.O_TRUNC))
    assert run(["sh", "-c", ': > "$1"', "sh", view]).returncode == 0
    assert run(["truncate", "-s", "0", view]).returncode == 0
    assert_untouched(srv, m, old)
    assert not view_lines(m, fmt), m.stderr


# ------------------------------------------------------------------- export


@fmts
def test_export_round_trip(server, mount, tmp_path, fmt):
    f = FORMATS[fmt]
    size = 5 * MiB + 512
    srv, old = random_export(server, size)
    m = mount(srv)
    out = tmp_path / f"out.{fmt}"
    r = run(["cp", m.mp / f.view, out], timeout=300)
    assert r.returncode == 0, r.stderr
    assert out.stat().st_size == os.stat(m.mp / f.view).st_size
    disk = tmp_path / "disk.raw"
    disk.write_bytes(read_nbd(srv.uri))
    assert sha256_file(disk) == hashlib.sha256(old).hexdigest()
    rc, text = qemu_compare(f, out, disk)
    assert rc == 0, text
    if f.qemu != "vpc":                 # qemu-img does not check VHDs
        r = run(["qemu-img", "check", "-f", f.qemu, out])
        assert r.returncode == 0, r.stdout + r.stderr
    assert sha256_file(to_raw(f, out, tmp_path / "back.raw")) == \
        sha256_file(disk)
    # ... and lands again, byte-exact, on another random disk.
    srv2, _ = random_export(server, size)
    m2 = mount(srv2)
    land(m2, out, view=f.view)
    assert sha256_nbd(srv2.uri) == hashlib.sha256(old).hexdigest()
    assert sha256_file(m2.file) == hashlib.sha256(old).hexdigest()


# ------------------------------------------------------ digest and progress


@pytest.mark.parametrize("digest", ["default", "sha256"])
@fmts
def test_inline_digest_is_the_sources(server, mount, src, fmt, digest):
    raw, images = src
    opt = ["--digest=sha256"] if digest == "sha256" else []
    want = verify_digest(raw) if not opt else \
        run([str(FORMATS[fmt].tool.parent / "nbdferry-verify"), *opt,
             str(raw)], check=True).stdout.split()[0]
    srv, _ = random_export(server, EXPORT)
    m = mount(srv, *opt)
    land(m, images[fmt], view=FORMATS[fmt].view)
    d = settled_digest(m)
    assert d["state"] == "complete", (d.get("reason"), d)
    assert d["value"] == want, d
    assert d["covered"] == RAW_SIZE, d
    landed_raw(srv, raw)


def progress(m):
    return status(m)["progress"]


@fmts
def test_copy_moves_progress_to_100(server, mount, src, fmt):
    """dd from a pipe into the view, half first: the progress shows that
    half done and below 100%, then 100% with done == total == the image's
    length once dd has closed."""
    raw, images = src
    srv, _ = random_export(server, EXPORT)
    m = mount(srv)
    data = images[fmt].read_bytes()
    half = len(data) // 2 // BS * BS
    dd = subprocess.Popen(["dd", f"of={m.mp}/{FORMATS[fmt].view}", f"bs={BS}",
                           "iflag=fullblock", "status=none"],
                          stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        dd.stdin.write(data[:half])
        dd.stdin.flush()
        # Every byte dd wrote is counted once the server acknowledged it.
        wait_for(lambda: progress(m)["done"] == half, dd,
                 f"progress at {half} bytes of {FORMATS[fmt].view}")
        mid = progress(m)
        assert mid["percent"] < 100, mid
        assert mid["frontier"] == half, mid
        dd.stdin.write(data[half:])
        dd.stdin.close()
        assert dd.wait(timeout(120)) == 0, dd.stderr.read()
    finally:
        if dd.poll() is None:
            dd.kill()
            dd.wait()
    # dd's close() returned with every byte acknowledged; only a settled
    # pool shows 100%: wait for that state, not for a time.
    wait_for(lambda: progress(m)["settled"], None,
             f"{FORMATS[fmt].view}'s progress settled after dd closed")
    end = progress(m)
    assert end["done"] == end["total"] == len(data), end
    assert end["percent"] == 100 and end["settled"], end
    landed_raw(srv, raw)
