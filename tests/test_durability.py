"""close() and fsync() mean what they say; the namespace is fixed.

* close() returns only once every write made through the file is
  acknowledged by the server: read directly from a slow server right after
  close, every byte is there.
* fsync() also sends NBD flush, after the writes it covers completed (a
  flush only covers completed writes), and returns after its reply.
* Every time, not only the first: several write-then-fsync rounds on one
  handle each send their own flush after their own writes; several
  open-write-close rounds each find their bytes on the server at close.
* Creating, renaming and deleting files fail with an errno; chmod, chown
  and utimes are accepted as no-ops (rsync -a --inplace needs that)."""

import os
import re

import pytest

from lib.content import assert_content
from lib.copytools import log_mark
from lib.env import MiB
from lib.nbd import fill_random, read_nbd

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
    data = os.urandom(8 * MiB + 3)
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
    data = os.urandom(3 * MiB)
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
            data = os.urandom(MiB + 7 * i)
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
        data = os.urandom(2 * MiB + 5 * i)
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
        data = os.urandom(6 * MiB + 1)
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
    # Metadata changes are accepted and change nothing that matters.
    os.chmod(m.file, 0o600)
    os.utime(m.file, (1, 1))
    os.chown(m.file, 0, 0)
    assert_content(old, EXPORT, mount_file=m.file, uri=srv.uri,
                   what="after namespace operations")
