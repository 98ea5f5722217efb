"""The -P pidfile is written safely and removed only while it is ours.

It is created exclusively (O_EXCL|O_NOFOLLOW) in the directory opened at
start and renamed into place: a symlink someone planted, at the final
name or at any temporary name, is never followed.  At exit it is removed
only if it still holds this daemon's pid: a newer daemon's pidfile
survives an older daemon's exit.
"""

import os
import shlex
import subprocess


from lib.env import MiB, daemon_cmd
from lib.mounts import is_mounted
from lib.privatens import run_private
from lib.procs import pid_alive, run, wait_for

VICTIM = "precious contents\n"


def test_pidfile_planted_symlinks_not_followed(shortdir):
    """Symlinks to a victim file at the pidfile's name and at every
    temporary name the daemon could use (old and new schemes, for each
    pid it can get): the victim is untouched, the pidfile is a regular
    file with the daemon's pid.  Runs in its own pid namespace, so the
    daemon's pid is small and known in advance."""
    victim = shortdir / "victim"
    victim.write_text(VICTIM)
    victim.chmod(0o644)
    pf = shortdir / "d.pid"
    mp = shortdir / "mp"
    mp.mkdir()
    for pid in range(1, 64):
        for name in (f"d.pid.tmp{pid}", *(f".d.pid.{pid}.{i}"
                                          for i in range(3))):
            (shortdir / name).symlink_to(victim)
    pf.symlink_to(victim)
    q = shlex.quote
    script = f"""
$NBDFERRY -P {q(str(pf))} {q(str(mp))} [ nbdkit memory 16M ]
echo "rc=$?"
[ -L {q(str(pf))} ] && echo "pidfile is a symlink"
pid=$(cat {q(str(pf))})
kill -0 "$pid" && echo "pidfile names the daemon"
ps -o comm= -p "$pid" | sed 's/^/comm=/'
fusermount3 -u {q(str(mp))}
wait_gone "$pid"
[ -e {q(str(pf))} ] && echo "pidfile left"
unmount_all {q(str(mp))}
"""
    r = run_private(script, shortdir)
    out = r.stdout.splitlines()
    assert "rc=0" in out, r.stdout + r.stderr
    assert victim.read_text() == VICTIM, "the planted symlink was followed"
    assert "pidfile is a symlink" not in out
    assert "pidfile names the daemon" in out and "comm=nbdferry" in out, \
        r.stdout
    assert "pidfile left" not in out
    assert not any(l.startswith("mounted ") for l in out)
    assert sorted(p.name for p in shortdir.iterdir()
                  if not p.is_symlink()) == ["mp", "victim"], \
        "a temporary file was left behind"


def start(mp, pf, srv):
    r = run(daemon_cmd("-P", pf, mp, srv.uri), timeout=60)
    assert r.returncode == 0, r.stderr
    pid = int(pf.read_text())
    assert pid_alive(pid) and is_mounted(mp)
    return pid


def test_pidfile_of_a_newer_daemon_survives(server, shortdir):
    """Daemon A writes the pidfile, daemon B (same -P) replaces it; A's
    exit leaves B's pidfile alone, B's exit removes it."""
    # Two exports: a second writable mount of one export is refused.
    srvs = [server("memory", f"size={16 * MiB}") for _ in range(2)]
    pf = shortdir / "shared.pid"
    mps = [shortdir / "a", shortdir / "b"]
    pids = []
    try:
        for mp, srv in zip(mps, srvs):
            mp.mkdir()
            pids.append(start(mp, pf, srv))
        assert int(pf.read_text()) == pids[1]
        subprocess.run(["fusermount3", "-u", mps[0]], check=True)
        wait_for(lambda: not pid_alive(pids[0]), None, "daemon A exit", 60)
        assert pf.exists(), "the older daemon removed the newer one's pidfile"
        assert int(pf.read_text()) == pids[1]
        subprocess.run(["fusermount3", "-u", mps[1]], check=True)
        wait_for(lambda: not pid_alive(pids[1]), None, "daemon B exit", 60)
        assert not pf.exists(), "the pidfile outlived its daemon"
    finally:
        for mp in mps:
            if is_mounted(mp):
                subprocess.run(["fusermount3", "-u", "-z", mp])


def test_pidfile_removed_by_its_own_daemon_after_sigterm(server, shortdir):
    srv = server("memory", f"size={16 * MiB}")
    pf = shortdir / "own.pid"
    mp = shortdir / "mp"
    mp.mkdir()
    pid = start(mp, pf, srv)
    os.kill(pid, 15)
    wait_for(lambda: not pid_alive(pid), None, "daemon exit", 60)
    assert not is_mounted(mp)
    assert not pf.exists()


def test_pidfile_directory_missing_is_a_usage_error(server, shortdir):
    """Checked before anything starts: nothing mounted, no server run."""
    srv = server("memory", f"size={16 * MiB}")
    mp = shortdir / "mp"
    mp.mkdir()
    r = run(daemon_cmd("-P", shortdir / "nosuch" / "x.pid", mp, srv.uri))
    assert r.returncode == 1
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "nosuch" in lines[0], r.stderr
    assert not is_mounted(mp)
