/* fs/readback.c: read-back verification (readback.h).
 *
 * THREAD MODEL
 * A verification runs on the thread that asks for it (a FUSE worker in
 * close/fsync, main() at unmount); rb->run serializes them.  Its reads
 * go to nbdx directly; their done() runs on nbdx I/O threads and only
 * marks the slot under run->lock and signals run->cond.  The block
 * status extent callback runs inside libnbd on an I/O thread while the
 * verifying thread waits in nbdx_run(): it only appends to run->ext.
 * rb->lock protects the status fields (read by the status file's
 * opener); it is never held across I/O.  Lock order: rb->run, then
 * rb->lock; run->lock is a leaf.
 *
 * THE READ
 * [0, size) is the file the digest covers; [size, export) must read as
 * zero.  Pieces are produced in disk order: the server's zero extents
 * (block status, in windows of at most 32 MiB) as zero pieces, the rest
 * as data pieces of at most READBACK_CHUNK bytes.  A ring of
 * READBACK_SLOTS slots keeps that many reads in flight; the head slot is
 * consumed in order, so the sinks see the disk as one stream.
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

#include "common/blkhash.h"
#include "common/iszero.h"
#include "common/log.h"
#include "common/monotime.h"
#include "fs/digest.h"

#define BS_WINDOW (32u << 20)         /* block status request length */
#define MAX_REGIONS (1u << 18)        /* fingerprints: 2 MiB a side */
#define RANGES_SHOWN 16
#define SETTLE_S 120                  /* wait for the digest thread */
#define ZERO_SLAB (1u << 20)

static const unsigned char zeros[ZERO_SLAB];

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

    pthread_mutex_lock(&rb->lock);
    va_start(ap, fmt);
    vsnprintf(rb->message, sizeof rb->message, fmt, ap);
    va_end(ap);
    pthread_mutex_unlock(&rb->lock);
}

static void set_state(struct readback *rb, enum rb_state s)
{
    pthread_mutex_lock(&rb->lock);
    rb->state = s;
    pthread_mutex_unlock(&rb->lock);
}

static void put_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char) *s < 0x20)
            fprintf(f, "\\u%04x", (unsigned char) *s);
        else
            fputc(*s, f);
    }
    fputc('"', f);
}

void readback_put_status(FILE *f, struct fs_disk *d)
{
    struct readback *rb = d->readback;

    if (!rb) {
        fputs("  \"readback\": null,\n", f);
        return;
    }
    pthread_mutex_lock(&rb->lock);
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
        put_json_string(f, rb->message);
    }
    fputs("},\n", f);
    pthread_mutex_unlock(&rb->lock);
}

/* ---- sinks: sha256 as one stream, or blkhash block by block ---------- */

struct sink {
    EVP_MD_CTX *ctx;                  /* sha256, or blkhash's outer */
    bool blkhash;
    EVP_MD *md;                       /* blkhash: the block digest */
    uint64_t bs;
    unsigned dsize;
    unsigned char zero_digest[EVP_MAX_MD_SIZE];
    unsigned char *acc;               /* a block being gathered */
    size_t fill;
    uint64_t b;                       /* next block's index */
    unsigned char *batch;             /* block digests for ctx */
    size_t nbatch;
    uint64_t *fp;                     /* region fingerprints */
    size_t nfp;
    unsigned shift;
};

#define BATCH 1024

static int emit(struct sink *s, const unsigned char *d, bool data)
{
    memcpy(s->batch + s->nbatch * s->dsize, d, s->dsize);
    if (++s->nbatch == BATCH) {
        if (EVP_DigestUpdate(s->ctx, s->batch, BATCH * s->dsize) != 1)
            return -EIO;
        s->nbatch = 0;
    }
    if (data && (s->b >> s->shift) < s->nfp)
        s->fp[s->b >> s->shift] ^= blkhash_fp_term(s->b, d);
    s->b++;
    return 0;
}

