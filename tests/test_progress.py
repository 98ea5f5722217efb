"""--progress: counted in acknowledged bytes, 100% only after the last reply.

--progress=FD writes "N/100" lines like nbdcopy; the test reads them with
timestamps.  With the server paused, a writer that has handed every byte to
the daemon sees no progress at all (nothing is acknowledged), its close()
blocks, and no 100% line appears until the server resumes; the 100% line
arrives only after the resume.  Sparse copies reach 100% too (holes count
once the copy passes them and their zeroing is acknowledged).  Every case
checks the bytes that landed."""

import json
import os
import re
import subprocess
import threading
import time

import pytest

from lib.content import assert_content
from lib.env import HAVE_FUSE, HAVE_NBDKIT, MiB, TOP, daemon_cmd, timeout
from lib.images import make_sparse_image, random_bytes, random_file
from lib.nbd import fill_random
from lib.procs import run
from lib.servers import PauseControl

pytestmark = pytest.mark.skipif(not (HAVE_FUSE and HAVE_NBDKIT),
                                reason="needs /dev/fuse and nbdkit")

EXPORT = 64 * MiB
LINE = re.compile(r"^(\d+)/100$")


class Lines:
    """Reads "N/100" lines from a pipe in a thread, with arrival times."""

    def __init__(self, rfd):
        self.f = os.fdopen(rfd, "r")
        self.got = []                   # (monotonic time, percent)
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        for line in self.f:
            mo = LINE.match(line.strip())
            assert mo, f"bad progress line {line!r}"
            self.got.append((time.monotonic(), int(mo.group(1))))

    def percents(self):
        return [p for _, p in self.got]

    def first_time(self, pct):
        return next((t for t, p in self.got if p >= pct), None)

    def wait_for(self, pct, secs):
        deadline = time.monotonic() + timeout(secs)
        while self.first_time(pct) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.first_time(pct)

    def join(self):
        self.t.join(timeout(10))
        assert not self.t.is_alive(), "progress fd not closed at exit"


def progress_mount(mount, target, *opts):
    r, w = os.pipe()
    try:
        m = mount(target, f"--progress={w}", *opts, pass_fds=(w,))
    finally:
        os.close(w)
    return m, Lines(r)


def status(m):
    return json.loads((m.mp / ".nbdferry-status").read_bytes())


def assert_monotonic(ps):
    assert ps == sorted(ps), f"progress went backwards: {ps}"


def test_progress_100_only_after_last_reply(server, mount, shm, shortdir):
    size = 16 * MiB
    ctl = shortdir / "pause.ctl"
    disk = shm / "disk.img"
    with open(disk, "wb") as f:
        f.truncate(EXPORT)
    srv = server("file", disk, f"pause-control={ctl}", filters=["pause"])
    m, lines = progress_mount(mount, srv, "--expected-size", str(size))
    pause = PauseControl(ctl)
    data = random_bytes(size)
    box = {}

    pause.pause()
    resumed = None
    try:
        fd = os.open(m.file, os.O_WRONLY | os.O_TRUNC)
        for i in range(0, size, MiB):          # the pool takes it all
            assert os.pwrite(fd, data[i:i + MiB], i) == MiB

        def closer():
            os.close(fd)
            box["closed"] = time.monotonic()
        t = threading.Thread(target=closer, daemon=True)
        t.start()
        time.sleep(timeout(1.5))
        assert "closed" not in box, "close() returned with the server paused"
        # Everything was issued, nothing acknowledged: no progress shown.
        assert lines.percents() and max(lines.percents()) == 0, lines.got
        st = status(m)
        assert st["bytes_written"] == size and st["bytes_acknowledged"] == 0
        assert st["progress"]["done"] == 0 and not st["progress"]["settled"]
        resumed = time.monotonic()
        pause.resume()
        t.join(timeout(60))
    finally:
        if resumed is None:
            pause.resume()
    assert "closed" in box, "close() did not return after resume"
    t100 = lines.wait_for(100, 10)
    assert t100 is not None, f"no 100% line: {lines.got}"
    assert t100 > resumed, "100% reported while the server was paused"
    assert_monotonic(lines.percents())
    assert status(m)["progress"]["settled"]
    assert_content(data, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=size, what="paused copy")
    m.unmount()
    lines.join()
    assert lines.percents()[-1] == 100


BAR = re.compile(r"^\[ *[\d.]+%\] \[[#.]+\] .* (\S+ \S+)/s  (ETA \S+)")


def last_bar(m):
    """(rate, ETA) of the last --progress bar drawn on stderr."""
    bars = [BAR.match(seg.strip("\n"))
            for seg in m.stderr_path.read_bytes().decode().split("\r")]
    bars = [b for b in bars if b]
    assert bars, "no progress bar on stderr"
    return bars[-1].group(1), bars[-1].group(2)


