/* qcow2/tables.c: what the tables say, for the stream decoder
 * (qcow2/stream.c walks the file and calls in here).  The heaps of things
 * expected ahead, the ownership bitmaps and refcount checks, the spool
 * and the record of passed clusters, compressed clusters, and the parsing
 * of the L1 table and the refcount table and blocks: each entry that
 * names a cluster ahead is pushed, one that names a cluster already passed
 * is served from the spool at once.  L2 tables are qcow2/l2.c's.  See the
 * overview at the top of qcow2/stream.c. */
#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "qcow2/stream-internal.h"

/* ---- heaps (min by the first uint64_t of an element) ----------------------- */

static uint64_t hkey(const struct heap *h, size_t i)
{
    uint64_t k;
    memcpy(&k, (const uint8_t *) h->v + i * h->size, 8);
    return k;
}

static void hswap(struct heap *h, size_t i, size_t j)
{
    uint8_t t[24];
    uint8_t *a = (uint8_t *) h->v + i * h->size, *b = (uint8_t *) h->v + j * h->size;
    memcpy(t, a, h->size);
    memcpy(a, b, h->size);
    memcpy(b, t, h->size);
}

int qcow2_heap_push(struct heap *h, const void *e)
{
    if (h->n == h->cap && h->cap >= MAX_ITEMS)
        return -EFBIG;
    if (vector_grow(&h->v, &h->cap, h->n, 1, h->size, 256) < 0)
        return -ENOMEM;
    size_t i = h->n++;
    memcpy((uint8_t *) h->v + i * h->size, e, h->size);
    while (i > 0 && hkey(h, (i - 1) / 2) > hkey(h, i)) {
        hswap(h, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
    return 0;
}

bool qcow2_heap_peek(const struct heap *h, void *e)
{
    if (h->n == 0)
        return false;
    memcpy(e, h->v, h->size);
    return true;
}

void qcow2_heap_pop(struct heap *h)
{
    assert(h->n > 0);
    h->n--;
    if (h->n == 0)
        return;
    memcpy(h->v, (uint8_t *) h->v + h->n * h->size, h->size);
    for (size_t i = 0;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && hkey(h, l) < hkey(h, m))
            m = l;
        if (r < h->n && hkey(h, r) < hkey(h, m))
            m = r;
        if (m == i)
            break;
        hswap(h, i, m);
        i = m;
    }
}

/* ---- small pieces ----------------------------------------------------------- */

const char *qcow2_kind_name(int k)
{
    switch (k) {
    case IT_L1: return "the L1 table";
    case IT_RT: return "the refcount table";
    case IT_RB: return "a refcount block";
    case IT_L2: return "an L2 table";
    case IT_DATA: return "a data cluster";
    case IT_SKIP: return "a preallocated zero cluster";
    case IT_HEAD: return "the header";
    case IT_ANY: return "the image";
    default: return "a compressed cluster";
    }
}

int qcow2_emit_data(struct qcow2_stream *s, uint64_t disk_off,
                     const void *buf, uint64_t len)
{
    if (disk_off >= s->h.size || len == 0)
        return 0;
    if (!buf && !s->overlay)
        return 0;             /* a standalone disk reads as zero from begin()
                               * on: no call, and no begin() for it */
    if (!s->began && qcow2_begin(s) < 0)
        return s->err;
    len = MIN(len, s->h.size - disk_off);
    int r = buf ? s->sink->data(s->opaque, disk_off, buf, (size_t) len)
                : s->sink->zero(s->opaque, disk_off, len);
    if (r < 0)
        return qcow2_fail(s, r, "placing %" PRIu64 " bytes at disk offset %" PRIu64
                    ": %s", len, disk_off, strerror(-r));
    return 0;
}

int qcow2_emit_zero(struct qcow2_stream *s, uint64_t disk_off, uint64_t len)
{
    return qcow2_emit_data(s, disk_off, NULL, len);
}

int qcow2_emit_map(struct qcow2_stream *s, uint64_t disk_off, uint64_t len,
                   enum qcow2_map what, uint64_t file_off)
{
    if (!s->sink->map || disk_off >= s->h.size)
        return 0;
    int r = s->sink->map(s->opaque, disk_off, MIN(len, s->h.size - disk_off),
                         (int) what, file_off);
    return r < 0 ? qcow2_fail(s, r, "mapping disk offset %" PRIu64 ": %s",
                              disk_off, strerror(-r)) : 0;
}

/* ---- ownership of host clusters ------------------------------------------- */

static int page_of(struct qcow2_stream *s, uint64_t **pages, uint64_t hc,
                   uint64_t **out)
{
    if (hc >= QCOW2_MAX_HOST_CLUSTERS)
        return qcow2_fail(s, -EFBIG, "a cluster at byte %" PRIu64 " lies past the "
                    "decoder's limit of 2^30 host clusters", hc << s->cb);
    uint64_t **p = &pages[hc >> PAGE_SHIFT];
    if (!*p) {
        if (page_vector_reserve(&s->pages, 1) < 0)
            return qcow2_fail(s, -ENOMEM, "out of memory for the cluster bitmap");
        if (!(*p = calloc(1, (1u << PAGE_SHIFT) / 8)))
            return qcow2_fail(s, -ENOMEM, "out of memory for the cluster bitmap");
        s->pages.ptr[s->pages.len++] = *p;
    }
    *out = *p;
    return 0;
}

static bool bit(const uint64_t *m, uint64_t hc)
{
    uint64_t i = hc & ((1u << PAGE_SHIFT) - 1);
    return m[i / 64] >> (i % 64) & 1;
}

static void set_bit(uint64_t *m, uint64_t hc)
{
    uint64_t i = hc & ((1u << PAGE_SHIFT) - 1);
    m[i / 64] |= 1ull << (i % 64);
}

static bool claimed(const struct qcow2_stream *s, uint64_t hc)
{
    const uint64_t *u = s->used[hc >> PAGE_SHIFT], *c = s->comp[hc >> PAGE_SHIFT];
    return (u && bit(u, hc)) || (c && bit(c, hc));
}

/* Refcounts that matter: a cluster the image uses must not have refcount
 * 0 (qemu would hand it out again: the image is damaged).  Checked when
 * the claim, the refcount table and the cluster's refcount block are all
 * known, whichever comes last. */
static int rc_check(struct qcow2_stream *s, uint64_t hc, int what)
{
    if (!s->reftable)
        return 0;                     /* checked when the table arrives */
    uint64_t k = hc >> s->rb_shift;
    const uint64_t *z = s->rczero[hc >> PAGE_SHIFT];
    bool zero = k >= s->rt_entries || s->reftable[k] == 0 ||
                (s->rb_seen[k] && z && bit(z, hc));
    if (!zero)
        return 0;
    return qcow2_fail(s, -EINVAL, "the cluster at byte %" PRIu64 " is in use (by %s)"
                " but its refcount is 0: the refcounts are inconsistent "
                "(qemu-img check -r all repairs them)", hc << s->cb,
                qcow2_kind_name(what));
}

/* Claim host clusters [off, off+len) for 'what' (a kind; compressed ranges
 * share clusters with each other only). */
int qcow2_claim(struct qcow2_stream *s, uint64_t off, uint64_t len, int what)
{
    uint64_t first = off >> s->cb, last = (off + len - 1) >> s->cb;
    for (uint64_t hc = first; hc <= last; hc++) {
        uint64_t *u = NULL, *c = NULL;
        if (page_of(s, s->used, hc, &u) < 0 || page_of(s, s->comp, hc, &c) < 0)
            return s->err;
        bool compressed = what == IT_NONE;
        if (bit(u, hc) || (!compressed && bit(c, hc)))
            return qcow2_fail(s, -EINVAL, "the cluster at byte %" PRIu64 " is "
                        "claimed twice (the second time by %s)", hc << s->cb,
                        qcow2_kind_name(what));
        set_bit(compressed ? c : u, hc);
        if (rc_check(s, hc, what) < 0)
            return s->err;
    }
    return 0;
}

/* ---- spool ------------------------------------------------------------------ */

/* Every spooled cluster dropped (the stream is failing or done). */
void qcow2_spool_drop_all(struct qcow2_stream *s)
{
    for (size_t i = 0; i < s->sp.len; i++)
        if (s->sp.ptr[i].state == SP_LIVE) {
            if (s->sink->spool_drop)
                s->sink->spool_drop(s->opaque, s->sp.ptr[i].off);
            s->sp.ptr[i].state = SP_DEAD;
        }
    s->spool_bytes = 0;
    spent_vector_reset(&s->sp);
}

int qcow2_spool_zero_run(struct qcow2_stream *s, uint64_t off, uint64_t len,
                     int state)
{
    struct spent *last = s->sp.len ? &s->sp.ptr[s->sp.len - 1] : NULL;
    if (state == SP_ZERO && last && last->state == SP_ZERO &&
        last->off + last->len == off) {
        last->len += len;
        return 0;
    }
    if (spent_vector_append(&s->sp, (struct spent) { off, len, state }) < 0)
        return qcow2_fail(s, -ENOMEM, "out of memory for the spool index");
    return 0;
}

int qcow2_spool_put(struct qcow2_stream *s, uint64_t off, const uint8_t *buf)
{
    if (s->spool_bytes + s->C > s->o.spool_max)
        return qcow2_fail(s, -EFBIG, "the cluster at byte %" PRIu64 " arrived before "
                    "the table that places it, and keeping it would take "
                    "more than %" PRIu64 " bytes of spool (raise %s)", off,
                    s->o.spool_max, s->o.spool_option);
    int r = s->sink->spool_put(s->opaque, off, buf, (size_t) s->C);
    if (r < 0)
        return qcow2_fail(s, r, "spooling the cluster at byte %" PRIu64 ": %s", off,
                    strerror(-r));
    s->spool_bytes += s->C;
    s->stats.spooled_clusters++;
    s->stats.spool_peak = MAX(s->stats.spool_peak, s->spool_bytes);
    return qcow2_spool_zero_run(s, off, s->C, SP_LIVE);
}

static struct spent *sp_find(struct qcow2_stream *s, uint64_t off)
{
    size_t lo = 0, hi = s->sp.len;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (s->sp.ptr[mid].off + s->sp.ptr[mid].len <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < s->sp.len && s->sp.ptr[lo].off <= off &&
        s->sp.ptr[lo].state != SP_DEAD)
        return &s->sp.ptr[lo];
    return NULL;
}

static const uint8_t *look_find(const struct qcow2_stream *s, uint64_t off)
{
    for (unsigned i = 0; i < NLOOK; i++)
        if (s->look[i].buf && s->look[i].off == ROUND_DOWN(off, s->C))
            return s->look[i].buf;
    return NULL;
}

/* Bytes [off, off+len) of the file, already passed: from the spool or the
 * zero record.  -ENOENT if they were not kept. */
int qcow2_read_passed(struct qcow2_stream *s, uint64_t off, uint8_t *out,
                      uint64_t len, const char *what)
{
    while (len > 0) {
        struct spent *p = sp_find(s, off);
        const uint8_t *lb = look_find(s, off);
        if (!p && lb) {
            uint64_t n = MIN(len, s->C - (off & (s->C - 1)));
            memcpy(out, lb + (off & (s->C - 1)), n);
            off += n, out += n, len -= n;
            continue;
        }
        if (!p)
            return qcow2_fail(s, -EINVAL, "%s at byte %" PRIu64 " is named after "
                        "the stream has passed it, and it was not kept (it "
                        "lies inside other compressed data, or was claimed "
                        "as something else)", what, off);
        uint64_t n = MIN(len, p->off + p->len - off);
        if (p->state == SP_ZERO)
            memset(out, 0, n);
        else {
            int r = s->sink->spool_get(s->opaque, p->off, s->tbuf,
                                       (size_t) s->C);
            if (r < 0)
                return qcow2_fail(s, r, "reading the spooled cluster at byte %"
                            PRIu64 ": %s", p->off, strerror(-r));
            memcpy(out, s->tbuf + (off - p->off), n);
        }
        off += n;
        out += n;
        len -= n;
    }
    return 0;
}

/* A whole passed cluster, for one use: dropped from the spool after. */
int qcow2_take_passed(struct qcow2_stream *s, uint64_t off, uint8_t *out,
                      const char *what)
{
    int r = qcow2_read_passed(s, off, out, s->C, what);
    if (r < 0)
        return r;
    struct spent *p = sp_find(s, off);
    if (p && p->state == SP_LIVE) {
        if (s->sink->spool_drop)
            s->sink->spool_drop(s->opaque, p->off);
        p->state = SP_DEAD;
        s->spool_bytes -= s->C;
    }
    return 0;
}

/* ---- compressed clusters --------------------------------------------------- */

int qcow2_dispatch(struct qcow2_stream *s, const struct citem *c,
                    const uint8_t *data, size_t len)
{
    struct qcow2_compressed q = {
        .disk_off = (uint64_t) c->guest << s->cb, .file_off = c->off,
        .cdata = data, .clen = len, .cluster_size = (size_t) s->C,
        .type = s->h.compression_type,
    };
    q.place_len = (size_t) MIN(s->C, s->h.size - q.disk_off);
    s->stats.compressed_clusters++;
    if (s->sink->compressed) {
        if (!s->began && qcow2_begin(s) < 0)
            return s->err;
        int r = s->sink->compressed(s->opaque, &q, q.cdata, q.clen);
        if (r < 0)
            return qcow2_fail(s, r, "compressed cluster for disk offset %" PRIu64
                        " (file byte %" PRIu64 "): %s", q.disk_off, c->off,
                        strerror(-r));
        return 0;
    }
    if (!s->dz && qcow2_decompressor_new(&s->dz) < 0)
        return qcow2_fail(s, -ENOMEM, "out of memory for a decompressor");
    struct nbdf_err e = { "" };
    int64_t n = qcow2_compressed_decode(s->dz, &q, s->xbuf, &e);
    if (n < 0)
        return qcow2_fail(s, (int) n, "%s", e.msg);
    return qcow2_emit_data(s, q.disk_off, s->xbuf, (uint64_t) n);
}

/* ---- tables -------------------------------------------------------------- */

int qcow2_push_item(struct qcow2_stream *s, uint64_t off, int kind,
                     uint32_t arg, uint32_t aux)
{
    struct item it = { off | (uint64_t) kind, arg, aux };
    int r = qcow2_heap_push(&s->items, &it);
    if (r < 0)
        return qcow2_fail(s, r, "more than %u clusters mapped ahead of the stream",
                    MAX_ITEMS);
    return 0;
}

int qcow2_check_cluster_off(struct qcow2_stream *s, uint64_t off,
                            const char *what, uint64_t index)
{
    if (!IS_ALIGNED(off, s->C))
        return qcow2_fail(s, -EINVAL, "%s %" PRIu64 " points at byte %" PRIu64
                    ", not cluster-aligned", what, index, off);
    return 0;
}


void qcow2_check_complete(struct qcow2_stream *s)
{
    if (s->l1_seen && s->rt_seen && s->pending_l2 == 0 && !s->map_complete) {
        s->map_complete = true;
        qcow2_spool_drop_all(s);            /* nobody can claim what is left */
    }
}

/* A refcount table entry naming block off: if the stream has passed it,
 * parse it now from the spool, else wait for it. */
static int want_rb(struct qcow2_stream *s, uint64_t off, uint32_t index)
{
    if (qcow2_claim(s, off, s->C, IT_RB) < 0)
        return s->err;
    if (off >= s->pos)
        return qcow2_push_item(s, off, IT_RB, index, (uint32_t) s->C);
    uint8_t *tmp = malloc(s->C);
    if (!tmp)
        return qcow2_fail(s, -ENOMEM, "out of memory for a table");
    int r = qcow2_take_passed(s, off, tmp, qcow2_kind_name(IT_RB));
    if (r == 0)
        r = qcow2_rb_parse(s, index, tmp);
    free(tmp);
    return r;
}

/* Bytes [off, off+len) of the file, already passed, are still held (the
 * spool, the zero record or a recent cluster of compressed data): what
 * qcow2_read_passed() would find, without reading it. */
int qcow2_passed_kept(struct qcow2_stream *s, uint64_t off, uint64_t len,
                      const char *what)
{
    while (len > 0) {
        const struct spent *p = sp_find(s, off);
        uint64_t n;
        if (p)
            n = MIN(len, p->off + p->len - off);
        else if (look_find(s, off))
            n = MIN(len, s->C - (off & (s->C - 1)));
        else
            return qcow2_fail(s, -EINVAL, "%s at byte %" PRIu64 " is named after "
                        "the stream has passed it, and it was not kept (it "
                        "lies inside other compressed data, or was claimed "
                        "as something else)", what, off);
        off += n;
        len -= n;
    }
    return 0;
}

/* Just before the first write (or at finish, for a disk with none): so
 * that a table damaged before any data is due (an L2 table checked whole
 * before the clusters it maps arrive, as qemu-img lays them out) is
 * refused with the disk untouched. */
int qcow2_begin(struct qcow2_stream *s)
{
    assert(!s->began);
    s->began = true;
    struct nbdf_begin b = {
        .kind = s->overlay ? QCOW2_OVERLAY : QCOW2_STANDALONE,
        .kind_name = s->overlay ? "overlay" : "standalone",
        .size = s->h.size, .overlay = s->overlay, .info = &s->h,
    };
    int r = s->sink->begin(s->opaque, &b);
    if (r < 0)
        return qcow2_fail(s, r, "refused by the destination: %s", strerror(-r));
    return 0;
}

int qcow2_rt_parse(struct qcow2_stream *s, const uint8_t *b)
{
    s->rt_entries = s->h.refcount_table_clusters * s->C / 8;
    s->reftable = malloc(s->rt_entries * 8);
    if (!s->reftable)
        return qcow2_fail(s, -ENOMEM, "out of memory for the refcount table");
    for (uint64_t i = 0; i < s->rt_entries; i++) {
        uint64_t e = qcow2_be64(b + i * 8);
        s->reftable[i] = e & QCOW2_RT_OFFSET_MASK;
        if (e & 0x1ff)
            return qcow2_fail(s, -EINVAL, "refcount table entry %" PRIu64 " (0x%016"
                        PRIx64 ") has reserved bits set", i, e);
        if (qcow2_check_cluster_off(s, s->reftable[i], "refcount table entry", i) < 0)
            return s->err;
    }
    if (!(s->rb_seen = calloc(s->rt_entries, 1)))
        return qcow2_fail(s, -ENOMEM, "out of memory for the refcount table");
    /* What was claimed before the table arrived. */
    for (uint64_t p = 0; p < NPAGES; p++) {
        if (!s->used[p] && !s->comp[p])
            continue;
        for (uint64_t hc = p << PAGE_SHIFT; hc < (p + 1) << PAGE_SHIFT; hc++)
            if (claimed(s, hc) && rc_check(s, hc, IT_ANY) < 0)
                return s->err;
    }
    for (uint64_t i = 0; i < s->rt_entries; i++)
        if (s->reftable[i]) {
            if (s->reftable[i] >= QCOW2_MAX_HOST_OFFSET)
                return qcow2_fail(s, -EINVAL, "refcount block %" PRIu64 " at byte %"
                            PRIu64 " lies past 2^56", i, s->reftable[i]);
            s->pending_rb++;
            if (want_rb(s, s->reftable[i], (uint32_t) i) < 0)
                return s->err;
        }
    s->rt_seen = true;
    qcow2_check_complete(s);
    return 0;
}

/* Is entry i of a refcount block 0?  Sub-byte widths count from the
 * least significant bit; wider ones are big-endian. */
static bool rc_zero(const uint8_t *b, uint64_t i, unsigned order)
{
    if (order < 3) {
        unsigned per = 8u >> order, w = 1u << order;
        return !((b[i / per] >> (w * (i % per))) & ((1u << w) - 1));
    }
    unsigned n = 1u << (order - 3);
    return is_zero(b + i * n, n);
}

/* A word of the bitmap page m for clusters hc..hc+63 (hc a multiple of
 * 64), 0 if the page does not exist. */
static uint64_t word(uint64_t *const *pages, uint64_t hc)
{
    const uint64_t *m = pages[hc >> PAGE_SHIFT];
    return m ? m[(hc & ((1u << PAGE_SHIFT) - 1)) / 64] : 0;
}

/* Refcount block rti: remember its zero entries, 64 at a time (a bitmap
 * word; the entries of an all-zero stretch at once), and refuse one that
 * a claimed cluster has. */
int qcow2_rb_parse(struct qcow2_stream *s, uint32_t rti, const uint8_t *b)
{
    uint64_t n = 1ull << s->rb_shift, base = (uint64_t) rti << s->rb_shift;
    unsigned order = s->h.refcount_order;
    size_t gbytes = (size_t) 8 << order;          /* 64 entries */

    s->rb_seen[rti] = 1;
    for (uint64_t i = 0; i < n && base + i < QCOW2_MAX_HOST_CLUSTERS; i += 64) {
        const uint8_t *g = b + (i / 64) * gbytes;
        uint64_t zw = 0, hc = base + i, *z = NULL;
        if (is_zero(g, gbytes))
            zw = UINT64_MAX;
        else
            for (unsigned k = 0; k < 64; k++)
                if (rc_zero(g, k, order))
                    zw |= 1ull << k;
        if (zw == 0)
            continue;
        if (page_of(s, s->rczero, hc, &z) < 0)
            return s->err;
        z[(hc & ((1u << PAGE_SHIFT) - 1)) / 64] |= zw;
        uint64_t bad = zw & (word(s->used, hc) | word(s->comp, hc));
        if (bad)
            return rc_check(s, hc + (uint64_t) __builtin_ctzll(bad), IT_ANY);
    }
    s->pending_rb--;
    s->stats.refcount_blocks++;
    return 0;
}

/* Is cluster hc free by the refcounts that have arrived?  (A table that
 * names it later is refused for the refcount, so it need not be kept.) */
bool qcow2_known_free(const struct qcow2_stream *s, uint64_t hc)
{
    if (!s->reftable || hc >= QCOW2_MAX_HOST_CLUSTERS)
        return false;
    uint64_t k = hc >> s->rb_shift;
    if (k >= s->rt_entries || s->reftable[k] == 0)
        return true;
    const uint64_t *z = s->rczero[hc >> PAGE_SHIFT];
    return s->rb_seen[k] && z && bit(z, hc);
}
