"""The mount's files behind one interface: what every view shares.

- Refused opens leave nothing behind: a second writer of nbd.vhd (EBUSY)
  and a write open of the status file (EACCES) take no handle, so the
  first writer's close frees the VHD view for the next one and the unmount
  is clean.
- One error per case for the whole mount: a size past the export
  (truncate) is EFBIG, data past the export (write, fallocate that grows)
  is ENOSPC, and none of them changes a byte of the disk (an image whose
  disk is larger: test_view_contract.py).
- No source file imports another in a circle (scripts/dev/import-graph over
  the build, which is itself checked to catch a planted circle).

Every landing is checked by sha256 against the source, read directly from
the server.

Run: /usr/bin/python3 -m pytest tests/test_views.py
"""

import errno
import hashlib
import json
import os
import shutil
from pathlib import Path

from lib.env import BUILD, MiB
from lib.nbd import fill_random, sha256_nbd
from lib.procs import oserror_errno, run
from lib.vhd import SHA, VIRTUAL, fixture

ROOT = Path(__file__).resolve().parents[1]
IMPORT_GRAPH = ROOT / "scripts" / "dev" / "import-graph"
EXPORT = 32 * MiB
BS = 64 * 1024

for tool in ("qemu-img", "dd", "nm", "cc"):
    if not shutil.which(tool):
        raise RuntimeError(f"{tool} missing (scripts/install-deps)")


# ------------------------------------------------------------ open failures


def test_refused_opens_take_no_handle(server, mount, shm):
    srv = server("memory", f"size={EXPORT}")
    fill_random(srv.uri)
    m = mount(srv)
    vhd = m.mp / "nbd.vhd"
    first = os.open(vhd, os.O_WRONLY)
    try:
        assert oserror_errno(os.open, vhd, os.O_WRONLY) == errno.EBUSY
        assert oserror_errno(os.open, vhd, os.O_RDWR) == errno.EBUSY
        assert oserror_errno(os.open, m.mp / ".nbdferry-status",
                             os.O_WRONLY) == errno.EACCES
    finally:
        os.close(first)
    # The refused writers took nothing: the next writer owns the view.
    img = fixture("qemu-dyn-10m.vhd", shm)
    run(["dd", f"if={img}", f"of={vhd}", f"bs={BS}", "status=none"],
        check=True)
    assert sha256_nbd(srv.uri, VIRTUAL["qemu-dyn-10m"]) == \
        SHA["qemu-dyn-10m.raw"]
    # A clean unmount: no handle of a refused open is left to free.
    assert m.unmount() == 0


# ------------------------------------------------------------ errors


def test_size_past_export_efbig_data_past_export_enospc(server, mount):
    srv = server("memory", f"size={EXPORT}")
    data = fill_random(srv.uri)
    m = mount(srv, expect_errors=True)
    assert oserror_errno(os.truncate, m.file, EXPORT + 1) == errno.EFBIG
    fd = os.open(m.file, os.O_RDWR)
    try:
        assert oserror_errno(os.ftruncate, fd, EXPORT + MiB) == errno.EFBIG
        assert oserror_errno(os.pwrite, fd, b"x" * 512, EXPORT) == \
            errno.ENOSPC
        assert oserror_errno(os.posix_fallocate, fd, EXPORT - 4096,
                             8192) == errno.ENOSPC
        os.fsync(fd)
    finally:
        os.close(fd)
    assert os.stat(m.file).st_size == EXPORT
    # Each error the tool saw is logged and counted.
    st = json.loads((m.mp / ".nbdferry-status").read_bytes())
    assert st["errors"] == 4, st["failures"]
    assert sum("refused: the export holds" in l or "past the end of the "
               "export" in l for l in m.stderr.splitlines()) == 4
    assert m.unmount() == 0
    assert sha256_nbd(srv.uri) == hashlib.sha256(data).hexdigest()


# ------------------------------------------------------------ imports


def test_no_import_cycle():
    r = run([str(IMPORT_GRAPH), str(BUILD)])
    assert r.returncode == 0, r.stderr


def test_import_graph_catches_a_cycle(tmp_path):
    """Two files of a fake tree that call each other: a cycle."""
    (tmp_path / "fs").mkdir()
    (tmp_path / "fs" / "a.c").write_text("int b(void);\nint a(void) "
                                         "{ return b(); }\n")
    (tmp_path / "fs" / "b.c").write_text("int a(void);\nint b(void) "
                                         "{ return a() + 1; }\n")
    objdir = tmp_path / "build" / "fs" / "CMakeFiles" / "x.dir"
    objdir.mkdir(parents=True)
    for f in ("a", "b"):
        run(["cc", "-c", "-o", str(objdir / f"{f}.c.o"),
             str(tmp_path / "fs" / f"{f}.c")], check=True)
    r = run([str(IMPORT_GRAPH), "--root", str(tmp_path),
             str(tmp_path / "build")])
    assert r.returncode == 1, r
    assert "fs/a -> fs/b -> fs/a" in r.stderr, r.stderr
