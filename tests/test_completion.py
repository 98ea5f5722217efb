"""Bash completion: tools/bash-completion/nbdferry completes each
program's options from the program's own --long-options/--short-options
(the tables its getopt parses), and cmake --install puts it where
bash-completion looks, under each program's name."""

import shutil
import subprocess
from pathlib import Path

import pytest

from lib.env import BUILD, NBDFERRY
from lib.procs import run

SCRIPT = Path(__file__).resolve().parent.parent / "tools/bash-completion/nbdferry"
PROGRAMS = {
    "nbdferry": NBDFERRY,
    "nbdferry-vhd": BUILD / "tools" / "nbdferry-vhd",
    "nbdferry-vmdk": BUILD / "tools" / "nbdferry-vmdk",
    "nbdferry-vhdx": BUILD / "tools" / "nbdferry-vhdx",
    "nbdferry-qcow2": BUILD / "tools" / "nbdferry-qcow2",
    "nbdferry-verify": BUILD / "tools" / "nbdferry-verify",
    "nbdferry-sync": BUILD / "tools" / "nbdferry-sync",
    "nbdferry-status": Path(__file__).resolve().parent.parent / "tools" /
    "status" / "nbdferry-status",
}


def complete(prog, *words):
    """COMPREPLY for the command line PROG WORDS..., cursor on the last."""
    assert shutil.which("bash"), "bash is required"
    words = [str(prog), *words]
    script = (f"source {SCRIPT}\n"
              f"COMP_WORDS=({' '.join(repr(w) for w in words)})\n"
              f"COMP_CWORD={len(words) - 1}\n"
              "_nbdferry\n"
              "printf '%s\\n' \"${COMPREPLY[@]}\"\n"
              f"complete -p {Path(prog).name}\n")
    r = subprocess.run(["bash", "--norc", "-c", script], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines and lines[-1].startswith("complete -o default -F _nbdferry")
    return set(l for l in lines[:-1] if l)


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_completion_lists_every_long_option(name):
    exe = PROGRAMS[name]
    assert exe.exists(), f"{exe} not built"
    longs = set(run([exe, "--long-options"]).stdout.split())
    assert "--help" in longs and "--version" in longs, longs
    assert complete(exe, "--") == longs
    shorts = set(run([exe, "--short-options"]).stdout.split())
    assert shorts and shorts <= complete(exe, "-")


def test_completion_narrows_by_prefix():
    assert complete(NBDFERRY, "--pi") == {"--pidfile", "--pid-file"}
    assert complete(NBDFERRY, "--tls-v") == {"--tls-verify-peer"}
    assert complete(PROGRAMS["nbdferry-verify"], "--zero") == {"--zero-tail"}
    assert complete(NBDFERRY, "--no-such") == set()


def test_completion_of_digest_values():
    """--digest=VALUE: bash breaks the word at "=" (COMP_WORDBREAKS)."""
    assert complete(NBDFERRY, "--digest", "=", "") == \
        {"blkhash", "sha256", "none"}
    assert complete(NBDFERRY, "--digest", "=") == \
        {"blkhash", "sha256", "none"}
    assert complete(NBDFERRY, "--digest", "=", "s") == {"sha256"}
    assert complete(NBDFERRY, "--digest", "n") == {"none"}
    assert complete(PROGRAMS["nbdferry-verify"], "--digest", "=", "sha") == \
        {"sha1", "sha256", "sha512"}


def test_completion_leaves_paths_to_bash():
    """A word that is not an option gets no list of ours: -o default
    completes file names (mountpoints, images)."""
    assert complete(NBDFERRY, "/tm") == set()


def test_completion_of_qcow2_cluster_sizes():
    """--qcow2-cluster-size takes the sizes qemu does, 512 to 2M."""
    every = complete(NBDFERRY, "--qcow2-cluster-size", "=")
    assert {"512", "4K", "64K", "2M"} <= every and "4M" not in every, every
    assert complete(NBDFERRY, "--qcow2-cluster-size", "6") == {"64K"}
