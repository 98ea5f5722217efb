"""No NBD connection is closed with requests outstanding, timeouts
included: a server that is merely slow (paused, then resumed) must never
see a close mid-request.  Debian's nbdkit 1.32 aborts when a client closes
while its worker threads still send replies (raw_send_socket: assertion
'sock >= 0'), taking its memory disk with it.

The case: short timeouts, the server paused mid-copy until the copy
fails (the daemon gives up on it), resumed, and the mount unmounted within
a second, while the resumed server still answers what it held.  Ten
rounds: nbdkit (memory plugin) must still run, without an assertion in
its log, and its disk must still hold what the server acknowledged before
the pause (read back and compared through a fresh connection)."""

import os
import signal
import time

from lib.env import MiB
from lib.faults import wait_progress, written_bytes
from lib.images import random_bytes, random_file
from lib.nbd import read_nbd, write_nbd

EXPORT = 64 * MiB
SRC = 32 * MiB
ROUNDS = 10


def nbdkit_alive(k):
    assert k.proc.poll() is None, \
        f"nbdkit exited ({k.proc.returncode}):\n{k.stderr.read_text()}"
    assert "Assertion" not in k.stderr.read_text(), k.stderr.read_text()


def test_stall_give_up_resume_unmount_server_survives(kit, mount, shm, bg):
    src = random_file(shm / "src.img", SRC)
    for i in range(ROUNDS):
        k = kit(f"mem{i}", ["--filter=delay", "memory", f"size={EXPORT}",
                            "wdelay=20ms", "rdelay=4ms"])
        # A mark beyond what the copy writes: the memory disk survived if
        # it is still there at the end.
        mark = random_bytes(MiB)
        write_nbd(k.uri, mark, EXPORT - MiB)
        m = mount(k.target, "--request-timeout", "1", "--retry-timeout", "1",
                  "--request-size", "512K", expect_rc=None,
                  expect_errors=True)
        cp = bg(["dd", f"if={src}", f"of={m.file}", "bs=1M",
                 "conv=notrunc,fsync"],
                shm / f"cp{i}.err")
        wait_progress(cp, written_bytes, 4 * MiB)
        os.kill(k.proc.pid, signal.SIGSTOP)
        try:
            rc = cp.wait(120)
            assert rc != 0, f"dd exited 0 on a paused server\n{m.stderr}"
            assert "Input/output error" in cp.stderr, cp.stderr
        finally:
            os.kill(k.proc.pid, signal.SIGCONT)
        time.sleep(0.3)                # unmount within a second of resuming
        rc = m.unmount(check=False)
        m.checked = True
        assert rc in (0, 1), (rc, m.stderr)
        time.sleep(1)                  # the server answers what it held
        nbdkit_alive(k)
        # It still serves, its disk intact.
        assert read_nbd(k.uri, EXPORT - MiB, MiB) == mark, "disk lost"
        nbdkit_alive(k)
        k.stop()
