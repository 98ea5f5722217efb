"""Coming from nbdfuse: its usages and options work with nbdferry, and
the deliberate differences behave as docs/user-guide.md says.

One test per nbdfuse usage (file mode with a URI, with [ CMD ], with
--unix; every option; relative pidfile and mountpoint ended by SIGTERM
and by fusermount3 -u; the owner with -o uid=/gid=), then the
differences: file semantics by default and nbdfuse's block-device
semantics with --block-device; write-zeroes where nbdfuse trims;
coalesced writes; a mount private to its owner.
"""

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from lib.env import MiB, daemon_cmd, timeout
from lib.images import random_bytes
from lib.mounts import Mount, is_mounted, stderr_problems
from lib.nbd import fill_random, read_nbd
from lib.procs import nonempty, pid_alive, run, wait_for

EXPORT = 16 * MiB


@pytest.fixture
def daemon(shortdir):
    """Factory: daemon(target_path, server_args, *opts, cwd=None,
    foreground=True, pidfile=None) runs nbdferry [-f] -P PIDFILE OPTS
    TARGET SERVER_ARGS, waits for the mount and returns a lib.mounts Mount
    (mp is the target: a directory, or the file in file mode)."""
    started = []

    def start(target, server_args, *opts, cwd=None, foreground=True,
              pidfile=None):
        n = len(started)
        pidfile = pidfile or shortdir / f"d{n}.pid"
        errpath = shortdir / f"d{n}.err"
        cmd = daemon_cmd(*(["-f"] if foreground else []), "-P", pidfile,
                         *opts, target, *server_args)
        with open(errpath, "wb") as e:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=e,
                                    stderr=e, cwd=cwd)
        pidpath = Path(cwd or ".") / pidfile
        if foreground:
            wait_for(nonempty(pidpath), proc, "nbdferry mount", 30,
                     log=errpath)
        else:
            assert proc.wait(timeout(60)) == 0, errpath.read_text()
        mp = Path(cwd or ".") / target
        m = Mount(mp=mp.resolve(), file=mp.resolve(), proc=proc,
                  pid=int(pidpath.read_text()), pidfile=pidpath,
                  stderr_path=errpath, expect_rc=0, expect_errors=False,
                  checked=not foreground, cmd=cmd)
        assert is_mounted(m.mp), f"{m.mp} not mounted"
        started.append(m)
        return m

    yield start
    for m in reversed(started):
        if m.proc.poll() is None or is_mounted(m.mp):
            m.finish()
        if pid_alive(m.pid):
            os.kill(m.pid, signal.SIGKILL)
            pytest.fail(f"daemon {m.pid} left running")


def write_read_check(path, uri, off=MiB + 3, n=2 * MiB + 7):
    data = random_bytes(n)
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(data)
    with open(path, "rb") as f:
        f.seek(off)
        assert f.read(n) == data, "read back through the mount differs"
    if uri:
        assert read_nbd(uri, off, n) == data, "the server differs"
    return off, data


# ------------------------------------------------------------ file mode

@pytest.fixture
def empty_file(shortdir):
    f = shortdir / "disk.raw"
    f.write_bytes(b"")
    return f


def assert_file_mode(m, size=EXPORT):
    st = os.stat(m.mp)
    assert st.st_size == size, st
    assert (st.st_mode & 0o170000) == 0o100000, oct(st.st_mode)


def unmount_file(m, f):
    rc = m.unmount()
    assert rc == 0
    assert f.stat().st_size == 0, "the file under the mount changed"


def test_file_mode_uri(daemon, server, empty_file):
    srv = server("memory", f"size={EXPORT}")
    fill_random(srv.uri)
    m = daemon(empty_file, [srv.uri])
    assert_file_mode(m)
    write_read_check(empty_file, srv.uri)
    unmount_file(m, empty_file)


