/* fs/readback.c: read-back verification (readback.h).
 *
 * THREAD MODEL
 * A verification runs on the thread that asks for it (a FUSE worker in
 * close/fsync, main() at unmount); rb->run serializes them.  It drives
 * the verify library's reader (digest/verify-reader.h) and sink
 * (digest/verify-sink.h) on that thread; the blkhash sink hashes on its hasher threads.  The
 * reads go to nbdx directly; their done() runs on nbdx I/O threads and
 * only publishes the entry (vr_done) and signals run->cond under
 * run->lock.  The block status extent callback runs inside libnbd on an
 * I/O thread while the verifying thread waits in nbdx_run(): it only
 * appends to run->ext.  rb->lock protects the status fields (read by
 * the status file's opener); it is never held across I/O.  Lock order:
 * rb->run, then rb->lock; run->lock is a leaf.
 *
 * THE READ
 * [0, size) is the file the digest covers; [size, export) must read as
 * zero (the sink's tail check).  The reader cuts the disk in order into
 * the server's zero extents (block status, in windows of at most
 * 32 MiB), trusted only where this mount never wrote (rb_must_read),
 * and data reads of at most READBACK_CHUNK bytes, READBACK_SLOTS of
 * them in flight; the sink sees the disk as one stream.
 */
#include "fs/fs.h"
#include "fs/readback.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <libnbd.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "digest/blkhash.h"
#include "common/cleanup.h"
#include "common/json.h"
#include "common/log.h"
#include "common/monotime.h"
#include "common/vector.h"
#include "digest/digest.h"
#include "digest/verify-reader.h"
#include "digest/verify-sink.h"

#define BS_WINDOW (32u << 20)         /* block status request length */
#define MAX_REGIONS (1u << 18)        /* fingerprints: 2 MiB a side */
#define RANGES_SHOWN 16
#define SETTLE_S 120                  /* wait for the digest thread */

enum rb_state {
    RB_IDLE, RB_RUNNING, RB_PASSED, RB_FAILED, RB_ERROR, RB_SKIPPED,
    RB_INTERRUPTED,
};

static const char *state_name(enum rb_state s)
{
    static const char *n[] = { "idle", "running", "passed", "failed",
                               "error", "skipped", "interrupted" };
    return n[s];
}

struct rb_range { uint64_t off, len; };

/* What was verified: the same key twice means the disk did not change
 * through the mount in between, so the verdict stands. */
struct rb_key {
    char hex[DIGEST_HEX_MAX];
    uint64_t size, written, writes, zeroes, zeroed, skipped, errors;
};

struct readback {
    enum readback_when when;
    bool blkhash;
    bool extents;                     /* may trust block status (not
                                       * --no-extents) */
    char md[BLKHASH_NAME_MAX];
    uint64_t bs;
    pthread_mutex_t run;              /* one verification at a time */

    bool have_key;                    /* under run */
    struct rb_key key;
    int verdict;                      /* for key: 0 or -EIO */

    pthread_mutex_t lock;             /* the status fields below */
    enum rb_state state;
    unsigned runs;
    uint64_t total, done, bytes_read, reads, zero_bytes;
    double seconds;                   /* the last run's */
    char algorithm[32 + BLKHASH_NAME_MAX];
    char expected[DIGEST_HEX_MAX], got[DIGEST_HEX_MAX];
    char message[256];
    bool ranges_known;
    uint64_t nranges, range_bytes;    /* all differing ranges */
    struct rb_range ranges[RANGES_SHOWN];
    uint64_t tail_nonzero;            /* first nonzero byte past the file,
                                       * UINT64_MAX: none */
};

/* ---- the status ------------------------------------------------------ */

