"""One run: fresh nbdkit, optional mount, timed copy, unmount, verify.

Timing covers the client only: from spawning cp/dd/nbdcopy/qemu-img to its
exit.  cp and dd exit after close(), and close() on a FUSE file returns once
the daemon has every write acknowledged, so write-back daemons are not
flattered; the unmount (drain + NBD flush) is timed separately.  Mounting
and server start-up are outside the timing.

CPU seconds: client and daemon from wait4() rusage (the daemon's covers its
whole life, unmount included); server from /proc/PID/stat after the copy and
before the verification read-back.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

from lib.digest import blkhash_file, sha256_file, sha256_stream

from . import procs
from .report import parse_stats
from .sources import disk_path


class RunError(Exception):
    pass


@dataclass
class Env:
    workdir: str
    nbdferry: str              # path to the nbdferry binary ("" if missing)
    usdelay: str               # path to nbdkit-usdelay-filter.so ("" if none)
    verify: str = ""           # path to nbdferry-verify ("" if missing)
    ferry_opts: list = field(default_factory=list)
    stats: bool = True
    usdelay_all: bool = False  # use usdelay for whole-ms delays too
    timeout: float = 900.0     # per client run
    keep: bool = False
    nbdcopy_new: list = field(default_factory=list)  # argv of nbdcopy >= 1.24


def delay_args(env, lat_ms, key="wdelay"):
    """(nbdkit filter args, filter params) for a per-write delay (key
    "rdelay": per-read)."""
    if not lat_ms:
        return [], []
    if lat_ms == int(lat_ms) and not env.usdelay_all:
        return ["--filter=delay"], [f"{key}={int(lat_ms)}ms"]
    if not env.usdelay:
        raise RunError("sub-millisecond delay needs nbdkit-usdelay-filter.so")
    return [f"--filter={env.usdelay}"], [f"{key}={round(lat_ms * 1000)}us"]


def delay_how(env, lat_ms, key="wdelay"):
    f, p = delay_args(env, lat_ms, key)
    if not f:
        return "none"
    name = "usdelay" if "usdelay" in f[0] else "delay"
    return f"{name} {p[0]}"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(env, srv, lat, size, d, key="wdelay"):
    """Start the server for one run; returns (Popen or procs.Daemon, uri,
    backing file or None)."""
    if srv.plugin in OTHER_SERVERS:
        if lat:
            raise RunError(f"{srv.name}: per-request delays need nbdkit")
        return OTHER_SERVERS[srv.plugin](srv, size, d)
    pidfile = os.path.join(d, "nbdkit.pid")
    argv = ["nbdkit", "--exit-with-parent", "-P", pidfile]
    if srv.transport == "unix":
        sock = os.path.join(d, "nbd.sock")
        argv += ["-U", sock]
        uri = f"nbd+unix:///?socket={sock}"
    else:
        port = free_port()
        argv += ["-i", "127.0.0.1", "-p", str(port)]
        uri = f"nbd://127.0.0.1:{port}/"
    params = []
    if env.stats:
        argv += ["--filter=stats"]
        params += [f"statsfile={os.path.join(d, 'stats.txt')}",
                   "statsthreshold=0"]
    fargs, fparams = delay_args(env, lat, key)
    argv += fargs
    params += fparams
    for name, fp in srv.filters:
        argv += [f"--filter={name}"]
        params += list(fp)
    backing = None
    if srv.plugin == "memory":
        argv += ["memory", str(size)]
    elif srv.plugin == "file":
        backing = os.path.join(d, "backing.img")
        with open(backing, "wb") as f:
            f.truncate(size)
        argv += ["file", backing]
    else:
        raise ValueError(srv.plugin)
    argv += params
    p = procs.spawn(argv, log=os.path.join(d, "nbdkit.log"))
    procs.wait_for_file(pidfile, p, 30, "nbdkit")
    return p, uri, backing


def sparse_file(path, size):
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def endpoint(srv, d):
    """(qemu-nbd style listen args, URI) for the server's transport."""
    if srv.transport == "unix":
        sock = os.path.join(d, "nbd.sock")
        return ["-k", sock], f"nbd+unix:///?socket={sock}", sock
    port = free_port()
    return (["-b", "127.0.0.1", "-p", str(port)], f"nbd://127.0.0.1:{port}/",
            port)


