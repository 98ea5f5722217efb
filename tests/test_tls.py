"""TLS: PSK and X.509 against nbdkit --tls=require, with keys and
certificates made here by gnutls-bin's psktool and certtool.

X.509 is verified or refused: a server whose certificate comes from a CA
the client does not trust (none given: the system's trust store; or
another CA's directory), or names another host, is refused; the right CA
is accepted; --tls-insecure is the only way around it and says so.  X.509
over a Unix socket (no host name to check) is refused.  PSK works as
before; a key file open to group or others is refused.  --tls=require
refuses a server that cannot do TLS.  Every copy is verified by sha256
through the mount and in the server's backing file.

The key files (the last section): a TLS key file open to group or
others, or owned by another user than the daemon's (or root), is refused
(with the chmod or chown that fixes it; the path is named only when it
came from the option, not from the URI, whose tls-psk-file values are
redacted), and while a key is loaded the daemon cannot dump core (a core
file would carry the key).

The core test crashes a daemon on purpose (SIGSEGV) with RLIMIT_CORE
unlimited in a scratch directory: without a key a core file appears (the
control: proves this machine writes cores where the test looks), with a
PSK loaded none does."""

import os
import re
import resource
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from lib.digest import sha256_file
from lib.env import MiB, daemon_cmd, timeout
from lib.faults import sha256_prefix
from lib.images import random_file
from lib.mounts import fusermount_u, is_mounted
from lib.procs import run, wait_for
from lib.tls import make_psk
from test_verify import VERIFY

pytestmark = pytest.mark.skipif(
    not (shutil.which("psktool") and shutil.which("certtool")),
    reason="needs gnutls-bin (psktool, certtool)")

EXPORT = 32 * MiB
SRC = 8 * MiB


def certtool(*args, template=None, d=None):
    cmd = ["certtool", *map(str, args)]
    if template is not None:
        t = Path(d) / "t.info"
        t.write_text(template)
        cmd += ["--template", str(t)]
    subprocess.run(cmd, check=True, capture_output=True)


def make_pki(d, name="pki", host="localhost"):
    """CA + server certificate for host (and 127.0.0.1 when host is
    localhost).  Returns (server_dir, client_dir): nbdkit wants
    ca-cert.pem, server-cert.pem and server-key.pem; the client only the
    CA's ca-cert.pem."""
    ip = "ip_address = 127.0.0.1\n" if host == "localhost" else ""
    base = Path(d) / name
    srv, cli = base / "server", base / "client"
    srv.mkdir(parents=True)
    cli.mkdir()
    ca_key, ca_cert = base / "ca-key.pem", srv / "ca-cert.pem"
    certtool("--generate-privkey", "--outfile", ca_key)
    certtool("--generate-self-signed", "--load-privkey", ca_key, "--outfile",
             ca_cert, d=base, template="cn = nbdferry test CA\nca\n"
             "cert_signing_key\nexpiration_days = 2\n")
    key = srv / "server-key.pem"
    certtool("--generate-privkey", "--outfile", key)
    certtool("--generate-certificate", "--load-ca-certificate", ca_cert,
             "--load-ca-privkey", ca_key, "--load-privkey", key,
             "--outfile", srv / "server-cert.pem", d=base,
             template=f"organization = nbdferry tests\ncn = {host}\n"
             f"dns_name = {host}\n{ip}"
             "tls_www_server\nencryption_key\nsigning_key\n"
             "expiration_days = 2\n")
    key.chmod(0o600)
    shutil.copy(ca_cert, cli / "ca-cert.pem")
    return srv, cli


def disk_server(server, shm, *extra, tcp=False):
    disk = random_file(shm / "disk.img", EXPORT)
    srv = server("file", disk, tcp=tcp, extra=list(extra))
    srv.disk = disk
    return srv


def copy_and_verify(m, shm, disk):
    src = random_file(shm / "src.img", SRC)
    run(["dd", f"if={src}", f"of={m.file}", "bs=1M", "conv=fsync",
         "status=none"], check=True)
    want = sha256_file(src)
    assert sha256_prefix(m.file, SRC) == want, "through the mount"
    assert sha256_prefix(disk, SRC) == want, "on the server"


