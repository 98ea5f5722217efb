"""Scratch directories follow $TMPDIR: scripts/demo's and the tests'.

Run: /usr/bin/python3 -m pytest tests/test_tmpdir.py
"""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from lib.env import BUILD
from lib.procs import run

TOP = Path(__file__).resolve().parent.parent


def test_shortdir_is_under_tmpdir(shortdir):
    """Run by the test below with TMPDIR set (and directly: then $TMPDIR
    or /tmp)."""
    assert str(shortdir).startswith(tempfile.gettempdir() + "/")


def test_tests_use_tmpdir(tmp_path):
    mine = tmp_path / "t"
    mine.mkdir()
    if len(str(mine)) > 60:                 # too long for socket names
        mine = Path(tempfile.mkdtemp(prefix="td", dir="/tmp"))
    env = dict(os.environ, TMPDIR=str(mine))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p",
                        "no:cacheprovider", f"{__file__}::"
                        "test_shortdir_is_under_tmpdir"],
                       env=env, capture_output=True, text=True, cwd=TOP)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 passed" in r.stdout, r.stdout


def test_demo_uses_tmpdir(tmp_path):
    env = dict(os.environ, TMPDIR=str(tmp_path), NBDFERRY_BUILD=str(BUILD))
    r = run([TOP / "scripts" / "demo"], env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "OK: the disk arrived intact" in r.stdout, r.stdout
    src = next(l for l in r.stdout.splitlines() if l.startswith("source: "))
    assert src.startswith(f"source: {tmp_path}/nbdferry-demo."), src
    assert not any(tmp_path.iterdir()), "the demo left its scratch dir"
