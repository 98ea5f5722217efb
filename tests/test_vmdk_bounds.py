"""Every bound the VMDK stream decoder checks, through MNT/nbd.vmdk.

tests/unit/test-vmdk-stream.c and test-vmdk-format.c check each rule of a
grain marker, of the metadata after the grains and of the header's
layout on the decoder alone; here each one lands a crafted file through
the view (test_vmdk_view.py covers the magic, version, newline test,
grain size, create type, delta disk, extent size and the sparse grain
map's overhead and overlaps the same way), and expects a clean refusal: the copy fails (write or close), the daemon
logs exactly one nbd.vmdk line naming the rule, and the disk is untouched
(sha256 of the server's bytes before and after, read from the server and
through the mount).  The crafted files start from python3-vmdkstream's
output of test_vmdk_view.py's source disk (capacity 12313 sectors, on a
16 MiB export, so a grain the decoder placed past the capacity would land
inside the export, where it shows).

A rule broken by the first grain is refused before anything is written.
A rule broken later (a grain that repeats an LBA, a bad marker, a footer
that disagrees) is refused there: by then the disk has been replaced (it
reads as zero but for the grains before it, docs/design/format-vmdk.md), so for
those what is checked is that nothing but zeros or the old bytes lies
past the VMDK's capacity: no decoded byte went outside the disk.

Run: /usr/bin/python3 -m pytest tests/test_vmdk_bounds.py
"""

import struct

import pytest

from lib.nbd import read_nbd
from lib.vhd import copy_into
from test_vmdk_view import (assert_untouched, fx, land, patch,  # noqa: F401
                            random_export, roundup, sha256_file, sha256_nbd,
                            split_stream)

EXPORT = 16 * 1024 * 1024


def capacity(data):
    """The header's capacity, in sectors."""
    return struct.unpack_from("<Q", data, 12)[0]


def grain_at(data, i):
    """File offset of grain marker i."""
    head, grains, _ = split_stream(data)
    return len(head) + sum(len(g) for _, g in grains[:i])


def set_lba(data, i, lba):
    return patch(data, grain_at(data, i), struct.pack("<Q", lba))


def meta_at(data):
    head, grains, _ = split_stream(data)
    return len(head) + sum(len(g) for _, g in grains)


def footer_at(data):
    """File offset of the footer (after its marker)."""
    pos = meta_at(data)
    while True:
        n, size, typ = struct.unpack_from("<QII", data, pos)
        if typ == 3:
            return pos + 512
        pos += 512 + n * 512


def first_lba(data):
    return split_stream(data)[1][0][0]


# case -> (mutation of the vmdkstream file, message in the log).  The
# first grain breaks the rule: nothing may reach the disk.
FIRST = {
    "grain-past-capacity": (
        lambda d: set_lba(d, 0, roundup(capacity(d), 128)), "past the capacity"),
    "grain-far-past-capacity": (
        lambda d: set_lba(d, 0, 1 << 40), "past the capacity"),
    "grain-at-capacity-end": (
        lambda d: set_lba(d, 0, capacity(d)), "past the capacity"),
    "grain-unaligned": (
        lambda d: set_lba(d, 0, first_lba(d) + 1), "not at a grain boundary"),
    "grain-huge": (
        lambda d: patch(d, grain_at(d, 0) + 8, struct.pack("<I", 1 << 30)),
        "compressed bytes"),
}