def start_qemu_nbd(srv, size, d):
    """qemu-nbd on a raw file on tmpfs, in the foreground; --shared=8 so
    that it offers multi-conn as nbdkit does, --persistent so that the
    verification can connect after the copy."""
    backing = sparse_file(os.path.join(d, "backing.img"), size)
    listen, uri, where = endpoint(srv, d)
    pidfile = os.path.join(d, "qemu-nbd.pid")
    p = procs.spawn(["qemu-nbd", "--persistent", "--shared=8", "-f", "raw",
                     "--cache=writeback", "--discard=unmap", *listen,
                     "--pid-file", pidfile, backing],
                    log=os.path.join(d, "qemu-nbd.log"))
    procs.wait_for_file(pidfile, p, 30, "qemu-nbd")
    wait_listening(where, p, "qemu-nbd")
    return p, uri, backing


def start_nbd_server(srv, size, d):
    """nbd-server 3.24 with a config file in the run's directory, on TCP.
    It forks into the background (in the foreground it serves a single
    connection), so it is tracked by its pidfile.  flush = true, as
    docs/servers.md recommends for migrations."""
    if srv.transport != "tcp":
        raise RunError("nbd-server: TCP only")
    backing = sparse_file(os.path.join(d, "backing.img"), size)
    port = free_port()
    cfg = os.path.join(d, "nbd-server.conf")
    with open(cfg, "w") as f:
        f.write(f"[generic]\n    port = {port}\n    allowlist = false\n"
                f"[disk]\n    exportname = {backing}\n    flush = true\n")
    pidfile = os.path.join(d, "nbd-server.pid")
    r = subprocess.run(["nbd-server", "-C", cfg, "-p", pidfile],
                       stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, timeout=30)
    if r.returncode != 0:
        raise RunError(f"nbd-server exited {r.returncode}: "
                       f"{r.stderr.strip()[-300:]}")
    end = time.monotonic() + 30
    while not (os.path.exists(pidfile) and os.path.getsize(pidfile)):
        if time.monotonic() > end:
            raise RunError("nbd-server wrote no pidfile")
        time.sleep(0.01)
    with open(pidfile) as f:
        p = procs.Daemon(int(f.read().split()[0]), "nbd-server")
    wait_listening(port, p, "nbd-server")
    return p, f"nbd://127.0.0.1:{port}/disk", backing


def wait_listening(where, p, what, timeout=30):
    """Until a TCP port or a Unix socket accepts connections."""
    end = time.monotonic() + timeout
    while True:
        fam = socket.AF_UNIX if isinstance(where, str) else socket.AF_INET
        addr = where if isinstance(where, str) else ("127.0.0.1", where)
        with socket.socket(fam) as s:
            if s.connect_ex(addr) == 0:
                return
        alive = p.alive() if isinstance(p, procs.Daemon) else \
            p.poll() is None
        if not alive or time.monotonic() > end:
            raise RunError(f"{what} does not accept connections")
        time.sleep(0.02)


# Servers other than nbdkit: Server.plugin -> start function.
OTHER_SERVERS = {"qemu-nbd": start_qemu_nbd, "nbd-server": start_nbd_server}


def stop_server(server):
    if isinstance(server, procs.Daemon):
        procs.stop_daemon(server, grace=10)
    else:
        procs.kill(server, grace=10)


def start_daemon(env, arm, mnt, uri, d):
    pidfile = os.path.join(d, f"{arm.daemon}.pid")
    if arm.daemon == "nbdferry":
        argv = [env.nbdferry, "-f", "-P", pidfile, *arm.daemon_opts,
                *env.ferry_opts, mnt, uri]
    elif arm.daemon == "nbdfuse":
        argv = ["nbdfuse", "-P", pidfile, *arm.daemon_opts, mnt, uri]
    else:
        raise ValueError(arm.daemon)
    procs.add_mount(mnt)
    p = procs.spawn(argv, log=os.path.join(d, f"{arm.daemon}.log"))
    procs.wait_for_file(pidfile, p, 30, arm.daemon)
    if not procs.is_mounted(mnt):
        raise RunError(f"{arm.daemon} wrote its pidfile but {mnt} is not "
                       f"mounted")
    return p, argv


STATUS_FILES = {"nbdferry": ".nbdferry-status"}


