"""While a connection is being reconnected, the status says why (issue
41, item 13): the loss, then the last try's error, not only
"reconnecting".

The server is killed mid-copy: its Unix socket is left behind, so each
try is refused (ECONNREFUSED); then the socket file is removed, and the
tries find nothing there (ENOENT).  The status's server_answers names
each in its message and in reconnect_error.  The copy fails once the
retry window is over; the server started again on the same socket, the
next copy onto the same mount lands byte-exact (sha256 on the server)."""

import time

from lib.digest import sha256_file
from lib.env import MiB
from lib.faults import status_json, wait_progress, written_bytes
from lib.images import random_file
from lib.nbd import sha256_nbd

SRC = 32 * MiB


def wait_message(m, cp, text, secs=30):
    """The status's server_answers once its message holds text."""
    deadline, seen = time.monotonic() + secs, []
    while time.monotonic() < deadline and cp.poll() is None:
        st = status_json(m)
        sa = st and st["server_answers"]
        if sa and sa["state"] == "reconnecting":
            seen.append(sa["message"])
            if text in sa["message"]:
                return sa
        time.sleep(0.05)
    raise AssertionError(f"the status never said {text!r}: {seen[-3:]}")


def test_stall_reconnecting_status_says_why(kit, mount, shm, bg):
    k = kit("srv", ["--filter=delay", "memory", f"size={64 * MiB}",
                    "wdelay=20ms"])
    m = mount(k.target, "--request-timeout", "2", "--retry-timeout", "8",
              "--request-size", "512K", "-C", "1", "--depth", "2",
              expect_rc=None, expect_errors=True)
    src = random_file(shm / "src.img", SRC)
    cp = bg(["dd", f"if={src}", f"of={m.file}", "bs=1M", "conv=fsync"],
            shm / "cp.err")
    wait_progress(cp, written_bytes, 4 * MiB)
    k.kill()                           # the socket file stays: refused
    sa = wait_message(m, cp, "Connection refused")
    assert "connection 0 try" in sa["message"], sa
    assert "Connection refused" in sa["reconnect_error"], sa
    assert "the copy fails in" in sa["message"], sa
    print(sa["message"])
    k.sock.unlink()                    # now nothing is there
    sa = wait_message(m, cp, "No such file or directory")
    assert "No such file or directory" in sa["reconnect_error"], sa
    assert cp.wait(60) != 0, "dd exited 0 with the server gone"
    k.start()
    cp2 = bg(["dd", f"if={src}", f"of={m.file}", "bs=1M", "conv=fsync"],
             shm / "cp2.err")
    assert cp2.wait(120) == 0, f"{cp2.stderr}\n{m.stderr}"
    assert sha256_nbd(k.uri, SRC) == sha256_file(src)
    assert "reconnect_error" not in status_json(m)["server_answers"]
