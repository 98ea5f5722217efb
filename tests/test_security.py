"""Security: secrets stay out of logs, status and process
titles; the mount is private unless -o allow_other; writes beyond the
export, negative or overflowing offsets and absurd option values give
clean errors.

What argv shows: /proc/PID/cmdline is what the user typed, so a secret
put in a URI (a password, a key in a query) is visible to every local
user for the daemon's lifetime.  Keys belong in a file (--tls-psk-file or
the URI's tls-psk-file=PATH, which names the file, not the key); these
tests check that the key itself never shows anywhere."""

import ctypes
import errno
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from lib.env import MiB, daemon_cmd, timeout
from lib.faults import sha256_prefix
from lib.images import random_bytes, random_file
from lib.mounts import is_mounted
from lib.tls import make_psk, psk_key

EXPORT = 16 * MiB
NOBODY = 65534


def as_nobody(*cmd):
    return subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
                           "--clear-groups", *map(str, cmd)],
                          capture_output=True, text=True, timeout=timeout(30))


def visible(m):
    """Everything a local user or a log reader can see of the daemon."""
    out = {"stderr": m.stderr}
    with open(f"/proc/{m.pid}/cmdline", "rb") as f:
        out["cmdline"] = f.read().replace(b"\0", b" ").decode()
    with open(f"/proc/{m.pid}/comm") as f:
        out["comm"] = f.read()
    st = Path(m.mp) / ".nbdferry-status"
    out["status"] = st.read_text() if st.exists() else ""
    return out


# ------------------------------------------------------------- secrets

@pytest.mark.skipif(not shutil.which("psktool"), reason="needs psktool")
@pytest.mark.parametrize("verbosity", [
    0, 1,
    2])
