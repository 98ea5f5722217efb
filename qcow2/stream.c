/* qcow2/stream.c: forward-only decoder, qcow2 file bytes in file order to
 * raw-disk writes.  See the contract in qcow2/qcow2.h and the format notes
 * in docs/design/format-qcow2.md.
 *
 * HEAD collects the first cluster and decodes the header.  BODY walks the
 * rest cluster by cluster.  What a cluster is comes from a min-heap of
 * items keyed by file offset: the L1 table, the refcount table, refcount
 * blocks, L2 tables (known once the L1 table or the refcount table has
 * arrived) and data clusters (known once their L2 table has arrived).  At
 * each cluster boundary the heap's top says whether the cluster is:
 *
 *   metadata   collected, then parsed (which pushes more items);
 *   data       emitted as it arrives, straight from the caller's buffer;
 *   skip       preallocated space of a zero cluster: dropped;
 *   none       not known (yet).  While the map is incomplete (the
 *              refcount table, the L1 table or one of its L2 tables has
 *              not arrived) such a cluster may be anything a later table
 *              names: if it is not all zero (and not free by its refcount)
 *              it is spooled, if it is all zero it is remembered as zero
 *              (no bytes kept).  Once the map is complete it is dropped.
 *
 * Compressed clusters are byte ranges, not clusters: a second heap holds
 * the known ones by start; a range becomes active when the stream reaches
 * it and collects its bytes (several may be active: the tail sector of one
 * may hold the head of the next), whatever the cluster around it is.
 *
 * An entry that names a cluster the stream has already passed is served
 * from the spool (or the zero record).  Every host cluster claimed by
 * metadata or data is marked in a bitmap: a second claim is an error
 * (compressed ranges may share clusters among themselves only).
 *
 * Input may be "zeros" (buf == NULL) for gaps and holes of the file.
 *
 * This file is the walk (HEAD, BODY, feed, hole, finish); what the tables
 * say (the heaps, ownership and refcounts, the spool, table parsing,
 * compressed clusters) is qcow2/tables.c, over the state declared in
 * qcow2/stream-internal.h.
 */
#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/fileorder.h"
#include "common/imagekind.h"
#include "qcow2/stream-internal.h"

int qcow2_stream_new(const struct nbdf_sink *sink, void *opaque,
                     const struct qcow2_stream_opts *opts,
                     struct qcow2_stream **out)
{
    struct qcow2_stream *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    s->sink = sink;
    s->opaque = opaque;
    if (opts)
        s->o = *opts;
    if (!s->o.spool_option)
        s->o.spool_option = "the spool limit";
    if (!sink->spool_put || !sink->spool_get)
        s->o.spool_max = 0;
    s->items.size = sizeof(struct item);
    s->citems.size = sizeof(struct citem);
    s->hneed = 24;
    *out = s;
    return 0;
}

void qcow2_stream_free(struct qcow2_stream *s)
{
    if (!s)
        return;
    qcow2_spool_drop_all(s);
    free(s->hbuf);
    free(s->items.v);
    free(s->citems.v);
    free(s->mbuf);
    free(s->cbuf);
    free(s->tbuf);
    free(s->xbuf);
    for (unsigned i = 0; i < MAX_ACTIVE; i++)
        free(s->act[i].buf);
    free(s->reftable);
    for (unsigned i = 0; i < NLOOK; i++)
        free(s->look[i].buf);
    for (size_t i = 0; i < s->pages.len; i++)
        free(s->pages.ptr[i]);
    page_vector_reset(&s->pages);
    free(s->rczero);
    free(s->rb_seen);
    free(s->used);
    free(s->comp);
    qcow2_decompressor_free(s->dz);
    free(s);
}

const char *qcow2_stream_error(const struct qcow2_stream *s) { return s->e.msg; }
uint64_t qcow2_stream_position(const struct qcow2_stream *s) { return s->pos; }

const struct qcow2_header *qcow2_stream_header(const struct qcow2_stream *s)
{
    return s->have_header ? &s->h : NULL;
}

void qcow2_stream_stats(const struct qcow2_stream *s,
                        struct qcow2_stream_stats *out)
{
    *out = s->stats;
    out->began = s->began;
}

/* ---- small pieces ---------------------------------------------------------- */

static void take(void *dst, const uint8_t *buf, size_t n)
{
    if (buf)
        memcpy(dst, buf, n);
    else
        memset(dst, 0, n);
}

static uint64_t ilen(const struct item *it)   /* file bytes an item spans */
{
    return it->aux;
}

