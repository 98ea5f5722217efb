"""The benchmark matrix as data: arms, sources, servers, latencies, presets.

Adding an arm, a source, a server or a latency is one line here; the runner
and the report iterate over whatever these lists hold.

Command templates are tuples of strings formatted with:
  {src}   the source image path        {file}  the file inside the mount
  {uri}   the NBD URI of the server    {mnt}   the mountpoint
  {verify} the nbdferry-verify binary {out}   copy-out arms: the output file
"""

from dataclasses import dataclass

MiB = 1 << 20
GiB = 1 << 30

CP = ("cp", "--sparse=always", "{src}", "{file}")
# dd opens without O_TRUNC, ftruncate()s to 0 (nbdfuse ignores that; nbdferry
# acts on it) and seeks over all-zero blocks with conv=sparse.
DD = ("dd", "if={src}", "of={file}", "bs=4M", "conv=sparse", "status=none")


@dataclass(frozen=True)
class Arm:
    name: str                  # id on the command line and in raw data
    label: str                 # what the tables and plots call it
    client: tuple              # command template run and timed
    daemon: str = ""           # "" (client talks NBD itself), "nbdferry", "nbdfuse"
    daemon_opts: tuple = ()    # extra daemon options, before MOUNTPOINT
    needs: tuple = ()          # daemon options that must appear in --help
    family: str = ""           # plot colour group
    verified: str = ""         # a verified copy: the time runs until the
                               # copy's sha256 is known and checked.
                               # "inline": nbdferry's inline digest;
                               # "stdout": the client prints it (sha256sum)
                               # "e2e": both: the client prints the
                               # source's, the inline one must be ready
    direction: str = "in"      # "in": src onto the export, delay on writes;
                               # "out": the export (holding src) into {out},
                               # delay on reads


    @property
    def mounted(self):
        return bool(self.daemon)


@dataclass(frozen=True)
class Source:
    name: str
    kind: str                  # "dense" | "sparse25" | "sparse10" | "thin" | "fsimage" | "vmdk25"
                               # | "qcow2-25" | "qcow2z-25" | "vhdx25"
    size: int

    @property
    def label(self):
        return f"{self.name}"


@dataclass(frozen=True)
class Server:
    name: str
    plugin: str                # nbdkit "memory" | "file" (backing file on
                               # tmpfs), or another server on a raw file on
                               # tmpfs: "qemu-nbd" | "nbd-server"
    transport: str             # "unix" | "tcp" (127.0.0.1)
    filters: tuple = ()        # extra (filter, (key=value, ...)) pairs
    note: str = ""
    default: bool = False      # the preset's default server: --server
                               # memory turns it into nbdkit memory


@dataclass
class Experiment:
    """A block of cells: every arm x source x server x latency."""
    name: str
    arms: list
    sources: list
    servers: list
    latencies: list            # ms per write; 0 = no delay filter
    runs: int = 3
    note: str = ""
    time_ratios: bool = False  # tables in seconds, ratios of times


    def cells(self):
        for lat in self.latencies:
            for srv in self.servers:
                for src in self.sources:
                    yield (src, srv, lat)


def dense(size):
    return Source(f"dense-{human(size)}", "dense", size)


def sparse25(size):
    return Source(f"25%-data-{human(size)}", "sparse25", size)


def sparse10(size):
    return Source(f"10%-data-{human(size)}", "sparse10", size)


def thin(size):
    """A thin disk: 1/64 of it data (16 GiB holding 256 MiB), the rest
    holes."""
    return Source(f"thin-{human(size)}-{human(size // 64)}-data", "thin", size)


def fsimage(size):
    return Source(f"ext4-image-{human(size)}", "fsimage", size)


def vmdk25(size):
    """A streamOptimized VMDK of a disk of size bytes, 25% data (the
    source path is the .vmdk; the export must end up holding the disk)."""
    return Source(f"vmdk-25%-data-{human(size)}", "vmdk25", size)


def human(n):
    if n % GiB == 0:
        return f"{n // GiB}G"
    return f"{n // MiB}M"


# ---- arms ---------------------------------------------------------------

# nbdferry arms reproducing the published XCP-ng measurements (stock,
# TCP_NODELAY, pipelined, both).  'needs' lists options the
# daemon must offer; arms whose options are missing are skipped with a note.
# Every nbdferry arm compared with nbdcopy, qemu-img or nbdfuse runs with
# --no-digest: none of those hashes what it copies.  The digest arms show
# what it costs; the defaults preset runs the daemon with no options at
# all (inline blkhash) against them.
ND = ("--no-digest",)
SHA = ("--digest=sha256",)
FERRY_CP = Arm("ferry-cp", "nbdferry + cp (--no-digest)", CP, "nbdferry",
               ND, needs=ND, family="nbdferry")
# Nothing hashed at all: no digest, and no manifest (whose block digests
# --no-digest still makes, for the next pass): the FUSE path's own cost.
FERRY_CP_NOHASH = Arm("ferry-cp-nohash", "nbdferry + cp (--no-digest "
                      "--no-manifest: hashes nothing)", CP, "nbdferry",
                      ND + ("--no-manifest",), needs=ND + ("--no-manifest",),
                      family="nbdferry")
FERRY_CP_DIGEST = Arm("ferry-cp-digest", "nbdferry + cp (inline sha256)", CP,
                      "nbdferry", SHA, needs=("--digest",), family="digest")
