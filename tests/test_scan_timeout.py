"""The block status scan at mount never leaves a dead mount behind.

A server whose block status never answers (nbdkit's delay filter holding
every extents request for an hour) used to overrun the scan's budget,
have its connection timed out for good, and still be mounted "ready",
failing every write.  Now the scan gives the server up once no reply has
come for --request-timeout (15 s at most), and the daemon either
connects again and mounts without the scan (a URI, --unix or --tcp
server: writes land byte-exact, the status says "timed out") or, where it
cannot connect again (a server it started itself), fails with one line
and nothing mounted."""

import os
import subprocess

from lib.copytools import status
from lib.env import MiB, daemon_cmd, timeout
from lib.images import random_bytes
from lib.mounts import is_mounted
from lib.nbd import fill_random, read_nbd, sha256_nbd

EXPORT = 64 * MiB
HUNG = ["--filter=delay", "memory", f"size={EXPORT}", "delay-extents=3600"]


def test_scan_without_reply_mounts_without_extents(server, mount):
    srv = server(*HUNG[1:], filters=["delay"])
    m = mount(srv, "--request-timeout", "2", expect_errors=True,
              ready_timeout=timeout(60))
    st = status(m)
    assert st["block_status_scan"] == "timed out", st["block_status_scan"]
    assert st["known_zero_bytes"] == 0
    data = random_bytes(4 * MiB + 5)
    with open(m.file, "r+b") as f:
        f.seek(3 * MiB + 1)
        f.write(data)
        os.fsync(f.fileno())
    assert read_nbd(srv.uri, 3 * MiB + 1, len(data)) == data
    assert read_nbd(srv.uri, 0, 3 * MiB + 1) == bytes(3 * MiB + 1)
    with open(m.file, "rb") as f:
        f.seek(3 * MiB + 1)
        assert f.read(len(data)) == data
    assert m.unmount(check=False) == 0
    lines = [l for l in m.stderr.splitlines() if l.strip()]
    assert any("block status" in l and "without it" in l for l in lines), \
        m.stderr


def test_scan_without_reply_fails_cleanly_when_it_cannot_reconnect(
        shortdir):
    mp = shortdir / "mp"
    mp.mkdir()
    pidfile = shortdir / "pid"
    cmd = daemon_cmd("-f", "-P", pidfile, "--request-timeout", "2", mp,
                     "[", "nbdkit", *HUNG, "]")
    try:
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL,
                           capture_output=True, text=True,
                           timeout=timeout(60))
    finally:
        if is_mounted(mp):
            subprocess.run(["fusermount3", "-u", "-z", str(mp)])
    assert p.returncode != 0, "exit 0 with a server that never answered"
    # The server [ CMD ] shares our stderr: its own lines may be cut into
    # ours ("nbdkit: nbdferry: error: ...", or its unfinished line glued
    # to ours: "...Broken pipenbdferry: error: ..."), so find ours
    # anywhere.  One error line; the stall's warning may come before it
    # (the scan's wait and the request timeout are the same 2 s).
    ours = [l[l.index("nbdferry: error: "):] for l in p.stderr.splitlines()
            if "nbdferry: error: " in l]
    assert len(ours) == 1, f"expected one error line, got:\n{p.stderr}"
    assert "block status" in ours[0] and "--no-extents" in ours[0], ours[0]
    assert not is_mounted(mp), "mounted although the daemon failed"
    assert not pidfile.exists() or not pidfile.read_text().strip(), \
        "pidfile written by a daemon that never became ready"


def test_scan_timeout_of_a_second_disk_reconnects_to_its_own_export(
        server, mount):
    """A mount of two disks on two servers; the second's block status
    never answers.  Its scan gives up, it connects again to its own
    export (not the first disk's) and mounts without the scan: bytes
    written to it land on its server, the first export is untouched."""
    size = 16 * MiB
    first = server("memory", f"size={size}")
    slow = server("memory", f"size={size}", "delay-extents=3600",
                  filters=["delay"])
    fill_random(first.uri, size)
    fill_random(slow.uri, size)
    first_before, slow_before = sha256_nbd(first.uri), sha256_nbd(slow.uri)
    m = mount([f"fast={first.uri}", f"slow={slow.uri}"], "--request-timeout",
              "2", raw="fast", expect_errors=True, ready_timeout=timeout(90))
    disks = {d["name"]: d for d in status(m)["disks"]}
    assert disks["slow"]["block_status_scan"] == "timed out", disks
    data = random_bytes(2 * MiB + 7)
    with open(m.mp / "slow", "r+b") as f:
        f.seek(MiB + 3)
        f.write(data)
        os.fsync(f.fileno())
    assert m.unmount(check=False) == 0
    assert read_nbd(slow.uri, MiB + 3, len(data)) == data
    assert sha256_nbd(slow.uri) != slow_before
    assert sha256_nbd(first.uri) == first_before
    assert any("block status" in l and "without it" in l
               for l in m.stderr.splitlines()), m.stderr