def test_file_mode_socket_activation(daemon, shm, empty_file):
    disk = shm / "backing.img"
    old = random_bytes(EXPORT)
    disk.write_bytes(old)
    m = daemon(empty_file, ["[", "nbdkit", "file", disk, "]"])
    assert_file_mode(m)
    off, data = write_read_check(empty_file, None)
    unmount_file(m, empty_file)
    ref = bytearray(old)
    ref[off:off + len(data)] = data
    assert disk.read_bytes() == bytes(ref)


def test_file_mode_unix(daemon, server, empty_file):
    srv = server("memory", f"size={EXPORT}")
    m = daemon(empty_file, ["--unix", srv.sock])
    assert_file_mode(m)
    write_read_check(empty_file, srv.uri)
    unmount_file(m, empty_file)


def test_file_mode_cp_image(daemon, server, empty_file, shm):
    """The nbdfuse recipe: cp an image onto the file; every byte lands."""
    srv = server("memory", f"size={EXPORT}")
    fill_random(srv.uri)
    src = shm / "src.img"
    data = random_bytes(5 * MiB + 11)
    src.write_bytes(data)
    m = daemon(empty_file, [srv.uri])
    r = run(["cp", src, empty_file])
    assert r.returncode == 0, r.stderr
    assert read_nbd(srv.uri, 0, len(data)) == data
    assert read_nbd(srv.uri, len(data)) == bytes(EXPORT - len(data)), \
        "file semantics: bytes past the copy must read as zero"
    unmount_file(m, empty_file)


@pytest.mark.parametrize("how", ["truncate", "zeros"])
def test_file_mode_over_a_file_without_data(daemon, server, shortdir, how):
    """libnbd's test-nbdkit-file-null: file mode over a file made by
    `truncate -s 1024`, which holds no data (nor does one of written
    zeros): mounted, written, and the file is as it was after."""
    f = shortdir / "null.raw"
    if how == "truncate":
        assert run(["truncate", "-s", "1024", f]).returncode == 0
    else:
        f.write_bytes(bytes(3 * 4096))
    size = f.stat().st_size
    srv = server("memory", f"size={EXPORT}")
    m = daemon(f, [srv.uri])
    assert_file_mode(m)
    write_read_check(f, srv.uri)
    assert m.unmount() == 0
    assert f.stat().st_size == size and f.read_bytes() == bytes(size)


# ------------------------------------------------------------- options

