"""`nbdferry --unmount MNT`: unmount, wait for the daemon's final drain
and flush, print its verdict and exit with its status; `--log-file`.

A copy's verdict (the failed ranges, the inline digest) is known only
after the unmount's final flush, when fusermount3 -u has long returned.
--unmount waits for it and prints it: a good copy exits 0 with the
digest (blkhash by default, sha256sum's with --digest=sha256); a server that fails every
write exits 1 naming the failed range.  A background daemon (no -f) is
found through its status file.  --log-file gets every line with a time
stamp, daemon or not, and refuses a planted symlink or hard link; it gets
the verdict ("verdict: nbd: ok: ...", the digest) whether the mount is
unmounted with --unmount, fusermount3 -u or fusermount3 -u -z, and a
FAILED verdict says "digest: none (the copy failed)", never a digest.

Run: /usr/bin/python3 -m pytest tests/test_unmount_verdict.py
"""

import os

import pytest

from lib.digest import blkhash_file, sha256_file
from lib.env import MiB, daemon_cmd
from lib.images import random_file
from lib.mounts import is_mounted
from lib.nbd import sha256_nbd
from lib.procs import pid_alive, run, wait_for

EXPORT = 32 * MiB


def unmount(mp):
    return run(daemon_cmd("--unmount", mp), timeout=120)


def test_unmount_prints_the_verdict(server, mount, shm):
    srv = server("memory", f"size={EXPORT}")
    m = mount(srv, "--digest=sha256")
    src = random_file(shm / "src.img", 5 * MiB + 123)
    run(["cp", str(src), str(m.file)], check=True)
    r = unmount(m.mp)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert not is_mounted(m.mp)
    assert m.proc.poll() is not None, "--unmount returned before the exit"
    assert f"nbd: ok: {5 * MiB + 123} bytes written" in r.stdout, r.stdout
    assert f"digest: sha256 {sha256_file(src)} of {5 * MiB + 123} bytes" \
        in r.stdout, r.stdout
    m.check(m.wait_exit())


def test_unmount_failed_writes_exit_1(server, mount, shm):
    srv = server("memory", f"size={EXPORT}", "error-pwrite=EIO",
                 "error-pwrite-rate=100%", filters=["error"])
    m = mount(srv, "--retry-timeout", "0", expect_rc=1, expect_errors=True)
    src = random_file(shm / "src.img", 3 * MiB)
    assert run(["cp", str(src), str(m.file)]).returncode != 0
    r = unmount(m.mp)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "nbd: FAILED" in r.stdout, r.stdout
    assert "failed: write of" in r.stdout and "Input/output error" in \
        r.stdout, r.stdout
    m.check(m.wait_exit())


def test_background_daemon_and_log_file(server, shortdir, shm):
    """No -f: the command returns once mounted; --unmount finds the daemon
    through the status file, and the log file holds its lines."""
    srv = server("memory", f"size={EXPORT}")
    mp = shortdir / "bg"
    mp.mkdir()
    log = shortdir / "daemon.log"
    r = run(daemon_cmd("-v", "--log-file", log, mp, srv.uri), timeout=60)
    assert r.returncode == 0, r.stderr
    try:
        assert is_mounted(mp)
        src = random_file(shm / "src.img", 2 * MiB)
        run(["cp", str(src), str(mp / "nbd")], check=True)
    finally:
        r = unmount(mp)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert f"digest: blkhash/sha256/65536 {blkhash_file(src)}" in r.stdout, \
        r.stdout
    assert not is_mounted(mp)
    assert (os.stat(log).st_mode & 0o777) == 0o600
    text = log.read_text()
    assert "nbdferry[" in text and f"{mp}: " in text, text
    assert "unmounted:" in text, text            # the line after the flush


def test_log_file_never_follows_a_link(server, shortdir):
    srv = server("memory", f"size={EXPORT}")
    target = shortdir / "victim"
    target.write_text("keep\n")
    for kind in ("symlink", "hardlink"):
        link = shortdir / f"log-{kind}"
        (os.symlink if kind == "symlink" else os.link)(target, link)
        mp = shortdir / f"mnt-{kind}"
        mp.mkdir()
        r = run(daemon_cmd("-f", "--log-file", link, mp, srv.uri),
                timeout=60)
        assert r.returncode != 0 and "--log-file" in r.stderr, r.stderr
        assert "link" in r.stderr, r.stderr
        assert not is_mounted(mp)
    assert target.read_text() == "keep\n"


def test_unmount_of_a_busy_or_foreign_directory(server, mount, shortdir):
    r = unmount(shortdir)
    assert r.returncode == 1 and "nbdferry mount" in r.stderr, r.stderr
    srv = server("memory", f"size={EXPORT}")
    m = mount(srv)
    with open(m.file, "rb"):
        r = unmount(m.mp)
        assert r.returncode == 1 and "still mounted" in r.stderr, r.stderr
    assert is_mounted(m.mp)


