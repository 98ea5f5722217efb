"""The raw file's times: rsync's quick check tells the truth.

- A fresh mount shows the raw file, and every view of its disk, with mtime
  0 (the epoch), never the mount's start: a source changed in the same
  second as the mount would share that time, and rsync -a's quick check
  (size and mtime) would skip it.  The root directory shows the mount's
  start.
- rsync -a --inplace --no-whole-file, with and without -I: the first pass
  lands and leaves the source's mtime on the raw file; the source then
  changes (same size) and takes the start second of a new mount as its
  mtime (os.utime: deterministic, no race): the pass on the new mount
  transfers the change.
- The time is kept in the manifest (warm migration): a new mount shows
  what the last one ended with (rsync -a's, or the last write's), so the
  quick check skips an unchanged source on a new mount too; a manifest
  distrusted at mount (another writer) keeps no time: 0 again.
- cp -p, touch -d and touch set the time (utimensat: explicit, UTIME_NOW,
  UTIME_OMIT), shown to the nanosecond by the raw file and its views;
  touching a view sets the disk's time; a write after a set time moves the
  mtime to the write's time.
- The views' synthesizer caches key on the disk's changes, never on its
  time: a view read, the disk changed, its time set back by hand to what
  it was: the view shows the change (a write; a truncate that only grows
  the file, which no pool counter sees).

Every test that writes checks the bytes on the server against the source.

Run: /usr/bin/python3 -m pytest tests/test_mtime.py
"""

import os
import random
import shutil
import time

import pytest

from lib.content import assert_content
from lib.copytools import describe, log_mark, traffic
from lib.env import MiB
from lib.images import random_bytes, random_file
from lib.nbd import write_nbd
from lib.procs import run
from lib.vhd import VhdFile, apply_vhd

for tool in ("rsync", "cp", "touch"):
    if not shutil.which(tool):
        raise RuntimeError(f"{tool} missing (scripts/install-deps)")

EXPORT = 16 * MiB
SET_NS = 1234567890 * 10**9 + 123456789     # 2009-02-13, odd nanoseconds


def mtime_ns(p):
    return os.stat(p).st_mtime_ns


def views(m):
    return [m.mp / n for n in ("nbd.vhd", "nbd.vmdk", "nbd.vhdx",
                               "nbd.qcow2") if (m.mp / n).exists()]


def assert_times(m, want_ns, what):
    """The raw file and every view of its disk show mtime want_ns."""
    got = {p.name: mtime_ns(p) for p in [m.file] + views(m)}
    assert len(got) > 1, f"no views in {m.mp}"
    assert set(got.values()) == {want_ns}, f"{what}: mtimes {got}, " \
        f"expected {want_ns}"


# ---------------------------------------------------------------- a fresh mount

def test_mtime_fresh_mount_is_epoch(server, mount):
    """Before anything sets it, the disk's time is 0 (the epoch) on every
    file of the disk; the directory shows the mount's start."""
    srv = server("memory", f"size={EXPORT}")
    before = time.time_ns()
    m = mount(srv)
    after = time.time_ns()
    assert_times(m, 0, "fresh mount")
    st = os.stat(m.file)
    assert st.st_atime_ns == 0, st
    assert st.st_ctime_ns >= st.st_mtime_ns, st
    root = os.stat(m.mp).st_mtime_ns
    assert before - 10**9 <= root <= after, (before, root, after)


# ---------------------------------------------------------------- rsync