static int block(struct sink *s, const unsigned char *p, size_t n)
{
    unsigned char d[EVP_MAX_MD_SIZE];
    bool zero = is_zero(p, n);

    if (zero && n == s->bs)
        return emit(s, s->zero_digest, false);
    if (EVP_Digest(p, n, d, NULL, s->md, NULL) != 1)
        return -EIO;
    return emit(s, d, !zero);
}

static int sink_data(struct sink *s, const unsigned char *p, size_t len)
{
    int r = 0;

    if (!s->blkhash)
        return EVP_DigestUpdate(s->ctx, p, len) == 1 ? 0 : -EIO;
    while (len > 0 && r == 0) {
        if (s->fill == 0 && len >= s->bs) {
            r = block(s, p, s->bs);
            p += s->bs;
            len -= s->bs;
            continue;
        }
        size_t n = s->bs - s->fill < len ? s->bs - s->fill : len;
        memcpy(s->acc + s->fill, p, n);
        s->fill += n;
        p += n;
        len -= n;
        if (s->fill == s->bs) {
            r = block(s, s->acc, s->bs);
            s->fill = 0;
        }
    }
    return r;
}

static int sink_zero(struct sink *s, uint64_t len)
{
    int r = 0;

    if (!s->blkhash) {
        for (; len > 0 && r == 0; len -= len < ZERO_SLAB ? len : ZERO_SLAB)
            r = sink_data(s, zeros, len < ZERO_SLAB ? len : ZERO_SLAB);
        return r;
    }
    if (s->fill > 0) {
        size_t n = s->bs - s->fill < len ? s->bs - s->fill : (size_t) len;
        memset(s->acc + s->fill, 0, n);
        s->fill += n;
        len -= n;
        if (s->fill == s->bs) {
            r = block(s, s->acc, s->bs);
            s->fill = 0;
        }
    }
    for (; len >= s->bs && r == 0; len -= s->bs)
        r = emit(s, s->zero_digest, false);
    if (len > 0 && r == 0) {
        memset(s->acc, 0, len);
        s->fill = len;
    }
    return r;
}

