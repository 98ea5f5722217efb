/* daemon/cli.h: the daemon's command line.
 *
 * cli_parse_args() (daemon/cli.c) reads the whole command line into struct
 * cli_options: the option table, the defaults, every check that can be
 * made before anything forks, connects or mounts.  It prints nothing and
 * exits nowhere: a mistake comes back as one line in o->err for main() to
 * print.
 *
 * Below it, the helpers it is built from (daemon/cliargs.c, daemon/mountpoint.c),
 * without side effects beyond stat()/fcntl() checks: each returns 0 or
 * -errno and, on error, writes the one-line message into err (a 'struct
 * nbdf_err', common/err.h; may be NULL: no message), as nbdf_errf()
 * does.  Kept apart from cli.c so that they can be fuzzed
 * (tests/fuzz/fuzz-cli.c). */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "digest/blkhash.h"
#include "common/err.h"
#include "daemon/disks.h"
#include "fs/readback.h"
#include "transport/nbdx.h"

/* A command-line message is printed cut to CLI_MSG_MAX - 1 bytes (its
 * struct nbdf_err holds more). */
#define CLI_MSG_MAX 512
#define CLI_PROGRAM "nbdferry"

/* The defaults (daemon/cli.c sets them, daemon/usage.c shows them). */
#define DEFAULT_CONNECTIONS 4
#define DEFAULT_DEPTH 8
#define DEFAULT_REQUEST_SIZE (2u << 20)
#define DEFAULT_POOL_SIZE (64u << 20)
#define DEFAULT_READAHEAD (64u << 20)   /* read-ahead memory, all readers */
#define DEFAULT_IDLE_MS 10
#define DEFAULT_RETRY_TIMEOUT 60
#define DEFAULT_LIST_TIMEOUT 60     /* --list, --all-exports: the whole
                                     * listing, however many exports */
#define DEFAULT_REQUEST_TIMEOUT 30    /* NBD flush of a large dirty cache
                                       * can take seconds; 30 s rides out
                                       * that and short stalls, and a dead
                                       * server is noticed in half a
                                       * minute */

/* "SIZE" with an optional K/M/G/T suffix (powers of 1024), optionally
 * followed by "i", "B" or "iB".  -EINVAL: not a size; -ERANGE: too large. */
int cli_parse_size(const char *opt, const char *s, uint64_t *out,
                   struct nbdf_err *err);

/* A decimal number in [min, max].  -EINVAL: not a number; -ERANGE: out of
 * range. */
int cli_parse_uint(const char *opt, const char *s, unsigned min,
                   unsigned max, unsigned *out, struct nbdf_err *err);

/* Record the connection mode; -EINVAL if a different one was set. */
int cli_set_mode(struct nbdx_config *nbd, bool *mode_set, enum nbdx_mode m,
                 struct nbdf_err *err);

/* The arguments after MOUNTPOINT: URI, [ CMD ARGS ], --command CMD ...,
 * --unix SOCKET, --tcp HOST PORT or --fd N.  Pointers into argv are kept
 * in nbd (borrowed); "[ CMD ARGS ]" replaces the closing "]" by NULL. */
int cli_parse_server(struct nbdx_config *nbd, bool *mode_set, int argc,
                     char **argv, struct nbdf_err *err);

/* "--vsock CID PORT" (argv[0] is "--vsock") as the equivalent
 * nbd+vsock:// URI, which libnbd connects with nbd_connect_vsock().
 * *uri is malloc'd, the caller's. */
int cli_vsock_uri(int argc, char **argv, char **uri, struct nbdf_err *err);

/* MOUNTPOINT, MOUNTPOINT/FILENAME or FILE, resolved once (symlinks, ".."
 * and relative paths) and pinned (opened O_PATH|O_NOFOLLOW) before any
 * check, so that the daemon mounts exactly what was checked:
 *   DIR (a directory): the disk is DIR/nbd;
 *   DIR/FILENAME (FILENAME missing): the disk is DIR/FILENAME;
 *   FILE (an existing regular file): file mode, the disk appears over it.
 * The directory a mount would hide is refused when it is a system
 * directory (always), already a FUSE mount, not the daemon's user's (for
 * root also: in a directory another user owns, or may write to without
 * the sticky bit), or not empty (unless nonempty); a dead FUSE mount
 * (ENOTCONN) is named with the fusermount3 command that clears it.  File
 * mode's file likewise: refused in or below a system directory (/etc,
 * /usr, ...; not /dev/shm, /var/tmp, $HOME, $TMPDIR), as a FUSE mount,
 * another user's, or not empty (unless nonempty).  Every check is made
 * on the pinned descriptor (fstat, fstatfs, openat).  Reads the file
 * system, changes nothing. */
struct cli_mountpoint {
    char *mountpoint;         /* absolute; the caller frees */
    char *filename;           /* the disk file's name; the caller frees */
    bool file_mode;           /* mountpoint is the file itself */
    int fd;                   /* O_PATH|O_CLOEXEC: what was checked (mount
                               * through /proc/self/fd/FD); -1 if none */
};
int cli_parse_mountpoint(const char *arg, const char *reserved_name,
                         bool nonempty, struct cli_mountpoint *out,
                         struct nbdf_err *err);
/* Right before the mount: the path still names the pinned inode (not a
 * symlink or another file put there since).  -EAGAIN if not. */
int cli_mountpoint_recheck(const struct cli_mountpoint *m,
                           struct nbdf_err *err);
/* Right after the mount through the pin: the pinned inode is still at
 * the path (it was not renamed meanwhile).  -EAGAIN if not: unmount. */
int cli_mountpoint_landed(const struct cli_mountpoint *m,
                          struct nbdf_err *err);
