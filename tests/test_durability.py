"""close() and fsync() mean what they say; the namespace is fixed.

* close() returns only once every write made through the file is
  acknowledged by the server: read directly from a slow server right after
  close, every byte is there.
* fsync() also sends NBD flush, after the writes it covers completed (a
  flush only covers completed writes), and returns after its reply.
* Every time, not only the first: several write-then-fsync rounds on one
  handle each send their own flush after their own writes; several
  open-write-close rounds each find their bytes on the server at close.
* Creating, renaming and deleting files fail with an errno; chmod and
  chown are accepted as no-ops, utimes sets the disk's time (rsync -a
  --inplace needs both; the times: tests/test_mtime.py).
* O_DSYNC and O_SYNC writes are durable when they return.
  A write made through a handle opened with O_DSYNC or O_SYNC, or with
  pwritev2()'s RWF_DSYNC (the kernel passes it in the write's flags), is
  answered only once the server acknowledged it and an NBD flush issued
  after that acknowledgement was answered too.  Checked in nbdkit's request
  log: between each such write's reply and the next write, a flush and its
  reply; and on the server, the bytes are there when the call returns.
  Plain writes on the same handles stay write-back (no flush of their own)."""

import os
import re

import pytest

from lib.content import assert_content
from lib.copytools import log_mark
from lib.digest import sha256_file
from lib.env import MiB
from lib.images import random_bytes, random_file
from lib.nbd import fill_random, read_nbd, sha256_nbd
from lib.procs import run

EXPORT = 32 * MiB

REQ = re.compile(r"connection=(\d+) (\.\.\.)?(Write|Zero|Trim|Flush) id=(\d+)")


def log_events(log, since=0):
    """[(kind, is_reply, conn, id)] in log order, from byte offset since
    (lib.copytools.log_mark)."""
    out = []
    with open(log, "rb") as f:
        f.seek(since)
        text = f.read().decode(errors="replace")
    for line in text.splitlines():
        m = REQ.search(line)
        if m:
            out.append((m.group(3), bool(m.group(2)), m.group(1), m.group(4)))
    return out


def flush_after_writes(events):
    """True if some Flush request was issued after every write's reply and
    its own reply is logged."""
    last_write_reply = max((i for i, (k, r, _, _) in enumerate(events)
                            if k != "Flush" and r), default=-1)
    writes = [e for e in events if e[0] != "Flush" and not e[1]]
    if not writes:
        return False
    for i, (k, r, c, n) in enumerate(events):
        if k == "Flush" and not r and i > last_write_reply:
            if any(e == ("Flush", True, c, n) for e in events[i + 1:]):
                return True
    return False


def test_fsync_sends_flush_after_writes_complete(server, mount):
    srv = server("memory", f"size={EXPORT}", "wdelay=30ms",
                 filters=["delay"], log=True)
    m = mount(srv)
    data = random_bytes(8 * MiB + 3)
    fd = os.open(m.file, os.O_RDWR)
    try:
        assert os.pwrite(fd, data, 5) == len(data)
        os.fsync(fd)
        # Checked before close: fsync alone must have done it.
        assert read_nbd(srv.uri, 5, len(data)) == data, \
            "data not on the server when fsync returned"
        ev = log_events(srv.log)
        assert any(k == "Write" for k, _, _, _ in ev), "no writes logged"
        assert flush_after_writes(ev), (
            "fsync returned without an NBD flush issued after the writes "
            "completed (and answered)")
    finally:
        os.close(fd)


def test_fdatasync_sends_flush(server, mount):
    srv = server("memory", f"size={EXPORT}", "wdelay=30ms",
                 filters=["delay"], log=True)
    m = mount(srv)
    data = random_bytes(3 * MiB)
    fd = os.open(m.file, os.O_RDWR)
    try:
        os.pwrite(fd, data, 0)
        os.fdatasync(fd)
        assert read_nbd(srv.uri, 0, len(data)) == data
        assert flush_after_writes(log_events(srv.log)), "no flush"
    finally:
        os.close(fd)


def unanswered_writes(events):
    """Write and Zero requests whose reply is not in events."""
    replied = {(c, n) for k, r, c, n in events if r}
    return [e for e in events if e[0] != "Flush" and not e[1]
            and (e[2], e[3]) not in replied]


ROUNDS = 4