def test_version_lists_libraries(shortdir):
    r = run(daemon_cmd("--version"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 4, lines
    assert re.fullmatch(r"nbdferry \d+\.\d+\.\d+", lines[0]), lines
    assert re.fullmatch(r"libnbd \d+\.\d+\.\d+", lines[1]), lines
    assert re.fullmatch(r"libfuse \d+\.\d+\.\d+", lines[2]), lines
    assert re.fullmatch(r"NBD extended headers: (built in|not built "
                        r"\(libnbd < 1\.18\))", lines[3]), lines


def test_long_and_short_options_match_help():
    """--long-options/--short-options list what getopt accepts, and
    --help documents each one (the completion script reads these)."""
    help_text = run(daemon_cmd("--help")).stdout
    longs = run(daemon_cmd("--long-options")).stdout.split()
    shorts = run(daemon_cmd("--short-options")).stdout.split()
    for want in ("--pid-file", "--fuse-help", "--vsock", "--long-options",
                 "--short-options", "--socket-activation", "--read-only",
                 "--block-device", "--command", "--unix", "--tcp", "--fd"):
        assert want in longs, want
    assert {"-C", "-d", "-o", "-P", "-r", "-s", "-v", "-V", "-f"} <= \
        set(shorts), shorts
    for opt in longs + shorts:
        assert re.search(re.escape(opt) + r"\b", help_text), \
            f"--help does not document {opt}"
    assert "T suffix" in help_text or "or T" in help_text


def test_fuse_help():
    r = run(daemon_cmd("--fuse-help"))
    assert r.returncode == 0, r.stderr
    assert "allow_other" in r.stdout and "nonempty" in r.stdout, r.stdout


def test_option_d_debug(daemon, server, shortdir):
    """-d: foreground (the command does not return) with FUSE's and
    libnbd's debug output."""
    srv = server("memory", f"size={EXPORT}")
    (shortdir / "mp").mkdir()
    m = daemon(shortdir / "mp", [srv.uri], "-d")
    write_read_check(m.mp / "nbd", srv.uri)
    assert m.proc.poll() is None
    m.expect_errors = True              # debug output says "error: 0"
    assert m.unmount() == 0
    err = m.stderr
    assert "unique:" in err, "no FUSE debug output"
    assert "libnbd" in err, "no libnbd debug output"


def busy_mount_threads(daemon, srv, mp, src, *opts):
    """Mount, run four readers and a writer at once, check the bytes;
    return how many threads the daemon had."""
    mp.mkdir()
    m = daemon(mp, [srv.uri], *opts)
    readers = [subprocess.Popen(["dd", f"if={mp / 'nbd'}", "of=/dev/null",
                                 "bs=64K", "status=none"]) for _ in range(4)]
    r = run(["dd", f"if={src}", f"of={mp / 'nbd'}", "bs=1M",
             "conv=notrunc,fsync", "status=none"])
    for p in readers:
        assert p.wait(timeout(60)) == 0
    assert r.returncode == 0, r.stderr
    assert read_nbd(srv.uri, 0, src.stat().st_size) == src.read_bytes()
    threads = len(os.listdir(f"/proc/{m.pid}/task"))
    assert m.unmount() == 0
    return threads


def test_option_s_single_thread(daemon, server, shortdir, shm):
    """-s serves FUSE on the main thread: under the same parallel reads
    and writes the daemon runs fewer threads than with the default
    multi-threaded loop, and the bytes land either way."""
    srv = server("memory", f"size={EXPORT}")
    src = shm / "src"
    src.write_bytes(random_bytes(6 * MiB + 1))
    single = busy_mount_threads(daemon, srv, shortdir / "s", src, "-s")
    multi = busy_mount_threads(daemon, srv, shortdir / "m", src)
    assert single < multi, (single, multi)


def test_option_pid_file_alias(daemon, server, shortdir):
    srv = server("memory", f"size={EXPORT}")
    (shortdir / "mp").mkdir()
    pf = shortdir / "alias.pid"
    cmd = daemon_cmd("-f", "--pid-file", pf, shortdir / "mp", srv.uri)
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    try:
        wait_for(nonempty(pf), p, "--pid-file")
        assert int(pf.read_text()) == p.pid
    finally:
        subprocess.run(["fusermount3", "-u", shortdir / "mp"])
        p.wait(timeout(60))
    assert p.returncode == 0
    assert not pf.exists(), "pidfile not removed at exit"


def test_option_vsock_connects_over_vsock(shortdir):
    """--vsock CID PORT: connects with AF_VSOCK (this machine has no vsock
    transport to a server, so the connection itself fails, saying where
    it went); bad values are usage errors."""
    (shortdir / "mp").mkdir()
    r = run(daemon_cmd("-f", shortdir / "mp", "--vsock", "1", "10809"),
            timeout=120)
    assert r.returncode == 1
    assert "nbd+vsock://1:10809/" in r.stderr, r.stderr
    for bad in (["1"], ["x", "1"], ["1", "2", "3"]):
        r = run(daemon_cmd(shortdir / "mp", "--vsock", *bad))
        assert r.returncode == 1 and "--vsock" in r.stderr, r.stderr
    assert not is_mounted(shortdir / "mp")


def test_option_owner_uid_gid(daemon, server, shortdir):
    srv = server("memory", f"size={EXPORT}")
    (shortdir / "mp").mkdir()
    m = daemon(shortdir / "mp", [srv.uri], "-o", "uid=4321,gid=8765",
               "-o", "kernel_cache")
    for name in ("nbd", "nbd.vhd", "nbd.vmdk", "nbd.vhdx"):
        st = os.stat(m.mp / name)
        assert (st.st_uid, st.st_gid) == (4321, 8765), (name, st)
    write_read_check(m.mp / "nbd", srv.uri)
    assert m.unmount() == 0
    assert "kernel_cache" not in m.stderr or "ignored" in m.stderr


def test_option_owner_bad_value(shortdir):
    (shortdir / "mp").mkdir()
    r = run(daemon_cmd("-o", "uid=alice", shortdir / "mp", "nbd://x/"))
    assert r.returncode == 1 and "uid" in r.stderr, r.stderr


# ----------------------------------------------------- relative paths

@pytest.mark.parametrize("how", ["sigterm", "fusermount"])
def test_relative_pidfile_and_mountpoint(daemon, server, shortdir, how):
    """Relative -P and MOUNTPOINT, daemon mode: the pidfile appears where
    it was asked for, and after SIGTERM or fusermount3 -u the mount is gone
    (not a dead mount) and the pidfile removed."""
    srv = server("memory", f"size={EXPORT}")
    work = shortdir / "work"
    (work / "mp").mkdir(parents=True)
    m = daemon("mp", [srv.uri], cwd=work, foreground=False,
               pidfile="rel.pid")
    pf = work / "rel.pid"
    assert pf.exists() and pid_alive(m.pid)
    assert not Path("/rel.pid").exists()
    write_read_check(work / "mp" / "nbd", srv.uri)
    if how == "sigterm":
        os.kill(m.pid, signal.SIGTERM)
    else:
        r = run(["fusermount3", "-u", "mp"], cwd=work)
        assert r.returncode == 0, r.stderr
    wait_for(lambda: not pid_alive(m.pid), None, "daemon exit", 60)
    assert not is_mounted(work / "mp"), "left mounted"
    os.stat(work / "mp")                # ENOTCONN if a dead mount was left
    assert not pf.exists(), "relative pidfile not removed"


# --------------------------------------------- deliberate differences

@pytest.mark.parametrize("mode", ["file", "block-device"])
def test_o_trunc_semantics(daemon, server, shortdir, mode):
    """dd of one sector without conv=notrunc: file semantics (default)
    make the disk that one sector (the rest reads as zero on the server
    after close); --block-device keeps the disk and its size, as
    nbdfuse."""
    srv = server("memory", f"size={EXPORT}")
    old = fill_random(srv.uri)
    (shortdir / "mp").mkdir()
    opts = ["--block-device"] if mode == "block-device" else []
    m = daemon(shortdir / "mp", [srv.uri], *opts)
    sector = random_bytes(512)
    src = shortdir / "mbr.bin"
    src.write_bytes(sector)
    r = run(["dd", f"if={src}", f"of={m.mp / 'nbd'}", "bs=512", "count=1",
             "status=none"])
    assert r.returncode == 0, r.stderr
    size = os.stat(m.mp / "nbd").st_size
    r = run(["truncate", "-s", "4096", m.mp / "nbd"])
    assert r.returncode == 0, r.stderr
    size_after_truncate = os.stat(m.mp / "nbd").st_size
    assert m.unmount() == 0
    got = read_nbd(srv.uri)
    assert got[:512] == sector
    if mode == "file":
        assert size == 512 and size_after_truncate == 4096
        assert got[512:] == bytes(EXPORT - 512), "tail not zeroed"
    else:
        assert size == EXPORT and size_after_truncate == EXPORT
        assert got[512:] == old[512:], "block-device mode changed the disk"


def test_o_block_device_from_mount_options(daemon, server, shortdir):
    """-o block_device (the fstab spelling) is the same switch."""
    srv = server("memory", f"size={EXPORT}")
    old = fill_random(srv.uri)
    (shortdir / "mp").mkdir()
    m = daemon(shortdir / "mp", [srv.uri], "-o", "block_device")
    with open(m.mp / "nbd", "wb") as f:          # O_TRUNC
        f.write(b"x" * 4096)
    assert os.stat(m.mp / "nbd").st_size == EXPORT
    assert m.unmount() == 0
    assert read_nbd(srv.uri) == b"x" * 4096 + old[4096:]


def test_punch_hole_is_write_zeroes_not_trim(daemon, server, shortdir):
    """nbdfuse turns a punched hole into NBD trim, which may leave old
    bytes; nbdferry sends write-zeroes: the range reads as zero."""
    srv = server("memory", f"size={EXPORT}", log=True)
    fill_random(srv.uri)
    (shortdir / "mp").mkdir()
    m = daemon(shortdir / "mp", [srv.uri])
    r = run(["fallocate", "--punch-hole", "--keep-size", "-o", str(MiB),
             "-l", str(2 * MiB), m.mp / "nbd"])
    assert r.returncode == 0, r.stderr
    assert m.unmount() == 0
    log = Path(srv.log).read_text()
    assert re.search(r" Zero id=\d+ offset=0x100000 count=0x200000", log), log
    assert " Trim id=" not in log
    assert read_nbd(srv.uri, MiB, 2 * MiB) == bytes(2 * MiB)


def test_small_writes_are_coalesced(daemon, server, shortdir):
    """4 KiB writes arrive at the server as large NBD writes (nbdfuse
    sends one NBD write per FUSE write)."""
    srv = server("memory", f"size={EXPORT}", log=True)
    (shortdir / "mp").mkdir()
    m = daemon(shortdir / "mp", [srv.uri])
    data = random_bytes(4 * MiB)
    fd = os.open(m.mp / "nbd", os.O_WRONLY)
    try:
        for off in range(0, len(data), 4096):
            assert os.pwrite(fd, data[off:off + 4096], off) == 4096
    finally:
        os.close(fd)
    assert m.unmount() == 0
    assert read_nbd(srv.uri, 0, len(data)) == data
    counts = [int(c, 16) for c in re.findall(
        r" Write id=\d+ offset=0x[0-9a-f]+ count=0x([0-9a-f]+)",
        Path(srv.log).read_text())]
    assert counts and max(counts) >= MiB, counts[:10]
    assert len(counts) < len(data) // 4096 // 8, len(counts)


def test_mount_is_private_to_its_owner(daemon, server, shortdir):
    """Without -o allow_other only the owner reaches the disk (mode 0600
    on a 0700 root); nbdfuse's file is readable by others when
    allow_other is given."""
    srv = server("memory", f"size={EXPORT}")
    (shortdir / "mp").mkdir()
    m = daemon(shortdir / "mp", [srv.uri])
    assert (os.stat(m.mp / "nbd").st_mode & 0o777) == 0o600
    assert (os.stat(m.mp).st_mode & 0o777) == 0o700
    r = run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
             "head", "-c", "1", m.mp / "nbd"])
    assert r.returncode != 0 and "denied" in r.stderr, r.stderr
    assert m.unmount() == 0


def test_daemon_default_and_foreground_wait(daemon, server, shortdir):
    """nbdfuse stays in the foreground; nbdferry returns once the mount
    is ready, with -f it stays, so a script can wait on the process."""
    srv = server("memory", f"size={EXPORT}")
    (shortdir / "mp").mkdir()
    m = daemon(shortdir / "mp", [srv.uri], foreground=False)
    assert m.proc.returncode == 0 and pid_alive(m.pid)
    assert m.pid != m.proc.pid, "the daemon is the command we ran"
    subprocess.run(["fusermount3", "-u", shortdir / "mp"], check=True)
    wait_for(lambda: not pid_alive(m.pid), None, "daemon exit", 60)
    (shortdir / "mp2").mkdir()
    m2 = daemon(shortdir / "mp2", [srv.uri], foreground=True)
    assert m2.pid == m2.proc.pid and m2.proc.poll() is None
    subprocess.run(["fusermount3", "-u", shortdir / "mp2"], check=True)
    assert m2.proc.wait(timeout(60)) == 0
    assert not stderr_problems(m2.stderr)
