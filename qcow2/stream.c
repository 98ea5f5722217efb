/* qcow2/stream.c: forward-only decoder, qcow2 file bytes in file order to
 * raw-disk writes.  See the contract in qcow2/qcow2.h and the format notes
 * in docs/qcow2-format.md.
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
 *   none       not known (yet).  While the map is incomplete (the L1 table
 *              or one of its L2 tables has not arrived) such a cluster may
 *              be anything a later table names: if it is not all zero it
 *              is spooled, if it is all zero it is remembered as zero (no
 *              bytes kept).  Once the map is complete it is dropped.
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
 */
#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "qcow2/qcow2-internal.h"

enum st { ST_HEAD, ST_BODY };

/* Item kinds, kept in the low bits of a cluster-aligned offset. */
enum { IT_NONE = 0, IT_L1, IT_RT, IT_RB, IT_L2, IT_DATA, IT_SKIP, IT_HEAD,
       IT_ANY };
#define IT_MASK ((uint64_t) 0xf)

/* Two-level bitmaps: pages of 2^15 bits (4 KiB) made when first touched,
 * so a far-away claim costs a page, not a bitmap up to it. */
#define PAGE_SHIFT 15
#define NPAGES (QCOW2_MAX_HOST_CLUSTERS >> PAGE_SHIFT)
#define NGAPS 32
#define NLOOK 4                       /* passed compressed clusters kept */
#define MAX_ACTIVE 64                 /* compressed ranges open at once */
#define MAX_ITEMS (1u << 24)          /* clusters mapped ahead: 256 MiB */

struct item {                         /* a cluster-aligned thing ahead */
    uint64_t key;                     /* file offset | kind */
    uint32_t arg;                     /* guest cluster, L1 or refcount index */
    uint32_t aux;                     /* DATA: subclusters; L1/RT: bytes */
};

struct citem {                        /* a compressed range */
    uint64_t off;
    uint32_t guest;
    uint32_t len;
};

struct active {                       /* a compressed range being collected */
    struct citem c;
    uint32_t got;
    uint8_t *buf;
};

enum { SP_LIVE = 1, SP_ZERO = 2, SP_DEAD = 3 };
struct spent {                        /* a passed cluster run kept for later */
    uint64_t off, len;                /* LIVE: one cluster; ZERO: a run */
    int state;
};

struct heap {
    void *v;
    size_t n, cap, size;              /* size: bytes per element */
};

struct qcow2_stream {
    const struct qcow2_sink *sink;
    void *opaque;
    struct qcow2_stream_opts o;
    int err;                          /* sticky, negative */
    struct qcow2_err e;
    enum st st;
    uint64_t pos;                     /* next file byte expected */

    struct qcow2_header h;
    bool have_header;
    uint64_t C;                       /* cluster size */
    unsigned cb;                      /* cluster bits */
    uint64_t E;                       /* L2 entries per table */
    bool extl2, overlay;
    uint8_t hsmall[24];
    uint8_t *hbuf;                    /* HEAD: the first cluster */
    size_t hgot, hneed;

    /* BODY */
    struct heap items, citems;        /* struct item, struct citem */
    struct item cur;                  /* the current cluster's item */
    uint64_t cur_end;                 /* end of cur (file offset) */
    uint8_t *mbuf;                    /* cur's metadata bytes */
    uint64_t mgot, mlen, mcap;
    uint8_t *cbuf;                    /* an unknown cluster, assembled */
    bool c_nonzero, c_uncovered;      /* any byte / any uncovered byte != 0 */
    uint8_t *tbuf, *xbuf;             /* a cluster each: spool, inflate */
    struct active act[MAX_ACTIVE];
    unsigned nact;
    uint64_t cov_end;                 /* end of the compressed ranges begun */

    bool l1_seen, rt_seen, began, map_complete;
    uint64_t pending_l2, pending_rb;
    uint64_t *reftable;               /* refcount block offsets */
    uint64_t rt_entries;

    uint64_t **used, **comp;          /* a bit per host cluster, paged */
    uint64_t **rczero;                /* refcount 0, from blocks arrived */
    uint8_t *rb_seen;                 /* a byte per refcount table entry */
    unsigned rb_shift;                /* log2(refcount entries per block) */
    uint64_t **pages;                 /* every page made, to free */
    size_t npages, pages_cap;

    struct spent *sp;                 /* increasing off */
    size_t nsp, sp_cap;
    uint64_t spool_bytes;

    /* The last NLOOK passed clusters that held only compressed data of
     * known clusters: qemu puts the first compressed cluster of a new L2
     * table in the tail of the previous host cluster, before the table,
     * where it may lie wholly inside the last sector of a known range. */
    struct { uint64_t off; uint8_t *buf; } look[NLOOK];
    unsigned look_next;

