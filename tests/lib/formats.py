"""The format contract table: what every image view (MNT/nbd.FMT) and
every inspector (tools/nbdferry-FMT) promises, and for each format how to
make, damage and read back an image, so that tests/test_view_contract.py
and tests/test_inspector_contract.py run the same cases over all of them.

- ``FORMATS``: name -> Format (view file, qemu-img driver and create
  options, inspector, a header damage the view refuses before the disk
  changes and check rejects, the words each says).
- ``make_image(fmt, raw, out)``: qemu-img's image of a raw source, checked
  to decode back to the source (qemu-img convert -O raw).
- ``qemu_spec(fmt, path)``: how qemu-img should open an image (the VHD's
  size from its footer, not from CHS: lib/vhd.py's vpc_spec).
- ``to_raw(fmt, img, out)``, ``qemu_compare(fmt, img, raw)``.
- ``COPY_TOOLS``, ``copy_into``, ``land``, ``random_export``,
  ``assert_untouched``: the view tests' shared steps (lib/vhd.py's copy
  tools and a pipe; an export full of random bytes; the disk as it was,
  on the server and through the mount, at its size).
- ``contract_raw(path)``: the source disk: random data, all-zero MiBs and a
  size that is no multiple of any format's block (6 MiB + 12800 bytes,
  whole sectors as VHD and VMDK need; qemu-img 7.2 ends streamOptimized
  files of this size with their end-of-stream marker).

A new format joins by a row here; tests/test_layout.py fails until it also
has its unit tests (format, stream, synth) and its fuzz stream target.
"""

import hashlib
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from lib.digest import sha256_file
from lib.env import BUILD, MiB
from lib.images import random_bytes
from lib.nbd import fill_random, sha256_nbd
from lib.procs import run
from lib.vhd import COPY_TOOLS as _VHD_COPY_TOOLS, vpc_spec

RAW_SIZE = 6 * MiB + 12800


def _vhd_header(b):
    """The dynamic header's creator field changed, its checksum not."""
    (doff,) = struct.unpack_from(">Q", b, 16)
    b[doff + 100] ^= 0x5A


def _vmdk_version(b):
    struct.pack_into("<I", b, 4, 9)


def _vhdx_headers(b):
    """Both headers' CRC-32C broken (the copy tests nothing else)."""
    b[64 * 1024 + 100] ^= 1
    b[128 * 1024 + 100] ^= 1


def _qcow2_cluster_bits(b):
    struct.pack_into(">I", b, 20, 23)


@dataclass(frozen=True)
class Format:
    name: str               # vhd: the view is nbd.vhd, the tool nbdferry-vhd
    qemu: str               # qemu-img's name of the format (-f/-O)
    create: str             # qemu-img convert -o OPTIONS for the source image
    damage: object          # fn(bytearray): a header the view refuses
    refused: str            # ... the daemon's log line and check say this
    cut: str                # a file cut short: the daemon's log says this

    @property
    def view(self):
        return f"nbd.{self.name}"

    @property
    def tool(self):
        return BUILD / "tools" / f"nbdferry-{self.name}"


FORMATS = {f.name: f for f in (
    Format("vhd", "vpc", "subformat=dynamic,force_size=on", _vhd_header,
           "checksum", "ended"),
    Format("vmdk", "vmdk", "subformat=streamOptimized", _vmdk_version,
           "version 9", "ended"),
    Format("vhdx", "vhdx", "subformat=dynamic", _vhdx_headers,
           "header", "cut short"),
    Format("qcow2", "qcow2", "compat=1.1", _qcow2_cluster_bits,
           "cluster_bits 23", "ended at byte"),
)}


def qemu_spec(fmt, path):
    """qemu-img's arguments to open path as fmt (without -f: a VHD's size
    is its footer's current size, through json:)."""
    if fmt.qemu == "vpc":
        return [vpc_spec(path)]
    return ["-f", fmt.qemu, str(path)]


def qemu_img(*args):
    r = run(["qemu-img", *map(str, args)], timeout=300)
    assert r.returncode == 0, f"qemu-img {args}: {r.stdout}{r.stderr}"
    return r


def to_raw(fmt, img, out):
    """qemu-img's decode of img, a raw file."""
    qemu_img("convert", "-q", *qemu_spec(fmt, img), "-O", "raw", out)
    return Path(out)


def qemu_compare(fmt, img, raw):
    """qemu-img compare of raw and img: (returncode, output)."""
    other = [vpc_spec(img)] if fmt.qemu == "vpc" else \
        ["-F", fmt.qemu, str(img)]
    r = run(["qemu-img", "compare", "-f", "raw", str(raw), *other],
            timeout=300)
    return r.returncode, r.stdout + r.stderr


def contract_raw(path, size=RAW_SIZE):
    """Random data with every third MiB zero, and a random tail."""
    data = bytearray(size)
    for m in range(-(-size // MiB)):
        if m % 3 != 1:
            end = min((m + 1) * MiB, size)
            data[m * MiB:end] = random_bytes(end - m * MiB)
    Path(path).write_bytes(bytes(data))
    return Path(path)


def make_image(fmt, raw, out):
    """qemu-img's image of raw as fmt; it must decode back to raw."""
    qemu_img("convert", "-q", "-f", "raw", "-O", fmt.qemu, "-o", fmt.create,
             raw, out)
    rc, text = qemu_compare(fmt, out, raw)
    assert rc == 0, f"qemu-img's own {fmt.name} of {raw} reads back wrong: {text}"
    return Path(out)


def damaged(fmt, img, out):
    """img with fmt's header damage, written to out."""
    b = bytearray(Path(img).read_bytes())
    fmt.damage(b)
    Path(out).write_bytes(bytes(b))
    return Path(out)


def cut_short(img, out):
    """img cut two thirds in (inside its data for every format), at a
    sector boundary."""
    b = Path(img).read_bytes()
    Path(out).write_bytes(b[:len(b) * 2 // 3 // 512 * 512])
    return Path(out)


# name -> argv (src, dst); every one opens dst with O_TRUNC.
COPY_TOOLS = dict(_VHD_COPY_TOOLS)
COPY_TOOLS["pipe"] = lambda s, d: ["sh", "-c", 'cat "$1" | cat > "$2"', "sh",
                                   s, d]


def copy_into(tool, src, dst, secs=300):
    """Run one copy tool; the CompletedProcess (not checked)."""
    return run(COPY_TOOLS[tool](src, dst), timeout=secs)


def land(m, src, tool="cp", *, view):
    """Copy src into MNT/view; the copy must succeed."""
    r = copy_into(tool, src, m.mp / view)
    assert r.returncode == 0, (
        f"{tool} {Path(src).name} -> {view} exited {r.returncode}: "
        f"{r.stderr}\ndaemon stderr:\n{m.stderr[-3000:]}")
    return r


def random_export(server, size):
    """A memory export of size bytes full of random bytes: (server, bytes)."""
    srv = server("memory", f"size={size}")
    return srv, fill_random(srv.uri, size)


def assert_untouched(srv, m, old):
    """The disk is old, on the server and through the mount, at its size."""
    want = hashlib.sha256(old).hexdigest()
    assert sha256_nbd(srv.uri) == want, "the disk changed (on the server)"
    assert os.stat(m.file).st_size == len(old), "the disk's size changed"
    assert sha256_file(m.file) == want, "the disk changed (through the mount)"


__all__ = [n for n in dir() if not n.startswith("_")]