def read_status(mnt, arm):
    """The daemon's own status (JSON) after the copy, if it has one."""
    name = STATUS_FILES.get(arm.daemon)
    if not name:
        return {}
    try:
        with open(os.path.join(mnt, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def settle_digest(mnt, arm, src_sha, res, limit=120.0):
    """After the timed copy: wait while nbdferry's inline digest is still
    hashing, then record its state, how long after the copy it was ready,
    and whether it equals the source's sha256.  A complete digest that
    differs fails the run; an abandoned one is reported, not failed."""
    dg = (res.get("daemon_status") or {}).get("digest")
    if not isinstance(dg, dict) or dg.get("state") in (None, "disabled"):
        return
    t0 = time.monotonic()
    # A fine poll: the lag is part of the defaults' time, and a coarse one
    # (it was 20 ms) adds half a period on average to a 0.3 s copy.
    while dg.get("state") == "computing" and time.monotonic() - t0 < limit:
        time.sleep(0.002)
        dg = read_status(mnt, arm).get("digest") or dg
    res["digest_state"] = dg.get("state")
    res["digest_lag_s"] = time.monotonic() - t0
    if dg.get("value"):
        res["digest_match"] = dg["value"] == src_sha
        if not res["digest_match"]:
            raise RunError(f"inline digest {dg['value'][:16]}... differs "
                           f"from the source's {src_sha[:16]}...")


_BLKHASH = {}        # source path -> its blkhash (sha256/64K)


def inline_blkhash(arm):
    """Does this arm's mount hash with blkhash (the daemon's default)?"""
    return arm.daemon == "nbdferry" and not any(
        o in ("--digest=sha256", "--no-digest", "--digest=none")
        for o in arm.daemon_opts)


def expected_digest(env, arm, src_path, src_sha):
    """What the inline digest (or the one a client prints) must equal: the
    source's sha256, or where the mount hashes with blkhash (its default,
    or --blkhash) the source's blkhash as nbdferry-verify computes it.
    Called before the clock starts; computed once per source."""
    if not inline_blkhash(arm) and arm.verified != "stdout-blkhash":
        return src_sha
    if src_path in _BLKHASH:
        return _BLKHASH[src_path]
    disk = src_path + ".raw"          # an image source: the disk it holds
    disk = disk if os.path.exists(disk) else src_path
    if not env.verify:                # the same digest, slower
        _BLKHASH[src_path] = blkhash_file(disk)
        return _BLKHASH[src_path]
    r = subprocess.run([env.verify, disk], capture_output=True, text=True)
    if r.returncode != 0 or not r.stdout.split():
        raise RunError(f"nbdferry-verify: {r.stderr.strip()}")
    _BLKHASH[src_path] = r.stdout.split()[0]
    return _BLKHASH[src_path]


def client_argv(env, arm, subst):
    """The arm's command: its template formatted, "{nbdcopy_new}" replaced
    by nbdcopy >= 1.24's command (which may be several words: a loader,
    its library path, the binary)."""
    argv = []
    for a in arm.client:
        if a == "{nbdcopy_new}":
            if not env.nbdcopy_new:
                raise RunError("no nbdcopy >= 1.24 (--nbdcopy-new)")
            argv += env.nbdcopy_new
        else:
            argv.append(a.format(**subst))
    return argv


def server_cost(env, srv, lat, src, src_path, out, runs=2):
    """The server's own cost in a cell: the same copy by nbdcopy (the
    system's) 'runs' times into one fresh server (out: from it, to
    /dev/null, once it holds the image).  Returns a dict: CPU seconds of
    the server per GiB for each copy (from /proc/PID/stat, all threads),
    and each copy's seconds.  The first copy into a fresh file also pays
    for allocating its pages on tmpfs; the second overwrites them."""
    d = tempfile.mkdtemp(dir=env.workdir, prefix="server-cost-")
    server = None
    gib = src.size / (1 << 30)
    res = dict(source=src.name, server=srv.name, latency=lat,
               direction="out" if out else "in", cpu_per_gib=[],
               seconds=[], error="")
    try:
        server, uri, backing = start_server(env, srv, lat, src.size, d,
                                            "rdelay" if out else "wdelay")
        disk = disk_path(src, src_path)
        if out:
            fill_export(disk, uri)
        for _ in range(runs):
            argv = (["nbdcopy", uri, "null:"] if out and
                    nbdcopy_has_null() else
                    ["nbdcopy", uri, os.path.join(d, "out.img")] if out else
                    ["nbdcopy", disk, uri])
            c0 = procs.proc_cpu_seconds(server.pid) or 0
            t0 = time.monotonic()
            r = subprocess.run(argv, capture_output=True, text=True,
                               timeout=env.timeout)
            res["seconds"].append(time.monotonic() - t0)
            res["cpu_per_gib"].append(
                ((procs.proc_cpu_seconds(server.pid) or 0) - c0) / gib)
            if r.returncode != 0:
                raise RunError(f"nbdcopy: {r.stderr.strip()[-300:]}")
            if out and os.path.exists(os.path.join(d, "out.img")):
                os.unlink(os.path.join(d, "out.img"))
    except (RunError, procs.Timeout, RuntimeError, OSError,
            subprocess.SubprocessError) as e:
        res["error"] = str(e)
    finally:
        if server is not None:
            stop_server(server)
        shutil.rmtree(d, ignore_errors=True)
    return res


_NULL = {}


def nbdcopy_has_null():
    """Does the system's nbdcopy take null: as a destination?"""
    if "v" not in _NULL:
        r = subprocess.run(["nbdcopy", "--help"], capture_output=True,
                           text=True)
        _NULL["v"] = "null:" in r.stdout + r.stderr
    return _NULL["v"]


def check_printed_digest(clog, src_sha, res):
    """A verified-copy client printed the export's sha256 (an end-to-end
    arm: the source's digest): it must be the source's."""
    with open(clog, errors="replace") as f:
        found = re.findall(r"\b[0-9a-f]{64}\b", f.read())
    if not found:
        raise RunError(f"no sha256 in the client's output: {log_tail(clog)}")
    res["digest_state"] = "complete"
    res["digest_match"] = found[-1] == src_sha
    if not res["digest_match"]:
        raise RunError(f"printed sha256 {found[-1][:16]}... differs from the "
                       f"source's {src_sha[:16]}...")


def count_digest_time(res, size):
    """A verified copy through nbdferry ends when the inline digest is
    complete (and equal, which settle_digest() checked)."""
    if res.get("digest_state") != "complete" or not res.get("digest_match"):
        raise RunError(f"inline digest not complete: "
                       f"{res.get('digest_state')}")
    res["seconds"] += res["digest_lag_s"]
    res["mibs"] = size / (1 << 20) / res["seconds"]


def verify(uri, backing):
    """sha256 of the whole export, read back from the server itself."""
    if backing:
        return sha256_file(backing)
    p = subprocess.Popen(["nbdcopy", uri, "-"], stdout=subprocess.PIPE,
                         stdin=subprocess.DEVNULL)
    digest, _ = sha256_stream(p.stdout)
    if p.wait() != 0:
        raise RunError(f"nbdcopy read-back of {uri} failed")
    return digest


def fill_export(src_path, uri):
    r = subprocess.run(["nbdcopy", src_path, uri], capture_output=True,
                       text=True)
    if r.returncode != 0:
        raise RunError(f"nbdcopy {src_path} {uri}: {r.stderr.strip()}")


def verify_out(arm, path, size):
    """sha256 of a copy-out's output file (a VHD converted back to raw
    first), then the file goes: it is as large as the disk."""
    if "qcow2" in arm.name:
        path = qcow2_to_raw(path)
    elif "vhdx" in arm.name:
        raw = path + ".raw"
        r = subprocess.run(["qemu-img", "convert", "-q", "-f", "vhdx", "-O",
                            "raw", path, raw], capture_output=True, text=True)
        if r.returncode != 0:
            raise RunError(f"qemu-img convert of the VHDX: {r.stderr.strip()}")
        os.unlink(path)
        path = raw
    elif "vhd" in arm.name:
        raw = path + ".raw"
        spec = {"driver": "vpc", "force_size_calc": "current_size",
                "file": {"driver": "file", "filename": path}}
        r = subprocess.run(["qemu-img", "convert", "-q",
                            "json:" + json.dumps(spec), "-O", "raw", raw],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RunError(f"qemu-img convert of the VHD: {r.stderr.strip()}")
        os.unlink(path)
        path = raw
    digest = sha256_file(path)
    os.unlink(path)
    return digest


def qcow2_to_raw(path):
    """A copy-out's qcow2, converted to raw by qemu-img (which checks it
    on the way); the qcow2 goes."""
    raw = path + ".raw"
    r = subprocess.run(["qemu-img", "convert", "-q", "-f", "qcow2", "-O",
                        "raw", path, raw], capture_output=True, text=True)
    if r.returncode != 0:
        raise RunError(f"qemu-img convert of the qcow2: {r.stderr.strip()}")
    os.unlink(path)
    return raw


def log_tail(path, n=3):
    try:
        with open(path, errors="replace") as f:
            lines = [l.rstrip() for l in f if l.strip()]
    except OSError:
        return ""
    return " | ".join(lines[-n:])


def run_one(env, arm, src, src_path, src_sha, srv, lat, idx):
    d = tempfile.mkdtemp(dir=env.workdir, prefix=f"run-{arm.name}-")
    res = dict(arm=arm.name, label=arm.label, source=src.name, server=srv.name,
               latency=lat, run=idx, size=src.size, ok=False, verified=False,
               seconds=None, mibs=None, cpu_client=None, cpu_daemon=None,
               cpu_server=None, umount_seconds=None, stats={}, error="",
               dir=d)
    server = daemon = client = None
    mnt = None
    try:
        out = arm.direction == "out"
        server, uri, backing = start_server(env, srv, lat, src.size, d,
                                            "rdelay" if out else "wdelay")
        subst = dict(src=src_path, uri=uri, mnt="", file="",
                     verify=env.verify, out=os.path.join(d, "out.img"))
        if out:
            fill_export(disk_path(src, src_path), uri)  # untimed, undelayed
        if arm.mounted:
            mnt = os.path.join(d, "mnt")
            os.mkdir(mnt)
            daemon, dargv = start_daemon(env, arm, mnt, uri, d)
            res["daemon_argv"] = dargv
            subst.update(mnt=mnt, file=os.path.join(mnt, "nbd"))
        argv = client_argv(env, arm, subst)
        res["argv"] = argv
        want = expected_digest(env, arm, disk_path(src, src_path),
                               src_sha)                       # not timed
        clog = os.path.join(d, "client.log")
        busy0 = procs.system_busy_seconds()
        srv0 = procs.proc_cpu_seconds(server.pid) or 0
        dmn0 = procs.proc_cpu_seconds(daemon.pid) if daemon else 0
        t0 = time.monotonic()
        client = procs.spawn(argv, log=clog)
        rc, ru = procs.wait4(client, env.timeout)
        res["seconds"] = time.monotonic() - t0
        busy = procs.system_busy_seconds() - busy0
        ours = (procs.cpu_seconds(ru) or 0) + \
            ((procs.proc_cpu_seconds(server.pid) or 0) - srv0) + \
            (((procs.proc_cpu_seconds(daemon.pid) or 0) - (dmn0 or 0))
             if daemon else 0)
        # Noise: CPU that other processes on the machine burnt meanwhile.
        res["foreign_cpu"] = max(0.0, busy - ours)
        res["ncpu"] = os.cpu_count()
        res["mibs"] = src.size / (1 << 20) / res["seconds"]
        res["cpu_client"] = procs.cpu_seconds(ru)
        if rc != 0:
            raise RunError(f"{argv[0]} exited {rc}: {log_tail(clog)}")
        if arm.verified in ("stdout", "e2e", "stdout-blkhash"):
            check_printed_digest(clog, want, res)
        if daemon:
            res["daemon_status"] = read_status(mnt, arm)
            settle_digest(mnt, arm, want, res)
            if arm.verified in ("inline", "e2e"):
                count_digest_time(res, src.size)
            t1 = time.monotonic()
            urc, uerr = procs.unmount(mnt)
            if urc != 0:
                raise RunError(f"fusermount3 -u failed: {uerr}")
            drc, dru = procs.wait4(daemon, env.timeout)
            res["umount_seconds"] = time.monotonic() - t1
            res["cpu_daemon"] = procs.cpu_seconds(dru)
            if drc != 0:
                raise RunError(f"{arm.daemon} exited {drc} after unmount: "
                               f"{log_tail(os.path.join(d, arm.daemon + '.log'))}")
        res["cpu_server"] = procs.proc_cpu_seconds(server.pid)
        digest = (verify_out(arm, subst["out"], src.size) if out
                  else verify(uri, backing))
        res["verified"] = digest == src_sha
        if not res["verified"]:
            raise RunError(f"sha256 mismatch: source {src_sha[:16]}..., "
                           f"server {digest[:16]}...")
        res["ok"] = True
    except (RunError, procs.Timeout, RuntimeError, OSError,
            subprocess.SubprocessError) as e:
        res["error"] = str(e)
    finally:
        if client is not None and client.returncode is None:
            procs.kill(client, grace=2)
        if mnt and procs.is_mounted(mnt):
            procs.unmount(mnt, lazy=True)
        if daemon is not None and daemon.returncode is None:
            procs.kill(daemon, grace=10)
        if server is not None:
            stop_server(server)
            res["stats"] = parse_stats(os.path.join(d, "stats.txt"))
    if res["ok"] and not env.keep:
        shutil.rmtree(d, ignore_errors=True)
    return res
