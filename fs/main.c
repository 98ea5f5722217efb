/* fs/main.c: nbdferry — mount an NBD export as a file.
 *
 * Command line (nbdfuse's, plus our own options):
 *   nbdferry [OPTIONS] MOUNTPOINT[/FILENAME] URI
 *   nbdferry [OPTIONS] MOUNTPOINT[/FILENAME] [ CMD ARGS ]
 *   nbdferry [OPTIONS] MOUNTPOINT[/FILENAME] --command CMD ARGS
 *   nbdferry [OPTIONS] MOUNTPOINT[/FILENAME] --unix SOCKET
 *   nbdferry [OPTIONS] MOUNTPOINT[/FILENAME] --tcp HOST PORT
 *   nbdferry [OPTIONS] MOUNTPOINT[/FILENAME] --fd N
 *   nbdferry [OPTIONS] MOUNTPOINT[/FILENAME] --vsock CID PORT
 *   nbdferry [OPTIONS] FILE ...            (file mode: the disk over FILE)
 *
 * The mountpoint is checked and resolved while parsing, before anything
 * forks, connects or mounts (fs/cli.c).
 * Start-up order: parse, fork (unless -f; before any thread exists), connect,
 * create the pool, mount, write the pidfile, tell the waiting parent.  Any
 * failure before that point prints one line and exits non-zero with
 * nothing mounted.  At the end: unmount, drain, NBD flush, disconnect.
 */
#include "fs/fs.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/blkhash.h"
#include "common/log.h"
#include "common/monotime.h"
#include "common/optlist.h"
#include "fs/cli.h"
#include "fs/mountlock.h"
#include "fs/digest.h"
#include "fs/fuseloop.h"
#include "fs/readback.h"
#include "fs/pidfile.h"
#include "fs/stopsig.h"
#include "fs/progress.h"
#include "fs/rawfile.h"
#include "fs/spool.h"
#include "transport/readahead.h"
#include "fs/listexports.h"
#include "fs/verdict.h"
#include "fs/view.h"
#include "qcow2/qcow2.h"
#include "transport/tcpinfo.h"
#include "config.h"

#include <libnbd.h>

#define DEFAULT_CONNECTIONS 4
#define DEFAULT_DEPTH 8
#define DEFAULT_REQUEST_SIZE (2u << 20)
#define DEFAULT_POOL_SIZE (64u << 20)
#define DEFAULT_READAHEAD (64u << 20)   /* read-ahead memory, all readers */
#define READAHEAD_DEPTH 8               /* chunks ahead of one reader */
#define DEFAULT_IDLE_MS 10
#define DEFAULT_RETRY_TIMEOUT 60
#define DEFAULT_REQUEST_TIMEOUT 30    /* NBD flush of a large dirty cache
                                       * can take seconds; 30 s rides out
                                       * that and short stalls, and a dead
                                       * server is noticed in half a
                                       * minute */
#define MAX_REQUEST_SIZE (32u << 20)  /* some servers drop the connection
                                       * beyond this */

struct options {
    struct nbdx_config nbd;
    bool mode_set;
    unsigned depth;
    uint64_t request_size, pool_size;
    uint64_t readahead;       /* --readahead SIZE; 0: off */
    unsigned idle_ms;
    bool write_through, destination_is_zero, no_extents;
    struct cli_fuse_opts fo;  /* -o: ours taken out, the rest libfuse's */
    const char *pidfile;
    struct pidfile *pf;       /* its directory, opened before daemonising */
    bool foreground, single_thread, fuse_debug;
    char *vsock_uri;          /* --vsock CID PORT, as an nbd+vsock URI */
    struct cli_mountpoint mp;
    bool no_digest, progress_bar;
    const char *blkhash;      /* the blkhash spec ("DIGEST/SIZE", "" for
                               * the defaults), or NULL: sha256 or none */
    const char *digest_opt;   /* the option that named the digest, or NULL
                               * (the default: blkhash) */
    char blkhash_md[BLKHASH_NAME_MAX];
    uint64_t blkhash_block;
    enum readback_when verify_readback;   /* --verify-readback[=WHEN] */
    int progress_fd;          /* --progress=FD, or -1 */
    uint64_t expected_size;
    char *spool_dir;          /* --spool-dir, absolute; NULL: $TMPDIR */
    uint64_t spool_max;       /* --spool-max; 0: SPOOL_MAX_DEFAULT */
    unsigned qcow2_cluster_bits;  /* --qcow2-cluster-size, as log2 */
    bool unmount;             /* --unmount MOUNTPOINT */
    bool list;                /* --list URI */
    const char *log_file;     /* --log-file FILE */
};

#define FUSE_WORKERS 16   /* threads serving requests other than writes */

#define DIGEST_QUEUE_LIMIT (32u << 20)  /* bytes of copies waiting for the
                                         * hash: part of the daemon's
                                         * memory bound */
#define DIGEST_HOLD_BUFFERS 4   /* pool buffers of the digest's own, at
                                 * most a quarter of the pool's (and two) */

static const char *program = "nbdferry";

/* mount(8) helpers exit as mount does: 32 is "mount failure".  Set for
 * the fstab form; a plain command line fails with 1. */
#define MOUNT_EX_FAIL 32
static int failure_status = EXIT_FAILURE;

static void usage_error(const char *fmt, ...)
    __attribute__((format(printf, 1, 2), noreturn));
static void usage_error(const char *fmt, ...)
{
    va_list ap;
    char msg[512];

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s: %s (see %s --help)\n", program, msg, program);
    exit(EXIT_FAILURE);
}