FERRY_CP_BLKHASH = Arm("ferry-cp-blkhash", "nbdferry + cp (inline blkhash)",
                       CP, "nbdferry", ("--blkhash",), needs=("--blkhash",),
                       family="digest")
FERRY_DD = Arm("ferry-dd", "nbdferry + dd bs=4M (--no-digest)", DD,
               "nbdferry", ND, needs=ND, family="nbdferry")
FERRY_STOCK = Arm("ferry-stock", "nbdferry stock (depth 1, write-through, "
                  "Nagle; --no-digest)", CP, "nbdferry",
                  ("--depth", "1", "--write-through", "--no-nodelay") + ND,
                  needs=("--write-through", "--no-nodelay") + ND,
                  family="stock")
FERRY_NODELAY = Arm("ferry-nodelay", "nbdferry TCP_NODELAY only (--no-digest)",
                    CP, "nbdferry", ("--depth", "1", "--write-through") + ND,
                    needs=("--write-through",) + ND, family="stock")
FERRY_PIPE = Arm("ferry-pipe", "nbdferry pipelining only (Nagle on; "
                 "--no-digest)", CP, "nbdferry", ("--no-nodelay",) + ND,
                 needs=("--no-nodelay",) + ND, family="nbdferry")
FUSE_CP = Arm("fuse-cp", "nbdfuse + cp", CP, "nbdfuse", family="nbdfuse")
FUSE_DD = Arm("fuse-dd", "nbdfuse + dd bs=4M", DD, "nbdfuse", family="nbdfuse")
NBDCOPY = Arm("nbdcopy", "nbdcopy", ("nbdcopy", "{src}", "{uri}"),
              family="nbdcopy")
# nbdcopy >= 1.24 (Debian's is 1.14 here): "{nbdcopy_new}" stands for its
# command (one word or several: a loader and its libraries), found by
# bench/bench (--nbdcopy-new PATH, or a Debian unstable root); arms that
# cannot find one are skipped with the reason.  --blkhash (sha256 of 64
# KiB blocks, the mount's default digest) prints the copy's blkhash, which
# must equal the source's.
NBDCOPY_NEW_CMD = "{nbdcopy_new}"
NBDCOPY_NEW = Arm("nbdcopy-new", "nbdcopy 1.24+", (NBDCOPY_NEW_CMD, "{src}",
                                                  "{uri}"), family="nbdcopy")
NBDCOPY_NEW_BLKHASH = Arm("nbdcopy-new-blkhash", "nbdcopy 1.24+ --blkhash",
                          (NBDCOPY_NEW_CMD, "--blkhash", "{src}", "{uri}"),
                          family="verify", verified="stdout-blkhash")
NBDCOPY_ARMS = [NBDCOPY, NBDCOPY_NEW, NBDCOPY_NEW_BLKHASH]
NBDCOPY_SYNC = Arm("nbdcopy-sync", "nbdcopy --synchronous",
                   ("nbdcopy", "--synchronous", "{src}", "{uri}"),
                   family="nbdcopy")
QEMU = Arm("qemu-img", "qemu-img convert -n",
           ("qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", "{src}",
            "{uri}"), family="qemu")
QEMU_W = Arm("qemu-img-W", "qemu-img convert -n -W",
             ("qemu-img", "convert", "-n", "-W", "-f", "raw", "-O", "raw",
              "{src}", "{uri}"), family="qemu")

# Verified copies: what a user who wants proof that the bytes landed pays,
# the copy plus a sha256 of the destination.  nbdferry's inline digest is
# ready shortly after cp exits; the others read the export back.
VERIFIED_FERRY = Arm("verified-ferry", "nbdferry + cp, inline sha256 "
                     "(until ready)", CP, "nbdferry", SHA,
                     needs=("--digest",), family="digest", verified="inline")
VERIFIED_SUM = Arm("verified-nbdcopy-sum", "nbdcopy, then nbdcopy URI - into "
                   "sha256sum", ("sh", "-c", 'nbdcopy "$1" "$2" && '
                                 'nbdcopy "$2" - | sha256sum', "sh", "{src}",
                                 "{uri}"), family="nbdcopy", verified="stdout")
VERIFIED_VERIFY = Arm("verified-nbdcopy-verify", "nbdcopy, then "
                      "nbdferry-verify URI",
                      ("sh", "-c", 'nbdcopy "$1" "$2" && '
                       '"$3" --digest=sha256 "$2"', "sh",
                       "{src}", "{uri}", "{verify}"), family="verify",
                      verified="stdout")
# --verify-readback: cp's close returns once the disk was read back from
# the server and matched the inline digest (hole-aware, pipelined).
RB = ("--verify-readback",)
VERIFIED_FERRY_RB = Arm("verified-ferry-readback", "nbdferry + cp, inline "
                        "sha256 + --verify-readback", CP, "nbdferry",
                        RB + SHA, needs=RB + ("--digest",), family="digest",
                        verified="inline")
VERIFIED_FERRY_RB_BLK = Arm("verified-ferry-readback-blkhash", "nbdferry + "
                            "cp, inline blkhash + --verify-readback", CP,
                            "nbdferry", RB + ("--blkhash",),
                            needs=RB + ("--blkhash",), family="digest",
                            verified="inline")
# nbdcopy >= 1.24 --blkhash: the copy and its digest in one pass (of what
# it read from the source), printed when it ends.
VERIFIED_ARMS = [VERIFIED_FERRY, VERIFIED_FERRY_RB, VERIFIED_FERRY_RB_BLK,
                 VERIFIED_SUM, VERIFIED_VERIFY, NBDCOPY_NEW_BLKHASH]

