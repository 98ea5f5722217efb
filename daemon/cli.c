/* daemon/cli.c: the daemon's command line (see daemon/cli.h): the option table,
 * the defaults, the usage text and the parsing, which returns its one
 * message rather than printing it.
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
 * forks, connects or mounts (daemon/mountpoint.c). */
#include "fs/fs.h"
#include "daemon/cli.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "digest/blkhash.h"
#include "common/log.h"
#include "common/optlist.h"
#include "qcow2/qcow2.h"
#include "config.h"

#include <libnbd.h>

/* mount(8) helpers exit as mount does: 32 is "mount failure".  Set for
 * the fstab form; a plain command line fails with 1. */
#define MOUNT_EX_FAIL 32

/* A usage mistake: the message, printed with "(see nbdferry --help)". */
static int usage_error(struct cli_options *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int usage_error(struct cli_options *o, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(o->err.msg, sizeof o->err.msg, fmt, ap);
    va_end(ap);
    o->usage_mistake = true;
    return -EINVAL;
}

/* A helper of daemon/cliargs.c failed with its message in o->err. */
static int usage_helper_error(struct cli_options *o, int r)
{
    o->usage_mistake = true;
    return r;
}

/* ---- option values --------------------------------------------------- */

static int parse_size(struct cli_options *o, const char *opt, const char *s,
                      uint64_t *out)
{
    int r = cli_parse_size(opt, s, out, &o->err);

    return r < 0 ? usage_helper_error(o, r) : 0;
}

static int parse_uint(struct cli_options *o, const char *opt, const char *s,
                      unsigned min, unsigned max, unsigned *out)
{
    int r = cli_parse_uint(opt, s, min, max, out, &o->err);

    return r < 0 ? usage_helper_error(o, r) : 0;
}

/* blkhash[=DIGEST[/SIZE]]: checked here, so a bad name fails the
 * command line rather than the mount. */
static int parse_blkhash(struct cli_options *o, const char *spec)
{
    struct nbdf_err why;
    struct blkhash *h;

    if (blkhash_parse_spec(spec, o->blkhash_md, &o->blkhash_block, &why) < 0)
        return usage_error(o, "--blkhash=%s: %s", spec, why.msg);
    if (blkhash_create(o->blkhash_md, o->blkhash_block, &h) < 0)
        return usage_error(o, "--blkhash=%s: no such digest in OpenSSL (or "
                           "one of variable length)", spec);
    blkhash_free(h);
    o->blkhash = spec;
    return 0;
}

/* Two options naming different digests are a mistake, not a choice. */
static int digest_named(struct cli_options *o, const char *opt, bool same)
{
    if (o->digest_opt && !same)
        return usage_error(o, "%s and %s name different digests",
                           o->digest_opt, opt);
    o->digest_opt = opt;
    return 0;
}

/* --digest=blkhash[/DIGEST[/SIZE]]|sha256|none (and -o digest=...). */
static int parse_digest(struct cli_options *o, const char *opt,
                        const char *spec)
{
    int r;

    if (strcmp(spec, "none") == 0) {
        r = digest_named(o, opt, o->no_digest);
        o->no_digest = true;
    } else if (strcmp(spec, "sha256") == 0) {
        r = digest_named(o, opt, !o->no_digest && !o->blkhash);
        o->blkhash = NULL;
    } else if (strcmp(spec, "blkhash") == 0 ||
               strncmp(spec, "blkhash/", 8) == 0) {
        r = digest_named(o, opt, o->blkhash != NULL);
        if (r == 0)
            r = parse_blkhash(o, spec[7] ? spec + 8 : "");
    } else {
        r = usage_error(o, "%s=%s: not blkhash[/DIGEST[/SIZE]], sha256 or "
                        "none", opt, spec);
    }
    return r;
}

/* --qcow2-cluster-size SIZE (and -o qcow2_cluster_size=SIZE): what qemu
 * accepts, a power of two from 512 B to 2 MiB. */
static int parse_qcow2_cluster_size(struct cli_options *o, const char *opt,
                                    const char *s)
{
    uint64_t v;
    int r = parse_size(o, opt, s, &v);

    if (r < 0)
        return r;
    if (v < (1u << QCOW2_MIN_CLUSTER_BITS) ||
        v > (1u << QCOW2_MAX_CLUSTER_BITS) || (v & (v - 1)))
        return usage_error(o, "%s %s: not a power of two from 512 to 2M",
                           opt, s);
    o->qcow2_cluster_bits = (unsigned) __builtin_ctzll(v);
    return 0;
}

/* After every option (-o digest= may come last, in the fstab form): the
 * default when none named a digest is blkhash/sha256/64K. */
static int finish_digest(struct cli_options *o)
{
    int r = 0;

    if (o->fo.digest)
        r = parse_digest(o, "-o digest", o->fo.digest);
    if (r == 0 && o->fo.qcow2_cluster_size)   /* not digest's, but as late */
        r = parse_qcow2_cluster_size(o, "-o qcow2_cluster_size",
                                     o->fo.qcow2_cluster_size);
    if (r == 0 && !o->digest_opt)
        r = parse_blkhash(o, "");
    if (r == 0 && o->verify_readback && o->no_digest)
        r = usage_error(o, "--verify-readback compares with the inline "
                        "digest: not with --digest=none");
    return r;
}

/* --spool-dir DIR: absolute (the daemon leaves its directory), and a
 * directory now rather than at the first image that needs it. */
static int parse_spool_dir(struct cli_options *o, const char *dir)
{
    struct stat st;

    free(o->spool_dir);
    o->spool_dir = realpath(dir, NULL);
    if (!o->spool_dir || stat(o->spool_dir, &st) < 0)
        return usage_error(o, "--spool-dir %s: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return usage_error(o, "--spool-dir %s: not a directory", dir);
    return 0;
}

static int add_fuse_opt(struct cli_options *o, const char *opt)
{
    int r = cli_add_fuse_opts(&o->fo, opt, &o->err);

    return r < 0 ? usage_helper_error(o, r) : 0;
}

/* --tls require|on|allow|off */
static int parse_tls(struct cli_options *o, const char *arg)
{
    if (strcmp(arg, "require") == 0 || strcmp(arg, "on") == 0)
        o->nbd.tls = LIBNBD_TLS_REQUIRE;
    else if (strcmp(arg, "allow") == 0)
        o->nbd.tls = LIBNBD_TLS_ALLOW;
    else if (strcmp(arg, "off") == 0)
        o->nbd.tls = LIBNBD_TLS_DISABLE;
    else
        return usage_error(o, "--tls: '%s' is not require, allow or off",
                           arg);
    return 0;
}

/* --progress (the bar) or --progress=FD */
static int parse_progress(struct cli_options *o, const char *arg)
{
    unsigned fd;

    if (!arg) {
        o->progress_bar = true;
        return 0;
    }
    if (parse_uint(o, "--progress", arg, 0, INT_MAX, &fd) < 0)
        return -EINVAL;
    o->progress_fd = (int) fd;
    if (fcntl(o->progress_fd, F_GETFD) == -1)
        return usage_error(o, "--progress=%d: not an open file descriptor",
                           o->progress_fd);
    return 0;
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
    OPT_STATE_DIR, OPT_NO_MANIFEST, OPT_FORGET,
    OPT_QCOW2_CLUSTER_SIZE, OPT_ALL_EXPORTS, OPT_VSOCK, OPT_LIST_TIMEOUT,
    OPT_RAW_IMAGES, OPT_FUSE_IO_URING,
};

/* "-": options anywhere, each operand returned in order as option 1
 * (cli_parse_args() collects them); ":": a missing value is ':'. */
#define SHORT_OPTIONS "-:C:o:P:rfvVds"

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
    { "raw-images", no_argument, NULL, OPT_RAW_IMAGES },
    { "spool-dir", required_argument, NULL, OPT_SPOOL_DIR },
    { "state-dir", required_argument, NULL, OPT_STATE_DIR },
    { "no-manifest", no_argument, NULL, OPT_NO_MANIFEST },
    { "forget", no_argument, NULL, OPT_FORGET },
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
    { "list-timeout", required_argument, NULL, OPT_LIST_TIMEOUT },
    { "all-exports", no_argument, NULL, OPT_ALL_EXPORTS },
    { "vsock", no_argument, NULL, OPT_VSOCK },
    { "log-file", required_argument, NULL, OPT_LOG_FILE },
    { "fuse-help", no_argument, NULL, OPT_FUSE_HELP },
    { "fuse-io-uring", no_argument, NULL, OPT_FUSE_IO_URING },
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

static int set_mode(struct cli_options *o, enum nbdx_mode m)
{
    int r = cli_set_mode(&o->nbd, &o->mode_set, m, &o->err);

    return r < 0 ? usage_helper_error(o, r) : 0;
}

static int parse_server(struct cli_options *o, int argc, char **argv)
{
    int r;

    if (o->vsock_flag) {
        char *v[4] = { "--vsock", argc > 0 ? argv[0] : NULL,
                       argc > 1 ? argv[1] : NULL, NULL };
        if (o->mode_set)
            return usage_error(o, "only one of --command, "
                               "--socket-activation, --unix, --tcp, --fd "
                               "and --vsock may be given");
        r = cli_vsock_uri(argc + 1, v, &o->vsock_uri, &o->err);
        if (r < 0)
            return usage_helper_error(o, r);
        argc = 1;
        argv = &o->vsock_uri;
    }
    r = cli_parse_server(&o->nbd, &o->mode_set, argc, argv, &o->err);
    return r < 0 ? usage_helper_error(o, r) : 0;
}

/* Checks happen here, before anything forks, connects or mounts.  A
 * refused mountpoint is not a usage mistake: its message stands alone. */
static int parse_mountpoint(struct cli_options *o, const char *arg)
{
    return cli_parse_mountpoint(arg, FS_STATUS_NAME, o->fo.nonempty, &o->mp,
                                &o->err);
}

/* --long-options, --short-options: for the bash completion script, from
 * the same tables getopt uses. */
static void list_long_options(void)
{
    optlist_long(long_options);
}

static void fuse_help(void)
{
    printf("FUSE options for -o (libfuse %s), besides nbdferry's own\n"
           "(nonempty, digest=SPEC, uid=N, gid=N, block_device,\n"
           "kernel_cache):\n",
           fuse_pkgversion());
    fflush(stdout);
    fuse_lowlevel_help();
}

static void version(void)
{
    struct nbd_handle *h = nbd_create();

    printf("%s %s\n", PACKAGE_NAME, PACKAGE_VERSION);
    if (h)
        printf("libnbd %s\n", nbd_get_version(h));
    printf("libfuse %s\n", fuse_pkgversion());
    /* Tests decide what to expect of a server from this line. */
    printf("NBD extended headers: %s\n",
           HAVE_NBD_EXTENDED_HEADERS ? "built in" : "not built (libnbd < 1.18)");
    nbd_close(h);
}

void cli_print(enum cli_action a)
{
    switch (a) {
    case CLI_HELP: cli_usage(); break;
    case CLI_VERSION: version(); break;
    case CLI_FUSE_HELP: fuse_help(); break;
    case CLI_LONG_OPTIONS: list_long_options(); break;
    case CLI_SHORT_OPTIONS: optlist_short(SHORT_OPTIONS); break;
    default: break;
    }
}

static int unknown_option(struct cli_options *o, int optopt_,
                          const char *arg)
{
    if (optopt_ && optopt_ < 256)
        return usage_error(o, "invalid option -- '%c'", optopt_);
    const char *hint = cli_suggest_option(arg, long_options);
    if (hint)
        return usage_error(o, "unrecognized option '%s' (did you mean "
                           "--%s?)", arg, hint);
    return usage_error(o, "unrecognized or incomplete option '%s'", arg);
}

/* mount.fuse3 (fstab: "nbdferry#URI /mnt fuse3 ..." or "URI /mnt
 * fuse.nbdferry ...") runs "nbdferry URI MOUNTPOINT -o OPTIONS": the
 * source first, options last.  Recognised when the first argument is a
 * URI and the second an existing directory.  1: it is (and was parsed),
 * 0: it is not, or -errno. */
static int fstab_form(struct cli_options *o, int argc, char **argv)
{
    struct stat st;
    int r;

    if (argc < 2 || !strstr(argv[0], "://") || o->mode_set ||
        o->all_exports_flag || o->vsock_flag)
        return 0;
    /* A dead mount (ENOTCONN) is the fstab form too, to be named. */
    if (stat(argv[1], &st) == -1 ? errno != ENOTCONN
        : !(S_ISDIR(st.st_mode) || S_ISREG(st.st_mode)))
        return 0;
    if (argc > 2)                 /* its -o OPTIONS are taken already */
        return usage_error(o, "unexpected '%s' after the mountpoint",
                           argv[2]);
    o->failure_status = MOUNT_EX_FAIL;
    if ((r = parse_mountpoint(o, argv[1])) < 0)
        return r;
    char *uri[] = { argv[0], NULL };
    if ((r = parse_server(o, 1, uri)) < 0)
        return r;
    o->nbd.debug = log_verbosity >= 2;
    return 1;
}

/* The options that take a value.  0, or -errno. */
static int parse_value_option(struct cli_options *o, int c, const char *arg)
{
    int r;

    switch (c) {
    case 'C':
        return parse_uint(o, "--connections", arg, 1, 64,
                          &o->nbd.connections);
    case OPT_DEPTH:
        return parse_uint(o, "--depth", arg, 1, 1024, &o->depth);
    case OPT_REQUEST_SIZE:
        if ((r = parse_size(o, "--request-size", arg, &o->request_size)) < 0)
            return r;
        if (o->request_size < 4096)
            return usage_error(o, "--request-size must be at least 4K");
        return 0;
    case OPT_POOL_SIZE:
        if ((r = parse_size(o, "--pool-size", arg, &o->pool_size)) < 0)
            return r;
        if (o->pool_size < 8192 || o->pool_size > (64ull << 30))
            return usage_error(o, "--pool-size must be between 8K and 64G");
        return 0;
    case OPT_READAHEAD:
        if ((r = parse_size(o, "--readahead", arg, &o->readahead)) < 0)
            return r;
        if (o->readahead > (64ull << 30))
            return usage_error(o, "--readahead must be at most 64G");
        return 0;
    case OPT_IDLE_MS:
        return parse_uint(o, "--idle-ms", arg, 1, 60000, &o->idle_ms);
    case OPT_TLS:
        return parse_tls(o, arg);
    case OPT_TLS_PSK_FILE:
        if (access(arg, R_OK) == -1)
            return usage_error(o, "--tls-psk-file %s: %s", arg,
                               strerror(errno));
        o->nbd.tls_psk_file = arg;
        return 0;
    case OPT_TLS_USERNAME: o->nbd.tls_username = arg; return 0;
    case OPT_TLS_CERTIFICATES:
        if (access(arg, R_OK | X_OK) == -1)
            return usage_error(o, "--tls-certificates %s: %s", arg,
                               strerror(errno));
        o->nbd.tls_certificates = arg;
        return 0;
    case OPT_RETRY_TIMEOUT:
        return parse_uint(o, "--retry-timeout", arg, 0, 86400,
                          &o->nbd.retry_timeout_s);
    case OPT_REQUEST_TIMEOUT:
        return parse_uint(o, "--request-timeout", arg, 0, 86400,
                          &o->nbd.request_timeout_s);
    case OPT_DIGEST: return parse_digest(o, "--digest", arg);
    case OPT_BLKHASH:
        if ((r = digest_named(o, "--blkhash",
                              o->blkhash && !o->no_digest)) < 0)
            return r;
        return parse_blkhash(o, arg ? arg : "");
    case OPT_VERIFY_READBACK:
        if (readback_parse_when(arg, &o->verify_readback) < 0)
            return usage_error(o, "--verify-readback=%s: not close or "
                               "unmount", arg);
        return 0;
    case OPT_PROGRESS: return parse_progress(o, arg);
    case OPT_EXPECTED_SIZE:
        return parse_size(o, "--expected-size", arg, &o->expected_size);
    case OPT_SPOOL_DIR: return parse_spool_dir(o, arg);
    case OPT_STATE_DIR:
        if (arg[0] != '/')
            return usage_error(o, "--state-dir %s: not an absolute path",
                               arg);
        free(o->state_dir);
        o->state_dir = strdup(arg);
        return o->state_dir ? 0 : usage_error(o, "out of memory");
    case OPT_SPOOL_MAX:
        return parse_size(o, "--spool-max", arg, &o->spool_max);
    case OPT_QCOW2_CLUSTER_SIZE:
        return parse_qcow2_cluster_size(o, "--qcow2-cluster-size", arg);
    case 'o': return add_fuse_opt(o, arg);
    case 'P': o->pidfile = arg; return 0;
    case OPT_LOG_FILE: o->log_file = arg; return 0;
    case OPT_LIST_TIMEOUT:
        return parse_uint(o, "--list-timeout", arg, 0, 86400,
                          &o->list_timeout_s);
    }
    return 1;                 /* not one of them */
}

/* One option.  0: go on; 1: stop, o->action says what to do; -errno. */
static int parse_option(struct cli_options *o, int c, char **argv)
{
    int r = parse_value_option(o, c, optarg);

    if (r <= 0)
        return r;
    switch (c) {
    case OPT_WRITE_THROUGH: o->write_through = true; break;
    case OPT_FUSE_IO_URING: o->fuse_io_uring = true; break;
    case OPT_NO_NODELAY: o->nbd.nodelay = false; break;
    case OPT_DEST_ZERO: o->destination_is_zero = true; break;
    case OPT_NO_EXTENTS: o->no_extents = true; break;
    case OPT_TLS_VERIFY_PEER: o->nbd.tls_verify_peer = true; break;
    case OPT_TLS_INSECURE: o->nbd.tls_insecure = true; break;
    case OPT_NO_DIGEST: return parse_digest(o, "--no-digest", "none");
    case OPT_VHD_FIXED: o->fo.vhd_fixed = true; break;
    case OPT_RAW_IMAGES: o->fo.raw_images = true; break;
    case OPT_MULTIWRITER: o->fo.multiwriter = true; break;
    case OPT_ALL_EXPORTS: o->all_exports_flag = true; break;
    case OPT_VSOCK: o->vsock_flag = true; break;
    case 'r': o->nbd.readonly = true; break;
    case 'f': o->foreground = true; break;
    case 'v': log_verbosity++; break;
    case 's': o->single_thread = true; break;
    case 'd':
        o->foreground = o->fuse_debug = true;
        log_verbosity += 2;
        break;
    case OPT_BLOCK_DEVICE: o->fo.block_device = true; break;
    case OPT_UNMOUNT:         /* --list wins, whichever comes first */
        if (o->action != CLI_LIST)
            o->action = CLI_UNMOUNT;
        break;
    case OPT_LIST: o->action = CLI_LIST; break;
    case OPT_NO_MANIFEST: o->no_manifest = true; break;
    case OPT_FORGET: o->action = CLI_FORGET; break;
    case 'V': o->action = CLI_VERSION; return 1;
    case OPT_FUSE_HELP: o->action = CLI_FUSE_HELP; return 1;
    case OPT_LONG_OPTIONS: o->action = CLI_LONG_OPTIONS; return 1;
    case OPT_SHORT_OPTIONS: o->action = CLI_SHORT_OPTIONS; return 1;
    case OPT_HELP: o->action = CLI_HELP; return 1;
    case OPT_COMMAND: return set_mode(o, NBDX_COMMAND);
    case OPT_SOCKACT: return set_mode(o, NBDX_SOCKET_ACTIVATION);
    case OPT_UNIX: return set_mode(o, NBDX_UNIX);
    case OPT_TCP: return set_mode(o, NBDX_TCP);
    case OPT_FD: return set_mode(o, NBDX_FD);
    case ':':
        return usage_error(o, "option '%s' needs a value", argv[optind - 1]);
    default:
        /* opterr is 0: one line, ours. */
        return unknown_option(o, optopt, argv[optind - 1]);
    }
    return 0;
}

static void set_defaults(struct cli_options *o)
{
    o->action = CLI_MOUNT;
    o->failure_status = EXIT_FAILURE;
    o->mp.fd = -1;
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
    o->list_timeout_s = DEFAULT_LIST_TIMEOUT;
}

/* --list URI, --unmount MOUNTPOINT: one argument each. */
static int parse_target(struct cli_options *o, int argc, char **argv)
{
    if (o->action == CLI_LIST &&
        (argc != 1 || !strstr(argv[0], "://")))
        return usage_error(o, "--list takes one URI (nbd://HOST[:PORT], "
                           "nbd+unix:///?socket=SOCKET, nbds://...)");
    if (o->action == CLI_UNMOUNT && argc != 1)
        return usage_error(o, "--unmount takes one MOUNTPOINT and nothing "
                           "else");
    if (o->action == CLI_FORGET && argc != 1)
        return usage_error(o, "--forget takes one MOUNTPOINT or URI and "
                           "nothing else");
    o->target = argv[0];
    return 0;
}

/* MOUNTPOINT --all-exports URI, or MOUNTPOINT NAME=URI ...: every disk
 * connects by URI; the names are checked here (--all-exports: by main(),
 * once the server has listed them). */
static int parse_disks(struct cli_options *o, int argc, char **argv)
{
    int r;

    if (o->mode_set)
        return usage_error(o, "several disks are each NAME=URI (or "
                           "--all-exports URI): not with --%s",
                           o->nbd.mode == NBDX_UNIX ? "unix"
                           : o->nbd.mode == NBDX_TCP ? "tcp"
                           : o->nbd.mode == NBDX_FD ? "fd" : "command");
    if (o->all_exports_flag) {
        if (argc != 1 || !strstr(argv[0], "://"))
            return usage_error(o, "--all-exports takes one URI "
                               "(nbd://HOST[:PORT], "
                               "nbd+unix:///?socket=SOCKET, ...)");
        if (disks_uri_has_export(argv[0]))
            return usage_error(o, "--all-exports %s: the URI names an "
                               "export; --all-exports mounts every export "
                               "the server lists: give the server alone "
                               "(path '/'), or mount one export as "
                               "NAME=URI", argv[0]);
        o->all_exports = argv[0];
    } else {
        r = disks_parse_named(argc, argv, &o->disks, &o->ndisks, &o->err);
        if (r == 0)
            r = disks_check_names(o->disks, o->ndisks, &o->err);
        if (r < 0)
            return usage_helper_error(o, r);
    }
    /* The first disk's URI stands for the rest where one is asked for
     * (the TLS choice, -v); each disk connects with its own. */
    char *uri[] = { o->all_exports ? argv[0] : o->disks[0].uri, NULL };
    return parse_server(o, 1, uri);
}

static bool command_mode(const struct cli_options *o)
{
    return o->mode_set && (o->nbd.mode == NBDX_COMMAND ||
                           o->nbd.mode == NBDX_SOCKET_ACTIVATION);
}

/* Options wherever they stand, as getopt users write them; the operands
 * into o->args in their order.  The server command is the exception:
 * from "[" after MOUNTPOINT, or from the first operand after MOUNTPOINT
 * with --command or --socket-activation, every argument is the
 * command's own (its options too), taken as is.  "--" ends the options.
 * 0: go on; 1: stop (o->action); -errno. */
static int collect(struct cli_options *o, int argc, char **argv)
{
    int c, r, n = 0;

    if (!(o->args = calloc((size_t) argc + 1, sizeof *o->args)))
        return usage_error(o, "out of memory");
    while (!(n > 0 && command_mode(o)) &&
           (c = getopt_long(argc, argv, SHORT_OPTIONS, long_options,
                            NULL)) != -1) {
        if (c == 1 && n > 0 && strcmp(optarg, "[") == 0) {
            optind--;             /* the command starts here */
            break;
        }
        if (c == 1) {
            o->args[n++] = optarg;
            continue;
        }
        if ((r = parse_option(o, c, argv)) != 0)
            return r;
    }
    while (optind < argc)
        o->args[n++] = argv[optind++];
    o->nargs = n;
    return 0;
}

int cli_parse_args(struct cli_options *o, int argc, char **argv)
{
    int r;

    set_defaults(o);
    opterr = 0;
    if ((r = collect(o, argc, argv)) != 0)
        return r < 0 ? r : 0;
    argc = o->nargs;              /* from here: the operands alone */
    argv = o->args;
    if (o->action == CLI_LIST || o->action == CLI_UNMOUNT ||
        o->action == CLI_FORGET)
        return parse_target(o, argc, argv);
    if (argc == 0)
        return usage_error(o, "missing the mountpoint");
    if (o->progress_bar && !o->foreground)
        return usage_error(o, "--progress draws on stderr, which a daemon "
                           "closes: add -f, or use --progress=FD");
    r = fstab_form(o, argc, argv);
    if (r != 0)
        return r < 0 ? r : finish_digest(o);
    if ((r = finish_digest(o)) < 0)
        return r;
    /* The server first: --fd N must be checked before the mountpoint's
     * pinned descriptor could take the number N. */
    if (o->all_exports_flag || disks_form(argc - 1, argv + 1))
        r = parse_disks(o, argc - 1, argv + 1);
    else
        r = parse_server(o, argc - 1, argv + 1);
    if (r == 0)
        r = parse_mountpoint(o, argv[0]);
    if (r == 0 && (o->ndisks || o->all_exports) &&
        (o->mp.file_mode || strcmp(o->mp.filename, "nbd") != 0)) {
        r = usage_error(o, "several disks mount on a directory (each disk "
                        "is a file named after it): not on %s",
                        o->mp.file_mode ? "a file" : "DIR/FILENAME");
    }
    o->nbd.debug = log_verbosity >= 2;
    return r;
}

void cli_options_free(struct cli_options *o)
{
    cli_mountpoint_free(&o->mp);
    cli_fuse_opts_free(&o->fo);
    free(o->spool_dir);
    free(o->vsock_uri);
    free(o->state_dir);
    o->spool_dir = o->vsock_uri = o->state_dir = NULL;
    disks_free(o->disks, o->ndisks);
    o->disks = NULL;
    o->ndisks = 0;
    free(o->args);
    o->args = NULL;
}
