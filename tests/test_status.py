"""The live status, MNT/.nbdferry-status, and tools/status/nbdferry-status.

The counters add up while a slow copy runs (acknowledged <= written, in
flight <= peak, buffers in use <= buffers) and agree after close
(acknowledged == written, nothing in flight); failed requests are listed
with their ranges; the nbdferry-status tool prints a summary and the JSON.
Every case also checks the bytes that landed."""

import errno
import json
import os
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from lib.content import assert_content
from lib.digest import blkhash_file, sha256_bytes
from lib.env import HAVE_FUSE, HAVE_NBDKIT, MiB, TOP, daemon_cmd, timeout
from lib.images import random_bytes, random_file
from lib.nbd import fill_random
from lib.procs import oserror_errno, run

pytestmark = pytest.mark.skipif(not (HAVE_FUSE and HAVE_NBDKIT),
                                reason="needs /dev/fuse and nbdkit")

EXPORT = 64 * MiB
TOOL = TOP / "tools" / "status" / "nbdferry-status"
# What the status file must hold: every key a monitor may rely on.
KEYS = ["export_size", "apparent_size", "bytes_written", "bytes_acknowledged",
        "bytes_zeroed", "in_flight", "in_flight_peak", "pool_buffers_in_use",
        "pool_buffers", "writer_wait_s", "nbd_requests", "errors", "warnings",
        "failures",
        "throughput", "connections", "digest", "progress"]


def status(m):
    return json.loads((m.mp / ".nbdferry-status").read_bytes())


def check_invariants(st):
    assert st["bytes_acknowledged"] <= st["bytes_written"], st
    assert st["bytes_unacknowledged"] == st["bytes_written"] - \
        st["bytes_acknowledged"] - st["bytes_failed"], st
    assert st["in_flight"] <= st["in_flight_peak"], st
    assert st["pool_buffers_in_use"] <= st["pool_buffers"], st
    assert st["apparent_size"] <= st["export_size"], st
    p = st["progress"]
    assert 0 <= p["done"] <= p["total"], p
    assert p["percent"] < 100 or p["settled"], p


def test_status_has_every_field(server, mount):
    srv = server("memory", f"size={EXPORT}")
    m = mount(srv)
    st = status(m)
    missing = [k for k in KEYS if k not in st]
    assert not missing, f"status lacks {missing}"
    assert st["export_size"] == EXPORT and st["apparent_size"] == EXPORT
    assert st["connections"] >= 1
    assert set(st["throughput"]) >= {"last_1s", "last_5s", "last_10s"}
    assert set(st["nbd_requests"]) >= {"read", "write", "zero", "flush"}
    assert st["digest"]["state"] == "idle"
    check_invariants(st)


def test_status_counters_add_up_during_slow_copy(server, mount, shm):
    """A writer pushes 24 MiB into a server that takes 50 ms per write;
    while it runs, the counters never claim more than was written, and
    acknowledged bytes trail written ones.  After close they are equal."""
    srv = server("memory", f"size={EXPORT}", "wdelay=50ms", filters=["delay"])
    m = mount(srv, "--digest=sha256", "--pool-size", "8M", "--request-size",
              "1M", "-C", "1", "--depth", "2")
    data = random_bytes(24 * MiB)
    done = threading.Event()
    box = {}

    def writer():
        try:
            with open(m.file, "wb", buffering=0) as f:   # O_TRUNC
                for i in range(0, len(data), MiB):
                    f.write(data[i:i + MiB])
                box["closing"] = status(m)
            box["closed"] = status(m)          # close() has returned
        except BaseException as e:
            box["err"] = e
        finally:
            done.set()

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    samples = []
    while not done.wait(0.03):
        st = status(m)
        check_invariants(st)
        samples.append(st)
    t.join()
    assert "err" not in box, box.get("err")
    assert any(s["bytes_acknowledged"] < s["bytes_written"] for s in samples), \
        "never saw unacknowledged bytes during a slow copy"
    assert any(s["in_flight"] > 0 for s in samples)
    assert max(s["throughput"]["last_1s"] for s in samples) > 0
    # 100% only once every byte is written and acknowledged (a sample may
    # land while close() drains, or after it returned).
    assert min(s["progress"]["percent"] for s in samples) < 100
    for s in samples:
        if s["progress"]["percent"] >= 100:
            assert s["bytes_written"] == s["bytes_acknowledged"] == len(data), s

    before = box["closing"]            # all written, close not yet called
    check_invariants(before)
    assert before["bytes_written"] == len(data)
    after = box["closed"]
    check_invariants(after)
    assert after["bytes_written"] == after["bytes_acknowledged"] == len(data)
    assert after["in_flight"] == 0 and after["bytes_unacknowledged"] == 0
    # What is left in use is acknowledged, kept only until the next NBD
    # flush covers it (sent again if the server restarts before).
    assert after["pool_buffers_in_use"] == after["pool_buffers_retained"]
    assert after["apparent_size"] == len(data)
    assert after["nbd_requests"]["write"] >= 24
    assert after["writer_wait_s"] > 0, "8M pool, 24M copy: writers waited"
    assert after["errors"] == 0 and after["failures"] == []
    d = after["digest"]
    # The digest may still be hashing just after close; wait for it.
    deadline = time.monotonic() + timeout(30)
    while d["state"] == "computing" and time.monotonic() < deadline:
        time.sleep(0.05)
        d = status(m)["digest"]
    assert d["state"] == "complete" and d["value"] == sha256_bytes(data)
    assert_content(data, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=len(data), what="slow copy")