def test_rsync_source_in_fresh_mount_second_transfers(server, mount, shm):
    """A fresh mount (no manifest: nothing known of the disk's time) and a
    source of the export's size last changed in the mount's start second:
    rsync -a --inplace's quick check (size and whole-second mtime) must
    not take the disk for the source; the source lands.  A mount that
    showed its start as the disk's mtime would make rsync skip it, exit 0
    over a disk that is not the source (mutant
    fresh-mount-mtime-is-start)."""
    srv = server("memory", f"size={EXPORT}")
    src = random_file(shm / "src.img", EXPORT)      # the export's size
    m = mount(srv)
    start = os.stat(m.mp).st_mtime_ns               # the mount's start
    os.utime(src, ns=(start, start))
    r = run(["rsync", "-a", "--inplace", str(src), str(m.file)])
    assert r.returncode == 0, f"rsync exited {r.returncode}: {r.stderr}"
    assert_content(src, EXPORT, mount_file=m.file, uri=srv.uri,
                   what="a fresh mount, source changed in its second")
    m.unmount()


@pytest.mark.parametrize("ignore_times", [False, True], ids=["quick", "I"])
def test_rsync_change_in_mount_second_transfers(server, mount, shm,
                                                ignore_times):
    """rsync -a --inplace --no-whole-file [-I]: the first pass lands and
    sets the time; a source changed (same size) with a new mount's start
    second as its mtime is transferred by the pass on that mount."""
    srv = server("memory", f"size={EXPORT}", log=True)
    src = random_file(shm / "src.img", EXPORT)      # the export's size
    # Last changed a minute ago: the new mount shows this time (kept in
    # the manifest), and the change below lands in another second (a
    # change in the same second as the last one is one rsync's quick
    # check, which compares whole seconds, misses on any destination).
    old = time.time_ns() - 60 * 10**9
    os.utime(src, ns=(old, old))
    cmd = ["rsync", "-a", "--inplace", "--no-whole-file"] + \
        (["-I"] if ignore_times else []) + [src]
    m = mount(srv)
    r = run(cmd + [m.file])
    assert r.returncode == 0, f"rsync exited {r.returncode}: {r.stderr}"
    assert_content(src, EXPORT, mount_file=m.file, uri=srv.uri,
                   what="first pass")
    assert mtime_ns(m.file) == mtime_ns(src), "rsync -a's time not kept"
    m.unmount()

    rng = random.Random(45)
    with open(src, "r+b") as f:
        f.seek(5 * MiB + 123)
        f.write(rng.randbytes(MiB))
    m2 = mount(srv)
    start = os.stat(m2.mp).st_mtime_ns     # the new mount's start
    os.utime(src, ns=(start, start))
    mark = log_mark(srv)
    r = run(cmd + [m2.file])
    assert r.returncode == 0, f"rsync exited {r.returncode}: {r.stderr}"
    assert_content(src, EXPORT, mount_file=m2.file, uri=srv.uri,
                   what="pass on a new mount, source changed in its second")
    assert mtime_ns(m2.file) == start
    m2.unmount()
    tr = traffic(srv, mark)
    # The delta: about the changed MiB is written, not the disk.
    assert MiB <= tr.bytes["Write"] <= 2 * MiB, describe(tr)


def test_rsync_unchanged_source_skipped_once_time_set(server, mount, shm):
    """Once rsync -a set the time, a second pass over an unchanged source
    is skipped by the quick check (nothing read back, nothing written);
    the disk is still the source."""
    srv = server("memory", f"size={EXPORT}", log=True)
    src = random_file(shm / "src.img", EXPORT)
    cmd = ["rsync", "-a", "--inplace", "--no-whole-file", src]
    m = mount(srv)
    r = run(cmd + [m.file])
    assert r.returncode == 0, f"rsync exited {r.returncode}: {r.stderr}"
    mark = log_mark(srv)
    r = run(cmd + [m.file])
    assert r.returncode == 0, f"rsync exited {r.returncode}: {r.stderr}"
    tr = traffic(srv, mark)
    assert tr.bytes["Write"] == 0 and tr.bytes["Read"] < EXPORT // 2, \
        describe(tr)
    assert_content(src, EXPORT, mount_file=m.file, uri=srv.uri,
                   what="after the skipped pass")