def refused(shortdir, *args):
    """Run the daemon in the foreground expecting it to fail to start:
    returns its stderr; asserts non-zero exit and nothing mounted."""
    mp = shortdir / "refused"
    mp.mkdir(exist_ok=True)
    r = subprocess.run(daemon_cmd("-f", *args[:-1], mp, *args[-1]),
                       capture_output=True, text=True, timeout=timeout(60),
                       stdin=subprocess.DEVNULL)
    assert r.returncode != 0, "the daemon started although it should not"
    assert not is_mounted(mp)
    assert r.stderr.strip(), "no message"
    return r.stderr


# ------------------------------------------------------------------ PSK

def test_tls_psk_options(server, mount, shm, shortdir):
    keys = make_psk(shortdir)
    srv = disk_server(server, shm, "--tls=require", f"--tls-psk={keys}")
    m = mount(["--unix", srv.sock], "--tls=require", "--tls-psk-file", keys,
              "--tls-username", "alice")
    copy_and_verify(m, shm, srv.disk)


def test_tls_psk_uri(server, mount, shm, shortdir):
    keys = make_psk(shortdir)
    srv = disk_server(server, shm, "--tls=require", f"--tls-psk={keys}")
    uri = f"nbds+unix://alice@/?socket={srv.sock}&tls-psk-file={keys}"
    m = mount(uri)
    copy_and_verify(m, shm, srv.disk)


def verify_tls(uri, disk):
    """nbdferry-verify over a TLS URI: the disk's sha256, and a match
    against the server's backing file."""
    p = subprocess.run([str(VERIFY), "--digest=sha256", uri],
                       capture_output=True, text=True, timeout=timeout(60))
    assert p.returncode == 0, p.stderr
    assert p.stdout.split()[0] == sha256_file(disk), p.stdout
    p = subprocess.run([str(VERIFY), "--request-timeout=10", disk, uri],
                       capture_output=True, text=True, timeout=timeout(60))
    assert p.returncode == 0, (p.stdout, p.stderr)


def test_tls_psk_uri_verify(server, shm, shortdir):
    """nbdferry-verify takes the URI's tls-psk-file (a local file libnbd
    refuses unless asked)."""
    keys = make_psk(shortdir)
    srv = disk_server(server, shm, "--tls=require", f"--tls-psk={keys}")
    verify_tls(f"nbds+unix://alice@/?socket={srv.sock}&tls-psk-file={keys}",
               srv.disk)


def test_tls_x509_uri_verify(server, shm, shortdir):
    sdir, cdir = make_pki(shortdir)
    srv = disk_server(server, shm, "--tls=require",
                      f"--tls-certificates={sdir}", tcp=True)
    verify_tls(f"nbds://localhost:{srv.port}/?tls-certificates={cdir}",
               srv.disk)


def test_tls_psk_wrong_key_refused(server, shm, shortdir):
    keys = make_psk(shortdir)
    other = shortdir / "other"
    other.mkdir()
    wrong = make_psk(other)                 # same user, another key
    srv = disk_server(server, shm, "--tls=require", f"--tls-psk={keys}")
    err = refused(shortdir, "--tls=require", "--tls-psk-file", wrong,
                  "--tls-username", "alice", ["--unix", srv.sock])
    assert "cannot connect" in err, err


def test_tls_psk_tcp_multi_conn(server, mount, shm, shortdir):
    """TLS over TCP with several connections (file offers multi-conn)."""
    keys = make_psk(shortdir)
    srv = disk_server(server, shm, "--tls=require", f"--tls-psk={keys}",
                      tcp=True)
    m = mount(["--tcp", "127.0.0.1", srv.port], "-C", "4", "--tls=require",
              "--tls-psk-file", keys, "--tls-username", "alice")
    copy_and_verify(m, shm, srv.disk)


# ----------------------------------------------------------------- X.509

def test_tls_x509_verify_peer(server, mount, shm, shortdir):
    sdir, cdir = make_pki(shortdir)
    srv = disk_server(server, shm, "--tls=require",
                      f"--tls-certificates={sdir}", tcp=True)
    m = mount(["--tcp", "localhost", srv.port], "--tls=require",
              "--tls-certificates", cdir, "--tls-verify-peer")
    copy_and_verify(m, shm, srv.disk)


def test_tls_x509_uri(server, mount, shm, shortdir):
    sdir, cdir = make_pki(shortdir)
    srv = disk_server(server, shm, "--tls=require",
                      f"--tls-certificates={sdir}", tcp=True)
    m = mount(f"nbds://localhost:{srv.port}/?tls-certificates={cdir}")
    copy_and_verify(m, shm, srv.disk)


