/* qcow2/l2.c: L2 tables, for the stream decoder: each table is checked
 * whole before any entry of it is applied.
 *
 * Why two passes: applying an entry is an effect on the disk (a zero
 * cluster of an overlay is written as zeros, a data cluster the stream
 * has passed is placed from the spool, and the first such write is
 * begin(), which replaces a standalone disk).  A table whose entry 0 is a
 * zero cluster (qemu-img writes them for `write -z`, discards and zero
 * runs) and whose entry 1 is damaged used to zero the disk and then be
 * refused.  So:
 *
 *   check   every entry of the table: reserved bits, alignment, the zero
 *           flag of version 2, subcluster bitmaps, compressed ranges
 *           inside the file and not straddling the table, every host
 *           cluster it names claimed (a second claim, a claim on
 *           metadata such as the L1 table, a cluster whose refcount is 0
 *           in a refcount block that has arrived: refused), a cluster the
 *           stream has passed still kept (spool or zero record), and room
 *           for what it maps ahead.  No sink call.
 *   apply   the map hook, zeros, data from the spool, clusters ahead
 *           pushed to wait for the stream.  What can still fail here is
 *           not the table: the destination (sink errors), the spool's own
 *           I/O, memory, and the content of a compressed cluster the
 *           stream has passed (its deflate/zstd data is checked when it is
 *           decoded, as for every compressed cluster).
 *
 * "Validated" for qcow2, then: the header, the L1 table (whole, with every
 * L2 table the stream has already passed, see qcow2_l1_parse()) and the
 * L2 table being applied have passed the checks above.  A table that
 * arrives after data was placed is still checked whole before it is
 * applied, but the disk was begun by then: a one-pass stream cannot wait
 * for every table before it places data that precedes them (qemu-img
 * interleaves L2 tables and data).  Refcount blocks and a refcount table
 * that arrive after a claim check it on arrival, likewise. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "qcow2/stream-internal.h"

/* ---- check ------------------------------------------------------------------ */

/* A data cluster: claimed, and if passed, still held. */
static int check_data(struct qcow2_stream *s, uint64_t off, uint64_t *ahead)
{
    if (qcow2_claim(s, off, s->C, IT_DATA) < 0)
        return s->err;
    if (off >= s->pos) {
        (*ahead)++;
        return 0;
    }
    return qcow2_passed_kept(s, off, s->C, qcow2_kind_name(IT_DATA));
}

/* Preallocated space of a zero cluster: claimed (dropped when it passes). */
static int check_skip(struct qcow2_stream *s, uint64_t off, uint64_t *ahead)
{
    if (qcow2_claim(s, off, s->C, IT_SKIP) < 0)
        return s->err;
    *ahead += off >= s->pos;
    return 0;
}

static int check_compressed(struct qcow2_stream *s, uint64_t off, uint64_t len,
                            uint64_t *cahead)
{
    if (qcow2_claim(s, off, len, IT_NONE) < 0)
        return s->err;
    if (off >= s->pos) {
        (*cahead)++;
        return 0;
    }
    if (off + len > s->pos)
        return qcow2_fail(s, -EINVAL, "compressed cluster at file byte %" PRIu64
                    " straddles the table that names it", off);
    return qcow2_passed_kept(s, off, len, "a compressed cluster");
}

/* Entry p of guest cluster g, decoded by the one entry parser
 * (qcow2/entry.c); its failure is the stream's. */
static int decode(struct qcow2_stream *s, uint64_t g, const uint8_t *p,
                  struct qcow2_entry *en)
{
    struct nbdf_err e = { "" };
    int r = qcow2_entry_decode(&s->h, g, p, en, &e);
    return r < 0 ? qcow2_fail(s, r, "%s", e.msg) : 0;
}

static int check_entry(struct qcow2_stream *s, uint64_t g, const uint8_t *p,
                       uint64_t *ahead, uint64_t *cahead)
{
    struct qcow2_entry en;

    if (decode(s, g, p, &en) < 0)
        return s->err;
    if (en.compressed)
        return check_compressed(s, en.off, en.clen, cahead);
    if (en.off == 0)
        return 0;                     /* unallocated, or a zero cluster */
    return en.alloc ? check_data(s, en.off, ahead)
                    : check_skip(s, en.off, ahead);
}

/* Guest clusters table l1i maps inside the disk (the rest is not read). */
static uint64_t table_entries(const struct qcow2_stream *s, uint32_t l1i)
{
    uint64_t nclusters = DIV_ROUND_UP(s->h.size, s->C);
    uint64_t first = (uint64_t) l1i * s->E;
    return first >= nclusters ? 0 : MIN(s->E, nclusters - first);
}

