"""The status and the verdict list a mount's disks by name, not in the order the server listed them or the command line
gave them: NAME=URI operands given as zeta, alpha, mid (each onto its own
export) come out alpha, mid, zeta in MNT/.nbdferry-status's "disks" and
in nbdferry --unmount's verdict.  Each disk gets a small copy, checked
by sha256 on the server."""

import json

from lib.digest import sha256_file
from lib.env import MiB
from lib.images import random_file
from lib.nbd import sha256_nbd
from lib.procs import run

from test_multidisk import disk_dir, export_uri, unmount_verdict

NAMES = ["zeta", "alpha", "mid"]


def test_status_and_verdict_list_disks_by_name(server, mount, shm, tmp_path):
    d = disk_dir(tmp_path, names=("e0", "e1", "e2"))
    srv = server("file", f"dir={d}")
    ops = [f"{n}={export_uri(srv, f'e{i}')}" for i, n in enumerate(NAMES)]
    m = mount(ops, raw=NAMES[0])
    for i, n in enumerate(NAMES):
        src = random_file(shm / f"{n}.img", MiB + i * 4096)
        r = run(["cp", src, m.mp / n])
        assert r.returncode == 0, r.stderr
        assert sha256_nbd(export_uri(srv, f"e{i}"), src.stat().st_size) == \
            sha256_file(src)
    st = json.loads((m.mp / ".nbdferry-status").read_text())
    assert [x["name"] for x in st["disks"]] == sorted(NAMES), st["disks"]
    r = unmount_verdict(m)
    assert r.returncode == 0, r.stderr
    order = [l.split(":")[0] for l in r.stdout.splitlines()
             if l.split(":")[0] in NAMES]
    assert order == sorted(NAMES), r.stdout
