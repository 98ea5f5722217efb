"""The status is the state after the last copy.

A copy fails on a paused server; the server resumes, the mount heals, and
a second copy of the same image (without O_TRUNC, as qemu-img convert
-n or dd conv=notrunc do) lands byte-exact.  The status must then
describe that second copy: 100 % and settled, nothing "waiting" for an
acknowledgement (the failed copy's bytes were answered, with an error:
they are failed, not waiting), no failure marked unrepaired, and a
digest that is not "write-failed" (the failed ranges were written again);
the verdict at unmount says ok, as the status does.

Each copy is judged by sha256 of what the server holds."""

import json
import os
import signal
import time

from lib.digest import sha256_file
from lib.env import MiB
from lib.faults import status_json, wait_progress, written_bytes
from lib.images import random_file
from lib.nbd import sha256_nbd

SRC = 32 * MiB
FAST = ("--request-timeout", "2", "--retry-timeout", "3",
        "--request-size", "512K", "--pool-size", "8M")


def dd(bg, shm, src, dst, name):
    return bg(["dd", f"if={src}", f"of={dst}", "bs=1M",
               "conv=notrunc,fsync"], shm / f"{name}.err")


def test_status_after_failed_copy_heal_and_recopy(kit, mount, shm, bg):
    k = kit("srv", ["--filter=delay", "memory", f"size={96 * MiB}",
                    "wdelay=20ms"])
    m = mount(k.target, *FAST, expect_rc=None, expect_errors=True)
    src = random_file(shm / "src.img", SRC)
    cp = dd(bg, shm, src, m.file, "cp1")
    wait_progress(cp, written_bytes, 12 * MiB)
    os.kill(k.proc.pid, signal.SIGSTOP)
    try:
        assert cp.wait(120) != 0, "dd exited 0 on a paused server"
        st = status_json(m)
        assert st["progress"]["failed"], st["progress"]
        assert st["bytes_written"] > st["bytes_acknowledged"], st
    finally:
        os.kill(k.proc.pid, signal.SIGCONT)
    time.sleep(1)                      # the server answers what it held
    cp2 = dd(bg, shm, src, m.file, "cp2")
    assert cp2.wait(120) == 0, f"{cp2.stderr}\n{m.stderr}"
    assert sha256_nbd(k.uri, SRC) == sha256_file(src)

    # The status settles once the close has drained: wait on that state.
    deadline = time.monotonic() + 30
    while True:
        st = status_json(m)
        if st["progress"]["settled"] or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    p = st["progress"]
    assert p["settled"], json.dumps(st)
    assert p["percent"] == 100.0 and not p["failed"], p
    assert p["written"] == SRC and p["acknowledged"] == SRC, p
    assert st["in_flight"] == 0, st
    assert st["bytes_unacknowledged"] == 0, \
        ("bytes that failed are shown as waiting", st["bytes_written"],
         st["bytes_acknowledged"], st.get("bytes_failed"))
    assert st["bytes_failed"] > 0, st      # the first copy's, kept apart
    assert not st["damage"]["unrepaired"], st["damage"]
    assert st["server_answers"]["state"] == "healed", st["server_answers"]
    d = st["digest"]
    assert d["state"] != "write-failed", d
    if d["state"] == "complete":
        assert d["value"] == sha256_file(src), d
    rc = m.unmount(check=False)
    m.checked = True
    assert rc == 0, m.stderr
    assert "nbd: ok:" in m.stderr, m.stderr