static void usage(void)
{
    printf(
"nbdferry - mount an NBD export as a file, with pipelined write-back\n"
"\n"
"Usage:\n"
"  nbdferry [OPTIONS] MOUNTPOINT[/FILENAME] URI\n"
"  nbdferry [OPTIONS] MOUNTPOINT[/FILENAME] [ CMD ARGS ... ]\n"
"  nbdferry [OPTIONS] MOUNTPOINT[/FILENAME] --command CMD ARGS ...\n"
"  nbdferry [OPTIONS] MOUNTPOINT[/FILENAME] --unix SOCKET\n"
"  nbdferry [OPTIONS] MOUNTPOINT[/FILENAME] --tcp HOST PORT\n"
"  nbdferry [OPTIONS] MOUNTPOINT[/FILENAME] --fd N\n"
"  nbdferry [OPTIONS] MOUNTPOINT[/FILENAME] --vsock CID PORT\n"
"  nbdferry [OPTIONS] FILE URI|SERVER...   (file mode)\n"
"  nbdferry --unmount MOUNTPOINT\n"
"  nbdferry --list URI\n"
"  nbdferry --help | --fuse-help | --version | --long-options |\n"
"           --short-options\n"
"\n"
"The export appears as MOUNTPOINT/FILENAME (default: nbd), or over FILE\n"
"when FILE is an existing regular file (file mode, as nbdfuse).  Copy a\n"
"raw disk image into it with cp, dd, rsync --inplace or qemu-img.  Beside\n"
"it, the same disk in other formats: write a VHD into FILENAME.vhd or a\n"
"VMDK (streamOptimized, as in an OVA, or monolithicSparse) into\n"
"FILENAME.vmdk and the decoded disk lands; read them to export the disk\n"
"(at the raw file's size) in that format.  MOUNTPOINT/.nbdferry-status is\n"
"the live status (JSON: progress, errors, the inline digest); the\n"
"nbdferry-status program summarises it.  Unmount with nbdferry --unmount\n"
"MOUNTPOINT to wait for the final flush and see the verdict (or\n"
"fusermount3 -u MOUNTPOINT).  [ CMD ARGS ] starts a server with\n"
"systemd socket activation (also: --socket-activation CMD ARGS);\n"
"--command runs one on stdin/stdout.  Options go before MOUNTPOINT.\n"
"\n"
"The mountpoint must be an empty directory of yours: a directory that\n"
"holds files is refused unless -o nonempty; a system directory (/, /etc,\n"
"/tmp, /usr, /var, $HOME, $TMPDIR, ...) and a FUSE mount always; a dead\n"
"mount is named with the fusermount3 -u that clears it.  File mode's FILE\n"
"must be an empty file of yours (or -o nonempty), never a system file.\n"
"\n"
"Without -f the command returns once the mount is ready and the daemon\n"
"runs on (nbdfuse stays in the foreground: use -f to wait on the process,\n"
"or -P FILE to find it).\n"
"\n"
"Options:\n"
"  -C, --connections N    NBD connections if the server offers multi-conn\n"
"                         (default %u)\n"
"      --depth N          requests in flight per connection (default %u)\n"
"      --request-size SIZE  largest NBD write; clamped to the server's\n"
"                         maximum and to 32M (default 2M)\n"
"      --pool-size SIZE   write-back memory in all (default 64M)\n"
"      --readahead SIZE   read-ahead memory for sequential readers, in\n"
"                         all (default 64M; 0: off)\n"
"      --idle-ms N        send a partly filled buffer after N ms without\n"
"                         writes (default %u)\n"
"      --write-through    no write-back: each write waits for its reply\n"
"                         (the stock behaviour, for comparison)\n"
"      --no-nodelay       leave Nagle's algorithm on for TCP connections\n"
"      --destination-is-zero  the export already reads as zero everywhere:\n"
"                         never zero it again\n"
"      --no-extents       do not read block status at start\n"
"      --digest=blkhash[/DIGEST[/SIZE]]|sha256|none  the inline digest of\n"
"                         the copy (also -o digest=...).  Default blkhash\n"
"                         (sha256 of 64K blocks, any write order; holes\n"
"                         and zeroes cost nothing): check it with\n"
"                         nbdferry-verify SOURCE, blksum SOURCE or\n"
"                         nbdcopy --blkhash.  sha256 (one forward pass)\n"
"                         compares with sha256sum SOURCE.  none: no digest\n"
"      --blkhash[=DIGEST[/SIZE]]  the same as --digest=blkhash[/...]\n"
"      --no-digest        the same as --digest=none\n"
"      --verify-readback[=WHEN]  read the disk back from the server and\n"
"                         compare it with the inline digest: at a\n"
"                         writer's close/fsync and at unmount (WHEN\n"
"                         close, the default) or at unmount only\n"
"                         (unmount); a difference fails with EIO\n"
"      --progress[=FD]    show the copy's progress, counted in acknowledged\n"
"                         bytes: a bar on stderr (needs -f), or \"N/100\"\n"
"                         lines written to file descriptor FD\n"
"      --expected-size SIZE  the source's size, for percent and ETA\n"
"                         (default: the writer's input file, if it can be\n"
"                         seen; else the size the copy tool truncates to)\n"
"      --vhd-fixed        FILENAME.vhd also takes fixed VHDs (-o vhd_fixed);\n"
"                         without it, anything that does not begin like a\n"
"                         dynamic or differencing VHD is refused\n"
"      --spool-dir DIR    where a format view keeps the bytes of an image that\n"
"                         arrive before the table that places them, past\n"
"                         what it keeps in memory (default $TMPDIR, else\n"
"                         /var/tmp; an unnamed file, mode 0600)\n"
"      --spool-max SIZE   at most SIZE bytes spooled at once (default 1G);\n"
"                         an image that needs more fails with EFBIG\n"
"      --qcow2-cluster-size SIZE  the clusters of the qcow2 that reading\n"
"                         FILENAME.qcow2 gives: a power of two from 512\n"
"                         to 2M (default 64K; -o qcow2_cluster_size=SIZE)\n"
"      --multiwriter      several processes may write the disk at once, and\n"
"                         another writable mount of the export may exist\n"
"                         (-o multiwriter); without it a second writer\n"
"                         fails with EBUSY and a second mount is refused\n"
"      --retry-timeout S  when a connection fails, reconnect and resend\n"
"                         for up to S seconds (URI, --unix, --tcp; 0: fail\n"
"                         at once; default %u)\n"
"      --request-timeout S  no reply for S seconds with requests outstanding:\n"
"                         the server gets --retry-timeout more, then they\n"
"                         fail (a handshake that slow fails; 0: wait\n"
"                         forever; default %u)\n"
"      --tls=require|allow|off  TLS (default: as the URI says; nbds://\n"
"                         requires it); require refuses a server\n"
"                         that cannot do TLS\n"
"      --tls-psk-file FILE  TLS pre-shared keys (psktool format)\n"
"      --tls-username USER  the PSK or X.509 user name\n"
"      --tls-certificates DIR  X.509 certificates (ca-cert.pem, ...)\n"
"      --tls-verify-peer  check the server's X.509 certificate and host\n"
"                         name (always done, unless --tls-insecure)\n"
"      --tls-insecure     X.509 TLS without checking the server: INSECURE,\n"
"                         anyone on the path can read and change the disk\n"
"      --block-device     nbdfuse's block-device semantics: O_TRUNC and\n"
"                         truncate leave the disk and its size alone (to\n"
"                         patch sectors in place); also -o block_device.\n"
"                         Default: file semantics, right for copying a\n"
"                         whole image in\n"
"  -o FUSE-OPTION         FUSE mount option; the mount is private to its\n"
"                         owner unless -o allow_other; repeatable.  Taken\n"
"                         by nbdferry: nonempty (mount over a directory\n"
"                         that holds files), digest=SPEC (as --digest),\n"
"                         uid=N, gid=N (the files' owner), block_device,\n"
"                         qcow2_cluster_size=SIZE, kernel_cache (accepted and\n"
"                         ignored: every file is direct I/O, the kernel\n"
"                         caches nothing); see --fuse-help for the rest\n"
"      --list URI         print the server's exports, one per line:\n"
"                         NAME, SIZE, DESCRIPTION separated by tabs\n"
"      --unmount MOUNTPOINT  unmount, wait for the daemon's final drain\n"
"                         and flush, print its verdict (failed ranges, the\n"
"                         digest) and exit with its status (with -P FILE:\n"
"                         the daemon's pidfile, for a file-mode mount)\n"
"      --log-file FILE    also append every message to FILE (created 0600;\n"
"                         a link there is refused), daemon or not\n"
"  -P, --pidfile, --pid-file FILE  write the daemon's pid here once the\n"
"                         mount is ready; removed at exit\n"
"  -r, --readonly, --read-only  read-only mount\n"
"  -f, --foreground       stay in the foreground\n"
"  -s                     single-threaded FUSE loop\n"
"  -d                     debug: -f, -v -v and FUSE's debug output\n"
"  -v, --verbose          more messages (twice: libnbd debug too)\n"
"  -V, --version          print the versions and exit\n"
"      --help             this text\n"
"      --fuse-help        the FUSE options -o accepts\n"
"      --long-options, --short-options  list the options (for completion)\n"
"\n"
"SIZE takes a K, M, G or T suffix (powers of 1024).\n",
        DEFAULT_CONNECTIONS, DEFAULT_DEPTH, DEFAULT_IDLE_MS,
        DEFAULT_RETRY_TIMEOUT, DEFAULT_REQUEST_TIMEOUT);
}

