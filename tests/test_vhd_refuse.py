"""MOUNTPOINT/nbd.vhd refuses what is not a VHD before touching the disk.

A stream whose first sector is not a dynamic or differencing VHD footer
copy (garbage, a qcow2 or raw image written there by mistake, a fixed VHD
on a mount without --vhd-fixed) is refused at the write that completes
that sector, with EMEDIUMTYPE, and the reason appears in the daemon's log
and in the status file (errors, failures with the message).  A VHD cut
short before its metadata is complete fails at close, also untouched.
Each case hashes the whole export on the server before and after.  With
--vhd-fixed (or -o vhd_fixed) fixed VHDs land byte-exact.

Run: /usr/bin/python3 -m pytest tests/test_vhd_refuse.py
"""

import errno
import hashlib
import json
import os

import pytest

from lib.digest import sha256_file
from lib.env import MiB
from lib.images import random_bytes
from lib.nbd import fill_random, sha256_nbd
from lib.procs import oserror_errno
from lib.vhd import SHA, VIRTUAL, copy_into, fixture, qemu_img

EXPORT = 16 * MiB
NOT_VHD = "not a dynamic or differencing VHD"


def status(m):
    return json.loads((m.mp / ".nbdferry-status").read_bytes())


def vhd_errors(m):
    return [l for l in m.stderr.splitlines() if "nbd.vhd:" in l]


@pytest.fixture
def victim(server, mount):
    """A random 16 MiB export, mounted; (server, mount, sha256 before)."""
    srv = server("memory", f"size={EXPORT}")
    fill_random(srv.uri, EXPORT)
    m = mount(srv, expect_errors=True)
    return srv, m, sha256_nbd(srv.uri)


def garbage(shm):
    p = shm / "garbage.bin"
    p.write_bytes(random_bytes(3 * MiB + 100))
    return p


def qcow2(shm):
    raw = shm / "src.raw"
    raw.write_bytes(random_bytes(2 * MiB))
    p = shm / "disk.qcow2"
    qemu_img("convert", "-f", "raw", "-O", "qcow2", raw, p)
    return p


def raw_with_boot_sector(shm):
    data = bytearray(random_bytes(4 * MiB))
    data[510:512] = b"\x55\xaa"
    p = shm / "disk.raw"
    p.write_bytes(bytes(data))
    return p


def raw_starting_with_zeros(shm):
    p = shm / "sparse.raw"
    with open(p, "wb") as f:
        f.truncate(6 * MiB)
        f.seek(3 * MiB)
        f.write(random_bytes(MiB))
    return p


def fixed_vhd(shm):
    return fixture("tap-fixed-8m.vhd", shm)


SOURCES = {
    "garbage": (garbage, "is not a VHD footer copy"),
    "qcow2": (qcow2, "a qcow2 image"),
    "raw-boot-sector": (raw_with_boot_sector, "boot sector"),
    "raw-leading-zeros": (raw_starting_with_zeros, "zeros"),
    "fixed-vhd-not-enabled": (fixed_vhd, "fixed VHD"),
}


def check_refusal(srv, m, before, what):
    assert sha256_nbd(srv.uri) == before, f"{what}: the disk changed"
    assert os.stat(m.file).st_size == EXPORT
    errs = vhd_errors(m)
    assert len(errs) == 1 and NOT_VHD in errs[0], m.stderr
    st = status(m)
    assert st["errors"] >= 1, st
    msgs = [f["message"] for f in st["failures"] if f["kind"] == "error"]
    assert any(NOT_VHD in t for t in msgs), st["failures"]


@pytest.mark.parametrize("tool", ["cp", "dd-1M", "cp-sparse-always"])
@pytest.mark.parametrize("case", sorted(SOURCES))
def test_not_a_vhd_refused_disk_untouched(victim, shm, case, tool):
    srv, m, before = victim
    make, hint = SOURCES[case]
    src = make(shm)
    r = copy_into(tool, src, m.mp / "nbd.vhd")
    assert r.returncode != 0, f"{tool} of {case} into nbd.vhd succeeded"
    assert "Wrong medium type" in r.stderr, r.stderr
    check_refusal(srv, m, before, case)
    assert hint in vhd_errors(m)[0], m.stderr
    # the view still takes a real VHD afterwards
    r = copy_into("cp", fixture("qemu-dyn-10m.vhd", shm), m.mp / "nbd.vhd")
    assert r.returncode == 0, r.stderr
    assert sha256_nbd(srv.uri, VIRTUAL["qemu-dyn-10m"]) == \
        SHA["qemu-dyn-10m.raw"]


