"""Several disks in one mount: ``nbdferry MNT --all-exports URI`` (every
export the server lists, each a file named after it, with its views) and
``nbdferry MNT NAME=URI ...`` (named exports of any servers).

A VM's disks migrate in one mount: raw, VHD and VMDK sources at once,
``cp -r`` of a VM directory, one cp per disk in parallel.  Each disk is
checked byte for byte against its source on the server.  An error on one
disk fails that disk's copy and the unmount verdict (naming it) while
the other disks land; a name that cannot be a file name, and a server
that lists no exports, are refused before anything is mounted."""

import json
import subprocess

import pytest

from lib.digest import sha256_file
from lib.env import MiB, NBDFERRY, TOP
from lib.images import make_sparse_image, random_file
from lib.mounts import is_mounted
from lib.nbd import sha256_nbd
from lib.procs import run

DISK = 64 * MiB


def export_uri(srv, name):
    """The URI of export name on a Unix-socket nbdkit."""
    return f"nbd+unix:///{name}?socket={srv.sock}"


def disk_dir(tmp_path, names=("disk0", "disk1", "disk2")):
    d = tmp_path / "exports"
    d.mkdir()
    for n in names:
        with open(d / n, "wb") as f:
            f.truncate(DISK)
    return d


def unmount_verdict(m):
    """nbdferry --unmount: its exit status and verdict text."""
    r = run([NBDFERRY, "-P", str(m.pidfile), "--unmount", str(m.mp)],
            timeout=120)
    m.wait_exit()
    m.checked = True
    return r


def qemu_img(*args):
    r = run(["qemu-img", "convert", *map(str, args)])
    assert r.returncode == 0, r.stderr


def test_three_disks_raw_vhd_vmdk(server, mount, shm, tmp_path):
    """One nbdkit serving three exports; one mount; a raw image, a VHD
    and a streamOptimized VMDK copied in at once, each into its disk's
    file; each export then holds exactly its source."""
    d = disk_dir(tmp_path)
    srv = server("file", f"dir={d}")
    m = mount(["--all-exports", srv.uri], raw="disk0")
    names = sorted(p.name for p in m.mp.iterdir())
    for n in ("disk0", "disk1", "disk2"):
        for suffix in ("", ".vhd", ".vmdk", ".qcow2", ".vhdx"):
            assert n + suffix in names, names
    raw0 = make_sparse_image(shm / "d0.raw", 48 * MiB,
                             [(0, 3 * MiB), (20 * MiB, 5 * MiB)], seed=1).path
    raw1 = random_file(shm / "d1.raw", 16 * MiB)
    raw2 = make_sparse_image(shm / "d2.raw", 40 * MiB,
                             [(MiB, 2 * MiB), (30 * MiB, MiB)], seed=2).path
    vhd = shm / "d1.vhd"
    qemu_img("-f", "raw", "-O", "vpc", "-o",
             "subformat=dynamic,force_size=on", raw1, vhd)
    vmdk = shm / "d2.vmdk"
    qemu_img("-f", "raw", "-O", "vmdk", "-o", "subformat=streamOptimized",
             raw2, vmdk)
    copies = [subprocess.Popen(["cp", "--sparse=always", str(raw0),
                                str(m.mp / "disk0")]),
              subprocess.Popen(["cp", str(vhd), str(m.mp / "disk1.vhd")]),
              subprocess.Popen(["cp", str(vmdk), str(m.mp / "disk2.vmdk")])]
    assert [c.wait(120) for c in copies] == [0, 0, 0]
    status = json.loads((m.mp / ".nbdferry-status").read_text())
    # In the server's order (nbdkit's file plugin: the directory's).
    assert sorted(s["name"] for s in status["disks"]) == ["disk0", "disk1",
                                                           "disk2"]
    assert status["total"]["disks"] == 3
    # One memory bound for the mount: the pools share the default 64M.
    pooled = sum(s["pool_buffers"] * s["request_size"]
                 for s in status["disks"])
    assert pooled <= 64 * MiB, pooled
    assert status["total"]["bytes_written"] == sum(
        s["bytes_written"] for s in status["disks"])
    tool = run([TOP / "tools" / "status" / "nbdferry-status", m.mp])
    assert tool.returncode == 0, tool.stderr
    for n in ("disk0", "disk1", "disk2"):
        assert f"disk {n}:" in tool.stdout, tool.stdout
    assert "3 disks" in tool.stdout, tool.stdout
    r = unmount_verdict(m)
    assert r.returncode == 0, r.stdout + r.stderr
    for n in ("disk0", "disk1", "disk2"):
        assert f"{n}: ok" in r.stdout, r.stdout
    for name, src in (("disk0", raw0), ("disk1", raw1), ("disk2", raw2)):
        assert sha256_nbd(export_uri(srv, name)) == \
            sha256_file(src, pad_to=DISK), name