def test_mtime_kept_across_mounts(server, mount, shm, state_dir):
    """The time rsync -a set is kept in the manifest: a new mount shows
    it, so the next pass over an unchanged source is skipped by the quick
    check on that mount too (nothing read back, nothing written).  The
    last write's time is kept the same way when nothing set one."""
    srv = server("memory", f"size={EXPORT}", log=True)
    src = random_file(shm / "src.img", EXPORT)
    cmd = ["rsync", "-a", "--inplace", "--no-whole-file", src]
    m = mount(srv)
    r = run(cmd + [m.file])
    assert r.returncode == 0, f"rsync exited {r.returncode}: {r.stderr}"
    m.unmount()
    m2 = mount(srv)
    assert status_manifest(m2)["trust"] == "trusted"
    assert_times(m2, mtime_ns(src), "a new mount after rsync -a")
    mark = log_mark(srv)
    r = run(cmd + [m2.file])
    assert r.returncode == 0, f"rsync exited {r.returncode}: {r.stderr}"
    tr = traffic(srv, mark)
    assert tr.bytes["Write"] == 0 and tr.bytes["Read"] < EXPORT // 2, \
        describe(tr)
    # A write (no time set after it): its time is what the next mount shows.
    with open(m2.file, "r+b") as f:
        f.write(b"x" * 4096)
    written_ns = mtime_ns(m2.file)
    assert written_ns > mtime_ns(src)
    m2.unmount()
    m3 = mount(srv)
    assert_times(m3, written_ns, "a new mount after a write")
    m3.unmount()


