"""The command line: every connection mode mounts and carries data; bad
command lines and unreachable servers fail with one clear line, a non-zero
exit and nothing left mounted or running."""

import errno
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from lib.content import assert_content
from lib.digest import sha256_file
from lib.env import MiB, daemon_cmd, timeout
from lib.images import random_bytes, random_file
from lib.mounts import fusermount_u, is_mounted, stderr_problems
from lib.nbd import fill_random, read_nbd
from lib.procs import free_tcp_port, nonempty, pid_alive, wait_for

ROOT = Path(__file__).resolve().parent.parent
EXPORT = 64 * MiB


def project_version():
    text = (ROOT / "CMakeLists.txt").read_text()
    return re.search(r"project\(\s*nbdferry\s+VERSION\s+([\d.]+)", text).group(1)


# ------------------------------------------------------------ helpers

class Cli:
    """Runs the daemon as a user would (no -f unless given), always with a
    pidfile so that anything it left behind can be found and removed."""

    def __init__(self, d):
        self.dir = d
        self.mp = d / "mp"
        self.mp.mkdir()
        self.pidfile = d / "cli.pid"
        self.runs = 0

    def run(self, *args, secs=30, pidfile=True, **kw):
        self.runs += 1
        out = self.dir / f"out{self.runs}"
        err = self.dir / f"err{self.runs}"
        pre = ["-P", self.pidfile] if pidfile else []
        cmd = daemon_cmd(*pre, *args)
        with open(out, "wb") as o, open(err, "wb") as e:
            try:
                rc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=o,
                                    stderr=e, timeout=timeout(secs),
                                    **kw).returncode
            except subprocess.TimeoutExpired:
                pytest.fail(f"{' '.join(cmd)}: did not return within "
                            f"{timeout(secs)}s")
        return rc, out.read_text(errors="replace"), err.read_text(errors="replace")

    def daemon_pid(self):
        try:
            return int(self.pidfile.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def cleanup(self):
        left = []
        for mp in [self.mp] + sorted(self.dir.glob("mp*")):
            if is_mounted(mp):
                left.append(str(mp))
                fusermount_u(mp, wait=2)
        pid = self.daemon_pid()
        if pid and pid_alive(pid):
            deadline = time.monotonic() + timeout(10)
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if pid_alive(pid):
                left.append(f"pid {pid}")
                os.kill(pid, signal.SIGKILL)
        return left


@pytest.fixture
def cli(shortdir):
    c = Cli(shortdir)
    yield c
    left = c.cleanup()
    assert not left, f"left behind: {left}"


def assert_one_clear_line(rc, err, *mentions, child_lines=False):
    """Non-zero exit and exactly one line on stderr that mentions one of
    the words.  child_lines: a server the daemon started may print its own
    lines first; then exactly one line must be the daemon's."""
    assert rc != 0, "exit status 0 for a failing command line"
    lines = [l for l in err.splitlines() if l.strip()]
    if child_lines:
        lines = [l for l in lines if re.match(r"(\S*/)?nbdferry:", l)]
    assert len(lines) == 1, (f"expected exactly one line on stderr, got "
                             f"{len(lines)}:\n{err}")
    if mentions:
        assert any(w.lower() in lines[0].lower() for w in mentions), (
            f"stderr line does not mention any of {mentions}: {lines[0]!r}")
    return lines[0]


def write_and_verify(path, uri=None, backing=None, size=EXPORT):
    """Write random data at an odd offset through the mount, close, read it
    back through the mount; check the server or backing file if given."""
    off, n = MiB + 7, 4 * MiB + 3
    data = random_bytes(n)
    fd = os.open(path, os.O_RDWR)
    try:
        assert os.pwrite(fd, data, off) == n
    finally:
        os.close(fd)
    with open(path, "rb") as f:
        f.seek(off)
        assert f.read(n) == data, "read back through the mount differs"
    if uri is not None:
        assert read_nbd(uri, off, n) == data, "server differs"
    return off, data


def assert_backing(disk, old, off, data):
    ref = bytearray(old)
    ref[off:off + len(data)] = data
    assert Path(disk).read_bytes() == bytes(ref), "backing file differs"


# ------------------------------------------------------- info options

def test_cli_version(cli):
    rc, out, err = cli.run("-V", pidfile=False)
    assert rc == 0, err
    assert "nbdferry" in out and project_version() in out, out
    rc2, out2, _ = cli.run("--version", pidfile=False)
    assert rc2 == 0 and out2 == out


def test_cli_help(cli):
    rc, out, err = cli.run("--help", pidfile=False)
    assert rc == 0, err
    text = out + err
    assert "nbdferry" in text and "MOUNTPOINT" in text, text
    for opt in ("--depth", "--request-size", "--pool-size", "--connections",
                "--unix", "--tcp", "--fd", "--command"):
        assert opt in text, f"--help does not mention {opt}"
    assert not is_mounted(cli.mp)


# -------------------------------------------------------- bad input

NOSOCK = "/nonexistent-nbdferry-dir/sock"


def bad_cases(mp, uri):
    """(id, args, words the error line should mention).  Ids starting
    with "child-" start a server process that may print lines of its own."""
    return [
        ("no-args", [], ()),
        ("no-target", [mp], ()),
        ("unknown-option", ["--bogus-option", mp, uri], ("bogus-option",)),
        ("depth-zero", ["--depth", "0", mp, uri], ("depth",)),
        ("depth-garbage", ["--depth", "lots", mp, uri], ("depth", "lots")),
        ("request-size-garbage", ["--request-size", "garbage", mp, uri],
         ("request-size", "garbage")),
        ("request-size-zero", ["--request-size", "0", mp, uri],
         ("request-size",)),
        ("pool-size-garbage", ["--pool-size", "12Q", mp, uri],
         ("pool-size", "12Q")),
        ("connections-zero", ["-C", "0", mp, uri],
         ("connection", "-C")),
        ("option-missing-value", [mp, uri, "--depth"], ()),
        ("extra-arg", [mp, uri, "surplus"], ()),
        # MOUNTPOINT/FILENAME whose MOUNTPOINT does not exist.
        ("missing-mountpoint", [mp.parent / "no-such-dir" / "nbd", uri],
         ("no-such-dir", "No such file")),
        ("unreachable-uri", [mp, f"nbd+unix:///?socket={NOSOCK}"],
         (NOSOCK, "No such file", "connect")),
        ("unreachable-unix", [mp, "--unix", NOSOCK],
         (NOSOCK, "No such file", "connect")),
        ("bad-uri", [mp, "http://example.invalid/"],
         ("uri", "http", "scheme")),
        # The lowest free descriptor: the mountpoint's pinned descriptor
        # must not pass for it.
        ("fd-lowest-free", [mp, "--fd", "3"],
         ("--fd 3", "not an open file descriptor")),
        ("child-command-fails", [mp, "--command", "false"], ()),
        ("child-command-missing-binary",
         [mp, "--command", "/nonexistent-nbdferry-dir/server"],
         ("nonexistent-nbdferry-dir", "No such file")),
        ("child-activation-missing-binary",
         [mp, "[", "/nonexistent-nbdferry-dir/server", "]"],
         ("nonexistent-nbdferry-dir", "No such file")),
    ]


CASE_IDS = [c[0] for c in bad_cases(Path("/x"), "u")]


@pytest.mark.parametrize("case", CASE_IDS)
def test_cli_bad_command_line(cli, server, case):
    srv = server("memory", "size=16M")
    cid, args, mentions = next(c for c in bad_cases(cli.mp, srv.uri)
                               if c[0] == case)
    rc, out, err = cli.run(*args)
    assert_one_clear_line(rc, err, *mentions,
                          child_lines=cid.startswith("child-"))
    assert not is_mounted(cli.mp), "something was left mounted"
    pid = cli.daemon_pid()
    assert not (pid and pid_alive(pid)), "a daemon was left running"


def test_cli_mountpoint_is_a_file(cli, server):
    """MOUNTPOINT/FILENAME where MOUNTPOINT is a regular file."""
    srv = server("memory", "size=16M")
    f = cli.dir / "plainfile"
    f.write_bytes(b"x")
    rc, _, err = cli.run(f / "nbd", srv.uri)
    assert_one_clear_line(rc, err, "plainfile", "directory")
    assert f.read_bytes() == b"x"
    assert not is_mounted(f)


def test_cli_refused_tcp(cli):
    port = free_tcp_port()              # nothing listens there
    rc, _, err = cli.run(cli.mp, "--tcp", "127.0.0.1", port)
    assert_one_clear_line(rc, err, "refused", str(port), "connect")
    assert not is_mounted(cli.mp)


@pytest.mark.parametrize("fg", [False, True], ids=["background", "foreground"])
def test_cli_unreachable_server(cli, fg):
    args = (["-f"] if fg else []) + [cli.mp, f"nbd+unix:///?socket={NOSOCK}"]
    rc, _, err = cli.run(*args)
    assert_one_clear_line(rc, err, NOSOCK, "No such file", "connect")
    assert not is_mounted(cli.mp)
    assert not cli.pidfile.exists() or not pid_alive(cli.daemon_pid() or 0), \
        "pidfile left pointing at a live daemon"


# ------------------------------------------------- connection modes

def test_mode_uri(server, mount):
    srv = server("memory", f"size={EXPORT}")
    fill_random(srv.uri, EXPORT)
    m = mount(srv)
    st = os.stat(m.file)
    assert st.st_size == EXPORT
    assert st.st_blksize == MiB, f"st_blksize {st.st_blksize} (want 1 MiB)"
    write_and_verify(m.file, uri=srv.uri)


def test_mode_filename(server, mount):
    srv = server("memory", f"size={EXPORT}")
    m = mount(srv, filename="disk.raw")
    names = os.listdir(m.mp)
    assert "disk.raw" in names and "nbd" not in names, names
    write_and_verify(m.file, uri=srv.uri)


@pytest.fixture
def disk(shm):
    d = random_file(shm / "disk.img", EXPORT)
    return d, d.read_bytes()


def test_mode_socket_activation(mount, disk):
    path, old = disk
    m = mount(["[", "nbdkit", "file", path, "]"])
    assert os.path.getsize(m.file) == EXPORT
    off, data = write_and_verify(m.file)
    m.unmount()
    assert_backing(path, old, off, data)


def test_mode_socket_activation_memory(mount):
    m = mount(["[", "nbdkit", "memory", "64M", "]"])
    assert os.path.getsize(m.file) == EXPORT
    write_and_verify(m.file)


def test_mode_command(mount, disk):
    path, old = disk
    m = mount(["--command", "nbdkit", "-s", "file", path])
    assert os.path.getsize(m.file) == EXPORT
    off, data = write_and_verify(m.file)
    m.unmount()
    assert_backing(path, old, off, data)


def test_mode_unix(server, mount):
    srv = server("memory", f"size={EXPORT}")
    m = mount(["--unix", srv.sock])
    write_and_verify(m.file, uri=srv.uri)


def test_mode_tcp(server, mount):
    srv = server("memory", f"size={EXPORT}", tcp=True)
    m = mount(["--tcp", "127.0.0.1", srv.port])
    write_and_verify(m.file, uri=srv.uri)


def test_mode_fd(server, mount):
    srv = server("memory", f"size={EXPORT}")
    s = socket.socket(socket.AF_UNIX)
    s.connect(str(srv.sock))
    try:
        m = mount(["--fd", s.fileno()], pass_fds=(s.fileno(),))
    finally:
        s.close()                        # the daemon has its own copy
    write_and_verify(m.file, uri=srv.uri)


# ------------------------------------------------------------ options

def test_option_readonly(server, mount):
    srv = server("memory", f"size={EXPORT}")
    old = fill_random(srv.uri, EXPORT)
    m = mount(srv, "-r")
    try:
        fd = os.open(m.file, os.O_WRONLY)
    except OSError as e:
        assert e.errno == errno.EROFS, f"open for write: {e}"
    else:
        try:
            with pytest.raises(OSError) as e:
                os.pwrite(fd, b"x" * 4096, 0)
                os.fsync(fd)
            assert e.value.errno == errno.EROFS
        finally:
            try:
                os.close(fd)
            except OSError:
                pass
    assert_content(old, EXPORT, mount_file=m.file, uri=srv.uri,
                   what="read-only mount")


def test_option_connections_multi_conn(server, mount, shm):
    srv = server("memory", f"size={EXPORT}", log=True)
    m = mount(srv, "-C", "4", "--request-size", "256K")
    src = random_file(shm / "src.img", 32 * MiB)
    with open(src, "rb") as f, open(m.file, "r+b") as g:
        g.write(f.read())
    assert_content(src, EXPORT, uri=srv.uri, what="-C 4")
    n = srv.connections()
    assert n >= 4, f"-C 4 opened {n} connection(s)"


def test_option_connections_without_multi_conn(server, mount, shm):
    """-C 4 against a server that does not offer multi-conn: one
    connection only (a flush on one connection would not cover writes on
    the others), and the data lands."""
    srv = server("memory", f"size={EXPORT}", "multi-conn-mode=disable",
                 filters=["multi-conn"], log=True)
    m = mount(srv, "-C", "4")
    src = random_file(shm / "src.img", 16 * MiB)
    with open(src, "rb") as f, open(m.file, "r+b") as g:
        g.write(f.read())
        g.flush()
        os.fsync(g.fileno())
    assert_content(src, EXPORT, uri=srv.uri, what="-C 4, no multi-conn")
    n = srv.connections() - 1                  # minus our own check above
    assert n == 1, f"{n} connections to a server without multi-conn"


@pytest.mark.parametrize("opts", [
    ("--depth", "1"),
    ("--depth", "1", "-C", "1", "--request-size", "4K"),
    ("--pool-size", "2M", "--request-size", "2M"),
    ("--pool-size", "64K", "--request-size", "1M", "--depth", "64"),
], ids=["depth1", "depth1-4k", "pool-one-buffer", "pool-below-request"])
def test_option_extreme_settings(server, mount, shm, opts):
    """Edge settings (one request in flight, tiny requests, a pool of one
    buffer or smaller than a request) still work and carry data exactly."""
    srv = server("memory", f"size={EXPORT}")
    fill_random(srv.uri, EXPORT)
    m = mount(srv, *opts)
    src = random_file(shm / "src.img", 8 * MiB + 1)
    r = subprocess.run(["cp", str(src), str(m.file)], capture_output=True,
                       text=True, timeout=timeout(120))
    assert r.returncode == 0, r.stderr
    assert_content(src, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=8 * MiB + 1, what=" ".join(opts))


def test_option_sizes_with_suffixes(server, mount, shm):
    srv = server("memory", f"size={EXPORT}")
    m = mount(srv, "--depth", "4", "--request-size", "1M",
              "--pool-size", "16M", "-C", "2", "-o", "fsname=nbdferrytest")
    src = random_file(shm / "src.img", 24 * MiB + 1)
    with open(src, "rb") as f, open(m.file, "r+b") as g:
        g.write(f.read())
    assert_content(src, EXPORT, uri=srv.uri, what="suffix sizes")
    with open("/proc/mounts") as f:
        line = next(l for l in f if l.split()[1] == str(m.mp))
    assert line.split()[0] == "nbdferrytest", f"-o fsname ignored: {line}"


def test_option_request_size_above_limit_is_clamped(server, mount, shm):
    """--request-size beyond 32M is clamped (not refused, not sent)."""
    srv = server("memory", f"size={EXPORT}", log=True)
    m = mount(srv, "--request-size", "64M", "--pool-size", "128M")
    src = random_file(shm / "src.img", 40 * MiB)
    r = subprocess.run(["dd", f"if={src}", f"of={m.file}", "bs=4M",
                        "conv=notrunc,fsync", "status=none"],
                       capture_output=True, text=True, timeout=timeout(120))
    assert r.returncode == 0, r.stderr
    assert_content(src, EXPORT, uri=srv.uri, what="--request-size 64M")
    counts = [int(c, 16) for c in re.findall(
        r" Write id=\d+ offset=0x[0-9a-f]+ count=0x([0-9a-f]+)",
        Path(srv.log).read_text())]
    assert counts and max(counts) <= 32 * MiB, \
        f"largest NBD write {max(counts or [0])} bytes"


def test_background_mode(cli, server):
    """Without -f the command returns once the mount is ready; fusermount3
    -u ends the daemon."""
    srv = server("memory", f"size={EXPORT}")
    rc, out, err = cli.run(cli.mp, srv.uri)
    assert rc == 0, f"background mount failed: {err}"
    assert is_mounted(cli.mp), "command returned before the mount was ready"
    assert nonempty(cli.pidfile)(), "pidfile missing after return"
    pid = cli.daemon_pid()
    assert pid_alive(pid), "daemon not running after background start"
    write_and_verify(cli.mp / "nbd", uri=srv.uri)
    r = subprocess.run(["fusermount3", "-u", str(cli.mp)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    wait_for(lambda: not pid_alive(pid), None, "daemon exit after unmount",
             timeout=60)
    assert not is_mounted(cli.mp)
    bad = stderr_problems(err)
    assert not bad, f"stderr: {bad}"


def test_sha256_file_helper_sanity(tmp_path):
    """The digest helper pads with zeros as the tests assume."""
    p = tmp_path / "f"
    p.write_bytes(b"abc")
    import hashlib
    assert sha256_file(p, pad_to=5) == hashlib.sha256(b"abc\0\0").hexdigest()


# ------------------------------------------- a new user's small slips

@pytest.mark.parametrize("args,suggest", [
    (["--depht", "4"], "--depth"),
    (["--pool-sise=8M"], "--pool-size"),
    (["--readonyl"], "--readonly"),
    (["--conections", "2"], "--connections"),
])
def test_cli_misspelled_option_suggests(cli, args, suggest):
    rc, _, err = cli.run(*args, cli.mp, "nbd://localhost/")
    line = assert_one_clear_line(rc, err, "did you mean")
    assert f"did you mean {suggest}?" in line, line
    assert not is_mounted(cli.mp)


def test_cli_unknown_option_without_a_near_name(cli):
    rc, _, err = cli.run("--frobnicate", cli.mp, "nbd://localhost/")
    line = assert_one_clear_line(rc, err, "frobnicate")
    assert "did you mean" not in line


# Every option of the table, each with a value it accepts, and the
# operands it takes when it changes them (a connection mode, an action).
# The operands: MOUNTPOINT and a server that does not answer, so that
# every run ends (or prints) at once the same way wherever the option
# stood.
def option_cases(d, mp):
    nosock = f"nbd+unix:///?socket={NOSOCK}"
    psk = d / "keys.psk"
    psk.write_text("alice:00\n")
    psk.chmod(0o600)
    plain = [mp, nosock]
    valued = {
        "--connections": "2", "-C": "2", "--depth": "4",
        "--request-size": "1M", "--pool-size": "16M", "--readahead": "1M",
        "--idle-ms": "5", "--digest": "sha256", "--expected-size": "1M",
        "--spool-dir": str(d), "--spool-max": "1G", "--state-dir": str(d),
        "--qcow2-cluster-size": "64K", "--retry-timeout": "0",
        "--request-timeout": "5", "--list-timeout": "5", "--tls": "off",
        "--tls-psk-file": str(psk), "--tls-username": "alice",
        "--tls-certificates": str(d), "--pidfile": str(d / "p.pid"),
        "--pid-file": str(d / "p.pid"), "-P": str(d / "p.pid"),
        "--log-file": str(d / "log"), "-o": "nonempty",
    }
    # option -> (its words, the operands)
    cases = {o: ([o, v], plain) for o, v in valued.items()}
    for o in ("--blkhash", "--verify-readback", "--progress"):
        cases[o] = ([o], plain)
    cases["--unix"] = (["--unix"], [mp, NOSOCK])
    cases["--tcp"] = (["--tcp"], [mp, "127.0.0.1", str(free_tcp_port())])
    cases["--fd"] = (["--fd"], [mp, "3"])
    cases["--vsock"] = (["--vsock"], [mp, "cid", "2"])
    cases["--command"] = (["--command"], [mp, "false"])
    cases["--socket-activation"] = (["--socket-activation"], [mp, "false"])
    cases["--all-exports"] = (["--all-exports"], plain)
    cases["--list"] = (["--list"], [nosock])
    cases["--unmount"] = (["--unmount"], [mp])
    cases["--forget"] = (["--forget"], [mp])
    cases["--no-manifest"] = (["--no-manifest"], plain)
    return cases


def long_and_short_options():
    words = []
    for flag in ("--long-options", "--short-options"):
        r = subprocess.run(daemon_cmd(flag), capture_output=True, text=True,
                           check=True)
        words += r.stdout.split()
    return words


def test_cli_every_option_in_every_position(cli):
    """Options wherever they stand, as getopt users write them: each option
    of the table before, between and after the operands is the same
    command line (the same exit status, stdout and stderr)."""
    cases = option_cases(cli.dir, cli.mp)
    tried = 0
    for opt in long_and_short_options():
        words, operands = cases.get(opt, ([opt], [cli.mp,
                                    f"nbd+unix:///?socket={NOSOCK}"]))
        placings = {"before": [*words, *operands],
                    "after": [*operands, *words]}
        if len(operands) > 1:
            placings["between"] = [operands[0], *words, *operands[1:]]
        seen = {}
        for where, args in placings.items():
            rc, out, err = cli.run("-f", *args)
            seen[where] = (rc, out, err)
            assert "unrecognized" not in err and "after the mountpoint" \
                not in err, (opt, where, err)
            assert not is_mounted(cli.mp), (opt, where)
        first = seen["before"]
        for where, got in seen.items():
            assert got == first, (opt, where, got, first)
        tried += 1
    assert tried >= 60, tried


def test_cli_all_exports_option_before_the_mountpoint(server, mount, shm):
    """nbdferry -f --all-exports MNT URI (the option before the
    mountpoint) mounts every export; the bytes land on the server."""
    d = shm / "exports"
    d.mkdir()
    for name in ("disk0", "disk1"):
        with open(d / name, "wb") as f:
            f.truncate(4 * MiB)
    srv = server("file", f"dir={d}")
    m = mount([srv.uri], "--all-exports", raw="disk1")
    data = random_bytes(MiB)
    with open(m.mp / "disk1", "r+b") as f:
        f.write(data)
    assert m.unmount() == 0
    assert (d / "disk1").read_bytes()[:MiB] == data
    assert (d / "disk0").read_bytes() == bytes(4 * MiB)


def test_cli_all_exports_refuses_an_export_in_the_uri(cli, server):
    """--all-exports with a URI that names an export would mount every
    export and silently drop the name: refused, nothing mounted."""
    srv = server("memory", "size=16M")
    uri = srv.uri.replace(":///", ":///disk0")
    assert "disk0" in uri
    rc, _, err = cli.run("-f", cli.mp, "--all-exports", uri)
    line = assert_one_clear_line(rc, err, "names an export")
    assert "disk0" in line
    assert not is_mounted(cli.mp)


@pytest.mark.parametrize("form", ["activation", "command"])
def test_cli_server_command_exit_status(cli, form):
    """A server command that exits before answering is reported with its
    exit status, not with libnbd's recv error."""
    args = (["[", "nbdkit", "nosuchplugin", "]"] if form == "activation"
            else ["--command", "nbdkit", "-s", "nosuchplugin"])
    rc, _, err = cli.run(cli.mp, *args)
    line = assert_one_clear_line(rc, err, "the server command exited",
                                 child_lines=True)
    assert "exited with status 1" in line and "recv" not in line, line
    assert not is_mounted(cli.mp)
    assert not cli.pidfile.exists()


def test_cli_help_lists_what_users_look_for(cli):
    rc, out, _ = cli.run("--help", pidfile=False)
    assert rc == 0
    for want in ("--socket-activation", "--read-only", "K, M, G or T",
                 "-o nonempty", "file mode", "--block-device",
                 "fusermount3 -u", "Options may stand anywhere"):
        assert want in out, f"--help does not say {want!r}"


def test_cli_size_suffix_t(cli, server):
    """The T suffix --help lists is accepted (and checked against the
    option's own limit, here --pool-size's 64G)."""
    srv = server("memory", "size=16M")
    rc, _, err = cli.run("--pool-size", "1T", cli.mp, srv.uri)
    assert_one_clear_line(rc, err, "--pool-size must be between")
    rc, _, err = cli.run("--expected-size", "1Ti", "-f", "--help",
                         pidfile=False)
    assert rc == 0, err
