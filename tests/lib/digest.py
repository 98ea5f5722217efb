"""sha256 of files, byte strings and streams: the one definition the tests
and the benchmark (bench/bench, bench/bench-cpu, bench/bench-verify,
bench/bench-warm)
share.  Standard library only, so the benchmark can import it without
pytest; bench/benchlib makes the harness importable as the package ``lib``:

    import benchlib
    from lib.digest import sha256_file
"""

import hashlib

MiB = 1 << 20
CHUNK = 4 * MiB
# Files are read and hashed 256 KiB at a time: the buffer stays in the
# cache between the read and the hash (10% faster here than 4 MiB).
READ_CHUNK = 256 << 10


def update_zeros(h, n):
    """Feed n zero bytes to the hash object h."""
    z = bytes(min(n, CHUNK))
    while n > 0:
        k = min(n, CHUNK)
        h.update(z[:k])
        n -= k


def update_stream(h, f, length=None):
    """Feed h from the binary file object f until EOF or length bytes;
    returns the number of bytes read.  One buffer, reused (readinto)."""
    buf = memoryview(bytearray(READ_CHUNK))
    n = 0
    while length is None or n < length:
        k = f.readinto(buf[:READ_CHUNK if length is None else
                           min(READ_CHUNK, length - n)])
        if not k:
            break
        h.update(buf[:k])
        n += k
    return n


def sha256_file(path, pad_to=None, length=None):
    """sha256 of a file's bytes (only the first length bytes, if given),
    followed by zeros up to pad_to bytes."""
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        n = update_stream(h, f, length)
    if pad_to is not None:
        assert n <= pad_to, f"{path}: {n} bytes, more than {pad_to}"
        update_zeros(h, pad_to - n)
    return h.hexdigest()


def sha256_stream(f, length=None):
    """(sha256, bytes read) of a binary stream read to EOF (or length)."""
    h = hashlib.sha256()
    n = update_stream(h, f, length)
    return h.hexdigest(), n


def sha256_bytes(data, pad_to=None):
    """sha256 of data followed by zeros up to pad_to bytes."""
    h = hashlib.sha256(data)
    if pad_to is not None:
        update_zeros(h, pad_to - len(data))
    return h.hexdigest()


def sha256_zeros(n):
    """sha256 of n zero bytes."""
    return sha256_bytes(b"", pad_to=n)


def blkhash_file(path, alg="sha256", block=64 << 10, length=None):
    """blkhash of a file's bytes (the default digest of an nbdferry mount
    and of nbdferry-verify; blksum's and nbdcopy --blkhash's):
    D(D(block 0) || ... || D(block n-1) || le64(length)), sha256 of 64 KiB
    blocks unless told otherwise."""
    outer = hashlib.new(alg)
    n = 0
    with open(path, "rb") as f:
        while length is None or n < length:
            b = f.read(block if length is None else min(block, length - n))
            if not b:
                break
            outer.update(hashlib.new(alg, b).digest())
            n += len(b)
    outer.update(n.to_bytes(8, "little"))
    return outer.hexdigest()


def blkhash_bytes(data, alg="sha256", block=64 << 10):
    """blkhash of a byte string (see blkhash_file)."""
    outer = hashlib.new(alg)
    for off in range(0, len(data), block):
        outer.update(hashlib.new(alg, data[off:off + block]).digest())
    outer.update(len(data).to_bytes(8, "little"))
    return outer.hexdigest()