def test_every_fsync_flushes_after_its_writes(server, mount):
    """Four write-then-fsync rounds on one handle: each fsync issues its own
    NBD flush after that round's writes were answered, and returns after
    the flush's reply, with the round's bytes on the server."""
    srv = server("memory", f"size={EXPORT}", "wdelay=20ms",
                 filters=["delay"], log=True)
    m = mount(srv)
    fd = os.open(m.file, os.O_RDWR)
    try:
        for i in range(ROUNDS):
            mark = log_mark(srv)
            data = random_bytes(MiB + 7 * i)
            off = i * 3 * MiB + 11
            assert os.pwrite(fd, data, off) == len(data)
            os.fsync(fd)
            ev = log_events(srv.log, mark)
            assert any(k == "Write" for k, _, _, _ in ev), \
                f"round {i}: no writes logged before fsync returned"
            assert flush_after_writes(ev), (
                f"fsync {i + 1} of {ROUNDS} on one handle returned without an "
                f"NBD flush issued after its writes were answered: {ev}")
            assert read_nbd(srv.uri, off, len(data)) == data, \
                f"round {i}: data not on the server when fsync returned"
    finally:
        os.close(fd)


def test_every_close_returns_after_its_writes_are_answered(server, mount):
    """Four open-write-close rounds: each close returns only once every
    write of its round has been answered (the log has every reply), and the
    round's bytes are on the server.  (close drains; only fsync flushes.)"""
    srv = server("memory", f"size={EXPORT}", "wdelay=50ms",
                 filters=["delay"], log=True)
    m = mount(srv)
    rounds = []
    for i in range(ROUNDS):
        mark = log_mark(srv)
        data = random_bytes(2 * MiB + 5 * i)
        off = i * 4 * MiB + 3
        fd = os.open(m.file, os.O_WRONLY)
        try:
            assert os.pwrite(fd, data, off) == len(data)
        finally:
            os.close(fd)
        ev = log_events(srv.log, mark)
        assert any(k == "Write" for k, _, _, _ in ev), \
            f"close {i + 1}: no writes logged before close returned"
        assert not unanswered_writes(ev), (
            f"close {i + 1} of {ROUNDS} returned before the server answered "
            f"{unanswered_writes(ev)}")
        assert read_nbd(srv.uri, off, len(data)) == data, \
            f"close {i + 1}: data not on the server when close returned"
        rounds.append((off, data))
    for off, data in rounds:              # no round undid another
        assert read_nbd(srv.uri, off, len(data)) == data


@pytest.mark.parametrize("handles", [1, 3])
def test_close_returns_after_server_ack(server, mount, handles):
    """With writes delayed 100 ms at the server, the bytes are on the
    server as soon as close() returns; with several handles open, closing
    the one that wrote is enough."""
    srv = server("memory", f"size={EXPORT}", "wdelay=100ms",
                 filters=["delay"])
    m = mount(srv)
    others = [os.open(m.file, os.O_RDONLY) for _ in range(handles - 1)]
    try:
        data = random_bytes(6 * MiB + 1)
        fd = os.open(m.file, os.O_WRONLY)
        assert os.pwrite(fd, data, MiB - 1) == len(data)
        os.close(fd)
        assert read_nbd(srv.uri, MiB - 1, len(data)) == data, \
            "close() returned before the server had every byte"
    finally:
        for o in others:
            os.close(o)


def test_namespace_is_fixed(server, mount):
    srv = server("memory", f"size={EXPORT}")
    old = fill_random(srv.uri, EXPORT)
    m = mount(srv)
    refused = {}
    for what, fn in [
            ("create", lambda: open(m.mp / "newfile", "wb").close()),
            ("mkdir", lambda: os.mkdir(m.mp / "newdir")),
            ("unlink", lambda: os.unlink(m.file)),
            ("rename", lambda: os.rename(m.file, m.mp / "other")),
            ("link", lambda: os.link(m.file, m.mp / "other")),
            ("symlink", lambda: os.symlink("nbd", m.mp / "other"))]:
        try:
            fn()
            refused[what] = None
        except OSError as e:
            refused[what] = e.errno
    assert all(refused.values()), f"not refused: {refused}"
    assert m.file.exists() and not (m.mp / "newfile").exists()
    # Metadata changes are accepted and change no byte of the disk.
    os.chmod(m.file, 0o600)
    os.utime(m.file, (1, 1))
    os.chown(m.file, 0, 0)
    assert_content(old, EXPORT, mount_file=m.file, uri=srv.uri,
                   what="after namespace operations")


# ---------------------------------------------- O_DSYNC, O_SYNC, RWF_DSYNC

# connection=1 Write id=3 offset=0x100000 count=0x100000 fua=0 ...
# connection=1 ...Write id=3 return=0 (Success)
RANGED_EVENT = re.compile(
    r"connection=(\d+) (\.\.\.)?(Write|Zero|Flush) id=(\d+)"
    r"(?: offset=(0x[0-9a-f]+|\d+) count=(0x[0-9a-f]+|\d+))?")


def log_ranged_events(log):
    """[(op, is_reply, (conn, id), offset, count)] in log order; a reply
    carries its request's offset and count."""
    out, reqs = [], {}
    for line in open(log, errors="replace"):
        m = RANGED_EVENT.search(line)
        if not m:
            continue
        key = (m.group(1), m.group(4))
        if m.group(2):
            off, cnt = reqs.get(key, (None, None))
            out.append((m.group(3), True, key, off, cnt))
        else:
            off = int(m.group(5), 0) if m.group(5) else None
            cnt = int(m.group(6), 0) if m.group(6) else None
            reqs[key] = (off, cnt)
            out.append((m.group(3), False, key, off, cnt))
    return out


