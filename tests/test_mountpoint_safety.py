"""Mount safety: a mistake in the mountpoint gets a clear error and
touches nothing.

A directory that holds files is refused (both `DIR URI` and `DIR/FILENAME
URI` with FILENAME missing, which says that FILENAME does not exist and
was taken as the file name) unless `-o nonempty`; a system directory
always; a directory that is already a FUSE mount always; a dead mount is
named with the fusermount3 command that clears it.  File mode refuses a
file in or below a system directory (/etc/passwd, /usr/bin/ls) always,
and a non-empty file (the source image named as the mountpoint) unless
`-o nonempty`.  The checks come
before anything starts: no server command runs, no pidfile is left.

Every nbdferry command here runs inside a private mount namespace
(tests/lib/privatens.py), so a regression can never hide this machine's
directories from anyone else.
"""

import hashlib
import os
import shlex
import shutil
import tempfile
from pathlib import Path

import pytest

from lib.env import MiB
from lib.images import random_bytes
from lib.privatens import daemon_lines, run_private

EXPORT = 16 * MiB


def q(p):
    return shlex.quote(str(p))


def marked_server(mark, size="16M"):
    """A socket-activated nbdkit that leaves a mark when it starts."""
    return (f"[ sh -c {q(f'touch {mark}; exec nbdkit memory {size}')} ]")


def refused(shortdir, target, *opts, extra_mounts=(), env=None, setup="",
            cd=None):
    """Run nbdferry OPTS TARGET [ marked server ] in a private namespace;
    return (rc, the daemon's stderr lines, what got mounted)."""
    mark = shortdir / "server-started"
    pidfile = shortdir / "refused.pid"
    watch = [shortdir, shortdir / "full", shortdir / "empty", "/etc", "/tmp",
             "/var/tmp", "/", *extra_mounts]
    script = f"""
{setup}
{f'cd {q(cd)} &&' if cd else ''} $NBDFERRY -P {q(pidfile)} {' '.join(map(q, opts))} {q(target)} {marked_server(mark)}
echo "rc=$?"
[ -e {q(mark)} ] && echo "server started"
[ -e {q(pidfile)} ] && echo "pidfile left"
unmount_all {' '.join(q(m) for m in watch)}
"""
    r = run_private(script, shortdir, env=env)
    out = r.stdout.splitlines()
    rc = next(int(l[3:]) for l in out if l.startswith("rc="))
    assert "server started" not in out, "the server command was started"
    assert "pidfile left" not in out, "a pidfile was left behind"
    return rc, daemon_lines(r.stderr), [l[8:] for l in out
                                        if l.startswith("mounted ")]


@pytest.fixture
def full(shortdir):
    d = shortdir / "full"
    d.mkdir()
    (d / "a.txt").write_text("keep me\n")
    return d


def assert_one_line(lines, *words):
    assert len(lines) == 1, f"expected one line from nbdferry: {lines}"
    for w in words:
        assert w in lines[0], f"{w!r} not in {lines[0]!r}"
    return lines[0]


@pytest.mark.parametrize("form", ["dir", "dir-missing-filename",
                                  "relative-missing-filename"])
def test_nonempty_directory_refused(shortdir, full, form):
    target, cd = {
        "dir": (full, None),
        "dir-missing-filename": (full / "nosuch", None),
        "relative-missing-filename": ("full/nosuch", shortdir),
    }[form]
    rc, lines, mounted = refused(shortdir, target, cd=cd)
    assert rc != 0
    line = assert_one_line(lines, str(full), "not empty", "-o nonempty",
                           "empty directory", "file mode")
    if form != "dir":             # a typo'd mountpoint: say what was taken
        assert "nosuch does not exist" in line, line
        assert "taken as the FILENAME" in line, line
        assert "spelling" in line, line
    assert not mounted, f"mounted: {mounted}"
    assert sorted(os.listdir(full)) == ["a.txt"]
    assert (full / "a.txt").read_text() == "keep me\n"