static int sink_finish(struct sink *s, uint64_t length, char *hex)
{
    unsigned char md[EVP_MAX_MD_SIZE], le[8];
    unsigned n = 0;
    int r = 0;

    if (s->blkhash) {
        if (s->fill > 0)
            r = block(s, s->acc, s->fill);
        if (r == 0 && s->nbatch &&
            EVP_DigestUpdate(s->ctx, s->batch, s->nbatch * s->dsize) != 1)
            r = -EIO;
        for (int i = 0; i < 8; i++)
            le[i] = (unsigned char) (length >> (8 * i));
        if (r == 0 && EVP_DigestUpdate(s->ctx, le, sizeof le) != 1)
            r = -EIO;
    }
    if (r == 0 && EVP_DigestFinal_ex(s->ctx, md, &n) != 1)
        r = -EIO;
    for (unsigned i = 0; r == 0 && i < n; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
    return r;
}

static void sink_free(struct sink *s)
{
    EVP_MD_CTX_free(s->ctx);
    EVP_MD_free(s->md);
    free(s->acc);
    free(s->batch);
    free(s->fp);
}

/* Regions of 2^shift blocks, at most MAX_REGIONS of them. */
static unsigned region_shift(uint64_t nblocks)
{
    unsigned shift = 0;

    while ((nblocks >> shift) >= MAX_REGIONS)
        shift++;
    return shift;
}

static int sink_init(struct sink *s, const struct readback *rb,
                     uint64_t size)
{
    *s = (struct sink) { .blkhash = rb->blkhash, .bs = rb->bs };
    if (!(s->ctx = EVP_MD_CTX_new()))
        return -ENOMEM;
    if (!rb->blkhash)
        return EVP_DigestInit_ex(s->ctx, EVP_sha256(), NULL) == 1 ? 0 : -EIO;
    s->md = EVP_MD_fetch(NULL, rb->md, NULL);
    if (!s->md || EVP_DigestInit_ex(s->ctx, s->md, NULL) != 1)
        return -EIO;
    s->dsize = (unsigned) EVP_MD_get_size(s->md);
    uint64_t nblocks = (size + s->bs - 1) / s->bs;
    s->shift = region_shift(nblocks);
    s->nfp = (size_t) ((nblocks + (1ull << s->shift) - 1) >> s->shift);
    s->acc = malloc(s->bs);
    s->batch = malloc((size_t) BATCH * s->dsize);
    s->fp = calloc(s->nfp ? s->nfp : 1, sizeof *s->fp);
    if (!s->acc || !s->batch || !s->fp)
        return -ENOMEM;
    memset(s->acc, 0, s->bs);
    return EVP_Digest(s->acc, s->bs, s->zero_digest, NULL, s->md, NULL) == 1
           ? 0 : -EIO;
}

/* ---- the read -------------------------------------------------------- */

struct rb_ext { uint64_t off, len; bool zero; };

struct slot {
    struct nbdx_op op;                /* first: done() finds the slot */
    struct run *run;
    uint64_t off, len;
    bool zero, busy;
    int err;
    unsigned char *buf;
};

struct run {
    struct readback *rb;
    struct nbdx *x;
    struct pool *pool;                /* what this mount touched */
    uint64_t size, end;               /* the file, the export */
    uint64_t chunk, window;
    bool extents;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct slot slots[READBACK_SLOTS];
    struct rb_ext *ext;               /* the current window's extents */
    size_t next, n, cap;
    uint64_t pos;                     /* pieces made up to here */
    uint64_t tail_nonzero;
};

static void read_done(struct nbdx_op *op, int err)
{
    struct slot *sl = (struct slot *) op;
    struct run *run = sl->run;

    pthread_mutex_lock(&run->lock);
    sl->err = err;
    sl->busy = false;
    pthread_cond_broadcast(&run->cond);
    pthread_mutex_unlock(&run->lock);
}

static bool push_ext(struct run *run, uint64_t off, uint64_t len, bool zero)
{
    if (run->n == run->cap) {
        size_t cap = run->cap ? 2 * run->cap : 64;
        struct rb_ext *e = realloc(run->ext, cap * sizeof *e);
        if (!e)
            return false;
        run->ext = e;
        run->cap = cap;
    }
    run->ext[run->n++] = (struct rb_ext) { .off = off, .len = len,
                                           .zero = zero };
    return true;
}

/* nbdx_run() takes op->opaque: the run is found from the op. */
struct bs_op {
    struct nbdx_op op;
    struct run *run;
};

/* Out of memory drops the extent: the rest of the window is data. */
static void ext_cb(struct nbdx_op *op, uint64_t off, uint64_t len,
                   uint32_t flags)
{
    push_ext(((struct bs_op *) op)->run, off, len,
             (flags & LIBNBD_STATE_ZERO) != 0);
}

/* Ask the server which of [pos, pos + window) reads as zero.  A reply
 * covering only part of the window is taken as far as it goes (the next
 * call asks for the rest); without block status, or when it fails or
 * makes no progress, the window is all data.  n == 0 afterwards only
 * when out of memory. */
static void fetch_extents(struct run *run)
{
    uint64_t len = run->end - run->pos < run->window ? run->end - run->pos
                                                     : run->window;
    struct bs_op bs = { .op = { .kind = NBDX_OP_BLOCK_STATUS,
                                .off = run->pos, .len = len,
                                .extent = ext_cb },
                        .run = run };
    uint64_t pos = run->pos, end = run->pos + len;
    size_t k = 0;

    run->n = run->next = 0;
    if (run->extents && nbdx_run(run->x, &bs.op) < 0)
        run->n = 0;
    /* Keep what lies in order inside the window; the rest is data. */
    for (size_t i = 0; i < run->n && pos < end; i++) {
        struct rb_ext e = run->ext[i];
        if (e.off != pos || e.len == 0)
            break;
        if (e.off + e.len > end)
            e.len = end - e.off;
        run->ext[k++] = e;
        pos = e.off + e.len;
    }
    run->n = k;
    if (k == 0 && !push_ext(run, pos, end - pos, false))
        run->n = 0;
}

/* A zero extent is trusted only where this mount never wrote or zeroed:
 * a server that acknowledges a write-zeroes it did not do reports the
 * range as zero too, so what the daemon touched is read.  Shortens *len
 * to a run that is all touched or all untouched; true if touched. */
static bool touched_run(struct run *run, uint64_t off, uint64_t *len)
{
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

/* The next piece in disk order; false at the end. */
static bool next_piece(struct run *run, uint64_t *off, uint64_t *len,
                       bool *zero)
{
    if (run->pos >= run->end)
        return false;
    if (run->next == run->n)
        fetch_extents(run);
    if (run->n == 0) {                /* out of memory: read it */
        *off = run->pos;
        *len = run->end - run->pos < run->chunk ? run->end - run->pos
                                                : run->chunk;
        *zero = false;
        run->pos += *len;
        return true;
    }
    struct rb_ext *e = &run->ext[run->next];
    uint64_t e_end = e->off + e->len;
    *off = run->pos;
    *zero = e->zero;
    *len = e_end - run->pos;
    if (*zero && touched_run(run, *off, len))
        *zero = false;
    if (!*zero && *len > run->chunk)
        *len = run->chunk;
    /* Stop at the file's end: past it, only zero is right. */
    if (*off < run->size && *off + *len > run->size)
        *len = run->size - *off;
    run->pos += *len;
    if (run->pos == e_end)
        run->next++;
    return true;
}

static void start_slot(struct run *run, struct slot *sl)
{
    sl->err = 0;
    if (sl->zero)
        return;
    sl->busy = true;
    sl->op = (struct nbdx_op) { .kind = NBDX_OP_READ, .off = sl->off,
                                .len = sl->len, .buf = sl->buf,
                                .done = read_done };
    nbdx_submit(run->x, &sl->op);
}

/* A piece past the file's end: must be zero. */
static void check_tail(struct run *run, const struct slot *sl)
{
    if (run->tail_nonzero != UINT64_MAX || is_zero(sl->buf, sl->len))
        return;
    for (uint64_t i = 0; i < sl->len; i++)
        if (sl->buf[i]) {
            run->tail_nonzero = sl->off + i;
            return;
        }
}

static int consume(struct run *run, struct slot *sl, struct sink *s)
{
    struct readback *rb = run->rb;
    int r = 0;

    if (sl->off < run->size)
        r = sl->zero ? sink_zero(s, sl->len) : sink_data(s, sl->buf, sl->len);
    else if (!sl->zero)
        check_tail(run, sl);
    pthread_mutex_lock(&rb->lock);
    rb->done += sl->len;
    if (sl->zero) {
        rb->zero_bytes += sl->len;
    } else {
        rb->bytes_read += sl->len;
        rb->reads++;
    }
    pthread_mutex_unlock(&rb->lock);
    return r;
}

static void wait_idle(struct run *run, struct slot *sl)
{
    pthread_mutex_lock(&run->lock);
    while (sl->busy)
        pthread_cond_wait(&run->cond, &run->lock);
    pthread_mutex_unlock(&run->lock);
}

/* Stream the disk through s, READBACK_SLOTS reads in flight.  0 or
 * -errno (a read failed: logged). */
static int stream(struct run *run, struct sink *s)
{
    uint64_t head = 0, tail = 0;
    bool more = true;
    int r = 0;

    while (r == 0 && (more || head < tail)) {
        while (more && tail - head < READBACK_SLOTS) {
            struct slot *sl = &run->slots[tail % READBACK_SLOTS];
            more = next_piece(run, &sl->off, &sl->len, &sl->zero);
            if (more) {
                start_slot(run, sl);
                tail++;
            }
        }
        if (head == tail)
            break;
        struct slot *sl = &run->slots[head++ % READBACK_SLOTS];
        wait_idle(run, sl);
        if (sl->err) {
            r = -sl->err;
            log_err("read-back: reading %" PRIu64 " bytes at offset %" PRIu64
                    " failed: %s", sl->len, sl->off, strerror(sl->err));
            set_message(run->rb, "reading %" PRIu64 " bytes at offset %"
                        PRIu64 " failed: %s", sl->len, sl->off,
                        strerror(sl->err));
        } else {
            r = consume(run, sl, s);
        }
    }
    for (; head < tail; head++)       /* let the reads in flight land */
        wait_idle(run, &run->slots[head % READBACK_SLOTS]);
    return r;
}

static int run_init(struct run *run, struct fs_disk *d, uint64_t size)
{
    const struct nbdx_info *info = nbdx_info(d->x);

    *run = (struct run) { .rb = d->readback, .x = d->x, .pool = d->pool,
                          .size = size, .end = d->export_size,
                          .chunk = READBACK_CHUNK, .window = BS_WINDOW,
                          .extents = info->can_extents && d->readback->extents,
                          .tail_nonzero = UINT64_MAX };
    if (info->block_max && info->block_max < run->chunk)
        run->chunk = info->block_max;
    if (info->block_max && info->block_max < run->window)
        run->window = info->block_max;
    pthread_mutex_init(&run->lock, NULL);
    pthread_cond_init(&run->cond, NULL);
    for (unsigned i = 0; i < READBACK_SLOTS; i++) {
        run->slots[i].run = run;
        if (!(run->slots[i].buf = malloc(run->chunk)))
            return -ENOMEM;
    }
    return 0;
}

static void run_free(struct run *run)
{
    for (unsigned i = 0; i < READBACK_SLOTS; i++)
        free(run->slots[i].buf);
    free(run->ext);
    pthread_mutex_destroy(&run->lock);
    pthread_cond_destroy(&run->cond);
}

/* ---- naming the differences ------------------------------------------ */

static void add_range(struct readback *rb, uint64_t off, uint64_t len)
{
    pthread_mutex_lock(&rb->lock);
    uint64_t i = rb->nranges < RANGES_SHOWN ? rb->nranges : RANGES_SHOWN;
    if (i > 0 && rb->ranges[i - 1].off + rb->ranges[i - 1].len == off &&
        rb->nranges <= RANGES_SHOWN) {
        rb->ranges[i - 1].len += len;
    } else {
        if (i < RANGES_SHOWN)
            rb->ranges[i] = (struct rb_range) { off, len };
        rb->nranges++;
    }
    rb->range_bytes += len;
    pthread_mutex_unlock(&rb->lock);
}

/* Regions twice as large, until they are of 2^to blocks (XOR merges). */
static void coarsen(struct sink *s, unsigned to)
{
    for (; s->shift < to; s->shift++) {
        for (size_t i = 0; i < s->nfp; i++)
            s->fp[i / 2] = (i % 2 ? s->fp[i / 2] : 0) ^ s->fp[i];
        s->nfp = (s->nfp + 1) / 2;
    }
}

/* blkhash: the regions whose fingerprints differ between the inline
 * digest and the read-back. */
static void name_ranges(struct fs_disk *d, struct sink *s, uint64_t size)
{
    struct readback *rb = d->readback;
    uint64_t *mine = NULL;
    unsigned shift = s->shift;
    size_t n = 0;

    if (digest_fingerprints(d->digest, size, &shift, &mine, &n) < 0) {
        free(mine);
        return;
    }
    coarsen(s, shift);
    uint64_t region = s->bs << s->shift;
    for (size_t i = 0; i < s->nfp && i < n; i++) {
        if (mine[i] == s->fp[i])
            continue;
        uint64_t off = (uint64_t) i * region;
        add_range(rb, off, size - off < region ? size - off : region);
    }
    free(mine);
    pthread_mutex_lock(&rb->lock);
    rb->ranges_known = true;
    pthread_mutex_unlock(&rb->lock);
}

/* ---- one verification ------------------------------------------------ */

static uint64_t file_size(struct fs_disk *d)
{
    pthread_mutex_lock(&d->fs->lock);
    uint64_t size = d->apparent_size;
    pthread_mutex_unlock(&d->fs->lock);
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
    pthread_mutex_lock(&rb->lock);
    rb->state = RB_RUNNING;
    rb->runs++;
    rb->total = total;
    rb->done = rb->bytes_read = rb->reads = rb->zero_bytes = 0;
    snprintf(rb->expected, sizeof rb->expected, "%s", k->hex);
    rb->got[0] = rb->message[0] = '\0';
    rb->ranges_known = false;
    rb->nranges = rb->range_bytes = 0;
    rb->tail_nonzero = UINT64_MAX;
    pthread_mutex_unlock(&rb->lock);
}

/* Compare; 0 (same) or -EIO (differs: status, ranges and log say how). */
static int judge(struct fs_disk *d, struct sink *s, const struct run *run,
                 const struct rb_key *k, const char *hex)
{
    struct readback *rb = d->readback;
    bool same = strcmp(hex, k->hex) == 0;

    pthread_mutex_lock(&rb->lock);
    snprintf(rb->got, sizeof rb->got, "%s", hex);
    rb->tail_nonzero = run->tail_nonzero;
    pthread_mutex_unlock(&rb->lock);
    if (same && run->tail_nonzero == UINT64_MAX) {
        set_state(rb, RB_PASSED);
        set_message(rb, "the disk holds what was written");
        return 0;
    }
    if (!same && s->blkhash)
        name_ranges(d, s, k->size);
    set_state(rb, RB_FAILED);
    pthread_mutex_lock(&rb->lock);
    char first[96] = "";
    if (rb->nranges)
        snprintf(first, sizeof first, "; first %" PRIu64 " bytes at offset %"
                 PRIu64, rb->ranges[0].len, rb->ranges[0].off);
    if (!same)
        snprintf(rb->message, sizeof rb->message, "the disk differs from "
                 "what was written: read back %.16s..., expected %.16s...%s%s",
                 hex, k->hex, !s->blkhash ? " (sha256 cannot say where: "
                 "--blkhash names the ranges)" : "", first);
    else
        snprintf(rb->message, sizeof rb->message, "the disk holds data past "
                 "the file's end (%" PRIu64 " bytes), from offset %" PRIu64,
                 k->size, run->tail_nonzero);
    log_err("read-back: %s (%" PRIu64 " differing range(s))", rb->message,
            rb->nranges);
    for (uint64_t i = 0; i < rb->nranges && i < RANGES_SHOWN; i++)
        log_err("read-back: differs: %" PRIu64 " bytes at offset %" PRIu64,
                rb->ranges[i].len, rb->ranges[i].off);
    pthread_mutex_unlock(&rb->lock);
    return -EIO;
}

static int verify_locked(struct fs_disk *d, const struct rb_key *k)
{
    struct readback *rb = d->readback;
    struct run run;
    struct sink s;
    char hex[DIGEST_HEX_MAX] = "";

    double t0 = mono_now_s();

    reset_status(rb, k, d->export_size);
    int r = run_init(&run, d, k->size);
    if (r == 0)
        r = sink_init(&s, rb, k->size);
    else
        memset(&s, 0, sizeof s);
    if (r == 0 && (r = stream(&run, &s)) == 0)
        r = sink_finish(&s, k->size, hex);
    if (r == 0)
        r = judge(d, &s, &run, k, hex);
    else {
        set_state(rb, RB_ERROR);
        if (!rb->message[0])
            set_message(rb, "read-back failed: %s", strerror(-r));
        log_err("read-back: %s", rb->message);
        r = -EIO;
    }
    sink_free(&s);
    run_free(&run);
    pthread_mutex_lock(&rb->lock);
    rb->seconds = mono_now_s() - t0;
    pthread_mutex_unlock(&rb->lock);
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
    pthread_mutex_lock(&rb->run);
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
    pthread_mutex_unlock(&rb->run);
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

    pthread_mutex_lock(&rb->lock);
    if (r < 0)
        log_err("read-back: the disk does not hold what was written (%s); "
                "exiting 1", rb->message);
    pthread_mutex_unlock(&rb->lock);
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