def test_status_zero_runs_count_as_acknowledged(server, mount):
    """All-zero data from the copy tool becomes write-zeroes (or nothing)
    and still counts: acknowledged == written after close."""
    srv = server("memory", f"size={EXPORT}")
    fill_random(srv.uri, EXPORT)
    m = mount(srv)
    data = random_bytes(MiB) + bytes(8 * MiB) + random_bytes(MiB)
    with open(m.file, "wb") as f:
        f.write(data)
    st = status(m)
    check_invariants(st)
    assert st["bytes_written"] == st["bytes_acknowledged"] == len(data)
    assert st["bytes_zeroed"] >= 8 * MiB
    assert_content(data, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=len(data))


def test_status_lists_failed_ranges(server, mount, shortdir):
    """Writes fail once a trigger file exists: the status counts the
    errors, names each failed range, and the digest shows no value."""
    trigger = shortdir / "fail-now"
    srv = server("memory", f"size={EXPORT}", "error-pwrite=EIO",
                 "error-pwrite-rate=100%", f"error-pwrite-file={trigger}",
                 filters=["error"])
    m = mount(srv, expect_rc=None, expect_errors=True)
    good = random_bytes(4 * MiB)
    with open(m.file, "wb") as f:
        f.write(good)
    trigger.touch()
    fd = os.open(m.file, os.O_WRONLY)
    os.pwrite(fd, random_bytes(2 * MiB), 8 * MiB)   # write-back: accepted
    assert oserror_errno(os.close, fd) == errno.EIO, "close hid the failure"
    trigger.unlink()
    st = status(m)
    check_invariants(st)
    assert st["errors"] >= 1 and st["failures"], st
    nbd = [f for f in st["failures"] if f["kind"] not in ("error", "warning")]
    assert nbd, st["failures"]
    for f in nbd:
        assert f["kind"] == "write" and f["errno"] > 0
        assert f["message"] == os.strerror(f["errno"])
        assert 8 * MiB <= f["offset"] < 10 * MiB, f
        assert f["offset"] + f["length"] <= 10 * MiB, f
    assert st["bytes_acknowledged"] < st["bytes_written"]
    assert st["digest"]["state"] == "write-failed"
    assert "value" not in st["digest"]
    # The first 4 MiB landed.
    assert_content(good, 4 * MiB, uri=srv.uri, what="before the failure")