/* ---- HEAD -------------------------------------------------------------------- */

static int header_done(struct qcow2_stream *s)
{
    struct nbdf_err e = { "" };
    int r = qcow2_header_decode(s->hbuf, s->hgot, &s->h, &e);
    if (r < 0)
        return qcow2_fail(s, r, "%s", e.msg);
    if (s->o.max_size && s->h.size > s->o.max_size)
        return qcow2_fail(s, -ENOSPC, "the image's disk is %" PRIu64 " bytes, "
                    "larger than the destination (%" PRIu64 ")", s->h.size,
                    s->o.max_size);
    s->have_header = true;
    s->C = qcow2_cluster_size(&s->h);
    s->cb = s->h.cluster_bits;
    s->E = qcow2_l2_entries(&s->h);
    s->extl2 = qcow2_extended_l2(&s->h);
    s->overlay = s->h.backing_file_offset != 0;
    s->used = calloc(NPAGES, sizeof *s->used);
    s->comp = calloc(NPAGES, sizeof *s->comp);
    s->rczero = calloc(NPAGES, sizeof *s->rczero);
    s->rb_shift = s->cb + 3 - s->h.refcount_order;
    if (!s->used || !s->comp || !s->rczero)
        return qcow2_fail(s, -ENOMEM, "out of memory for the cluster bitmap");
    s->cbuf = malloc(s->C);
    s->tbuf = malloc(s->C);
    s->xbuf = malloc(s->C);
    if (!s->cbuf || !s->tbuf || !s->xbuf)
        return qcow2_fail(s, -ENOMEM, "out of memory for cluster buffers");
    uint64_t l1len = (uint64_t) s->h.l1_size * 8;
    uint64_t rtlen = s->h.refcount_table_clusters * s->C;
    if (qcow2_claim(s, 0, s->C, IT_HEAD) < 0 ||
        qcow2_claim(s, s->h.refcount_table_offset, rtlen, IT_RT) < 0 ||
        qcow2_push_item(s, s->h.refcount_table_offset, IT_RT, 0,
                  (uint32_t) rtlen) < 0)
        return s->err;
    if (l1len == 0) {
        s->l1_seen = true;
        qcow2_check_complete(s);
    } else if (qcow2_claim(s, s->h.l1_table_offset, l1len, IT_L1) < 0 ||
               qcow2_push_item(s, s->h.l1_table_offset, IT_L1, 0,
                         (uint32_t) l1len) < 0)
        return s->err;
    s->st = ST_BODY;
    return 0;
}

/* The file does not start with the magic: another format (or none)
 * written here by mistake.  Say which, from the first sector when this
 * feed holds it, with the errno every view uses for "not this format". */
static int not_qcow2(struct qcow2_stream *s, const uint8_t *head, size_t len)
{
    const char *known = image_kind_name(image_kind(head, len));
    if (known)
        return qcow2_fail(s, -EMEDIUMTYPE, "not a qcow2 image: its first "
                          "sector is %s; nothing was written", known);
    return qcow2_fail(s, -EMEDIUMTYPE, "not a qcow2 image: no \"QFI\\xfb\" "
                      "magic at byte 0 (a raw disk image or another format); "
                      "nothing was written");
}

static int64_t step_head(struct qcow2_stream *s, const uint8_t *buf,
                         uint64_t len)
{
    if (s->hgot < 24) {
        size_t n = (size_t) MIN(len, 24 - s->hgot);
        bool at0 = s->hgot == 0 && buf;   /* buf holds the file's start */
        take(s->hsmall + s->hgot, buf, n);
        s->hgot += n;
        if (s->hgot >= 4 && qcow2_be32(s->hsmall) != QCOW2_MAGIC)
            return not_qcow2(s, at0 ? buf : s->hsmall,
                             at0 ? (size_t) MIN(len, (uint64_t) 512) : s->hgot);
        if (s->hgot == 24) {
            s->hneed = qcow2_header_need(s->hsmall, 24);
            if (s->hneed == 24) {     /* bad cluster_bits: decode says so */
                s->hbuf = malloc(24);
                if (!s->hbuf)
                    return qcow2_fail(s, -ENOMEM, "out of memory");
                memcpy(s->hbuf, s->hsmall, 24);
                int r = header_done(s);
                return r < 0 ? r : (int64_t) n;
            }
            s->hbuf = malloc(s->hneed);
            if (!s->hbuf)
                return qcow2_fail(s, -ENOMEM, "out of memory for the header cluster");
            memcpy(s->hbuf, s->hsmall, 24);
        }
        return (int64_t) n;
    }
    size_t n = (size_t) MIN(len, s->hneed - s->hgot);
    take(s->hbuf + s->hgot, buf, n);
    s->hgot += n;
    if (s->hgot == s->hneed) {
        int r = header_done(s);
        if (r < 0)
            return r;
    }
    return (int64_t) n;
}

