"""Mounting from fstab: mount -a -T FILE through mount.fuse3.

A line `PROG#URI MNT fuse3 OPTIONS 0 0` makes mount(8) run mount.fuse3,
which runs `PROG URI MNT -o OPTIONS`: the source first, the options last.
The daemon takes that order, forks, and its parent exits 0 once the mount
is ready, so `mount -a` returns with the disk mounted.

PROG is the nbdferry of a temporary `cmake --install` prefix, given by
absolute path: mount runs helpers without PATH (the helper's /bin/sh then
uses its default, so the `URI MNT fuse.nbdferry` form needs nbdferry in
/usr/local/bin or /usr/bin, which tests never install into).

The daemon detaches from mount, so it is no child of ours.  mount runs
under a small "reaper" (PR_SET_CHILD_SUBREAPER) that adopts the orphaned
daemon and records its exit status, so the tests can still assert that it
exits 0 after umount.  Needs root (mount -a), mount.fuse3 and /dev/fuse.
"""

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lib.content import assert_content
from lib.digest import sha256_bytes, sha256_file
from lib.env import BUILD, MiB, timeout
from lib.images import make_sparse_image, random_bytes
from lib.mounts import fusermount_u, is_mounted, mounted_paths
from lib.nbd import fill_random, sha256_nbd
from lib.procs import pid_alive, run, wait_for

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="mount -a needs root"),
    pytest.mark.skipif(not (shutil.which("mount.fuse3")
                            or os.path.exists("/sbin/mount.fuse3")),
                       reason="needs mount.fuse3 (fuse3 package)"),
    pytest.mark.skipif(not (BUILD / "CMakeCache.txt").exists(),
                       reason=f"needs a configured build tree at {BUILD}"),
]

EXPORT = 64 * MiB

# Runs argv (mount -a -T FILE) as a child subreaper: the daemon that
# mount's helper leaves behind is re-parented here, and its exit status
# is appended to the report file as "exit PID STATUS".
REAPER = r"""
import ctypes, os, subprocess, sys
report = open(sys.argv[1], "a", buffering=1)
if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:
    sys.exit("prctl(PR_SET_CHILD_SUBREAPER) failed")
rc = subprocess.call(sys.argv[2:])
report.write(f"mount {rc}\n")
while True:
    try:
        pid, st = os.wait()
    except ChildProcessError:
        break
    report.write(f"exit {pid} {os.waitstatus_to_exitcode(st)}\n")
report.write("done\n")
"""


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    """A temporary install prefix (cmake --install), never a system dir."""
    p = tmp_path_factory.mktemp("prefix")
    r = run(["cmake", "--install", BUILD, "--prefix", p], timeout=120)
    assert r.returncode == 0, f"cmake --install failed:\n{r.stderr}"
    return p


class FstabMount:
    """One `mount -a -T FILE` run under the reaper."""

    def __init__(self, fstab, mp, report, stderr, proc):
        self.fstab, self.mp, self.report = fstab, mp, report
        self.stderr_path, self.proc = stderr, proc

    def lines(self):
        try:
            return self.report.read_text().splitlines()
        except FileNotFoundError:
            return []

    def mount_rc(self):
        for line in self.lines():
            if line.startswith("mount "):
                return int(line.split()[1])
        return None

    def exits(self):
        return {int(l.split()[1]): int(l.split()[2])
                for l in self.lines() if l.startswith("exit ")}

    @property
    def stderr(self):
        return Path(self.stderr_path).read_text(errors="replace")

    def daemons(self):
        """Live processes the reaper adopted (the nbdferry daemon)."""
        r = subprocess.run(["pgrep", "-P", str(self.proc.pid)],
                           capture_output=True, text=True)
        return [int(p) for p in r.stdout.split()]

    def wait_done(self, secs=60):
        """Wait until the reaper has no child left; returns the exits."""
        try:
            self.proc.wait(timeout(secs))
        except subprocess.TimeoutExpired:
            pytest.fail(f"daemon still running {timeout(secs):.0f}s after "
                        f"umount: {self.daemons()}")
        return self.exits()


