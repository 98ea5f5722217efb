"""--qcow2-cluster-size: reading MOUNTPOINT/nbd.qcow2 gives a qcow2 with
the clusters asked for (64 KiB without the option).

For 512 B, 4 KiB, 1 MiB and 2 MiB (one of them given in the fstab form,
`-o qcow2_cluster_size=SIZE`), a disk with data in odd places is copied
out with cp: `qemu-img info` says that cluster size, `qemu-img check` is
clean, `qemu-img compare` finds it equal to the disk read from the
server, its size is the one stat reported, and it is laid out metadata
first with the data clusters in disk order (nbdferry-qcow2 reading it from
a pipe spools nothing).  Values qemu would not
take (not a power of two, below 512 B, above 2 MiB, not a size) are
refused with one line naming the option, before anything is mounted.

Run: /usr/bin/python3 -m pytest tests/test_qcow2_export_clusters.py
"""

import json
import os
import random
import shutil
import subprocess

import pytest

from lib.env import BUILD, MiB, daemon_cmd, timeout
from lib.mounts import is_mounted
from lib.procs import run

if not shutil.which("qemu-img"):
    raise RuntimeError("qemu-img missing (scripts/install-deps)")
TOOL = BUILD / "tools" / "nbdferry-qcow2"
if not TOOL.exists():
    raise RuntimeError(f"{TOOL} not built")

EXPORT = 8 * MiB + 1536                 # not a multiple of any cluster size
SPOTS = [0, 700, 65536 - 10, 3 * MiB + 4096, 4 * MiB - 1, EXPORT - 300]


def qemu_img_json(*args):
    r = run(["qemu-img", *map(str, args), "--output=json"])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def disk_with_spots(server, mount, *opts):
    """A zero export with a few data spots (clusters shared by two spots,
    one crossing 4 MiB, one in the partial last cluster)."""
    srv = server("memory", f"size={EXPORT}")
    m = mount(srv, *opts)
    rnd = random.Random(7)
    with open(m.file, "r+b") as f:
        for off in SPOTS:
            f.seek(off)
            f.write(rnd.randbytes(min(300, EXPORT - off)))
    return srv, m


@pytest.mark.parametrize("size,opts", [
    (512, ["--qcow2-cluster-size", "512"]),
    (4096, ["--qcow2-cluster-size=4K"]),
    (MiB, ["-o", "qcow2_cluster_size=1M"]),
    (2 * MiB, ["--qcow2-cluster-size", "2M"]),
    (65536, []),
], ids=["512", "4K", "1M-fstab-form", "2M", "default-64K"])
def test_qcow2_export_cluster_size(server, mount, tmp_path, size, opts):
    srv, m = disk_with_spots(server, mount, *opts)
    out = tmp_path / "out.qcow2"
    r = run(["cp", m.mp / "nbd.qcow2", out])
    assert r.returncode == 0, r.stderr
    assert os.path.getsize(out) == os.stat(m.mp / "nbd.qcow2").st_size
    info = qemu_img_json("info", "-f", "qcow2", out)
    assert info["cluster-size"] == size, info
    assert info["format-specific"]["data"]["compat"] == "1.1", info
    r = run(["qemu-img", "check", "-f", "qcow2", out])
    assert r.returncode == 0, r.stdout + r.stderr
    r = run(["qemu-img", "compare", "-f", "qcow2", "-F", "raw", out, srv.uri])
    assert r.returncode == 0, r.stdout + r.stderr
    # Holes are not stored: only the clusters the spots touch hold data.
    extents = qemu_img_json("map", "-f", "qcow2", out)
    data = sum(e["length"] for e in extents if e["data"])
    touched = {o // size for off in SPOTS
               for o in (off, min(off + 299, EXPORT - 1))}
    assert data <= len(touched) * size, (data, touched)
    # Metadata first, then the data clusters in disk order: a reader that
    # sees the file once (nbdferry-qcow2 from a pipe) spools nothing.
    hosts = [e["offset"] for e in extents if e["data"]]
    assert hosts == sorted(hosts), extents
    with open(out, "rb") as f:
        r = subprocess.run([TOOL, "info", "-"], stdin=f, capture_output=True,
                           text=True, timeout=timeout(60))
    assert r.returncode == 0 and "spooled                0 clusters" in \
        r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("value,opt", [
    ("3000", "--qcow2-cluster-size"), ("256", "--qcow2-cluster-size"),
    ("4M", "--qcow2-cluster-size"), ("0", "--qcow2-cluster-size"),
    ("64Q", "--qcow2-cluster-size"), ("96K", "-o qcow2_cluster_size"),
])
def test_qcow2_cluster_size_refused(server, tmp_path, value, opt):
    """A bad value is a usage error: exit 1, one line naming the option
    and the value, no mount, no daemon left."""
    srv = server("memory", f"size={EXPORT}")
    mp = tmp_path / "mp"
    mp.mkdir()
    pid = tmp_path / "pid"
    arg = [opt, value] if opt.startswith("--") else \
        ["-o", f"qcow2_cluster_size={value}"]
    cmd = daemon_cmd("-P", pid, *arg, mp, srv.uri)
    r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, timeout=timeout(30))
    assert r.returncode == 1, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and opt in lines[0] and value in lines[0], r.stderr
    assert not is_mounted(mp) and not pid.exists(), r.stderr
    assert os.listdir(mp) == []