SYSTEM_CASES = {
    # id: (target, options, directory named in the error)
    "etc-missing-filename": ("/etc/nosuch", (), "/etc"),
    "etc-nonempty-opt": ("/etc", ("-o", "nonempty"), "/etc"),
    "tmp": ("/tmp", ("-o", "nonempty"), "/tmp"),
    "tmp-missing-filename": ("/tmp/nbdferry-test-nosuch", (), "/tmp"),
    "var-tmp": ("/var/tmp/nosuch", ("-o", "nonempty"), "/var/tmp"),
    "root": ("/nosuch", ("-o", "nonempty"), "/"),
    "usr": ("/usr", ("-o", "allow_other,nonempty"), "/usr"),
    "dotdot-to-etc": ("DIR/../../../../../../../etc/nosuch", (), "/etc"),
    "symlink-to-etc": ("DIR/link/nosuch", (), "/etc"),
    "home": ("HOME", ("-o", "nonempty"), "HOME"),
    "tmpdir-env": ("TMPD", ("-o", "nonempty"), "TMPD"),
}


@pytest.mark.parametrize("case", list(SYSTEM_CASES))
def test_system_directory_refused(shortdir, case):
    target, opts, named = SYSTEM_CASES[case]
    home, tmpd = shortdir / "home", shortdir / "tmpd"
    home.mkdir()                        # empty: refused all the same
    tmpd.mkdir()
    (shortdir / "link").symlink_to("/etc")
    names = {"DIR": str(shortdir), "HOME": str(home), "TMPD": str(tmpd)}
    for k, v in names.items():
        target = target.replace(k, v)
        named = named.replace(k, v)
    env = dict(os.environ, HOME=str(home), TMPDIR=str(tmpd))
    rc, lines, mounted = refused(shortdir, target, *opts, env=env,
                                 extra_mounts=[home, tmpd])
    assert rc != 0
    line = assert_one_line(lines, "system directory")
    assert f" {named}:" in line, line
    assert not mounted, f"mounted: {mounted}"


def test_already_mounted_refused_first_keeps_serving(shortdir):
    """A second mount on a FUSE mountpoint is refused, also with -o
    nonempty; the first keeps serving the right bytes."""
    mp = shortdir / "mp"
    mp.mkdir()
    src = shortdir / "src"
    src.write_bytes(random_bytes(3 * MiB + 5))
    pid1 = shortdir / "first.pid"
    script = f"""
$NBDFERRY -P {q(pid1)} {q(mp)} [ nbdkit memory 16M ] || exit 9
$NBDFERRY -P {q(shortdir / 'second.pid')} {q(mp)} [ nbdkit memory 16M ]
echo "rc=$?"
$NBDFERRY -o nonempty {q(mp)} [ nbdkit memory 16M ]
echo "rc=$?"
$NBDFERRY {q(mp / 'other')} [ nbdkit memory 16M ]
echo "rc=$?"
[ -e {q(shortdir / 'second.pid')} ] && echo "pidfile left"
dd if={q(src)} of={q(mp / 'nbd')} bs=1M conv=notrunc status=none && echo written
cmp -n {3 * MiB + 5} {q(src)} {q(mp / 'nbd')} && echo "first serves"
awk -v p={q(mp)} '$5 == p' /proc/self/mountinfo | wc -l | sed 's/^/mounts=/'
pid=$(cat {q(pid1)})
fusermount3 -u {q(mp)}
wait_gone $pid
unmount_all {q(mp)}
"""
    r = run_private(script, shortdir)
    out = r.stdout.splitlines()
    assert [l for l in out if l.startswith("rc=")] == ["rc=1"] * 3, r.stdout
    lines = daemon_lines(r.stderr)
    assert len(lines) == 3, r.stderr
    for l in lines:
        assert "already a FUSE mount" in l and str(mp) in l, l
    assert "pidfile left" not in out
    assert "written" in out and "first serves" in out, r.stdout + r.stderr
    assert "mounts=1" in out, "mounts stacked: " + r.stdout
    assert not any(l.startswith("mounted ") for l in out), r.stdout