@pytest.fixture
def fstab_mount(shortdir, prefix):
    """Factory: fstab_mount(source, options, fstype="fuse3") writes a
    one-line fstab for mountpoint shortdir/mntN, runs `mount -a -T FILE`
    under the reaper and waits for mount's exit status.  Teardown always
    unmounts (lazily at last) and kills a daemon that does not exit."""
    started = []

    def do_mount(source, options, fstype="fuse3"):
        n = len(started)
        mp = shortdir / f"mnt{n}"
        mp.mkdir()
        fstab = shortdir / f"fstab{n}"
        fstab.write_text(f"# nbdferry test\n{source} {mp} {fstype} "
                         f"{options} 0 0\n")
        report = shortdir / f"reaper{n}.out"
        stderr = shortdir / f"mount{n}.err"
        with open(stderr, "wb") as errf:
            proc = subprocess.Popen(
                [sys.executable, "-c", REAPER, str(report),
                 "mount", "-a", "-T", str(fstab)],
                stdin=subprocess.DEVNULL, stdout=errf, stderr=errf)
        m = FstabMount(fstab, mp, report, stderr, proc)
        started.append(m)
        wait_for(lambda: m.mount_rc() is not None or proc.poll() is not None,
                 None, "mount -a", timeout=60)
        return m

    yield do_mount
    for m in started:
        if is_mounted(m.mp):
            subprocess.run(["umount", str(m.mp)], capture_output=True)
            fusermount_u(m.mp, wait=5)
        try:
            m.proc.wait(timeout(30))
        except subprocess.TimeoutExpired:
            for pid in m.daemons():
                os.kill(pid, 9)
            m.proc.kill()
            m.proc.wait(10)


def fstab_source(prefix, uri):
    return f"{prefix}/bin/nbdferry#{uri}"


def mount_entry(mp):
    with open("/proc/mounts") as f:
        for line in f:
            dev, where, fstype, opts = line.split()[:4]
            if where == str(mp):
                return dev, fstype, opts.split(",")
    return None


def assert_mounted_ok(m):
    assert m.mount_rc() == 0, f"mount -a exited {m.mount_rc()}:\n{m.stderr}"
    assert is_mounted(m.mp), f"mount -a returned 0 but {m.mp} is not mounted"
    daemons = m.daemons()
    assert len(daemons) == 1, f"expected one daemon, found {daemons}"
    with open(f"/proc/{daemons[0]}/cmdline", "rb") as f:
        argv = f.read().split(b"\0")
    assert argv[0].endswith(b"/bin/nbdferry") and \
        str(m.mp).encode() in argv, argv
    return daemons[0]


def umount_and_wait(m, pid):
    r = run(["umount", m.mp], timeout=120)
    assert r.returncode == 0, f"umount {m.mp}: {r.stderr}"
    assert not is_mounted(m.mp)
    exits = m.wait_done()
    assert not pid_alive(pid)
    assert exits.get(pid) == 0, f"daemon {pid} exit statuses {exits}"


def test_fstab_mount_cp_umount(server, fstab_mount, shm, prefix):
    """The documented fstab line: mount, cp, sha256, umount, daemon exits."""
    srv = server("memory", EXPORT)
    fill_random(srv.uri)                      # stale bytes must not survive
    img = make_sparse_image(shm / "disk.img", 40 * MiB, 12, seed=5)
    m = fstab_mount(fstab_source(prefix, srv.uri), "rw,noatime,_netdev")
    pid = assert_mounted_ok(m)
    dev, fstype, opts = mount_entry(m.mp)
    assert fstype == "fuse.nbdferry" and "noatime" in opts, (fstype, opts)
    assert os.path.getsize(m.mp / "nbd") == EXPORT

    r = run(["cp", "--sparse=always", img.path, m.mp / "nbd"], timeout=120)
    assert r.returncode == 0, r.stderr
    assert_content(img.path, EXPORT, mount_file=m.mp / "nbd", uri=srv.uri,
                   mount_size=img.size, what="cp through an fstab mount")

    umount_and_wait(m, pid)
    assert sha256_nbd(srv.uri) == sha256_file(img.path, pad_to=EXPORT), \
        "after umount the server does not hold the image"


