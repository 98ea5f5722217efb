"""valgrind memcheck of a whole mount / copy / read / unmount cycle:
no invalid accesses, no definite leaks.  The daemon runs
under ``valgrind --leak-check=full --error-exitcode=99
--errors-for-leak-kinds=definite`` through conftest's wrapper hook, so the
mount fixture's teardown asserts exit status 0 (99 would mean errors or
leaks) and a clean stderr.  Skipped for sanitizer builds, which valgrind
cannot run."""

import os
import shutil

import pytest

import conftest
from conftest import MiB, NBDFERRY, random_file, run, sha256_file
from faulthelpers import is_sanitized, sha256_prefix

pytestmark = pytest.mark.skipif(not shutil.which("valgrind"),
                                reason="needs valgrind")

VALGRIND = ["valgrind", "--quiet", "--leak-check=full",
            "--errors-for-leak-kinds=definite",
            "--show-leak-kinds=definite", "--error-exitcode=99",
            "--trace-children=no", "--num-callers=30"]


@pytest.fixture
def under_valgrind(monkeypatch):
    if NBDFERRY.exists() and is_sanitized(NBDFERRY):
        pytest.skip("sanitizer build: valgrind cannot run it")
    monkeypatch.setattr(conftest, "WRAPPER", VALGRIND)
    monkeypatch.setattr(conftest, "SCALE", max(conftest.SCALE, 10))


@pytest.mark.parametrize("mode", ["uri-multiconn", "command"])
def test_valgrind_mount_copy_unmount(under_valgrind, server, mount, shm,
                                     mode):
    disk = random_file(shm / "disk.img", 32 * MiB)
    if mode == "command":
        target = ["--command", "nbdkit", "-s", "--exit-with-parent", "file",
                  str(disk)]
        m = mount(target, ready_timeout=120)
    else:
        srv = server("file", disk, "wdelay=1ms", filters=["delay"])
        m = mount(srv, "-C", "4", "--request-size", "256K", ready_timeout=120)
    assert m.cmd[0] == "valgrind", m.cmd
    src = random_file(shm / "src.img", 12 * MiB)
    run(["cp", src, m.file], check=True, timeout=300)
    # Sparse writes, a punch, a read and the status file, for coverage.
    run(["fallocate", "--punch-hole", "--keep-size", "-o", str(MiB), "-l",
         str(MiB), m.file], check=True, timeout=120)
    run(["cat", m.mp / ".nbdferry-status"], check=True, timeout=120)
    out = shm / "out.img"
    run(["dd", f"if={m.file}", f"of={out}", "bs=1M", "count=4",
         "status=none"], check=True, timeout=300)
    m.unmount(secs=300)              # asserts rc 0 under valgrind
    ref = bytearray(src.read_bytes())
    ref[MiB:2 * MiB] = bytes(MiB)
    import hashlib
    assert sha256_prefix(disk, len(ref)) == hashlib.sha256(ref).hexdigest()
    assert sha256_file(out) == hashlib.sha256(ref[:4 * MiB]).hexdigest()


def test_valgrind_second_connection_refused(server, tmp_path):
    """The first connection opens, the second is refused (nbdkit's limit
    filter lets one client in): the daemon fails to start, and frees the
    half-made second connection as well as the first."""
    if NBDFERRY.exists() and is_sanitized(NBDFERRY):
        pytest.skip("sanitizer build: valgrind cannot run it")
    srv = server("memory", "64M", "limit=1", filters=["limit"])
    mp = tmp_path / "mp"
    mp.mkdir()
    p = run(VALGRIND + [str(NBDFERRY), "-f", "-C", "2", str(mp), "--unix",
                        str(srv.sock)], timeout=300)
    assert "cannot connect" in p.stderr, p.stderr
    assert "definitely lost" not in p.stderr, p.stderr
    assert p.returncode not in (0, 99), (p.returncode, p.stderr)
    assert not os.path.ismount(mp)