@pytest.mark.parametrize("form", ["dir", "dir-missing-filename"])
def test_dead_mount_named(shortdir, form):
    """After kill -9 the mountpoint answers ENOTCONN: the error names the
    dead mount and the command that clears it, and nothing (in particular
    not the parent directory) is mounted."""
    mp = shortdir / "mp"
    mp.mkdir()
    target = mp if form == "dir" else mp / "disk"
    pidfile = shortdir / "dead.pid"
    script = f"""
$NBDFERRY -P {q(pidfile)} {q(mp)} [ nbdkit memory 16M ] || exit 9
pid=$(cat {q(pidfile)})
kill -9 $pid
wait_gone $pid
stat {q(mp)} >/dev/null 2>&1 || echo "enotconn"
$NBDFERRY {q(target)} {marked_server(shortdir / 'mark')}
echo "rc=$?"
[ -e {q(shortdir / 'mark')} ] && echo "server started"
mounted {q(shortdir)} && echo "parent mounted"
awk -v p={q(mp)} '$5 == p' /proc/self/mountinfo | wc -l | sed 's/^/mounts=/'
fusermount3 -u {q(mp)} && echo "cleared"
unmount_all {q(shortdir)} {q(mp)}
"""
    r = run_private(script, shortdir)
    out = r.stdout.splitlines()
    assert "enotconn" in out, r.stdout
    assert "rc=1" in out, r.stdout + r.stderr
    line = assert_one_line(daemon_lines(r.stderr), "dead nbdferry mount")
    assert line.endswith(f"{mp} is a dead nbdferry mount: run fusermount3 "
                         f"-u {mp}"), line
    assert "server started" not in out and "parent mounted" not in out
    assert "mounts=1" in out, "mounted over the dead mount: " + r.stdout
    assert "cleared" in out, "the suggested fusermount3 -u did not work"


def test_nonempty_opt_in(shortdir, full):
    """-o nonempty mounts over the directory; the bytes land; after the
    unmount the directory's own files are visible again, unchanged."""
    disk = shortdir / "disk.img"
    disk.write_bytes(b"\0" * EXPORT)
    data = random_bytes(5 * MiB + 17)
    src = shortdir / "src"
    src.write_bytes(data)
    pidfile = shortdir / "optin.pid"
    script = f"""
$NBDFERRY -P {q(pidfile)} -o nonempty {q(full / 'disk.raw')} [ nbdkit file {q(disk)} ]
echo "rc=$?"
ls {q(full)} | tr '\\n' ' ' | sed 's/^/ls=/'; echo
cp {q(src)} {q(full / 'disk.raw')} && echo copied
pid=$(cat {q(pidfile)})
fusermount3 -u {q(full)}
wait_gone $pid
[ -e {q(pidfile)} ] && echo "pidfile left"
unmount_all {q(full)}
"""
    r = run_private(script, shortdir)
    out = r.stdout.splitlines()
    assert "rc=0" in out, r.stdout + r.stderr
    assert "ls=disk.raw disk.raw.qcow2 disk.raw.vhd disk.raw.vhdx disk.raw.vmdk " in out, r.stdout
    assert "copied" in out, r.stderr
    assert "pidfile left" not in out
    assert not any(l.startswith("mounted ") for l in out), r.stdout
    got = disk.read_bytes()
    assert hashlib.sha256(got[:len(data)]).hexdigest() == \
        hashlib.sha256(data).hexdigest(), "the disk does not hold the copy"
    assert got[len(data):].count(0) == EXPORT - len(data)
    assert sorted(os.listdir(full)) == ["a.txt"]
    assert (full / "a.txt").read_text() == "keep me\n"


def test_empty_directory_and_file_mode_still_mount(shortdir):
    """The checks refuse nothing legitimate: an empty directory, a new
    FILENAME in an empty directory, an existing regular file."""
    (shortdir / "e1").mkdir()
    (shortdir / "e2").mkdir()
    f = shortdir / "disk.raw"
    f.write_bytes(b"")
    script = ""
    for i, t in enumerate([shortdir / "e1", shortdir / "e2" / "disk", f]):
        script += f"""
$NBDFERRY -P {q(shortdir / f'p{i}')} {q(t)} [ nbdkit memory 16M ]
echo "rc=$?"
stat -c 'size=%s' {q(t if i == 2 else t / 'nbd' if i == 0 else t)}
pid=$(cat {q(shortdir / f'p{i}')})
fusermount3 -u {q(t if i == 2 else t if i == 0 else t.parent)}
wait_gone $pid
"""
    r = run_private(script + f"unmount_all {q(shortdir / 'e1')} "
                    f"{q(shortdir / 'e2')} {q(f)}\n", shortdir)
    out = r.stdout.splitlines()
    assert out.count("rc=0") == 3, r.stdout + r.stderr
    assert out.count(f"size={EXPORT}") == 3, r.stdout
    assert not any(l.startswith("mounted ") for l in out), r.stdout


# ------------------------------------------------------------ file mode

def sha(p):
    return hashlib.sha256(open(p, "rb").read()).hexdigest()


@pytest.mark.parametrize("target", ["/etc/passwd", "/etc/hostname",
                                    "/usr/bin/ls", "/bin/ls",
                                    "DIR/link/passwd"])