/* ---- option values --------------------------------------------------- */

static uint64_t parse_size(const char *opt, const char *s)
{
    char msg[CLI_MSG_MAX];
    uint64_t v;

    if (cli_parse_size(opt, s, &v, msg, sizeof msg) < 0)
        usage_error("%s", msg);
    return v;
}

static unsigned parse_uint(const char *opt, const char *s, unsigned min,
                           unsigned max)
{
    char msg[CLI_MSG_MAX];
    unsigned v;

    if (cli_parse_uint(opt, s, min, max, &v, msg, sizeof msg) < 0)
        usage_error("%s", msg);
    return v;
}

/* blkhash[=DIGEST[/SIZE]]: checked here, so a bad name fails the
 * command line rather than the mount. */
static void parse_blkhash(struct options *o, const char *spec)
{
    char why[128];
    struct blkhash *h;

    if (blkhash_parse_spec(spec, o->blkhash_md, &o->blkhash_block, why,
                           sizeof why) < 0)
        usage_error("--blkhash=%s: %s", spec, why);
    if (blkhash_create(o->blkhash_md, o->blkhash_block, &h) < 0)
        usage_error("--blkhash=%s: no such digest in OpenSSL (or one of "
                    "variable length)", spec);
    blkhash_free(h);
    o->blkhash = spec;
}

/* Two options naming different digests are a mistake, not a choice. */
static void digest_named(struct options *o, const char *opt, bool same)
{
    if (o->digest_opt && !same)
        usage_error("%s and %s name different digests", o->digest_opt, opt);
    o->digest_opt = opt;
}

/* --digest=blkhash[/DIGEST[/SIZE]]|sha256|none (and -o digest=...). */
static void parse_digest(struct options *o, const char *opt, const char *spec)
{
    if (strcmp(spec, "none") == 0) {
        digest_named(o, opt, o->no_digest);
        o->no_digest = true;
    } else if (strcmp(spec, "sha256") == 0) {
        digest_named(o, opt, !o->no_digest && !o->blkhash);
        o->blkhash = NULL;
    } else if (strcmp(spec, "blkhash") == 0 ||
               strncmp(spec, "blkhash/", 8) == 0) {
        digest_named(o, opt, o->blkhash != NULL);
        parse_blkhash(o, spec[7] ? spec + 8 : "");
    } else {
        usage_error("%s=%s: not blkhash[/DIGEST[/SIZE]], sha256 or none",
                    opt, spec);
    }
}

/* --qcow2-cluster-size SIZE (and -o qcow2_cluster_size=SIZE): what qemu
 * accepts, a power of two from 512 B to 2 MiB. */
static void parse_qcow2_cluster_size(struct options *o, const char *opt,
                                     const char *s)
{
    uint64_t v = parse_size(opt, s);

    if (v < (1u << QCOW2_MIN_CLUSTER_BITS) ||
        v > (1u << QCOW2_MAX_CLUSTER_BITS) || (v & (v - 1)))
        usage_error("%s %s: not a power of two from 512 to 2M", opt, s);
    o->qcow2_cluster_bits = (unsigned) __builtin_ctzll(v);
}

/* After every option (-o digest= may come last, in the fstab form): the
 * default when none named a digest is blkhash/sha256/64K. */
static void finish_digest(struct options *o)
{
    if (o->fo.digest)
        parse_digest(o, "-o digest", o->fo.digest);
    if (o->fo.qcow2_cluster_size)   /* not digest's, but as late */
        parse_qcow2_cluster_size(o, "-o qcow2_cluster_size",
                                 o->fo.qcow2_cluster_size);
    if (!o->digest_opt)
        parse_blkhash(o, "");
    if (o->verify_readback && o->no_digest)
        usage_error("--verify-readback compares with the inline digest: "
                    "not with --digest=none");
}

/* --spool-dir DIR: absolute (the daemon leaves its directory), and a
 * directory now rather than at the first image that needs it. */