def test_status_tool(server, mount, shm):
    srv = server("memory", f"size={EXPORT}")
    m = mount(srv)                # the default digest: blkhash
    src = random_file(shm / "src.img", 3 * MiB)
    run(["cp", src, m.file], check=True)
    want = blkhash_file(src)
    # The digest thread may lag the close by a moment.
    deadline = time.monotonic() + timeout(30)
    while status(m)["digest"]["state"] == "computing" and \
            time.monotonic() < deadline:
        time.sleep(0.05)

    r = run(["/usr/bin/python3", TOOL, m.mp],
            check=True)
    out = r.stdout
    for word in ("progress", "acknowledged", "in flight", "throughput",
                 "requests", "digest", "errors"):
        assert word in out, f"{word!r} missing from:\n{out}"
    assert f"blkhash/sha256/65536 complete: {want}" in out, out
    assert "check with nbdferry-verify SOURCE" in out, out
    assert "100.0%" in out, out

    r = run(["/usr/bin/python3", TOOL, "--json", m.file], check=True)
    st = json.loads(r.stdout)
    assert st["bytes_written"] == st["bytes_acknowledged"] == 3 * MiB
    assert st["digest"]["value"] == want

    # --watch repeats until interrupted.
    p = subprocess.Popen(["/usr/bin/python3", TOOL, "--watch", "0.2", m.mp],
                         stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(timeout(1.5))
    finally:
        p.terminate()
        out, _ = p.communicate(timeout=10)
    assert out.count("nbdferry at ") >= 3, out

    r = run(["/usr/bin/python3", TOOL, shm])
    assert r.returncode == 1 and "nbdferry-status:" in r.stderr
    assert_content(src, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=3 * MiB)


def test_man_page_lists_every_option():
    """docs/nbdferry.1 documents every option that --help lists."""
    page = (Path(__file__).resolve().parent.parent / "docs" /
            "nbdferry.1").read_text().replace("\\-", "-")
    r = run(daemon_cmd("--help"), check=True)
    opts = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*|-[A-Za-z])\b", r.stdout))
    assert "--progress" in opts and "--no-digest" in opts
    missing = sorted(o for o in opts if o not in page)
    assert not missing, f"docs/nbdferry.1 lacks {missing}"


def test_status_shows_daemon_errors(server, mount, shm):
    """A refusal the daemon logs (a non-VHD written into nbd.vhd) is in the
    status (errors, failures with the message) and in nbdferry-status."""
    srv = server("memory", f"size={EXPORT}")
    m = mount(srv, expect_errors=True)
    st = status(m)
    assert st["errors"] == 0 and st["warnings"] == 0 and st["failures"] == []
    junk = random_file(shm / "junk.bin", MiB)
    for _ in range(3):
        assert run(["cp", junk, m.mp / "nbd.vhd"]).returncode != 0
    st = status(m)
    assert st["errors"] == 3, st
    (f,) = st["failures"]                   # one entry, repeated 3 times
    assert f["kind"] == "error" and f["repeated"] == 3, f
    assert "not a dynamic or differencing VHD" in f["message"], f
    assert f["time"] <= f["last_time"] <= time.time() + 1, f
    out = run(["/usr/bin/python3", TOOL, m.mp], check=True).stdout
    assert "errors      3" in out, out
    assert "error (x3): nbd.vhd: not a dynamic or differencing VHD" in out, out


def test_status_tool_names_the_unreadable_mountpoint(server, mount):
    """Another user's mount (no allow_other): the tool names the
    mountpoint and says why, not a file beside it."""
    srv = server("memory", f"size={EXPORT}")
    m = mount(srv)
    os.chmod(m.mp.parent, 0o755)
    r = run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
             "/usr/bin/python3", TOOL, m.mp])
    assert r.returncode == 1, r
    assert r.stderr.startswith(f"nbdferry-status: {m.mp}: Permission denied"), \
        r.stderr
    assert "allow_other" in r.stderr, r.stderr


def test_status_tool_on_a_dead_mount(server, mount):
    """kill -9 leaves a dead mount: the tool says so and how to clear it."""
    srv = server("memory", f"size={EXPORT}")
    m = mount(srv, expect_rc=None, expect_errors=True)
    m.proc.kill()
    m.proc.wait(10)
    r = run(["/usr/bin/python3", TOOL, m.mp])
    assert r.returncode == 1
    assert r.stderr.startswith(
        f"nbdferry-status: {m.mp}: Transport endpoint is not connected"), \
        r.stderr
    assert "fusermount3 -u" in r.stderr, r.stderr
