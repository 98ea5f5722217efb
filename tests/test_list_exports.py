"""nbdferry --list URI: the server's exports, one per line (NAME, SIZE,
DESCRIPTION separated by tabs), for scripts that mount each disk of a VM.

nbdkit's file plugin with dir= serves every file of a directory as an
export of its name; the memory plugin serves only the default export
(listed with an empty name).  An unreachable server and a bad operand are
one line on stderr and exit 1 (2 for usage)."""


import re

from lib.env import MiB, NBDFERRY
from lib.procs import run


def test_list_exports_of_a_directory(server, tmp_path):
    d = tmp_path / "disks"
    d.mkdir()
    sizes = {"disk0": 10 * MiB, "disk1": 20 * MiB + 512, "disk2": 3 * MiB}
    for name, size in sizes.items():
        with open(d / name, "wb") as f:
            f.truncate(size)
    srv = server("file", f"dir={d}")
    r = run([NBDFERRY, "--list", srv.uri])
    assert r.returncode == 0, r.stderr
    got = {}
    for line in r.stdout.splitlines():
        name, size, desc = line.split("\t")
        got[name] = int(size)
    assert got == sizes, r.stdout
    assert r.stderr == "", r.stderr


def test_list_default_export(server):
    srv = server("memory", f"size={MiB}")
    r = run([NBDFERRY, "--list", srv.uri])
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"\t{MiB}\t\n", repr(r.stdout)


def test_list_unreachable_and_usage(tmp_path):
    r = run([NBDFERRY, "--list", f"nbd+unix:///?socket={tmp_path}/none"])
    assert r.returncode == 1 and r.stdout == ""
    assert len(r.stderr.splitlines()) == 1 and "--list" in r.stderr, r.stderr
    for args in (["--list"], ["--list", "/tmp/x"], ["--list", "a://", "b"]):
        r = run([NBDFERRY, *args])
        assert r.returncode != 0 and len(r.stderr.splitlines()) == 1, \
            (args, r.stderr)


def test_list_deadline_with_a_slow_server(server, tmp_path):
    """--list has one deadline for the whole listing (--list-timeout):
    a server that takes 1 s per export answers the list at once, then
    the sizes it did not give in time are '?', with one warning; every
    export is still listed."""
    d = tmp_path / "disks"
    d.mkdir()
    names = [f"disk{i}" for i in range(8)]
    for name in names:
        with open(d / name, "wb") as f:
            f.truncate(MiB)
    srv = server("file", f"dir={d}", "delay-open=1", filters=["delay"])
    r = run([NBDFERRY, "--list-timeout", "3", "--list", srv.uri],
            timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert sorted(l.split("\t")[0] for l in lines) == names, r.stdout
    unknown = [l for l in lines if l.split("\t")[1] == "?"]
    # Not all asked within 3 s at 1 s each; the last ones are '?'.
    assert len(unknown) >= len(names) - 4, r.stdout
    known = [l for l in lines if l.split("\t")[1] != "?"]
    assert all(l.split("\t")[1] == str(MiB) for l in known), r.stdout
    assert re.search(r"--list-timeout.*the last \d+ of 8 exports", r.stderr), \
        r.stderr