# blkhash (the block-based digest of blksum and nbdcopy --blkhash) against
# sha256, inline in the mount and on the source side.  "Until ready" arms
# stop the clock when the inline digest is complete; the end-to-end arms
# also hash the source with nbdferry-verify while cp runs, the way a
# verified migration is done (the printed digest and the inline one must
# both equal the source's).
BH = ("--blkhash",)
VERIFIED_FERRY_BLKHASH = Arm("verified-ferry-blkhash", "nbdferry + cp, inline "
                             "blkhash (until ready)", CP, "nbdferry", BH,
                             needs=BH, family="digest", verified="inline")
E2E = ("sh", "-c", '"$3" $4 "$1" & v=$!; cp --sparse=always "$1" "$2" && '
       'wait $v', "sh", "{src}", "{file}", "{verify}")
E2E_SHA256 = Arm("e2e-sha256", "nbdferry-verify SRC while cp, inline sha256 "
                 "(until both ready)", E2E + ("--digest=sha256",),
                 "nbdferry", SHA, needs=("--digest",), family="verify",
                 verified="e2e")
E2E_BLKHASH = Arm("e2e-blkhash", "nbdferry-verify --blkhash SRC while cp, "
                  "inline blkhash (until both ready)", E2E + ("--blkhash",),
                  "nbdferry", BH, needs=BH, family="verify", verified="e2e")
BLKHASH_ARMS = [FERRY_CP, FERRY_CP_DIGEST, FERRY_CP_BLKHASH, VERIFIED_FERRY,
                VERIFIED_FERRY_BLKHASH, E2E_SHA256, E2E_BLKHASH,
                NBDCOPY_NEW_BLKHASH]

# VMDK ingest: the VMDK file copied into the mount's nbd.vmdk view against
# qemu-img decoding the same file into the export over NBD.
FERRY_VMDK = Arm("ferry-vmdk", "nbdferry + cp x.vmdk MNT/nbd.vmdk "
                 "(--no-digest)", ("cp", "{src}", "{mnt}/nbd.vmdk"),
                 "nbdferry", ND, needs=ND, family="nbdferry")
QEMU_VMDK = Arm("qemu-img-vmdk", "qemu-img convert -n -f vmdk -O raw",
                ("qemu-img", "convert", "-n", "-f", "vmdk", "-O", "raw",
                 "{src}", "{uri}"), family="qemu")

# Copying the disk out: the export holds the source, the client writes it
# to a file on tmpfs; the delay filter delays reads.
OUT = "{out}"
COPYOUT_FERRY = Arm("out-ferry-cp", "nbdferry + cp (read-ahead; --no-digest)",
                    ("cp", "{file}", OUT), "nbdferry", ND, needs=ND,
                    family="nbdferry", direction="out")
COPYOUT_FERRY_NORA = Arm("out-ferry-cp-nora", "nbdferry + cp, --readahead 0",
                         ("cp", "{file}", OUT), "nbdferry",
                         ("--readahead", "0") + ND,
                         needs=("--readahead",) + ND, family="stock",
                         direction="out")
COPYOUT_FERRY_VHD = Arm("out-ferry-vhd", "nbdferry + cp nbd.vhd "
                        "(VHD export; --no-digest)", ("cp", "{mnt}/nbd.vhd",
                                                      OUT),
                        "nbdferry", ND, needs=ND, family="digest",
                        direction="out")
COPYOUT_NBDCOPY = Arm("out-nbdcopy", "nbdcopy URI out.img",
                      ("nbdcopy", "{uri}", OUT), family="nbdcopy",
                      direction="out")
COPYOUT_NBDCOPY_NEW = Arm("out-nbdcopy-new", "nbdcopy 1.24+ URI out.img",
                          (NBDCOPY_NEW_CMD, "{uri}", OUT), family="nbdcopy",
                          direction="out")
COPYOUT_NBDCOPY_NEW_BLKHASH = Arm("out-nbdcopy-new-blkhash", "nbdcopy 1.24+ "
                                  "--blkhash URI out.img",
                                  (NBDCOPY_NEW_CMD, "--blkhash", "{uri}",
                                   OUT), family="verify", direction="out",
                                  verified="stdout-blkhash")
COPYOUT_NBDCOPY_ARMS = [COPYOUT_NBDCOPY, COPYOUT_NBDCOPY_NEW,
                        COPYOUT_NBDCOPY_NEW_BLKHASH]
COPYOUT_QEMU = Arm("out-qemu-img", "qemu-img convert URI out.img",
                   ("qemu-img", "convert", "-f", "raw", "-O", "raw", "{uri}",
                    OUT), family="qemu", direction="out")
COPYOUT_FUSE = Arm("out-fuse-cp", "nbdfuse + cp", ("cp", "{file}", OUT),
                   "nbdfuse", family="nbdfuse", direction="out")
COPYOUT_ARMS = [COPYOUT_FERRY, COPYOUT_FERRY_NORA, *COPYOUT_NBDCOPY_ARMS,
                COPYOUT_QEMU, COPYOUT_FUSE, COPYOUT_FERRY_VHD]

# The daemon with no options at all (inline blkhash on, read-ahead on),
# timed until its digest is complete: what a new user runs.
FERRY_DEFAULTS = Arm("ferry-defaults", "nbdferry + cp (no options; until "
                     "the inline blkhash is ready)", CP, "nbdferry",
                     family="nbdferry", verified="inline")
