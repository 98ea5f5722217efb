/* daemon/main.c: nbdferry — mount an NBD export as a file.  The wiring: the
 * command line is daemon/cli.c's, the daemon's start daemon/daemon.c's.
 *
 * Start-up order: parse, fork (unless -f; before any thread exists), connect,
 * create the pool, mount, write the pidfile, tell the waiting parent.  Any
 * failure before that point prints one line and exits non-zero with
 * nothing mounted.  At the end: unmount, drain, NBD flush, disconnect.
 */
#include "fs/fs.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "common/monotime.h"
#include "daemon/cli.h"
#include "daemon/daemon.h"
#include "daemon/fuseuring.h"
#include "daemon/mountlock.h"
#include "digest/digest.h"
#include "fs/fuseloop.h"
#include "fs/fusetimeout.h"
#include "fs/readback.h"
#include "daemon/stopsig.h"
#include "fs/progress.h"
#include "fs/rawfile.h"
#include "views/spool.h"
#include "transport/readahead.h"
#include "daemon/listexports.h"
#include "daemon/verdict.h"
#include "fs/warm.h"
#include "daemon/viewtable.h"
#include "fs/view.h"
#include "transport/tcpinfo.h"

#define READAHEAD_DEPTH 8               /* chunks ahead of one reader */
#define MAX_REQUEST_SIZE (32u << 20)  /* some servers drop the connection
                                       * beyond this */

#define FUSE_WORKERS 16   /* threads serving requests other than writes */

#define DIGEST_QUEUE_LIMIT (32u << 20)  /* bytes of copies waiting for the
                                         * hash: part of the daemon's
                                         * memory bound */
#define DIGEST_HOLD_BUFFERS 4   /* pool buffers of the digest's own, at
                                 * most a quarter of the pool's (and two) */

static const char *program = CLI_PROGRAM;

/* A disk's name at the start of a log line, in a mount of several. */
#define DISK_FMT "%s%s"
#define DISK_ARG(d) ((d)->fs->ndisks > 1 ? (d)->filename : ""), \
                    ((d)->fs->ndisks > 1 ? ": " : "")


/* ---- setup ----------------------------------------------------------- */