void cli_mountpoint_free(struct cli_mountpoint *m);   /* closes fd */

/* -o OPTIONS: the items nbdferry handles itself are taken out, the rest
 * collected (comma-separated) for libfuse.  Repeatable; a backslash
 * escapes a comma.  -EINVAL/-ERANGE for a bad uid=/gid= value. */
struct cli_fuse_opts {
    char *pass;               /* for libfuse; NULL if none; caller frees */
    bool nonempty;            /* mount over a non-empty directory */
    bool kernel_cache;        /* accepted; every file is direct I/O */
    bool block_device;        /* O_TRUNC and truncate leave the disk */
    bool vhd_fixed;           /* FILENAME.vhd also takes fixed VHDs */
    bool raw_images;          /* the raw file takes image files as bytes */
    bool multiwriter;         /* several writers at once, a second
                               * writable mount of the export */
    char *digest;             /* digest=SPEC (the last one), or NULL */
    char *qcow2_cluster_size; /* qcow2_cluster_size=SIZE (the last), or NULL */
    bool set_uid, set_gid;    /* uid=N, gid=N: the files' owner */
    unsigned uid, gid;
};
int cli_add_fuse_opts(struct cli_fuse_opts *fo, const char *arg,
                      struct nbdf_err *err);
void cli_fuse_opts_free(struct cli_fuse_opts *fo);

/* For an unknown "--NAME[=VALUE]", the long option it is most likely a
 * typo of, or NULL. */
struct option;
const char *cli_suggest_option(const char *arg, const struct option *opts);

/* ---- the command line (daemon/cli.c) ------------------------------------ */

/* What the command line asks for.  Everything but CLI_MOUNT is done by
 * main() at once: cli_print() for the texts, daemon/listexports.c for
 * --list, daemon/verdict.c for --unmount. */
enum cli_action {
    CLI_MOUNT,
    CLI_HELP, CLI_VERSION, CLI_FUSE_HELP, CLI_LONG_OPTIONS,
    CLI_SHORT_OPTIONS,
    CLI_LIST,                 /* --list URI: target is the URI */
    CLI_UNMOUNT,              /* --unmount MOUNTPOINT: target */
    CLI_FORGET,               /* --forget MNT|URI: target */
};

/* The whole command line, as parsed.  Strings are borrowed from argv
 * unless marked; cli_options_free() frees the rest. */
struct cli_options {
    enum cli_action action;
    const char *target;       /* --list, --unmount: their argument */
    struct nbdx_config nbd;
    bool mode_set;
    unsigned depth;
    uint64_t request_size, pool_size;
    uint64_t readahead;       /* --readahead SIZE; 0: off */
    unsigned idle_ms;
    bool write_through, destination_is_zero, no_extents;
    struct cli_fuse_opts fo;  /* -o: ours taken out, the rest libfuse's */
    const char *pidfile;
    bool foreground, single_thread, fuse_debug;
    bool fuse_io_uring;       /* --fuse-io-uring (daemon/fuseuring.c) */
    char *vsock_uri;          /* --vsock CID PORT, as an nbd+vsock URI;
                               * owned */
    struct cli_mountpoint mp; /* owned */
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
    char *spool_dir;          /* --spool-dir, absolute; NULL: $TMPDIR;
                               * owned */
    uint64_t spool_max;       /* --spool-max; 0: SPOOL_MAX_DEFAULT */
    char *state_dir;          /* --state-dir, absolute; NULL: the
                               * default (fs/warm.h); owned */
    bool no_manifest;         /* --no-manifest */
    unsigned qcow2_cluster_bits;  /* --qcow2-cluster-size, as log2; 0: 64K */
    const char *log_file;     /* --log-file FILE */
    /* Several disks (daemon/disks.h): MOUNTPOINT NAME=URI ..., or
     * MOUNTPOINT --all-exports URI (the names and URIs filled in by
     * main() from the server's list).  ndisks 0: the one-disk form. */
    struct cli_disk *disks;   /* owned */
    unsigned ndisks;
    const char *all_exports;  /* --all-exports URI, or NULL */
    bool all_exports_flag;    /* --all-exports seen (its URI is an operand) */
    bool vsock_flag;          /* --vsock seen (CID PORT are operands) */
    unsigned list_timeout_s;  /* --list-timeout: the whole listing of
                               * --list and --all-exports; 0: no limit */
    char **args;              /* the operands, options taken out (owned
                               * array, borrowed strings) */
    int nargs;

    /* The exit status of a failed mount: mount(8)'s 32 in the fstab form
     * ("nbdferry URI MOUNTPOINT -o OPTIONS", as mount.fuse3 runs it), 1
     * otherwise.  A usage mistake always exits 1. */
    int failure_status;
    /* On a negative return: the one line to print (cut to CLI_MSG_MAX - 1
     * bytes), and whether it is a usage mistake (printed with "(see
     * nbdferry --help)", exit 1) or a refused mountpoint (printed alone,
     * exit failure_status). */
    struct nbdf_err err;
    bool usage_mistake;
};

/* Parse argv into *o (zeroed by the caller).  0, with o->action set, or
 * -errno with o->err.  Sets log_verbosity (-v, -d) as it goes. */
int cli_parse_args(struct cli_options *o, int argc, char **argv);

/* The texts of CLI_HELP, CLI_VERSION, CLI_FUSE_HELP, CLI_LONG_OPTIONS and
 * CLI_SHORT_OPTIONS, on stdout. */
void cli_print(enum cli_action a);

void cli_options_free(struct cli_options *o);

/* daemon/usage.c: the --help text, on stdout. */
void cli_usage(void);
