"""Warm migration, trust (fs/warm.c, THE TRUST CHECK): the manifest is
believed only when it is the export's and the server still holds what it
says.  Each case makes the manifest wrong or unusable between two passes
and checks that the second pass is a full copy (or fails loudly) and that
the server's bytes equal the source's: never a skipped block over wrong
bytes, never exit 0 with a wrong disk.

- another writer puts data into a hole: block status shows data where the
  manifest holds zero: distrusted at mount;
- another writer changes data: with --verify-readback the cutover either
  distrusts it at mount (the sample found it) or the read-back fails the
  close: cp does not exit 0 with a wrong disk;
- the manifest file truncated, corrupted, replaced by a symbolic link, or
  another export's manifest (same size) in its place: refused;
- a RAM-backed server (memory plugin) restarted between the passes: it
  reads as zero where the manifest holds data: distrusted.
"""

import os
import shutil
import subprocess

import pytest

from lib.copytools import log_mark, status
from lib.env import MiB
from lib.nbd import sha256_nbd
from lib.procs import nonempty, run, wait_for
from lib.warm import BLOCK, copy, make_source, sha256, written

SIZE = 32 * MiB


def full_pass(server, mount, shm, fraction=0.25):
    """A full pass of a source with fraction data onto a file-plugin
    export; returns what later passes need."""
    src = make_source(shm / "src.img", SIZE, fraction)
    disk = shm / "disk.img"
    with open(disk, "wb") as f:
        f.truncate(SIZE)
    srv = server("file", f"file={disk}", log=True)
    m = mount(srv)
    copy("cp", src, m.file)
    path = status(m)["manifest"]["path"]
    m.unmount()
    assert sha256(disk) == sha256(src)
    assert os.path.exists(path)
    raw = src.read_bytes()
    data = [b for b in range(SIZE // BLOCK)
            if raw[b * BLOCK:(b + 1) * BLOCK].strip(b"\0")]
    return src, disk, srv, path, data


@pytest.fixture
def first_pass(server, mount, shm):
    """A full pass of a source with 25% data (more data blocks than the
    trust check's sample)."""
    return full_pass(server, mount, shm)


def second_pass(mount, srv, src, *opts, expect_ok=True, **kw):
    m = mount(srv, *opts, expect_errors=True, **kw)
    mf = status(m)["manifest"]
    mark = log_mark(srv)
    r = run(["cp", "--sparse=always", src, m.file], timeout=300)
    if expect_ok:
        assert r.returncode == 0, r.stderr
    m.unmount(check=False)
    return mf, written(srv, mark), r, m


def hole_block(src):
    with open(src, "rb") as f:
        b = 0
        while f.read(BLOCK).strip(b"\0"):
            b += 1
    return b


def test_foreign_write_into_hole(first_pass, mount):
    src, disk, srv, path, data = first_pass
    b = hole_block(src)
    with open(disk, "r+b") as f:          # another writer, between passes
        f.seek(b * BLOCK)
        f.write(b"\x5a" * BLOCK)
    mf, sent, _, m = second_pass(mount, srv, src)
    assert mf["trust"] == "distrusted", mf
    assert "holds data" in mf["why"]
    assert "distrusted" in m.stderr
    assert sent >= 0.2 * SIZE             # a full copy
    assert sha256(disk) == sha256(src)


def test_foreign_write_into_data(first_pass, mount):
    src, disk, srv, path, data = first_pass
    b = data[len(data) // 2]
    with open(disk, "r+b") as f:
        f.seek(b * BLOCK + 100)
        f.write(b"\x5a" * 64)
    mf, sent, r, m = second_pass(mount, srv, src, "--verify-readback",
                                 expect_ok=False, expect_rc=None)
    right = sha256(disk) == sha256(src)
    print("foreign write into data:", mf["trust"], r.returncode, right)
    if mf["trust"] == "distrusted":
        assert r.returncode == 0 and right, (mf, r.stderr)
    else:
        # Skipped over the foreign bytes: the read-back must fail the copy.
        assert not (r.returncode == 0 and not right), (
            "cp exited 0 and the disk differs from the source")
        assert r.returncode != 0, "the read-back did not see the change"


def test_foreign_write_into_data_sampled(server, mount, shm):
    """A source with no more data blocks than the trust check's sample
    (64, SAMPLE_MIN in fs/warm.c): every data block is re-hashed at
    mount, so a foreign change of 64 bytes inside one is always found:
    distrusted, a full copy, cp exits 0 and the disk is the source's (no
    --verify-readback needed).  Believed anyway, the second pass skips
    the block and the disk keeps the foreign bytes (mutant
    warm-sample-verdict-ignored)."""
    src, disk, srv, path, data = full_pass(server, mount, shm, 0.04)
    assert 0 < len(data) <= 64, len(data)   # the sample is all of them
    b = data[len(data) // 2]
    with open(disk, "r+b") as f:
        f.seek(b * BLOCK + 100)
        f.write(b"\x5a" * 64)
    mf, sent, r, m = second_pass(mount, srv, src)
    assert mf["trust"] == "distrusted", mf
    assert "differs from the manifest" in mf["why"], mf
    assert "distrusted" in m.stderr
    assert sent >= len(data) * BLOCK // 2  # a full copy of the data
    assert sha256(disk) == sha256(src)


@pytest.mark.parametrize("damage", ["truncated", "corrupted", "symlink",
                                    "other_export"])
def test_bad_manifest_is_refused(first_pass, mount, server, shm, damage):
    src, disk, srv, path, data = first_pass
    if damage == "truncated":
        os.truncate(path, 100)
    elif damage == "corrupted":
        with open(path, "r+b") as f:
            f.seek(1088 + 64 * 3 + 30)     # a record in the middle
            f.write(b"\xff\xfe")
    elif damage == "symlink":
        target = shm / "elsewhere"
        shutil.copy(path, target)
        os.unlink(path)
        os.symlink(target, path)
    else:
        # Another export of the same size, copied with a different source:
        # its manifest put where this export's belongs.
        disk2 = shm / "disk2.img"
        with open(disk2, "wb") as f:
            f.truncate(SIZE)
        srv2 = server("file", f"file={disk2}")
        m2 = mount(srv2)
        other = make_source(shm / "src2.img", SIZE, seed=9)
        copy("cp", other, m2.file)
        path2 = status(m2)["manifest"]["path"]
        m2.unmount()
        shutil.copy(path2, path)
    mf, sent, _, m = second_pass(mount, srv, src)
    assert mf["trust"] == "refused", mf
    assert "refused" in m.stderr
    assert sent >= 0.2 * SIZE             # a full copy
    assert sha256(disk) == sha256(src)
    if damage == "symlink":
        assert not os.path.islink(path)   # replaced, never followed
        assert open(shm / "elsewhere", "rb").read(8) == b"NBDFMANI"


def test_memory_server_restarted(server, mount, shm):
    """A RAM disk restarted between passes reads as zero: distrusted."""
    src = make_source(shm / "src.img", SIZE)
    srv = server("memory", f"size={SIZE}", log=True, tcp=True)
    m = mount(srv)
    copy("cp", src, m.file)
    m.unmount()
    srv.proc.terminate()
    srv.proc.wait(30)
    os.unlink(srv.pidfile)
    with open(srv.stderr, "ab") as errf:
        srv.proc = subprocess.Popen(srv.cmd, stdin=subprocess.DEVNULL,
                                    stdout=errf, stderr=errf)
    wait_for(nonempty(srv.pidfile), srv.proc, "nbdkit again", 30)
    mf, sent, _, m = second_pass(mount, srv, src)
    assert mf["trust"] == "distrusted", mf
    assert sent >= 0.2 * SIZE
    assert sha256_nbd(srv.uri, SIZE) == sha256(src)