int qcow2_l2_check(struct qcow2_stream *s, uint32_t l1i, const uint8_t *b)
{
    uint64_t n = table_entries(s, l1i), ahead = 0, cahead = 0;

    for (uint64_t j = 0; j < n; j++) {
        uint64_t g = (uint64_t) l1i * s->E + j;
        if (check_entry(s, g, b + j * (s->extl2 ? 16 : 8), &ahead,
                        &cahead) < 0)
            return s->err;
    }
    /* The heaps' bound, which the apply pass would otherwise meet after
     * some of the table was applied. */
    if (s->items.n + ahead > MAX_ITEMS || s->citems.n + cahead > MAX_ITEMS)
        return qcow2_fail(s, -EFBIG, "more than %u clusters mapped ahead of the "
                    "stream", MAX_ITEMS);
    return 0;
}

/* ---- apply ------------------------------------------------------------------ */

/* Place guest cluster g from host cluster off, subclusters 'alloc'. */
static int place_data(struct qcow2_stream *s, uint64_t g, uint64_t off,
                      uint32_t alloc)
{
    s->stats.data_clusters++;
    if (off >= s->pos)
        return qcow2_push_item(s, off, IT_DATA, (uint32_t) g, alloc);
    if (qcow2_take_passed(s, off, s->xbuf, qcow2_kind_name(IT_DATA)) < 0)
        return s->err;
    if (alloc == UINT32_MAX)
        return qcow2_emit_data(s, g << s->cb, s->xbuf, s->C);
    uint64_t sc = s->C / 32;
    for (unsigned k = 0; k < 32; k++)
        if (alloc >> k & 1)
            if (qcow2_emit_data(s, (g << s->cb) + k * sc, s->xbuf + k * sc, sc) < 0)
                return s->err;
    return 0;
}

static int skip_ahead(struct qcow2_stream *s, uint64_t g, uint64_t off)
{
    return off >= s->pos ? qcow2_push_item(s, off, IT_SKIP, (uint32_t) g, 0) : 0;
}

static int apply_standard(struct qcow2_stream *s, uint64_t g,
                          const struct qcow2_entry *en)
{
    if (en->zero) {
        s->stats.zero_clusters++;
        if (qcow2_emit_map(s, g << s->cb, s->C, QCOW2_MAP_ZERO, 0) < 0 ||
            qcow2_emit_zero(s, g << s->cb, s->C) < 0)
            return s->err;
        return en->off ? skip_ahead(s, g, en->off) : 0;
    }
    if (en->off == 0)
        return 0;                     /* unallocated */
    if (qcow2_emit_map(s, g << s->cb, s->C, QCOW2_MAP_DATA, en->off) < 0)
        return s->err;
    return place_data(s, g, en->off, UINT32_MAX);
}

static int apply_extended(struct qcow2_stream *s, uint64_t g,
                          const struct qcow2_entry *en)
{
    uint64_t sc = s->C / 32;

    if (en->zero)
        s->stats.zero_clusters++;
    for (unsigned k = 0; k < 32; k++) {
        uint64_t d = (g << s->cb) + k * sc;
        if (en->zero >> k & 1)
            if (qcow2_emit_map(s, d, sc, QCOW2_MAP_ZERO, 0) < 0 ||
                qcow2_emit_zero(s, d, sc) < 0)
                return s->err;
        if (en->alloc >> k & 1)
            if (qcow2_emit_map(s, d, sc, QCOW2_MAP_DATA, en->off + k * sc) < 0)
                return s->err;
    }
    if (en->off == 0)
        return 0;
    return en->alloc ? place_data(s, g, en->off, en->alloc)
                     : skip_ahead(s, g, en->off);
}

static int apply_compressed(struct qcow2_stream *s, uint64_t g, uint64_t off,
                            uint64_t len)
{
    if (qcow2_emit_map(s, g << s->cb, s->C, QCOW2_MAP_COMPRESSED, off) < 0)
        return s->err;
    struct citem c = { off, (uint32_t) g, (uint32_t) len };
    if (off >= s->pos) {
        int r = qcow2_heap_push(&s->citems, &c);
        return r < 0 ? qcow2_fail(s, r, "too many compressed clusters ahead of the "
                            "stream") : 0;
    }
    uint8_t *tmp = malloc(len);
    if (!tmp)
        return qcow2_fail(s, -ENOMEM, "out of memory for a compressed cluster");
    int r = qcow2_read_passed(s, off, tmp, len, "a compressed cluster");
    if (r == 0)
        r = qcow2_dispatch(s, &c, tmp, len);
    free(tmp);
    return r;
}