def test_security_psk_never_shown(server, mount, shm, shortdir, verbosity):
    """PSK in a file named by the URI: the key never appears; the file's
    path (a URI query value of a tls-psk* key) is redacted in logs and
    status; argv shows what the user typed (documented)."""
    keys = make_psk(shortdir)
    key = psk_key(keys)
    disk = random_file(shm / "disk.img", EXPORT)
    srv = server("file", disk, extra=["--tls=require", f"--tls-psk={keys}"])
    uri = f"nbds+unix://alice@/?socket={srv.sock}&tls-psk-file={keys}"
    m = mount(uri, *(["-v"] * verbosity), expect_errors=verbosity > 0)
    data = random_bytes(MiB)
    fd = os.open(m.file, os.O_RDWR)
    try:
        os.pwrite(fd, data, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    seen = visible(m)
    m.unmount(check=False)
    m.checked = True
    seen["stderr"] = m.stderr                   # including the exit lines
    for where, text in seen.items():
        assert key not in text, f"the PSK itself shows in {where}"
    for where in ("stderr", "status", "comm"):
        assert str(keys) not in seen[where], (
            f"the PSK file's path shows in {where}:\n" +
            "\n".join(l for l in seen[where].splitlines() if str(keys) in l))
    assert str(keys) in seen["cmdline"]        # argv: what the user typed
    assert sha256_prefix(disk, MiB) == sha256_file_bytes(data)


def sha256_file_bytes(b):
    import hashlib
    return hashlib.sha256(b).hexdigest()


@pytest.mark.parametrize("verbosity", [
    0, 1,
    2])
@pytest.mark.parametrize("uri", [
    "nbd+unix://alice:S3cretPw@/?socket={sock}",
    "nbd://alice:S3cretPw@127.0.0.1:1/",
    "nbd+unix:///?socket={sock}&password=S3cretPw",
    "nbds+unix://alice@/?socket={sock}&tls-psk-file=/S3cretPw/keys",
])
def test_security_uri_secret_not_in_errors(shortdir, uri, verbosity):
    """A URI the daemon cannot connect to: its failure message (and, with
    -v, everything else) names the server without the secret."""
    mp = shortdir / "mp"
    mp.mkdir()
    u = uri.format(sock=shortdir / "nothing.sock")
    r = subprocess.run(daemon_cmd("-f", *(["-v"] * verbosity), mp, u),
                       capture_output=True, text=True, timeout=timeout(60),
                       stdin=subprocess.DEVNULL)
    assert r.returncode != 0
    assert "cannot connect" in r.stderr, r.stderr
    leaks = [l for l in r.stderr.splitlines() if "S3cretPw" in l]
    assert not leaks, "secret in stderr:\n" + "\n".join(leaks)


# --------------------------------------------------------- private mount

def test_security_private_by_default(server, mount, shortdir):
    """No allow_other: another uid cannot even stat the file."""
    os.chmod(shortdir, 0o755)        # the mount, not this, must refuse
    srv = server("memory", f"size={EXPORT}")
    m = mount(srv)
    st = os.stat(m.file)
    assert st.st_mode & 0o777 == 0o600, oct(st.st_mode)
    r = as_nobody("ls", m.mp)
    assert r.returncode != 0 and "Permission denied" in r.stderr, r
    r = as_nobody("head", "-c", "16", m.file)
    assert r.returncode != 0 and "Permission denied" in r.stderr, r
    r = as_nobody("sh", "-c", f"echo x | dd of={m.file} conv=notrunc")
    assert r.returncode != 0 and "Permission denied" in r.stderr, r
    r = as_nobody("cat", Path(m.mp) / ".nbdferry-status")
    assert r.returncode != 0, "status readable by another user"


def test_security_allow_other_respects_file_mode(server, mount, shortdir):
    """-o allow_other lets other users into the mount, but the file is
    0600: they still get EACCES on it."""
    os.chmod(shortdir, 0o755)
    srv = server("memory", f"size={EXPORT}")
    m = mount(srv, "-o", "allow_other")
    assert as_nobody("ls", m.mp).returncode == 0   # the directory: yes
    r = as_nobody("head", "-c", "16", m.file)
    w = as_nobody("sh", "-c", f"echo x | dd of={m.file} conv=notrunc")
    assert r.returncode != 0 and w.returncode != 0, (
        f"another uid read (rc {r.returncode}) or wrote (rc {w.returncode}) "
        "a 0600 file")


def test_security_allow_other_default_permissions(server, mount, shortdir):
    """The safe opt-in today: -o allow_other,default_permissions (the
    kernel enforces the 0600 mode)."""
    os.chmod(shortdir, 0o755)
    srv = server("memory", f"size={EXPORT}")
    m = mount(srv, "-o", "allow_other,default_permissions")
    d = os.stat(m.mp).st_mode & 0o777
    print(f"mount root mode {oct(d)}")
    r = as_nobody("head", "-c", "16", m.file)
    assert r.returncode != 0 and "Permission denied" in r.stderr, r
    w = as_nobody("sh", "-c", f"echo x | dd of={m.file} conv=notrunc")
    assert w.returncode != 0, w


# ------------------------------------------------------- bounds, offsets

def test_security_write_beyond_export_enospc(server, mount, shm):
    srv = server("memory", f"size={EXPORT}")
    m = mount(srv, expect_errors=True)
    data = random_bytes(8192)
    fd = os.open(m.file, os.O_RDWR)
    try:
        # Straddling the end: a short write or ENOSPC, never past it.
        try:
            n = os.pwrite(fd, data, EXPORT - 4096)
            assert n == 4096, f"wrote {n} bytes across the end"
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
        for off in (EXPORT, EXPORT + 1, EXPORT + MiB, 1 << 40):
            with pytest.raises(OSError) as ei:
                os.pwrite(fd, data, off)
            assert ei.value.errno in (errno.ENOSPC, errno.EFBIG), (off,
                                                                   ei.value)
        os.fsync(fd)
    finally:
        os.close(fd)
    assert os.stat(m.file).st_size == EXPORT
    with open(m.file, "rb") as f:
        f.seek(EXPORT - 4096)
        tail_ = f.read()
    assert len(tail_) == 4096


def fallocate(fd, mode, off, length):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64,
                               ctypes.c_int64]
    if libc.fallocate(fd, mode, off, length) == -1:
        return ctypes.get_errno()
    return 0