def client_cert(sdir, cdir):
    """A client certificate of the test CA in cdir (client-cert.pem,
    client-key.pem 0600), for a server started with --tls-verify-peer."""
    base = Path(sdir).parent
    key = Path(cdir) / "client-key.pem"
    certtool("--generate-privkey", "--outfile", key)
    certtool("--generate-certificate", "--load-ca-certificate",
             Path(sdir) / "ca-cert.pem", "--load-ca-privkey",
             base / "ca-key.pem", "--load-privkey", key, "--outfile",
             Path(cdir) / "client-cert.pem", d=base,
             template="cn = nbdferry test client\ntls_www_client\n"
             "encryption_key\nsigning_key\nexpiration_days = 2\n")
    key.chmod(0o600)


def export_dir_server(server, shm, sdir):
    """Two exports over TLS that verifies the client's certificate."""
    d = shm / "exports"
    d.mkdir()
    for name in ("disk0", "disk1"):
        random_file(d / name, EXPORT)
    srv = server("file", f"dir={d}", tcp=True,
                 extra=["--tls=require", f"--tls-certificates={sdir}",
                        "--tls-verify-peer"])
    srv.dir = d
    return srv


@pytest.mark.parametrize("how", ["option", "uri"])
def test_tls_x509_client_cert_list(server, shm, shortdir, how):
    """--list over nbds:// takes the TLS options (here a client
    certificate the server insists on), or tls-certificates in the URI."""
    sdir, cdir = make_pki(shortdir)
    client_cert(sdir, cdir)
    srv = export_dir_server(server, shm, sdir)
    uri = f"nbds://localhost:{srv.port}/"
    args = (["--tls-certificates", str(cdir), "--list", uri] if how ==
            "option" else ["--list", f"{uri}?tls-certificates={cdir}"])
    r = subprocess.run(daemon_cmd(*args), capture_output=True, text=True,
                       timeout=timeout(60))
    assert r.returncode == 0, r.stderr
    got = sorted(line.split("\t")[:2] for line in r.stdout.splitlines())
    assert got == [["disk0", str(EXPORT)], ["disk1", str(EXPORT)]], r.stdout


@pytest.mark.parametrize("how", ["option", "uri"])
def test_tls_x509_client_cert_all_exports(server, mount, shm, shortdir,
                                          how):
    """--all-exports over nbds:// with a client certificate: the listing
    and every disk's connections take the same TLS options; the bytes
    land on the server."""
    sdir, cdir = make_pki(shortdir)
    client_cert(sdir, cdir)
    srv = export_dir_server(server, shm, sdir)
    uri = f"nbds://localhost:{srv.port}/"
    if how == "option":
        m = mount(["--all-exports", uri], "--tls-certificates", cdir,
                  raw="disk1")
    else:
        m = mount(["--all-exports", f"{uri}?tls-certificates={cdir}"],
                  raw="disk1")
    before0 = sha256_file(srv.dir / "disk0")
    src = random_file(shm / "src.img", SRC)
    run(["dd", f"if={src}", f"of={m.mp / 'disk1'}", "bs=1M",
         "conv=fsync,notrunc", "status=none"], check=True)
    assert m.unmount() == 0
    assert sha256_prefix(srv.dir / "disk1", SRC) == sha256_file(src)
    assert sha256_file(srv.dir / "disk0") == before0


def test_tls_x509_other_ca_refused(server, shm, shortdir):
    """The client trusts another CA than the one that signed the
    server's certificate."""
    sdir, _ = make_pki(shortdir, "pki1")
    _, other_cdir = make_pki(shortdir, "pki2")
    srv = disk_server(server, shm, "--tls=require",
                      f"--tls-certificates={sdir}", tcp=True)
    err = refused(shortdir, "--tls=require", "--tls-certificates",
                  other_cdir, "--tls-verify-peer",
                  ["--tcp", "localhost", str(srv.port)])
    assert "cannot connect" in err, err
    err = refused(shortdir, [f"nbds://localhost:{srv.port}/"
                             f"?tls-certificates={other_cdir}"])
    assert "cannot connect" in err, err


