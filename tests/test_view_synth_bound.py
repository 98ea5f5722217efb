"""Opens of the format views stay within the memory bound, whatever the
readers do between them.

Each read-only open of nbd.vhd or nbd.vmdk reads one frozen description
of the disk (a synthesizer: about 2.3 MiB for a 1 TiB VHD).  Opens that
see the same disk state share one; an open after a change of the disk
needs a new one, and a reader that keeps every handle open across
changes used to make the daemon grow by one per open (300 opens: 13 MB
to 711 MB).  Now at most 8 distinct ones live: past that an open fails
with EMFILE (one log line) until handles close, and the daemon's RSS
stays within the bound.  The raw file's bytes written between the opens
land on the server as usual; the handles held across them fail their
reads with EIO (the disk changed since their open), a new open reads."""

import errno
import os

import pytest

from lib.env import MiB
from lib.images import random_bytes
from lib.mounts import RssSampler
from lib.nbd import read_nbd

EXPORT = 1 << 40                   # nbdkit memory: sparse
OPENS = 300
CAP = 8                            # views/synthcache.h SYNTHCACHE_MAX
POOL = 8 * MiB                     # the mount's write-back pool
SLACK = 24 * MiB                   # what else may grow meanwhile


@pytest.mark.parametrize("view", ["nbd.vhd", "nbd.vmdk"])
def test_opens_after_changes_are_capped(server, mount, view):
    srv = server("memory", f"size={EXPORT}")
    # The pool is small and counted: each 4 KiB write below takes a
    # buffer of its own until it is sent, and with the default 64 MiB
    # pool a machine slow to send them (a busy core) grew the daemon by
    # up to its size for reasons this test is not about.
    m = mount(srv, "--pool-size", str(POOL), expect_errors=True)  # EMFILE
    path = m.mp / view
    held, refused, written = [], 0, []
    raw = os.open(m.file, os.O_RDWR)
    try:
        first = os.open(path, os.O_RDONLY)   # the view's first state
        held.append(first)
        base = m.rss()[0]
        with RssSampler(m) as rss:
            for i in range(OPENS):
                data = random_bytes(4096)
                off = (i + 1) * 3 * (1 << 30)    # a new 2 MiB block each
                assert os.pwrite(raw, data, off) == len(data)
                written.append((off, data))
                try:
                    held.append(os.open(path, os.O_RDONLY))
                except OSError as e:
                    assert e.errno == errno.EMFILE, e
                    refused += 1
        assert len(held) == CAP and refused == OPENS + 1 - CAP, \
            (len(held), refused)
        grew = rss.peak - base
        print(f"{view}: {len(held)} held, {refused} refused, VmRSS +"
              f"{grew / MiB:.1f} MiB")
        assert grew < CAP * 3 * MiB + POOL + SLACK, \
            f"VmRSS grew {grew / MiB:.0f} MiB over {OPENS} opens"
        # Every handle was opened before a change of the disk: it reads
        # the disk at its open or nothing (views/imageview.c, THE
        # SNAPSHOT): EIO.
        for fd in held:
            with pytest.raises(OSError) as e:
                os.pread(fd, 512, 0)
            assert e.value.errno == errno.EIO, e.value
        for fd in held:
            os.close(fd)
        held = []
        fd = os.open(path, os.O_RDONLY)      # room again
        held.append(fd)
        assert len(os.pread(fd, 512, 0)) == 512
    finally:
        for fd in held:
            os.close(fd)
        os.close(raw)
    assert "versions of the disk are already open" in m.stderr
    for off, data in written[:3] + written[-3:]:
        assert read_nbd(srv.uri, off, len(data)) == data


@pytest.mark.parametrize("view", ["nbd.vhd", "nbd.vmdk"])
def test_opens_of_one_state_share_one(server, mount, view):
    """Without changes between them, 300 held opens cost one description
    (the VMDK view used to build one per open)."""
    srv = server("memory", f"size={EXPORT}")
    m = mount(srv)
    path = m.mp / view
    base = m.rss()[0]
    held = []
    try:
        with RssSampler(m) as rss:
            held += [os.open(path, os.O_RDONLY) for _ in range(OPENS)]
            # The metadata at the head (VMDK: header, descriptor, grain
            # directory), read through every handle: each description it
            # touches is resident.
            heads = {os.pread(fd, MiB, 0) for fd in held}
        assert len(heads) == 1
    finally:
        for fd in held:
            os.close(fd)
    grew = rss.peak - base
    print(f"{view}: {OPENS} opens of one state, VmRSS +{grew / MiB:.1f} MiB")
    assert grew < 3 * MiB + SLACK, f"VmRSS grew {grew / MiB:.0f} MiB"
