"""MOUNTPOINT/nbd.vhdx: VHDX files written into the mount land on the
export, and reading it exports the disk as a dynamic VHDX.

Files come from qemu-img (dynamic, fixed, several block sizes) and from
tests/unit/vhdx-build.h through the vhdx-mkfile helper, for what qemu-img
cannot write: the metadata and BAT after the blocks (spooled, bounded by
--spool-max), differencing files with sector bitmaps (applied over what
the disk holds), every block state, a log to replay (replayed as it
streams).  Every landing
starts from an export full of random bytes and compares the sha256 of
the disk, through the mount and read from the server, with what the file
describes.  Refused files (not a VHDX, a bad region table, a log that
writes behind itself)
leave the disk untouched; a log that says the file was longer fails at
close.  An export of a disk not in whole sectors is rounded up.

What every view promises (a qemu-img image lands; a damaged header is
refused with the disk untouched; a cut file fails at close; a disk larger
than the export is ENOSPC; a second writer is EBUSY; O_TRUNC alone
changes nothing; the export round trip; the inline digest; the progress)
is tested once for all of them in test_view_contract.py; this file keeps
the VHDX view's own rules.

Run: /usr/bin/python3 -m pytest tests/test_vhdx_view.py
"""

import functools
import hashlib
import os
import random
import shutil

import pytest

from lib.content import assert_content
from lib.digest import sha256_file
from lib.env import BUILD, MiB
from lib import formats
from lib.formats import assert_untouched, copy_into, land as land_in
from lib.nbd import fill_random, sha256_nbd
from lib.procs import run
from test_digest_inline import status

if not shutil.which("qemu-img"):
    raise RuntimeError("qemu-img missing (scripts/install-deps)")
MKFILE = BUILD / "tests" / "vhdx-mkfile"
if not MKFILE.exists():
    raise RuntimeError(f"{MKFILE} missing: build the tree (scripts/build)")

RAW_SIZE = 9 * MiB + 512 * 3            # not a multiple of the block size
EXPORT = 16 * MiB