def test_unmount_file_mode_with_pidfile(server, shortdir, shm):
    """A file-mode mount has no status file: -P names the daemon."""
    srv = server("memory", f"size={EXPORT}")
    disk = shortdir / "disk.raw"
    disk.write_bytes(b"")
    pidfile = shortdir / "d.pid"
    r = run(daemon_cmd("-P", pidfile, disk, srv.uri), timeout=60)
    assert r.returncode == 0, r.stderr
    try:
        src = random_file(shm / "src.img", 3 * MiB)
        run(["cp", str(src), str(disk)], check=True)
        r = unmount(disk)                     # no status beside a file
        assert r.returncode == 1 and "-P PIDFILE" in r.stderr, r.stderr
        assert is_mounted(disk)
    finally:
        r = run(daemon_cmd("-P", pidfile, "--unmount", disk), timeout=120)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert f"digest: blkhash/sha256/65536 {blkhash_file(src)}" in r.stdout, \
        r.stdout
    assert not is_mounted(disk)


def background(srv, shortdir, name, *opts):
    """A daemon (no -f, no -v) with --log-file and -P; (mp, log, pid)."""
    mp = shortdir / name
    mp.mkdir()
    log, pidfile = shortdir / f"{name}.log", shortdir / f"{name}.pid"
    r = run(daemon_cmd("--log-file", log, "-P", pidfile, *opts, mp, srv.uri),
            timeout=60)
    assert r.returncode == 0, r.stderr
    return mp, log, int(pidfile.read_text())


def unmount_by(way, mp, pid):
    """Unmount as a user would; returns what --unmount printed ("" for
    fusermount3), once the daemon has exited."""
    if way == "--unmount":
        r = unmount(mp)
    else:
        r = run(["fusermount3", *way.split()[1:], mp], timeout=60)
        assert r.returncode == 0, r.stderr
    wait_for(lambda: not pid_alive(pid), what="the daemon's exit",
             timeout=120)
    return r.stdout if way == "--unmount" else ""


WAYS = ["--unmount", "fusermount3 -u", "fusermount3 -u -z"]


@pytest.mark.parametrize("way", WAYS)
def test_log_file_gets_the_verdict(server, shortdir, shm, way):
    """Without syslog the log file is the daemon's last words: the verdict
    (ok, the bytes, the digest) reaches it whoever unmounts."""
    srv = server("memory", f"size={EXPORT}")
    mp, log, pid = background(srv, shortdir, "ok")
    src = random_file(shm / "src.img", 3 * MiB + 5)
    run(["cp", str(src), str(mp / "nbd")], check=True)
    unmount_by(way, mp, pid)
    assert not is_mounted(mp)
    text = log.read_text()
    assert (f"notice: verdict: nbd: ok: {3 * MiB + 5} bytes written, "
            f"{3 * MiB + 5} acknowledged by the server, 0 request(s) "
            "failed; final flush done") in text, text
    assert (f"notice: verdict: digest: blkhash/sha256/65536 "
            f"{blkhash_file(src)} of {3 * MiB + 5} bytes") in text, text
    assert "FAILED" not in text, text
    assert sha256_nbd(srv.uri, 3 * MiB + 5) == sha256_file(src)


@pytest.mark.parametrize("way", WAYS)
def test_failed_verdict_has_no_digest_result(server, shortdir, shm, way):
    """A server that fails every write: the log file's verdict says FAILED
    and that there is no digest (what was written is not on the disk);
    --unmount prints the same and exits 1."""
    srv = server("memory", f"size={EXPORT}", "error-pwrite=EIO",
                 "error-pwrite-rate=100%", filters=["error"])
    mp, log, pid = background(srv, shortdir, "bad", "--retry-timeout", "0")
    src = random_file(shm / "src.img", 3 * MiB)
    assert run(["cp", str(src), str(mp / "nbd")]).returncode != 0
    out = unmount_by(way, mp, pid)
    text = log.read_bytes().decode()
    # Even the rate limit's last summary, after the options are freed.
    assert all(f"]: {mp}: " in l for l in text.splitlines()), text
    assert "notice: verdict: nbd: FAILED: " in text, text
    assert "notice: verdict: nbd: failed: write of" in text, text
    assert "notice: verdict: digest: none (the copy failed)" in text, text
    assert "digest: blkhash" not in text, text
    if way == "--unmount":
        assert "nbd: FAILED" in out and \
            "digest: none (the copy failed)" in out, out
        assert "digest: blkhash" not in out, out
