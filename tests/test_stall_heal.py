"""A paused server that resumes, a server that comes back, a server that
changed: what the mount does with them.

- Paused (SIGSTOP) mid-copy: the status shows the late replies at once
  ("no reply for N s from the server", with the time left); the copy
  fails no earlier than --request-timeout + --retry-timeout after the
  pause; on SIGCONT Debian's nbdkit 1.32 survives (the daemon never
  closed a connection with requests outstanding under it: that server
  aborts when a client does), still serves, and its memory disk holds
  what the mount copies next.
- The mount heals: after the loss, the next open tries the server again;
  a new copy lands byte-exact without a remount and the status says when
  it healed.  The same after a restart on the same socket.
- A mount that cannot heal (--command) says so in the status and the log.
- A reconnect refuses a server whose read-only flag or FUA changed.
- Reads on a lost connection fail with EIO, not ENOTCONN.
- A copy of blocks the manifest knows unchanged, onto a server still
  gone, fails (nothing is skipped while the server is given up on).

Every copy is judged by sha256 of what the server holds.  The measured
times (fail, heal) are printed, never asserted against a maximum."""

import errno
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from lib.digest import sha256_file
from lib.env import TOP, MiB
from lib.faults import (children, judge, sha256_mount, status_json,
                        wait_progress, written_bytes)
from lib.images import random_bytes, random_file
from lib.nbd import sha256_nbd
from lib.servers import plugin_path

TOOL = TOP / "tools" / "status" / "nbdferry-status"
EXPORT = 96 * MiB
SRC = 32 * MiB
REQ_T, RETRY_T = 2, 3                  # --request-timeout, --retry-timeout
FAST = ("--request-timeout", str(REQ_T), "--retry-timeout", str(RETRY_T),
        "--request-size", "512K")


def memory_kit(kit, params=(), name="mem", tcp=False):
    """nbdkit memory with a write delay: a copy is still running when the
    test acts."""
    return kit(name, ["--filter=delay", "memory", f"size={EXPORT}",
                      "wdelay=4ms", *params], tcp=tcp)


def nbdkit_alive(k):
    """The server still runs and did not abort (its stderr holds nbdkit's
    assertion message if it did)."""
    assert k.proc.poll() is None, \
        f"nbdkit exited ({k.proc.returncode}):\n{k.stderr.read_text()}"
    assert "Assertion" not in k.stderr.read_text(), k.stderr.read_text()


def copy(bg, shm, src, dst, name="cp", conv="fsync"):
    """dd of the source onto dst (conv: dd's).  conv "rsync": rsync
    --inplace instead, which opens dst itself (no O_TRUNC) and writes
    that one descriptor: dd's of= (and a shell's redirection) opens the
    file, dup2()s it and closes the first descriptor, and that close,
    whose error nobody checks, takes a failure meant for the copy."""
    if conv == "rsync":
        return bg(["rsync", "--inplace", "-I", str(src), str(dst)],
                  shm / f"{name}.err")
    return bg(["dd", f"if={src}", f"of={dst}", "bs=1M", f"conv={conv}"],
              shm / f"{name}.err")