/* ---- BODY ---------------------------------------------------------------- */

/* At a cluster boundary: which item, if any, starts here. */
static int start_cluster(struct qcow2_stream *s)
{
    struct item it;

    s->cur.key = IT_NONE;
    s->c_nonzero = s->c_uncovered = false;
    if (!qcow2_heap_peek(&s->items, &it))
        return 0;
    uint64_t off = it.key & ~IT_MASK;
    assert(off >= s->pos);            /* entries behind are served at once */
    if (off != s->pos)
        return 0;
    qcow2_heap_pop(&s->items);
    s->cur = it;
    s->cur_end = off + ROUND_UP(ilen(&it), s->C);
    int kind = (int) (it.key & IT_MASK);
    if (kind == IT_DATA || kind == IT_SKIP) {
        s->cur_end = off + s->C;
        return 0;
    }
    s->mlen = ilen(&it);
    s->mgot = 0;
    if (s->mlen > s->mcap) {
        free(s->mbuf);
        s->mcap = 0;
        if (!(s->mbuf = malloc(s->mlen)))
            return qcow2_fail(s, -ENOMEM, "out of memory for %s", qcow2_kind_name(kind));
        s->mcap = s->mlen;
    }
    return 0;
}

static int meta_done(struct qcow2_stream *s)
{
    int kind = (int) (s->cur.key & IT_MASK);
    switch (kind) {
    case IT_L1: return qcow2_l1_parse(s, s->mbuf);
    case IT_RT: return qcow2_rt_parse(s, s->mbuf);
    case IT_RB: return qcow2_rb_parse(s, s->cur.arg, s->mbuf);
    case IT_L2: return qcow2_l2_parse(s, s->cur.arg, s->mbuf);
    }
    return 0;
}

/* Bytes of a data cluster, at cluster offset 'in'. */
static int data_bytes(struct qcow2_stream *s, uint64_t in, const uint8_t *buf,
                      uint64_t n)
{
    uint64_t disk = ((uint64_t) s->cur.arg << s->cb) + in;
    uint32_t alloc = s->cur.aux;
    if (alloc == UINT32_MAX)
        return qcow2_emit_data(s, disk, buf, n);
    uint64_t sc = s->C / 32;
    while (n > 0) {
        uint64_t k = MIN(n, sc - in % sc);
        if (alloc >> (in / sc) & 1)
            if (qcow2_emit_data(s, disk, buf, k) < 0)
                return s->err;
        disk += k, in += k, n -= k;
        if (buf)
            buf += k;
    }
    return 0;
}

/* End of a cluster nobody claimed (yet). */
static int unknown_done(struct qcow2_stream *s, uint64_t start)
{
    if (s->map_complete)
        return 0;
    if (s->c_uncovered && qcow2_known_free(s, start >> s->cb)) {
        s->stats.free_clusters++;     /* discarded: stale bytes */
        return 0;
    }
    if (s->c_uncovered)
        return qcow2_spool_put(s, start, s->cbuf);
    if (!s->c_nonzero)
        return qcow2_spool_zero_run(s, start, s->C, SP_ZERO);
    /* Compressed data of known clusters only: keep it a while (swap the
     * buffers, no copy). */
    unsigned i = s->look_next++ % NLOOK;
    if (!s->look[i].buf && !(s->look[i].buf = malloc(s->C)))
        return qcow2_fail(s, -ENOMEM, "out of memory for a cluster");
    uint8_t *t = s->look[i].buf;
    s->look[i].buf = s->cbuf;
    s->look[i].off = start;
    s->cbuf = t;
    return 0;
}

static int activate(struct qcow2_stream *s, const struct citem *c,
                    const uint8_t *buf, uint64_t avail)
{
    s->cov_end = MAX(s->cov_end, c->off + c->len);
    if (buf && avail >= c->len)       /* all there: no copy */
        return qcow2_dispatch(s, c, buf, c->len);
    if (s->nact == MAX_ACTIVE)
        return qcow2_fail(s, -EINVAL, "more than %u compressed clusters overlap at "
                    "byte %" PRIu64, MAX_ACTIVE, s->pos);
    struct active *a = &s->act[s->nact];
    /* Buffers stay with their slot: a range is at most two clusters. */
    if (!a->buf && !(a->buf = malloc(2 * s->C)))
        return qcow2_fail(s, -ENOMEM, "out of memory for a compressed cluster");
    assert(c->len <= 2 * s->C);
    a->c = *c;
    a->got = 0;
    s->nact++;
    return 0;
}

