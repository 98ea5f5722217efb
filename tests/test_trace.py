"""-v prints one line per FUSE request (the requesting process, the
operation, the offset and length), so a user's log shows a copy tool's
exact pattern; without -v there is none."""
import re
import subprocess

from lib.content import assert_content
from lib.env import MiB
from lib.images import random_file

EXPORT = 16 * MiB


def trace_lines(text, pid):
    return [l for l in text.splitlines() if f"pid {pid}: " in l]


def copy_with_dd(m, src):
    dd = subprocess.Popen(["dd", f"if={src}", f"of={m.file}", "bs=1M",
                           "conv=fsync", "status=none"])
    assert dd.wait(120) == 0
    return dd.pid


def test_verbose_traces_every_request(server, mount, shm):
    srv = server("memory", f"size={EXPORT}")
    m = mount(srv, "-v")
    src = random_file(shm / "src.img", 3 * MiB)
    pid = copy_with_dd(m, src)
    assert_content(src, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=3 * MiB, what="dd under -v")
    m.unmount()
    lines = trace_lines(m.stderr, pid)
    writes = [l for l in lines if re.search(r": write ino=\d+ off=", l)]
    offs = sorted(int(re.search(r"off=(\d+)", l).group(1)) for l in writes)
    assert offs == [0, MiB, 2 * MiB], lines
    assert all(l.endswith(f"len={MiB}") for l in writes), writes
    for op in ("open", "fsync", "flush"):
        assert any(f": {op} ino=" in l for l in lines), (op, lines)
    # The kernel sends the release after dd's close, on no process's behalf.
    assert re.search(r"pid \d+: release ino=", m.stderr), m.stderr


def test_quiet_without_verbose(server, mount, shm):
    srv = server("memory", f"size={EXPORT}")
    m = mount(srv)
    src = random_file(shm / "src.img", 2 * MiB)
    pid = copy_with_dd(m, src)
    assert_content(src, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=2 * MiB, what="dd without -v")
    m.unmount()
    assert not trace_lines(m.stderr, pid), m.stderr
    assert ": write ino=" not in m.stderr