def test_fstab_ro_option_reaches_fuse(server, fstab_mount, prefix):
    """`ro` in fstab makes a read-only FUSE mount: writes fail EROFS."""
    srv = server("memory", 16 * MiB)
    data = fill_random(srv.uri)
    m = fstab_mount(fstab_source(prefix, srv.uri), "ro,_netdev")
    pid = assert_mounted_ok(m)
    assert "ro" in mount_entry(m.mp)[2]

    with pytest.raises(OSError) as e:
        with open(m.mp / "nbd", "r+b") as f:
            f.write(b"x" * 4096)
    assert e.value.errno == errno.EROFS
    r = run(["dd", "if=/dev/zero", f"of={m.mp}/nbd", "bs=1M", "count=1",
             "conv=notrunc"])
    assert r.returncode != 0 and "Read-only file system" in r.stderr
    with pytest.raises(OSError) as e:
        os.truncate(m.mp / "nbd", 0)
    assert e.value.errno == errno.EROFS

    assert_content(data, len(data), mount_file=m.mp / "nbd", uri=srv.uri,
                   what="read-only fstab mount")
    umount_and_wait(m, pid)
    assert sha256_nbd(srv.uri) == sha256_bytes(data)


@pytest.mark.parametrize("case", ["unreachable-socket", "unknown-option"])
def test_fstab_bad_line_fails_and_mounts_nothing(server, fstab_mount, prefix,
                                                 shortdir, case):
    if case == "unreachable-socket":
        uri = f"nbd+unix:///?socket={shortdir}/nobody-listens.sock"
        m = fstab_mount(fstab_source(prefix, uri), "rw,_netdev")
        said = "cannot connect"
    else:
        srv = server("memory", 16 * MiB)
        m = fstab_mount(fstab_source(prefix, srv.uri), "rw,depth=16")
        said = "unknown option"
    assert m.mount_rc() not in (None, 0), m.stderr
    assert said in m.stderr, m.stderr
    assert not is_mounted(m.mp)
    assert str(m.mp) not in mounted_paths()
    # No daemon is left behind (its parent reaps a child that failed
    # before the mount was ready, so usually nothing reaches the reaper).
    exits = m.wait_done(30)
    assert all(rc != 0 for rc in exits.values()), exits


# --------------------------------------- mountpoint checks from fstab
# Mounting over a non-empty directory is hazardous: these run in a
# private mount namespace (tests/lib/privatens.py).

def fstab_script(fstab, mp):
    from shlex import quote as q
    return f"""
mount -T {q(str(fstab))} {q(str(mp))}
echo "rc=$?"
ls {q(str(mp))} | tr '\\n' ' ' | sed 's/^/ls=/'; echo
"""


@pytest.mark.parametrize("nonempty", [False, True],
                         ids=["refused", "nonempty-option"])
def test_fstab_nonempty_directory(server, prefix, shortdir, nonempty):
    """A non-empty mountpoint in fstab: refused with mount's 32 and the
    directory untouched; with `nonempty` in the options field, mounted,
    the bytes land, and the directory's file is back after umount."""
    from lib.privatens import run_private
    from shlex import quote as q
    srv = server("memory", EXPORT)
    mp = shortdir / "full"
    mp.mkdir()
    (mp / "a.txt").write_text("keep me\n")
    data = random_bytes(3 * MiB + 1)
    src = shortdir / "src"
    src.write_bytes(data)
    opts = "rw,nonempty,_netdev" if nonempty else "rw,_netdev"
    fstab = shortdir / "fstab"
    fstab.write_text(f"{fstab_source(prefix, srv.uri)} {mp} fuse3 {opts} "
                     "0 0\n")
    script = fstab_script(fstab, mp) + f"""
mounted {q(str(mp))} && cp {q(str(src))} {q(str(mp / 'nbd'))} && echo copied
pid=$(pgrep -x nbdferry)
umount {q(str(mp))} 2>/dev/null && echo unmounted
[ -n "$pid" ] && wait_gone "$pid"
unmount_all {q(str(mp))}
"""
    r = run_private(script, shortdir)
    out = r.stdout.splitlines()
    if nonempty:
        assert "rc=0" in out, r.stdout + r.stderr
        assert "ls=nbd nbd.qcow2 nbd.vhd nbd.vhdx nbd.vmdk " in out, r.stdout
        assert "copied" in out and "unmounted" in out, r.stdout + r.stderr
        assert read_nbd_prefix(srv.uri, len(data)) == data
    else:
        assert "rc=32" in out, r.stdout + r.stderr
        assert "not empty" in r.stderr and "-o nonempty" in r.stderr
        assert "ls=a.txt " in out, r.stdout
    assert not any(l.startswith("mounted ") for l in out), r.stdout
    assert sorted(os.listdir(mp)) == ["a.txt"]
    assert (mp / "a.txt").read_text() == "keep me\n"