    struct qcow2_decompressor *dz;
    struct { uint64_t off, len; } gaps[NGAPS];
    unsigned gap_next;
    struct qcow2_stream_stats stats;
};

__attribute__((format(printf, 3, 4)))
static int fail(struct qcow2_stream *s, int code, const char *fmt, ...)
{
    if (!s->err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(s->e.msg, sizeof s->e.msg, fmt, ap);
        va_end(ap);
        s->err = code;
    }
    return s->err;
}

int qcow2_stream_new(const struct qcow2_sink *sink, void *opaque,
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
    if (!s->o.spool)
        s->o.spool_max = 0;
    s->items.size = sizeof(struct item);
    s->citems.size = sizeof(struct citem);
    s->hneed = 24;
    *out = s;
    return 0;
}

static void drop_spool(struct qcow2_stream *s)
{
    for (size_t i = 0; i < s->nsp; i++)
        if (s->sp[i].state == SP_LIVE) {
            s->o.spool->drop(s->o.spool_opaque, s->sp[i].off);
            s->sp[i].state = SP_DEAD;
        }
    s->spool_bytes = 0;
    free(s->sp);
    s->sp = NULL;
    s->nsp = s->sp_cap = 0;
}

void qcow2_stream_free(struct qcow2_stream *s)
{
    if (!s)
        return;
    drop_spool(s);
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
    for (size_t i = 0; i < s->npages; i++)
        free(s->pages[i]);
    free(s->pages);
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

static int hpush(struct heap *h, const void *e)
{
    if (h->n == h->cap) {
        if (h->cap >= MAX_ITEMS)
            return -EFBIG;
        size_t cap = h->cap ? h->cap * 2 : 256;
        void *v = realloc(h->v, cap * h->size);
        if (!v)
            return -ENOMEM;
        h->v = v;
        h->cap = cap;
    }
    size_t i = h->n++;
    memcpy((uint8_t *) h->v + i * h->size, e, h->size);
    while (i > 0 && hkey(h, (i - 1) / 2) > hkey(h, i)) {
        hswap(h, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
    return 0;
}

static bool hpeek(const struct heap *h, void *e)
{
    if (h->n == 0)
        return false;
    memcpy(e, h->v, h->size);
    return true;
}

static void hpop(struct heap *h)
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

static const char *kind_name(int k)
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

static int emit_data(struct qcow2_stream *s, uint64_t disk_off,
                     const void *buf, uint64_t len)
{
    if (disk_off >= s->h.size || len == 0)
        return 0;
    len = MIN(len, s->h.size - disk_off);
    int r = buf ? s->sink->data(s->opaque, disk_off, buf, (size_t) len)
                : s->overlay ? s->sink->zero(s->opaque, disk_off, len) : 0;
    if (r < 0)
        return fail(s, r, "placing %" PRIu64 " bytes at disk offset %" PRIu64
                    ": %s", len, disk_off, strerror(-r));
    return 0;
}

static int emit_zero(struct qcow2_stream *s, uint64_t disk_off, uint64_t len)
{
    return emit_data(s, disk_off, NULL, len);
}

/* ---- ownership of host clusters ------------------------------------------- */

static int page_of(struct qcow2_stream *s, uint64_t **pages, uint64_t hc,
                   uint64_t **out)
{
    if (hc >= QCOW2_MAX_HOST_CLUSTERS)
        return fail(s, -EFBIG, "a cluster at byte %" PRIu64 " lies past the "
                    "decoder's limit of 2^30 host clusters", hc << s->cb);
    uint64_t **p = &pages[hc >> PAGE_SHIFT];
    if (!*p) {
        if (s->npages == s->pages_cap) {
            size_t cap = s->pages_cap ? s->pages_cap * 2 : 16;
            uint64_t **l = realloc(s->pages, cap * sizeof *l);
            if (!l)
                return fail(s, -ENOMEM, "out of memory for the cluster bitmap");
            s->pages = l;
            s->pages_cap = cap;
        }
        if (!(*p = calloc(1, (1u << PAGE_SHIFT) / 8)))
            return fail(s, -ENOMEM, "out of memory for the cluster bitmap");
        s->pages[s->npages++] = *p;
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
    return fail(s, -EINVAL, "the cluster at byte %" PRIu64 " is in use (by %s)"
                " but its refcount is 0: the refcounts are inconsistent "
                "(qemu-img check -r all repairs them)", hc << s->cb,
                kind_name(what));
}

/* Claim host clusters [off, off+len) for 'what' (a kind; compressed ranges
 * share clusters with each other only). */
static int claim(struct qcow2_stream *s, uint64_t off, uint64_t len, int what)
{
    uint64_t first = off >> s->cb, last = (off + len - 1) >> s->cb;
    for (uint64_t hc = first; hc <= last; hc++) {
        uint64_t *u, *c;
        if (page_of(s, s->used, hc, &u) < 0 || page_of(s, s->comp, hc, &c) < 0)
            return s->err;
        bool compressed = what == IT_NONE;
        if (bit(u, hc) || (!compressed && bit(c, hc)))
            return fail(s, -EINVAL, "the cluster at byte %" PRIu64 " is "
                        "claimed twice (the second time by %s)", hc << s->cb,
                        kind_name(what));
        set_bit(compressed ? c : u, hc);
        if (rc_check(s, hc, what) < 0)
            return s->err;
    }
    return 0;
}

/* ---- spool ------------------------------------------------------------------ */

static int sp_append(struct qcow2_stream *s, uint64_t off, uint64_t len,
                     int state)
{
    if (state == SP_ZERO && s->nsp && s->sp[s->nsp - 1].state == SP_ZERO &&
        s->sp[s->nsp - 1].off + s->sp[s->nsp - 1].len == off) {
        s->sp[s->nsp - 1].len += len;
        return 0;
    }
    if (s->nsp == s->sp_cap) {
        size_t cap = s->sp_cap ? s->sp_cap * 2 : 64;
        struct spent *p = realloc(s->sp, cap * sizeof *p);
        if (!p)
            return fail(s, -ENOMEM, "out of memory for the spool index");
        s->sp = p;
        s->sp_cap = cap;
    }
    s->sp[s->nsp++] = (struct spent) { off, len, state };
    return 0;
}

static int spool_put(struct qcow2_stream *s, uint64_t off, const uint8_t *buf)
{
    if (s->spool_bytes + s->C > s->o.spool_max)
        return fail(s, -EFBIG, "the cluster at byte %" PRIu64 " arrived before "
                    "the table that places it, and keeping it would take "
                    "more than %" PRIu64 " bytes of spool (raise %s)", off,
                    s->o.spool_max, s->o.spool_option);
    int r = s->o.spool->put(s->o.spool_opaque, off, buf, (size_t) s->C);
    if (r < 0)
        return fail(s, r, "spooling the cluster at byte %" PRIu64 ": %s", off,
                    strerror(-r));
    s->spool_bytes += s->C;
    s->stats.spooled_clusters++;
    s->stats.spool_peak = MAX(s->stats.spool_peak, s->spool_bytes);
    return sp_append(s, off, s->C, SP_LIVE);
}

static struct spent *sp_find(struct qcow2_stream *s, uint64_t off)
{
    size_t lo = 0, hi = s->nsp;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (s->sp[mid].off + s->sp[mid].len <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < s->nsp && s->sp[lo].off <= off && s->sp[lo].state != SP_DEAD)
        return &s->sp[lo];
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
static int read_passed(struct qcow2_stream *s, uint64_t off, uint8_t *out,
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
            return fail(s, -EINVAL, "%s at byte %" PRIu64 " is named after "
                        "the stream has passed it, and it was not kept (it "
                        "lies inside other compressed data, or was claimed "
                        "as something else)", what, off);
        uint64_t n = MIN(len, p->off + p->len - off);
        if (p->state == SP_ZERO)
            memset(out, 0, n);
        else {
            int r = s->o.spool->get(s->o.spool_opaque, p->off, s->tbuf,
                                    (size_t) s->C);
            if (r < 0)
                return fail(s, r, "reading the spooled cluster at byte %"
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
static int take_passed(struct qcow2_stream *s, uint64_t off, uint8_t *out,
                       const char *what)
{
    int r = read_passed(s, off, out, s->C, what);
    if (r < 0)
        return r;
    struct spent *p = sp_find(s, off);
    if (p && p->state == SP_LIVE) {
        s->o.spool->drop(s->o.spool_opaque, p->off);
        p->state = SP_DEAD;
        s->spool_bytes -= s->C;
    }
    return 0;
}

/* ---- compressed clusters --------------------------------------------------- */

static int dispatch(struct qcow2_stream *s, const struct citem *c,
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
        int r = s->sink->compressed(s->opaque, &q);
        if (r < 0)
            return fail(s, r, "compressed cluster for disk offset %" PRIu64
                        " (file byte %" PRIu64 "): %s", q.disk_off, c->off,
                        strerror(-r));
        return 0;
    }
    if (!s->dz && qcow2_decompressor_new(&s->dz) < 0)
        return fail(s, -ENOMEM, "out of memory for a decompressor");
    struct qcow2_err e = { "" };
    int64_t n = qcow2_compressed_decode(s->dz, &q, s->xbuf, &e);
    if (n < 0)
        return fail(s, (int) n, "%s", e.msg);
    return emit_data(s, q.disk_off, s->xbuf, (uint64_t) n);
}

static int add_compressed(struct qcow2_stream *s, uint64_t entry, uint64_t g)
{
    uint64_t off, len;
    qcow2_compressed_range(entry, s->cb, &off, &len);
    if (off < s->C || off >= QCOW2_MAX_HOST_OFFSET)
        return fail(s, -EINVAL, "compressed cluster for disk offset %" PRIu64
                    " at file byte %" PRIu64 " (inside the header or past "
                    "2^56)", g << s->cb, off);
    if (claim(s, off, len, IT_NONE) < 0)
        return s->err;
    struct citem c = { off, (uint32_t) g, (uint32_t) len };
    if (off >= s->pos) {
        int r = hpush(&s->citems, &c);
        return r < 0 ? fail(s, r, "too many compressed clusters ahead of the "
                            "stream") : 0;
    }
    if (off + len > s->pos)
        return fail(s, -EINVAL, "compressed cluster at file byte %" PRIu64
                    " straddles the table that names it", off);
    uint8_t *tmp = malloc(len);
    if (!tmp)
        return fail(s, -ENOMEM, "out of memory for a compressed cluster");
    int r = read_passed(s, off, tmp, len, "a compressed cluster");
    if (r == 0)
        r = dispatch(s, &c, tmp, len);
    free(tmp);
    return r;
}

/* ---- tables -------------------------------------------------------------- */

static int push_item(struct qcow2_stream *s, uint64_t off, int kind,
                     uint32_t arg, uint32_t aux)
{
    struct item it = { off | (uint64_t) kind, arg, aux };
    int r = hpush(&s->items, &it);
    if (r < 0)
        return fail(s, r, "more than %u clusters mapped ahead of the stream",
                    MAX_ITEMS);
    return 0;
}

static int check_cluster_off(struct qcow2_stream *s, uint64_t off,
                             const char *what, uint64_t index)
{
    if (!IS_ALIGNED(off, s->C))
        return fail(s, -EINVAL, "%s %" PRIu64 " points at byte %" PRIu64
                    ", not cluster-aligned", what, index, off);
    return 0;
}

static int l2_parse(struct qcow2_stream *s, uint32_t l1i, const uint8_t *b);
static int rb_parse(struct qcow2_stream *s, uint32_t rti, const uint8_t *b);

static void check_complete(struct qcow2_stream *s)
{
    if (s->l1_seen && s->rt_seen && s->pending_l2 == 0 && !s->map_complete) {
        s->map_complete = true;
        drop_spool(s);            /* nobody can claim what is left */
    }
}

/* A table entry naming cluster off: if the stream has passed it, parse or
 * place it now from the spool, else wait for it. */
static int want_table(struct qcow2_stream *s, uint64_t off, int kind,
                      uint32_t index, bool claimed)
{
    if (!claimed && claim(s, off, s->C, kind) < 0)
        return s->err;
    if (off >= s->pos)
        return push_item(s, off, kind, index, (uint32_t) s->C);
    uint8_t *tmp = malloc(s->C);
    if (!tmp)
        return fail(s, -ENOMEM, "out of memory for a table");
    int r = take_passed(s, off, tmp, kind_name(kind));
    if (r == 0)
        r = kind == IT_L2 ? l2_parse(s, index, tmp) : rb_parse(s, index, tmp);
    free(tmp);
    return r;
}

static int begin(struct qcow2_stream *s)
{
    assert(!s->began);
    s->began = true;
    int r = s->sink->begin(s->opaque, s->overlay ? QCOW2_OVERLAY
                                                 : QCOW2_STANDALONE, s->h.size);
    if (r < 0)
        return fail(s, r, "refused by the destination: %s", strerror(-r));
    return 0;
}

static int l1_parse(struct qcow2_stream *s, const uint8_t *b)
{
    for (uint32_t i = 0; i < s->h.l1_size; i++) {
        uint64_t e = qcow2_be64(b + (uint64_t) i * 8);
        if (e & QCOW2_L1_RESERVED)
            return fail(s, -EINVAL, "L1 entry %" PRIu32 " (0x%016" PRIx64 ") "
                        "has reserved bits set", i, e);
        if (check_cluster_off(s, e & QCOW2_L1_OFFSET_MASK, "L1 entry", i) < 0)
            return s->err;
        /* Claimed before begin: an L2 table on other metadata or named
         * twice is refused before the disk changes. */
        if ((e & QCOW2_L1_OFFSET_MASK) &&
            claim(s, e & QCOW2_L1_OFFSET_MASK, s->C, IT_L2) < 0)
            return s->err;
    }
    s->l1_seen = true;
    if (begin(s) < 0)
        return s->err;
    for (uint32_t i = 0; i < s->h.l1_size; i++) {
        uint64_t off = qcow2_be64(b + (uint64_t) i * 8) & QCOW2_L1_OFFSET_MASK;
        if (off == 0)
            continue;
        s->pending_l2++;
        if (want_table(s, off, IT_L2, i, true) < 0)
            return s->err;
    }
    check_complete(s);
    return 0;
}

static int rt_parse(struct qcow2_stream *s, const uint8_t *b)
{
    s->rt_entries = s->h.refcount_table_clusters * s->C / 8;
    s->reftable = malloc(s->rt_entries * 8);
    if (!s->reftable)
        return fail(s, -ENOMEM, "out of memory for the refcount table");
    for (uint64_t i = 0; i < s->rt_entries; i++) {
        uint64_t e = qcow2_be64(b + i * 8);
        s->reftable[i] = e & QCOW2_RT_OFFSET_MASK;
        if (e & 0x1ff)
            return fail(s, -EINVAL, "refcount table entry %" PRIu64 " (0x%016"
                        PRIx64 ") has reserved bits set", i, e);
        if (check_cluster_off(s, s->reftable[i], "refcount table entry", i) < 0)
            return s->err;
    }
    if (!(s->rb_seen = calloc(s->rt_entries, 1)))
        return fail(s, -ENOMEM, "out of memory for the refcount table");
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
                return fail(s, -EINVAL, "refcount block %" PRIu64 " at byte %"
                            PRIu64 " lies past 2^56", i, s->reftable[i]);
            s->pending_rb++;
            if (want_table(s, s->reftable[i], IT_RB, (uint32_t) i, false) < 0)
                return s->err;
        }
    s->rt_seen = true;
    check_complete(s);
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
static int rb_parse(struct qcow2_stream *s, uint32_t rti, const uint8_t *b)
{
    uint64_t n = 1ull << s->rb_shift, base = (uint64_t) rti << s->rb_shift;
    unsigned order = s->h.refcount_order;
    size_t gbytes = (size_t) 8 << order;          /* 64 entries */

    s->rb_seen[rti] = 1;
    for (uint64_t i = 0; i < n && base + i < QCOW2_MAX_HOST_CLUSTERS; i += 64) {
        const uint8_t *g = b + (i / 64) * gbytes;
        uint64_t zw = 0, hc = base + i, *z;
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

/* Place guest cluster g from host cluster off, subclusters 'alloc'. */
static int place_data(struct qcow2_stream *s, uint64_t g, uint64_t off,
                      uint32_t alloc)
{
    if (claim(s, off, s->C, IT_DATA) < 0)
        return s->err;
    s->stats.data_clusters++;
    if (off >= s->pos)
        return push_item(s, off, IT_DATA, (uint32_t) g, alloc);
    if (take_passed(s, off, s->xbuf, kind_name(IT_DATA)) < 0)
        return s->err;
    if (alloc == UINT32_MAX)
        return emit_data(s, g << s->cb, s->xbuf, s->C);
    uint64_t sc = s->C / 32;
    for (unsigned k = 0; k < 32; k++)
        if (alloc >> k & 1)
            if (emit_data(s, (g << s->cb) + k * sc, s->xbuf + k * sc, sc) < 0)
                return s->err;
    return 0;
}

static int l2_standard(struct qcow2_stream *s, uint64_t g, uint64_t e)
{
    uint64_t off = e & QCOW2_L2_OFFSET_MASK;

    if (e & QCOW2_L2_RESERVED)
        return fail(s, -EINVAL, "L2 entry for disk offset %" PRIu64 " (0x%016"
                    PRIx64 ") has reserved bits set", g << s->cb, e);
    if (check_cluster_off(s, off, "the L2 entry for disk cluster", g) < 0)
        return s->err;
    if (e & QCOW2_OFLAG_ZERO) {
        if (s->h.version == 2)
            return fail(s, -EINVAL, "L2 entry for disk offset %" PRIu64 " has "
                        "the zero flag, which version 2 does not have",
                        g << s->cb);
        s->stats.zero_clusters++;
        if (emit_zero(s, g << s->cb, s->C) < 0)
            return s->err;
        if (off == 0)
            return 0;
        if (claim(s, off, s->C, IT_SKIP) < 0)
            return s->err;
        return off >= s->pos ? push_item(s, off, IT_SKIP, (uint32_t) g, 0) : 0;
    }
    if (off == 0)
        return 0;                     /* unallocated */
    return place_data(s, g, off, UINT32_MAX);
}

static int l2_extended(struct qcow2_stream *s, uint64_t g, uint64_t e,
                       uint64_t bm)
{
    uint64_t off = e & QCOW2_L2_OFFSET_MASK;
    uint32_t alloc = (uint32_t) bm, zero = (uint32_t) (bm >> 32);
    uint64_t sc = s->C / 32;

    if (e & (QCOW2_L2_RESERVED | QCOW2_OFLAG_ZERO))
        return fail(s, -EINVAL, "L2 entry for disk offset %" PRIu64 " (0x%016"
                    PRIx64 ") has reserved bits set", g << s->cb, e);
    if (alloc & zero)
        return fail(s, -EINVAL, "L2 entry for disk offset %" PRIu64 ": "
                    "subclusters both allocated and zero (bitmap 0x%016"
                    PRIx64 ")", g << s->cb, bm);
    if (check_cluster_off(s, off, "the L2 entry for disk cluster", g) < 0)
        return s->err;
    if (alloc && off == 0)
        return fail(s, -EINVAL, "L2 entry for disk offset %" PRIu64 ": "
                    "allocated subclusters but no cluster offset", g << s->cb);
    if (zero)
        s->stats.zero_clusters++;
    for (unsigned k = 0; k < 32; k++)
        if (zero >> k & 1)
            if (emit_zero(s, (g << s->cb) + k * sc, sc) < 0)
                return s->err;
    if (off == 0)
        return 0;
    if (alloc)
        return place_data(s, g, off, alloc);
    if (claim(s, off, s->C, IT_SKIP) < 0)
        return s->err;
    return off >= s->pos ? push_item(s, off, IT_SKIP, (uint32_t) g, 0) : 0;
}

static int l2_parse(struct qcow2_stream *s, uint32_t l1i, const uint8_t *b)
{
    uint64_t nclusters = DIV_ROUND_UP(s->h.size, s->C);

    s->stats.l2_tables++;
    for (uint64_t j = 0; j < s->E; j++) {
        uint64_t g = (uint64_t) l1i * s->E + j;
        if (g >= nclusters)
            break;                    /* past the disk: not read */
        const uint8_t *p = b + j * (s->extl2 ? 16 : 8);
        uint64_t e = qcow2_be64(p);
        int r;
        if (e & QCOW2_OFLAG_COMPRESSED) {
            if (s->extl2 && qcow2_be64(p + 8) != 0)
                return fail(s, -EINVAL, "compressed L2 entry for disk offset %"
                            PRIu64 " with a subcluster bitmap", g << s->cb);
            r = add_compressed(s, e & ~(QCOW2_OFLAG_COMPRESSED |
                                        QCOW2_OFLAG_COPIED), g);
        } else if (s->extl2)
            r = l2_extended(s, g, e, qcow2_be64(p + 8));
        else
            r = l2_standard(s, g, e);
        if (r < 0)
            return r;
    }
    s->pending_l2--;
    check_complete(s);
    return 0;
}

/* ---- HEAD -------------------------------------------------------------------- */

static int header_done(struct qcow2_stream *s)
{
    struct qcow2_err e = { "" };
    int r = qcow2_header_decode(s->hbuf, s->hgot, &s->h, &e);
    if (r < 0)
        return fail(s, r, "%s", e.msg);
    if (s->o.max_size && s->h.size > s->o.max_size)
        return fail(s, -ENOSPC, "the image's disk is %" PRIu64 " bytes, "
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
        return fail(s, -ENOMEM, "out of memory for the cluster bitmap");
    s->cbuf = malloc(s->C);
    s->tbuf = malloc(s->C);
    s->xbuf = malloc(s->C);
    if (!s->cbuf || !s->tbuf || !s->xbuf)
        return fail(s, -ENOMEM, "out of memory for cluster buffers");
    uint64_t l1len = (uint64_t) s->h.l1_size * 8;
    uint64_t rtlen = s->h.refcount_table_clusters * s->C;
    if (claim(s, 0, s->C, IT_HEAD) < 0 ||
        claim(s, s->h.refcount_table_offset, rtlen, IT_RT) < 0 ||
        push_item(s, s->h.refcount_table_offset, IT_RT, 0,
                  (uint32_t) rtlen) < 0)
        return s->err;
    if (l1len == 0) {
        s->l1_seen = true;
        if (begin(s) < 0)
            return s->err;
        check_complete(s);
    } else if (claim(s, s->h.l1_table_offset, l1len, IT_L1) < 0 ||
               push_item(s, s->h.l1_table_offset, IT_L1, 0,
                         (uint32_t) l1len) < 0)
        return s->err;
    s->st = ST_BODY;
    return 0;
}

static int64_t step_head(struct qcow2_stream *s, const uint8_t *buf,
                         uint64_t len)
{
    if (s->hgot < 24) {
        size_t n = (size_t) MIN(len, 24 - s->hgot);
        take(s->hsmall + s->hgot, buf, n);
        s->hgot += n;
        if (s->hgot >= 4 && qcow2_be32(s->hsmall) != QCOW2_MAGIC)
            return fail(s, -EMEDIUMTYPE, "not a qcow2 image: no \"QFI\\xfb\" "
                        "magic at byte 0");
        if (s->hgot == 24) {
            s->hneed = qcow2_header_need(s->hsmall, 24);
            if (s->hneed == 24) {     /* bad cluster_bits: decode says so */
                s->hbuf = malloc(24);
                if (!s->hbuf)
                    return fail(s, -ENOMEM, "out of memory");
                memcpy(s->hbuf, s->hsmall, 24);
                int r = header_done(s);
                return r < 0 ? r : (int64_t) n;
            }
            s->hbuf = malloc(s->hneed);
            if (!s->hbuf)
                return fail(s, -ENOMEM, "out of memory for the header cluster");
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
    if (!hpeek(&s->items, &it))
        return 0;
    uint64_t off = it.key & ~IT_MASK;
    assert(off >= s->pos);            /* entries behind are served at once */
    if (off != s->pos)
        return 0;
    hpop(&s->items);
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
            return fail(s, -ENOMEM, "out of memory for %s", kind_name(kind));
        s->mcap = s->mlen;
    }
    return 0;
}

static int meta_done(struct qcow2_stream *s)
{
    int kind = (int) (s->cur.key & IT_MASK);
    switch (kind) {
    case IT_L1: return l1_parse(s, s->mbuf);
    case IT_RT: return rt_parse(s, s->mbuf);
    case IT_RB: return rb_parse(s, s->cur.arg, s->mbuf);
    case IT_L2: return l2_parse(s, s->cur.arg, s->mbuf);
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
        return emit_data(s, disk, buf, n);
    uint64_t sc = s->C / 32;
    while (n > 0) {
        uint64_t k = MIN(n, sc - in % sc);
        if (alloc >> (in / sc) & 1)
            if (emit_data(s, disk, buf, k) < 0)
                return s->err;
        disk += k, in += k, n -= k;
        if (buf)
            buf += k;
    }
    return 0;
}

/* End of a cluster nobody claimed (yet). */
/* Is cluster hc free by the refcounts that have arrived?  (A table that
 * names it later is refused for the refcount, so it need not be kept.) */
static bool known_free(const struct qcow2_stream *s, uint64_t hc)
{
    if (!s->reftable || hc >= QCOW2_MAX_HOST_CLUSTERS)
        return false;
    uint64_t k = hc >> s->rb_shift;
    if (k >= s->rt_entries || s->reftable[k] == 0)
        return true;
    const uint64_t *z = s->rczero[hc >> PAGE_SHIFT];
    return s->rb_seen[k] && z && bit(z, hc);
}

static int unknown_done(struct qcow2_stream *s, uint64_t start)
{
    if (s->map_complete)
        return 0;
    if (s->c_uncovered && known_free(s, start >> s->cb)) {
        s->stats.free_clusters++;     /* discarded: stale bytes */
        return 0;
    }
    if (s->c_uncovered)
        return spool_put(s, start, s->cbuf);
    if (!s->c_nonzero)
        return sp_append(s, start, s->C, SP_ZERO);
    /* Compressed data of known clusters only: keep it a while (swap the
     * buffers, no copy). */
    unsigned i = s->look_next++ % NLOOK;
    if (!s->look[i].buf && !(s->look[i].buf = malloc(s->C)))
        return fail(s, -ENOMEM, "out of memory for a cluster");
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
        return dispatch(s, c, buf, c->len);
    if (s->nact == MAX_ACTIVE)
        return fail(s, -EINVAL, "more than %u compressed clusters overlap at "
                    "byte %" PRIu64, MAX_ACTIVE, s->pos);
    struct active *a = &s->act[s->nact];
    /* Buffers stay with their slot: a range is at most two clusters. */
    if (!a->buf && !(a->buf = malloc(2 * s->C)))
        return fail(s, -ENOMEM, "out of memory for a compressed cluster");
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
        int r = dispatch(s, &a->c, a->buf, a->c.len);
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
    return hpeek(&s->items, &it) ? it.key & ~IT_MASK : UINT64_MAX;
}

/* A run of whole unknown zero clusters (a hole of the file while nothing
 * else is due): recorded at once, not cluster by cluster. */
static int64_t skip_zeros(struct qcow2_stream *s, uint64_t len)
{
    struct citem c;
    uint64_t lim = MIN(next_item(s), hpeek(&s->citems, &c) ? c.off : UINT64_MAX);
    uint64_t n = ROUND_DOWN(MIN(len, lim - s->pos), s->C);
    if (n == 0)
        return 0;
    if (!s->map_complete && sp_append(s, s->pos, n, SP_ZERO) < 0)
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
    while (hpeek(&s->citems, &c) && c.off <= s->pos) {
        assert(c.off == s->pos);
        hpop(&s->citems);
        if ((r = activate(s, &c, buf, len)) < 0)
            return r;
    }
    uint64_t n = MIN(len, s->C - in);
    if (hpeek(&s->citems, &c))
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

static int consume(struct qcow2_stream *s, const uint8_t *buf, uint64_t len)
{
    while (len > 0) {
        int64_t n = s->st == ST_HEAD ? step_head(s, buf, len)
                                     : step_body(s, buf, len);
        if (n < 0)
            return fail(s, (int) n, "%s", strerror((int) -n));
        s->pos += (uint64_t) n;
        len -= (uint64_t) n;
        if (buf)
            buf += n;
    }
    return 0;
}

static void remember_gap(struct qcow2_stream *s, uint64_t off, uint64_t len)
{
    unsigned last = (s->gap_next + NGAPS - 1) % NGAPS;
    if (s->gaps[last].len && s->gaps[last].off + s->gaps[last].len == off) {
        s->gaps[last].len += len;
        return;
    }
    s->gaps[s->gap_next].off = off;
    s->gaps[s->gap_next].len = len;
    s->gap_next = (s->gap_next + 1) % NGAPS;
}

static bool inside_gap(const struct qcow2_stream *s, uint64_t off,
                       uint64_t len)
{
    for (unsigned i = 0; i < NGAPS; i++)
        if (s->gaps[i].len && off >= s->gaps[i].off &&
            off + len <= s->gaps[i].off + s->gaps[i].len)
            return true;
    return false;
}

static int accept(struct qcow2_stream *s, uint64_t off, const uint8_t *buf,
                  uint64_t len)
{
    if (s->err)
        return s->err;
    if (off + len < off)
        return fail(s, -EINVAL, "write at %" PRIu64 " wraps around", off);
    if (off < s->pos) {
        uint64_t back = MIN(len, s->pos - off);
        if ((buf && !is_zero(buf, back)) || !inside_gap(s, off, back))
            return fail(s, -EINVAL, "write at byte %" PRIu64 " goes "
                        "backwards (the file has been read up to byte %"
                        PRIu64 "): a qcow2 must be written in file order",
                        off, s->pos);
        off += back;
        len -= back;
        if (buf)
            buf += back;
        if (len == 0)
            return 0;
    }
    if (off > s->pos) {
        uint64_t gap = off - s->pos;
        remember_gap(s, s->pos, gap);
        if (consume(s, NULL, gap) < 0)
            return s->err;
    }
    if (!buf)
        remember_gap(s, off, len);
    return consume(s, buf, len);
}

int qcow2_stream_feed(struct qcow2_stream *s, uint64_t file_off,
                      const void *buf, size_t len)
{
    return accept(s, file_off, buf, len);
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
        int r = dispatch(s, &a->c, a->buf, a->got);
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
        return fail(s, -EINVAL, "the file ended after %" PRIu64 " bytes, "
                    "inside the header", s->pos);
    int kind = (int) (s->cur.key & IT_MASK);
    if (kind != IT_NONE && kind != IT_DATA && kind != IT_SKIP &&
        s->mgot < s->mlen)
        return fail(s, -EINVAL, "the file ended at byte %" PRIu64 " inside %s"
                    " (at byte %" PRIu64 ")", s->pos, kind_name(kind),
                    s->cur.key & ~IT_MASK);
    if (kind == IT_DATA && s->pos < s->cur_end && s->pos < data_need(s))
        return fail(s, -EINVAL, "the file ended at byte %" PRIu64 " inside the "
                    "data cluster for disk offset %" PRIu64, s->pos,
                    (uint64_t) s->cur.arg << s->cb);
    if (hpeek(&s->items, &it)) {
        int k = (int) (it.key & IT_MASK);
        return fail(s, -EINVAL, "the file ended at byte %" PRIu64 " before %s "
                    "at byte %" PRIu64 "%s (%zu clusters missing: cut short, "
                    "or an entry points past the end)", s->pos, kind_name(k),
                    it.key & ~IT_MASK, k == IT_DATA ? " (disk data)" : "",
                    s->items.n);
    }
    if (finish_active(s) < 0)
        return s->err;
    if (hpeek(&s->citems, &c))
        return fail(s, -EINVAL, "the file ended at byte %" PRIu64 " before "
                    "the compressed cluster at byte %" PRIu64 " (disk offset %"
                    PRIu64 ")", s->pos, c.off, (uint64_t) c.guest << s->cb);
    if (!s->map_complete || !s->began)
        return fail(s, -EINVAL, "the file ended at byte %" PRIu64 " before "
                    "its L1 table and L2 tables were complete", s->pos);
    return 0;
}