@pytest.mark.parametrize("how", ["uri", "uri-verify-flag", "tcp"])
def test_tls_x509_unknown_ca_refused(server, shm, shortdir, how):
    """No CA directory given: the server's CA is in no trust store the
    client knows (the system's), so the mount is refused, with or
    without --tls-verify-peer (libnbd alone would connect unverified)."""
    sdir, _ = make_pki(shortdir)
    srv = disk_server(server, shm, "--tls=require",
                      f"--tls-certificates={sdir}", tcp=True)
    args = {"uri": [[f"nbds://localhost:{srv.port}/"]],
            "uri-verify-flag": ["--tls-verify-peer",
                                [f"nbds://localhost:{srv.port}/"]],
            "tcp": ["--tls=require",
                    ["--tcp", "localhost", str(srv.port)]]}[how]
    before = ca_dirs()
    err = refused(shortdir, *args)
    assert "cannot connect" in err, err
    assert ca_dirs() <= before, "the private CA directory was left behind"


def ca_dirs():
    """The daemon's private CA directories (mkdtemp under TMPDIR)."""
    return set(Path(os.environ.get("TMPDIR", "/tmp")).glob("nbdferry-ca-*"))


def test_tls_x509_wrong_host_refused(server, shm, shortdir):
    """The right CA, but the certificate names another host."""
    sdir, cdir = make_pki(shortdir, host="otherhost.example")
    srv = disk_server(server, shm, "--tls=require",
                      f"--tls-certificates={sdir}", tcp=True)
    err = refused(shortdir, "--tls=require", "--tls-certificates", cdir,
                  ["--tcp", "localhost", str(srv.port)])
    assert "cannot connect" in err, err
    err = refused(shortdir, [f"nbds://127.0.0.1:{srv.port}/"
                             f"?tls-certificates={cdir}"])
    assert "cannot connect" in err, err


def test_tls_x509_insecure_is_explicit_and_logged(server, mount, shm,
                                                  shortdir):
    """--tls-insecure connects to an unverifiable server, and the log
    says it is insecure."""
    sdir, _ = make_pki(shortdir, host="otherhost.example")
    srv = disk_server(server, shm, "--tls=require",
                      f"--tls-certificates={sdir}", tcp=True)
    m = mount([f"nbds://localhost:{srv.port}/"], "--tls-insecure",
              expect_errors=True)
    copy_and_verify(m, shm, srv.disk)
    m.unmount()
    assert re.search(r"warning: --tls-insecure: .*NOT verified", m.stderr), \
        m.stderr


def test_tls_x509_unix_socket_refused(server, shm, shortdir):
    """Over a Unix socket there is no host name to check the certificate
    against: refused, with the ways out."""
    sdir, cdir = make_pki(shortdir)
    srv = disk_server(server, shm, "--tls=require",
                      f"--tls-certificates={sdir}")
    err = refused(shortdir, "--tls=require", "--tls-certificates", cdir,
                  ["--unix", srv.sock])
    assert "cannot be verified without the server's host name" in err, err
    assert "--tls-insecure" in err, err


def test_tls_x509_ca_dir_without_ca_cert_refused(server, shm, shortdir):
    """A certificate directory without ca-cert.pem would make libnbd fall
    back to checking nothing: refused."""
    sdir, _ = make_pki(shortdir)
    empty = shortdir / "empty"
    empty.mkdir()
    srv = disk_server(server, shm, "--tls=require",
                      f"--tls-certificates={sdir}", tcp=True)
    err = refused(shortdir, "--tls-certificates", empty,
                  [f"nbds://localhost:{srv.port}/"])
    assert "ca-cert.pem" in err, err


# ------------------------------------------------------------ plain server

def test_tls_require_refuses_plain_server(server, shm, shortdir):
    srv = disk_server(server, shm)
    keys = make_psk(shortdir)
    err = refused(shortdir, "--tls=require", "--tls-psk-file", keys,
                  "--tls-username", "alice", ["--unix", srv.sock])
    assert "cannot connect" in err, err
    err = refused(shortdir, [f"nbds+unix:///?socket={srv.sock}"
                             f"&tls-psk-file={keys}"])
    assert "cannot connect" in err, err
    # X.509 over a Unix socket is refused before connecting.
    err = refused(shortdir, [f"nbds+unix:///?socket={srv.sock}"])
    assert "host name" in err, err


def test_tls_allow_accepts_plain_server(server, mount, shm):
    srv = disk_server(server, shm)
    m = mount(["--unix", srv.sock], "--tls=allow")
    copy_and_verify(m, shm, srv.disk)


def test_tls_off_refused_by_tls_server(server, shm, shortdir):
    keys = make_psk(shortdir)
    srv = disk_server(server, shm, "--tls=require", f"--tls-psk={keys}")
    refused(shortdir, "--tls=off", ["--unix", srv.sock])


# ------------------------------------------------------------ key files

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
