"""One event, one warning; and a warning under -f --progress starts on
a cleared line.

A server paused past --request-timeout while a copy runs on four
connections is one event: "no reply from the server" is warned once, and
"the server answers again" once, not once per connection (the other
connections' lines are info, shown with -v).  The same for a server
killed and started again within --retry-timeout: "lost ... reconnecting"
and "reconnected" once each.

With -f --progress the bar is redrawn in place on stderr ("\\r[ 42.0%]
..."); a log line written while a bar is shown must not land on the end
of it: rendered as a terminal would (each "\\r" back to column 0,
overwriting), the line that ends with the log message holds the message
alone.

Every copy is checked by sha256 on the server."""

import os
import re
import signal
import time

from lib.digest import sha256_file
from lib.env import MiB
from lib.faults import wait_progress, written_bytes
from lib.images import random_file
from lib.nbd import sha256_nbd

SRC = 48 * MiB


def rendered_lines(err):
    """stderr as a terminal shows it: each line after its carriage
    returns overwrote it from column 0."""
    out = []
    for raw in err.split("\n"):
        cols = []
        for piece in raw.split("\r"):
            cols[:len(piece)] = list(piece)
        out.append("".join(cols).rstrip())
    return out


def paused_copy(kit, mount, shm, bg, *opts):
    k = kit("srv", ["--filter=delay", "memory", f"size={64 * MiB}",
                    "wdelay=30ms"])
    m = mount(k.target, "-C", "4", "--request-timeout", "2",
              "--retry-timeout", "30", "--request-size", "512K", *opts,
              expect_errors=True)
    src = random_file(shm / "src.img", SRC)
    cp = bg(["dd", f"if={src}", f"of={m.file}", "bs=1M", "conv=fsync"],
            shm / "cp.err")
    wait_progress(cp, written_bytes, 8 * MiB)
    os.kill(k.proc.pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 30
        while m.stderr.count("no reply from the server") == 0:
            assert time.monotonic() < deadline, m.stderr
            time.sleep(0.1)
        time.sleep(1.5)                # every connection is past its timeout
    finally:
        os.kill(k.proc.pid, signal.SIGCONT)
    assert cp.wait(120) == 0, f"{cp.stderr}\n{m.stderr}"
    assert sha256_nbd(k.uri, SRC) == sha256_file(src)
    m.unmount(check=False)
    m.checked = True
    return m


def test_log_paused_server_warned_once(kit, mount, shm, bg):
    m = paused_copy(kit, mount, shm, bg)
    warn = [l for l in m.stderr.splitlines() if ": warning: " in l]
    stalls = [l for l in warn if "no reply from the server" in l]
    answers = [l for l in warn if "answers again" in l]
    assert len(stalls) == 1, stalls
    assert len(answers) == 1, answers


def test_log_killed_server_warned_once(kit, mount, shm, bg):
    with open(shm / "disk.img", "wb") as f:   # kept across the restart
        f.truncate(64 * MiB)
    k = kit("srv", ["--filter=delay", "file", str(shm / "disk.img"),
                    "wdelay=30ms"])
    m = mount(k.target, "-C", "4", "--retry-timeout", "30",
              "--request-size", "512K", expect_errors=True, expect_rc=None)
    src = random_file(shm / "src.img", SRC)
    cp = bg(["dd", f"if={src}", f"of={m.file}", "bs=1M", "conv=fsync"],
            shm / "cp.err")
    wait_progress(cp, written_bytes, 8 * MiB)
    k.kill()
    time.sleep(1)
    k.start()
    cp.wait(120)                       # may fail: acknowledged, not flushed
    cp2 = bg(["dd", f"if={src}", f"of={m.file}", "bs=1M", "conv=fsync"],
             shm / "cp2.err")
    assert cp2.wait(120) == 0, f"{cp2.stderr}\n{m.stderr}"
    assert sha256_nbd(k.uri, SRC) == sha256_file(src)
    m.unmount(check=False)
    m.checked = True
    warn = [l for l in m.stderr.splitlines() if ": warning: " in l]
    lost = [l for l in warn if "was lost" in l]
    back = [l for l in warn if "reconnected after" in l]
    assert len(lost) == 1, lost
    assert len(back) == 1, back


def test_log_line_under_progress_bar_starts_clear(kit, mount, shm, bg):
    m = paused_copy(kit, mount, shm, bg, "--progress")
    err = m.stderr_path.read_bytes().decode()
    assert "\r[" in err, "no bar drawn"
    lines = rendered_lines(err)
    logged = [l for l in lines if re.search(r"nbdferry: (warning|error): ", l)]
    assert logged, err
    bad = [l for l in logged if not l.startswith("nbdferry: ")]
    assert not bad, f"log lines on the end of the bar: {bad[:3]}"
