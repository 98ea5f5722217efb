"""The contract every inspector keeps (nbdferry-vhd, -vmdk, -vhdx,
-qcow2: info, check, map, cat, export), run for every format of the table
in tests/lib/formats.py over qemu-img's image of one raw source (random
data, all-zero MiBs, 6 MiB + 12800 bytes).  The per-format files
(test_vhd_tool.py ...) keep only each format's own rules.

- info, check and map read a good image (exit 0; check says "ok", after any warning).
- cat of the image equals the raw source (sha256), to a file and to
  standard output.
- check of the image with the table's header damage exits 1 naming the
  rule; cat and info of it exit 1 too (the same reader).
- export of the raw source: qemu-img compares it equal to the source (and
  checks it, for formats qemu-img checks), the inspector's own check passes and its cat gives the source back.
- --help prints the usage on standard output and exits 0, --version the
  program's name and version; no command, or an unknown one, exits 2 with
  the usage; a missing file exits 2.

Run: /usr/bin/python3 -m pytest -n 2 tests/test_inspector_contract.py
"""

import hashlib
import re
import shutil
import subprocess

import pytest

from lib.digest import sha256_file
from lib.formats import (FORMATS, contract_raw, damaged, make_image,
                         qemu_compare)
from lib.env import timeout

if not shutil.which("qemu-img"):
    raise RuntimeError("qemu-img missing (scripts/install-deps)")
for _f in FORMATS.values():
    if not _f.tool.exists():
        raise RuntimeError(f"{_f.tool} not built (scripts/build)")

fmts = pytest.mark.parametrize("fmt", list(FORMATS))


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    d = tmp_path_factory.mktemp("inspect")
    raw = contract_raw(d / "src.raw")
    images = {n: make_image(f, raw, d / f"src.{n}") for n, f in
              FORMATS.items()}
    return raw, images


def tool(fmt, *args, expect=0):
    r = subprocess.run([str(FORMATS[fmt].tool), *map(str, args)],
                       capture_output=True, stdin=subprocess.DEVNULL,
                       timeout=timeout(300))
    assert r.returncode == expect, (
        f"nbdferry-{fmt} {args}: exit {r.returncode}, want {expect}\n"
        f"{r.stdout[-2000:]!r}\n{r.stderr.decode(errors='replace')}")
    return r


@fmts
def test_info_check_map(src, fmt):
    _, images = src
    assert tool(fmt, "info", images[fmt]).stdout
    out = tool(fmt, "check", images[fmt]).stdout
    assert re.search(rb"(^|: )ok\b", out, re.M), out
    assert tool(fmt, "map", images[fmt]).stdout


@fmts
def test_cat_is_the_raw_source(src, tmp_path, fmt):
    raw, images = src
    out = tmp_path / "cat.raw"
    tool(fmt, "cat", images[fmt], "-o", out)
    assert sha256_file(out) == sha256_file(raw)
    r = tool(fmt, "cat", images[fmt])
    assert hashlib.sha256(r.stdout).hexdigest() == sha256_file(raw)


@fmts
def test_check_refuses_damaged_header(src, tmp_path, fmt):
    _, images = src
    f = FORMATS[fmt]
    bad = damaged(f, images[fmt], tmp_path / f"bad.{fmt}")
    r = tool(fmt, "check", bad, expect=1)
    assert f.refused.encode() in r.stderr, r.stderr
    tool(fmt, "cat", bad, "-o", tmp_path / "bad.raw", expect=1)
    tool(fmt, "info", bad, expect=1)


@fmts
def test_export_round_trip(src, tmp_path, fmt):
    raw, _ = src
    f = FORMATS[fmt]
    out = tmp_path / f"export.{fmt}"
    tool(fmt, "export", raw, "-o", out)
    rc, text = qemu_compare(f, out, raw)
    assert rc == 0, text
    if f.qemu != "vpc":                 # qemu-img does not check VHDs
        r = subprocess.run(["qemu-img", "check", "-f", f.qemu, str(out)],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
    tool(fmt, "check", out)
    back = tmp_path / "back.raw"
    tool(fmt, "cat", out, "-o", back)
    assert sha256_file(back) == sha256_file(raw)


@fmts
def test_help_version_usage(tmp_path, fmt):
    r = tool(fmt, "--help")
    assert r.stdout.startswith(f"usage: nbdferry-{fmt} ".encode()), r.stdout
    r = tool(fmt, "--version")
    assert r.stdout.split()[0] == f"nbdferry-{fmt}".encode(), r.stdout
    assert b"usage" in tool(fmt, expect=2).stderr
    assert b"usage" in tool(fmt, "frobnicate", tmp_path, expect=2).stderr
    tool(fmt, "check", tmp_path / f"missing.{fmt}", expect=2)
