/* digest/blkpass.c: the inline blkhash's view of the raw file (blkpass.h).
 *
 * INVARIANTS
 * 1. written and zero are disjoint: a write takes its range out of zero,
 *    a zeroing takes its range out of written.
 * 2. A block with a part (a copy) holds in part->buf every byte of the
 *    block that is in written, and part->cov says which (written since
 *    the part was made); other bytes of buf are zero.
 * 3. A block without a part that intersects written has been hashed
 *    whole, from bytes that were all written or zero; its bytes are gone.
 *    So a later change to part of it cannot be followed.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "digest/blkhash.h"
#include "common/cleanup.h"
#include "digest/blkpass.h"
#include "digest/hashers.h"
#include "transport/extmap.h"

/* Ranges kept in written or zero (16 bytes each): writes scattered wider
 * than this end the pass rather than grow the daemon without bound. */
#define MAX_EXTENTS (1u << 19)

/* Block digests kept at once (the copies have partial_budget): writes
 * scattered so widely that their digests would take more end the pass
 * ("too scattered") rather than grow the daemon (1 KiB blocks per 32 KiB
 * chunk: 16 MiB follows data spread over 32 GiB at 64 KiB blocks, and
 * folding keeps an in-order copy far below it). */
#define MAX_STATE (16u << 20)

/* Folding (blkhash_fold): blocks further than FOLD_LAG_BYTES (at least
 * FOLD_LAG_MIN blocks) behind the end of the data, and known (written or
 * zero, no part), are folded into the outer digest FOLD_STEP blocks at a
 * time, so a dense stream keeps a bounded number of block digests.  A
 * writer reordering within less than the lag (qemu-img convert -W) is
 * unaffected; one rewriting a folded block makes the pass fail. */
#define FOLD_LAG_BYTES (256u << 20)
#define FOLD_LAG_MIN 1024u
#define FOLD_STEP 1024u

/* THE VOLUME LAG: the lag above is one of disk distance, but a writer
 * reorders by the data it has in flight, not by disk distance: where a
 * hole of more than the lag lies between two runs of data (a sparse
 * disk), a block of the first run that arrives a little late (qemu-img
 * convert -c stores some clusters of a disk ahead of earlier ones; a
 * view's decoder places what its threads finish first) is behind the
 * lag already.  So folding also stays behind where the data ended
 * VOLUME_LAG_BLOCKS blocks of writing ago (vol_mark[]: the end of the
 * data each time another VOLUME_LAG_BLOCKS / VOLUME_MARKS blocks were
 * written).  Memory: at most that many more block digests (their chunks:
 * 256 of 32 KiB where every block is 64 MiB from the next). */
#define VOLUME_LAG_BLOCKS 256u
#define VOLUME_MARKS 16u

/* The range sets are exact (never forget a range); the pass bounds them
 * itself at MAX_EXTENTS and gives up past it. */
static void map_init(struct extmap *m) { extmap_init(m, SIZE_MAX, false); }

static void map_clear(struct extmap *m)
{
    extmap_free(m);
    map_init(m);
}

static bool map_contains(const struct extmap *m, uint64_t s, uint64_t e)
{
    return extmap_covered(m, s, e) == e - s;
}

static bool map_intersects(const struct extmap *m, uint64_t s, uint64_t e)
{
    return extmap_covered(m, s, e) > 0;
}

struct part {
    uint64_t b;                   /* block index */
    unsigned char *buf;           /* block_size bytes */
    struct extmap cov;            /* bytes of the block buf knows */
    uint64_t tick;                /* last touched */
};

struct blkpass {
    char md[BLKHASH_NAME_MAX];
    uint64_t bs;
    struct blkhash *h;
    struct extmap written, zero;
    struct part *parts;
    size_t nparts, maxparts;
    uint64_t tick, hashed, data_end;
    uint64_t reused;              /* of hashed: digests the writer gave */
    uint64_t fold_lag;            /* bytes (FOLD_LAG_BYTES) */
    uint64_t volume;              /* bytes written in this pass */
    uint64_t vol_mark[VOLUME_MARKS];  /* THE VOLUME LAG, a ring */
    bool fold_at_settle;          /* fold at blkpass_settle() only, */
    size_t settle_state;          /* once the state passes this */
    int (*read)(void *, uint64_t, void *, size_t);   /* THE READER */
    int (*fill)(void *, uint64_t, unsigned char *);  /* THE FILLER */
    void *fill_ctx;
    void *read_ctx;
    uint64_t disk_size;
    struct digest_hashers hs;
};