# The header's layout (offsets from the VMDK sparse header): refused
# before anything reaches the disk.  (file, mutation, message)
HEADER = {
    "capacity-zero": ("vmdkstream", lambda d: patch(d, 12, struct.pack("<Q", 0)),
                      "capacity is 0"),
    "gtes-per-gt": ("qemu-sparse", lambda d: patch(d, 44, struct.pack("<I", 1024)),
                    "grain table"),
    "compression-2": ("vmdkstream", lambda d: patch(d, 77, struct.pack("<H", 2)),
                      "compression algorithm 2"),
    "overhead-zero": ("vmdkstream", lambda d: patch(d, 64, struct.pack("<Q", 0)),
                      "overhead"),
    "descriptor-size-0": ("vmdkstream",
                          lambda d: patch(d, 36, struct.pack("<Q", 0)), "size 0"),
    "descriptor-outside-overhead": (
        "qemu-sparse", lambda d: patch(d, 28, struct.pack(
            "<Q", struct.unpack_from("<Q", d, 64)[0] + 8)),
        "not inside the overhead"),
    "gd-on-descriptor": (
        "qemu-sparse", lambda d: patch(d, 56, d[28:36]), "descriptor"),
    "gt-outside-overhead": (
        "qemu-sparse", lambda d: patch(
            d, struct.unpack_from("<Q", d, 56)[0] * 512, struct.pack(
                "<I", struct.unpack_from("<Q", d, 64)[0] + 64)),
        "not inside the overhead"),
}

# The rule is broken after some grains: they may have landed.
LATER = {
    "grain-twice": (
        lambda d: set_lba(d, 1, first_lba(d)), "appears twice"),
    "marker-type": (
        lambda d: patch(d, meta_at(d) + 12, struct.pack("<I", 9)),
        "unknown marker type 9"),
    "footer-capacity": (
        lambda d: patch(d, footer_at(d) + 12,
                        struct.pack("<Q", capacity(d) + 128)),
        "does not match the header"),
    "zeroed-grain": (
        lambda d: patch(d, grain_at(d, 3), bytes(len(split_stream(d)[1][3][1]))),
        "after the end-of-stream marker"),
}


@pytest.fixture
def victim(server, mount):
    srv, old = random_export(server, EXPORT)
    m = mount(srv, expect_errors=True)
    return srv, m, old


def refused(m, tool, bad, message):
    r = copy_into(tool, bad, m.mp / "nbd.vmdk")
    assert r.returncode != 0, f"{tool} accepted a VMDK breaking {message!r}"
    errs = [l for l in m.stderr.splitlines() if "nbd.vmdk:" in l]
    assert len(errs) == 1 and message in errs[0], m.stderr
    return r


@pytest.mark.parametrize("tool", ["cp", "cat"])
@pytest.mark.parametrize("case", sorted(FIRST))
def test_first_grain_bound_refused_disk_untouched(victim, fx, tmp_path,
                                                  case, tool):
    srv, m, old = victim
    _, raw, files = fx
    fn, message = FIRST[case]
    bad = tmp_path / "bad.vmdk"
    bad.write_bytes(fn(files["vmdkstream"].read_bytes()))
    refused(m, tool, bad, message)
    assert_untouched(srv, m, old)
    land(m, files["vmdkstream"], "cp")          # the view works afterwards
    assert sha256_nbd(srv.uri) == sha256_file(raw, pad_to=EXPORT)


@pytest.mark.parametrize("case", sorted(HEADER))
def test_header_bound_refused_disk_untouched(victim, fx, tmp_path, case):
    srv, m, old = victim
    _, raw, files = fx
    name, fn, message = HEADER[case]
    bad = tmp_path / "bad.vmdk"
    bad.write_bytes(fn(files[name].read_bytes()))
    refused(m, "cp", bad, message)
    assert_untouched(srv, m, old)
    land(m, files[name], "cp")
    assert sha256_nbd(srv.uri) == sha256_file(raw, pad_to=EXPORT)


@pytest.mark.parametrize("case", sorted(LATER))
def test_later_bound_refused_nothing_past_capacity(victim, fx, tmp_path, case):
    srv, m, old = victim
    _, raw, files = fx
    fn, message = LATER[case]
    data = files["vmdkstream"].read_bytes()
    bad = tmp_path / "bad.vmdk"
    bad.write_bytes(fn(data))
    refused(m, "cp", bad, message)
    end = roundup(capacity(data) * 512, 64 * 1024)
    past = read_nbd(srv.uri, end, EXPORT - end)
    assert past == bytes(len(past)) or past == old[end:], \
        "decoded bytes past the VMDK's capacity"
    land(m, files["vmdkstream"], "cp")
    assert sha256_nbd(srv.uri) == sha256_file(raw, pad_to=EXPORT)