/* Feed n bytes to the active compressed ranges (each covers them). */
static int feed_active(struct qcow2_stream *s, const uint8_t *buf, uint64_t n)
{
    for (unsigned i = 0; i < s->nact;) {
        struct active *a = &s->act[i];
        take(a->buf + a->got, buf, (size_t) n);
        a->got += (uint32_t) n;
        if (a->got < a->c.len) {
            i++;
            continue;
        }
        int r = qcow2_dispatch(s, &a->c, a->buf, a->c.len);
        struct active t = *a;         /* keep the buffer in the spare slot */
        *a = s->act[--s->nact];
        s->act[s->nact] = t;
        if (r < 0)
            return r;
    }
    return 0;
}

static uint64_t active_end(const struct qcow2_stream *s)
{
    uint64_t end = UINT64_MAX;
    for (unsigned i = 0; i < s->nact; i++)
        end = MIN(end, s->act[i].c.off + s->act[i].c.len);
    return end;
}

static uint64_t next_item(const struct qcow2_stream *s)
{
    struct item it;
    return qcow2_heap_peek(&s->items, &it) ? it.key & ~IT_MASK : UINT64_MAX;
}

/* A run of whole unknown zero clusters (a hole of the file while nothing
 * else is due): recorded at once, not cluster by cluster. */
static int64_t skip_zeros(struct qcow2_stream *s, uint64_t len)
{
    struct citem c;
    uint64_t lim = MIN(next_item(s), qcow2_heap_peek(&s->citems, &c) ? c.off : UINT64_MAX);
    uint64_t n = ROUND_DOWN(MIN(len, lim - s->pos), s->C);
    if (n == 0)
        return 0;
    if (!s->map_complete && qcow2_spool_zero_run(s, s->pos, n, SP_ZERO) < 0)
        return s->err;
    return (int64_t) n;
}

static int64_t step_body(struct qcow2_stream *s, const uint8_t *buf,
                         uint64_t len)
{
    uint64_t in = s->pos & (s->C - 1);
    struct citem c;
    int r;

    if (in == 0 && (s->cur.key == IT_NONE || s->pos >= s->cur_end)) {
        if (!buf && s->nact == 0 && next_item(s) > s->pos) {
            int64_t n = skip_zeros(s, len);
            if (n != 0)
                return n;
        }
        if ((r = start_cluster(s)) < 0)
            return r;
    }
    /* Compressed ranges that start here. */
    while (qcow2_heap_peek(&s->citems, &c) && c.off <= s->pos) {
        assert(c.off == s->pos);
        qcow2_heap_pop(&s->citems);
        if ((r = activate(s, &c, buf, len)) < 0)
            return r;
    }
    uint64_t n = MIN(len, s->C - in);
    if (qcow2_heap_peek(&s->citems, &c))
        n = MIN(n, c.off - s->pos);
    n = MIN(n, active_end(s) - s->pos);
    bool covered = s->pos < s->cov_end;
    if (covered)
        n = MIN(n, s->cov_end - s->pos);
    assert(n > 0);

    if ((r = feed_active(s, buf, n)) < 0)
        return r;
    int kind = (int) (s->cur.key & IT_MASK);
    switch (kind) {
    case IT_DATA:
        if ((r = data_bytes(s, in, buf, n)) < 0)
            return r;
        break;
    case IT_SKIP:
        break;
    case IT_NONE:
        if (s->map_complete)
            break;
        take(s->cbuf + in, buf, (size_t) n);
        if (buf && !is_zero(buf, (size_t) n)) {
            s->c_nonzero = true;
            if (!covered)
                s->c_uncovered = true;
        }
        if (in + n == s->C && (r = unknown_done(s, s->pos + n - s->C)) < 0)
            return r;
        break;
    default: {                        /* metadata */
        uint64_t k = s->mgot < s->mlen ? MIN(n, s->mlen - s->mgot) : 0;
        take(s->mbuf + s->mgot, buf, (size_t) k);
        s->mgot += k;
        if (k && s->mgot == s->mlen) {
            s->pos += n;              /* tables it names lie after it */
            r = meta_done(s);
            s->pos -= n;
            if (r < 0)
                return r;
        }
        break;
    }
    }
    return (int64_t) n;
}