static void parse_spool_dir(struct options *o, const char *dir)
{
    struct stat st;

    free(o->spool_dir);
    o->spool_dir = realpath(dir, NULL);
    if (!o->spool_dir || stat(o->spool_dir, &st) < 0)
        usage_error("--spool-dir %s: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        usage_error("--spool-dir %s: not a directory", dir);
}

static void add_fuse_opt(struct options *o, const char *opt)
{
    char msg[CLI_MSG_MAX];

    if (cli_add_fuse_opts(&o->fo, opt, msg, sizeof msg) < 0)
        usage_error("%s", msg);
}

/* ---- command line ---------------------------------------------------- */

enum {
    OPT_HELP = 256, OPT_DEPTH, OPT_REQUEST_SIZE, OPT_POOL_SIZE, OPT_IDLE_MS,
    OPT_WRITE_THROUGH, OPT_NO_NODELAY, OPT_DEST_ZERO, OPT_NO_EXTENTS,
    OPT_COMMAND, OPT_SOCKACT, OPT_UNIX, OPT_TCP, OPT_FD, OPT_RETRY_TIMEOUT,
    OPT_TLS, OPT_TLS_PSK_FILE, OPT_TLS_USERNAME, OPT_TLS_CERTIFICATES,
    OPT_TLS_VERIFY_PEER,
    OPT_NO_DIGEST, OPT_PROGRESS, OPT_EXPECTED_SIZE, OPT_VHD_FIXED,
    OPT_REQUEST_TIMEOUT, OPT_TLS_INSECURE, OPT_READAHEAD,
    OPT_FUSE_HELP, OPT_LONG_OPTIONS, OPT_SHORT_OPTIONS, OPT_BLOCK_DEVICE,
    OPT_BLKHASH, OPT_VERIFY_READBACK, OPT_UNMOUNT, OPT_LOG_FILE, OPT_LIST,
    OPT_MULTIWRITER, OPT_SPOOL_DIR, OPT_SPOOL_MAX, OPT_DIGEST,
    OPT_QCOW2_CLUSTER_SIZE,
};

#define SHORT_OPTIONS "+:C:o:P:rfvVds"

static const struct option long_options[] = {
    { "connections", required_argument, NULL, 'C' },
    { "depth", required_argument, NULL, OPT_DEPTH },
    { "request-size", required_argument, NULL, OPT_REQUEST_SIZE },
    { "pool-size", required_argument, NULL, OPT_POOL_SIZE },
    { "readahead", required_argument, NULL, OPT_READAHEAD },
    { "idle-ms", required_argument, NULL, OPT_IDLE_MS },
    { "write-through", no_argument, NULL, OPT_WRITE_THROUGH },
    { "no-nodelay", no_argument, NULL, OPT_NO_NODELAY },
    { "destination-is-zero", no_argument, NULL, OPT_DEST_ZERO },
    { "no-extents", no_argument, NULL, OPT_NO_EXTENTS },
    { "digest", required_argument, NULL, OPT_DIGEST },
    { "no-digest", no_argument, NULL, OPT_NO_DIGEST },
    { "blkhash", optional_argument, NULL, OPT_BLKHASH },
    { "verify-readback", optional_argument, NULL, OPT_VERIFY_READBACK },
    { "progress", optional_argument, NULL, OPT_PROGRESS },
    { "expected-size", required_argument, NULL, OPT_EXPECTED_SIZE },
    { "vhd-fixed", no_argument, NULL, OPT_VHD_FIXED },
    { "multiwriter", no_argument, NULL, OPT_MULTIWRITER },
    { "spool-dir", required_argument, NULL, OPT_SPOOL_DIR },
    { "spool-max", required_argument, NULL, OPT_SPOOL_MAX },
    { "qcow2-cluster-size", required_argument, NULL, OPT_QCOW2_CLUSTER_SIZE },
    { "retry-timeout", required_argument, NULL, OPT_RETRY_TIMEOUT },
    { "request-timeout", required_argument, NULL, OPT_REQUEST_TIMEOUT },
    { "tls-insecure", no_argument, NULL, OPT_TLS_INSECURE },
    { "tls", required_argument, NULL, OPT_TLS },
    { "tls-psk-file", required_argument, NULL, OPT_TLS_PSK_FILE },
    { "tls-username", required_argument, NULL, OPT_TLS_USERNAME },
    { "tls-certificates", required_argument, NULL, OPT_TLS_CERTIFICATES },
    { "tls-verify-peer", no_argument, NULL, OPT_TLS_VERIFY_PEER },
    { "pidfile", required_argument, NULL, 'P' },
    { "pid-file", required_argument, NULL, 'P' },
    { "block-device", no_argument, NULL, OPT_BLOCK_DEVICE },
    { "unmount", no_argument, NULL, OPT_UNMOUNT },
    { "list", no_argument, NULL, OPT_LIST },
    { "log-file", required_argument, NULL, OPT_LOG_FILE },
    { "fuse-help", no_argument, NULL, OPT_FUSE_HELP },
    { "long-options", no_argument, NULL, OPT_LONG_OPTIONS },
    { "short-options", no_argument, NULL, OPT_SHORT_OPTIONS },
    { "readonly", no_argument, NULL, 'r' },
    { "read-only", no_argument, NULL, 'r' },
    { "foreground", no_argument, NULL, 'f' },
    { "verbose", no_argument, NULL, 'v' },
    { "version", no_argument, NULL, 'V' },
    { "help", no_argument, NULL, OPT_HELP },
    { "command", no_argument, NULL, OPT_COMMAND },
    { "socket-activation", no_argument, NULL, OPT_SOCKACT },
    { "unix", no_argument, NULL, OPT_UNIX },
    { "tcp", no_argument, NULL, OPT_TCP },
    { "fd", no_argument, NULL, OPT_FD },
    { NULL },
};

static void set_mode(struct options *o, enum nbdx_mode m)
{
    char msg[CLI_MSG_MAX];

    if (cli_set_mode(&o->nbd, &o->mode_set, m, msg, sizeof msg) < 0)
        usage_error("%s", msg);
}

static void parse_server(struct options *o, int argc, char **argv)
{
    char msg[CLI_MSG_MAX];

    if (!o->mode_set && argc > 0 && strcmp(argv[0], "--vsock") == 0) {
        if (cli_vsock_uri(argc, argv, &o->vsock_uri, msg, sizeof msg) < 0)
            usage_error("%s", msg);
        argc = 1;
        argv = &o->vsock_uri;
    }
    if (cli_parse_server(&o->nbd, &o->mode_set, argc, argv, msg,
                         sizeof msg) < 0) {
        /* An option after the mountpoint: say where options go. */
        for (int i = 0; o->nbd.mode == NBDX_URI && i < argc; i++)
            if (argv[i][0] == '-' && argv[i][1])
                usage_error("'%s' after the mountpoint: options go before "
                            "it", argv[i]);
        usage_error("%s", msg);
    }
}

/* Checks happen here, before anything forks, connects or mounts. */
static void parse_mountpoint(struct options *o, const char *arg)
{
    char msg[CLI_MSG_MAX];

    if (cli_parse_mountpoint(arg, FS_STATUS_NAME, o->fo.nonempty, &o->mp,
                             msg, sizeof msg) < 0) {
        fprintf(stderr, "%s: %s\n", program, msg);
        exit(failure_status);
    }
}

/* --long-options, --short-options: for the bash completion script, from
 * the same tables getopt uses. */
static void __attribute__((noreturn)) list_long_options(void)
{
    optlist_long(long_options);
    printf("--vsock\n");         /* only after MOUNTPOINT, as in nbdfuse */
    exit(EXIT_SUCCESS);
}

static void __attribute__((noreturn)) list_short_options(void)
{
    optlist_short(SHORT_OPTIONS);
    exit(EXIT_SUCCESS);
}

static void __attribute__((noreturn)) fuse_help(void)
{
    printf("FUSE options for -o (libfuse %s), besides nbdferry's own\n"
           "(nonempty, digest=SPEC, uid=N, gid=N, block_device,\n"
           "kernel_cache):\n",
           fuse_pkgversion());
    fflush(stdout);
    fuse_lowlevel_help();
    exit(EXIT_SUCCESS);
}

static void __attribute__((noreturn)) version(void)
{
    struct nbd_handle *h = nbd_create();

    printf("%s %s\n", PACKAGE_NAME, PACKAGE_VERSION);
    if (h)
        printf("libnbd %s\n", nbd_get_version(h));
    printf("libfuse %s\n", fuse_pkgversion());
    nbd_close(h);
    exit(EXIT_SUCCESS);
}

static void __attribute__((noreturn))
unknown_option(int optopt_, const char *arg)
{
    if (optopt_ && optopt_ < 256)
        usage_error("invalid option -- '%c'", optopt_);
    const char *hint = cli_suggest_option(arg, long_options);
    if (hint)
        usage_error("unrecognized option '%s' (did you mean --%s?)", arg,
                    hint);
    usage_error("unrecognized or incomplete option '%s'", arg);
}

/* mount.fuse3 (fstab: "nbdferry#URI /mnt fuse3 ..." or "URI /mnt
 * fuse.nbdferry ...") runs "nbdferry URI MOUNTPOINT -o OPTIONS": the
 * source first, options last.  Recognised when the first argument is a
 * URI and the second an existing directory. */
static bool fstab_form(struct options *o, int argc, char **argv)
{
    struct stat st;

    if (argc < 2 || !strstr(argv[0], "://") || o->mode_set)
        return false;
    /* A dead mount (ENOTCONN) is the fstab form too, to be named. */
    if (stat(argv[1], &st) == -1 ? errno != ENOTCONN
        : !(S_ISDIR(st.st_mode) || S_ISREG(st.st_mode)))
        return false;
    for (int i = 2; i < argc; i += 2) {
        if (strcmp(argv[i], "-o") != 0 || i + 1 >= argc)
            usage_error("unexpected '%s' after the mountpoint", argv[i]);
        add_fuse_opt(o, argv[i + 1]);
    }
    failure_status = MOUNT_EX_FAIL;
    parse_mountpoint(o, argv[1]);
    char *uri[] = { argv[0], NULL };
    parse_server(o, 1, uri);
    o->nbd.debug = log_verbosity >= 2;
    return true;
}

static void parse_args(struct options *o, int argc, char **argv)
{
    int c;

    o->nbd.connections = DEFAULT_CONNECTIONS;
    o->nbd.nodelay = true;
    o->nbd.retry_timeout_s = DEFAULT_RETRY_TIMEOUT;
    o->nbd.request_timeout_s = DEFAULT_REQUEST_TIMEOUT;
    o->nbd.tls = NBDX_TLS_FROM_URI;
    o->progress_fd = -1;
    o->depth = DEFAULT_DEPTH;
    o->request_size = DEFAULT_REQUEST_SIZE;
    o->pool_size = DEFAULT_POOL_SIZE;
    o->readahead = DEFAULT_READAHEAD;
    o->idle_ms = DEFAULT_IDLE_MS;

    opterr = 0;
    while ((c = getopt_long(argc, argv, SHORT_OPTIONS, long_options,
                            NULL)) != -1) {
        switch (c) {
        case 'C':
            o->nbd.connections = parse_uint("--connections", optarg, 1, 64);
            break;
        case OPT_DEPTH:
            o->depth = parse_uint("--depth", optarg, 1, 1024);
            break;
        case OPT_REQUEST_SIZE:
            o->request_size = parse_size("--request-size", optarg);
            if (o->request_size < 4096)
                usage_error("--request-size must be at least 4K");
            break;
        case OPT_POOL_SIZE:
            o->pool_size = parse_size("--pool-size", optarg);
            if (o->pool_size < 8192 || o->pool_size > (64ull << 30))
                usage_error("--pool-size must be between 8K and 64G");
            break;
        case OPT_READAHEAD:
            o->readahead = parse_size("--readahead", optarg);
            if (o->readahead > (64ull << 30))
                usage_error("--readahead must be at most 64G");
            break;
        case OPT_IDLE_MS:
            o->idle_ms = parse_uint("--idle-ms", optarg, 1, 60000);
            break;
        case OPT_WRITE_THROUGH: o->write_through = true; break;
        case OPT_NO_NODELAY: o->nbd.nodelay = false; break;
        case OPT_DEST_ZERO: o->destination_is_zero = true; break;
        case OPT_NO_EXTENTS: o->no_extents = true; break;
        case OPT_TLS:
            if (strcmp(optarg, "require") == 0 || strcmp(optarg, "on") == 0)
                o->nbd.tls = LIBNBD_TLS_REQUIRE;
            else if (strcmp(optarg, "allow") == 0)
                o->nbd.tls = LIBNBD_TLS_ALLOW;
            else if (strcmp(optarg, "off") == 0)
                o->nbd.tls = LIBNBD_TLS_DISABLE;
            else
                usage_error("--tls: '%s' is not require, allow or off",
                            optarg);
            break;
        case OPT_TLS_PSK_FILE:
            if (access(optarg, R_OK) == -1)
                usage_error("--tls-psk-file %s: %s", optarg, strerror(errno));
            o->nbd.tls_psk_file = optarg;
            break;
        case OPT_TLS_USERNAME: o->nbd.tls_username = optarg; break;
        case OPT_TLS_CERTIFICATES:
            if (access(optarg, R_OK | X_OK) == -1)
                usage_error("--tls-certificates %s: %s", optarg,
                            strerror(errno));
            o->nbd.tls_certificates = optarg;
            break;
        case OPT_TLS_VERIFY_PEER: o->nbd.tls_verify_peer = true; break;
        case OPT_RETRY_TIMEOUT:
            o->nbd.retry_timeout_s =
                parse_uint("--retry-timeout", optarg, 0, 86400);
            break;
        case OPT_REQUEST_TIMEOUT:
            o->nbd.request_timeout_s =
                parse_uint("--request-timeout", optarg, 0, 86400);
            break;
        case OPT_TLS_INSECURE: o->nbd.tls_insecure = true; break;
        case OPT_DIGEST: parse_digest(o, "--digest", optarg); break;
        case OPT_NO_DIGEST: parse_digest(o, "--no-digest", "none"); break;
        case OPT_BLKHASH:
            digest_named(o, "--blkhash", o->blkhash && !o->no_digest);
            parse_blkhash(o, optarg ? optarg : "");
            break;
        case OPT_VERIFY_READBACK:
            if (readback_parse_when(optarg, &o->verify_readback) < 0)
                usage_error("--verify-readback=%s: not close or unmount",
                            optarg);
            break;
        case OPT_PROGRESS:
            if (!optarg) {
                o->progress_bar = true;
                break;
            }
            o->progress_fd = (int) parse_uint("--progress", optarg, 0, INT_MAX);
            if (fcntl(o->progress_fd, F_GETFD) == -1)
                usage_error("--progress=%d: not an open file descriptor",
                            o->progress_fd);
            break;
        case OPT_EXPECTED_SIZE:
            o->expected_size = parse_size("--expected-size", optarg);
            break;
        case OPT_VHD_FIXED:
            o->fo.vhd_fixed = true;
            break;
        case OPT_MULTIWRITER:
            o->fo.multiwriter = true;
            break;
        case OPT_SPOOL_DIR: parse_spool_dir(o, optarg); break;
        case OPT_SPOOL_MAX:
            o->spool_max = parse_size("--spool-max", optarg);
            break;
        case OPT_QCOW2_CLUSTER_SIZE:
            parse_qcow2_cluster_size(o, "--qcow2-cluster-size", optarg);
            break;
        case 'o': add_fuse_opt(o, optarg); break;
        case 'P': o->pidfile = optarg; break;
        case 'r': o->nbd.readonly = true; break;
        case 'f': o->foreground = true; break;
        case 'v': log_verbosity++; break;
        case 's': o->single_thread = true; break;
        case 'd':
            o->foreground = o->fuse_debug = true;
            log_verbosity += 2;
            break;
        case OPT_BLOCK_DEVICE: o->fo.block_device = true; break;
        case OPT_UNMOUNT: o->unmount = true; break;
        case OPT_LIST: o->list = true; break;
        case OPT_LOG_FILE: o->log_file = optarg; break;
        case 'V': version();
        case OPT_FUSE_HELP: fuse_help();
        case OPT_LONG_OPTIONS: list_long_options();
        case OPT_SHORT_OPTIONS: list_short_options();
        case OPT_HELP:
            usage();
            exit(EXIT_SUCCESS);
        case OPT_COMMAND: set_mode(o, NBDX_COMMAND); break;
        case OPT_SOCKACT: set_mode(o, NBDX_SOCKET_ACTIVATION); break;
        case OPT_UNIX: set_mode(o, NBDX_UNIX); break;
        case OPT_TCP: set_mode(o, NBDX_TCP); break;
        case OPT_FD: set_mode(o, NBDX_FD); break;
        case ':':
            usage_error("option '%s' needs a value", argv[optind - 1]);
        default:
            /* opterr is 0: one line, ours. */
            unknown_option(optopt, argv[optind - 1]);
        }
    }
    if (o->list) {
        if (argc - optind != 1 || !strstr(argv[optind], "://"))
            usage_error("--list takes one URI (nbd://HOST[:PORT], "
                        "nbd+unix:///?socket=SOCKET, nbds://...)");
        exit(list_exports(argv[optind]));
    }
    if (o->unmount) {
        if (argc - optind != 1)
            usage_error("--unmount takes one MOUNTPOINT and nothing else");
        exit(verdict_unmount(argv[optind], o->pidfile));
    }
    if (optind >= argc)
        usage_error("missing the mountpoint");
    if (o->progress_bar && !o->foreground)
        usage_error("--progress draws on stderr, which a daemon closes: "
                    "add -f, or use --progress=FD");
    if (fstab_form(o, argc - optind, argv + optind)) {
        finish_digest(o);
        return;
    }
    finish_digest(o);
    /* The server first: --fd N must be checked before the mountpoint's
     * pinned descriptor could take the number N. */
    parse_server(o, argc - optind - 1, argv + optind + 1);
    parse_mountpoint(o, argv[optind]);
    o->nbd.debug = log_verbosity >= 2;
}

/* ---- daemon ---------------------------------------------------------- */

static int ready_fd = -1;         /* tells the waiting parent we are up */

/* Fork now, before any thread exists.  The parent waits for one byte: 0
 * when the mount is ready, anything else (or EOF) on failure, and exits
 * with it.  The child carries on. */
static void daemonize_early(void)
{
    int p[2];

    if (pipe(p) == -1) {
        perror(program);
        exit(EXIT_FAILURE);
    }
    pid_t pid = fork();
    if (pid == -1) {
        perror(program);
        exit(EXIT_FAILURE);
    }
    if (pid > 0) {
        unsigned char status = 1;
        close(p[1]);
        if (read(p[0], &status, 1) != 1) {
            int ws;
            status = 1;
            if (waitpid(pid, &ws, 0) == pid && WIFEXITED(ws) &&
                WEXITSTATUS(ws) != 0)
                status = (unsigned char) WEXITSTATUS(ws);
        }
        _exit(status);
    }
    close(p[0]);
    ready_fd = p[1];
    setsid();
}

/* The mount is up: release the parent, leave the terminal. */
static void detach(void)
{
    if (ready_fd < 0)
        return;
    unsigned char ok = 0;
    int null = open("/dev/null", O_RDWR);
    if (write(ready_fd, &ok, 1) != 1) {
        /* the parent is gone: nobody to tell */
    }
    close(ready_fd);
    ready_fd = -1;
    log_set_syslog(true);
    if (null >= 0) {
        dup2(null, STDIN_FILENO);
        dup2(null, STDOUT_FILENO);
        dup2(null, STDERR_FILENO);
        if (null > STDERR_FILENO)
            close(null);
    }
    if (chdir("/") == -1) {
        /* harmless */
    }
}

/* ---- setup ----------------------------------------------------------- */

static uint64_t clamp_request_size(const struct options *o,
                                   const struct nbdx_info *info)
{
    uint64_t rs = o->request_size;

    if (rs > MAX_REQUEST_SIZE) {
        log_info("request size %" PRIu64 " clamped to 32M", rs);
        rs = MAX_REQUEST_SIZE;
    }
    if (info->block_max && rs > info->block_max) {
        log_info("request size clamped to the server's maximum, %" PRIu32,
                 info->block_max);
        rs = info->block_max;
    }
    return rs;
}

/* The block status scan got no reply in time and gave the server up
 * (transport/pool.c): nothing is written yet, so connect again and go on
 * without the scan, or fail where the server cannot be connected to
 * again (a command, socket activation, --fd).  Logs one line. */
static int reopen_without_extents(struct fs *fs, const struct options *o,
                                  struct pool_config *pc)
{
    enum nbdx_mode m = o->nbd.mode;

    if (m != NBDX_URI && m != NBDX_UNIX && m != NBDX_TCP) {
        log_err("the server did not answer block status in time and this "
                "mode cannot connect again; mount with --no-extents");
        return -ETIMEDOUT;
    }
    nbdx_close(fs->x);
    fs->x = NULL;
    if (nbdx_open(&o->nbd, &fs->x) < 0)   /* logged */
        return -ENOTCONN;
    if (nbdx_info(fs->x)->size != fs->export_size) {
        log_err("the export changed size after connecting again");
        return -ENOTCONN;
    }
    log_warn("the server did not answer block status in time: connected "
             "again, mounted without it (nothing known to read as zero; "
             "--no-extents skips the wait)");
    pc->scan_extents = false;
    pc->scan_timed_out = true;
    int r = pool_create(pc, fs->x, fs->export_size, &fs->pool);
    if (r < 0)
        log_err("cannot create the write-back pool: %s", strerror(-r));
    return r;
}

/* The digest's own pool buffers (pool_config.hold_buffers): beside the
 * writers' pool_size, so a slow hasher never takes the pipeline's. */
static unsigned digest_hold_buffers(const struct options *o, size_t pool_size,
                                    size_t request_size)
{
    unsigned n = (unsigned) (pool_size / request_size / 4);

    if (o->no_digest)
        return 0;
    return n < 2 ? 2 : n > DIGEST_HOLD_BUFFERS ? DIGEST_HOLD_BUFFERS : n;
}

/* The bytes the digest may hold in those buffers: one less than they
 * are, as a run of contiguous holds may start inside a buffer. */
static size_t digest_hold_limit(const struct pool_stats *s)
{
    return s->hold_bufs > 1 ? (s->hold_bufs - 1) * s->request_size : 0;
}

static int open_pool(struct fs *fs, const struct options *o)
{
    const struct nbdx_info *info = nbdx_info(fs->x);
    struct pool_config pc = {
        .request_size = clamp_request_size(o, info),
        .pool_size = o->pool_size,
        .depth = o->depth,
        .idle_ms = o->idle_ms,
        .write_through = o->write_through,
        .destination_is_zero = o->destination_is_zero,
        .scan_extents = !o->no_extents,
        .track_touched = o->verify_readback != READBACK_OFF,
        /* A reply to block status is waited for no longer than any other
         * reply (--request-timeout), and 15 s at most. */
        .scan_wait_ms = o->nbd.request_timeout_s &&
                        o->nbd.request_timeout_s < 15
                        ? o->nbd.request_timeout_s * 1000u : 15000u,
    };
    if (pc.pool_size < 2 * pc.request_size) {
        log_info("pool size raised to two requests");
        pc.pool_size = 2 * pc.request_size;
    }
    pc.hold_buffers = digest_hold_buffers(o, pc.pool_size, pc.request_size);
    int r = pool_create(&pc, fs->x, fs->export_size, &fs->pool);
    if (r == -ETIMEDOUT) {
        r = reopen_without_extents(fs, o, &pc);
        if (r < 0)
            return r;             /* logged */
    } else if (r < 0) {
        log_err("cannot create the write-back pool: %s", strerror(-r));
        return r;
    }
    /* Read requests as large as write requests, as many ahead of one
     * reader as the write side keeps in flight per connection. */
    r = ra_create(fs->pool, (size_t) o->readahead, pc.request_size,
                  READAHEAD_DEPTH, &fs->ra);
    if (r < 0)
        log_err("cannot create the read-ahead: %s", strerror(-r));
    return r;
}

/* Is name one of the comma-separated options in opts? */
static bool has_fuse_opt(const char *opts, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = opts; p; p = strchr(p, ',')) {
        if (*p == ',')
            p++;
        if (strncmp(p, name, n) == 0 && (p[n] == ',' || p[n] == '\0' ||
                                         p[n] == '='))
            return true;
    }
    return false;
}

