"""The kernel's FUSE request timeout (Linux 6.15+:
/proc/sys/fs/fuse/default_request_timeout): a request left unanswered
longer gets the whole mount aborted by the kernel.  The daemon reads it at
start and shortens --request-timeout and --retry-timeout to fit below it
(logged, with why), so a copy onto a paused server fails with EIO from
the daemon while the mount stays up, instead of ENOTCONN from an aborted
mount.

The sysctl is global to the machine: it is set to 30 s only while the
mount starts (the kernel takes it at FUSE_INIT), restored at once in a
finally, and under the knob lock held exclusively (tests/lib/mounts.py:
no other test's mount starts meanwhile and gets the timeout)."""

import os
import re
import signal
from pathlib import Path

from lib.env import MiB
from lib.faults import wait_progress, written_bytes
from lib.images import random_file
from lib.mounts import fuse_knobs, is_mounted

KNOB = Path("/proc/sys/fs/fuse/default_request_timeout")
MAXKNOB = Path("/proc/sys/fs/fuse/max_request_timeout")
KERNEL_T = 30


def test_fuse_timeout_paused_server_fails_with_eio_mount_survives(
        kit, mount, shm, bg):
    assert KNOB.exists(), "this kernel has no FUSE request timeout (6.15+)"
    assert MAXKNOB.read_text().strip() == "0", "a maximum is set: unexpected"
    k = kit("srv", ["--filter=delay", "memory", f"size={64 * MiB}",
                    "wdelay=10ms"])
    with fuse_knobs(exclusive=True):
        old = KNOB.read_text().strip()
        KNOB.write_text(str(KERNEL_T))
        try:
            # Defaults: 30 s + 60 s, far past the kernel's 30 s.
            m = mount(k.target, "--request-size", "512K", expect_rc=1,
                      expect_errors=True)
        finally:
            KNOB.write_text(old)
    text = m.stderr
    got = re.search(r"--request-timeout 30 s and --retry-timeout 60 s "
                    r"shortened to (\d+) s and (\d+) s", text)
    assert got, text
    assert int(got[1]) + int(got[2]) <= KERNEL_T - 5, got[0]
    src = random_file(shm / "src.img", 32 * MiB)
    cp = bg(["dd", f"if={src}", f"of={m.file}", "bs=1M",
             "conv=notrunc,fsync"], shm / "cp.err")
    wait_progress(cp, written_bytes, 4 * MiB)
    os.kill(k.proc.pid, signal.SIGSTOP)
    try:
        rc = cp.wait(120)
        assert rc != 0, f"dd exited 0 on a paused server\n{m.stderr}"
        assert "Input/output error" in cp.stderr, cp.stderr
        assert "Transport endpoint" not in cp.stderr, \
            f"the kernel aborted the mount:\n{cp.stderr}\n{m.stderr}"
        assert is_mounted(m.mp), "the mount is gone"
        assert os.stat(m.file).st_size == 64 * MiB   # still answers
    finally:
        os.kill(k.proc.pid, signal.SIGCONT)
    assert m.unmount(check=True) == 1
