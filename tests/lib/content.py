"""Content checks: the bytes through the mount and on the server against
the expected bytes, and on a mismatch which byte ranges differ and whether
they read as zero."""

import os

import pytest

from lib.env import CHUNK, MiB, libnbd
from lib.nbd import nbd_handle, read_nbd


def file_reader(path):
    def rd(off, n):
        with open(path, "rb") as f:
            f.seek(off)
            return f.read(n)
    return rd


def bytes_reader(data):
    return lambda off, n: bytes(data[off:off + n])


def nbd_reader(uri):
    def rd(off, n):
        return read_nbd(uri, off, n)
    return rd


def padded(reader, real_size):
    """A reader that returns zeros beyond real_size."""
    def rd(off, n):
        b = reader(off, max(0, min(n, real_size - off))) if off < real_size else b""
        return b + bytes(n - len(b))
    return rd


def describe_mismatch(expected, actual, size, limit=8):
    """Human-readable list of differing MiB chunks between two readers."""
    out = []
    off = 0
    while off < size and len(out) < limit:
        n = min(MiB, size - off)
        a, b = expected(off, n), actual(off, n)
        if a != b:
            if len(b) < len(a):
                out.append(f"  short read at {off + len(b)}")
                break
            first = next(i for i in range(n) if a[i] != b[i])
            last = max(i for i in range(n) if a[i] != b[i])
            zero = b[first:last + 1].count(0) == last + 1 - first
            out.append(f"  bytes {off + first}..{off + last} differ"
                       f"{' (read as zero)' if zero else ''}")
        off += n
    return "\n".join(out) or f"  (first {size} bytes equal)"


def _expected_chunks(expected, exp_len, size):
    """The expected bytes, CHUNK at a time, zeros past exp_len, to size."""
    f = None if isinstance(expected, (bytes, bytearray)) else \
        open(expected, "rb", buffering=0)
    try:
        off = 0
        while off < size:
            n = min(CHUNK, size - off)
            k = max(0, min(n, exp_len - off))
            if f is None:
                b = bytes(expected[off:off + k])
            else:
                b = read_full(f, k)
            yield b + bytes(n - len(b)) if len(b) < n else b
            off += n
    finally:
        if f is not None:
            f.close()


def _same(expected, exp_len, read_at, size):
    """True if read_at(off, n) returns the expected bytes over [0, size)."""
    off = 0
    for want in _expected_chunks(expected, exp_len, size):
        if read_at(off, len(want)) != want:
            return False
        off += len(want)
    return True


def assert_content(expected, size, mount_file=None, uri=None,
                   mount_size=None, what=""):
    """Assert that the file through the mount and/or the export read
    directly from the server hold the expected bytes: compared byte for
    byte (a stronger check than comparing digests, and faster: the tests
    spent more time hashing than copying).

    expected: bytes, or a path whose bytes are followed by zeros up to size.
    size: bytes to compare on the server (usually the export size).
    mount_size: expected length of the file through the mount (default size).
    """
    if isinstance(expected, (bytes, bytearray)):
        exp_reader = padded(bytes_reader(expected), len(expected))
        exp_len = len(expected)
    else:
        exp_len = os.path.getsize(expected)
        exp_reader = padded(file_reader(expected), exp_len)

    problems = []
    if mount_file is not None:
        msize = size if mount_size is None else mount_size
        st = os.stat(mount_file)
        if st.st_size != msize:
            problems.append(f"{mount_file}: size {st.st_size}, expected {msize}")
        with open(mount_file, "rb", buffering=0) as mf:
            def read_mount(off, n):
                mf.seek(off)
                return read_full(mf, n)
            same = _same(expected, exp_len, read_mount, msize) and \
                not mf.read(1)
        if not same:
            problems.append(
                f"{mount_file}: differs from the source; read through "
                f"the mount:\n" + describe_mismatch(
                    exp_reader, padded(file_reader(mount_file), st.st_size),
                    msize))
    if uri is not None:
        if libnbd is not None:
            with nbd_handle(uri) as nh:
                same = _same(expected, exp_len,
                             lambda off, n: nh.pread(n, off), size)
        else:
            whole = read_nbd(uri, 0, size)
            same = _same(expected, exp_len,
                         lambda off, n: whole[off:off + n], size)
        if not same:
            problems.append(
                "server: differs from the source; read directly from "
                "the server:\n" + describe_mismatch(exp_reader,
                                                    nbd_reader(uri), size))
    if problems:
        pytest.fail((what + ": " if what else "") + "\n".join(problems))


def read_full(f, n):
    """Up to n bytes from an unbuffered file: read() until n or EOF."""
    parts = []
    while n > 0:
        b = f.read(n)
        if not b:
            break
        parts.append(b)
        n -= len(b)
    return b"".join(parts) if len(parts) != 1 else parts[0]