/* Mount what fs/cli.c checked (THE PIN there).  As root, through
 * /proc/self/fd/N: the kernel follows it to the pinned inode, whatever
 * the path names now.  Otherwise fusermount3 mounts by path (it resolves
 * /proc/self/fd/N in its own process): the path is re-checked right
 * before and right after.  Nothing may stat the path once mounted: the
 * kernel would ask this daemon, which does not serve yet. */
static int mount_pinned(struct fuse_session *se,
                        const struct cli_mountpoint *mp)
{
    char msg[CLI_MSG_MAX], path[64];

    if (cli_mountpoint_recheck(mp, msg, sizeof msg) < 0) {
        log_err("%s", msg);
        return -1;
    }
    bool root = geteuid() == 0;
    snprintf(path, sizeof path, "/proc/self/fd/%d", mp->fd);
    if (fuse_session_mount(se, root ? path : mp->mountpoint) == -1) {
        log_err("cannot mount on %s", mp->mountpoint);
        return -1;
    }
    if (cli_mountpoint_landed(mp, msg, sizeof msg) < 0) {
        log_err("%s", msg);
        fuse_session_unmount(se);
        return -1;
    }
    log_debug("mounted on %s through %s", mp->mountpoint,
              root ? path : "its path");
    return 0;
}