/* Hash count whole blocks blk[i] from mem[i], on the helpers and this
 * thread; returns once every one is stored.  0 or -errno. */
static int hash_blocks(struct blkpass *p, const uint64_t *blk,
                       const unsigned char *const *mem, size_t count)
{
    return digest_hashers_run(&p->hs, p->h, blk, mem, count);
}

static void drop_part(struct blkpass *p, size_t i)
{
    free(p->parts[i].buf);
    extmap_free(&p->parts[i].cov);
    p->parts[i] = p->parts[--p->nparts];
}

static void clear(struct blkpass *p)
{
    while (p->nparts)
        drop_part(p, 0);
    map_clear(&p->written);
    map_clear(&p->zero);
    p->hashed = p->reused = p->data_end = p->volume = 0;
    memset(p->vol_mark, 0, sizeof p->vol_mark);
    p->fold_at_settle = false;
}

int blkpass_create(const char *md, uint64_t block_size, size_t partial_budget,
                   struct blkpass **out)
{
    struct blkpass *p = calloc(1, sizeof *p);
    if (!p)
        return -ENOMEM;
    snprintf(p->md, sizeof p->md, "%s", md);
    p->bs = block_size;
    p->fold_lag = FOLD_LAG_BYTES;
    digest_hashers_start(&p->hs);
    p->maxparts = partial_budget / block_size < 2 ? 2
                                                  : partial_budget / block_size;
    p->parts = calloc(p->maxparts, sizeof *p->parts);
    map_init(&p->written);
    map_init(&p->zero);
    int r = p->parts ? blkhash_create(md, block_size, &p->h) : -ENOMEM;
    if (r < 0) {
        blkpass_free(p);
        return r;
    }
    *out = p;
    return 0;
}

void blkpass_free(struct blkpass *p)
{
    if (!p)
        return;
    digest_hashers_stop(&p->hs);
    if (p->parts)
        clear(p);
    free(p->parts);
    extmap_free(&p->written);
    extmap_free(&p->zero);
    blkhash_free(p->h);
    free(p);
}

int blkpass_reset(struct blkpass *p)
{
    struct blkhash *h;
    int r = blkhash_create(p->md, p->bs, &h);

    if (r < 0)
        return r;
    clear(p);
    blkhash_free(p->h);
    p->h = h;
    return 0;
}

uint64_t blkpass_hashed(const struct blkpass *p)
{
    return p->hashed;
}

uint64_t blkpass_reused(const struct blkpass *p)
{
    return p->reused;
}

/* Block b's digest, if the writer gave it (known.h; *j walks known in
 * step with the blocks, both ascending), else NULL. */
static const unsigned char *known_digest(const struct blkpass *p,
                                         const struct digest_known *k,
                                         size_t *j, uint64_t b)
{
    if (!k || p->bs != DIGEST_KNOWN_BS || strcmp(p->md, "sha256") != 0)
        return NULL;
    while (*j < k->n && k->block[*j] < b)
        ++*j;
    return *j < k->n && k->block[*j] == b ? k->digest[*j] : NULL;
}

