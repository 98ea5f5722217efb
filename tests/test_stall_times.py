"""The documented time for a copy onto a server paused for good:
--request-timeout + --retry-timeout after the last reply (docs/user-guide.md:
"measured: 5.0-5.1 s with --request-timeout 2 --retry-timeout 3").  A
writer waiting for a pool buffer when the server is given up on fails
with it; it does not try a heal first (a handshake of up to
--request-timeout on the paused server, which stretched the time to
about 6-7 s here and 118 s instead of 90 with the defaults).

The margin: the last reply came at most a few milliseconds before the
pause, and the machine may be loaded: 5 s - 0.2 to 5 s + 0.7."""

import os
import signal
import time

from lib.env import MiB
from lib.faults import wait_progress, written_bytes
from lib.images import random_file

REQ_T, RETRY_T = 2, 3


def test_stall_paused_copy_fails_at_request_plus_retry_timeout(
        kit, mount, shm, bg):
    k = kit("srv", ["--filter=delay", "memory", f"size={96 * MiB}",
                    "wdelay=20ms"])
    m = mount(k.target, "--request-timeout", str(REQ_T), "--retry-timeout",
              str(RETRY_T), "--request-size", "512K", "--pool-size", "16M",
              expect_rc=1, expect_errors=True)
    src = random_file(shm / "src.img", 64 * MiB)
    cp = bg(["dd", f"if={src}", f"of={m.file}", "bs=1M",
             "conv=notrunc,fsync"], shm / "cp.err")
    wait_progress(cp, written_bytes, 24 * MiB)    # past the pool: waiting
    os.kill(k.proc.pid, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        rc = cp.wait(120)
        took = time.monotonic() - t0
        assert rc != 0, f"dd exited 0 on a paused server\n{m.stderr}"
        assert "Input/output error" in cp.stderr, cp.stderr
    finally:
        os.kill(k.proc.pid, signal.SIGCONT)
    print(f"paused server: the copy failed after {took:.2f} s "
          f"(documented {REQ_T + RETRY_T} s)")
    assert REQ_T + RETRY_T - 0.2 <= took <= REQ_T + RETRY_T + 0.7, \
        (took, m.stderr)
    assert m.unmount(check=True) == 1