def test_cp_r_vm_directory_and_parallel(server, mount, shm, tmp_path):
    """cp -r --sparse=always vmdir/. MNT/ migrates every raw disk of a VM
    in one command; named exports of two servers (NAME=URI)."""
    d = disk_dir(tmp_path, ("a", "b"))
    srv = server("file", f"dir={d}")
    mem = server("memory", f"size={DISK}")
    m = mount([f"sys={export_uri(srv, 'a')}", f"data={export_uri(srv, 'b')}",
               f"swap={mem.uri}"], raw="sys")
    vm = shm / "vm"
    vm.mkdir()
    srcs = {"sys": make_sparse_image(vm / "sys", 32 * MiB,
                                     [(0, MiB), (9 * MiB, 4 * MiB)], seed=3).path,
            "data": random_file(vm / "data", 12 * MiB),
            "swap": random_file(vm / "swap", 8 * MiB)}
    r = run(["cp", "-r", "--sparse=always", f"{vm}/.", f"{m.mp}/"])
    assert r.returncode == 0, r.stderr
    r = unmount_verdict(m)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sha256_nbd(export_uri(srv, "a")) == \
        sha256_file(srcs["sys"], pad_to=DISK)
    assert sha256_nbd(export_uri(srv, "b")) == \
        sha256_file(srcs["data"], pad_to=DISK)
    assert sha256_nbd(mem.uri) == sha256_file(srcs["swap"], pad_to=DISK)


@pytest.mark.parametrize("bad", ["disk0", "disk2", "disk4"],
                         ids=["first", "middle", "last"])
def test_error_on_one_disk_fails_it_alone(server, mount, shm, tmp_path, bad):
    """Every write to one disk fails on its server: that disk's copy fails
    and so does the unmount verdict, naming it; the other disks land.
    The failing disk first, between the others and last in the mount's
    order (by name): a verdict that looked at one disk alone (the first)
    would forgive the others' failures (mutant
    later-disk-failure-forgiven)."""
    good = [n for n in ("disk1", "disk3") if n != bad]
    d = disk_dir(tmp_path, good)
    srv = server("file", f"dir={d}")
    failing = server("memory", f"size={DISK}", "error-pwrite=EIO",
                     "error-pwrite-rate=1", filters=["error"])
    m = mount([f"{good[0]}={export_uri(srv, good[0])}", f"{bad}={failing.uri}",
               f"{good[1]}={export_uri(srv, good[1])}"], "--retry-timeout",
              "0", raw=good[0], expect_rc=1, expect_errors=True)
    srcs = [random_file(shm / f"s{i}", 10 * MiB) for i in range(3)]
    copies = [subprocess.Popen(["cp", str(srcs[0]), str(m.mp / good[0])]),
              subprocess.Popen(["cp", str(srcs[1]), str(m.mp / bad)],
                               stderr=subprocess.DEVNULL),
              subprocess.Popen(["cp", str(srcs[2]), str(m.mp / good[1])])]
    rcs = [c.wait(120) for c in copies]
    assert rcs[0] == 0 and rcs[2] == 0 and rcs[1] != 0, rcs
    r = unmount_verdict(m)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"{bad}: FAILED" in r.stdout, r.stdout
    assert f"{good[0]}: ok" in r.stdout and f"{good[1]}: ok" in r.stdout, \
        r.stdout
    # The failed requests' log lines name their disk, and only it.
    failed = [l for l in m.stderr.splitlines() if "failed:" in l]
    assert failed and all(f"{bad}: " in l for l in failed), m.stderr
    assert sha256_nbd(export_uri(srv, good[0])) == \
        sha256_file(srcs[0], pad_to=DISK)
    assert sha256_nbd(export_uri(srv, good[1])) == \
        sha256_file(srcs[2], pad_to=DISK)


def refused(tmp_path, args):
    """Run a mount that must be refused before anything starts."""
    mp = tmp_path / "mnt"
    mp.mkdir(exist_ok=True)
    r = run([NBDFERRY, "-f", str(mp), *args], timeout=60)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert not is_mounted(mp)
    assert list(mp.iterdir()) == []
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    return r.stderr