def test_refused_at_first_write(victim, shm):
    """The write that completes the first sector fails, not the close."""
    srv, m, before = victim
    fd = os.open(m.mp / "nbd.vhd", os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, b"\xee" * 100)           # not a sector yet: accepted
        e = oserror_errno(os.write, fd, b"\xee" * MiB)
        assert e == errno.EMEDIUMTYPE, f"errno {e}"
        e = oserror_errno(os.write, fd, b"\xee" * MiB)
        assert e == errno.EMEDIUMTYPE, f"second write: errno {e}"
    finally:
        e = oserror_errno(os.close, fd)
    assert e == errno.EMEDIUMTYPE, f"close: errno {e}"
    check_refusal(srv, m, before, "first write")


TRUNCATED = {
    "first-300-bytes": 300,          # not even a sector
    "footer-copy-only": 512,
    "inside-header": 1000,
    "inside-bat": 1536 + 8,
}


@pytest.mark.parametrize("case", sorted(TRUNCATED))
def test_truncated_vhd_disk_untouched(victim, shm, case):
    """A VHD cut before its metadata is complete fails at close, EINVAL,
    with the disk as it was."""
    srv, m, before = victim
    data = fixture("qemu-dyn-10m.vhd", shm).read_bytes()[:TRUNCATED[case]]
    p = shm / "cut.vhd"
    p.write_bytes(data)
    r = copy_into("cp", p, m.mp / "nbd.vhd")
    assert r.returncode != 0 and "Invalid argument" in r.stderr, r.stderr
    assert sha256_nbd(srv.uri) == before, "the disk changed"
    errs = vhd_errors(m)
    assert len(errs) == 1 and "file ended" in errs[0], m.stderr
    st = status(m)
    assert any("file ended" in f.get("message", "") for f in st["failures"])


@pytest.mark.parametrize("how", [("--vhd-fixed",), ("-o", "vhd_fixed")])
def test_fixed_vhd_lands_when_enabled(server, mount, shm, how):
    srv = server("memory", f"size={EXPORT}")
    fill_random(srv.uri, EXPORT)
    m = mount(srv, *how)
    r = copy_into("cp", fixed_vhd(shm), m.mp / "nbd.vhd")
    assert r.returncode == 0, r.stderr
    virt = VIRTUAL["tap-fixed-8m"]
    assert sha256_nbd(srv.uri, virt) == SHA["tap-fixed-8m.raw"]
    assert sha256_file(m.file) == SHA["tap-fixed-8m.raw"]
    assert sha256_nbd(srv.uri) == hashlib.sha256(
        fixture("tap-fixed-8m.raw", shm).read_bytes() +
        bytes(EXPORT - virt)).hexdigest()
    assert not vhd_errors(m), m.stderr


def test_vhd_larger_than_export_refused_before_bat(server, mount, shm):
    """A VHD whose disk exceeds the export is refused at its first sector:
    a 2 TiB dynamic VHD claiming an 8M-entry BAT costs no memory."""
    srv = server("memory", f"size={EXPORT}")
    fill_random(srv.uri, EXPORT)
    before = sha256_nbd(srv.uri)
    m = mount(srv, expect_errors=True)
    vhd = shm / "huge.vhd"
    qemu_img("create", "-f", "vpc", "-o", "force_size=on", vhd, "2000G")
    r = copy_into("cp", vhd, m.mp / "nbd.vhd")
    assert r.returncode != 0 and "No space left" in r.stderr, r.stderr
    assert sha256_nbd(srv.uri) == before
    errs = vhd_errors(m)
    assert len(errs) == 1 and "larger than the export" in errs[0], m.stderr
    # At its first sector: the write of the footer copy itself fails,
    # before the BAT (4 MiB in the file, 1M entries) is read or held.
    fd = os.open(m.mp / "nbd.vhd", os.O_WRONLY | os.O_TRUNC)
    try:
        assert oserror_errno(os.write, fd, vhd.read_bytes()[:512]) == \
            errno.ENOSPC, "the first sector of a VHD too large was taken"
    finally:
        oserror_errno(os.close, fd)       # close reports it again
    assert sha256_nbd(srv.uri) == before