COPYOUT_DEFAULTS = Arm("out-ferry-defaults", "nbdferry + cp (no options)",
                       ("cp", "{file}", OUT), "nbdferry", family="nbdferry",
                       direction="out")
# The copy-out arm: cp --sparse=always out of a mount with no
# options (holes in the export stay holes in the output).
COPYOUT_DEFAULTS_SPARSE = Arm("out-ferry-defaults-sparse", "nbdferry + cp "
                              "--sparse=always (no options)",
                              ("cp", "--sparse=always", "{file}", OUT),
                              "nbdferry", family="nbdferry", direction="out")
DEFAULTS_IN_ARMS = [FERRY_DEFAULTS, FERRY_CP, *NBDCOPY_ARMS, QEMU_W]
DEFAULTS_OUT_ARMS = [COPYOUT_DEFAULTS, *COPYOUT_NBDCOPY_ARMS, COPYOUT_QEMU]
HEADLINE_IN_ARMS = [FERRY_DEFAULTS, FERRY_CP, FERRY_CP_NOHASH,
                    *NBDCOPY_ARMS]
HEADLINE_OUT_ARMS = [COPYOUT_DEFAULTS_SPARSE, *COPYOUT_NBDCOPY_ARMS]

# Every arm of the latency sweep (full preset); ALL_ARMS adds those only
# the blkhash and defaults presets run.
# (nbdcopy 1.24+ --blkhash is both a plain nbdcopy arm and a verified copy:
# once.)
SWEEP_ARMS = list(dict.fromkeys([
    FERRY_CP, FERRY_CP_DIGEST, FERRY_CP_BLKHASH, FERRY_DD, FERRY_STOCK,
    FERRY_NODELAY, FERRY_PIPE, FUSE_CP, FUSE_DD, *NBDCOPY_ARMS, NBDCOPY_SYNC,
    QEMU, QEMU_W, *VERIFIED_ARMS, FERRY_VMDK, QEMU_VMDK, *COPYOUT_ARMS]))
ALL_ARMS = SWEEP_ARMS + [VERIFIED_FERRY_BLKHASH, E2E_SHA256, E2E_BLKHASH,
                         FERRY_DEFAULTS, COPYOUT_DEFAULTS,
                         COPYOUT_DEFAULTS_SPARSE]
FIRST_ARMS = [FERRY_CP, FERRY_CP_DIGEST, FUSE_CP, *NBDCOPY_ARMS]
# The sparse case: a sparse image onto an export that reads as zero.  nbdfuse
# is left out: cp --sparse=always fails on it (no ftruncate).
SPARSE_ARMS = [FERRY_CP, FERRY_CP_DIGEST, FERRY_CP_BLKHASH, *NBDCOPY_ARMS,
               QEMU_W, QEMU]



def ferry_tuned(depth=None, rsize=None, pool=None, conns=None):
    """nbdferry + cp --no-digest with some defaults overridden (the tuning
    preset)."""
    opts, bits = [], []
    for flag, v in (("--depth", depth), ("--request-size", rsize),
                    ("--pool-size", pool), ("--connections", conns)):
        if v is not None:
            opts += [flag, str(v)]
            bits.append(f"{flag.lstrip('-')} {v}")
    name = "ferry-" + "-".join(b.replace(" ", "") for b in bits)
    return Arm(name, "nbdferry " + ", ".join(bits) + " (--no-digest)", CP,
               "nbdferry", tuple(opts) + ND, needs=tuple(opts[::2]) + ND,
               family="nbdferry")


# ---- servers ------------------------------------------------------------

MEM_UNIX = Server("memory/unix", "memory", "unix")
MEM_TCP = Server("memory/tcp", "memory", "tcp")
FILE_UNIX = Server("file-on-tmpfs/unix", "file", "unix")
FILE_TCP = Server("file-on-tmpfs/tcp", "file", "tcp")
# The server of every preset's cells unless a cell is about servers: nbdkit
# file on a sparse file on tmpfs (/dev/shm), whose own cost is small and
# measured (the report's "server's own cost": nbdcopy into it twice).
# bench/bench --server memory swaps these two for nbdkit memory.
SRV_UNIX = Server("file-on-tmpfs/unix", "file", "unix", default=True)
SRV_TCP = Server("file-on-tmpfs/tcp", "file", "tcp", default=True)
# nbdkit-rate-filter counts bits per second; 10G is a 10GbE-like cap.
MEM_TCP_10G = Server("memory/tcp rate=10G", "memory", "tcp",
                     filters=(("rate", ("rate=10G",)),),
                     note="nbdkit rate filter at 10 Gbit/s")

# The servers Debian ships besides nbdkit (docs/servers.md): over TCP,
# like nbd-server, which has no Unix socket.
QEMU_NBD_TCP = Server("qemu-nbd-raw/tcp", "qemu-nbd", "tcp",
                      note="qemu-nbd --shared=8 --cache=writeback, raw file "
                           "on tmpfs")
NBD_SERVER_TCP = Server("nbd-server/tcp", "nbd-server", "tcp",
                        note="nbd-server 3.24, flush = true, file on tmpfs; "
                             "no block status, no block sizes")

ALL_SERVERS = [MEM_UNIX, MEM_TCP, FILE_UNIX, FILE_TCP, MEM_TCP_10G,
               QEMU_NBD_TCP, NBD_SERVER_TCP]