static struct fuse_session *mount_fuse(struct fs *fs, const struct options *o)
{
    struct fuse_args args = FUSE_ARGS_INIT(0, NULL);
    struct fuse_session *se = NULL;

    fuse_opt_add_arg(&args, program);
    fuse_opt_add_arg(&args, "-o");
    fuse_opt_add_arg(&args, "fsname=nbdferry,subtype=nbdferry");
    if (fs->readonly) {
        fuse_opt_add_arg(&args, "-o");
        fuse_opt_add_arg(&args, "ro");
    }
    if (o->fo.pass) {
        fuse_opt_add_arg(&args, "-o");
        fuse_opt_add_arg(&args, o->fo.pass);
    }
    if (o->fuse_debug)
        fuse_opt_add_arg(&args, "-d");
    /* With allow_other, other users reach the files: let the kernel
     * enforce their modes (0600), or anyone could read and write the
     * disk. */
    fs->allow_other = o->fo.pass && has_fuse_opt(o->fo.pass,
                                                 "allow_other");
    if (fs->allow_other &&
        !has_fuse_opt(o->fo.pass, "default_permissions")) {
        fuse_opt_add_arg(&args, "-o");
        fuse_opt_add_arg(&args, "default_permissions");
    }
    static struct fuse_lowlevel_ops ops;
    fs_mode_ops(&ops);
    se = fuse_session_new(&args, &ops, sizeof ops, fs);
    fuse_opt_free_args(&args);
    if (!se) {
        log_err("cannot start FUSE (bad -o option?)");
        return NULL;
    }
    if (fuse_set_signal_handlers(se) == -1 || mount_pinned(se, &o->mp) < 0) {
        fuse_remove_signal_handlers(se);
        fuse_session_destroy(se);
        return NULL;
    }
    return se;
}

