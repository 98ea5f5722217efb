"""Content checks: the bytes through the mount and on the server against
the expected bytes, and on a mismatch which byte ranges differ and whether
they read as zero."""

import hashlib
import os

import pytest

from lib.digest import sha256_bytes, sha256_file
from lib.env import MiB
from lib.nbd import read_nbd, sha256_nbd


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


def assert_content(expected, size, mount_file=None, uri=None,
                   mount_size=None, what=""):
    """Assert that the file through the mount and/or the export read
    directly from the server hold the expected bytes.

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

    def exp_sha(n):
        if isinstance(expected, (bytes, bytearray)):
            return sha256_bytes(bytes(expected[:n]), pad_to=n)
        return sha256_file(expected, pad_to=n) if n >= exp_len else \
            hashlib.sha256(exp_reader(0, n)).hexdigest()

    problems = []
    if mount_file is not None:
        msize = size if mount_size is None else mount_size
        st = os.stat(mount_file)
        if st.st_size != msize:
            problems.append(f"{mount_file}: size {st.st_size}, expected {msize}")
        if sha256_file(mount_file) != exp_sha(msize):
            problems.append(
                f"{mount_file}: sha256 differs from the source; read through "
                f"the mount:\n" + describe_mismatch(
                    exp_reader, padded(file_reader(mount_file), st.st_size),
                    msize))
    if uri is not None:
        if sha256_nbd(uri, size) != exp_sha(size):
            problems.append(
                "server: sha256 differs from the source; read directly from "
                "the server:\n" + describe_mismatch(exp_reader,
                                                    nbd_reader(uri), size))
    if problems:
        pytest.fail((what + ": " if what else "") + "\n".join(problems))

