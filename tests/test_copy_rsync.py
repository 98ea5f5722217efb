"""rsync into the mount.

rsync normally writes a temporary file next to the destination and renames
it over; the mount refuses to create files, so rsync needs --inplace.  With
--inplace and delta transfer (--no-whole-file; local copies default to whole
file), a second run after a small change to the source writes only about
the changed bytes, counted here from nbdkit's request log.
"""

import os
import random
import shutil

import pytest

from lib.content import assert_content
from lib.copytools import describe, garbage_target, log_mark, traffic
from lib.env import MiB
from lib.images import random_file
from lib.nbd import fill_random
from lib.procs import run

pytestmark = pytest.mark.skipif(shutil.which("rsync") is None,
                                reason="needs rsync")

EXPORT = 96 * MiB
SRC_SIZE = 80 * MiB + 12345


def test_rsync_inplace_delta_second_run_writes_only_changes(server, mount,
                                                            shm):
    t = garbage_target(server, mount, EXPORT)
    src = random_file(shm / "src.img", SRC_SIZE)
    cmd = ["rsync", "-a", "--inplace", "--no-whole-file", src, t.m.file]
    r = run(cmd)
    assert r.returncode == 0, f"rsync exited {r.returncode}: {r.stderr}"
    assert_content(src, EXPORT, mount_file=t.m.file, uri=t.srv.uri,
                   mount_size=SRC_SIZE, what="rsync first run")

    # Change 3 MiB of the source in three places, at odd offsets.
    rng = random.Random(7)
    changes = [(5 * MiB + 123, MiB), (40 * MiB + 4097, MiB),
               (SRC_SIZE - MiB - 1, MiB)]
    with open(src, "r+b") as f:
        for off, n in changes:
            f.seek(off)
            f.write(rng.randbytes(n))
    st = os.stat(src)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    changed = sum(n for _, n in changes)

    mark = log_mark(t.srv)
    r = run(cmd)
    assert r.returncode == 0, f"rsync exited {r.returncode}: {r.stderr}"
    assert_content(src, EXPORT, mount_file=t.m.file, uri=t.srv.uri,
                   mount_size=SRC_SIZE, what="rsync second run")
    t.m.unmount()
    tr = traffic(t.srv, mark)
    # rsync sends literal data for the blocks (about 9 KiB here) around
    # each change; everything else matched in place and is not rewritten.
    assert changed <= tr.bytes["Write"] <= changed + MiB, \
        f"second run wrote {tr.bytes['Write']} bytes for {changed} changed " \
        f"bytes: " + describe(tr)
    assert tr.bytes["Zero"] == 0 and tr.n["Trim"] == 0, describe(tr)


def test_rsync_inplace_sparse_small_writes_coalesced(server, mount, shm):
    """rsync --inplace --sparse writes 1 KiB at a time; the server still
    gets large requests, and the bytes are right."""
    t = garbage_target(server, mount, EXPORT)
    src = random_file(shm / "src.img", 32 * MiB + 5)
    r = run(["rsync", "--inplace", "--sparse", src, t.m.file])
    assert r.returncode == 0, f"rsync exited {r.returncode}: {r.stderr}"
    assert_content(src, EXPORT, mount_file=t.m.file, uri=t.srv.uri,
                   mount_size=32 * MiB + 5, what="rsync --inplace --sparse")
    t.m.unmount()
    tr = traffic(t.srv, t.mark)
    # (rsync --sparse skips zero bytes even at the edges of its 1 KiB
    # chunks, so a few bytes of random data are never sent.)
    assert tr.bytes["Write"] >= 31 * MiB, describe(tr)
    # 32 MiB in 1 KiB writes would be 32768 requests; coalesced into
    # buffers of up to 2 MiB it is a few dozen.  Allow for partly filled
    # buffers sent after an idle pause.
    assert tr.n["Write"] <= 32 * MiB // (256 * 1024), \
        f"{tr.n['Write']} write requests for 32 MiB: " + describe(tr)


def test_rsync_plain_fails_and_says_inplace(server, mount, shm):
    """Plain rsync wants a temporary file in the mount: it fails (non-zero
    exit), the daemon's log tells the user to use --inplace, and the disk
    is not touched."""
    srv = server("memory", f"size={EXPORT}", log=True)
    old = fill_random(srv.uri, EXPORT)
    m = mount(srv)
    src = random_file(shm / "src.img", 8 * MiB)
    r = run(["rsync", src, m.file])
    assert r.returncode != 0, "plain rsync into the mount succeeded"
    assert "--inplace" in m.stderr, \
        f"daemon stderr does not mention --inplace:\n{m.stderr}"
    assert_content(old, EXPORT, mount_file=m.file, uri=srv.uri,
                   what="after the failed rsync")