# Binaries a server needs besides nbdkit's.
SERVER_BINARIES = {"qemu-nbd": "qemu-nbd", "nbd-server": "nbd-server"}

# ---- presets ------------------------------------------------------------


def preset(name, size=None, runs=None, server="file"):
    """The experiments of a named preset; size/runs override the defaults;
    server "memory" runs the default server's cells on nbdkit memory."""
    if name == "quick":
        s = size or 128 * MiB
        exps = [Experiment("headline", FIRST_ARMS, [dense(s)], [SRV_UNIX],
                           [0, 2], runs=1),
                verified_experiment(s, runs=1),
                sparse_experiment(size or 256 * MiB, [0], runs=1),
                every_server_experiment(s, runs=1)]
    elif name == "servers":
        exps = [every_server_experiment(size or 512 * MiB)]
    elif name == "first":
        s = size or GiB
        exps = [Experiment("headline", FIRST_ARMS, [dense(s)], [SRV_UNIX],
                           [0, 2]),
                verified_experiment(s)]
    elif name == "full":
        exps = full_preset(size)
    elif name == "tuning":
        exps = tuning_preset(size)
    elif name == "sparse":
        exps = [sparse_experiment(size or 4 * GiB, [0, 2])]
    elif name == "vmdk":
        exps = [vmdk_experiment(size or GiB)]
    elif name == "vhdx":
        exps = vhdx_preset(size or GiB)
    elif name == "copyout":
        exps = [copyout_experiment(size or 512 * MiB, [0, 0.2, 2, 10])]
    elif name == "blkhash":
        exps = [blkhash_experiment(size or GiB)]
    elif name == "defaults":
        exps = defaults_preset(size)
    elif name == "qcow2":
        exps = qcow2_preset(size)
    elif name == "headline":
        exps = headline_preset(size)
    else:
        raise ValueError(f"unknown preset {name!r}")
    if runs:
        for e in exps:
            e.runs = runs
    if server != "file":
        exps = with_server(exps, server)
    return exps


def with_server(exps, plugin):
    """The experiments with each preset's default server (nbdkit file on
    tmpfs) replaced by nbdkit 'plugin' (memory) on the same transport;
    servers that are the point of a cell (every server, rate filter) stay."""
    for e in exps:
        e.servers = [Server(f"{plugin}/{s.transport}", plugin, s.transport,
                            s.filters, s.note, default=True)
                     if s.default else s for s in e.servers]
    return exps


def headline_preset(size=None, runs=5):
    """The cells of docs/benchmarks.md's headline: the daemon with no
    options and with --no-digest against nbdcopy (Debian's, and >= 1.24
    with and without --blkhash) writing 1 GiB dense, 1 GiB with 25% data,
    16 GiB holding 256 MiB, 1 GiB dense at 2 ms per write; and copying
    1 GiB with 25% data out at 2 and 10 ms per read.  5 interleaved
    rounds; with --size S, S and 16 x S holding S / 4."""
    s = size or GiB
    big = 16 * s
    note = ("Writing in: nbdferry with no options is timed until its "
            "inline blkhash is complete (and equals nbdferry-verify "
            "SOURCE); nbdcopy --blkhash prints the copy's blkhash "
            "(sha256/64k, the same digest), which must equal it too; "
            "--no-digest still hashes each block for the manifest (the "
            "next pass's record), --no-digest --no-manifest and plain "
            "nbdcopy hash nothing.  Copying out: "
            "the export holds the image (written by nbdcopy, untimed); "
            "`cp --sparse=always MNT/nbd out` from a fresh mount with no "
            "options against `nbdcopy URI out`, onto tmpfs.  The server is "
            "nbdkit file on a sparse file on tmpfs (its own cost: the "
            "table 'server's own cost').  Runs are interleaved round by "
            "round; compare the medians of the per-round ratios (in "
            "brackets).")
    return [
        Experiment("headline: writing in", HEADLINE_IN_ARMS,
                   [dense(s), sparse25(s), thin(big)], [SRV_UNIX], [0],
                   runs=runs, note=note),
        Experiment("headline: writing in at 2 ms", HEADLINE_IN_ARMS,
                   [dense(s)], [SRV_UNIX], [2], runs=runs, note=note),
        Experiment("headline: copying out", HEADLINE_OUT_ARMS,
                   [sparse25(s)], [SRV_UNIX], [2, 10], runs=runs, note=note),
    ]


def full_preset(size=None):
    s = size or GiB
    sweep = size or 512 * MiB
    return [
        # The headline cells, 1 GiB over a Unix socket.
        Experiment("headline", FIRST_ARMS, [dense(s)], [SRV_UNIX], [0, 2]),
        verified_experiment(s),
        # Every arm across latencies over TCP.  512 MiB keeps the
        # serial arms (one request in flight) under ~50 s a run at 10 ms.
        Experiment("latency sweep", SWEEP_ARMS, [dense(sweep)], [SRV_TCP],
                   [0, 0.2, 2, 10],
                   note="throughput is size-independent once requests "
                        "stream; the serial arms would take minutes at 1 GiB"),
        # Other sources at 2 ms.  nbdfuse is fed by dd here: cp
        # --sparse=always ends an image that ends in a hole with ftruncate(),
        # which nbdfuse does not implement (cp fails with ENOSYS).
        Experiment("sources", [FERRY_CP, FUSE_DD, *NBDCOPY_ARMS, QEMU_W],
                   [sparse25(s), fsimage(s)], [SRV_TCP], [2],
                   note="nbdfuse is fed by dd conv=sparse: cp --sparse=always "
                        "fails on nbdfuse when the image ends in a hole "
                        "(ftruncate: Function not implemented)."),
        # Other servers at the published 0.2 ms.
        Experiment("servers", [FERRY_CP, *NBDCOPY_ARMS],
                   [dense(s)], [FILE_UNIX, FILE_TCP, MEM_TCP_10G], [0.2]),
        # The sparse case.
        sparse_experiment(4 * GiB if size is None else 4 * size, [0, 2]),
        every_server_experiment(size or 512 * MiB),
        copyout_experiment(size or 512 * MiB, [0, 0.2, 2, 10]),
    ]


