"""Secrets: a TLS key file open to group or others, or owned by another
user than the daemon's (or root), is refused (with the chmod or chown
that fixes it; the path is named only when it came from the
option, not from the URI, whose tls-psk-file values are redacted), and while a key is loaded the daemon cannot dump
core (a core file would carry the key).

The core test crashes a daemon on purpose (SIGSEGV) with RLIMIT_CORE
unlimited in a scratch directory: without a key a core file appears (the
control: proves this machine writes cores where the test looks), with a
PSK loaded none does."""

import os
import resource
import signal
import subprocess

import pytest

from lib.env import MiB, daemon_cmd, timeout
from lib.images import random_file
from lib.mounts import fusermount_u, is_mounted
from lib.procs import wait_for
from test_tls import make_psk, refused


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o620], ids=oct)
def test_secrets_psk_file_open_to_others_refused(server, shm, shortdir,
                                                 mode):
    keys = make_psk(shortdir)
    disk = random_file(shm / "disk.img", 16 * MiB)
    srv = server("file", disk, extra=["--tls=require", f"--tls-psk={keys}"])
    keys.chmod(mode)
    err = refused(shortdir, "--tls=require", "--tls-psk-file", keys,
                  "--tls-username", "alice", ["--unix", srv.sock])
    assert f"chmod 600 {keys}" in err, err
    # From the URI: the path is redacted like every tls-psk* value.
    err = refused(shortdir, [f"nbds+unix://alice@/?socket={srv.sock}"
                             f"&tls-psk-file={keys}"])
    assert "tls-psk-file is open to group or others" in err, err
    assert "chmod 600" in err and str(keys) not in err, err


def test_secrets_psk_file_of_another_user_refused(server, shm, shortdir):
    """A key file another user owns is refused even at mode 0600: that
    user can read the keys (and act as the server) or replace them.  The
    fix is named; nothing is mounted and the disk is untouched."""
    keys = make_psk(shortdir)
    disk = random_file(shm / "disk.img", 16 * MiB)
    before = disk.read_bytes()
    srv = server("file", disk, extra=["--tls=require", f"--tls-psk={keys}"])
    keys.chmod(0o600)
    os.chown(keys, 65534, 65534)
    err = refused(shortdir, "--tls=require", "--tls-psk-file", keys,
                  "--tls-username", "alice", ["--unix", srv.sock])
    assert "belongs to uid 65534" in err and f"chown root {keys}" in err, err
    err = refused(shortdir, [f"nbds+unix://alice@/?socket={srv.sock}"
                             f"&tls-psk-file={keys}"])
    assert "tls-psk-file belongs to uid 65534" in err, err
    assert "chown root" in err and str(keys) not in err, err
    assert disk.read_bytes() == before


def crash_and_look_for_core(shortdir, name, *args):
    """Start the daemon in the foreground in a scratch directory with
    cores allowed, wait for the mount, SIGSEGV it; return the core files
    it left there."""
    work = shortdir / name
    work.mkdir()
    mp = work / "mnt"
    mp.mkdir()

    def allow_core():
        resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY,
                                                  resource.RLIM_INFINITY))
    cmd = daemon_cmd("-f", "--pool-size", "1M", "--no-digest", "-C", "1",
                     *args[:-1], mp, *args[-1])
    with open(work / "err", "wb") as errf:
        p = subprocess.Popen(cmd, cwd=work, stdin=subprocess.DEVNULL,
                             stdout=errf, stderr=errf, preexec_fn=allow_core)
    try:
        wait_for(lambda: is_mounted(mp), p, "nbdferry mount", 30,
                 log=work / "err")
        p.send_signal(signal.SIGSEGV)
        rc = p.wait(timeout(60))
        assert rc == -signal.SIGSEGV, f"daemon exited {rc}"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
        fusermount_u(mp, wait=1)
    return sorted(work.glob("core*"))


def test_secrets_no_core_dump_while_key_loaded(server, shm, shortdir):
    disk = random_file(shm / "disk.img", 16 * MiB)
    plain = server("file", disk)
    control = crash_and_look_for_core(shortdir, "plain", ["--unix",
                                                          plain.sock])
    assert control, ("no core file from the daemon without a key: this "
                     "machine does not write cores to the working "
                     "directory (kernel.core_pattern), so the test cannot "
                     "tell")
    for c in control:
        c.unlink()
    keys = make_psk(shortdir)
    tls = server("file", disk, extra=["--tls=require", f"--tls-psk={keys}"])
    cores = crash_and_look_for_core(shortdir, "psk", "--tls=require",
                                    "--tls-psk-file", keys,
                                    "--tls-username", "alice",
                                    ["--unix", tls.sock])
    assert not cores, f"core dumped with the TLS key loaded: {cores}"