def make_raw(path, size=RAW_SIZE, seed=1):
    rnd = random.Random(seed)
    data = bytearray(size)
    for m in range(-(-size // MiB)):
        if m % 3 == 1:
            continue                    # all-zero MiBs
        end = min((m + 1) * MiB, size)
        data[m * MiB:end] = rnd.randbytes(end - m * MiB)
    path.write_bytes(bytes(data))
    return path


def qemu_vhdx(src, dst, *opts):
    o = ["-o", ",".join(opts)] if opts else []
    r = run(["qemu-img", "convert", "-q", "-f", "raw", "-O", "vhdx", *o,
             str(src), str(dst)])
    assert r.returncode == 0, r.stderr
    return dst


def mkfile(d, name, size, block=MiB, lsec=512, flags="", seed=3, base=None):
    out, want = d / f"{name}.vhdx", d / f"{name}.want"
    r = run([str(MKFILE), str(out), str(want), str(base) if base else "-",
             str(size), str(block), str(lsec), flags or "-", str(seed)])
    assert r.returncode == 0, r.stderr
    return out, want


land = functools.partial(land_in, view="nbd.vhdx")


def random_export(server, size=EXPORT):
    return formats.random_export(server, size)


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    d = tmp_path_factory.mktemp("vhdx")
    raw = make_raw(d / "src.raw")
    files = {
        "dynamic": qemu_vhdx(raw, d / "dynamic.vhdx"),
        "dynamic-1M": qemu_vhdx(raw, d / "dyn1.vhdx", "block_size=1M"),
        "dynamic-8M": qemu_vhdx(raw, d / "dyn8.vhdx", "block_size=8M"),
        "dynamic-256M": qemu_vhdx(raw, d / "dyn256.vhdx", "block_size=256M"),
        "fixed": qemu_vhdx(raw, d / "fixed.vhdx", "subformat=fixed"),
    }
    return d, raw, files


# ---- landing ---------------------------------------------------------------

@pytest.mark.parametrize("name", ["dynamic-1M", "dynamic-8M", "dynamic-256M",
                                  "fixed"])
def test_qemu_kinds_land(server, mount, fx, name):
    _, raw, files = fx
    srv, _ = random_export(server)
    m = mount(srv)
    land(m, files[name], "cp-sparse-always")
    assert_content(raw, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=RAW_SIZE, what=name)


@pytest.mark.parametrize("lsec", [512, 4096])
def test_block_states_and_regions_after_data(server, mount, tmp_path, lsec):
    """Blocks before the metadata and BAT are spooled and placed once the
    tables arrive; zero, unmapped and absent blocks read as zero."""
    size = 12 * MiB
    vhdx, want = mkfile(tmp_path, "late", size, lsec=lsec, flags="rm")
    srv, _ = random_export(server)
    m = mount(srv, "--spool-dir", str(tmp_path))
    land(m, vhdx, "pipe")
    assert_content(want, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=size)
    assert [p for p in os.listdir(tmp_path) if "spool" in p] == []


def test_spool_spills_to_a_file(server, mount, tmp_path):
    """12 MiB of blocks before the BAT with --spool-max 16M: 8 MiB stay in
    memory, the rest goes to an unnamed file of --spool-dir."""
    size = 12 * MiB
    vhdx, want = mkfile(tmp_path, "late", size, flags="r")
    spool = tmp_path / "spool"
    spool.mkdir()
    srv, _ = random_export(server)
    m = mount(srv, "--spool-dir", str(spool), "--spool-max", "16M", "-v")
    land(m, vhdx, "cat")
    assert_content(want, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=size)
    assert f"{12 * MiB} spooled" in m.stderr, m.stderr[-2000:]
    assert os.listdir(spool) == []


def test_spool_dir_that_cannot_take_it(server, mount, tmp_path):
    """A spool directory that goes away: the image fails naming
    --spool-dir, and the disk keeps what it had (the BAT never came)."""
    vhdx, _ = mkfile(tmp_path, "late", 12 * MiB, flags="r")
    spool = tmp_path / "spool"
    spool.mkdir()
    srv, old = random_export(server)
    m = mount(srv, "--spool-dir", str(spool), "--spool-max", "16M",
              expect_errors=True)
    spool.rmdir()
    r = copy_into("cat", vhdx, m.mp / "nbd.vhdx")
    assert r.returncode != 0
    assert "--spool-dir" in m.stderr
    assert_untouched(srv, m, old)


def test_spool_bound_names_the_option(server, mount, tmp_path):
    vhdx, _ = mkfile(tmp_path, "late", 8 * MiB, flags="r")
    srv, old = random_export(server)
    m = mount(srv, "--spool-max", "2M", expect_errors=True)
    r = copy_into("cp", vhdx, m.mp / "nbd.vhdx")
    assert r.returncode != 0
    assert "--spool-max" in m.stderr
    assert_untouched(srv, m, old)       # the BAT never arrived


def test_differencing_applies_over_the_disk(server, mount, tmp_path):
    size = 10 * MiB
    srv, _ = random_export(server, size)
    base = tmp_path / "base.raw"
    base.write_bytes(random.Random(9).randbytes(size))
    m = mount(srv)
    with open(m.file, "r+b") as f:
        f.write(base.read_bytes())
    vhdx, want = mkfile(tmp_path, "diff", size, flags="dm", base=base)
    land(m, vhdx, "cat")
    assert sha256_nbd(srv.uri) == sha256_file(want)
    assert sha256_file(m.file) == sha256_file(want)


@pytest.mark.parametrize("tool", ["cp", "pipe"])
def test_log_is_replayed(server, mount, tmp_path, tool):
    """A file not closed cleanly: its log restores the BAT's first sector
    (all blocks absent in place) and zeros a block's first 64 KiB; torn
    and foreign entries after it are ignored.  What lands is the disk
    after the replay (qemu-img check -r all agrees, in the unit test)."""
    size = 8 * MiB + 4096
    vhdx, want = mkfile(tmp_path, "log", size, flags="l")
    srv, _ = random_export(server)
    m = mount(srv)
    land(m, vhdx, tool)
    assert_content(want, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=size)
    assert "log entries replayed: 1 (2 writes)" in m.stderr, m.stderr


# ---- refusals --------------------------------------------------------------

def test_not_a_vhdx_is_emediumtype(server, mount, fx, tmp_path):
    _, raw, _ = fx
    q = tmp_path / "disk.qcow2"
    r = run(["qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2",
             str(raw), str(q)])
    assert r.returncode == 0
    srv, old = random_export(server)
    m = mount(srv, expect_errors=True)
    for src in (q, raw):
        r = copy_into("cp", src, m.mp / "nbd.vhdx")
        assert r.returncode != 0
        assert "Wrong medium type" in r.stderr, r.stderr
    into = f"write it into {m.mp}/nbd.qcow2"
    assert "nbd.vhdx: " in m.stderr and into in m.stderr
    # ... and in the status, for a copy tool that only says EMEDIUMTYPE.
    msgs = [f["message"] for f in status(m)["failures"] if "time" in f]
    assert any("nbd.vhdx: " in x and into in x for x in msgs), msgs
    assert_untouched(srv, m, old)


@pytest.mark.parametrize("damage", ["headers", "region", "log", "too-large"])
def test_bad_file_touches_nothing(server, mount, fx, tmp_path, damage):
    _, _, files = fx
    data = bytearray(files["dynamic"].read_bytes())
    export = EXPORT
    if damage == "headers":
        data[64 * 1024 + 100] ^= 1
        data[128 * 1024 + 100] ^= 1
    elif damage == "region":
        data[192 * 1024 + 40] ^= 1
        data[256 * 1024 + 40] ^= 1
    elif damage == "too-large":
        export = 8 * MiB
    bad = tmp_path / "bad.vhdx"
    if damage == "log":
        bad, _ = mkfile(tmp_path, "log", 4 * MiB, flags="lb")
    else:
        bad.write_bytes(bytes(data))
    srv, old = random_export(server, export)
    m = mount(srv, expect_errors=True)
    r = copy_into("cp", bad, m.mp / "nbd.vhdx")
    assert r.returncode != 0
    assert "nbd.vhdx: " in m.stderr
    if damage == "log":                 # it writes behind itself
        assert "log to replay" in m.stderr
        assert "qemu-img check -r all" in m.stderr
    assert_untouched(srv, m, old)


def test_log_cut_short_fails_at_close(server, mount, tmp_path):
    """A file whose log says it was longer than what arrived was cut: the
    copy fails at close naming the rule (after its blocks landed)."""
    vhdx, _ = mkfile(tmp_path, "log", 4 * MiB, flags="lc")
    srv, _ = random_export(server)
    m = mount(srv, expect_errors=True)
    r = copy_into("cp", vhdx, m.mp / "nbd.vhdx")
    assert r.returncode != 0 and "Invalid argument" in r.stderr, r.stderr
    assert "cut short: its log says it was at least" in m.stderr, \
        m.stderr[-2000:]


# ---- export -----------------------------------------------------------------

def test_export_not_whole_sectors(server, mount, tmp_path):
    """A disk of 3 MiB + 1000 bytes: the VHDX's virtual size is rounded up
    to whole sectors (3 MiB + 1024, as qemu-img convert -O vhdx does), the
    24 bytes past the disk read as zero, and the daemon says so.  The file
    lands back on the same export (its zero tail is dropped)."""
    size = 3 * MiB + 1000
    srv, old = random_export(server, size)
    m = mount(srv)
    out = tmp_path / "out.vhdx"
    r = run(["cp", m.mp / "nbd.vhdx", out])
    assert r.returncode == 0, r.stderr
    back = tmp_path / "back.raw"
    r = run(["qemu-img", "convert", "-f", "vhdx", "-O", "raw", str(out),
             str(back)])
    assert r.returncode == 0, r.stderr
    assert back.read_bytes() == old + bytes(24)
    assert "rounded up to 3146752, its last 24 bytes zeros" in m.stderr, \
        m.stderr[-2000:]
    fill_random(srv.uri, size)
    land(m, out, "cp")
    assert sha256_nbd(srv.uri) == hashlib.sha256(old).hexdigest()