static int serve(struct fs *fs, struct fuse_session *se, bool single_thread)
{
    if (single_thread)
        return fuse_session_loop(se);
    struct fuseloop_landing landing;
    fs_landing(fs, &landing);
    return fuseloop_run(se, FUSE_WORKERS, &landing);
}

/* The digest's reader (digest_set_reader()): the disk as every change
 * reported so far left it, pending writes included. */
static int digest_read_disk(void *ctx, uint64_t off, void *buf, size_t len)
{
    struct fs *fs = ctx;

    return pool_read(fs->pool, off, buf, len);
}

/* The inline digest and the progress thread: they start once the pool
 * exists and stop after the final flush, so the last progress line
 * comes after the last reply. */
static int start_watchers(struct fs *fs, const struct options *o)
{
    struct progress_config pc = {
        .bar = o->progress_bar,
        .fd = o->progress_fd,
        .expected_size = o->expected_size,
        .mountpoint = o->mp.mountpoint,
    };
    struct pool_stats ps;
    pool_get_stats(fs->pool, &ps);
    int r = o->no_digest ? 0
          : o->blkhash ? digest_create_blkhash(DIGEST_QUEUE_LIMIT,
                                               o->blkhash_md,
                                               o->blkhash_block, &fs->digest)
                       : digest_create(DIGEST_QUEUE_LIMIT, &fs->digest);
    if (r == 0) {
        digest_set_hold_limit(fs->digest, digest_hold_limit(&ps));
        digest_set_reader(fs->digest, digest_read_disk, fs, fs->export_size);
    }
    if (r == 0)
        r = readback_create(o->verify_readback,
                            o->blkhash ? o->blkhash_md : NULL,
                            o->blkhash_block, !o->no_extents,
                            &fs->readback);
    if (r == 0)
        r = progress_create(fs, &pc, &fs->progress);
    /* Stall diagnostics: TCP_INFO every 10 ms, on TCP connections. */
    if (r == 0 && nbdx_info(fs->x)->tcp)
        r = tcpinfo_start(nbdx_conn_fd, fs->x, nbdx_connections(fs->x), 10,
                          &fs->tcp);
    if (r < 0)
        log_err("cannot start the digest and progress threads: %s",
                strerror(-r));
    return r;
}

static void stop_watchers(struct fs *fs)
{
    struct digest_info di;

    progress_destroy(fs->progress);
    fs->progress = NULL;
    if (fs->tcp) {
        struct tcpinfo_stats t;
        tcpinfo_get(fs->tcp, &t);
        log_info("tcp: %" PRIu64 " samples, %" PRIu64 " with sub-MSS data "
                 "unsent behind unacknowledged segments", t.samples,
                 t.nagle_stalls);
        tcpinfo_stop(fs->tcp);
        fs->tcp = NULL;
    }
    digest_get(fs->digest, rawfile_size(fs), &di);
    struct pool_stats st;
    pool_get_stats(fs->pool, &st);
    /* The digest is of what was written, not of what a failed or lost
     * request left on the disk. */
    if (di.state == DIGEST_COMPLETE && !st.nfailures)
        log_info("inline %s of %s: %s", di.algorithm, fs->filename, di.hex);
    readback_destroy(fs->readback);
    fs->readback = NULL;
    digest_destroy(fs->digest);
    fs->digest = NULL;
}

#define FINISH_ZEROING_NOTICE (1ull << 30)  /* seconds of zeroing, or more */

/* The only failures were writes counted lost at a reconnect: with
 * --verify-readback, read the whole disk back; if it holds every byte
 * written, the server kept them and the mount's verdict is clean. */
static bool forgive_lost(struct fs *fs, const struct pool_stats *st)
{
    if (!fs->readback || st->errors != st->errors_lost || st->flush_failed)
        return false;
    log_notice("%" PRIu64 " write(s) counted lost at a reconnect: reading "
               "the disk back to see whether the server kept them",
               st->errors_lost);
    if (readback_at_unmount(fs) < 0 || pool_forgive_lost(fs->pool) < 0)
        return false;
    log_notice("the read-back found every byte written on the disk: the "
               "writes counted lost at the reconnect were kept");
    return true;
}

