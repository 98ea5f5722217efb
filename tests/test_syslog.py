"""A daemonized nbdferry reports to the system log, naming its mountpoint.

Without -f the daemon's errors and warnings go to syslog(3) once it has
detached.  The test runs in a private mount namespace whose /dev is a
fresh tmpfs (holding bind mounts of fuse, null, zero, urandom) so that it
can listen on its own /dev/log without touching the machine's: it mounts
without -f, writes a non-VHD into nbd.vhd (refused), repeats it 40 times,
unmounts, and reads what arrived on /dev/log.

Run: /usr/bin/python3 -m pytest tests/test_syslog.py
"""

import os
import shutil
import sys

from lib.env import daemon_cmd
from lib.procs import run

INSIDE = r'''
import os, socket, subprocess, sys, time
mp, uri, out = sys.argv[1], sys.argv[2], sys.argv[3]
cmd = sys.argv[4:]
log = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
log.bind("/dev/log")
log.settimeout(0.2)
r = subprocess.run(cmd + [mp, uri], capture_output=True, text=True)
assert r.returncode == 0, r
junk = os.urandom(1 << 20)
for i in range(41):
    fd = os.open(mp + "/nbd.vhd", os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, junk)
        sys.exit("a non-VHD was accepted")
    except OSError:
        pass
    try:
        os.close(fd)
    except OSError:
        pass
subprocess.run(["fusermount3", "-u", mp], check=True)
lines = []
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    try:
        lines.append(log.recv(4096).decode(errors="replace"))
    except socket.timeout:
        if any("rate limit" in l for l in lines[-3:]):
            break
with open(out, "w") as f:
    f.write("\n".join(lines))
'''

SETUP = r'''
set -e
mount --make-rprivate /
mkdir -p "$T/olddev"
mount --rbind /dev "$T/olddev"
mount -t tmpfs -o mode=755 devtmp /dev
for n in fuse null zero urandom random; do
    touch "/dev/$n"
    mount --bind "$T/olddev/$n" "/dev/$n"
done
umount -l "$T/olddev"
exec "$@"
'''


def test_daemon_logs_to_syslog_with_mountpoint(server, shortdir):
    assert shutil.which("unshare"), "unshare (util-linux) is needed"
    srv = server("memory", "size=64M")
    mp = shortdir / "mnt"
    mp.mkdir()
    out = shortdir / "syslog.txt"
    script = shortdir / "inside.py"
    script.write_text(INSIDE)
    env = dict(os.environ, T=str(shortdir))
    r = run(["unshare", "-m", "sh", "-c", SETUP, "setup",
             sys.executable, script, mp, srv.uri, out,
             *daemon_cmd()], timeout=180, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    text = out.read_text()
    lines = text.splitlines()
    refusals = [l for l in lines if "not a dynamic or differencing VHD" in l]
    assert refusals, text
    # "<3>... nbdferry[PID]: /path/mnt: error: nbd.vhd: not a ..."
    for l in refusals:
        assert l.startswith("<27>") or l.startswith("<3>"), l
        assert "nbdferry[" in l and f": {mp}: error: nbd.vhd:" in l, l
    # 41 refusals: rate-limited, the rest counted
    assert len(refusals) <= 10, text
    assert any("rate limit" in l for l in lines), text