def flushes(events):
    return sum(1 for op, rep, *_ in events if op == "Flush" and rep)


def unflushed_writes(events, chunks, size):
    """The chunks i (in chunks, of size bytes each) whose writes were not followed,
    before any write of a later chunk was issued, by a flush request
    issued after their last reply and answered."""
    def touches(e, i):
        off, cnt = e[3], e[4]
        return off is not None and off < (i + 1) * size and \
            off + cnt > i * size
    bad = []
    for i in chunks:
        replies = [j for j, e in enumerate(events)
                   if e[0] == "Write" and e[1] and touches(e, i)]
        later = [j for j, e in enumerate(events)
                 if e[0] == "Write" and not e[1] and e[3] is not None
                 and e[3] >= (i + 1) * size]
        if not replies:
            bad.append(i)
            continue
        start, stop = max(replies), min(later, default=len(events))
        ok = False
        for j in range(start + 1, stop):
            op, rep, key = events[j][:3]
            if op == "Flush" and not rep and any(
                    e[0] == "Flush" and e[1] and e[2] == key
                    for e in events[j + 1:stop]):
                ok = True
                break
        if not ok:
            bad.append(i)
    return bad


def test_dd_oflag_dsync_flushes_every_write(server, mount, shm):
    srv = server("memory", f"size={EXPORT}", log=True)
    m = mount(srv)
    src = shm / "src.img"
    random_file(src, 16 * MiB)
    run(["dd", f"if={src}", f"of={m.file}", "bs=1M", "count=16",
         "oflag=dsync", "conv=notrunc", "status=none"], check=True)
    ev = log_ranged_events(srv.log)
    assert flushes(ev) >= 16, f"{flushes(ev)} NBD flushes for 16 dsync writes"
    bad = unflushed_writes(ev, range(16), MiB)
    assert not bad, f"MiB {bad}: no flush between the write and the next"
    assert sha256_nbd(srv.uri, 16 * MiB) == sha256_file(src)


def test_o_sync_handle_each_write_flushed_on_return(server, mount):
    """Each write through an O_SYNC handle is on the server, and covered
    by a flush, when pwrite returns; then the same for O_DSYNC."""
    srv = server("memory", f"size={EXPORT}", "wdelay=20ms",
                 filters=["delay"], log=True)
    m = mount(srv)
    rounds = 0
    for flag in (os.O_SYNC, os.O_DSYNC):
        fd = os.open(m.file, os.O_RDWR | flag)
        try:
            for _ in range(3):
                data = random_bytes(MiB + 17)
                off = rounds * 2 * MiB + 5
                assert os.pwrite(fd, data, off) == len(data)
                rounds += 1
                # The write alone, before the reader's own requests.
                ev = log_ranged_events(srv.log)
                assert flushes(ev) >= rounds, \
                    f"round {rounds}: {flushes(ev)} flushes answered"
                assert read_nbd(srv.uri, off, len(data)) == data, \
                    f"round {rounds}: bytes not on the server at return"
                assert not unflushed_writes(ev, range(rounds), 2 * MiB), \
                    f"round {rounds}: no flush after the write's reply"
        finally:
            os.close(fd)


def test_pwritev2_rwf_dsync_flushes_that_write_only(server, mount):
    """RWF_DSYNC on one write of an ordinary handle makes that write
    durable; the plain writes around it send no flush of their own."""
    srv = server("memory", f"size={EXPORT}", log=True)
    m = mount(srv)
    fd = os.open(m.file, os.O_RDWR)
    plain, written = random_bytes(MiB), []
    try:
        assert os.pwrite(fd, plain, 0) == MiB
        assert flushes(log_ranged_events(srv.log)) == 0, "plain write flushed"
        for i in range(1, 4):
            data = random_bytes(MiB - 3)
            before = flushes(log_ranged_events(srv.log))
            assert os.pwritev(fd, [data], i * 2 * MiB,
                              os.RWF_DSYNC) == len(data)
            ev = log_ranged_events(srv.log)    # before a reader's own requests
            assert flushes(ev) > before, f"write {i}: no flush answered"
            assert not unflushed_writes(ev, range(1, i + 1), 2 * MiB), \
                f"write {i}: no flush after the write's reply"
            written.append((i * 2 * MiB, data))
        before = flushes(log_ranged_events(srv.log))
        assert os.pwrite(fd, plain, 9 * MiB) == MiB
        assert flushes(log_ranged_events(srv.log)) == before, "plain write flushed"
    finally:
        os.close(fd)
    for off, data in written + [(0, plain), (9 * MiB, plain)]:
        assert read_nbd(srv.uri, off, len(data)) == data
