"""Run a shell script in a private mount namespace.

Tests of wrong or hazardous mountpoints (a non-empty directory, /etc,
/tmp, a parent directory taken by mistake, a dead mount) run their
nbdferry commands inside `unshare -m sh -c 'mount --make-rprivate / &&
...'`: whatever a regression mounts there is invisible to the rest of the
machine and disappears with the namespace.  The script also runs in its
own pid namespace: when it ends, or times out, every process it left (a
daemon that mounted where it should not, and hangs there on its own
mount) is killed with it.

The script gets these shell helpers:
  $NBDFERRY ...        the daemon command (with NBDFERRY_WRAPPER)
  mounted PATH         true if a FUSE filesystem is mounted on PATH
  unmount_all PATH...  print "mounted PATH" and unmount (lazily at last)
                       each PATH that is a FUSE mount
  wait_gone PID        wait up to 30 s for a process to exit
and must print what the test checks ("rc=N", "mounted PATH", ...).
"""

import shlex
import shutil
import subprocess

import pytest

from lib.env import daemon_cmd, timeout

PRELUDE = r"""
set -u
mounted() {
    awk -v p="$1" '{ for (i = 7; i < NF && $i != "-"; i++) ;
                     if ($5 == p && $(i + 1) ~ /^fuse/) f = 1 }
                   END { exit !f }' /proc/self/mountinfo
}
unmount_all() {
    for m in "$@"; do
        if mounted "$m"; then
            echo "mounted $m"
            fusermount3 -u "$m" 2>/dev/null || fusermount3 -uz "$m" 2>/dev/null || umount -l "$m"
        fi
    done
}
wait_gone() {
    i=0
    while kill -0 "$1" 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
    if kill -0 "$1" 2>/dev/null; then echo "still running $1"; kill -9 "$1"; fi
}
"""


def run_private(script, cwd, env=None, secs=60):
    """Run script (sh) in a private mount namespace; returns the
    CompletedProcess (text).  A missing unshare is a failure."""
    assert shutil.which("unshare"), "unshare (util-linux) is required"
    full = ("mount --make-rprivate / && " + PRELUDE +
            f"NBDFERRY={shlex.quote(shlex.join(map(str, daemon_cmd())))}\n" +
            script)
    try:
        return subprocess.run(["unshare", "-m", "-p", "-f", "--mount-proc",
                               "--kill-child", "sh", "-c", full], cwd=cwd,
                              env=env, capture_output=True, text=True,
                              timeout=timeout(secs))
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"private-namespace script timed out:\n{e.stdout}\n"
                    f"{e.stderr}")


def daemon_lines(stderr):
    """The daemon's own lines (a server it started may print others)."""
    return [l for l in stderr.splitlines() if l.startswith("nbdferry:")]