def test_file_mode_system_file_refused(shortdir, target):
    """A system file is never mounted over, even with -o nonempty: every
    program would read the disk instead of /etc/passwd or run it instead
    of ls."""
    (shortdir / "link").symlink_to("/etc")
    target = target.replace("DIR", str(shortdir))
    real = os.path.realpath(target)
    before = sha(real)
    rc, lines, mounted = refused(shortdir, target, "-o", "nonempty",
                                 extra_mounts=[real])
    assert rc != 0
    line = assert_one_line(lines, "system file", real)
    assert "empty file of your own" in line, line
    assert not mounted, f"mounted: {mounted}"
    assert sha(real) == before


def test_file_mode_nonempty_file_refused(shortdir):
    """`nbdferry disk.img URI`, the source image named by mistake as the
    mountpoint: refused with the reason and the fix, the image untouched,
    no server started (the disk is untouched)."""
    img = shortdir / "disk.img"
    img.write_bytes(random_bytes(MiB + 3))
    before = sha(img)
    rc, lines, mounted = refused(shortdir, img, extra_mounts=[img])
    assert rc != 0
    line = assert_one_line(lines, str(img), f"holds {MiB + 3} bytes",
                           "source image", "-o nonempty", "empty file")
    assert "nbdferry MOUNTPOINT URI" in line, line
    assert not mounted, f"mounted: {mounted}"
    assert sha(img) == before


def test_file_mode_file_with_data_after_a_hole_refused(shortdir):
    """A sparse file whose only data is one non-zero byte at its end holds
    data: refused (a file of holes or zeros is not: test_nbdfuse_compat)."""
    img = shortdir / "sparse.img"
    with open(img, "wb") as f:
        f.truncate(4 * MiB)
        f.seek(4 * MiB - 1)
        f.write(b"x")
    before = sha(img)
    rc, lines, mounted = refused(shortdir, img, extra_mounts=[img])
    assert rc != 0
    assert_one_line(lines, str(img), f"holds {4 * MiB} bytes", "-o nonempty")
    assert not mounted, f"mounted: {mounted}"
    assert sha(img) == before


def test_file_mode_nonempty_opt_in(shortdir):
    """-o nonempty mounts over a file that holds bytes; the copy lands on
    the server, and after the unmount the file is unchanged."""
    f = shortdir / "over.raw"
    f.write_bytes(b"the user's own bytes\n")
    disk = shortdir / "disk.img"
    disk.write_bytes(b"\0" * EXPORT)
    data = random_bytes(2 * MiB + 5)
    src = shortdir / "src"
    src.write_bytes(data)
    pidfile = shortdir / "fm.pid"
    r = run_private(f"""
$NBDFERRY -P {q(pidfile)} -o nonempty {q(f)} [ nbdkit file {q(disk)} ]
echo "rc=$?"
stat -c 'size=%s' {q(f)}
dd if={q(src)} of={q(f)} bs=1M conv=notrunc,fsync status=none && echo copied
pid=$(cat {q(pidfile)})
fusermount3 -u {q(f)}
wait_gone $pid
unmount_all {q(f)}
""", shortdir)
    out = r.stdout.splitlines()
    assert "rc=0" in out and f"size={EXPORT}" in out, r.stdout + r.stderr
    assert "copied" in out, r.stderr
    assert not any(l.startswith("mounted ") for l in out), r.stdout
    assert disk.read_bytes()[:len(data)] == data
    assert f.read_bytes() == b"the user's own bytes\n"


@pytest.mark.parametrize("base", ["/var/tmp", "/dev/shm"])
def test_file_mode_in_user_trees_still_mounts(shortdir, base):
    """Below /var and /dev, the places users keep files (/var/tmp,
    /dev/shm) still take a file-mode mount."""
    d = tempfile.mkdtemp(prefix="nf-fm-", dir=base)
    try:
        f = Path(d) / "disk.raw"
        f.write_bytes(b"")
        pidfile = shortdir / "ut.pid"
        r = run_private(f"""
$NBDFERRY -P {q(pidfile)} {q(f)} [ nbdkit memory 16M ]
echo "rc=$?"
stat -c 'size=%s' {q(f)}
pid=$(cat {q(pidfile)})
fusermount3 -u {q(f)}
wait_gone $pid
unmount_all {q(f)}
""", shortdir)
        out = r.stdout.splitlines()
        assert "rc=0" in out and f"size={EXPORT}" in out, \
            r.stdout + r.stderr
        assert not any(l.startswith("mounted ") for l in out), r.stdout
    finally:
        shutil.rmtree(d, ignore_errors=True)
