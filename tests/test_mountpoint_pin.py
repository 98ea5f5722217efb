"""Mountpoint pinning: the mountpoint is opened (O_PATH|O_NOFOLLOW) before
any check, checked through that descriptor and mounted through it, so a
directory swapped after the checks cannot redirect the mount.

A second, unprivileged user (nobody, through setpriv) attacks root's
mount: it owns a directory on the way to the mountpoint and, the moment
the emptiness check's listing of the mountpoint ends (inotify), swaps its
subdirectory for a symlink to another, non-empty directory.  The mount
must not land there: nbdferry refuses (the path no longer names what was
checked), nothing is mounted anywhere, the other directory is untouched.
A mountpoint another user owns, or whose directory others may write to
without the sticky bit, is refused outright.

Everything runs inside a private mount namespace (tests/lib/privatens.py);
the symlink's target is a scratch directory of the test's.
"""

import hashlib
import os
import shlex
import shutil

import pytest

from lib.images import random_bytes
from lib.privatens import daemon_lines, run_private

NOBODY = 65534

# Run as nobody: wait for the first close of a directory opened for
# reading (the check's readdir ending), then swap victim for a symlink
# to target, and say so.
SWAPPER = r"""
import ctypes, os, sys
watch, victim, target, ready, done = sys.argv[1:6]
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
IN_CLOSE_NOWRITE = 0x10
if fd < 0 or libc.inotify_add_watch(fd, watch.encode(), IN_CLOSE_NOWRITE) < 0:
    sys.exit("inotify: " + os.strerror(ctypes.get_errno()))
open(ready, "w").close()
os.read(fd, 4096)
os.rename(victim, victim + ".old")
os.symlink(target, victim)
open(done, "w").close()
"""


def q(p):
    return shlex.quote(str(p))


def as_nobody(cmd):
    return (f"setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups "
            f"{cmd}")


def need_setpriv():
    if not shutil.which("setpriv"):
        pytest.fail("setpriv (util-linux) is required")


def waiting_server(flag, disk):
    """A socket-activated nbdkit serving disk that starts only once flag
    exists: the daemon is between its checks and its mount until then."""
    body = (f"while [ ! -e {flag} ]; do sleep 0.05; done; "
            f"exec nbdkit file {disk}")
    return f"[ sh -c {q(body)} ]"


@pytest.fixture
def public(shortdir):
    """shortdir/pub: world-writable and sticky, as /tmp; shortdir
    traversable by nobody."""
    os.chmod(shortdir, 0o755)
    pub = shortdir / "pub"
    pub.mkdir()
    os.chmod(pub, 0o1777)
    return pub


@pytest.fixture
def target(shortdir):
    """The directory an attacker would have the mount land on: the
    test's own, non-empty."""
    t = shortdir / "target"
    (t / "mnt").mkdir(parents=True)
    (t / "mnt" / "keep").write_text("keep me\n")
    return t


def test_swap_after_the_check_is_refused(shortdir, public, target):
    """nobody owns pub/q; root's mountpoint is pub/q/r/mnt (r and mnt
    root's, so the owner and parent rules pass).  When the check's
    listing of mnt ends, nobody renames q/r away and puts a symlink
    q/r -> target in its place: the path now leads to target/mnt.  The
    mount must not land on target/mnt (nor anywhere)."""
    need_setpriv()
    qd = public / "q"
    qd.mkdir()
    (qd / "r" / "mnt").mkdir(parents=True)
    os.chown(qd, NOBODY, NOBODY)
    mp = qd / "r" / "mnt"
    disk = shortdir / "disk.img"
    disk.write_bytes(random_bytes(4 << 20))
    before = hashlib.sha256(disk.read_bytes()).hexdigest()
    swapper = shortdir / "swap.py"
    swapper.write_text(SWAPPER)
    ready, done = public / "ready", public / "swapped"
    script = f"""
{as_nobody(f'/usr/bin/python3 {q(swapper)} {q(mp)} {q(qd / "r")} {q(target)} {q(ready)} {q(done)}')} &
i=0; while [ ! -e {q(ready)} ] && [ $i -lt 300 ]; do sleep 0.05; i=$((i+1)); done
[ -e {q(ready)} ] || echo "swapper not ready"
$NBDFERRY {q(mp)} {waiting_server(q(done), q(disk))}
echo "rc=$?"
[ -e {q(done)} ] && echo "swapped"
[ -L {q(qd / 'r')} ] && echo "symlinked"
unmount_all {q(target / 'mnt')} {q(qd / 'r.old' / 'mnt')} {q(mp)} {q(target)}
"""
    r = run_private(script, shortdir)
    out = r.stdout.splitlines()
    assert "swapper not ready" not in out, r.stdout + r.stderr
    assert "swapped" in out and "symlinked" in out, \
        "the attack did not run: " + r.stdout + r.stderr
    assert not any(l.startswith("mounted ") for l in out), \
        "the mount landed: " + r.stdout
    assert "rc=1" in out, r.stdout + r.stderr
    lines = daemon_lines(r.stderr)
    assert len(lines) == 1, r.stderr
    assert "changed after it was checked" in lines[0] and str(mp) in lines[0]
    assert os.listdir(target / "mnt") == ["keep"]
    assert (target / "mnt" / "keep").read_text() == "keep me\n"
    assert hashlib.sha256(disk.read_bytes()).hexdigest() == before