/* ---- driving -------------------------------------------------------------- */

static int64_t step(void *p, const uint8_t *buf, uint64_t len)
{
    struct qcow2_stream *s = p;
    return s->st == ST_HEAD ? step_head(s, buf, len) : step_body(s, buf, len);
}

static int accept(struct qcow2_stream *s, uint64_t off, const uint8_t *buf,
                  uint64_t len)
{
    struct fileorder_decoder d = { &s->pos, step, s, &s->err, &s->e };
    return fileorder_accept(&s->order, &d, "a qcow2", off, buf, len);
}

int qcow2_stream_feed(struct qcow2_stream *s, uint64_t file_off,
                      const void *buf, size_t len)
{
    if (file_off == 0 && s->pos == 0 && !s->first_seen) {
        s->first = image_kind(buf, len);      /* what a refusal names */
        s->first_seen = true;
    }
    return accept(s, file_off, buf, len);
}

enum image_kind qcow2_stream_first_kind(const struct qcow2_stream *s)
{
    return s->first;
}

int qcow2_stream_hole(struct qcow2_stream *s, uint64_t file_off, uint64_t len)
{
    return accept(s, file_off, NULL, len);
}

/* The file may end inside compressed data that runs to the end of its
 * last sector (qemu pads to a sector, but a cut tail is only zeros). */
static int finish_active(struct qcow2_stream *s)
{
    while (s->nact > 0) {
        struct active *a = &s->act[--s->nact];
        int r = qcow2_dispatch(s, &a->c, a->buf, a->got);
        if (r < 0)
            return r;
    }
    return 0;
}

/* Where the current data cluster's bytes that matter end: its last
 * allocated subcluster, clipped to the disk (qemu does not extend the
 * file over unallocated subclusters of the last cluster). */
static uint64_t data_need(const struct qcow2_stream *s)
{
    uint64_t start = s->cur.key & ~IT_MASK, disk = (uint64_t) s->cur.arg << s->cb;
    uint64_t need = s->C;
    if (s->cur.aux != UINT32_MAX)
        need = (32 - (uint64_t) __builtin_clz(s->cur.aux)) * (s->C / 32);
    return start + MIN(need, s->h.size - disk);
}

int qcow2_stream_finish(struct qcow2_stream *s)
{
    struct item it;
    struct citem c;

    if (s->err)
        return s->err;
    if (s->st == ST_HEAD)
        return qcow2_fail(s, -EINVAL, "the file ended after %" PRIu64 " bytes, "
                    "inside the header", s->pos);
    int kind = (int) (s->cur.key & IT_MASK);
    if (kind != IT_NONE && kind != IT_DATA && kind != IT_SKIP &&
        s->mgot < s->mlen)
        return qcow2_fail(s, -EINVAL, "the file ended at byte %" PRIu64 " inside %s"
                    " (at byte %" PRIu64 ")", s->pos, qcow2_kind_name(kind),
                    s->cur.key & ~IT_MASK);
    if (kind == IT_DATA && s->pos < s->cur_end && s->pos < data_need(s))
        return qcow2_fail(s, -EINVAL, "the file ended at byte %" PRIu64 " inside the "
                    "data cluster for disk offset %" PRIu64, s->pos,
                    (uint64_t) s->cur.arg << s->cb);
    if (qcow2_heap_peek(&s->items, &it)) {
        int k = (int) (it.key & IT_MASK);
        return qcow2_fail(s, -EINVAL, "the file ended at byte %" PRIu64 " before %s "
                    "at byte %" PRIu64 "%s (%zu clusters missing: cut short, "
                    "or an entry points past the end)", s->pos, qcow2_kind_name(k),
                    it.key & ~IT_MASK, k == IT_DATA ? " (disk data)" : "",
                    s->items.n);
    }
    if (finish_active(s) < 0)
        return s->err;
    if (qcow2_heap_peek(&s->citems, &c))
        return qcow2_fail(s, -EINVAL, "the file ended at byte %" PRIu64 " before "
                    "the compressed cluster at byte %" PRIu64 " (disk offset %"
                    PRIu64 ")", s->pos, c.off, (uint64_t) c.guest << s->cb);
    if (!s->map_complete || !s->l1_seen)
        return qcow2_fail(s, -EINVAL, "the file ended at byte %" PRIu64 " before "
                    "its L1 table and L2 tables were complete", s->pos);
    return s->began ? 0 : qcow2_begin(s);        /* a disk of zeros */
}
