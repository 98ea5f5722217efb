"""O_DSYNC and O_SYNC writes are durable when they return.

A write made through a handle opened with O_DSYNC or O_SYNC, or with
pwritev2()'s RWF_DSYNC (the kernel passes it in the write's flags), is
answered only once the server acknowledged it and an NBD flush issued
after that acknowledgement was answered too.  Checked in nbdkit's request
log: between each such write's reply and the next write, a flush and its
reply; and on the server, the bytes are there when the call returns.
Plain writes on the same handles stay write-back (no flush of their own).
"""

import os
import re

from lib.env import MiB
from lib.nbd import read_nbd, sha256_nbd
from lib.digest import sha256_file
from lib.images import random_file
from lib.procs import run

EXPORT = 32 * MiB

# connection=1 Write id=3 offset=0x100000 count=0x100000 fua=0 ...
# connection=1 ...Write id=3 return=0 (Success)
EVENT = re.compile(r"connection=(\d+) (\.\.\.)?(Write|Zero|Flush) id=(\d+)"
                   r"(?: offset=(0x[0-9a-f]+|\d+) count=(0x[0-9a-f]+|\d+))?")


def log_events(log):
    """[(op, is_reply, (conn, id), offset, count)] in log order; a reply
    carries its request's offset and count."""
    out, reqs = [], {}
    for line in open(log, errors="replace"):
        m = EVENT.search(line)
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
    ev = log_events(srv.log)
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
                data = os.urandom(MiB + 17)
                off = rounds * 2 * MiB + 5
                assert os.pwrite(fd, data, off) == len(data)
                rounds += 1
                # The write alone, before the reader's own requests.
                ev = log_events(srv.log)
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
    plain, written = os.urandom(MiB), []
    try:
        assert os.pwrite(fd, plain, 0) == MiB
        assert flushes(log_events(srv.log)) == 0, "plain write flushed"
        for i in range(1, 4):
            data = os.urandom(MiB - 3)
            before = flushes(log_events(srv.log))
            assert os.pwritev(fd, [data], i * 2 * MiB,
                              os.RWF_DSYNC) == len(data)
            ev = log_events(srv.log)    # before a reader's own requests
            assert flushes(ev) > before, f"write {i}: no flush answered"
            assert not unflushed_writes(ev, range(1, i + 1), 2 * MiB), \
                f"write {i}: no flush after the write's reply"
            written.append((i * 2 * MiB, data))
        before = flushes(log_events(srv.log))
        assert os.pwrite(fd, plain, 9 * MiB) == MiB
        assert flushes(log_events(srv.log)) == before, "plain write flushed"
    finally:
        os.close(fd)
    for off, data in written + [(0, plain), (9 * MiB, plain)]:
        assert read_nbd(srv.uri, off, len(data)) == data
