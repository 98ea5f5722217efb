"""A reader of a format view gets the disk as it was at its open, or an
error: never a mix of before and after.

A read-only open of nbd.qcow2, nbd.vhdx, nbd.vhd or nbd.vmdk freezes the
disk's allocation, not its bytes.  For each of the four views: a disk of
data and holes; the view is opened and read in part; the raw file is
written into a hole that was a hole at the open and into data not read
yet; the rest is read.  Whoever reads (a Python reader, and cp and dd
through a pipe that the test drains slowly, so the write comes while
they are mid-file) either gets the whole image and it decodes (qemu-img
convert -O raw) to the disk at the open (sha256), or fails with EIO (cp
and dd exit non-zero), with the reason in the log.  A view read while
nothing writes still decodes to the disk; a view opened after the
change reads the new disk.  Landing an image while a view is read fails
the reader the same way.

Run: /usr/bin/python3 -m pytest tests/test_view_snapshot.py
"""

import errno
import hashlib
import os
import shutil
import subprocess

import pytest

from lib.env import MiB, timeout
from lib.images import random_bytes
from lib.procs import run

if not shutil.which("qemu-img"):
    raise RuntimeError("qemu-img missing (scripts/install-deps)")

DISK = 32 * MiB
# name: qemu-img's format name
VIEWS = {"qcow2": "qcow2", "vhdx": "vhdx", "vhd": "vpc", "vmdk": "vmdk"}
DATA = ((0, 3 * MiB), (12 * MiB, 4 * MiB), (20 * MiB, 6 * MiB))
HOLE_AT = 8 * MiB + 4096              # a hole at the open
DATA_AT = 24 * MiB + 12345            # data near the end (not read yet)


def make_disk(m):
    """Data and holes through the raw file; returns the disk's bytes."""
    disk = bytearray(DISK)
    fd = os.open(m.file, os.O_WRONLY)
    try:
        for off, n in DATA:
            b = random_bytes(n)
            disk[off:off + n] = b
            os.pwrite(fd, b, off)
        os.fsync(fd)
    finally:
        os.close(fd)
    return bytes(disk)


def change_disk(m):
    """Write the raw file: into the hole and into the data."""
    fd = os.open(m.file, os.O_WRONLY)
    try:
        os.pwrite(fd, b"\x5a" * 70000, HOLE_AT)
        os.pwrite(fd, b"\xa5" * 70000, DATA_AT)
        os.fsync(fd)
    finally:
        os.close(fd)


def decoded_sha(tmp_path, fmt, image):
    img = tmp_path / "out.img"
    img.write_bytes(image)
    raw = tmp_path / "out.raw"
    r = run(["qemu-img", "convert", "-f", fmt, "-O", "raw", img, raw],
            timeout=120)
    assert r.returncode == 0, r.stderr
    data = raw.read_bytes()
    assert len(data) == DISK, len(data)
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def disk(server, mount):
    srv = server("memory", f"size={DISK}")
    m = mount(srv, expect_errors=True)
    return m, make_disk(m)


@pytest.mark.parametrize("view", VIEWS)
def test_view_read_is_the_disk_at_open_or_fails(disk, tmp_path, view):
    """Python reader: part, then the raw file written, then the rest."""
    m, before = disk
    path = m.mp / f"nbd.{view}"
    size = os.stat(path).st_size
    got = bytearray()
    err = None
    with open(path, "rb", buffering=0) as f:
        while len(got) < size // 3:
            got += f.read(256 * 1024)
        change_disk(m)
        try:
            while True:
                b = f.read(256 * 1024)
                if not b:
                    break
                got += b
        except OSError as e:
            err = e
    if err is not None:
        assert err.errno == errno.EIO, err
        assert f"nbd.{view}: the disk changed while pid" in m.stderr, \
            m.stderr[-2000:]
        return
    # A whole image: it must be the disk at the open.
    assert decoded_sha(tmp_path, VIEWS[view], bytes(got)) == \
        hashlib.sha256(before).hexdigest(), \
        f"nbd.{view} read across a change of the disk is a mix"