def read_nbd_prefix(uri, n):
    from lib.nbd import read_nbd
    return read_nbd(uri, 0, n)


def test_fstab_mount_t_exit_status(prefix, shortdir):
    """`mount -T FILE MNT` with a server nobody serves exits 32, mount's
    "mount failure", as the guide says; nothing is mounted."""
    from lib.privatens import run_private
    mp = shortdir / "mnt"
    mp.mkdir()
    fstab = shortdir / "fstab"
    uri = f"nbd+unix:///?socket={shortdir}/nobody.sock"
    fstab.write_text(f"{fstab_source(prefix, uri)} {mp} fuse3 rw,_netdev "
                     "0 0\n")
    r = run_private(fstab_script(fstab, mp) +
                    f"unmount_all {mp}\n", shortdir)
    out = r.stdout.splitlines()
    assert "rc=32" in out, r.stdout + r.stderr
    assert "cannot connect" in r.stderr
    assert not any(l.startswith("mounted ") for l in out)


def test_fstab_dead_mount_named(server, prefix, shortdir):
    """After the daemon of an fstab mount is killed, mounting the line
    again names the dead mount (exit 32) instead of mounting anything."""
    from lib.privatens import run_private
    from shlex import quote as q
    srv = server("memory", EXPORT)
    mp = shortdir / "mnt"
    mp.mkdir()
    fstab = shortdir / "fstab"
    fstab.write_text(f"{fstab_source(prefix, srv.uri)} {mp} fuse3 "
                     "rw,_netdev 0 0\n")
    script = f"""
mount -T {q(str(fstab))} {q(str(mp))} || exit 9
pid=$(pgrep -x nbdferry)
kill -9 $pid
wait_gone $pid
""" + fstab_script(fstab, mp) + f"""
awk -v p={q(str(mp))} '$5 == p' /proc/self/mountinfo | wc -l | sed 's/^/mounts=/'
fusermount3 -u {q(str(mp))} && echo cleared
unmount_all {q(str(mp))}
"""
    r = run_private(script, shortdir)
    out = r.stdout.splitlines()
    assert "rc=32" in out, r.stdout + r.stderr
    assert f"{mp} is a dead nbdferry mount: run fusermount3 -u {mp}" in \
        r.stderr, r.stderr
    assert "mounts=1" in out and "cleared" in out, r.stdout


def test_fstab_qcow2_cluster_size(server, fstab_mount, prefix, shm):
    """qcow2_cluster_size=SIZE in the options field: reading nbd.qcow2
    gives a qcow2 with those clusters, equal to the disk."""
    srv = server("memory", 16 * MiB)
    fill_random(srv.uri)
    m = fstab_mount(fstab_source(prefix, srv.uri),
                    "rw,_netdev,qcow2_cluster_size=4K")
    pid = assert_mounted_ok(m)
    out = shm / "out.qcow2"
    r = run(["cp", m.mp / "nbd.qcow2", out], timeout=120)
    assert r.returncode == 0, r.stderr
    r = run(["qemu-img", "info", "-f", "qcow2", out])
    assert r.returncode == 0 and "cluster_size: 4096" in r.stdout, r.stdout
    r = run(["qemu-img", "compare", "-f", "qcow2", "-F", "raw", out, srv.uri])
    assert r.returncode == 0, r.stdout + r.stderr
    umount_and_wait(m, pid)