static int fail(struct nbdf_err *why, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(struct nbdf_err *why, int err, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(why->msg, sizeof why->msg, fmt, ap);
    va_end(ap);
    return err;
}

/* ---- parts ---- */

static struct part *find_part(struct blkpass *p, uint64_t b)
{
    for (size_t i = 0; i < p->nparts; i++)
        if (p->parts[i].b == b)
            return &p->parts[i];
    return NULL;
}

/* Every byte of [start, end) in the part's block that the copy does not
 * know reads as zero. */
static bool gaps_are_zero(const struct blkpass *p, const struct part *pt,
                          uint64_t start, uint64_t end)
{
    const struct extmap *c = &pt->cov;

    for (uint64_t pos = start; pos < end;) {
        struct ext x;
        bool more = extmap_next(c, pos, &x);
        if (more && x.start <= pos) {
            pos = x.end;
            continue;
        }
        uint64_t gap_end = more && x.start < end ? x.start : end;
        if (!map_contains(&p->zero, pos, gap_end))
            return false;
        pos = gap_end;
    }
    return true;
}

static int hash_part(struct blkpass *p, const struct part *pt, size_t len,
                     struct nbdf_err *why)
{
    int r = blkhash_update(p->h, pt->b * p->bs, pt->buf, len);
    if (r < 0)
        return fail(why, r, "hashing the block at %" PRIu64 " failed: %s",
                    pt->b * p->bs, strerror(-r));
    p->hashed += len;
    return 0;
}

static int read_block(struct blkpass *p, uint64_t b, unsigned char *buf,
                      struct nbdf_err *why);

/* Let go of the least recently touched part: hashed whole, its unknown
 * bytes zero, or the pass fails.  The part holding the end of the data
 * stays: it is the file's last block, to be hashed short at the close. */
static int evict_part(struct blkpass *p, struct nbdf_err *why)
{
    uint64_t tail = p->data_end ? (p->data_end - 1) / p->bs : UINT64_MAX;
    size_t old = p->nparts;

    for (size_t i = 0; i < p->nparts; i++)
        if (p->parts[i].b != tail &&
            (old == p->nparts || p->parts[i].tick < p->parts[old].tick))
            old = i;
    assert(old < p->nparts);      /* maxparts >= 2 */
    struct part *pt = &p->parts[old];
    uint64_t start = pt->b * p->bs;
    int r;
    if (!gaps_are_zero(p, pt, start, start + p->bs)) {
        if (!p->read)
            return fail(why, -E2BIG, "more than %zu blocks are written in "
                        "part at once, and the one at %" PRIu64 " still "
                        "holds older data", p->maxparts, start);
        /* The disk now holds these bytes, or newer ones that the changes
         * still to come will write again. */
        if ((r = read_block(p, pt->b, pt->buf, why)) < 0)
            return r;
    }
    r = hash_part(p, pt, p->bs, why);
    if (r == 0)
        drop_part(p, old);
    return r;
}

static int new_part(struct blkpass *p, uint64_t b, struct part **out,
                    struct nbdf_err *why)
{
    int r;

    if (p->nparts == p->maxparts && (r = evict_part(p, why)) < 0)
        return r;
    struct part *pt = &p->parts[p->nparts];
    *pt = (struct part) { .b = b, .buf = calloc(1, p->bs) };
    if (!pt->buf)
        return fail(why, -ENOMEM, "out of memory");
    map_init(&pt->cov);
    p->nparts++;
    *out = pt;
    return 0;
}

/* ---- the reader (blkpass.h, THE READER) ---- */

void blkpass_set_reader(struct blkpass *p,
                        int (*read)(void *ctx, uint64_t off, void *buf,
                                    size_t len),
                        void *ctx, uint64_t size)
{
    p->read = read;
    p->read_ctx = ctx;
    p->disk_size = size;
}

void blkpass_set_filler(struct blkpass *p,
                        int (*fill)(void *ctx, uint64_t b,
                                    unsigned char *digest),
                        void *ctx)
{
    p->fill = fill;
    p->fill_ctx = ctx;
}

/* buf = block b as the disk holds it now (zeros past the disk's end);
 * the whole block is then known: written (zero's bytes included). */
static int read_block(struct blkpass *p, uint64_t b, unsigned char *buf,
                      struct nbdf_err *why)
{
    uint64_t start = b * p->bs;
    int r = 0;

    memset(buf, 0, p->bs);
    if (start < p->disk_size) {
        size_t n = p->disk_size - start < p->bs
                   ? (size_t) (p->disk_size - start) : (size_t) p->bs;
        r = p->read(p->read_ctx, start, buf, n);
    }
    if (r < 0)
        return fail(why, r, "reading the block at %" PRIu64 " back from "
                    "the disk failed: %s", start, strerror(-r));
    if (extmap_remove(&p->zero, start, start + p->bs) < 0 ||
        extmap_add(&p->written, start, start + p->bs) < 0)
        return fail(why, -ENOMEM, "out of memory");
    return 0;
}

/* Block b's bytes were let go (hashed whole): a part holding the whole
 * block as the disk has it now, or the pass fails (no reader). */
static int reload_part(struct blkpass *p, uint64_t b, struct part **out,
                       const char *what, uint64_t off, struct nbdf_err *why)
{
    struct part *pt;
    int r;

    if (!p->read)
        return fail(why, -ESTALE, "%s at %" PRIu64 " changed part of the "
                    "block at %" PRIu64 " after it was hashed", what, off,
                    b * p->bs);
    if ((r = new_part(p, b, &pt, why)) < 0)
        return r;
    uint64_t start = b * p->bs;
    r = read_block(p, b, pt->buf, why);
    if (r == 0 && extmap_add(&pt->cov, start, start + p->bs) < 0)
        r = fail(why, -ENOMEM, "out of memory");
    if (r < 0) {
        drop_part(p, (size_t) (pt - p->parts));
        return r;
    }
    pt->tick = ++p->tick;
    *out = pt;
    return 0;
}

/* The part's block is known now: hash it and let its copy go. */
static int settle_if_whole(struct blkpass *p, struct part *pt, struct nbdf_err *why)
{
    uint64_t start = pt->b * p->bs;

    if (!map_contains(&pt->cov, start, start + p->bs))
        return 0;
    int r = hash_part(p, pt, p->bs, why);
    if (r == 0)
        drop_part(p, (size_t) (pt - p->parts));
    return r;
}

/* ---- changes ---- */

static uint64_t first_unknown(const struct blkpass *p, uint64_t from,
                              uint64_t size);

/* len more bytes were written, the data now ending at p->data_end (THE
 * VOLUME LAG). */
static void note_volume(struct blkpass *p, uint64_t len)
{
    uint64_t step = (uint64_t) VOLUME_LAG_BLOCKS / VOLUME_MARKS * p->bs;
    uint64_t from = p->volume / step;

    p->volume += len;
    for (uint64_t k = from + 1; k <= p->volume / step &&
                                k <= from + VOLUME_MARKS; k++)
        p->vol_mark[k % VOLUME_MARKS] = p->data_end;
}

/* The end of the data VOLUME_LAG_BLOCKS blocks of writing ago (0: not
 * that many written yet). */
static uint64_t lagged_end(const struct blkpass *p)
{
    uint64_t step = (uint64_t) VOLUME_LAG_BLOCKS / VOLUME_MARKS * p->bs;
    uint64_t k = p->volume / step;

    if (k < VOLUME_MARKS - 1)
        return 0;
    uint64_t then = p->vol_mark[(k - (VOLUME_MARKS - 1)) % VOLUME_MARKS];
    return then < p->data_end ? then : p->data_end;
}

/* Fold the known blocks far enough behind the data's end (FOLD_*, THE
 * VOLUME LAG). */
static int maybe_fold(struct blkpass *p, struct nbdf_err *why)
{
    uint64_t lag = p->fold_lag / p->bs > FOLD_LAG_MIN
                   ? p->fold_lag / p->bs : FOLD_LAG_MIN;
    uint64_t folded = blkhash_folded(p->h);
    uint64_t full = lagged_end(p) / p->bs;
    int r;

    if (full < folded + lag + FOLD_STEP)
        return 0;
    uint64_t upto = full - lag;
    uint64_t gap = first_unknown(p, folded * p->bs, upto * p->bs) / p->bs;
    if (gap < upto)
        upto = gap;
    for (size_t i = 0; i < p->nparts; i++)
        if (p->parts[i].b < upto)
            upto = p->parts[i].b;
    if (upto < folded + FOLD_STEP)
        return 0;
    if ((r = blkhash_fold(p->h, upto)) < 0)
        return fail(why, r, "folding block digests failed: %s",
                    strerror(-r));
    return 0;
}

static int folded_fail(struct blkpass *p, const char *what, uint64_t off,
                       struct nbdf_err *why)
{
    return fail(why, -ESTALE, "%s at %" PRIu64 " changed a block already "
                "folded into the digest (blocks far behind the end of the "
                "data, below %" PRIu64 ", are final)", what, off,
                blkhash_folded(p->h) * p->bs);
}

/* [s, e), inside block b, was written with buf. */
static int write_in_block(struct blkpass *p, uint64_t b, uint64_t s,
                          uint64_t e, const unsigned char *buf, struct nbdf_err *why)
{
    uint64_t start = b * p->bs;
    struct part *pt = find_part(p, b);
    int r;

    if (b < blkhash_folded(p->h))
        return folded_fail(p, "a write", s, why);

    if (!pt && s == start && e == start + p->bs) {
        if ((r = blkhash_update(p->h, start, buf, p->bs)) < 0)
            return fail(why, r, "hashing failed: %s", strerror(-r));
        p->hashed += p->bs;
        return 0;
    }
    if (!pt && map_intersects(&p->written, start, start + p->bs) &&
        (r = reload_part(p, b, &pt, "a write", s, why)) < 0)
        return r;
    if (!pt && (r = new_part(p, b, &pt, why)) < 0)
        return r;
    memcpy(pt->buf + (s - start), buf, e - s);
    if (extmap_add(&pt->cov, s, e) < 0)
        return fail(why, -ENOMEM, "out of memory");
    pt->tick = ++p->tick;
    return settle_if_whole(p, pt, why);
}

int blkpass_write(struct blkpass *p, uint64_t off, const void *buf,
                  size_t len, const struct digest_known *known, struct nbdf_err *why)
{
    const unsigned char *src = buf;
    uint64_t end = off + len;
    int r;

    if (len == 0)
        return 0;
    if (extmap_remove(&p->zero, off, end) < 0)
        return fail(why, -ENOMEM, "out of memory");
    /* Whole blocks with no copy are hashed on the helpers, a batch at a
     * time (THE HASHERS), or take the digest the writer gave (known);
     * the others, one by one, here. */
    uint64_t blk[DIGEST_HASHERS_BATCH];
    const unsigned char *mem[DIGEST_HASHERS_BATCH];
    size_t n = 0, j = 0;
    for (uint64_t b = off / p->bs; b * p->bs < end; b++) {
        uint64_t s = b * p->bs > off ? b * p->bs : off;
        uint64_t e = (b + 1) * p->bs < end ? (b + 1) * p->bs : end;
        const unsigned char *dg;
        if (e - s == p->bs && b >= blkhash_folded(p->h) && !find_part(p, b) &&
            (dg = known_digest(p, known, &j, b)) != NULL) {
            if ((r = blkhash_put_digest(p->h, b, dg)) < 0)
                return fail(why, r, "out of memory");
            p->hashed += p->bs;
            p->reused += p->bs;
        } else if (e - s == p->bs && b >= blkhash_folded(p->h) &&
                   !find_part(p, b)) {
            blk[n] = b;
            mem[n++] = src + (s - off);
        } else if ((r = write_in_block(p, b, s, e, src + (s - off),
                                       why)) < 0) {
            return r;
        }
        if (n == DIGEST_HASHERS_BATCH || (n && (b + 1) * p->bs >= end)) {
            if ((r = hash_blocks(p, blk, mem, n)) < 0)
                return fail(why, r, "hashing failed: %s", strerror(-r));
            p->hashed += n * p->bs;
            n = 0;
        }
    }
    if (extmap_add(&p->written, off, end) < 0)
        return fail(why, -ENOMEM, "out of memory");
    if (extmap_count(&p->written) > MAX_EXTENTS ||
        extmap_count(&p->zero) > MAX_EXTENTS)
        return fail(why, -E2BIG, "the writes are too scattered to follow "
                    "(more than %u separate ranges)", MAX_EXTENTS);
    if (end > p->data_end)
        p->data_end = end;
    note_volume(p, len);
    int r2 = p->fold_at_settle ? 0 : maybe_fold(p, why);
    if (r2 == 0 && blkhash_memory(p->h) > MAX_STATE)
        return fail(why, -E2BIG, "the writes are too scattered to follow "
                    "(their block digests would take more than %u MiB)",
                    MAX_STATE >> 20);
    return r2;
}

/* Zeroing [s, e) of one block: if the block has no part, nothing is
 * lost unless it was hashed with data there (invariant 3). */
static int zero_edge(struct blkpass *p, uint64_t s, uint64_t e, struct nbdf_err *why)
{
    uint64_t b = s / p->bs;
    struct part *pt;

    if (e - s == p->bs || find_part(p, b) ||
        !map_intersects(&p->written, s, e))
        return 0;
    if (b < blkhash_folded(p->h))
        return fail(why, -ESTALE, "zeroing %" PRIu64 "-%" PRIu64 " changed "
                    "part of the block at %" PRIu64 " after it was hashed",
                    s, e, b * p->bs);
    return reload_part(p, b, &pt, "zeroing", s, why);
}

/* Parts inside [off, end) go (the blocks are zero).  Parts it overlaps
 * zero those bytes and leave them to the zero set: a part is not settled
 * by zeroing, so the block holding the end of the file after a truncate
 * is still a copy when the close hashes it short. */
static int zero_parts(struct blkpass *p, uint64_t off, uint64_t end,
                      struct nbdf_err *why)
{
    for (size_t i = 0; i < p->nparts;) {
        struct part *pt = &p->parts[i];
        uint64_t start = pt->b * p->bs, stop = start + p->bs;
        uint64_t s = start > off ? start : off, e = stop < end ? stop : end;
        if (s >= e) {
            i++;
        } else if (s == start && e == stop) {
            drop_part(p, i);
        } else {
            memset(pt->buf + (s - start), 0, e - s);
            if (extmap_remove(&pt->cov, s, e) < 0)
                return fail(why, -ENOMEM, "out of memory");
            i++;
        }
    }
    return 0;
}

int blkpass_zero(struct blkpass *p, uint64_t off, uint64_t len, struct nbdf_err *why)
{
    uint64_t end = off + len;
    uint64_t first = (off + p->bs - 1) / p->bs;  /* whole blocks [first, */
    uint64_t last = end / p->bs;                 /*  last) are zeroed */
    uint64_t data_blocks = (p->data_end + p->bs - 1) / p->bs;
    int r;

    if (len == 0)
        return 0;
    uint64_t fb = off / p->bs, lb = (end - 1) / p->bs;
    uint64_t fb_end = (fb + 1) * p->bs < end ? (fb + 1) * p->bs : end;
    if ((r = zero_edge(p, off, fb_end, why)) < 0)
        return r;
    if (lb != fb && (r = zero_edge(p, lb * p->bs, end, why)) < 0)
        return r;
    if ((r = zero_parts(p, off, end, why)) < 0)
        return r;
    if (last > data_blocks)
        last = data_blocks;       /* no block past the data was hashed */
    uint64_t folded = blkhash_folded(p->h);
    if (first < folded && first < last) {
        /* Folded blocks stay as they are: fine if nothing was written
         * there (they read as zero already). */
        uint64_t stop = last < folded ? last : folded;
        if (map_intersects(&p->written, first * p->bs, stop * p->bs))
            return folded_fail(p, "zeroing", first * p->bs, why);
        first = stop;
    }
    if (first < last &&
        (r = blkhash_zero(p->h, first * p->bs, (last - first) * p->bs)) < 0)
        return fail(why, r, "blkhash zero failed: %s", strerror(-r));
    if (extmap_remove(&p->written, off, end) < 0 ||
        extmap_add(&p->zero, off, end) < 0)
        return fail(why, -ENOMEM, "out of memory");
    if (extmap_count(&p->written) > MAX_EXTENTS ||
        extmap_count(&p->zero) > MAX_EXTENTS)
        return fail(why, -E2BIG, "the zeroed ranges are too scattered to "
                    "follow (more than %u separate ranges)", MAX_EXTENTS);
    if (off < p->data_end && end >= p->data_end)
        p->data_end = off;
    return 0;
}

int blkpass_truncate(struct blkpass *p, uint64_t size, struct nbdf_err *why)
{
    int r;

    if (size == 0) {
        if ((r = blkpass_reset(p)) < 0)
            return fail(why, r, "cannot restart: %s", strerror(-r));
        if (extmap_add(&p->zero, 0, UINT64_MAX) < 0)
            return fail(why, -ENOMEM, "out of memory");
        return 0;
    }
    return blkpass_zero(p, size, UINT64_MAX - size, why);
}

void blkpass_fold_at_settle(struct blkpass *p, size_t state)
{
    p->fold_at_settle = true;
    p->settle_state = state;
}

int blkpass_settle(struct blkpass *p, struct nbdf_err *why)
{
    if (blkhash_memory(p->h) < p->settle_state)
        return 0;                 /* every block stays open to change */
    return maybe_fold(p, why);
}

/* ---- the value ---- */

/* The first byte in [from, size) that the pass knows nothing about, or
 * size. */
static uint64_t first_unknown(const struct blkpass *p, uint64_t from,
                              uint64_t size)
{
    uint64_t pos = from;

    while (pos < size) {
        struct ext w, z;
        if (extmap_next(&p->written, pos, &w) && w.start <= pos)
            pos = w.end;
        else if (extmap_next(&p->zero, pos, &z) && z.start <= pos)
            pos = z.end;
        else
            return pos;
    }
    return size;
}

/* THE FILLER: the whole blocks this pass knows nothing of, from the
 * filler, while it knows them.  0, or -errno with why. */
static int fill_gaps(struct blkpass *p, uint64_t size, struct nbdf_err *why)
{
    uint64_t pos = 0;

    while (p->fill && (pos = first_unknown(p, pos, size)) < size) {
        uint64_t b = pos / p->bs, start = b * p->bs, end = start + p->bs;
        unsigned char d[EVP_MAX_MD_SIZE];
        if (end > size || map_intersects(&p->written, start, end) ||
            map_intersects(&p->zero, start, end) || find_part(p, b))
            return 0;             /* known in part: "incomplete" */
        int k = p->fill(p->fill_ctx, b, d);
        if (k == 1) {
            int r = blkpass_zero(p, start, p->bs, why);
            if (r < 0)
                return r;
        } else if (k == 2) {
            if (blkhash_put_digest(p->h, b, d) < 0 ||
                extmap_add(&p->written, start, end) < 0)
                return 0;
        } else {
            return 0;
        }
        pos = end;
    }
    return 0;
}

int blkpass_finish(struct blkpass *p, uint64_t size, char *hex, struct nbdf_err *why)
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned n = 0;
    int r = fill_gaps(p, size, why);
    if (r < 0)
        return r;
    uint64_t gap = first_unknown(p, 0, size);

    if (gap < size)
        return fail(why, -ENODATA, "bytes from %" PRIu64 " hold data this "
                    "pass did not write", gap);
    uint64_t tail = size / p->bs * p->bs;
    if (size % p->bs && !find_part(p, size / p->bs) &&
        map_intersects(&p->written, tail, size)) {
        struct part *pt;
        if (!p->read)
            return fail(why, -ESTALE, "the block at %" PRIu64 ", the "
                        "file's last, was hashed whole before the file "
                        "ended inside it", tail);
        if ((r = reload_part(p, size / p->bs, &pt, "the end", size,
                             why)) < 0)
            return r;
    }
    /* Parts are hashed as they stand; they stay, as the pass may go on. */
    for (size_t i = 0; i < p->nparts; i++) {
        const struct part *pt = &p->parts[i];
        uint64_t start = pt->b * p->bs;
        if (start >= size)
            continue;
        uint64_t len = size - start < p->bs ? size - start : p->bs;
        assert(gaps_are_zero(p, pt, start, start + len));
        if ((r = hash_part(p, pt, (size_t) len, why)) < 0)
            return r;
    }
    r = blkhash_finish(p->h, size, md, &n);
    if (r < 0)
        return fail(why, r, "the hashed blocks do not end at the file's "
                    "size %" PRIu64 " (a block past it, or its last block "
                    "hashed whole)", size);
    for (unsigned i = 0; i < n; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
    return 0;
}

int blkpass_fingerprints(struct blkpass *p, uint64_t size, unsigned shift,
                         uint64_t *fp, size_t n)
{
    return blkhash_fingerprints(p->h, size, shift, fp, n);
}

unsigned blkpass_fp_min_shift(const struct blkpass *p)
{
    return blkhash_fp_min_shift(p->h);
}

uint64_t blkpass_folded(const struct blkpass *p)
{
    return blkhash_folded(p->h);
}

size_t blkpass_memory(const struct blkpass *p)
{
    return blkhash_memory(p->h) + p->nparts * p->bs;
}

void blkpass_set_fold_lag(struct blkpass *p, uint64_t bytes)
{
    p->fold_lag = bytes;
}
