"""Warm migration, the cutover pass (fs/warm.c, THE SKIP): after a full
pass, about 1% of the source changes; the next pass, on a new mount with
the same copy command, sends only what changed.  Counted in bytes on
nbdkit's request log (no times); every case checks the bytes on the
server (the file plugin's file) against the source, and the inline
digest against nbdferry-verify SOURCE (the proof).

- cp --sparse=always (O_TRUNC: the truncate's zeroing is cancelled by
  the unchanged writes, trap (a)), dd conv=notrunc, plain dd (O_TRUNC
  with every block written), qemu-img convert -n: each cutover writes at
  most 3x the changed bytes + 1 MiB.
- The stale-entry rule (trap (b)): a block rewritten through the mount
  with other bytes, then with its old bytes again, is sent again.
- Without block status, a zero block over a block the manifest holds as
  zero sends nothing (no write-zeroes either).
- --no-manifest sends everything again; --forget MNT drops the manifest
  (the next pass is a full one).
"""

import json
import os
import re
import shutil

import pytest

from lib.copytools import log_mark, status, traffic
from lib.env import TOP, MiB, daemon_cmd
from lib.procs import run
from lib.warm import (BLOCK, change_source, copy, inline_digest, make_source,
                      sha256, verify_digest, written)

SIZE = 64 * MiB
SLACK = 1 * MiB


@pytest.fixture
def setup(server, shm):
    src = make_source(shm / "src.img", SIZE)
    disk = shm / "disk.img"
    with open(disk, "wb") as f:
        f.truncate(SIZE)
    srv = server("file", f"file={disk}", log=True)
    return src, disk, srv


def one_pass(mount, srv, src, tool, *opts):
    m = mount(srv, *opts)
    mark = log_mark(srv)
    copy(tool, src, m.file)
    wait_digest(m)
    st = status(m)
    m.human = run([TOP / "tools" / "status" / "nbdferry-status", m.mp],
                  check=True).stdout
    m.unmount()
    return st, written(srv, mark), m


def wait_digest(m):
    """The inline digest settles on its own thread after the close."""
    from lib.procs import wait_for
    wait_for(lambda: status(m)["digest"]["state"] not in ("computing",),
             m.proc, "the inline digest", 60)


@pytest.mark.parametrize("tool", ["cp", "dd_notrunc", "dd_trunc",
                                  "qemu_img"])
def test_cutover_sends_only_changes(setup, mount, tool):
    src, disk, srv = setup
    st, full, _ = one_pass(mount, srv, src, tool)
    assert sha256(disk) == sha256(src)
    assert st["manifest"]["trust"] == "new"
    changed = change_source(src, SIZE)
    st, cut, m = one_pass(mount, srv, src, tool)
    assert sha256(disk) == sha256(src), f"{tool}: the disk differs"
    mf = st["manifest"]
    assert mf["trust"] == "trusted", mf
    assert cut <= 3 * changed + SLACK, (
        f"{tool}: cutover wrote {cut} bytes for {changed} changed "
        f"(full pass: {full})")
    assert mf["skipped_bytes"] > 0
    # Per copy: the bytes not sent, apart from those written.
    assert st["progress"]["skipped_bytes"] == mf["skipped_bytes"]
    assert st["progress"]["written"] <= 3 * changed + SLACK + \
        (SIZE if tool.startswith("dd") else 0)       # dd writes its zeroes
    assert "manifest    trusted" in m.human and "not sent" in m.human
    # The proof: the inline digest is the whole disk's blkhash.
    assert inline_digest(st) == verify_digest(src), st["digest"]
    print(f"{tool}: full pass {full} B, cutover {cut} B for {changed} B "
          f"changed, {mf['skipped_bytes']} B skipped")


