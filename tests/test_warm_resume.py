"""Warm migration, resume (fs/warm.c, CHECKPOINTS): a copy whose daemon
is killed (SIGKILL) after about 60% of its data was acknowledged, and
whose server is then restarted (the file plugin keeps the data), is
started again on a new mount with the same command: it sends only the
blocks the manifest did not hold yet.  Checkpoints every 2 MiB here
(NBDFERRY_DEBUG_CHECKPOINT_BYTES), so at most that much (and the
pipeline) is sent twice.  Counted in bytes on nbdkit's request log; the
bytes on the server are checked against the source, and the resumed
pass's inline digest against nbdferry-verify SOURCE (the proof)."""

import os
import signal
import subprocess
import time

import pytest

from lib.copytools import log_mark, status
from lib.env import MiB
from lib.mounts import fusermount_u
from lib.procs import nonempty, wait_for
from lib.warm import (COPIES, inline_digest, make_source, sha256,
                      verify_digest, written)

SIZE = 64 * MiB


def restart(srv):
    """Stop nbdkit (if the kill did not already) and start it again with
    the same command: the same port, the same file."""
    if srv.proc.poll() is None:
        srv.proc.terminate()
        srv.proc.wait(30)
    os.unlink(srv.pidfile) if os.path.exists(srv.pidfile) else None
    if srv.sock and os.path.exists(srv.sock):
        os.unlink(srv.sock)       # as a service manager does: a new inode
    with open(srv.stderr, "ab") as errf:
        srv.proc = subprocess.Popen(srv.cmd, stdin=subprocess.DEVNULL,
                                    stdout=errf, stderr=errf)
    wait_for(nonempty(srv.pidfile), srv.proc, "nbdkit again", 30)


@pytest.mark.parametrize("tool,tcp", [("cp", True), ("dd_trunc", True),
                                      ("cp", False)],
                         ids=["cp-tcp", "dd_trunc-tcp", "cp-unix"])
def test_resume_after_kill(server, mount, shm, monkeypatch, tool, tcp):
    """Over TCP and over a Unix socket: the restarted server binds a new
    socket (another inode) at the same path, and the manifest, kept by
    the socket's path, is still found."""
    src = make_source(shm / "src.img", SIZE, fraction=0.5)
    disk = shm / "disk.img"
    with open(disk, "wb") as f:
        f.truncate(SIZE)
    srv = server("file", f"file={disk}", "wdelay=20ms", log=True, tcp=tcp,
                 filters=["delay"])
    monkeypatch.setenv("NBDFERRY_DEBUG_CHECKPOINT_BYTES", str(2 * MiB))
    m = mount(srv, "--request-size", "256K", expect_rc=None,
              expect_errors=True)
    with open(src, "rb") as f:
        data = sum(1 for blk in iter(lambda: f.read(64 << 10), b"")
                   if blk.strip(b"\0"))
    data *= 64 << 10
    cp = subprocess.Popen(COPIES[tool](src, m.file), stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
    wait_for(lambda: written(srv) >= 0.6 * data, cp,
             "60% of the data written to the server", 300)
    st = status(m)
    os.kill(m.pid, signal.SIGKILL)
    m.proc.wait(30)
    cp.wait(120)
    fusermount_u(m.mp)
    m.checked = True
    first = written(srv)
    assert cp.returncode != 0                 # the copy was cut short
    assert st["manifest"]["checkpoints"] >= 1, st["manifest"]
    restart(srv)

    monkeypatch.delenv("NBDFERRY_DEBUG_CHECKPOINT_BYTES")
    m2 = mount(srv)
    assert status(m2)["manifest"]["trust"] == "trusted"
    mark = log_mark(srv)
    r = subprocess.run(COPIES[tool](src, m2.file), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    wait_for(lambda: status(m2)["digest"]["state"] != "computing", m2.proc,
             "the inline digest", 60)
    st2 = status(m2)
    m2.unmount()
    second = written(srv, mark)
    assert sha256(disk) == sha256(src)
    # The part not yet durable at the kill, and the pipeline's worth.
    remaining = data - first
    assert second <= remaining + 2 * MiB + 4 * MiB, (
        f"{tool}: resumed pass wrote {second} B; {first} B written before "
        f"the kill, {data} B of data")
    assert st2["manifest"]["skipped_bytes"] > 0
    assert inline_digest(st2) == verify_digest(src), st2["digest"]
    print(f"{tool}: data {data}, before kill {first}, resumed {second}, "
          f"skipped {st2['manifest']['skipped_bytes']}")
