"""Memory stays bounded when the server is slower than the writer.

With a slow server (delay filter) and a small pool (--pool-size 8M), a
writer that produces data faster than the server accepts it must wait for
free buffers instead of the daemon buffering more.  Bound asserted: the
daemon's RSS (sampled during the copy, and VmHWM at the end) stays under
pool size + 64 MiB.  Skipped under valgrind or sanitizers, whose own memory
use would swamp the bound (the data checks still run there)."""

import os
import threading


from lib.content import assert_content
from lib.env import GiB, MiB, NBDFERRY, WRAPPER, timeout
from lib.images import random_file
from lib.mounts import RssSampler
from lib.procs import run
from lib.servers import PauseControl

POOL = 8 * MiB
BOUND = POOL + 64 * MiB


def instrumented():
    """True if the daemon runs under a wrapper or is a sanitizer build."""
    if WRAPPER:
        return True
    try:
        blob = NBDFERRY.read_bytes()
    except OSError:
        return False
    return b"__asan_init" in blob or b"__tsan_init" in blob


def check_bound(m, peak, what):
    hwm = m.rss()
    assert hwm is not None, "daemon gone before its memory was read"
    if instrumented():
        return
    assert peak < BOUND, (f"{what}: daemon RSS peaked at {peak >> 20} MiB, "
                          f"bound {BOUND >> 20} MiB (pool {POOL >> 20} MiB)")
    assert hwm[1] < BOUND, (f"{what}: daemon VmHWM {hwm[1] >> 20} MiB, "
                            f"bound {BOUND >> 20} MiB")


def test_backpressure_1gib_copy_small_pool(server, mount, shm):
    size = 1 * GiB
    srv = server("memory", f"size={size}", "wdelay=5ms", filters=["delay"])
    m = mount(srv, "--pool-size", "8M")
    src = random_file(shm / "src.img", size)
    with RssSampler(m) as s:
        r = run(["cp", src, m.file], timeout=600)
    assert r.returncode == 0, f"cp failed: {r.stderr}"
    assert s.samples > 0, "RSS never sampled"
    check_bound(m, s.peak, "1 GiB cp, wdelay=5ms")
    assert_content(src, size, mount_file=m.file, uri=srv.uri,
                   what="1 GiB copy")
    check_bound(m, s.peak, "after reading back 1 GiB")


def test_backpressure_writer_waits_while_server_paused(server, mount, shm,
                                                       shortdir):
    """Server paused, writer pushes 64 MiB into an 8 MiB pool: the daemon
    must not grow past the bound while the writer waits; once the server
    resumes, everything lands."""
    size = 128 * MiB
    ctl = shortdir / "pause.ctl"
    disk = shm / "disk.img"
    with open(disk, "wb") as f:
        f.truncate(size)
    srv = server("file", disk, f"pause-control={ctl}", filters=["pause"])
    m = mount(srv, "--pool-size", "8M")
    pause = PauseControl(ctl)
    data = os.urandom(64 * MiB)
    box = {}

    def writer():
        try:
            fd = os.open(m.file, os.O_RDWR)
            try:
                for i in range(0, len(data), MiB):
                    n = os.pwrite(fd, data[i:i + MiB], 16 * MiB + i)
                    assert n == MiB, f"short write {n} at {16 * MiB + i}"
            finally:
                os.close(fd)
            box["ok"] = True
        except BaseException as e:          # reported by the test body
            box["err"] = e

    t = threading.Thread(target=writer, daemon=True)
    pause.pause()
    resumed = False
    try:
        with RssSampler(m) as s:
            t.start()
            t.join(timeout(3))       # let the writer fill the pool and wait
            pause.resume()
            resumed = True
            t.join(timeout(120))
    finally:
        if not resumed:
            pause.resume()
    assert not t.is_alive(), "writer still blocked after the server resumed"
    assert "err" not in box, f"writer failed: {box.get('err')}"
    check_bound(m, s.peak, "64 MiB into a paused server")
    ref = bytes(16 * MiB) + data + bytes(size - 80 * MiB)
    assert_content(ref, size, mount_file=m.file, uri=srv.uri,
                   what="after resume")
