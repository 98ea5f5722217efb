"""The benchmark's scripts (bench/bench, bench-cpu, bench-verify,
bench-warm, bench-fuse-uring) start and describe themselves (--help, exit 0, nothing run),
and the matrix says what docs/benchmarks.md claims: every preset's
default cells use nbdkit file on tmpfs (memory only when asked), every
cell where nbdcopy runs also runs nbdcopy >= 1.24 with and without
--blkhash, and the headline preset holds the issue's cells.  No mount, no
server, no timing."""
import importlib.util
import subprocess

import pytest

import re

from lib.env import BUILD, TOP

BENCH = TOP / "bench"
SCRIPTS = ["bench", "bench-cpu", "bench-verify", "bench-warm",
           "bench-fuse-uring"]


def matrix():
    spec = importlib.util.spec_from_file_location(
        "bench_matrix", BENCH / "benchlib" / "matrix.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


@pytest.mark.parametrize("script", SCRIPTS)
def test_bench_script_help(script):
    r = subprocess.run(["/usr/bin/python3", BENCH / script, "--help"],
                       capture_output=True, text=True, timeout=60,
                       cwd=TOP)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage:"), r.stdout[:200]
    assert script in r.stdout.split("\n")[0], r.stdout[:200]


def presets():
    return ["quick", "first", "headline", "full", "tuning", "sparse",
            "servers", "vmdk", "copyout", "blkhash", "defaults", "qcow2",
            "vhdx"]


def test_default_server_is_file_on_tmpfs_and_memory_on_request():
    m = matrix()
    for name in presets():
        for e in m.preset(name):
            for s in e.servers:
                if s.default:
                    assert s.plugin == "file", (name, e.name, s)
        for e in m.preset(name, server="memory"):
            for s in e.servers:
                if s.default:
                    assert s.plugin == "memory", (name, e.name, s)
    # The presets' own cells use the default server (only the cells about
    # servers name theirs).
    for e in m.preset("headline") + m.preset("defaults"):
        assert all(s.default for s in e.servers), e.name


def test_new_nbdcopy_wherever_nbdcopy_runs():
    m = matrix()
    pairs = {"nbdcopy": ("nbdcopy-new", "nbdcopy-new-blkhash"),
             "out-nbdcopy": ("out-nbdcopy-new", "out-nbdcopy-new-blkhash")}
    for name in presets():
        for e in m.preset(name):
            arms = {a.name for a in e.arms}
            for old, new in pairs.items():
                if old in arms:
                    assert set(new) <= arms, (name, e.name)


def test_no_arm_twice():
    """An arm listed twice in an experiment would run twice a round and
    be counted as one arm's runs."""
    m = matrix()
    names = [a.name for a in m.ALL_ARMS]
    assert len(names) == len(set(names))
    for name in presets():
        for e in m.preset(name):
            arms = [a.name for a in e.arms]
            assert len(arms) == len(set(arms)), (name, e.name)


def test_headline_preset_holds_the_issues_cells():
    m = matrix()
    G, M = 1 << 30, 1 << 20
    cells = set()
    for e in m.preset("headline"):
        assert e.runs == 5, e.name
        ways = {a.direction for a in e.arms}
        assert len(ways) == 1, e.name       # one direction per experiment
        way = ways.pop()
        cells |= {(way, src.kind, src.size, lat)
                  for src, srv, lat in e.cells()}
    assert cells == {("in", "dense", G, 0), ("in", "sparse25", G, 0),
                     ("in", "thin", 16 * G, 0), ("in", "dense", G, 2),
                     ("out", "sparse25", G, 2), ("out", "sparse25", G, 10)}
    thin = m.thin(16 * G)
    assert thin.size // 64 == 256 * M
    arms = {a.name for e in m.preset("headline") for a in e.arms}
    assert {"ferry-defaults", "ferry-cp", "ferry-cp-nohash", "nbdcopy",
            "nbdcopy-new", "nbdcopy-new-blkhash", "out-ferry-defaults-sparse",
            "out-nbdcopy", "out-nbdcopy-new"} <= arms
    nohash = next(a for e in m.preset("headline") for a in e.arms
                  if a.name == "ferry-cp-nohash")
    assert {"--no-digest", "--no-manifest"} <= set(nohash.daemon_opts)
    sparse_out = next(a for e in m.preset("headline") for a in e.arms
                      if a.name == "out-ferry-defaults-sparse")
    assert sparse_out.client[:2] == ("cp", "--sparse=always")


@pytest.mark.parametrize("script", ["bench", "bench-cpu", "bench-warm"])
def test_bench_keeps_manifests_in_its_workdir(script):
    """A script that mounts keeps the mounts' manifests (warm migration)
    in its own work directory: a benchmark leaves none in
    /var/lib/nbdferry (the 118 it once left there), and no run finds an
    earlier run's record of the same export and skips its writes."""
    text = (BENCH / script).read_text()
    assert "NBDFERRY_STATE_DIR" in text or "--state-dir" in text, script


def test_default_binaries_are_built():
    """The programs a script takes from the build tree by default are
    where the build puts them (bench-warm once looked for the daemon at
    its old place, build/fs/nbdferry, and failed without --nbdferry)."""
    join = re.compile(r'os\.path\.join\(build, ((?:"[^"]+", )*"[^"]+")\)')
    found = 0
    for script in SCRIPTS:
        for args in join.findall((BENCH / script).read_text()):
            rel = [a.strip('"') for a in args.split(", ")]
            found += 1
            assert BUILD.joinpath(*rel).exists(), (script, rel)
    assert found >= 3


def test_cpu_breakdown_roles(monkeypatch):
    """bench-cpu's breakdown: a thread ever seen reading /dev/fuse is the
    FUSE receiver even when it was seen more often on a futex (waiting for
    a pool buffer), then a poller, then a worker."""
    from importlib.machinery import SourceFileLoader
    monkeypatch.syspath_prepend(str(BENCH))     # its benchlib
    spec = importlib.util.spec_from_loader(
        "bench_cpu", SourceFileLoader("bench_cpu", str(BENCH / "bench-cpu")))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    assert m.role_of({"futex": 9, "fuse": 1}) == "fuse"
    assert m.role_of({"futex": 9, "poll": 2, "7": 4}) == "poll"
    assert m.role_of({"futex": 1, "61": 5}) == "futex"
    assert m.role_of({"61": 5}) == "other"
