"""A view's refusal says that nothing was written, how to get the image
in, and names the real mountpoint.

Into MNT/nbd.vhdx: a VHDX whose headers are both bad, one whose region
table is bad, and a qcow2 (another format); into MNT/nbd.vmdk a VMDK
that qemu-img writes seeking back.  Each is refused before the disk
changes (the disk is checked byte for byte on the server), and the log
line naming the view says "nothing was written", gives a fix (the view
to write it into, or a qemu-img convert into the raw file), and spells
paths with the mount's own directory, never "MNT/"."""

import re

import pytest

from lib.formats import copy_into
from lib.images import make_sparse_image
from lib.procs import run

from test_vhdx_view import (assert_untouched, fx, qemu_vhdx,  # noqa
                            random_export)


def view_lines(m, view):
    return [l for l in m.stderr.splitlines()
            if re.search(rf"(^|: ){re.escape(view)}: ", l) and
            "error" in l]


def check_words(m, view):
    lines = view_lines(m, view)
    assert lines, m.stderr[-3000:]
    line = lines[0]
    assert "nothing was written" in line, line
    assert "qemu-img convert" in line or "write it into" in line, line
    assert "MNT/" not in line, line
    assert f"{m.mp}/" in line, line


@pytest.mark.parametrize("damage", ["headers", "region", "qcow2"])
def test_vhdx_refusal_says_nothing_written_and_the_fix(server, mount, fx,
                                                       tmp_path, damage):
    _, raw, files = fx
    bad = tmp_path / "bad.vhdx"
    if damage == "qcow2":
        r = run(["qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2",
                 str(raw), str(bad)])
        assert r.returncode == 0, r.stderr
    else:
        data = bytearray(files["dynamic"].read_bytes())
        at = (64, 128) if damage == "headers" else (192, 256)
        for k in at:
            data[k * 1024 + (100 if damage == "headers" else 40)] ^= 1
        bad.write_bytes(bytes(data))
    srv, old = random_export(server)
    m = mount(srv, expect_errors=True)
    r = copy_into("cp", bad, m.mp / "nbd.vhdx")
    assert r.returncode != 0
    assert_untouched(srv, m, old)
    check_words(m, "nbd.vhdx")


def test_vmdk_written_seeking_back_names_the_mountpoint(server, mount,
                                                         tmp_path):
    srv, old = random_export(server)
    m = mount(srv, expect_errors=True)
    raw = make_sparse_image(tmp_path / "d.raw", 2 << 20,
                            [(0, 1 << 20)], seed=4).path
    r = run(["qemu-img", "convert", "-f", "raw", "-O", "vmdk", str(raw),
             str(m.mp / "nbd.vmdk")])
    assert r.returncode != 0
    assert_untouched(srv, m, old)
    lines = view_lines(m, "nbd.vmdk")
    assert lines and "MNT/" not in lines[0], lines
    assert f"qemu-img convert -n -O raw SRC {m.mp}/nbd" in lines[0], lines