/* Drain and flush after the mount is gone.  Returns the exit status: 1
 * if any failure is left unrepaired (the disk may not hold what was
 * written), 0 when every failed range was written again (or zeroed)
 * successfully, with a notice saying so. */
static int finish(struct fs *fs)
{
    struct pool_stats st;

    /* A long zeroing says so before it starts (fs/stopsig.c). */
    pool_get_stats(fs->pool, &st);
    if (st.pending_zero >= FINISH_ZEROING_NOTICE && stopsig_started())
        log_notice("zeroing %" PRIu64 " bytes before exiting; a second "
                   "SIGTERM or SIGINT abandons it", st.pending_zero);
    int r = pool_flush(fs->pool);
    pool_get_stats(fs->pool, &st);
    if (st.unrepaired && r == 0 && forgive_lost(fs, &st))
        pool_get_stats(fs->pool, &st);
    if (st.unrepaired || r < 0) {
        const struct pool_failure *f = NULL;
        for (unsigned i = 0; i < st.nfailures && !f; i++)
            if (!st.failures[i].repaired)
                f = &st.failures[i];
        log_err("%" PRIu64 " NBD request(s) failed during this mount and "
                "%" PRIu64 " byte(s) in %" PRIu64 " range(s)%s were not "
                "repaired; the disk may not hold what was written (first: "
                "%s of %" PRIu64 " bytes at %" PRIu64 ")",
                st.errors, st.damaged_bytes, st.damaged_ranges,
                st.flush_failed ? " and the last flush" : "",
                !f ? "flush" : f->lost ? "lost write"
                   : pool_kind_name(f->kind),
                f ? f->len : 0, f ? f->off : 0);
        return EXIT_FAILURE;
    }
    if (st.errors)
        log_notice("%" PRIu64 " NBD request(s) failed during this mount; "
                   "every range they left wrong was written again "
                   "successfully (%" PRIu64 " repaired)", st.errors,
                   st.repairs);
    if (readback_at_unmount(fs) < 0)          /* --verify-readback */
        return EXIT_FAILURE;
    log_info("unmounted: %" PRIu64 " bytes written, %" PRIu64 " acknowledged",
             st.bytes_written, st.bytes_acked);
    return EXIT_SUCCESS;
}

int main(int argc, char **argv)
{
    struct options o = { 0 };
    struct fs fs = { 0 };
    struct mountlock *ml = NULL;
    int status = EXIT_FAILURE;

    log_set_program(program);
    signal(SIGPIPE, SIG_IGN);
    parse_args(&o, argc, argv);
    status = failure_status;
    if (o.pidfile) {
        int r = pidfile_prepare(o.pidfile, &o.pf);
        if (r < 0)
            usage_error("--pidfile %s: %s", o.pidfile, strerror(-r));
    }
    log_set_context(o.mp.mountpoint);    /* syslog lines name the mount */
    if (o.log_file) {                    /* opened here: a relative path */
        int r = log_set_file(o.log_file);
        if (r < 0)
            usage_error("--log-file %s: %s", o.log_file,
                        r == -EPERM ? "not a regular file of ours with one "
                        "link (a planted link is never followed)"
                        : strerror(-r));
    }
    if (!o.foreground)
        daemonize_early();
    /* After the fork (the lock file names the daemon's pid), before the
     * server: a second writable mount of the export stops here. */
    if (!o.nbd.readonly && !o.fo.multiwriter &&
        mountlock_take(&o.nbd, o.mp.mountpoint, &ml) < 0)
        goto out_nbd;


    if (nbdx_open(&o.nbd, &fs.x) < 0)
        goto out_nbd;
    const struct nbdx_info *info = nbdx_info(fs.x);
    fs.export_size = info->size;
    fs.apparent_size = info->size;
    fs.readonly = info->readonly;
    fs.filename = o.mp.filename;
    fs.file_mode = o.mp.file_mode;
    fs.block_device = o.fo.block_device;
    fs.vhd_fixed = o.fo.vhd_fixed;
    fs.multiwriter = o.fo.multiwriter;
    fs.spool_dir = o.spool_dir;
    fs.spool_max = o.spool_max ? o.spool_max : SPOOL_MAX_DEFAULT;
    fs.qcow2_cluster_bits = o.qcow2_cluster_bits ? o.qcow2_cluster_bits
                                                 : FS_QCOW2_CLUSTER_BITS_DEFAULT;
    if (fs_views_init(&fs) < 0) {
        log_err("out of memory");
        goto out_nbd;
    }
    fs.uid = o.fo.set_uid ? (uid_t) o.fo.uid : getuid();
    fs.gid = o.fo.set_gid ? (gid_t) o.fo.gid : getgid();
    if (o.fo.kernel_cache)
        log_info("-o kernel_cache: ignored, every file is direct I/O (the "
                 "write-back pool must see each write)");
    clock_gettime(CLOCK_REALTIME, &fs.started);
    fs.mtime = fs.started;
    pthread_mutex_init(&fs.lock, NULL);
    mono_cond_init(&fs.released);
    pthread_rwlock_init(&fs.size_lock, NULL);
    log_info("export: %" PRIu64 " bytes, %u connection(s)%s%s%s",
             info->size, info->connections, info->tcp ? ", tcp" : "",
             info->can_zero ? ", write-zeroes" : "",
             info->can_fast_zero ? ", fast-zero" : "");

    if (open_pool(&fs, &o) < 0)
        goto out_nbd;
    if (start_watchers(&fs, &o) < 0)
        goto out_pool;
    struct fuse_session *se = mount_fuse(&fs, &o);
    if (!se)
        goto out_pool;
    if (o.pf) {
        int r = pidfile_write(o.pf);
        if (r < 0) {
            log_err("pidfile %s: %s", o.pidfile, strerror(-r));
            goto out_unmount;
        }
    }
    if (stopsig_start(se, fs.pool) < 0)   /* libfuse's handlers stay */
        log_info("a second stop signal will not abandon the final drain");
    detach();
    serve(&fs, se, o.single_thread);
    status = EXIT_SUCCESS;

out_unmount:
    fuse_session_unmount(se);
    fuse_remove_signal_handlers(se);
    stopsig_session_end();
    fuse_session_destroy(se);
out_pool:
    /* libfuse's handlers are gone: a SIGTERM now would kill the final
     * drain and flush and lose acknowledged-to-the-kernel writes.  The
     * mount is already down; ignore it (SIGKILL still works), but for the
     * second stop signal that abandons the zeroing (fs/stopsig.c). */
    if (!stopsig_started()) {
        signal(SIGTERM, SIG_IGN);
        signal(SIGINT, SIG_IGN);
        signal(SIGHUP, SIG_IGN);
    }
    if (status == EXIT_SUCCESS)
        status = finish(&fs);
    verdict_write(&fs, status);       /* for nbdferry --unmount */
    stop_watchers(&fs);
    pool_destroy(fs.pool);
    stopsig_stop();
out_nbd:
    fs_close_all(&fs);
    ra_destroy(fs.ra);        /* after pool_destroy(): no read in flight */
    fs_views_fini(&fs);
    nbdx_close(fs.x);
    pidfile_remove(o.pf);     /* only if it still holds our pid */
    mountlock_release(ml);
    cli_mountpoint_free(&o.mp);
    cli_fuse_opts_free(&o.fo);
    free(o.spool_dir);
    free(o.vsock_uri);
    log_flush();
    return status;
}
