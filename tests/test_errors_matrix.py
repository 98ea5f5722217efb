"""The error matrix: whenever the disk is not byte-exact after a copy,
the copy tool's exit status is non-zero; whenever it exits 0, the disk is
byte-exact.

Every copy tool a user runs (cp in its three sparse modes, dd with and
without conv=fsync, notrunc and sparse, cat and pv through a shell
redirection, tee, rsync --inplace, qemu-img convert -n with and without
-W: 14) x every NBD request kind that can fail (write, write-zeroes, trim,
flush) x a permanent failure and a transient one (the error switched off
a moment into the copy).  Plus a VHD and a VMDK landing through
MNT/nbd.vhd and MNT/nbd.vmdk whose data write or zeroing fails.  The daemon never sends trim (a punched hole
is write-zeroes), so the trim cells check that nothing does.

Each cell: a fresh file-backed 8 MiB export of random bytes (so a hole
left unzeroed shows), a 6 MiB sparse source, one copy, the server's bytes
read back from its backing file and judged (lib.faults.judge, tallied in
tests/.fault-summary).  Write, zero and trim failures come from nbdkit's
error filter (error-*-file switches them); flush failures from
tests/nbdkit-plugins/flushfail.c (nbdkit 1.32's error filter cannot fail
a flush).  The daemon's exit status must agree with its status file: 1
exactly when damage was left unrepaired."""

import shutil
import threading
from pathlib import Path

import pytest

from lib.digest import sha256_bytes, sha256_file
from lib.env import MiB
from lib.faults import judge, status_json
from lib.images import make_sparse_image, random_file
from lib.procs import run
from lib.servers import plugin_path
from lib.vhd import qemu_img

EXPORT = 8 * MiB
IMAGE = 6 * MiB
RUNS = [(0, 700_000), (2 * MiB, 500_000), (4 * MiB + 12345, 600_000),
        (IMAGE - 300_000, 300_000)]


def _sh(cmd):
    return ["sh", "-c", cmd]


# name: (argv builder (src, dst), truncates the target)
TOOLS = {
    "cp-sparse-always": (lambda s, d: ["cp", "--sparse=always", s, d], True),
    "cp-sparse-auto": (lambda s, d: ["cp", "--sparse=auto", s, d], True),
    "cp-sparse-never": (lambda s, d: ["cp", "--sparse=never", s, d], True),
    "dd": (lambda s, d: ["dd", f"if={s}", f"of={d}", "bs=64k",
                         "status=none"], True),
    "dd-fsync": (lambda s, d: ["dd", f"if={s}", f"of={d}", "bs=64k",
                               "conv=fsync", "status=none"], True),
    "dd-sparse-fsync": (lambda s, d: ["dd", f"if={s}", f"of={d}", "bs=64k",
                                      "conv=sparse,fsync", "status=none"],
                        True),
    "dd-notrunc": (lambda s, d: ["dd", f"if={s}", f"of={d}", "bs=1M",
                                 "conv=notrunc", "status=none"], False),
    "dd-notrunc-fsync": (lambda s, d: ["dd", f"if={s}", f"of={d}", "bs=1M",
                                       "conv=notrunc,fsync", "status=none"],
                         False),
    "cat-redirect": (lambda s, d: _sh(f"cat '{s}' > '{d}'"), True),
    "tee": (lambda s, d: _sh(f"tee '{d}' < '{s}' > /dev/null"), True),
    "rsync-inplace": (lambda s, d: ["rsync", "--inplace", s, d], True),
    "qemu-img-n": (lambda s, d: ["qemu-img", "convert", "-n", "-f", "raw",
                                 "-O", "raw", s, d], False),
    "qemu-img-n-W": (lambda s, d: ["qemu-img", "convert", "-n", "-W", "-f",
                                   "raw", "-O", "raw", s, d], False),
    "pv-redirect": (lambda s, d: _sh(f"pv -q '{s}' > '{d}'"), True),
}

KINDS = ["write", "zero", "trim", "flush"]
MODES = ["permanent", "transient"]
ERROR_ARG = {"write": "pwrite", "zero": "zero", "trim": "trim"}
TRANSIENT_S = 0.15          # the error goes away this long into the copy


def failing_server(server, shm, flag, kind):
    """A server over EXPORT random bytes whose `kind` requests fail while
    flag exists (created here).  Returns (server, the disk's old bytes)."""
    disk = random_file(shm / "disk.img", EXPORT)
    old = disk.read_bytes()
    if kind == "flush":
        srv = server(plugin_path("flushfail"), f"file={disk}",
                     f"flag={flag}")
    else:
        e = ERROR_ARG[kind]
        srv = server("file", disk, f"error-{e}=EIO", f"error-{e}-rate=100%",
                     f"error-{e}-file={flag}", "wdelay=1ms", "delay-zero=1ms",
                     filters=["error", "delay"])
    Path(flag).write_bytes(b"")
    srv.disk = disk
    return srv, old


