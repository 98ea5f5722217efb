"""nbdferry --unmount while a copy runs names the copy:
the mount is busy, so it stays mounted and --unmount exits 1; its
message names the writer (pid and command, the file it has open for
writing), then the readers, so the user knows whom to wait for.  The
copy is not disturbed: it lands byte-exact (sha256 on the server) and a
second --unmount then succeeds."""

import os
import re
import signal

from lib.digest import sha256_file
from lib.env import MiB
from lib.faults import wait_progress, written_bytes
from lib.images import random_file
from lib.mounts import is_mounted
from lib.nbd import sha256_nbd

from test_unmount_verdict import unmount

SRC = 32 * MiB


def test_unmount_during_a_copy_names_the_writer(server, mount, shm, bg):
    srv = server("memory", f"size={64 * MiB}", "wdelay=20ms",
                 filters=["delay"])
    m = mount(srv, "--request-size", "512K")
    src = random_file(shm / "src.img", SRC)
    cp = bg(["dd", f"if={src}", f"of={m.file}", "bs=1M", "conv=fsync"],
            shm / "cp.err")
    wait_progress(cp, written_bytes, 4 * MiB)
    # The server paused: the copy is surely still running (on a loaded
    # machine it could otherwise end before --unmount looks).
    os.kill(srv.proc.pid, signal.SIGSTOP)
    try:
        assert cp.proc.poll() is None, "the copy ended before the pause"
        with open(m.file, "rb"):                  # a reader too
            r = unmount(m.mp)
    finally:
        os.kill(srv.proc.pid, signal.SIGCONT)
    assert r.returncode == 1 and "still mounted" in r.stderr, r.stderr
    assert is_mounted(m.mp)
    lines = r.stderr.splitlines()
    w = [l for l in lines if f"pid {cp.proc.pid} (dd)" in l]
    assert w and "open for writing" in w[0] and str(m.file) in w[0], \
        r.stderr
    readers = [l for l in lines if f"pid {os.getpid()} " in l]
    # The daemon's own hold on the directory under its mount (its pin of
    # the mountpoint) is no user of the mount.
    assert not [l for l in lines if f"pid {m.pid} " in l], r.stderr
    assert readers and "open for reading" in readers[0], r.stderr
    assert lines.index(w[0]) < lines.index(readers[0]), r.stderr
    assert cp.wait(120) == 0, cp.stderr
    assert sha256_nbd(srv.uri, SRC) == sha256_file(src)
    r = unmount(m.mp)
    assert r.returncode == 0, r.stderr
    m.wait_exit()
    m.checked = True