def status_tool(m):
    """nbdferry-status's summary of the mount."""
    r = subprocess.run([sys.executable, str(TOOL), str(m.mp)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout


def watch_status(m, until, secs=60):
    """Poll the status every 0.1 s until until() is true; returns the
    (elapsed, server_answers) samples and nbdferry-status's summary at
    the first late one."""
    t0, seen, summary = time.monotonic(), [], None
    while not until():
        assert time.monotonic() - t0 < secs, "gave up waiting"
        st = status_json(m)
        if st:
            seen.append((time.monotonic() - t0, st["server_answers"]))
            if summary is None and st["server_answers"]["state"] in (
                    "late", "stalled"):
                summary = status_tool(m)
        time.sleep(0.1)
    return seen, summary


def healed_copy(bg, shm, m, k, src, tally, case, conv="fsync"):
    """A new copy onto the mount after a loss: lands byte-exact (through
    the mount and on the server), and the status says healed.  Returns
    the seconds the copy took, healing included."""
    t0 = time.monotonic()
    cp = copy(bg, shm, src, m.file, "cp2", conv)
    rc = cp.wait(120)
    took = time.monotonic() - t0
    out = judge(tally, case, rc, src, sha256_nbd(k.uri, SRC),
                sha256_mount(m.file, SRC), cp.stderr)
    assert out == "match", f"rc {rc}\n{cp.stderr}\n{m.stderr}"
    sa = status_json(m)["server_answers"]
    assert sa["state"] == "healed", sa
    assert sa["heals"] >= 1 and sa["healed_at"], sa
    assert re.match(r"healed at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", sa["message"]), sa
    assert "the mount is healed" in m.stderr, m.stderr
    return took


@pytest.mark.parametrize("direction,tcp", [("write", False), ("read", False),
                                           ("read", True)],
                         ids=["write", "read", "read-tcp"])
def test_stall_paused_resumed_server_survives_and_mount_heals(
        kit, mount, shm, bg, tally, direction, tcp):
    """Paused mid-copy (onto the mount, or out of it: nbdkit 1.32 aborts
    on resume when a client closed with read replies pending), resumed
    once the copy failed: the server survives with its disk intact, and
    the next copy through the same mount lands byte-exact.  In the read
    cases the loss was found by the read-ahead and the next copy's writes
    are all found unchanged by the manifest (nothing is sent): the open
    must still try the server again, or every later read fails EIO."""
    k = memory_kit(kit, params=["rdelay=4ms", "wdelay=20ms"], tcp=tcp)
    # One connection: reads pile up on it (a deep read-ahead), writes go
    # two at a time, so the copy is still running at the pause.
    depth = ["--depth", "2"] if direction == "write" else []
    m = mount(k.target, *FAST, "-C", "1", "--readahead", "64M", *depth,
              expect_rc=None, expect_errors=True)
    src = random_file(shm / "src.img", SRC)
    if direction == "read":
        prep = copy(bg, shm, src, m.file, "prep")
        assert prep.wait(120) == 0, prep.stderr
        assert sha256_nbd(k.uri, SRC) == sha256_file(src)
        cp = bg(["dd", f"if={m.file}", f"of={shm / 'out.img'}", "bs=1M",
                 f"count={SRC // MiB}"], shm / "cp.err")
        wait_progress(cp, written_bytes, 4 * MiB)
    else:
        cp = copy(bg, shm, src, m.file)
        wait_progress(cp, written_bytes, 8 * MiB)
    os.kill(k.proc.pid, signal.SIGSTOP)
    t_pause = time.monotonic()
    try:
        seen, summary = watch_status(m, lambda: cp.poll() is not None)
        t_fail = time.monotonic() - t_pause
        rc = cp.returncode
        if direction == "write":
            judge(tally, "paused-resumed", rc, src, "0" * 64, None, cp.stderr)
        assert rc != 0, f"dd exited 0 on a paused server\n{m.stderr}"
        assert "Input/output error" in cp.stderr, cp.stderr
        # Never before the documented time (the last reply came at most a
        # few milliseconds before the pause).
        assert t_fail >= REQ_T + RETRY_T - 0.2, (t_fail, m.stderr)
        late = [(t, s) for t, s in seen if s["state"] in ("late", "stalled")]
        assert late, f"the status never showed the stall: {seen}"
        t_seen, first = late[0]
        assert re.match(r"no reply for \d+ s from the server .* the copy "
                        r"fails in \d+ s unless it answers", first["message"]), first
        assert 0 <= first["fails_in_s"] <= REQ_T + RETRY_T, first
        assert re.search(r"^  server +(late|stalled): no reply for \d+ s from the "
                         r"server", summary or "", re.M), summary
        lost = status_json(m)["server_answers"]
        assert lost["state"] == "lost" and lost["lost_at"], lost
        assert "the next open or write tries it again" in lost["message"], lost
    finally:
        os.kill(k.proc.pid, signal.SIGCONT)
    print(f"paused server ({direction}): stall shown after {t_seen:.1f} s, "
          f"copy failed after {t_fail:.1f} s (documented: {REQ_T} + "
          f"{RETRY_T} s)")
    time.sleep(1)                      # the server answers what it held
    nbdkit_alive(k)
    if direction == "read":            # the disk is intact
        assert sha256_nbd(k.uri, SRC) == sha256_file(src)
    took = healed_copy(bg, shm, m, k, src, tally, "paused-resumed-healed")
    nbdkit_alive(k)
    print(f"resumed server: the next copy (healing included) took {took:.1f} s")
    m.unmount(check=False)
    m.checked = True


def test_unchanged_copy_onto_a_server_still_lost_fails(kit, mount, shm, bg,
                                                       tally):
    """A copy landed; the server dies and stays down; a read finds it gone
    (the mount gives it up).  The same copy again, whose every block the
    manifest knows unchanged, must not exit 0: nobody reached the server
    (the open's try fails, and the writes are sent so that they fail)."""
    k = memory_kit(kit)
    m = mount(k.target, *FAST, "-C", "1", expect_rc=None, expect_errors=True)
    src = random_file(shm / "src.img", SRC)
    cp = copy(bg, shm, src, m.file)
    assert cp.wait(120) == 0, cp.stderr
    assert sha256_nbd(k.uri, SRC) == sha256_file(src)
    k.kill()
    # A read (the copy left nothing in the read-ahead) finds it gone.
    with open(m.file, "rb", buffering=0) as f:
        try:
            f.seek(8 * MiB)
            f.read(MiB)
        except OSError as e:
            assert e.errno == errno.EIO, e
    from lib.procs import wait_for
    wait_for(lambda: status_json(m)["server_answers"]["state"] == "lost",
             m.proc, "the server given up on", 60)
    again = copy(bg, shm, src, m.file, "again")
    rc = again.wait(120)
    judge(tally, "unchanged-onto-lost", rc, src, "0" * 64, None,
          again.stderr)
    assert rc != 0, f"a copy onto a server still gone exited 0\n{m.stderr}"
    assert status_json(m)["manifest"]["skipped_bytes"] == 0
    m.unmount(check=False)
    m.checked = True


def restart_heal(k, m, shm, bg, tally, conv, skip=0):
    """The server dies mid-copy and stays down past the retry window: the
    copy fails; started again on the same socket, the next copy onto the
    same mount (conv: dd's) lands byte-exact, and the unmount's verdict
    is that every range the failed copy left wrong was written again.
    skip: the failed copy writes the source from this MiB on (in place),
    the healed one all of it."""
    src = random_file(shm / "src.img", SRC)
    cp = bg(["dd", f"if={src}", f"of={m.file}", "bs=1M", f"skip={skip}",
             f"seek={skip}", "conv=" + ("notrunc,fsync" if skip else "fsync")],
            shm / "cp.err")
    # Some writes acknowledged (what the restart loses), the copy still
    # running: the state is waited on, never a time.
    deadline = time.monotonic() + 60
    while (status_json(m) or {}).get("bytes_acknowledged", 0) < 2 * MiB:
        assert cp.poll() is None, "the copy ended before the kill"
        assert time.monotonic() < deadline, status_json(m)
        time.sleep(0.005)
    k.kill()
    assert cp.poll() is None, "the copy ended before the kill"
    t0 = time.monotonic()
    rc = cp.wait(60)
    t_fail = time.monotonic() - t0
    judge(tally, "restart-heal-first", rc, src, "0" * 64, None, cp.stderr)
    assert rc != 0, m.stderr
    assert t_fail >= RETRY_T - 0.2, t_fail
    # Still down: a write fails at once, and says the next one tries again.
    fd = os.open(m.file, os.O_WRONLY)
    try:
        os.pwrite(fd, b"x" * 4096, 0)
        os.fsync(fd)
        raise AssertionError("a write succeeded with the server down")
    except OSError as e:
        assert e.errno == errno.EIO, e
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
    assert re.search(r"the server was given up on at .*; trying again: "
                     r".*the next open or write tries again", m.stderr), m.stderr
    k.start()
    t1 = time.monotonic()
    took = healed_copy(bg, shm, m, k, src, tally, "restart-healed", conv)
    print(f"restarted server: copy failed {t_fail:.1f} s after the kill; "
          f"healed copy took {took:.1f} s ({time.monotonic() - t1:.1f} s "
          f"after the restart)")
    st = status_json(m)
    # The healed copy rewrote every range the failed one left wrong (and
    # those acknowledged before the loss, counted lost at the heal): the
    # verdict is that nothing was left unrepaired.
    assert m.unmount(check=True) == 0
    assert re.search(r"every range they left wrong was written again", m.stderr), \
        m.stderr
    return st


@pytest.mark.parametrize("conv", ["fsync", "notrunc,fsync"])
def test_stall_heal_after_restart_on_same_socket(kit, mount, shm, bg, tally,
                                                 conv):
    """A RAM disk (nbdkit memory) restarted empty: the writes it
    acknowledged and no flush covered are kept and sent again after the
    heal, and the next copy lands byte-exact (restart_heal)."""
    k = memory_kit(kit, params=["wdelay=20ms"])
    # Two requests at a time: the copy is still running at the kill.
    m = mount(k.target, *FAST, "-C", "1", "--depth", "2", expect_rc=0,
              expect_errors=True)
    st = restart_heal(k, m, shm, bg, tally, conv)
    # Kept and sent again (no flush came before the kill: one is due only
    # when half the pool's buffers are kept, 32 MiB here, or after 10 s).
    assert st["bytes_resent"] > 0, st


@pytest.mark.parametrize("conv", ["fsync", "notrunc,fsync", "rsync"])
def test_stall_heal_counts_lost_writes_before_the_next_copy(
        kit, mount, shm, bg, tally, conv):
    """A server that offers no NBD flush (the flushfail test plugin,
    no-flush=1) restarted: no write it acknowledged was ever covered by a
    flush, so none is kept to send again and all of them count lost (NBD
    cannot tell this server from a RAM disk).  The failed copy wrote the
    source's second half; the healed one writes all of it, through a
    4 MiB pool, so its first replies come long before it rewrites the
    lost range.  The heal counts as a reconnect: the lost writes are
    counted before that copy's handle takes its error sequence (damage
    the copy then repairs), and the copy succeeds (also without O_TRUNC,
    whose open would count them on its own: conv=notrunc; and rsync
    --inplace, which has no close of its own to take the error and hide
    it, as dd has: see copy()).  Counted after it (at the
    copy's first reply, or when a connection reconnects on its own), the
    copy is told EIO for writes it makes again (mutants
    error-seq-before-lost-counted, heal-not-a-reconnect)."""
    disk = shm / "disk.img"
    with open(disk, "wb") as f:
        f.truncate(EXPORT)
    k = kit("noflush", ["--filter=delay", plugin_path("flushfail"),
                        f"file={disk}", f"flag={shm / 'never'}",
                        "no-flush=1", "wdelay=100ms"])
    m = mount(k.target, *FAST, "-C", "1", "--depth", "2", "--pool-size",
              "4M", expect_rc=0, expect_errors=True)
    st = restart_heal(k, m, shm, bg, tally, conv, skip=SRC // MiB // 2)
    # The case really was writes counted lost, none sent again.
    assert st["bytes_resent"] == 0, st
    lost = [f for f in st["failures"] if f.get("lost_at_reconnect")]
    assert lost and all(f["offset"] >= SRC // 2 and f["repaired"]
                        for f in lost), lost


def test_stall_command_mode_cannot_heal_says_so(mount, shm, bg, tally):
    """--command: the server the daemon started pauses; the copy fails;
    the status and every failed write's log line say this mount cannot
    reconnect and must be mounted again."""
    cmd = ["--command", "nbdkit", "-s", "--exit-with-parent",
           "--filter=delay", "memory", f"size={EXPORT}", "wdelay=4ms"]
    m = mount(cmd, *FAST, expect_rc=None, expect_errors=True)
    kids = children(m.pid)
    assert kids, "no server process under the daemon"
    src = random_file(shm / "src.img", SRC)
    cp = copy(bg, shm, src, m.file)
    wait_progress(cp, written_bytes, 8 * MiB)
    for c in kids:
        os.kill(c, signal.SIGSTOP)
    try:
        rc = cp.wait(60)
        judge(tally, "command-cannot-heal", rc, src, "0" * 64, None,
              cp.stderr)
        assert rc != 0
        cp2 = copy(bg, shm, src, m.file, "cp2")
        assert cp2.wait(60) != 0
        sa = status_json(m)["server_answers"]
        assert sa["state"] == "lost" and not sa["can_heal"], sa
        assert "cannot reconnect" in sa["message"], sa
        assert "unmount and mount again" in sa["message"], sa
        assert re.search(r"this mount cannot reconnect .*unmount and mount "
                         r"again", m.stderr), m.stderr
    finally:
        for c in kids:
            os.kill(c, signal.SIGCONT)
    m.unmount(check=False)
    m.checked = True


def test_stall_reads_on_lost_connection_are_eio(kit, mount, shm):
    """The server dies: a read waits for the retry window, then fails with
    EIO (not ENOTCONN), and so do the reads after it."""
    k = memory_kit(kit)
    m = mount(k.target, "--retry-timeout", "1", "--readahead", "0",
              expect_rc=None, expect_errors=True)
    with open(m.file, "r+b") as f:     # data: not answered from the
        f.seek(8 * MiB)                # known-zero map
        f.write(random_bytes(MiB))
        os.fsync(f.fileno())
    k.kill()
    for _ in range(2):
        fd = os.open(m.file, os.O_RDONLY)
        try:
            os.pread(fd, 65536, 8 * MiB)
            raise AssertionError("a read succeeded with the server gone")
        except OSError as e:
            assert e.errno == errno.EIO, e
        finally:
            os.close(fd)
    m.unmount(check=False)
    m.checked = True


def test_stall_reconnect_refuses_changed_server(kit, mount, shm, bg, tally):
    """The server restarts read-only, then with other block sizes: the reconnection
    (and the try to heal) is refused with the reason in the log, and the
    write fails; the server's disk is not written."""
    k = memory_kit(kit)
    m = mount(k.target, "--retry-timeout", "2", expect_rc=1,
              expect_errors=True)
    data = random_bytes(MiB)
    plain = ["--filter=delay", "memory", f"size={EXPORT}", "wdelay=4ms"]
    for i, (extra, args, why) in enumerate([
            (["-r"], plain, "the export is now read-only"),
            # Not the multi-conn filter: nbdkit 1.32's aborts in its
            # finalize (h->group) when a client leaves after the handshake.
            ([], ["--filter=delay", "--filter=blocksize-policy", "memory",
                  f"size={EXPORT}", "wdelay=4ms",
                  "blocksize-minimum=4096", "blocksize-preferred=65536",
                  "blocksize-maximum=1048576"],
             "the block sizes")]):
        k.kill()
        k.extra, k.args = extra, args
        k.start()
        fd = os.open(m.file, os.O_WRONLY)
        try:
            os.pwrite(fd, data, i * MiB)
            os.fsync(fd)
            raise AssertionError(f"a write landed on a changed server "
                                 f"({why})")
        except OSError as e:
            assert e.errno == errno.EIO, e
        finally:
            try:
                os.close(fd)
            except OSError:
                pass
        assert re.search(r"refusing the server.*" + re.escape(why),
                         m.stderr), m.stderr
        nbdkit_alive(k)
    m.unmount(check=False)
    m.checked = True