def defaults_preset(size=None, runs=5):
    """The daemon with no options at all against nbdcopy and qemu-img in
    every cell: dense, 25% data and a thin disk (16 GiB holding 256 MiB);
    writing in and copying out; 0, 2 and 10 ms.  With --size S the dense
    and 25% images are S and the thin one 16 x S holding S / 4."""
    s = size or GiB
    big = 16 * s if size else 16 * GiB
    sources = [dense(s), sparse25(s), thin(big)]
    lats = [0, 2, 10]
    note = ("nbdferry runs with no options (inline blkhash, read-ahead "
            "and every other default), against nbdcopy and qemu-img with "
            "theirs.  Writing in, nbdferry's time runs until its inline "
            "digest is complete (and equals nbdferry-verify SOURCE); the "
            "others stop when the copy exits.  Copying out, the export "
            "holds the image and each writes it to a file on tmpfs from a "
            "fresh mount.  The latency is a delay on every write (in) or "
            "read (out).  Runs are interleaved round by round; compare the "
            "medians of the per-round ratios.")
    return [Experiment("defaults: writing in", DEFAULTS_IN_ARMS, sources,
                       [SRV_UNIX], lats, runs=runs, note=note),
            Experiment("defaults: copying out", DEFAULTS_OUT_ARMS, sources,
                       [SRV_UNIX], lats, runs=runs, note=note)]


def copyout_experiment(size, latencies, runs=3):
    """Copying the disk out of the export into a file on tmpfs, with a delay
    on every read."""
    return Experiment(
        "copy out", COPYOUT_ARMS, [dense(size), sparse25(size)], [SRV_UNIX],
        latencies, runs=runs,
        note="The export holds the image, written into it by nbdcopy before "
             "the clock starts: dense, or 25% data with holes the server "
             "reports through block status (nbdferry serves them as zeros "
             "without reading, nbdcopy and qemu-img skip them, nbdfuse "
             "reads them); each client writes it to a "
             "file on tmpfs and the file's sha256 must be the source's.  "
             "The latency is a delay on every read (nbdkit delay filter "
             "rdelay; sub-millisecond delays: the bench's usdelay filter's "
             "rdelay).  nbdferry reads ahead of cp (8 x 2 MiB in flight per "
             "reader); --readahead 0 shows one NBD read per 1 MiB FUSE "
             "read.  The VHD row copies MNT/nbd.vhd, whose size is the "
             "disk's plus the VHD metadata.")


def every_server_experiment(size, runs=3):
    """Each NBD server Debian ships, side by side, over TCP with no added
    delay: nbdferry + cp, nbdcopy and qemu-img convert -W."""
    return Experiment(
        "every server", [FERRY_CP, *NBDCOPY_ARMS, QEMU_W], [dense(size)],
        [FILE_TCP, QEMU_NBD_TCP, NBD_SERVER_TCP], [0], runs=runs,
        note="The same dense image onto a fresh raw file on tmpfs served "
             "by nbdkit (file plugin), qemu-nbd and nbd-server 3.24, all "
             "over TCP on 127.0.0.1 (nbd-server has no Unix socket).  "
             "nbd-server offers no block status and no block sizes: "
             "nbdferry keeps every request at or under 32 MiB there.  "
             "Request counts come from nbdkit's stats filter, so only the "
             "nbdkit rows have them.")


def verified_experiment(size, runs=3):
    return Experiment(
        "verified copy", VERIFIED_ARMS, [dense(size)], [SRV_UNIX], [0],
        runs=runs,
        note="Copy, then know the destination's sha256: MiB/s = image size "
             "/ time from starting the copy until the digest is known and "
             "equals the source's (a run whose digest differs fails).  "
             "nbdferry: cp exits, then its inline sha256 is read from the "
             "status file once complete.  nbdcopy: the export is read back "
             "and hashed, by `nbdcopy URI - | sha256sum` or by "
             "nbdferry-verify (pipelined, hole-aware).  The source's own "
             "sha256 is not timed in any arm.")


def sparse_experiment(size, latencies, runs=3):
    """The sparse case: an image with 10% data in scattered 2 MiB runs onto an
    export of the same size that reads as zero."""
    return Experiment(
        "sparse", SPARSE_ARMS, [sparse10(size)], [SRV_UNIX], latencies,
        runs=runs, time_ratios=True,
        note="The source holds 10% data in 2 MiB runs at "
             "random places, the rest holes; the export is fresh and "
             "reads as zero (a sparse file on tmpfs).  cp is `cp --sparse=always`; "
             "nbdcopy and qemu-img read the source's holes with SEEK_DATA "
             "and send them as zero requests.  Times in seconds (lower is "
             "better); target: nbdferry + cp takes at most 1.25x "
             "the time of nbdcopy.  The NBD request columns show what the "
             "holes cost on the wire: written MiB should be the data alone.")