@pytest.mark.parametrize("names,why", [
    (["=U"], "empty"),
    (["a/b=U"], "has a '/'"),
    ([".=U"], "cannot be a file name"),
    (["..=U"], "cannot be a file name"),
    (["x" * 251 + "=U"], "too long"),
    (["a=U", "a=U"], "clash"),
    (["a=U", "a.vhd=U"], "clash"),
    (["a\x01b=U"], "control character"),
    ([".nbdferry-status=U"], "status file"),
])
def test_bad_disk_names_refused(server, tmp_path, names, why):
    """A name that cannot be a file name, or that one disk's files share
    with another's, is one line and exit 1: nothing mounted, no server
    written."""
    srv = server("memory", f"size={MiB}", log=True)
    err = refused(tmp_path, [n.replace("=U", "=" + srv.uri) for n in names])
    assert why in err, err
    assert "Write" not in open(srv.log).read()


def test_no_exports_and_empty_name(server, tmp_path):
    """--all-exports of a server that lists nothing, or lists only the
    default export (no name to make a file of), is refused."""
    none = server("memory", f"size={MiB}", "exportname-list=explicit",
                  filters=["exportname"])
    err = refused(tmp_path, ["--all-exports", none.uri])
    assert "lists no exports" in err, err
    default = server("memory", f"size={MiB}")
    mp = tmp_path / "mnt"
    r = run([NBDFERRY, "-f", str(mp), "--all-exports", default.uri],
            timeout=60)
    assert r.returncode == 1 and not is_mounted(mp), r.stderr
    assert "export '' skipped" in r.stderr and "empty" in r.stderr, r.stderr
    assert "no export has a name that can be a file name" in r.stderr


def test_bad_export_name_skipped_the_rest_mount(server, mount, tmp_path):
    """One export whose name cannot be a file name is skipped with a
    warning naming it; the others mount and take their bytes."""
    srv = server("memory", f"size={DISK}", "exportname-list=explicit",
                 "exportname=disk0", "exportname=bad/name",
                 "exportname=disk1", filters=["exportname"])
    m = mount(["--all-exports", srv.uri], raw="disk1", expect_errors=True)
    names = sorted(p.name for p in m.mp.iterdir())
    assert "disk0" in names and "disk1" in names, names
    assert not any("bad" in n for n in names), names
    src = random_file(tmp_path / "src.img", 8 * MiB)
    assert run(["dd", f"if={src}", f"of={m.mp / 'disk1'}", "bs=1M",
                "conv=fsync,notrunc", "status=none"]).returncode == 0
    assert m.unmount() == 0
    assert "export 'bad/name' skipped" in m.stderr, m.stderr
    # One memory disk behind every name: the bytes are there.
    assert sha256_nbd(srv.uri.replace(":///", ":///disk1"),
                      8 * MiB) == sha256_file(src)


def test_writes_land_on_each_disk(server, mount, shm, tmp_path):
    """The receive loop's landings (writes read straight into a pool
    buffer) follow the disk being written: copies to one disk after
    another each land bytes, into the right pool.  How many of a copy's
    writes land depends on the pool's free buffers when each request
    arrives (a slow build or a loaded machine lands fewer), so the test
    asks for some on every disk, not a share: a loop that stayed with the
    first disk it prepared in lands none on the others."""
    d = disk_dir(tmp_path)
    srv = server("file", f"dir={d}")
    m = mount(["--all-exports", srv.uri], raw="disk0")
    srcs = {n: random_file(shm / n, 12 * MiB) for n in ("disk0", "disk1",
                                                          "disk2")}
    for n in ("disk1", "disk0", "disk2", "disk1"):
        r = run(["dd", f"if={srcs[n]}", f"of={m.mp / n}", "bs=1M",
                 "conv=notrunc", "status=none"])
        assert r.returncode == 0, r.stderr
    status = json.loads((m.mp / ".nbdferry-status").read_text())
    for s in status["disks"]:
        assert s["bytes_landed"] >= 1 * MiB, (s["name"], s["bytes_landed"])
    r = unmount_verdict(m)
    assert r.returncode == 0, r.stdout + r.stderr
    for n, src in srcs.items():
        assert sha256_nbd(export_uri(srv, n)) == \
            sha256_file(src, pad_to=DISK), n