def test_swap_by_path_would_land_elsewhere(shortdir, public, target):
    """The control: the same swap done before nbdferry starts leads the
    path to target/mnt, which is refused there as not empty; so the test
    above refuses because of the pin, not by chance."""
    need_setpriv()
    qd = public / "q"
    (qd / "r" / "mnt").mkdir(parents=True)
    os.chown(qd, NOBODY, NOBODY)
    os.rename(qd / "r", qd / "r.old")
    os.symlink(target, qd / "r")
    r = run_private(f"""
$NBDFERRY {q(qd / 'r' / 'mnt')} [ nbdkit memory 16M ]
echo "rc=$?"
unmount_all {q(target / 'mnt')}
""", shortdir)
    lines = daemon_lines(r.stderr)
    assert "rc=1" in r.stdout.splitlines(), r.stdout + r.stderr
    assert len(lines) == 1 and str(target / "mnt") in lines[0], lines
    assert "not empty" in lines[0], lines


def test_another_users_directory_refused_for_root(shortdir, public):
    """A mountpoint nobody owns (in a sticky directory, as under /tmp):
    nobody could swap it at any time; refused with the owner named."""
    mp = public / "theirs"
    mp.mkdir()
    os.chown(mp, NOBODY, NOBODY)
    r = run_private(f"""
$NBDFERRY {q(mp)} [ nbdkit memory 16M ]
echo "rc=$?"
unmount_all {q(mp)}
""", shortdir)
    out = r.stdout.splitlines()
    assert "rc=1" in out and not any(l.startswith("mounted ") for l in out)
    lines = daemon_lines(r.stderr)
    assert len(lines) == 1, r.stderr
    assert "belongs to nobody" in lines[0] and "of your own" in lines[0]
    assert os.listdir(mp) == []


@pytest.mark.parametrize("mode,owner,words", [
    (0o777, 0, "writable by other users"),
    (0o775, 0, "writable by other users"),
    (0o755, NOBODY, "directory belongs to nobody"),
])
def test_replaceable_directory_refused_for_root(shortdir, mode, owner, words):
    """Root's mountpoint in a directory others may write to without the
    sticky bit, or that another user owns: they could rename it away and
    put anything there.  Refused with the reason and the fix."""
    parent = shortdir / "parent"
    parent.mkdir()
    mp = parent / "mnt"
    mp.mkdir()
    os.chmod(parent, mode)
    os.chown(parent, owner, 0)
    r = run_private(f"""
$NBDFERRY {q(mp)} [ nbdkit memory 16M ]
echo "rc=$?"
unmount_all {q(mp)}
""", shortdir)
    out = r.stdout.splitlines()
    assert "rc=1" in out and not any(l.startswith("mounted ") for l in out)
    lines = daemon_lines(r.stderr)
    assert len(lines) == 1 and words in lines[0] and str(mp) in lines[0], \
        lines


def test_sticky_world_writable_directory_still_mounts(shortdir, public):
    """A directory of root's in a sticky world-writable one (mkdir under
    /tmp) is fine: only its owner may rename it.  The mount goes through
    the pinned descriptor and the unmount works."""
    mp = public / "mine"
    mp.mkdir()
    pidfile = shortdir / "pid"
    r = run_private(f"""
$NBDFERRY -P {q(pidfile)} {q(mp)} [ nbdkit memory 16M ]
echo "rc=$?"
mounted {q(mp)} && echo "is mounted"
stat -c 'size=%s' {q(mp / 'nbd')}
pid=$(cat {q(pidfile)})
fusermount3 -u {q(mp)} && echo unmounted
wait_gone $pid
unmount_all {q(mp)}
""", shortdir)
    out = r.stdout.splitlines()
    assert "rc=0" in out and "is mounted" in out, r.stdout + r.stderr
    assert f"size={16 << 20}" in out and "unmounted" in out, r.stdout
    assert not any(l.startswith("mounted ") for l in out), r.stdout
    assert not [l for l in daemon_lines(r.stderr) if "error" in l], r.stderr