int qcow2_l2_apply(struct qcow2_stream *s, uint32_t l1i, const uint8_t *b)
{
    uint64_t n = table_entries(s, l1i);

    s->stats.l2_tables++;
    for (uint64_t j = 0; j < n; j++) {
        uint64_t g = (uint64_t) l1i * s->E + j;
        struct qcow2_entry en;
        int r = decode(s, g, b + j * (s->extl2 ? 16 : 8), &en);
        if (r == 0 && en.compressed)
            r = apply_compressed(s, g, en.off, en.clen);
        else if (r == 0)
            r = s->extl2 ? apply_extended(s, g, &en) : apply_standard(s, g, &en);
        if (r < 0)
            return r;
    }
    s->pending_l2--;
    qcow2_check_complete(s);
    return 0;
}

int qcow2_l2_parse(struct qcow2_stream *s, uint32_t l1i, const uint8_t *b)
{
    if (qcow2_l2_check(s, l1i, b) < 0)
        return s->err;
    return qcow2_l2_apply(s, l1i, b);
}

/* ---- the L1 table: the index of the L2 tables (here, beside them, so
 * that tables.c never calls up into this file) ---- */

/* The L2 tables of L1 table b that the stream has passed (an L1 table
 * written after them), each checked whole (qcow2/l2.c), all before any
 * is applied. */
static int check_passed_l2(struct qcow2_stream *s, const uint8_t *b)
{
    uint8_t *tmp = NULL;
    int r = 0;

    for (uint32_t i = 0; i < s->h.l1_size && r == 0; i++) {
        uint64_t off = qcow2_be64(b + (uint64_t) i * 8) & QCOW2_L1_OFFSET_MASK;
        if (off == 0 || off >= s->pos)
            continue;
        if (!tmp && !(tmp = malloc(s->C)))
            return qcow2_fail(s, -ENOMEM, "out of memory for a table");
        r = qcow2_read_passed(s, off, tmp, s->C, qcow2_kind_name(IT_L2));
        if (r == 0)
            r = qcow2_l2_check(s, i, tmp);
    }
    free(tmp);
    return r;
}

/* An L2 table the stream has passed, checked: applied from the spool. */
static int apply_passed_l2(struct qcow2_stream *s, uint64_t off, uint32_t i)
{
    uint8_t *tmp = malloc(s->C);
    if (!tmp)
        return qcow2_fail(s, -ENOMEM, "out of memory for a table");
    int r = qcow2_take_passed(s, off, tmp, qcow2_kind_name(IT_L2));
    if (r == 0)
        r = qcow2_l2_apply(s, i, tmp);
    free(tmp);
    return r;
}

int qcow2_l1_parse(struct qcow2_stream *s, const uint8_t *b)
{
    for (uint32_t i = 0; i < s->h.l1_size; i++) {
        struct nbdf_err e = { "" };
        uint64_t off;
        int r = qcow2_l1_entry(&s->h, i, qcow2_be64(b + (uint64_t) i * 8),
                               &off, &e);
        if (r < 0)
            return qcow2_fail(s, r, "%s", e.msg);
        /* Claimed before anything is written: an L2 table on other
         * metadata or named twice is refused before the disk changes. */
        if (off && qcow2_claim(s, off, s->C, IT_L2) < 0)
            return s->err;
    }
    /* Every L2 table counted before any is applied (the map is complete
     * only once none is pending), the ones already passed checked whole
     * before any is applied: a damaged one refuses the image with the
     * disk untouched, whichever table it is. */
    s->l1_seen = true;
    for (uint32_t i = 0; i < s->h.l1_size; i++)
        s->pending_l2 += (qcow2_be64(b + (uint64_t) i * 8) &
                          QCOW2_L1_OFFSET_MASK) != 0;
    if (check_passed_l2(s, b) < 0)
        return s->err;
    for (uint32_t i = 0; i < s->h.l1_size; i++) {
        uint64_t off = qcow2_be64(b + (uint64_t) i * 8) & QCOW2_L1_OFFSET_MASK;
        if (off == 0)
            continue;
        int r = off >= s->pos ? qcow2_push_item(s, off, IT_L2, i, (uint32_t) s->C)
                              : apply_passed_l2(s, off, i);
        if (r < 0)
            return r;
    }
    qcow2_check_complete(s);
    return 0;
}