def blkhash_experiment(size, runs=3):
    """Inline and source-side blkhash beside sha256 and --no-digest, on a
    dense and a 25%-sparse image."""
    return Experiment(
        "blkhash", BLKHASH_ARMS, [dense(size), sparse25(size)], [SRV_UNIX],
        [0], runs=runs,
        note="Every arm copies the image with `cp --sparse=always` through "
             "a fresh mount.  --no-digest hashes nothing; 'inline sha256' and "
             "'inline blkhash' (`--blkhash`, sha256 of 64 KiB blocks) hash "
             "in the daemon as the writes pass, timed to cp's exit; 'until "
             "ready' arms stop the clock when the status shows the digest "
             "complete (it must equal the source's).  The end-to-end arms "
             "also run `nbdferry-verify [--blkhash] SRC` beside cp and stop "
             "when both digests are known; both must equal the source's.  "
             "The blkhash the runs are checked against is computed before "
             "the clock starts.  MiB/s = image size / time.")


def vmdk_experiment(size, runs=3):
    """Ingesting a streamOptimized VMDK (what an OVA holds)."""
    return Experiment(
        "vmdk", [FERRY_VMDK, QEMU_VMDK], [vmdk25(size)], [SRV_UNIX], [0],
        runs=runs, time_ratios=True,
        note="The source is a streamOptimized VMDK made by qemu-img from a "
             "disk with 25% data in 1 MiB extents at random places (half "
             "text-like, half random bytes, so deflate gets about 1.3:1), the "
             "rest zero.  nbdferry: `cp x.vmdk MNT/nbd.vmdk` (decoded in the "
             "daemon, grains inflated with libdeflate); qemu-img: `convert -n "
             "-f vmdk -O raw x.vmdk URI`.  Both must leave the export holding "
             "the disk (sha256 of the whole export).  Times in seconds (lower "
             "is better); the target is nbdferry at most 1.0x qemu-img.")


# ---- qcow2: the nbd.qcow2 view against qemu-img -------------------------

def qcow2_25(size):
    """A qcow2 (qemu-img convert, defaults) of a disk of size bytes with
    25% data (the source path is the .qcow2; the export must end up
    holding the disk, the .raw beside it)."""
    return Source(f"qcow2-25%-data-{human(size)}", "qcow2-25", size)


def qcow2z_25(size):
    """The same disk, its clusters compressed with zlib (convert -c)."""
    return Source(f"qcow2-zlib-25%-data-{human(size)}", "qcow2z-25", size)


# Ingest: the qcow2 copied into nbd.qcow2 by a daemon with no options (the
# default a user gets: inline blkhash, compressed clusters decoded on
# worker threads) against qemu-img decoding the same file into the export
# over NBD.  Copy out: cp of nbd.qcow2 (the qcow2 synthesized in one pass)
# against qemu-img writing a qcow2 of the export.
FERRY_QCOW2 = Arm("ferry-qcow2", "nbdferry + cp x.qcow2 MNT/nbd.qcow2 "
                  "(no options)", ("cp", "{src}", "{mnt}/nbd.qcow2"),
                  "nbdferry", family="nbdferry")
QEMU_QCOW2 = Arm("qemu-img-qcow2", "qemu-img convert -n -f qcow2 -O raw",
                 ("qemu-img", "convert", "-n", "-f", "qcow2", "-O", "raw",
                  "{src}", "{uri}"), family="qemu")
COPYOUT_FERRY_QCOW2 = Arm("out-ferry-qcow2", "nbdferry + cp MNT/nbd.qcow2 "
                          "out.qcow2 (no options)",
                          ("cp", "{mnt}/nbd.qcow2", OUT), "nbdferry",
                          family="nbdferry", direction="out")
COPYOUT_QEMU_QCOW2 = Arm("out-qemu-img-qcow2", "qemu-img convert -f raw -O "
                         "qcow2 URI out.qcow2",
                         ("qemu-img", "convert", "-f", "raw", "-O", "qcow2",
                          "{uri}", OUT), family="qemu", direction="out")
QCOW2_ARMS = [FERRY_QCOW2, QEMU_QCOW2, COPYOUT_FERRY_QCOW2,
              COPYOUT_QEMU_QCOW2]
ALL_ARMS += QCOW2_ARMS


def qcow2_preset(size=None, runs=3):
    """Landing a qcow2 (plain and zlib-compressed) and copying the disk out
    as a qcow2, nbdferry against qemu-img, 1 GiB with 25% data."""
    s = size or GiB
    return [
        Experiment(
            "qcow2: writing in", [FERRY_QCOW2, QEMU_QCOW2],
            [qcow2_25(s), qcow2z_25(s)], [SRV_UNIX], [0], runs=runs,
            time_ratios=True,
            note="The source is a qcow2 made by qemu-img convert (64 KiB "
                 "clusters) from a disk with 25% data in 1 MiB extents at "
                 "random places (half text-like, half random bytes), the "
                 "rest zero; the zlib row is the same disk converted with "
                 "-c.  nbdferry runs with no options: `cp x.qcow2 "
                 "MNT/nbd.qcow2` (decoded in the daemon, compressed clusters "
                 "inflated on worker threads); qemu-img: `convert -n -f "
                 "qcow2 -O raw x.qcow2 URI`.  Both must leave the export "
                 "holding the disk (sha256 of the whole export).  Times in "
                 "seconds (lower is better); the target is nbdferry at most "
                 "1.0x qemu-img (median of the per-round ratios)."),
        Experiment(
            "qcow2: copying out", [COPYOUT_FERRY_QCOW2, COPYOUT_QEMU_QCOW2],
            [sparse25(s)], [SRV_UNIX], [0], runs=runs, time_ratios=True,
            note="The export holds a disk with 25% data (written by nbdcopy "
                 "before the clock starts, holes reported by block "
                 "status).  nbdferry: `cp MNT/nbd.qcow2 out.qcow2` from a "
                 "fresh mount with no options; qemu-img: `convert -f raw "
                 "-O qcow2 URI out.qcow2`; both onto tmpfs.  Each output is "
                 "converted back to raw by qemu-img and its sha256 must be "
                 "the source's.  Times in seconds (lower is better); the "
                 "target is nbdferry at most 1.0x qemu-img."),
    ]


