"""Model-based random I/O on the mounted file, alone and with concurrent
readers and closers (tests/exerciser/exer.c, built as nbdferry-exer).

Each seed gets a fresh 32 MiB export pre-filled with seed-determined random
bytes and a fresh mount.  The exerciser applies random pwrite, pread,
ftruncate down and up, punch-hole, zero-range, copy_file_range, fsync,
fdatasync, SEEK_DATA/SEEK_HOLE and close+reopen within the first 8 MiB,
checking every read, size and seek result against its model of the export.
Beside it, 1 to 3 "disturber" processes loop open (read-only or
read-write), read, maybe fsync, close on the same file: a close or an fsync
by a process that never wrote must not change what the writer reads, and
must not fail.  After the writer closes, the export read directly from
the server must equal the model (sha256), and again after the unmount.

Two servers: nbdkit's memory plugin behind the delay filter (1 ms on every
request; it answers block status, so zero maps are seeded from the server)
and the random-delay RAM disk of tests/nbdkit-plugins/jitter.c (requests
complete out of order).

CI runs 10 seeds per server with disturbers and 5 without (20 and 10
in all), 2000 operations each.  NBDFERRY_SOAK=1 runs a soak instead:
NBDFERRY_SOAK_SEEDS seeds (default 200) of NBDFERRY_SOAK_OPS operations
(default 10000) per case, starting at NBDFERRY_SOAK_FIRST (default 1000).

A failing case names every failing seed with the exerciser's message (the
operation number, the operation and the first differing offset); rerun one
by hand with the command line it prints.
"""

import os
import random
import signal
import subprocess
import time

import pytest

from lib.digest import sha256_file
from lib.env import BUILD, MiB, timeout
from lib.mounts import stderr_problems
from lib.nbd import sha256_nbd, write_nbd
from lib.procs import tail

EXER = BUILD / "tests" / "exerciser" / "nbdferry-exer"
EXPORT = 32 * MiB
AREA = 8 * MiB
MAXOP = 256 * 1024
STRESS = ("--depth", "64", "--request-size", "64K")

SOAK = os.environ.get("NBDFERRY_SOAK", "") not in ("", "0")
if SOAK:
    FIRST = int(os.environ.get("NBDFERRY_SOAK_FIRST", "1000"))
    NSEEDS = int(os.environ.get("NBDFERRY_SOAK_SEEDS", "200"))
    OPS = int(os.environ.get("NBDFERRY_SOAK_OPS", "10000"))
    CASES = {"alone": NSEEDS, "disturbed": NSEEDS}
else:
    FIRST, OPS = 1, 2000
    CASES = {"alone": 5, "disturbed": 10}


def exer(*args):
    if not EXER.exists():
        pytest.fail(f"{EXER} not found (build the tree, or set "
                    "NBDFERRY_BUILD)")
    return [str(EXER)] + [str(a) for a in args]


def start_export(kind, seed, server, jitter_server, shm):
    """A fresh export of random bytes determined by seed; returns (server,
    path of a file holding the same bytes)."""
    content = random.Random(seed).randbytes(EXPORT)
    init = shm / "init.img"
    init.write_bytes(content)
    if kind == "memory-delay":
        srv = server("memory", f"size={EXPORT}", "delay-read=1ms",
                     "delay-write=1ms", "delay-zero=1ms", "delay-trim=1ms",
                     "delay-extents=1ms", filters=["delay"])
        write_nbd(srv.uri, content)
    else:
        srv = jitter_server(EXPORT, 5000, f"init={init}")
    return srv, init


def start_disturbers(path, seed, n):
    return [subprocess.Popen(exer("--disturb", "-s", seed * 10 + i,
                                  "-a", AREA, "-m", MAXOP, path),
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
            for i in range(n)]


def stop_disturbers(procs):
    """SIGTERM each disturber (it finishes its loop and exits 0); returns
    a list of problems and the loop counts."""
    problems, loops = [], []
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            out, err = p.communicate(timeout=timeout(60))
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            problems.append(f"disturber {p.pid} hung:\n{err}")
            continue
        loops.append(out.strip().rsplit(" ", 2)[-2] if out.strip() else "?")
        if p.returncode != 0:
            problems.append(f"disturber exited {p.returncode}:\n"
                            f"{err.strip()}")
    return problems, loops


def run_seed(kind, seed, ndist, server, jitter_server, mount, shm):
    """One seed on a fresh export and mount; returns a problem description
    or None."""
    srv, init = start_export(kind, seed, server, jitter_server, shm)
    # Disturbers open the file read-write beside the writer: other
    # processes, so the mount must allow several writers.
    m = mount(srv, *(STRESS if kind == "jitter" else ()),
              *(("-o", "multiwriter") if ndist else ()))
    dump = shm / "model.img"
    dump.unlink(missing_ok=True)
    dist = start_disturbers(m.file, seed, ndist)
    cmd = exer("-s", seed, "-n", OPS, "-a", AREA, "-m", MAXOP, "-i", init,
               "-d", dump, m.file)
    try:
        r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, timeout=timeout(60 + OPS / 20))
        out = (r.stderr or r.stdout).strip()
        rc = r.returncode
    except subprocess.TimeoutExpired:
        rc, out = None, f"hung (no exit after {timeout(60 + OPS / 20):.0f}s)"
    problems, loops = stop_disturbers(dist)
    what = f"seed {seed} ({kind}, {ndist} disturbers, loops {loops})"
    if rc != 0:
        problems.insert(0, f"writer exited {rc}:\n{out}")
    else:
        want = sha256_file(dump)
        if sha256_nbd(srv.uri) != want:
            problems.append("after the writer's close the server's bytes "
                            "differ from the model")
        rc = m.unmount(check=False)
        if rc != 0:
            problems.append(f"daemon exited {rc}:\n{tail(m.stderr_path)}")
        elif sha256_nbd(srv.uri) != want:
            problems.append("after the unmount the server's bytes differ "
                            "from the model")
    if m.proc.poll() is None:
        m.unmount(check=False)
    bad = stderr_problems(m.stderr)
    if bad:
        problems.append("daemon stderr:\n  " + "\n  ".join(bad[:10]))
    m.checked = True                   # judged here, per seed
    srv.stop()
    return f"{what}: " + "\n".join(problems) if problems else None


@pytest.mark.parametrize("kind", ["memory-delay", "jitter"])
@pytest.mark.parametrize("case", list(CASES))
def test_exerciser(kind, case, server, jitter_server, mount, shm):
    seeds = range(FIRST, FIRST + CASES[case])
    failed = []
    t0 = time.monotonic()
    for seed in seeds:
        ndist = 1 + seed % 3 if case == "disturbed" else 0
        p = run_seed(kind, seed, ndist, server, jitter_server, mount, shm)
        if p:
            failed.append(p)
    took = time.monotonic() - t0
    print(f"{kind} {case}: {len(seeds)} seeds x {OPS} ops, "
          f"{len(failed)} failed, {took:.0f}s")
    assert not failed, (f"{len(failed)} of {len(seeds)} seeds failed "
                        f"({OPS} ops each):\n\n" + "\n\n".join(failed))