def test_mtime_not_kept_when_the_manifest_is_distrusted(server, mount, shm,
                                                        state_dir):
    """Another writer between the mounts (the trust check finds it): the
    stored time is as wrong as the blocks; the mount shows 0 again."""
    srv = server("memory", f"size={EXPORT}")
    src = shm / "src.img"
    with open(src, "wb") as f:        # data, then zeroes: a hole to spoil
        f.write(random_bytes(EXPORT // 2))
        f.truncate(EXPORT)
    m = mount(srv)
    r = run(["rsync", "-a", "--inplace", src, m.file])
    assert r.returncode == 0, r.stderr
    m.unmount()
    write_nbd(srv.uri, b"\xa5" * 65536, EXPORT - 4 * 65536)
    m2 = mount(srv, expect_errors=True)           # the distrust is warned
    assert status_manifest(m2)["trust"] == "distrusted", status_manifest(m2)
    assert_times(m2, 0, "a distrusted manifest")
    m2.unmount()


def status_manifest(m):
    import json
    return json.loads((m.mp / ".nbdferry-status").read_bytes())["manifest"]


# ---------------------------------------------------------------- cp -p, touch

def test_mtime_cp_p_and_touch_set_it(server, mount, shm):
    """cp -p keeps the source's time (to the nanosecond); touch -d sets
    one, on the raw file or on a view (the disk's time: every file shows
    it); touch sets now."""
    srv = server("memory", f"size={EXPORT}")
    src = random_file(shm / "src.img", 4 * MiB + 777)
    os.utime(src, ns=(SET_NS, SET_NS))
    m = mount(srv)
    r = run(["cp", "-p", src, m.file])
    assert r.returncode == 0, f"cp -p exited {r.returncode}: {r.stderr}"
    assert_content(src, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=4 * MiB + 777, what="cp -p")
    assert_times(m, SET_NS, "after cp -p")

    r = run(["touch", "-d", "@981173106.789", m.file])
    assert r.returncode == 0, r.stderr
    assert_times(m, 981173106789000000, "after touch -d")
    r = run(["touch", "-m", "-d", "@1000000000", m.mp / "nbd.vhd"])
    assert r.returncode == 0, r.stderr
    assert_times(m, 10**18, "after touch -d of nbd.vhd")
    # UTIME_OMIT: touch -a leaves the mtime, sets the access time.
    r = run(["touch", "-a", "-d", "@1100000000", m.file])
    assert r.returncode == 0, r.stderr
    st = os.stat(m.file)
    assert (st.st_mtime_ns, st.st_atime_ns) == (10**18, 11 * 10**17), st

    before = time.time_ns()
    r = run(["touch", m.file])
    after = time.time_ns()
    assert r.returncode == 0, r.stderr
    now = mtime_ns(m.file)
    assert before - 10**9 <= now <= after + 10**9, (before, now, after)
    assert_times(m, now, "after touch")
    assert_content(src, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=4 * MiB + 777, what="after the touches")


def test_mtime_write_after_touch_moves_forward(server, mount):
    """A write after a set time makes the mtime the write's time, as on a
    real file."""
    srv = server("memory", f"size={EXPORT}")
    m = mount(srv)
    os.utime(m.file, ns=(SET_NS, SET_NS))
    assert_times(m, SET_NS, "after utime")
    data = random_bytes(64 * 1024)
    before = time.time_ns()
    with open(m.file, "r+b") as f:
        f.seek(3 * MiB + 5)
        f.write(data)
    t = mtime_ns(m.file)
    assert t >= before - 10**9 and t != SET_NS, (before, t)
    assert_times(m, t, "after the write")
    expected = bytes(3 * MiB + 5) + data
    assert_content(expected, EXPORT, mount_file=m.file, uri=srv.uri,
                   what="after the write")


# ---------------------------------------------------------------- view caches

def read_vhd_disk(m, shm):
    """The disk nbd.vhd shows, decoded, and its size per the footer."""
    vhd = shm / "read.vhd"
    r = run(["cp", m.mp / "nbd.vhd", vhd])
    assert r.returncode == 0, r.stderr
    size = VhdFile(vhd.read_bytes()).size
    disk, _ = apply_vhd(vhd, bytearray(size))
    vhd.unlink()
    return bytes(disk), size


def test_view_shows_write_after_time_set_back(server, mount, shm):
    """nbd.vhd read; a write lands; the raw file's time set back by hand
    to what it was when the view was read: the view shows the write."""
    srv = server("memory", f"size={EXPORT}")
    m = mount(srv)
    t0 = mtime_ns(m.file)
    disk, size = read_vhd_disk(m, shm)
    assert size == EXPORT
    assert disk == bytes(EXPORT)
    data = random_bytes(100 * 1024)
    with open(m.file, "r+b") as f:
        f.seek(7 * MiB + 3)
        f.write(data)
    os.utime(m.file, ns=(t0, t0))
    assert mtime_ns(m.file) == t0
    expected = bytes(7 * MiB + 3) + data + bytes(EXPORT - 7 * MiB - 3
                                                 - len(data))
    disk, _ = read_vhd_disk(m, shm)
    assert disk == expected, "nbd.vhd shows the disk before the write"
    assert_content(expected, EXPORT, mount_file=m.file, uri=srv.uri,
                   what="after the write")


def test_view_shows_grown_size_after_time_set_back(server, mount, shm):
    """A truncate that only grows the raw file changes no byte and no pool
    counter, only the size and the time.  With the time set back by hand
    to what it was when nbd.vhd was read, the view still shows the new
    size."""
    srv = server("memory", f"size={EXPORT}")
    m = mount(srv)
    os.truncate(m.file, 4 * MiB)
    with open(m.file, "r+b") as f:     # settle: the cut bytes zeroed
        os.fsync(f.fileno())
    t1 = mtime_ns(m.file)
    disk, size = read_vhd_disk(m, shm)
    assert size == 4 * MiB and disk == bytes(size)
    os.truncate(m.file, 6 * MiB)
    os.utime(m.file, ns=(t1, t1))
    assert mtime_ns(m.file) == t1
    assert os.stat(m.file).st_size == 6 * MiB
    disk, size = read_vhd_disk(m, shm)
    assert size == 6 * MiB, f"nbd.vhd shows a disk of {size} bytes, " \
        f"the raw file {6 * MiB}: the disk before the truncate"
    assert disk == bytes(size)
    assert_content(b"", EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=6 * MiB, what="after the truncates")