def test_security_bad_offsets_clean_errors(server, mount, shm):
    """Negative and overflowing offsets and lengths: clean errno, nothing
    written, the daemon still serves."""
    srv = server("memory", f"size={EXPORT}")
    m = mount(srv, expect_errors=True)
    before = sha256_prefix(m.file, EXPORT)
    fd = os.open(m.file, os.O_RDWR)
    got = {}
    try:
        for off in (-1, -(1 << 63), (1 << 63) - 1, (1 << 63) - 4096,
                    (1 << 64) - 4096 - (1 << 63)):
            try:
                os.pwrite(fd, b"x" * 4096, off)
                got[("pwrite", off)] = 0
            except (OSError, OverflowError) as e:
                got[("pwrite", off)] = getattr(e, "errno", "overflow")
            try:
                os.pread(fd, 4096, off)
                got[("pread", off)] = 0
            except (OSError, OverflowError) as e:
                got[("pread", off)] = getattr(e, "errno", "overflow")
        PUNCH, KEEP = 0x02, 0x01
        for off, ln in ((-1, 4096), ((1 << 63) - 4096, 8192),
                        (0, (1 << 63) - 1), (EXPORT - 4096, 1 << 40)):
            got[("punch", off, ln)] = fallocate(fd, PUNCH | KEEP, off, ln)
        for size in (-1, (1 << 63) - 1, EXPORT + 1):
            try:
                os.ftruncate(fd, size)
                got[("truncate", size)] = 0
            except OSError as e:
                got[("truncate", size)] = e.errno
        os.fsync(fd)
    finally:
        os.close(fd)
    ok_errnos = {errno.EINVAL, errno.EFBIG, errno.ENOSPC, errno.EOVERFLOW,
                 errno.ENXIO}
    for k, v in got.items():
        if k[0] == "pread":
            assert v == 0 or v in ok_errnos, (k, v)   # EOF reads are fine
        elif k[0] == "punch" and k[1] >= 0 and k[1] < EXPORT:
            assert v in ok_errnos | {0}, (k, v)
        else:
            assert v in ok_errnos, f"{k}: got {v}, expected a clean errno"
    assert m.proc.poll() is None, "the daemon died"
    # A punch from EXPORT-4096 with a huge length zeroes only up to the
    # end; everything else is untouched.
    with open(m.file, "rb") as f:
        head = f.read(EXPORT - 4096)
    import hashlib
    assert hashlib.sha256(head).hexdigest() == \
        sha256_prefix_bytes(before, head), "bytes changed"
    print("errnos:", got)


def sha256_prefix_bytes(before_sha, head):
    # The export was all zero (memory plugin) before.
    import hashlib
    return hashlib.sha256(bytes(len(head))).hexdigest()


# --------------------------------------------------------- absurd options

ABSURD = [
    ("--depth", "0"), ("--depth", "99999999999999999999999"),
    ("--depth", "-1"), ("--connections", "1000"), ("-C", "0"),
    ("--request-size", "-1"), ("--request-size", "1"),
    ("--request-size", "99999999999999999999T"),
    ("--pool-size", "16E"), ("--pool-size", "1T"), ("--pool-size", "0"),
    ("--idle-ms", "abc"), ("--idle-ms", "0"),
    ("--retry-timeout", "1e9"), ("--retry-timeout", "99999999"),
    ("--expected-size", "18446744073709551616"), ("--tls", "maybe"),
    ("--tls-psk-file", "/nonexistent/keys.psk"),
    ("--tls-certificates", "/nonexistent/pki"),
    ("--progress=99999", None), ("--fd", "2147483648"),
]


@pytest.mark.parametrize("opt,val", ABSURD,
                         ids=[f"{o}={v}" for o, v in ABSURD])
def test_security_absurd_option_one_line(server, shortdir, opt, val):
    srv = server("memory", f"size={EXPORT}")
    mp = shortdir / "mp"
    mp.mkdir()
    args = [opt] if val is None else [opt, val]
    if opt == "--fd":
        cmd = daemon_cmd("-f", mp, *args)
    else:
        cmd = daemon_cmd("-f", *args, mp, srv.uri)
    r = subprocess.run(cmd, capture_output=True, text=True,
                       timeout=timeout(30), stdin=subprocess.DEVNULL)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert r.returncode != 0, f"{args} accepted"
    assert not is_mounted(mp)
    assert len(lines) == 1, f"{args}: expected one line:\n{r.stderr}"
    assert re.match(r"(\S*/)?nbdferry: ", lines[0]), lines[0]