def source(shm):
    return make_sparse_image(shm / "src.img", IMAGE, RUNS, seed=3)


def switch_off_later(flag, mode):
    if mode == "permanent":
        return None
    t = threading.Timer(TRANSIENT_S, lambda: Path(flag).unlink(
        missing_ok=True))
    t.start()
    return t


def judge_cell(tally, case, m, srv, r, want, flag, timer):
    if timer:
        timer.join()
    Path(flag).unlink(missing_ok=True)
    st = status_json(m)
    got = sha256_file(srv.disk)
    judge(tally, case, r.returncode, want, got, None, r.stderr)
    rc = m.unmount(check=False)
    # Damaged ranges left make the daemon exit 1; a failed flush alone may
    # be repaired by the unmount's own flush (the error is off by then).
    d = st["damage"]
    allowed = {1} if d["bytes"] else {0, 1} if d["unrepaired"] else {0}
    assert rc in allowed, f"daemon exited {rc}, status damage {d}\n{m.stderr}"
    return got == want


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tool", list(TOOLS))
def test_matrix(server, mount, shm, shortdir, tally, tool, kind, mode):
    argv, truncates = TOOLS[tool]
    assert shutil.which(argv("a", "b")[0] if tool != "pv-redirect" else "pv"), \
        f"{tool} is not installed (scripts/install-deps)"
    flag = shortdir / "fail.flag"
    srv, old = failing_server(server, shm, flag, kind)
    m = mount(srv, "--request-size", "256K", expect_rc=None,
              expect_errors=True)
    img = source(shm)
    data = Path(img.path).read_bytes()
    want = sha256_bytes(data, pad_to=EXPORT) if truncates else \
        sha256_bytes(data + old[IMAGE:])
    timer = switch_off_later(flag, mode)
    r = run(argv(str(img.path), str(m.file)), timeout=120)
    exact = judge_cell(tally, f"matrix-{tool}-{kind}-{mode}", m, srv, r,
                       want, flag, timer)
    if kind == "trim":
        # Never sent: nothing may fail.
        assert r.returncode == 0 and exact, r.stderr


# ------------------------------------------------------------ the VHD view

VHD_TOOLS = {
    "cp": lambda s, d: ["cp", s, d],
    "dd-fsync": lambda s, d: ["dd", f"if={s}", f"of={d}", "bs=1M",
                              "conv=fsync", "status=none"],
    "cat-redirect": lambda s, d: _sh(f"cat '{s}' > '{d}'"),
}


VIEW_IMAGES = {
    "vhd": ("nbd.vhd", ["-O", "vpc", "-o", "subformat=dynamic,force_size=on"]),
    "vmdk": ("nbd.vmdk", ["-O", "vmdk", "-o", "subformat=streamOptimized"]),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["write", "zero"])
@pytest.mark.parametrize("tool", list(VHD_TOOLS))
@pytest.mark.parametrize("fmt", list(VIEW_IMAGES))
def test_matrix_view(server, mount, shm, shortdir, tally, fmt, tool, kind,
                     mode):
    """A dynamic VHD or a streamOptimized VMDK (qemu-img) landed through
    MNT/nbd.vhd or MNT/nbd.vmdk: the disk is the image's disk, then zeros,
    or the copy tool fails."""
    name, opts = VIEW_IMAGES[fmt]
    flag = shortdir / "fail.flag"
    srv, _ = failing_server(server, shm, flag, kind)
    m = mount(srv, "--request-size", "256K", expect_rc=None,
              expect_errors=True)
    img = source(shm)
    packed = shm / f"src.{fmt}"
    qemu_img("convert", "-f", "raw", *opts, img.path, packed)
    want = sha256_file(img.path, pad_to=EXPORT)
    timer = switch_off_later(flag, mode)
    r = run(VHD_TOOLS[tool](str(packed), str(Path(m.mp) / name)),
            timeout=120)
    judge_cell(tally, f"matrix-{fmt}-{tool}-{kind}-{mode}", m, srv, r, want,
               flag, timer)


def test_matrix_cell_count():
    """The closing count: 14 copy tools x 4 request kinds x 2 modes, and
    2 formats x 3 tools x 2 kinds x 2 modes view cells: 136."""
    n = len(TOOLS) * len(KINDS) * len(MODES) + \
        len(VIEW_IMAGES) * len(VHD_TOOLS) * 2 * 2
    assert n == 136, n
