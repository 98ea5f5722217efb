"""What docs/user-guide.md tells a user to type works as it says.

- The raw-migration line for qemu-img (taken from the guide itself, with
  disk.img and /mnt/disk replaced) onto an export full of old data: the
  guide's own `qemu-img compare` check passes and the server holds the
  source followed by zeros.
- "One writer": a second writer's bytes in a hole the mount believes zero
  are invisible through the mount, and `nbdferry-verify --zero-tail
  disk.img URI`, as the guide says, sees them.
- "A verified migration with blkhash, end to end": the guide's lines, run
  as a shell script onto an export full of old data, find the source's
  blkhash in the status and the read-back matches; with one byte of the
  export changed behind the daemon's back the read-back says so.

Run: /usr/bin/python3 -m pytest tests/test_user_guide.py
"""

import os
import re
from pathlib import Path

from lib.content import assert_content
from lib.env import BUILD, MiB
from lib.images import make_sparse_image
from lib.nbd import fill_random, write_nbd
from lib.procs import run

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "user-guide.md"
EXPORT = 64 * MiB
VERIFY = next(p for p in (BUILD / "tools" / "nbdferry-verify",
                          BUILD / "nbdferry-verify") if p.exists())


def guide_line(pattern):
    """The indented command line of the guide that matches pattern."""
    for line in GUIDE.read_text().splitlines():
        if line.startswith("    ") and re.search(pattern, line):
            return line.split("  #")[0].strip()
    raise AssertionError(f"no line matching {pattern!r} in {GUIDE}")


def test_guide_qemu_img_line_leaves_no_old_tail(server, mount, shm):
    srv = server("memory", f"size={EXPORT}")
    fill_random(srv.uri, EXPORT)
    m = mount(srv)
    img = make_sparse_image(shm / "disk.img", 20 * MiB + 4096, runs=5,
                            seed=7)
    line = guide_line(r"qemu-img convert .*/mnt/disk/nbd")
    cmd = line.replace("disk.img", str(img.path)).replace("/mnt/disk",
                                                          str(m.mp))
    r = run(["sh", "-c", cmd])
    assert r.returncode == 0, (cmd, r.stderr)
    check = guide_line(r"qemu-img compare").replace(
        "disk.img", str(img.path)).replace("/mnt/disk", str(m.mp))
    r = run(["sh", "-c", check])
    assert r.returncode == 0, (check, r.stdout, r.stderr)
    assert_content(img.path, EXPORT, mount_file=m.file, uri=srv.uri,
                   mount_size=img.size, what="the guide's qemu-img line")


def test_one_writer_verify_against_the_server(server, mount, shm):
    """A hole of the source that the mount knows to be zero: another
    writer's bytes there stay on the server, the mount reads zeros."""
    srv = server("memory", f"size={EXPORT}")
    m = mount(srv)
    src = shm / "disk.img"
    with open(src, "wb") as f:             # data, 16 MiB hole, data
        f.write(os.urandom(8 * MiB))
        f.seek(24 * MiB)
        f.write(os.urandom(8 * MiB))
    write_nbd(srv.uri, b"\x77" * MiB, 12 * MiB)     # the other writer
    run(["cp", "--sparse=always", src, m.file], check=True)
    with open(m.file, "rb") as f:
        f.seek(12 * MiB)
        seen = f.read(MiB)
    through_mount = run([VERIFY, "--zero-tail", src, m.file])
    direct = run([VERIFY, "--zero-tail", src, srv.uri])
    # documented: the mount cannot see it (its zero map says zero) ...
    assert seen == bytes(MiB) and through_mount.returncode == 0, \
        "the mount saw the other writer: update the guide's One writer"
    # ... and the guide's check against the server does
    assert direct.returncode == 1, (direct.stdout, direct.stderr)


STATUS = Path(__file__).resolve().parent.parent / "tools" / "status" / "nbdferry-status"


def guide_block(first, last):
    """The guide's indented command lines from the one before the line
    matching 'first' to the one matching 'last', comments dropped."""
    lines = [l.split("  #")[0].strip() for l in
             GUIDE.read_text().splitlines() if l.startswith("    ")]
    i = next(n for n, l in enumerate(lines) if re.search(first, l))
    j = next(n for n, l in enumerate(lines) if n > i and re.search(last, l))
    return lines[i - 1:j + 1]


def test_guide_blkhash_end_to_end(server, mount, shm):
    srv = server("memory", f"size={EXPORT}")
    fill_random(srv.uri, EXPORT)
    m = mount(srv, "--blkhash")
    img = make_sparse_image(shm / "disk.img", 40 * MiB + 5, runs=6, seed=19)
    block = guide_block(r"> disk.blkhash &$", r"--zero-tail")
    assert block[0].startswith("nbdferry --blkhash ")  # the fixture mounts
    assert block[-2] == "fusermount3 -u /mnt/disk"

    def local(line):
        uri = re.search(r"'(nbd\+unix://[^']*)'", block[0]).group(1)
        return (line.replace("nbdferry-verify", str(VERIFY))
                .replace("nbdferry-status", f"/usr/bin/python3 {STATUS}")
                .replace("disk.blkhash", str(shm / "disk.blkhash"))
                .replace("disk.img", str(img.path))
                .replace("/mnt/disk", str(m.mp))
                .replace(uri, srv.uri))

    script = "set -e\n" + "\n".join(local(l) for l in block[1:-2])
    r = run(["bash", "-c", script])
    assert r.returncode == 0, (script, r.stdout, r.stderr)
    want = (shm / "disk.blkhash").read_text().split()[0]
    assert f"complete: {want}" in r.stdout, r.stdout
    m.unmount()
    readback = ["sh", "-c", local(block[-1])]
    r = run(readback)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert_content(img.path, EXPORT, uri=srv.uri, what="the guide's blkhash "
                   "migration")
    with open(img.path, "rb") as f:            # a byte the server lost
        byte = f.read(1)
    write_nbd(srv.uri, bytes([byte[0] ^ 1]), 0)
    assert run(readback).returncode == 1