static uint64_t clamp_request_size(const struct cli_options *o,
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
static int reopen_without_extents(struct fs_disk *d, const struct cli_options *o,
                                  struct pool_config *pc)
{
    enum nbdx_mode m = o->nbd.mode;

    if (m != NBDX_URI && m != NBDX_UNIX && m != NBDX_TCP) {
        log_err("the server did not answer block status in time and this "
                "mode cannot connect again; mount with --no-extents");
        return -ETIMEDOUT;
    }
    struct nbdx_config nc = o->nbd;
    if (o->ndisks) {
        nc.uri = o->disks[d->index].uri;  /* this disk's export */
        nc.log_subject = o->disks[d->index].name;
    }
    nbdx_close(d->x);
    d->x = NULL;
    if (nbdx_open(&nc, &d->x) < 0)        /* logged */
        return -ENOTCONN;
    if (nbdx_info(d->x)->size != d->export_size) {
        log_err("the export changed size after connecting again");
        return -ENOTCONN;
    }
    log_warn("the server did not answer block status in time: connected "
             "again, mounted without it (nothing known to read as zero; "
             "--no-extents skips the wait)");
    pc->scan_extents = false;
    pc->scan_timed_out = true;
    int r = pool_create(pc, d->x, d->export_size, &d->pool);
    if (r < 0)
        log_err("cannot create the write-back pool: %s", strerror(-r));
    return r;
}

/* The digest's own pool buffers (pool_config.hold_buffers): beside the
 * writers' pool_size, so a slow hasher never takes the pipeline's. */
static unsigned digest_hold_buffers(const struct cli_options *o, size_t pool_size,
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

static int open_pool(struct fs_disk *d, const struct cli_options *o)
{
    const struct nbdx_info *info = nbdx_info(d->x);
    struct pool_config pc = {
        .request_size = clamp_request_size(o, info),
        /* One memory bound for the mount: each disk has its share. */
        .pool_size = o->pool_size / d->fs->ndisks,
        .depth = o->depth,
        .idle_ms = o->idle_ms,
        .write_through = o->write_through,
        .destination_is_zero = o->destination_is_zero,
        .scan_extents = !o->no_extents,
        .track_touched = o->verify_readback != READBACK_OFF,
        /* Survive a server restart: acknowledged writes kept until a
         * flush covers them, resent after a reconnect; a flush at least
         * every 10 s and every GiB, so that window stays small. */
        .retain = true,
        .flush_interval_ms = POOL_FLUSH_INTERVAL_MS,
        .flush_bytes = POOL_FLUSH_BYTES,
        /* The manifest's record of what is durable (fs/warm.c). */
        .on_durable = o->no_manifest || o->fo.multiwriter || d->readonly
                      ? NULL : warm_on_durable,
        .durable_opaque = d,
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
    int r = pool_create(&pc, d->x, d->export_size, &d->pool);
    if (r == -ETIMEDOUT) {
        r = reopen_without_extents(d, o, &pc);
        if (r < 0)
            return r;             /* logged */
    } else if (r < 0) {
        log_err(DISK_FMT "cannot create the write-back pool: %s",
                DISK_ARG(d), strerror(-r));
        return r;
    }
    /* Read requests as large as write requests, as many ahead of one
     * reader as the write side keeps in flight per connection. */
    r = ra_create(d->pool, (size_t) (o->readahead / d->fs->ndisks),
                  pc.request_size,
                  READAHEAD_DEPTH, &d->ra);
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

/* Mount what daemon/cli.c checked (THE PIN there).  As root, through
 * /proc/self/fd/N: the kernel follows it to the pinned inode, whatever
 * the path names now.  Otherwise fusermount3 mounts by path (it resolves
 * /proc/self/fd/N in its own process): the path is re-checked right
 * before and right after.  Nothing may stat the path once mounted: the
 * kernel would ask this daemon, which does not serve yet. */
static int mount_pinned(struct fuse_session *se,
                        const struct cli_mountpoint *mp)
{
    struct nbdf_err err;
    char path[64];

    if (cli_mountpoint_recheck(mp, &err) < 0) {
        log_err("%.*s", CLI_MSG_MAX - 1, err.msg);
        return -1;
    }
    bool root = geteuid() == 0;
    snprintf(path, sizeof path, "/proc/self/fd/%d", mp->fd);
    if (fuse_session_mount(se, root ? path : mp->mountpoint) == -1) {
        log_err("cannot mount on %s", mp->mountpoint);
        return -1;
    }
    if (cli_mountpoint_landed(mp, &err) < 0) {
        log_err("%.*s", CLI_MSG_MAX - 1, err.msg);
        fuse_session_unmount(se);
        return -1;
    }
    log_debug("mounted on %s through %s", mp->mountpoint,
              root ? path : "its path");
    return 0;
}

static struct fuse_session *mount_fuse(struct fs *fs,
                                      const struct cli_options *o)
{
    struct fuse_args args = FUSE_ARGS_INIT(0, NULL);
    struct fuse_session *se = NULL;

    fuse_opt_add_arg(&args, program);
    fuse_opt_add_arg(&args, "-o");
    fuse_opt_add_arg(&args, "fsname=nbdferry,subtype=nbdferry");
    bool ro = true;
    for (unsigned i = 0; i < fs->ndisks; i++)
        ro = ro && fs->disks[i].readonly;
    if (ro) {
        fuse_opt_add_arg(&args, "-o");
        fuse_opt_add_arg(&args, "ro");
    }
    if (o->fo.pass) {
        fuse_opt_add_arg(&args, "-o");
        fuse_opt_add_arg(&args, o->fo.pass);
    }
    if (o->fuse_debug)
        fuse_opt_add_arg(&args, "-d");
    if (fs->cfg.fuse_io_uring) {
        fuse_opt_add_arg(&args, "-o");
        fuse_opt_add_arg(&args, "io_uring");
    }
    /* With allow_other, other users reach the files: let the kernel
     * enforce their modes (0600), or anyone could read and write the
     * disk. */
    fs->cfg.allow_other = o->fo.pass && has_fuse_opt(o->fo.pass,
                                                 "allow_other");
    if (fs->cfg.allow_other &&
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

/* Is io_uring asked for: --fuse-io-uring, -o io_uring, or libfuse's own
 * FUSE_URING_ENABLE (daemon/fuseuring.c decides whether it is had). */
static bool uring_asked(const struct cli_options *o)
{
    const char *env = getenv("FUSE_URING_ENABLE");

    return o->fuse_io_uring ||
           (o->fo.pass && has_fuse_opt(o->fo.pass, "io_uring")) ||
           (env && atoi(env) != 0);
}

static int serve(struct fs *fs, struct fuse_session *se, bool single_thread)
{
    if (fs->cfg.fuse_io_uring)
        return fuseuring_serve(se, FUSE_WORKERS, single_thread);
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
    struct fs_disk *d = ctx;

    return pool_read(d->pool, off, buf, len);
}

/* The inline digest and the progress thread: they start once the pool
 * exists and stop after the final flush, so the last progress line
 * comes after the last reply. */
static int start_watchers(struct fs_disk *d, const struct cli_options *o)
{
    /* The bar and the progress lines are one disk's: with several, the
     * status file has each disk's progress. */
    bool one = d->fs->ndisks == 1;
    size_t queue = DIGEST_QUEUE_LIMIT / d->fs->ndisks;
    struct progress_config pc = {
        .bar = one && o->progress_bar,
        .fd = one ? o->progress_fd : -1,
        .expected_size = o->expected_size,
        .mountpoint = o->mp.mountpoint,
    };
    struct pool_stats ps;
    pool_get_stats(d->pool, &ps);
    int r = o->no_digest ? 0
          : o->blkhash ? digest_create_blkhash(queue, o->blkhash_md,
                                               o->blkhash_block, &d->digest)
                       : digest_create(queue, &d->digest);
    if (r == 0) {
        digest_set_hold_limit(d->digest, digest_hold_limit(&ps));
        digest_set_reader(d->digest, digest_read_disk, d, d->export_size);
        /* Blocks a pass never wrote, from the manifest (fs/warm.h). */
        digest_set_filler(d->digest, warm_fill, d);
    }
    if (r == 0)
        r = readback_create(o->verify_readback,
                            o->blkhash ? o->blkhash_md : NULL,
                            o->blkhash_block, !o->no_extents,
                            &d->readback);
    if (r == 0)
        r = progress_create(d, &pc, &d->progress);
    /* Stall diagnostics: TCP_INFO every 10 ms, on TCP connections. */
    if (r == 0 && nbdx_info(d->x)->tcp)
        r = tcpinfo_start(nbdx_conn_fd, d->x, nbdx_connections(d->x), 10,
                          &d->tcp);
    if (r < 0)
        log_err("cannot start the digest and progress threads: %s",
                strerror(-r));
    return r;
}

static void stop_watchers(struct fs_disk *d)
{
    struct digest_info di;

    progress_destroy(d->progress);
    d->progress = NULL;
    if (d->tcp) {
        struct tcpinfo_stats t;
        tcpinfo_get(d->tcp, &t);
        log_info("tcp: %" PRIu64 " samples, %" PRIu64 " with sub-MSS data "
                 "unsent behind unacknowledged segments", t.samples,
                 t.nagle_stalls);
        tcpinfo_stop(d->tcp);
        d->tcp = NULL;
    }
    digest_get(d->digest, rawfile_size(d), &di);
    struct pool_stats st;
    pool_get_stats(d->pool, &st);
    /* The digest is of what was written, not of what a failed or lost
     * request left on the disk. */
    if (di.state == DIGEST_COMPLETE && !st.nfailures)
        log_info("inline %s of %s: %s", di.algorithm, d->filename, di.hex);
    readback_destroy(d->readback);
    d->readback = NULL;
    digest_destroy(d->digest);
    d->digest = NULL;
}

#define FINISH_ZEROING_NOTICE (1ull << 30)  /* seconds of zeroing, or more */

/* The only failures were writes counted lost at a reconnect: with
 * --verify-readback, read the whole disk back; if it holds every byte
 * written, the server kept them and the mount's verdict is clean. */
static bool forgive_lost(struct fs_disk *d, const struct pool_stats *st)
{
    if (!d->readback || st->errors != st->errors_lost || st->flush_failed)
        return false;
    log_notice("%" PRIu64 " write(s) counted lost at a reconnect: reading "
               "the disk back to see whether the server kept them",
               st->errors_lost);
    if (readback_at_unmount(d) < 0 || pool_forgive_lost(d->pool) < 0)
        return false;
    log_notice("the read-back found every byte written on the disk: the "
               "writes counted lost at the reconnect were kept");
    return true;
}

/* Drain and flush after the mount is gone.  Returns the exit status: 1
 * if any failure is left unrepaired (the disk may not hold what was
 * written), 0 when every failed range was written again (or zeroed)
 * successfully, with a notice saying so. */
static int finish(struct fs_disk *d)
{
    struct pool_stats st;

    /* A long zeroing says so before it starts (daemon/stopsig.c). */
    pool_get_stats(d->pool, &st);
    if (st.pending_zero >= FINISH_ZEROING_NOTICE && stopsig_started())
        log_notice("zeroing %" PRIu64 " bytes before exiting; a second "
                   "SIGTERM or SIGINT abandons it", st.pending_zero);
    warm_settle_begin(d);         /* the manifest's cut blocks: zeroed now */
    int r = pool_flush(d->pool);
    warm_settle_end(d);
    pool_get_stats(d->pool, &st);
    if (st.unrepaired && r == 0 && forgive_lost(d, &st))
        pool_get_stats(d->pool, &st);
    if (st.unrepaired || r < 0) {
        const struct pool_failure *f = NULL;
        for (unsigned i = 0; i < st.nfailures && !f; i++)
            if (!st.failures[i].repaired)
                f = &st.failures[i];
        log_err(DISK_FMT "%" PRIu64 " NBD request(s) failed during this "
                "mount and %" PRIu64 " byte(s) in %" PRIu64 " range(s)%s were not "
                "repaired; the disk may not hold what was written (first: "
                "%s of %" PRIu64 " bytes at %" PRIu64 ")", DISK_ARG(d),
                st.errors, st.damaged_bytes, st.damaged_ranges,
                st.flush_failed ? " and the last flush" : "",
                !f ? "flush" : f->lost ? "lost write"
                   : pool_kind_name(f->kind),
                f ? f->len : 0, f ? f->off : 0);
        return EXIT_FAILURE;
    }
    if (st.errors)
        log_notice(DISK_FMT "%" PRIu64 " NBD request(s) failed during "
                   "this mount; every range they left wrong was written "
                   "again successfully (%" PRIu64 " repaired)", DISK_ARG(d),
                   st.errors,
                   st.repairs);
    if (readback_at_unmount(d) < 0)          /* --verify-readback */
        return EXIT_FAILURE;
    log_info(DISK_FMT "unmounted: %" PRIu64 " bytes written, %" PRIu64
             " acknowledged", DISK_ARG(d), st.bytes_written, st.bytes_acked);
    return EXIT_SUCCESS;
}

/* A mistake on the command line: one line (cut to CLI_MSG_MAX - 1
 * bytes), exit 1 (or a refused mountpoint: one line, the command line's
 * failure status). */
static void __attribute__((noreturn))
cli_exit(const struct cli_options *o, bool usage_mistake, const char *msg)
{
    int n = CLI_MSG_MAX - 1;

    if (usage_mistake)
        fprintf(stderr, "%s: %.*s (see %s --help)\n", program, n, msg,
                program);
    else
        fprintf(stderr, "%s: %.*s\n", program, n, msg);
    exit(usage_mistake ? EXIT_FAILURE : o->failure_status);
}

/* Parse the command line; do at once what is not a mount. */
static void command_line(struct cli_options *o, int argc, char **argv)
{
    if (cli_parse_args(o, argc, argv) < 0)
        cli_exit(o, o->usage_mistake, o->err.msg);
    switch (o->action) {
    case CLI_MOUNT:
        return;
    case CLI_LIST: {
        struct nbdx_config cfg = o->nbd;   /* its TLS options too */
        cfg.mode = NBDX_URI;
        cfg.uri = o->target;
        exit(list_exports(&cfg, o->list_timeout_s));
    }
    case CLI_UNMOUNT:
        exit(verdict_unmount(o->target, o->pidfile));
    case CLI_FORGET: {
        struct warm_config wc = { .state_dir = o->state_dir };
        struct stat st;
        CLEANUP_FREE char *key = NULL;
        if (stat(o->target, &st) < 0 || !S_ISDIR(st.st_mode)) {
            /* A URI: the key its manifest is kept under. */
            struct nbdx_config nc = o->nbd;
            struct nbdx *x;
            nc.mode = NBDX_URI;
            nc.uri = o->target;
            if (nbdx_open(&nc, &x) < 0)
                exit(EXIT_FAILURE);       /* logged */
            key = mountlock_record_key(x, &nc);
            nbdx_close(x);
        }
        exit(warm_forget(o->target, &wc, key));
    }
    default:
        cli_print(o->action);
        exit(EXIT_SUCCESS);
    }
}

/* Before the fork: the pidfile's directory and the log file (a relative
 * path names the start directory). */
static void prepare(struct cli_options *o, struct daemon *d)
{
    char msg[CLI_MSG_MAX];
    int r = daemon_prepare(d, o->pidfile);

    if (r < 0) {
        snprintf(msg, sizeof msg, "--pidfile %s: %s", o->pidfile,
                 strerror(-r));
        cli_exit(o, true, msg);
    }
    log_set_context(o->mp.mountpoint);   /* syslog lines name the mount */
    if (o->log_file && (r = log_set_file(o->log_file)) < 0) {
        snprintf(msg, sizeof msg, "--log-file %s: %s", o->log_file,
                 r == -EPERM ? "not a regular file of ours with one link "
                 "(a planted link is never followed)" : strerror(-r));
        cli_exit(o, true, msg);
    }
}

/* Export names[i] as a disk, unless its name cannot be a file name or
 * clashes with one kept before it: then skipped with a warning naming
 * it, so that one odd export does not keep the others from mounting.
 * 1 kept, 0 skipped, -1 out of memory. */
static int add_listed(struct cli_options *o, char *name)
{
    struct nbdf_err err;
    struct cli_disk *d = &o->disks[o->ndisks];
    int r = 0;

    *d = (struct cli_disk){ .name = name,
                            .uri = disks_export_uri(o->all_exports, name) };
    if (!d->uri)
        return -1;
    r = disks_check_names(d, 1, &err);
    for (unsigned j = 0; r == 0 && j < o->ndisks; j++) {
        struct cli_disk pair[2] = { o->disks[j], *d };
        r = disks_check_names(pair, 2, &err);
    }
    if (r < 0) {
        log_warn("--all-exports %s: export '%s' skipped: %.*s",
                 o->all_exports, name, CLI_MSG_MAX - 1, err.msg);
        free(d->name);
        free(d->uri);
        return 0;
    }
    o->ndisks++;
    return 1;
}

/* --all-exports URI: the server's list, as NAME=URI disks, checked. */
static void list_all_exports(struct cli_options *o)
{
    char **names;
    size_t n;

    if (list_export_names(&o->nbd, o->list_timeout_s, &names, &n) < 0)
        exit(o->failure_status);                /* logged */
    if (!(o->disks = calloc(n, sizeof *o->disks)))
        cli_exit(o, false, "out of memory");
    for (size_t i = 0; i < n; i++)
        if (add_listed(o, names[i]) < 0)
            cli_exit(o, false, "out of memory");
    free(names);
    if (o->ndisks == 0) {
        char line[CLI_MSG_MAX];
        snprintf(line, sizeof line, "--all-exports %s: no export has a "
                 "name that can be a file name (see the warnings above)",
                 o->all_exports);
        cli_exit(o, false, line);
    }
}

/* The mount's configuration, from the command line. */
static void set_config(struct fs_config *c, const struct cli_options *o)
{
    c->file_mode = o->mp.file_mode;
    c->block_device = o->fo.block_device;
    c->vhd_fixed = o->fo.vhd_fixed;
    c->raw_images = o->fo.raw_images;
    c->mountpoint = o->mp.mountpoint;
    c->multiwriter = o->fo.multiwriter;
    c->spool_dir = o->spool_dir;
    c->spool_max = o->spool_max ? o->spool_max : SPOOL_MAX_DEFAULT;
    c->qcow2_cluster_bits = o->qcow2_cluster_bits ? o->qcow2_cluster_bits
                                                  : FS_QCOW2_CLUSTER_BITS_DEFAULT;
    c->uid = o->fo.set_uid ? (uid_t) o->fo.uid : getuid();
    c->gid = o->fo.set_gid ? (gid_t) o->fo.gid : getgid();
    clock_gettime(CLOCK_REALTIME, &c->started);
}

/* Connect disk d and name its files.  -1, logged. */
static int open_disk(struct fs_disk *d, const struct cli_options *o)
{
    struct nbdx_config nc = o->nbd;

    if (o->ndisks) {
        nc.mode = NBDX_URI;
        nc.uri = o->disks[d->index].uri;
        nc.log_subject = o->disks[d->index].name;
    }
    d->filename = o->ndisks ? o->disks[d->index].name : o->mp.filename;
    if (nbdx_open(&nc, &d->x) < 0)
        return -1;
    const struct nbdx_info *info = nbdx_info(d->x);
    d->export_size = info->size;
    d->apparent_size = info->size;
    d->readonly = info->readonly;
    rawfile_init_times(d);
    pthread_rwlock_init(&d->size_lock, NULL);
    if (fs_views_init(d) < 0) {
        log_err("out of memory");
        return -1;
    }
    log_info(DISK_FMT "export: %" PRIu64 " bytes, %u connection(s)%s%s%s",
             DISK_ARG(d), info->size, info->connections,
             info->tcp ? ", tcp" : "",
             info->can_zero ? ", write-zeroes" : "",
             info->can_fast_zero ? ", fast-zero" : "");
    return 0;
}

/* Each disk after its drain and flush: its status in ds[], the mount's
 * returned (a failure on any disk fails the mount). */
static int finish_all(struct fs *fs, int *ds)
{
    int status = EXIT_SUCCESS;

    for (unsigned i = 0; i < fs->ndisks; i++) {
        ds[i] = finish(&fs->disks[i]);
        if (ds[i] != EXIT_SUCCESS) {
            status = ds[i];
            if (fs->ndisks > 1)
                log_err("disk %s: FAILED (see above)",
                        fs->disks[i].filename);
        }
    }
    return status;
}

int main(int argc, char **argv)
{
    struct cli_options o = { 0 };
    struct daemon dm = { .ready_fd = -1 };
    struct fs fs = { .views = nbdferry_views };
    struct mountlock **ml = NULL;
    struct pool **pools = NULL;
    int status = EXIT_FAILURE, *ds = NULL;
    bool mounted = false;             /* the verdict is of a mount */
    unsigned opened = 0, pooled = 0, n;

    log_set_program(program);
    signal(SIGPIPE, SIG_IGN);
    command_line(&o, argc, argv);
    status = o.failure_status;
    if (o.all_exports)
        list_all_exports(&o);         /* before anything is started */
    disks_sort(o.disks, o.ndisks);    /* every list of them by name */
    n = o.ndisks ? o.ndisks : 1;
    fs.disks = calloc(n, sizeof *fs.disks);
    ml = calloc(n, sizeof *ml);
    pools = calloc(n, sizeof *pools);
    ds = calloc(n, sizeof *ds);
    if (!fs.disks || !ml || !pools || !ds)
        cli_exit(&o, false, "out of memory");
    fs.ndisks = n;
    prepare(&o, &dm);
    fusetimeout_fit(&o.nbd);            /* before any connection opens */
    if (!o.foreground)
        daemon_fork(&dm);
    set_config(&fs.cfg, &o);
    pthread_mutex_init(&fs.lock, NULL);
    mono_cond_init(&fs.h.released);
    if (o.fo.kernel_cache)
        log_info("-o kernel_cache: ignored, every file is direct I/O (the "
                 "write-back pool must see each write)");
    for (unsigned i = 0; i < n; i++) {
        struct fs_disk *d = &fs.disks[i];
        struct nbdx_config nc = o.nbd;

        *d = (struct fs_disk) { .fs = &fs, .cfg = &fs.cfg, .index = i };
        if (o.ndisks)
            nc.uri = o.disks[i].uri;
        opened = i + 1;
        if (open_disk(d, &o) < 0)
            goto out_nbd;
        /* After the fork (the lock file names the daemon's pid) and the
         * handshake (the key is the connected peer), before anything is
         * written: a second writable mount of an export stops here. */
        if (!o.nbd.readonly && !o.fo.multiwriter &&
            mountlock_take(d->x, &nc, o.mp.mountpoint, &ml[i]) < 0)
            goto out_nbd;
    }
    for (unsigned i = 0; i < n; i++) {
        struct nbdx_config nc = o.nbd;
        /* -o multiwriter: another mount may write the export, which
         * the manifest would not see. */
        struct warm_config wc = { .off = o.no_manifest || o.fo.multiwriter,
                                  .state_dir = o.state_dir };
        if (o.ndisks)
            nc.uri = o.disks[i].uri;
        if (open_pool(&fs.disks[i], &o) < 0)
            goto out_pool;
        pools[i] = fs.disks[i].pool;
        pooled = i + 1;
        /* Before anything is written: the trust check reads the disk. */
        {
            CLEANUP_FREE char *key = mountlock_record_key(fs.disks[i].x, &nc);
            warm_open(&fs.disks[i], &wc, key);
        }
        struct timespec t;
        if (warm_stored_mtime(&fs.disks[i], &t))
            rawfile_set_mtime(&fs.disks[i], &t);
        if (start_watchers(&fs.disks[i], &o) < 0)
            goto out_pool;
    }
    fs.cfg.fuse_io_uring = fuseuring_wanted(uring_asked(&o));
    struct fuse_session *se = mount_fuse(&fs, &o);
    if (!se)
        goto out_pool;
    mounted = true;
    if (daemon_write_pidfile(&dm) < 0)
        goto out_unmount;                 /* logged */
    if (stopsig_start(se, pools, n) < 0)  /* libfuse's handlers stay */
        log_info("a second stop signal will not abandon the final drain");
    daemon_detach(&dm);
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
     * second stop signal that abandons the zeroing (daemon/stopsig.c). */
    if (!stopsig_started()) {
        signal(SIGTERM, SIG_IGN);
        signal(SIGINT, SIG_IGN);
        signal(SIGHUP, SIG_IGN);
    }
    if (status == EXIT_SUCCESS)
        status = finish_all(&fs, ds);
    else
        for (unsigned i = 0; i < n; i++)
            ds[i] = status;
    if (pooled == n && mounted)           /* nothing mounted: no copy */
        verdict_log(&fs, status, ds);     /* for every log asked for */
    if (pooled == n) {
        verdict_write(&fs, status, ds);   /* for nbdferry --unmount */
    }
    for (unsigned i = 0; i < pooled; i++) {
        stop_watchers(&fs.disks[i]);
        struct timespec t;
        bool set;
        rawfile_stored_mtime(&fs.disks[i], &t, &set);
        warm_close(&fs.disks[i], &t, set);     /* after the final flush */
        pool_destroy(fs.disks[i].pool);
    }
    stopsig_stop();
out_nbd:
    fs_close_all(&fs);
    for (unsigned i = 0; i < opened; i++) {
        ra_destroy(fs.disks[i].ra);   /* after pool_destroy(): no read in
                                       * flight */
        fs_views_fini(&fs.disks[i]);
        nbdx_close(fs.disks[i].x);
        mountlock_release(ml[i]);
    }
    daemon_fini(&dm);          /* the pidfile, if it still holds our pid */
    free(fs.disks);
    free(ml);
    free(pools);
    free(ds);
    log_flush();              /* its lines name the mountpoint: before o goes */
    log_set_context(NULL);
    cli_options_free(&o);
    return status;
}
