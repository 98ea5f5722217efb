"""Reading and writing an export directly, not through the mount: with
python3-libnbd when it is installed, else nbdcopy/nbdinfo through pipes."""

import contextlib
import hashlib
import subprocess

from lib.digest import update_stream
from lib.env import CHUNK, libnbd
from lib.images import random_bytes, random_file
from lib.procs import run


@contextlib.contextmanager
def nbd_handle(uri):
    h = libnbd.NBD()
    h.connect_uri(uri)
    try:
        yield h
    finally:
        with contextlib.suppress(Exception):
            h.shutdown()


def nbd_size(uri):
    if libnbd is not None:
        with nbd_handle(uri) as h:
            return h.get_size()
    r = run(["nbdinfo", "--size", uri], check=True)
    return int(r.stdout)


def sha256_nbd(uri, size=None):
    """sha256 of the first size bytes (default: all) of an export, read
    directly from the server (libnbd if available, else nbdcopy URI -)."""
    h = hashlib.sha256()
    if libnbd is not None:
        with nbd_handle(uri) as nh:
            total = nh.get_size() if size is None else size
            off = 0
            while off < total:
                n = min(CHUNK, total - off)
                h.update(nh.pread(n, off))
                off += n
        return h.hexdigest()
    p = subprocess.Popen(["nbdcopy", uri, "-"], stdout=subprocess.PIPE)
    n = update_stream(h, p.stdout, size)
    p.stdout.close()
    p.kill()
    p.wait()
    assert size is None or n == size, \
        f"{uri}: short read, {size - n} bytes missing"
    return h.hexdigest()


def pread_many(uri, ranges, depth=64):
    """Yield (offset, bytes) for each (offset, length) in ranges, read from
    the server with up to depth requests in flight (python3-libnbd), in
    the order given.  For checks of many small blocks: one request at a
    time costs a round trip each."""
    ranges = list(ranges)
    with nbd_handle(uri) as nh:
        inflight = []               # (offset, buffer, cookie), in order
        i = 0
        while i < len(ranges) or inflight:
            while i < len(ranges) and len(inflight) < depth:
                off, n = ranges[i]
                buf = libnbd.Buffer(n)
                inflight.append((off, buf, nh.aio_pread(buf, off)))
                i += 1
            off, buf, cookie = inflight[0]
            while not nh.aio_command_completed(cookie):
                nh.poll(-1)
            inflight.pop(0)
            yield off, bytes(buf.to_bytearray())


def read_nbd(uri, offset=0, length=None):
    """Bytes of an export read directly from the server."""
    if libnbd is not None:
        with nbd_handle(uri) as nh:
            if length is None:
                length = nh.get_size() - offset
            out = bytearray()
            while len(out) < length:
                n = min(CHUNK, length - len(out))
                out += nh.pread(n, offset + len(out))
            return bytes(out)
    r = subprocess.run(["nbdcopy", uri, "-"], stdout=subprocess.PIPE,
                       check=True)
    end = None if length is None else offset + length
    return r.stdout[offset:end]


def write_nbd(uri, data, offset=0):
    """Write bytes to an export directly (not through the mount)."""
    if libnbd is not None:
        with nbd_handle(uri) as nh:
            pos = 0
            while pos < len(data):
                n = min(CHUNK, len(data) - pos)
                nh.pwrite(data[pos:pos + n], offset + pos)
                pos += n
            nh.flush()
        return
    assert offset == 0, "offset writes need python3-libnbd"
    run(["nbdcopy", "-", uri], check=True, input=data, text=False)


def fill_random(uri, size=None):
    """Pre-fill an export with random bytes, written directly to the server
    (so a stale byte anywhere shows).  Returns the bytes written."""
    if size is None:
        size = nbd_size(uri)
    data = random_bytes(size)
    write_nbd(uri, data)
    return data



def random_export(kind, server, jitter_server, scratch, size, maxdelay_us):
    """A size-byte export full of random bytes (a stale byte shows), and
    those bytes: kind "memory" (nbdkit memory) or "jitter" (the
    random-delay RAM disk: writes complete late and out of order, up to
    maxdelay_us each).  server and jitter_server are the fixtures."""
    if kind == "memory":
        srv = server("memory", f"size={size}")
        return srv, fill_random(srv.uri, size)
    disk = random_file(scratch / "disk.img", size)
    old = disk.read_bytes()
    srv = jitter_server(size, maxdelay_us, f"init={disk}")
    disk.unlink()
    return srv, old