def test_progress_rates_count_acknowledged_bytes(server, mount, shm, shortdir):
    """The throughput counts what the server acknowledged, never what the
    pool took: with the server paused after the pool accepted 8 MiB, every
    figure (the status's last 1/5/10 s and average, the bar's rate) is 0 and
    there is no ETA.  Once it runs, the average is the acknowledged bytes
    over the uptime and the 10 s window holds them all."""
    size = 8 * MiB
    ctl = shortdir / "pause.ctl"
    disk = shm / "disk.img"
    with open(disk, "wb") as f:
        f.truncate(EXPORT)
    srv = server("file", disk, f"pause-control={ctl}", filters=["pause"])
    m = mount(srv, "--progress", "--expected-size", str(size))
    data = random_bytes(size)
    pause = PauseControl(ctl)
    pause.pause()
    fd = os.open(m.file, os.O_WRONLY)
    try:
        for i in range(0, size, MiB):          # the pool takes it all
            assert os.pwrite(fd, data[i:i + MiB], i) == MiB
        time.sleep(timeout(1.5))               # samples every 250 ms
        st = status(m)
        assert st["bytes_written"] == size, st
        assert st["bytes_acknowledged"] == 0, st
        assert st["throughput"] == {"last_1s": 0, "last_5s": 0,
                                    "last_10s": 0, "average": 0}, \
            f"throughput with nothing acknowledged: {st['throughput']}"
        assert st["progress"]["done"] == 0, st["progress"]
        assert st["progress"]["eta_s"] < 0, \
            f"an ETA with nothing acknowledged: {st['progress']}"
        assert last_bar(m) == ("0 B", "ETA --:--"), last_bar(m)
    finally:
        pause.resume()
        os.close(fd)                           # drains: all acknowledged
    deadline = time.monotonic() + timeout(5)   # the next samples see it
    st = status(m)
    while st["throughput"]["last_10s"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
        st = status(m)
    assert st["bytes_acknowledged"] == size, st
    thr, up = st["throughput"], st["uptime_s"]
    assert abs(thr["average"] - size / up) <= 1 + size / up * 1e-3, (thr, up)
    # Every acknowledged byte arrived after a sample that saw none, within
    # the last 10 s: the window's rate covers them all.
    assert thr["last_10s"] * 10.5 >= size, thr
    if up < 9:                                 # the window reaches the start
        assert thr["last_10s"] >= thr["average"] * 0.99, (thr, up)
    assert_content(data, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=EXPORT, what="paused then resumed copy")


def test_progress_slow_copy_lines(server, mount, shm):
    """A copy against a slow server: lines climb, the last is 100, and no
    100 line arrives before the writer calls close()."""
    srv = server("memory", f"size={EXPORT}", "wdelay=60ms", filters=["delay"])
    m, lines = progress_mount(mount, srv, "-C", "1", "--depth", "1",
                              "--pool-size", "4M", "--request-size", "1M")
    data = random_bytes(20 * MiB)
    with open(m.file, "wb", buffering=0) as f:
        f.truncate(len(data))                   # like qemu-img: size first
        for i in range(0, len(data), MiB):
            f.write(data[i:i + MiB])
        t_close = time.monotonic()
    t100 = lines.wait_for(100, 10)
    assert t100 is not None and t100 >= t_close, lines.got
    ps = lines.percents()
    assert_monotonic(ps)
    assert len(set(ps)) >= 4, f"too few steps for a slow copy: {ps}"
    st = status(m)
    assert st["progress"]["total_from"] in ("truncate", "close")
    assert st["progress"]["done"] == st["progress"]["total"] == len(data)
    assert_content(data, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=len(data), what="slow copy")
    m.unmount()
    lines.join()
    assert ps[-1] == 100


def test_progress_sparse_copy_reaches_100(server, mount, shm):
    """cp --sparse=always never writes the holes; they count once passed
    (and zeroed: the export is full of old data)."""
    srv = server("memory", f"size={EXPORT}", "wdelay=10ms", filters=["delay"])
    fill_random(srv.uri, EXPORT)
    m, lines = progress_mount(mount, srv)
    img = make_sparse_image(shm / "src.img", 40 * MiB + 777, runs=6, seed=5)
    run(["cp", "--sparse=always", img.path, m.file], check=True)
    assert lines.wait_for(100, 10) is not None, lines.got
    p = status(m)["progress"]
    assert p["settled"] and p["done"] == p["total"] == img.size, p
    assert p["total_from"] == "source"          # cp's input file
    assert_monotonic(lines.percents())
    assert_content(img.path, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=img.size, what="sparse cp")
    m.unmount()
    lines.join()


def test_progress_bar_on_stderr(server, mount, shm):
    srv = server("memory", f"size={EXPORT}", "wdelay=5ms", filters=["delay"])
    m = mount(srv, "--progress")
    src = random_file(shm / "src.img", 12 * MiB)
    run(["dd", f"if={src}", f"of={m.file}", "bs=1M", "status=none"],
        check=True)
    assert_content(src, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=12 * MiB)
    m.unmount()
    err = m.stderr_path.read_bytes().decode()   # keep the \r
    assert "\r[" in err, err
    last = err.rstrip("\n").split("\r")[-1]
    assert last.startswith("[100.0%]") and "12.0 MiB / 12.0 MiB" in last, last


def test_progress_bar_needs_foreground(server, shortdir):
    srv = server("memory", f"size={EXPORT}")
    mp = shortdir / "mnt"
    mp.mkdir()
    cmd = [c for c in daemon_cmd("--progress", mp, srv.uri)]
    r = run(cmd)
    assert r.returncode == 1 and "--progress=FD" in r.stderr, r.stderr


def sample_during(m, proc, secs=120):
    """Status progress samples taken while proc runs (every 20 ms)."""
    got = []
    deadline = time.monotonic() + timeout(secs)
    while proc.poll() is None and time.monotonic() < deadline:
        st = status(m)
        if st["bytes_written"] > 0:
            got.append((st["bytes_written"], st["progress"]))
        time.sleep(0.02)
    return got


def test_progress_total_is_the_source_during_cp(server, mount, shm):
    """cp of a 512 MiB file onto a 1 GiB export: while it runs, the total
    is the source's size (found in cp's open files), not the export's."""
    export, size = 1024 * MiB, 512 * MiB
    srv = server("memory", f"size={export}", "wdelay=20ms", filters=["delay"])
    m = mount(srv, "-C", "1", "--depth", "2")
    src = random_file(shm / "src.img", size)
    cp = subprocess.Popen(["cp", src, m.file], stderr=subprocess.PIPE)
    got = sample_during(m, cp)
    assert cp.wait(timeout(120)) == 0, cp.stderr.read()
    assert len(got) >= 3, f"too few samples during the copy: {got}"
    for written, p in got:
        assert p["total"] == size and p["total_from"] == "source", p
        assert p["done"] <= written, p
        # A sample can land after cp's last write was acknowledged but
        # before cp exits: 100% then, and only then.
        assert p["percent"] < 100 or p["done"] == written == size, p
    st = status(m)
    assert st["progress"]["total"] == size
    assert_content(src, export, mount_file=m.file, uri=srv.uri,
                   mount_size=size, what="cp 512 MiB")


def test_progress_unrelated_open_file_is_not_the_total(server, mount, shm):
    """A writer that happens to hold a small file open read-only (a log, a
    config) while it writes something else: once it writes past that
    file's size, the guess is dropped, so the copy never shows 100% (or a
    settled total) before it is done."""
    srv = server("memory", f"size={EXPORT}", "wdelay=20ms", filters=["delay"])
    m = mount(srv, "-C", "1", "--depth", "1")
    decoy = random_file(shm / "decoy.cfg", 3 * MiB)
    src = random_file(shm / "src.img", 24 * MiB)
    # The writer opens the decoy before the mount's file; it writes data
    # from a pipe, so the decoy is the only regular file it reads.
    sh = subprocess.Popen(["sh", "-c", f"exec 3<'{decoy}'; cat '{src}' | "
                           f"dd of='{m.file}' bs=1M iflag=fullblock "
                           "status=none"])
    got = sample_during(m, sh)
    assert sh.wait(timeout(120)) == 0
    assert got, "no sample during the copy"
    for written, p in got:
        # 100% only once dd has written (and closed) the whole 24 MiB: a
        # sample can land between dd's close and the shell's exit.
        assert p["percent"] < 100 or (
            written == p["done"] == p["total"] == 24 * MiB
            and p["total_from"] == "close"), (written, p)
        if written > 3 * MiB:
            assert p["total_from"] != "source", (written, p)
    assert_content(src, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=24 * MiB, what="dd from a pipe")


def test_progress_total_from_a_pipe_is_the_export(server, mount, shm):
    """dd reading a pipe: no source to see, so the total is the export and
    nbdferry-status says the ETA is an upper bound."""
    srv = server("memory", f"size={EXPORT}", "wdelay=20ms", filters=["delay"])
    m = mount(srv, "-C", "1", "--depth", "1")
    src = random_file(shm / "src.img", 24 * MiB)
    sh = subprocess.Popen(["sh", "-c", f"cat '{src}' | dd of='{m.file}' "
                           "bs=1M iflag=fullblock status=none"])
    got = sample_during(m, sh)
    assert sh.wait(timeout(120)) == 0
    assert got, "no sample during the copy"
    for written, p in got:
        # A sample may land between dd's close and the shell's exit.
        assert (p["total_from"] == "export-size" and p["total"] == EXPORT) or (
            p["total_from"] == "close" and written == p["total"] == 24 * MiB), p
    assert status(m)["progress"]["total_from"] == "close"
    tool = TOP / "tools" / "status" / "nbdferry-status"
    sh = subprocess.Popen(["sh", "-c", f"cat '{src}' | dd of='{m.file}' "
                           "bs=1M iflag=fullblock status=none"])
    try:
        deadline = time.monotonic() + timeout(60)
        out = ""
        while sh.poll() is None and time.monotonic() < deadline:
            out = run(["/usr/bin/python3", tool, m.mp], check=True).stdout
            if "whole export" in out:
                break
            time.sleep(0.05)
    finally:
        assert sh.wait(timeout(120)) == 0
    assert "whole export" in out and "upper bound" in out, out
    assert_content(src, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=24 * MiB, what="dd from a pipe")


def test_progress_total_of_a_vhd_landing(server, mount, shm):
    """Writing a dynamic VHD into nbd.vhd: the total is the VHD file's
    length (from its metadata), the frontier its bytes."""
    from lib.vhd import SHA, VIRTUAL, fixture
    from lib.nbd import sha256_nbd
    srv = server("memory", f"size={EXPORT}")
    m = mount(srv)
    vhd = fixture("qemu-dyn-10m.vhd", shm)
    # through a pipe, so that only the VHD's metadata can say the length
    run(["sh", "-c", f"cat '{vhd}' | dd of='{m.mp}/nbd.vhd' bs=64K "
         "iflag=fullblock status=none"], check=True)
    p = status(m)["progress"]
    assert p["total_from"] == "vhd", p
    assert p["total"] == p["done"] == os.path.getsize(vhd), p
    assert sha256_nbd(srv.uri, VIRTUAL["qemu-dyn-10m"]) == \
        SHA["qemu-dyn-10m.raw"]


def test_progress_thin_disk_counts_the_data_to_come(server, mount, shm):
    """A 64 MiB image whose 12 MiB of data lie in its second half, copied
    with cp (which skips the holes) onto a server taking 200 ms a write,
    one 1 MiB write at a time: once the data begin to arrive, the status
    counts the data still to come (the holes before them are no progress),
    so the percent stays low and the ETA is not ~0.  After an earlier
    copy, `written` is this copy's, the top-level bytes_written the
    mount's."""
    data_off, data_len, size = 44 * MiB, 12 * MiB, 64 * MiB
    src = shm / "thin.img"
    with open(src, "wb") as f:
        f.truncate(size)
        f.seek(data_off)
        f.write(random_bytes(data_len))
    srv = server("memory", f"size={2 * size}", "wdelay=200ms",
                 filters=["delay"])
    m = mount(srv, "-C", "1", "--depth", "1", "--request-size", "1M",
              "--pool-size", "2M")
    small = random_file(shm / "small.img", MiB)     # an earlier copy
    run(["cp", str(small), str(m.file)], check=True)
    cp = subprocess.Popen(["cp", str(src), str(m.file)])
    try:
        deadline = time.monotonic() + timeout(60)
        while True:
            p = status(m)["progress"]
            if (p.get("data_total") == data_len and p["data_done"] >= MiB
                    or cp.poll() is not None):
                break
            assert time.monotonic() < deadline, p
            time.sleep(0.02)
        assert cp.poll() is None, "cp ended before the check"
        assert p["counts"] == "data" and p["data_total"] == data_len, p
        assert p["remaining"] >= data_len // 2, p
        assert p["percent"] < 50, p
        # The data arrive at 5 MiB/s at most (1 MiB per 200 ms): an
        # honest ETA is at least what is left at four times that rate.
        assert p["eta_s"] < 0 or p["eta_s"] >= p["remaining"] / (20 * MiB), p
    finally:
        assert cp.wait(timeout(120)) == 0
    st = status(m)
    p = st["progress"]
    assert p["settled"] and p["percent"] == 100, p
    assert p["data_done"] == p["data_total"] == data_len, p
    assert p["done"] == p["total"] == size and p["remaining"] == 0, p
    assert p["written"] == data_len, p         # this copy's
    assert st["bytes_written"] == data_len + MiB, st   # the mount's
    assert_content(src, 2 * size, mount_file=m.file, uri=srv.uri,
                   mount_size=size, what="thin cp")