def piped_copy(cmd, m, tmp_path):
    """Run cmd (its output a pipe), take 2 MiB of it, change the disk
    while it is blocked on the full pipe, then take the rest.  Returns
    (returncode, stderr, bytes)."""
    errf = tmp_path / "copy.err"
    with open(errf, "wb") as err:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err)
    try:
        got = bytearray()
        while len(got) < 2 * MiB:
            b = p.stdout.read(64 * 1024)
            assert b, "the copy ended before 2 MiB"
            got += b
        change_disk(m)
        got += p.stdout.read()
        rc = p.wait(timeout(60))
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return rc, errf.read_text(), bytes(got)


@pytest.mark.parametrize("tool", ["cp", "dd"])
@pytest.mark.parametrize("view", VIEWS)
def test_view_copy_across_a_change_fails(disk, tmp_path, view, tool):
    """cp and dd reading the view while the raw file is written exit
    non-zero (Input/output error), or their image is the disk at the
    open."""
    m, before = disk
    src = str(m.mp / f"nbd.{view}")
    cmd = (["cp", src, "/dev/stdout"] if tool == "cp"
           else ["dd", f"if={src}", "bs=64K", "status=none"])
    rc, err, got = piped_copy(cmd, m, tmp_path)
    if rc != 0:
        assert "Input/output error" in err, err
        return
    assert decoded_sha(tmp_path, VIEWS[view], got) == \
        hashlib.sha256(before).hexdigest(), \
        f"{tool} of nbd.{view} across a change of the disk is a mix"


@pytest.mark.parametrize("view", VIEWS)
def test_view_read_without_change_is_the_disk(disk, tmp_path, view):
    """No write meanwhile: cp of the view decodes to the disk; after a
    change, a new copy decodes to the new disk."""
    m, before = disk
    out = tmp_path / f"a.{view}"
    r = run(["cp", m.mp / f"nbd.{view}", out], timeout=120)
    assert r.returncode == 0, r.stderr
    assert decoded_sha(tmp_path, VIEWS[view], out.read_bytes()) == \
        hashlib.sha256(before).hexdigest()
    change_disk(m)
    after = bytearray(before)
    after[HOLE_AT:HOLE_AT + 70000] = b"\x5a" * 70000
    after[DATA_AT:DATA_AT + 70000] = b"\xa5" * 70000
    r = run(["cp", m.mp / f"nbd.{view}", out], timeout=120)
    assert r.returncode == 0, r.stderr
    assert decoded_sha(tmp_path, VIEWS[view], out.read_bytes()) == \
        hashlib.sha256(after).hexdigest()
    assert "the disk changed while" not in m.stderr


def test_view_read_across_a_landing(disk, tmp_path):
    """A qcow2 landed through nbd.qcow2 while nbd.vhd is read: the
    reader fails with EIO or has the disk at its open; the landing is
    byte-exact (sha256 from the raw file)."""
    m, before = disk
    src = tmp_path / "src.raw"
    new = random_bytes(5 * MiB)
    with open(src, "wb") as f:
        f.truncate(DISK)
        f.seek(9 * MiB)
        f.write(new)
    img = tmp_path / "src.qcow2"
    r = run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", src, img],
            timeout=120)
    assert r.returncode == 0, r.stderr
    path = m.mp / "nbd.vhd"
    size = os.stat(path).st_size
    got, err = bytearray(), None
    with open(path, "rb", buffering=0) as f:
        while len(got) < size // 3:
            got += f.read(256 * 1024)
        r = run(["cp", img, m.mp / "nbd.qcow2"], timeout=120)
        assert r.returncode == 0, r.stderr
        try:
            while b := f.read(256 * 1024):
                got += b
        except OSError as e:
            err = e
    assert hashlib.sha256(m.file.read_bytes()).hexdigest() == \
        hashlib.sha256(src.read_bytes()).hexdigest()
    if err is not None:
        assert err.errno == errno.EIO, err
        return
    assert decoded_sha(tmp_path, "vpc", bytes(got)) == \
        hashlib.sha256(before).hexdigest(), "nbd.vhd across a landing"