static void set_message(struct readback *rb, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void set_message(struct readback *rb, const char *fmt, ...)
{
    va_list ap;

    LOCK_FOR_SCOPE(&rb->lock);
    va_start(ap, fmt);
    vsnprintf(rb->message, sizeof rb->message, fmt, ap);
    va_end(ap);
}

static void set_state(struct readback *rb, enum rb_state s)
{
    LOCK_FOR_SCOPE(&rb->lock);
    rb->state = s;
}

void readback_put_status(FILE *f, struct fs_disk *d)
{
    struct readback *rb = d->readback;

    if (!rb) {
        fputs("  \"readback\": null,\n", f);
        return;
    }
    LOCK_FOR_SCOPE(&rb->lock);
    fprintf(f, "  \"readback\": {\"when\": \"%s\", \"state\": \"%s\", "
               "\"algorithm\": \"%s\", \"runs\": %u, \"verified\": %" PRIu64
               ", \"total\": %" PRIu64 ", \"bytes_read\": %" PRIu64
               ", \"reads\": %" PRIu64 ", \"zero_bytes_not_read\": %" PRIu64
               ", \"seconds\": %.3f",
            rb->when == READBACK_CLOSE ? "close" : "unmount",
            state_name(rb->state), rb->algorithm, rb->runs, rb->done,
            rb->total, rb->bytes_read, rb->reads, rb->zero_bytes,
            rb->seconds);
    if (rb->expected[0])
        fprintf(f, ", \"expected\": \"%s\"", rb->expected);
    if (rb->got[0])
        fprintf(f, ", \"read_back\": \"%s\"", rb->got);
    if (rb->state == RB_FAILED) {
        fprintf(f, ", \"ranges_known\": %s, \"differing_ranges\": %" PRIu64
                   ", \"differing_bytes\": %" PRIu64 ", \"ranges\": [",
                rb->ranges_known ? "true" : "false", rb->nranges,
                rb->range_bytes);
        for (uint64_t i = 0; i < rb->nranges && i < RANGES_SHOWN; i++)
            fprintf(f, "%s{\"offset\": %" PRIu64 ", \"length\": %" PRIu64 "}",
                    i ? ", " : "", rb->ranges[i].off, rb->ranges[i].len);
        fputc(']', f);
        if (rb->tail_nonzero != UINT64_MAX)
            fprintf(f, ", \"tail_nonzero_offset\": %" PRIu64,
                    rb->tail_nonzero);
    }
    if (rb->message[0]) {
        fputs(", \"message\": ", f);
        json_put_string(f, rb->message);
    }
    fputs("},\n", f);
}

/* ---- the sink: the verify library's (digest/verify-sink.h) ---------- */

#define HASH_WORKERS 2                /* blkhash: hasher threads */

static void lib_log(const char *line)
{
    log_err("read-back: %s", line);
}

/* [0, size) enters the digest, [size, end) must read as zero. */
static int rb_sink_init(struct sink *k, const struct readback *rb,
                        uint64_t size, uint64_t end, atomic_bool *abort)
{
    int r = sink_init(k, EVP_sha256(), size, end, 0, abort);

    if (r == 0 && rb->blkhash) {
        r = sink_blkhash(k, rb->md, rb->bs, HASH_WORKERS);
        sink_fold(k);                 /* memory bounded on any disk */
    }
    return r;
}

static void rb_sink_hex(const struct sink *k, char *hex)
{
    for (unsigned i = 0; i < k->digest_size; i++)
        snprintf(hex + 2 * i, 3, "%02x", k->digest[i]);
}

/* Regions of 2^shift blocks, at most MAX_REGIONS of them. */
static unsigned region_shift(uint64_t nblocks)
{
    unsigned shift = 0;

    while ((nblocks >> shift) >= MAX_REGIONS)
        shift++;
    return shift;
}

/* ---- the read: the library's reader over the mount's connections ---- */

struct rb_ext { uint64_t off, len; bool zero; };
DEFINE_VECTOR_TYPE(rb_ext_vector, struct rb_ext, 64);

struct rb_read {
    struct nbdx_op op;                /* first: done() finds the read */
    struct run *run;
    struct vr_ent *e;
    bool busy;                        /* under run->lock */
};

/* The reader's backend (digest/verify-reader.h). */
struct run {
    struct readback *rb;
    struct nbdx *x;
    struct pool *pool;                /* what this mount touched */
    pthread_mutex_t lock;             /* reads[].busy, in_flight, events */
    pthread_cond_t cond;
    struct rb_read reads[READBACK_SLOTS];
    unsigned in_flight;
    uint64_t events, seen;            /* completions; seen by wait() */
    struct rb_ext_vector ext;         /* a block status reply's extents */
};

static void read_done(struct nbdx_op *op, int err)
{
    struct rb_read *rd = (struct rb_read *) op;
    struct run *run = rd->run;

    LOCK_FOR_SCOPE(&run->lock);
    vr_done(rd->e, err);
    rd->busy = false;
    run->in_flight--;
    run->events++;
    pthread_cond_broadcast(&run->cond);
}

static int rb_read(void *ctx, struct vr_ent *e)
{
    struct run *run = ctx;
    struct rb_read *rd = run->reads;

    {
        LOCK_FOR_SCOPE(&run->lock);
        while (rd->busy)              /* at most READBACK_SLOTS in flight */
            rd++;
        rd->busy = true;
        run->in_flight++;
    }
    rd->e = e;
    rd->op = (struct nbdx_op) { .kind = NBDX_OP_READ, .off = e->off,
                                .len = e->len, .buf = e->buf,
                                .done = read_done };
    nbdx_submit(run->x, &rd->op);
    return 0;
}

/* timeout_ms 0: only a look; otherwise until a read completes. */
static int rb_wait(void *ctx, int timeout_ms)
{
    struct run *run = ctx;

    if (timeout_ms == 0)
        return 0;
    LOCK_FOR_SCOPE(&run->lock);
    while (run->events == run->seen && run->in_flight)
        pthread_cond_wait(&run->cond, &run->lock);
    run->seen = run->events;
    return 0;
}

static unsigned rb_in_flight(void *ctx)
{
    struct run *run = ctx;

    LOCK_FOR_SCOPE(&run->lock);
    unsigned n = run->in_flight;
    return n;
}

/* nbdx_run() takes op->opaque: the run is found from the op. */
struct bs_op {
    struct nbdx_op op;
    struct run *run;
};

/* On an nbdx I/O thread while the verifying thread waits in nbdx_run().
 * Out of memory drops the extent: the rest of the window is data. */
static void ext_cb(struct nbdx_op *op, uint64_t off, uint64_t len,
                   uint32_t flags)
{
    struct run *run = ((struct bs_op *) op)->run;

    (void) rb_ext_vector_append(&run->ext, (struct rb_ext) {
        .off = off, .len = len, .zero = (flags & LIBNBD_STATE_ZERO) != 0 });
}

/* Ask the server which of the window reads as zero.  A reply covering
 * only part of it is taken as far as it goes (the next request asks for
 * the rest); when it fails or makes no progress, the window is all data
 * (the reader's bs_retry). */
static int rb_extents(void *ctx, struct vreader *r, uint64_t off,
                      uint64_t len)
{
    struct run *run = ctx;
    struct bs_op bs = { .op = { .kind = NBDX_OP_BLOCK_STATUS,
                                .off = off, .len = len, .extent = ext_cb },
                        .run = run };
    int err = 0;

    run->ext.len = 0;
    if (nbdx_run(run->x, &bs.op) < 0)
        err = EIO;
    for (size_t i = 0; !err && i < run->ext.len; i++)
        if (vr_extent(r, run->ext.ptr[i].off, run->ext.ptr[i].len,
                      run->ext.ptr[i].zero) < 0)
            err = ENOMEM;
    vr_extents_done(r, err);
    return 0;
}

/* A zero extent is trusted only where this mount never wrote or zeroed:
 * a server that acknowledges a write-zeroes it did not do reports the
 * range as zero too, so what the daemon touched is read.  Shortens *len
 * to a run that is all touched or all untouched; true if touched. */
static bool rb_must_read(void *ctx, uint64_t off, uint64_t *len)
{
    struct run *run = ctx;
    struct pool_range t;

    if (!pool_touched_next(run->pool, off, &t) || t.start >= off + *len)
        return false;
    if (t.start > off) {
        *len = t.start - off;
        return false;
    }
    if (t.end - off < *len)
        *len = t.end - off;
    return true;
}

static void rb_read_failed(void *ctx, const struct vr_ent *e)
{
    struct run *run = ctx;

    log_err("read-back: reading %zu bytes at offset %" PRIu64 " failed: %s",
            e->len, e->off, strerror(e->err));
    set_message(run->rb, "reading %zu bytes at offset %" PRIu64
                " failed: %s", e->len, e->off, strerror(e->err));
}

static void rb_consumed(void *ctx, const struct vr_ent *e)
{
    struct readback *rb = ((struct run *) ctx)->rb;

    LOCK_FOR_SCOPE(&rb->lock);
    rb->done += e->len;
    if (!e->buf) {
        rb->zero_bytes += e->len;
    } else {
        rb->bytes_read += e->len;
        rb->reads++;
    }
}

static const struct vr_backend rb_backend = {
    .read = rb_read,
    .extents = rb_extents,
    .wait = rb_wait,
    .in_flight = rb_in_flight,
    .must_read = rb_must_read,
    .read_failed = rb_read_failed,
    .consumed = rb_consumed,
};

/* Stream the disk through k, READBACK_SLOTS reads in flight.  0 or
 * -errno (a read failed: logged). */
static int stream(struct fs_disk *d, struct sink *k)
{
    const struct nbdx_info *info = nbdx_info(d->x);
    struct run run = { .rb = d->readback, .x = d->x, .pool = d->pool };
    struct vr_config c = {
        .name = "read-back", .requests = READBACK_SLOTS,
        .request_size = READBACK_CHUNK, .bs_span = BS_WINDOW,
        .block_status = info->can_extents && d->readback->extents,
        .zero_piece = UINT64_MAX, .bs_retry = true,
    };
    struct vreader *r;

    if (info->block_max && info->block_max < c.request_size)
        c.request_size = info->block_max;
    if (info->block_max && info->block_max < c.bs_span)
        c.bs_span = info->block_max;
    pthread_mutex_init(&run.lock, NULL);
    pthread_cond_init(&run.cond, NULL);
    for (unsigned i = 0; i < READBACK_SLOTS; i++)
        run.reads[i].run = &run;
    int e = vreader_create(&c, &rb_backend, &run, k, &r);
    /* SINK_STOP (data past the file's end): read on, for the status. */
    while (e == 0 && (e = vreader_run(r)) == SINK_STOP)
        e = 0;
    if (r)
        vreader_drain(r, -1);         /* let the reads in flight land */
    vreader_free(r);
    rb_ext_vector_reset(&run.ext);
    pthread_mutex_destroy(&run.lock);
    pthread_cond_destroy(&run.cond);
    return e;
}

/* ---- naming the differences ------------------------------------------ */

struct rb_fps { const uint64_t *mine, *got; };

static bool region_differs(const void *ctx, size_t i)
{
    const struct rb_fps *f = ctx;

    return f->mine[i] != f->got[i];
}

/* blkhash: the regions whose fingerprints differ between the inline
 * digest and the read-back. */
static void name_ranges(struct fs_disk *d, struct sink *s, uint64_t size)
{
    struct readback *rb = d->readback;
    uint64_t *mine = NULL, *got = NULL, bytes = 0;
    unsigned shift = region_shift((size + rb->bs - 1) / rb->bs);
    struct verify_range *v = NULL;
    size_t n = 0, nv = 0;

    if (shift < blkhash_fp_min_shift(s->bh))
        shift = blkhash_fp_min_shift(s->bh);
    if (digest_fingerprints(d->digest, size, &shift, &mine, &n) == 0 &&
        (got = calloc(n ? n : 1, sizeof *got)) &&
        blkhash_fingerprints(s->bh, size, shift, got, n) == 0 &&
        verify_name_ranges(n, rb->bs << shift, size, region_differs,
                           &(struct rb_fps) { mine, got }, &v, &nv,
                           &bytes) == 0) {
        LOCK_FOR_SCOPE(&rb->lock);
        rb->ranges_known = true;
        rb->nranges = nv;
        rb->range_bytes = bytes;
        for (size_t i = 0; i < nv && i < RANGES_SHOWN; i++)
            rb->ranges[i] = (struct rb_range) { v[i].off, v[i].len };
    }
    free(v);
    free(mine);
    free(got);
}

/* ---- one verification ------------------------------------------------ */

static uint64_t file_size(struct fs_disk *d)
{
    LOCK_FOR_SCOPE(&d->fs->lock);
    uint64_t size = d->apparent_size;
    return size;
}

/* What the digest knows of the file. */
enum rb_cover {
    COVER_WHOLE,                      /* complete, no request failed */
    COVER_NOTHING_YET,                /* nothing written, or a pass still
                                       * being written: nothing to verify */
    COVER_CANNOT,                     /* changed, and the digest cannot say
                                       * into what: cannot be verified */
};

/* The digest as it stands, and what the pool has done; unless
 * COVER_WHOLE, why says why not. */
static enum rb_cover get_key(struct fs_disk *d, struct rb_key *k, char *why,
                             size_t n)
{
    struct digest_info di;
    struct pool_stats st;

    memset(k, 0, sizeof *k);
    k->size = file_size(d);
    digest_get(d->digest, k->size, &di);
    pool_get_stats(d->pool, &st);
    snprintf(k->hex, sizeof k->hex, "%s", di.hex);
    k->written = st.bytes_written;
    k->writes = st.requests[POOL_WRITE];
    k->zeroes = st.requests[POOL_ZERO];
    k->zeroed = st.bytes_zeroed;
    k->skipped = st.bytes_zero_skipped;
    /* Writes counted lost at a reconnect were acknowledged and hashed:
     * the digest still covers the file, and reading the disk back is how
     * to know whether the new connection's server holds them. */
    k->errors = st.errors - st.errors_lost;
    if (di.state == DIGEST_COMPLETE && !k->errors)
        return COVER_WHOLE;
    snprintf(why, n, "%s", k->errors ? "an NBD request failed"
             : di.reason[0] ? di.reason : digest_state_name(di.state));
    if (!k->errors &&
        (di.state == DIGEST_IDLE || di.state == DIGEST_COMPUTING))
        return COVER_NOTHING_YET;
    return COVER_CANNOT;
}

static void reset_status(struct readback *rb, const struct rb_key *k,
                         uint64_t total)
{
    LOCK_FOR_SCOPE(&rb->lock);
    rb->state = RB_RUNNING;
    rb->runs++;
    rb->total = total;
    rb->done = rb->bytes_read = rb->reads = rb->zero_bytes = 0;
    snprintf(rb->expected, sizeof rb->expected, "%s", k->hex);
    rb->got[0] = rb->message[0] = '\0';
    rb->ranges_known = false;
    rb->nranges = rb->range_bytes = 0;
    rb->tail_nonzero = UINT64_MAX;
}

/* Compare; 0 (same) or -EIO (differs: status, ranges and log say how). */
static int judge(struct fs_disk *d, struct sink *s, const struct rb_key *k,
                 const char *hex)
{
    struct readback *rb = d->readback;
    bool same = strcmp(hex, k->hex) == 0;
    uint64_t tail = s->tail_nonzero < 0 ? UINT64_MAX
                                        : (uint64_t) s->tail_nonzero;

    {
        LOCK_FOR_SCOPE(&rb->lock);
        snprintf(rb->got, sizeof rb->got, "%s", hex);
        rb->tail_nonzero = tail;
    }
    if (same && tail == UINT64_MAX) {
        set_state(rb, RB_PASSED);
        set_message(rb, "the disk holds what was written");
        return 0;
    }
    if (!same && rb->blkhash)
        name_ranges(d, s, k->size);
    set_state(rb, RB_FAILED);
    LOCK_FOR_SCOPE(&rb->lock);
    char first[96] = "";
    if (rb->nranges)
        snprintf(first, sizeof first, "; first %" PRIu64 " bytes at offset %"
                 PRIu64, rb->ranges[0].len, rb->ranges[0].off);
    if (!same)
        snprintf(rb->message, sizeof rb->message, "the disk differs from "
                 "what was written: read back %.16s..., expected %.16s...%s%s",
                 hex, k->hex, !rb->blkhash ? " (sha256 cannot say where: "
                 "--blkhash names the ranges)" : "", first);
    else
        snprintf(rb->message, sizeof rb->message, "the disk holds data past "
                 "the file's end (%" PRIu64 " bytes), from offset %" PRIu64,
                 k->size, tail);
    log_err("read-back: %s (%" PRIu64 " differing range(s))", rb->message,
            rb->nranges);
    for (uint64_t i = 0; i < rb->nranges && i < RANGES_SHOWN; i++)
        log_err("read-back: differs: %" PRIu64 " bytes at offset %" PRIu64,
                rb->ranges[i].len, rb->ranges[i].off);
    return -EIO;
}

static int verify_locked(struct fs_disk *d, const struct rb_key *k)
{
    struct readback *rb = d->readback;
    atomic_bool stop = false;         /* one side: nothing aborts it */
    struct sink s;
    char hex[DIGEST_HEX_MAX] = "";
    double t0 = mono_now_s();

    reset_status(rb, k, d->export_size);
    int r = rb_sink_init(&s, rb, k->size, d->export_size, &stop);
    if (r == 0 && (r = stream(d, &s)) == 0 && (r = sink_finish(&s)) == 0)
        rb_sink_hex(&s, hex);
    if (r == 0)
        r = judge(d, &s, k, hex);
    else {
        set_state(rb, RB_ERROR);
        if (!rb->message[0])
            set_message(rb, "read-back failed: %s", strerror(-r));
        log_err("read-back: %s", rb->message);
        r = -EIO;
    }
    sink_free(&s);
    LOCK_FOR_SCOPE(&rb->lock);
    rb->seconds = mono_now_s() - t0;
    return r;
}

/* The verification was asked for and cannot run: that is no pass. */
static int cannot_verify(struct readback *rb, const char *at,
                         const struct rb_key *k, const char *why)
{
    set_state(rb, RB_SKIPPED);
    if (k->errors)
        set_message(rb, "at %s: could not verify the disk: %s during this "
                    "mount (the status's failures say where); fix the "
                    "server, copy again on a new mount, or check the disk "
                    "with nbdferry-verify", at, why);
    else
        set_message(rb, "at %s: could not verify the disk: the inline "
                    "digest does not cover the file (%s); copy it again "
                    "through the raw file in one forward pass (or with "
                    "--blkhash), or check the disk with nbdferry-verify",
                    at, why);
    log_err("read-back: %s", rb->message);
    return -EIO;
}

/* Verify unless this disk state was verified already.  at: for the log.
 * final: the unmount (a pass still open there is no pass to wait for). */
static int verify(struct fs_disk *d, const char *at, bool final)
{
    struct readback *rb = d->readback;
    struct rb_key k, after;
    char why[192];
    int r;

    if (!rb)
        return 0;
    LOCK_FOR_SCOPE(&rb->run);
    if (digest_settle(d->digest, SETTLE_S) < 0)
        log_notice("read-back: the digest is still hashing after %d s",
                   SETTLE_S);
    enum rb_cover cover = get_key(d, &k, why, sizeof why);
    if (cover == COVER_NOTHING_YET && final && k.writes + k.zeroes > 0)
        cover = COVER_CANNOT;
    if (cover == COVER_NOTHING_YET) {
        set_state(rb, RB_IDLE);       /* never "passed" for a new pass */
        set_message(rb, "at %s: nothing to verify yet (%s)", at, why);
        r = 0;
    } else if (cover == COVER_CANNOT) {
        r = cannot_verify(rb, at, &k, why);
    } else if (rb->have_key && memcmp(&k, &rb->key, sizeof k) == 0) {
        r = rb->verdict;
    } else {
        r = verify_locked(d, &k);
        get_key(d, &after, why, sizeof why);
        if (memcmp(&k, &after, sizeof k) != 0) {
            /* Written meanwhile: what was read is no one's content, and
             * the writer that asked has no verdict. */
            set_state(rb, RB_INTERRUPTED);
            set_message(rb, "the file changed during the read-back: "
                        "verified again at the next close or fsync");
            log_err("read-back at %s: %s", at, rb->message);
            rb->have_key = false;
            r = -EIO;
        } else if (rb->state == RB_PASSED || rb->state == RB_FAILED) {
            rb->key = k;
            rb->have_key = true;
            rb->verdict = r;
            if (r == 0)
                log_notice("read-back at %s: %" PRIu64 " bytes match the "
                           "inline digest (%" PRIu64 " read in %.2f s)", at,
                           k.size, rb->bytes_read, rb->seconds);
        }
    }
    return r;
}

int readback_at_close(struct fs_disk *d)
{
    if (!d->readback || d->readback->when != READBACK_CLOSE)
        return 0;
    /* An empty file is a copy starting (dd's dup2 closes the O_TRUNC
     * descriptor once), not one ending: the unmount checks it. */
    if (file_size(d) == 0)
        return 0;
    return verify(d, "close", false);
}

int readback_at_unmount(struct fs_disk *d)
{
    if (!d->readback)
        return 0;
    struct readback *rb = d->readback;
    int r = verify(d, "unmount", true);

    LOCK_FOR_SCOPE(&rb->lock);
    if (r < 0)
        log_err("read-back: the disk does not hold what was written (%s); "
                "exiting 1", rb->message);
    return r;
}

/* ---- life ------------------------------------------------------------ */

int readback_parse_when(const char *s, enum readback_when *out)
{
    if (!s || !*s || strcmp(s, "close") == 0)
        *out = READBACK_CLOSE;
    else if (strcmp(s, "unmount") == 0)
        *out = READBACK_UNMOUNT;
    else
        return -EINVAL;
    return 0;
}

int readback_create(enum readback_when when, const char *md,
                    uint64_t block_size, bool extents, struct readback **out)
{
    *out = NULL;
    if (when == READBACK_OFF)
        return 0;
    struct readback *rb = calloc(1, sizeof *rb);
    if (!rb)
        return -ENOMEM;
    rb->when = when;
    rb->blkhash = md != NULL;
    rb->bs = block_size;
    rb->extents = extents;
    rb->tail_nonzero = UINT64_MAX;
    if (md)
        snprintf(rb->md, sizeof rb->md, "%s", md);
    if (md)
        snprintf(rb->algorithm, sizeof rb->algorithm, "blkhash/%s/%" PRIu64,
                 md, block_size);
    else
        snprintf(rb->algorithm, sizeof rb->algorithm, "sha256");
    pthread_mutex_init(&rb->run, NULL);
    pthread_mutex_init(&rb->lock, NULL);
    verify_set_log(lib_log);          /* before any verification runs */
    *out = rb;
    return 0;
}

void readback_destroy(struct readback *rb)
{
    if (!rb)
        return;
    pthread_mutex_destroy(&rb->run);
    pthread_mutex_destroy(&rb->lock);
    free(rb);
}