def tuning_preset(size=None):
    """Tuning: nbdferry's depth, request size, pool size and
    connections, one at a time around the defaults, over TCP.  The pool is
    raised to 256M where it would otherwise cap depth x request size."""
    s = size or 512 * MiB
    big = "256M"
    arms = ([ferry_tuned(depth=d, pool=big) for d in (1, 2, 4, 8, 16, 32)] +
            [ferry_tuned(rsize=r, pool=big) for r in ("256K", "1M", "8M")] +
            [ferry_tuned(pool=p) for p in ("16M", "64M")] +
            [ferry_tuned(conns=c, pool=big) for c in (1, 2)] +
            NBDCOPY_ARMS)
    return [Experiment("tuning", arms, [dense(s)], [SRV_TCP], [0.2, 2, 10],
                       note="defaults: depth 8 per connection, request size "
                            "2M, pool 64M, 4 connections (nbdkit file and memory "
                            "offer multi-conn); each arm changes one of "
                            "them (with a 256M pool unless the pool is what "
                            "varies).")]


# ---- VHDX: ingest and export ----------------------------------------------
# A dynamic VHDX (qemu-img) of a 25%-data disk: cp into MNT/nbd.vhdx against
# qemu-img decoding it into the export over NBD, and the export read out as
# a VHDX against qemu-img writing one from the URI.  The nbdferry arms run
# the daemon with its defaults (inline blkhash, read-ahead).

def vhdx25(size):
    """A dynamic VHDX of a disk of size bytes, 25% data (the source path is
    the .vhdx, the disk is beside it as .raw; the export must end up
    holding the disk, and a copy-out's file must convert back to it)."""
    return Source(f"vhdx-25%-data-{human(size)}", "vhdx25", size)


FERRY_VHDX = Arm("ferry-vhdx", "nbdferry + cp x.vhdx MNT/nbd.vhdx "
                 "(defaults)", ("cp", "{src}", "{mnt}/nbd.vhdx"), "nbdferry",
                 family="nbdferry")
QEMU_VHDX = Arm("qemu-img-vhdx", "qemu-img convert -n -f vhdx -O raw",
                ("qemu-img", "convert", "-n", "-f", "vhdx", "-O", "raw",
                 "{src}", "{uri}"), family="qemu")
COPYOUT_FERRY_VHDX = Arm("out-ferry-vhdx", "nbdferry + cp MNT/nbd.vhdx "
                         "out.vhdx (defaults)", ("cp", "{mnt}/nbd.vhdx", OUT),
                         "nbdferry", family="nbdferry", direction="out")
COPYOUT_QEMU_VHDX = Arm("out-qemu-img-vhdx", "qemu-img convert -f raw -O "
                        "vhdx URI out.vhdx", ("qemu-img", "convert", "-f",
                                              "raw", "-O", "vhdx", "{uri}",
                                              OUT),
                        family="qemu", direction="out")
VHDX_ARMS = [FERRY_VHDX, QEMU_VHDX, COPYOUT_FERRY_VHDX, COPYOUT_QEMU_VHDX]
ALL_ARMS = ALL_ARMS + VHDX_ARMS


def vhdx_preset(size, runs=3):
    src = [vhdx25(size)]
    return [
        Experiment(
            "vhdx", [FERRY_VHDX, QEMU_VHDX], src, [SRV_UNIX], [0], runs=runs,
            time_ratios=True,
            note="The source is a dynamic VHDX made by qemu-img from a disk "
                 "with 25% data in 1 MiB extents at random places, the rest "
                 "zero.  nbdferry: `cp x.vhdx MNT/nbd.vhdx` (decoded in the "
                 "daemon; no options, so the inline blkhash is on); "
                 "qemu-img: `convert -n -f vhdx -O raw x.vhdx URI`.  Both "
                 "must leave the export holding the disk (sha256 of the "
                 "whole export).  Times in seconds (lower is better); the "
                 "target is nbdferry at most 1.0x qemu-img."),
        Experiment(
            "vhdx copy-out", [COPYOUT_FERRY_VHDX, COPYOUT_QEMU_VHDX], src,
            [SRV_UNIX], [0], runs=runs, time_ratios=True,
            note="The export holds the disk; nbdferry: `cp MNT/nbd.vhdx "
                 "out.vhdx` (a dynamic VHDX synthesized from the disk's "
                 "allocation); qemu-img: `convert -f raw -O vhdx URI "
                 "out.vhdx`.  Each out.vhdx is converted back to raw by "
                 "qemu-img and must equal the disk.  Times in seconds; the "
                 "target is nbdferry at most 1.0x qemu-img."),
    ]
