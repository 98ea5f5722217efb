"""The tests' own oracles: assert_content (byte for byte, the file
through a mount and the export on the server against the source) fails on
every kind of difference it must catch, random_bytes gives data in which
no block repeats another, and pread_many returns what the server holds,
range by range in the order asked."""

import zlib

import pytest

from lib.content import assert_content
from lib.env import MiB
from lib.images import random_bytes
from lib.nbd import pread_many, write_nbd

SIZE = 9 * MiB + 4097           # past two 4 MiB chunks, not aligned


@pytest.fixture
def landed(server, shm):
    data = random_bytes(SIZE - 5000)        # the tail reads as zero
    srv = server("memory", f"size={SIZE}")
    write_nbd(srv.uri, data)
    f = shm / "through-the-mount"
    f.write_bytes(data + bytes(5000))
    src = shm / "source"
    src.write_bytes(data)
    return data, srv, f, src


def test_equal_content_passes(landed):
    data, srv, f, src = landed
    assert_content(data, SIZE, mount_file=f, uri=srv.uri)
    assert_content(src, SIZE, mount_file=f, uri=srv.uri)


@pytest.mark.parametrize("where", [0, 4 * MiB - 1, 4 * MiB, SIZE - 5001,
                                   SIZE - 1])
def test_one_byte_differing_fails(landed, where):
    data, srv, f, src = landed
    b = bytearray(f.read_bytes())
    b[where] ^= 0x5A
    f.write_bytes(bytes(b))
    with pytest.raises(pytest.fail.Exception, match=f"bytes {where}"):
        assert_content(src, SIZE, mount_file=f)
    write_nbd(srv.uri, bytes(b[where:where + 1]), where)
    with pytest.raises(pytest.fail.Exception, match="server: differs"):
        assert_content(data, SIZE, uri=srv.uri)


@pytest.mark.parametrize("delta", [-1, 1, -MiB])
def test_wrong_length_fails(landed, delta):
    data, srv, f, src = landed
    b = f.read_bytes()
    f.write_bytes(b[:SIZE + delta] if delta < 0 else b + bytes(delta))
    with pytest.raises(pytest.fail.Exception, match="size"):
        assert_content(src, SIZE, mount_file=f)


def test_longer_file_with_equal_prefix_fails(landed):
    """mount_size given as the expected length: a file longer than that
    fails even when the size check is told the longer size."""
    data, srv, f, src = landed
    f.write_bytes(f.read_bytes() + b"x")
    with pytest.raises(pytest.fail.Exception):
        assert_content(src, SIZE, mount_file=f, mount_size=SIZE)


def test_random_bytes_no_block_repeats():
    b = random_bytes(16 * MiB + 3)
    assert len(b) == 16 * MiB + 3
    blocks = [b[i:i + 512] for i in range(0, 16 * MiB, 512)]
    assert len(set(blocks)) == len(blocks)
    assert random_bytes(4 * MiB) != random_bytes(4 * MiB)
    assert len(zlib.compress(b, 6)) > len(b)       # incompressible


def test_pread_many_returns_each_range_in_order(landed):
    data, srv, f, src = landed
    ranges = [(off, n) for off, n in
              [(SIZE - 4096, 4096), (0, 1), (4 * MiB - 3, 7), (MiB, 65536)]
              * 40]
    got = list(pread_many(srv.uri, ranges, depth=8))
    assert [o for o, _ in got] == [o for o, _ in ranges]
    padded = data + bytes(SIZE - len(data))
    for (off, n), (_, b) in zip(ranges, got):
        assert b == padded[off:off + n], off