def test_rewrite_then_old_bytes_is_sent(setup, mount):
    """Trap (b): a block written with other bytes is stale until they are
    durable; writing the old bytes again must reach the server."""
    src, disk, srv = setup
    one_pass(mount, srv, src, "dd_notrunc")
    m = mount(srv)
    raw = src.read_bytes()
    b = next(b for b in range(SIZE // BLOCK)         # a block of data
             if raw[b * BLOCK:(b + 1) * BLOCK].strip(b"\0"))
    old = raw[b * BLOCK:(b + 1) * BLOCK]
    fd = os.open(m.file, os.O_WRONLY)
    try:
        os.pwrite(fd, b"\xa5" * BLOCK, b * BLOCK)     # other bytes, not
        os.pwrite(fd, old, b * BLOCK)                 # flushed; the old
    finally:                                          # ones again
        os.close(fd)
    m.unmount()
    assert sha256(disk) == sha256(src)


def test_no_manifest_sends_everything(setup, mount):
    src, disk, srv = setup
    _, full, _ = one_pass(mount, srv, src, "cp", "--no-manifest")
    st, again, _ = one_pass(mount, srv, src, "cp", "--no-manifest")
    assert st["manifest"] is None
    assert again >= full * 0.9
    assert sha256(disk) == sha256(src)


def test_forget_mountpoint(setup, mount, state_dir):
    src, disk, srv = setup
    one_pass(mount, srv, src, "cp")
    m = mount(srv)
    path = status(m)["manifest"]["path"]
    assert os.path.exists(path)
    r = run(daemon_cmd("--forget", m.mp))
    assert r.returncode == 0, r.stderr
    assert not os.path.exists(path)
    m.unmount()
    assert not os.path.exists(path)    # not written again at unmount
    mark = log_mark(srv)
    m = mount(srv)
    assert status(m)["manifest"]["trust"] == "new"
    copy("cp", src, m.file)
    m.unmount()
    assert written(srv, mark) >= 0.2 * SIZE     # a full pass again
    assert sha256(disk) == sha256(src)


def test_zero_over_zero_sends_nothing(setup, mount):
    """Without block status (--no-extents) the pool knows nothing zero; the
    manifest does: a dd that writes every zero block again sends neither
    writes nor write-zeroes for them."""
    src, disk, srv = setup
    one_pass(mount, srv, src, "dd_notrunc", "--no-extents")
    mark = log_mark(srv)
    st, _, _ = one_pass(mount, srv, src, "dd_notrunc", "--no-extents")
    t = traffic(srv, mark)
    assert st["manifest"]["trust"] == "trusted"
    assert t.bytes["Write"] == 0 and t.bytes["Zero"] == 0, t.bytes
    assert st["manifest"]["skipped_bytes"] == SIZE
    assert sha256(disk) == sha256(src)


def test_partial_writer_proof(setup, mount):
    """A writer that writes only the changed blocks (as rsync --inplace
    does) leaves the rest of the disk unwritten by its pass: the inline
    digest takes those blocks' digests from the manifest (digest/blkpass.h,
    THE FILLER), so it is still the whole disk's blkhash."""
    src, disk, srv = setup
    one_pass(mount, srv, src, "cp")
    raw = bytearray(src.read_bytes())
    blocks = [b for b in range(0, SIZE // BLOCK, 37)][:8]
    for b in blocks:
        raw[b * BLOCK:(b + 1) * BLOCK] = os.urandom(BLOCK)
    src.write_bytes(raw)
    m = mount(srv)
    mark = log_mark(srv)
    with open(m.file, "r+b") as f:
        for b in blocks:
            f.seek(b * BLOCK)
            f.write(raw[b * BLOCK:(b + 1) * BLOCK])
    wait_digest(m)
    st = status(m)
    m.unmount()
    assert sha256(disk) == sha256(src)
    assert written(srv, mark) == len(blocks) * BLOCK
    assert inline_digest(st) == verify_digest(src), (json.dumps(st["digest"]), json.dumps(st["manifest"]),
                                                      st["manifest"])


def data_block_bytes(src):
    """Bytes of the source's 64 KiB blocks that are not all zero."""
    raw = src.read_bytes()
    return sum(BLOCK for b in range(0, len(raw), BLOCK)
               if raw[b:b + BLOCK].strip(b"\0"))


@pytest.mark.parametrize("tool", ["cp", "dd_notrunc"])
def test_blocks_hashed_once(setup, mount, tool):
    """Every block is hashed once: the manifest hashes a write's whole
    blocks (to decide what to send, and to record them) and hands the
    digests to the inline digest, which stores them rather than hash the
    same bytes again (digest/known.h): reused_bytes, on the first pass
    (the landed path) and on the cutover (the copying path, unchanged
    blocks not sent).  The value stays the proof; without a manifest
    nothing is reused and the value is the same."""
    src, disk, srv = setup
    data = data_block_bytes(src)
    st, _, _ = one_pass(mount, srv, src, tool)
    assert inline_digest(st) == verify_digest(src), st["digest"]
    assert st["digest"]["reused_bytes"] >= 0.9 * data, (st["digest"], data)
    change_source(src, SIZE)
    data = data_block_bytes(src)
    st, _, _ = one_pass(mount, srv, src, tool)
    assert sha256(disk) == sha256(src)
    assert st["manifest"]["skipped_bytes"] > 0
    assert inline_digest(st) == verify_digest(src), st["digest"]
    assert st["digest"]["reused_bytes"] >= 0.9 * data, (st["digest"], data)
    st, _, _ = one_pass(mount, srv, src, tool, "--no-manifest")
    assert st["digest"]["reused_bytes"] == 0, st["digest"]
    assert inline_digest(st) == verify_digest(src), st["digest"]
    assert sha256(disk) == sha256(src)


@pytest.mark.parametrize("opts", [(), ("--no-digest",)],
                         ids=["defaults", "no-digest"])
def test_later_digest_slow_hasher(setup, mount, monkeypatch, opts):
    """The manifest's digests of a first pass are made on the hasher
    workers after the write was answered (fs/warm-later.c, THE LATER
    DIGEST).  With each of those jobs slowed on purpose, the copy's pool
    buffers go on to later writes meanwhile: the digests must still be of
    the bytes sent (the job holds them), the inline digest must wait for
    them (its value stays the proof, and it hashes nothing again), and
    every block must be known at the end (the unmount waits for the
    jobs): a second pass of the same source sends nothing."""
    src, disk, srv = setup
    data = data_block_bytes(src)
    monkeypatch.setenv("NBDFERRY_DEBUG_LATER_DELAY_US", "20000")
    # A pool of 8 MiB: its buffers are reused many times over in the copy.
    st, full, _ = one_pass(mount, srv, src, "cp", "--pool-size=8M", *opts)
    assert sha256(disk) == sha256(src)
    assert full >= 0.9 * data
    if not opts:
        assert inline_digest(st) == verify_digest(src), st["digest"]
        assert st["digest"]["reused_bytes"] >= 0.9 * data, st["digest"]
    monkeypatch.delenv("NBDFERRY_DEBUG_LATER_DELAY_US")
    st, again, _ = one_pass(mount, srv, src, "cp", *opts)
    assert st["manifest"]["trust"] == "trusted", st["manifest"]
    assert again <= SLACK, f"sent {again} B of an unchanged source"
    assert st["manifest"]["skipped_bytes"] >= 0.9 * data, st["manifest"]
    assert sha256(disk) == sha256(src)

