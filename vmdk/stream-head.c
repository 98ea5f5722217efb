/* vmdk/stream-head.c: the decoder's first two states.  HEADER collects
 * and checks sector 0 and sets up what the kind of file needs (the grain
 * directory and table buffers of a monolithicSparse file or of a
 * streamOptimized one whose tables lie in the overhead; the grain buffers
 * and inflater of a streamOptimized one).  PRE walks the overhead,
 * collecting the descriptor, the grain directory and each grain table in
 * file order, builds the grain map from them, and at the overhead's end
 * checks the map and hands over to GRAINS or MARKER (vmdk/stream-grains.c).
 * See vmdk/stream.c for the whole state machine. */
#include "vmdk/stream-internal.h"

static bool overlaps(uint64_t a, uint64_t alen, uint64_t b, uint64_t blen)
{
    return a < b + blen && b < a + alen;
}

/* ---- HEADER ------------------------------------------------------------------ */

static int setup_sparse(struct vmdk_stream *s)
{
    s->ngts = vmdk_header_gts(&s->h);
    if (s->ngts > GD_MAX_ENTRIES)
        return fail(s, -EFBIG, "grain directory of %" PRIu64 " entries "
                    "(limit %u)", s->ngts, GD_MAX_ENTRIES);
    s->gd_off = s->h.gd_offset * VMDK_SECTOR;
    s->gd_len = s->ngts * 4;
    s->gt_len = (uint64_t) s->h.gtes_per_gt * 4;
    s->gd = malloc(s->gd_len);
    s->gtbuf = malloc(s->gt_len);
    if (!s->gd || !s->gtbuf)
        return fail(s, -ENOMEM, "out of memory for the grain directory");
    return 0;
}

/* A streamOptimized header with a real grain directory that lies inside
 * the overhead, clear of the descriptor (qemu-img writes one and fills its
 * tables as grains go out): its tables arrive before the first marker. */
static bool stream_tables_ahead(const struct vmdk_stream *s)
{
    const struct vmdk_header *h = &s->h;
    uint64_t gd_sectors = vmdk_div_up(vmdk_header_gts(h) * 4, VMDK_SECTOR);
    if (h->gd_offset == 0 || h->gd_offset == VMDK_GD_AT_END ||
        h->gd_offset >= h->overhead || gd_sectors > h->overhead - h->gd_offset ||
        vmdk_header_gts(h) > GD_MAX_ENTRIES)
        return false;
    return !overlaps(h->gd_offset, gd_sectors, h->desc_offset, h->desc_size);
}

static int setup_stream(struct vmdk_stream *s)
{
    s->seen = calloc(s->ngrains / 64 + 1, sizeof *s->seen);
    s->cbuf = malloc(vmdk_compressed_max(s->grain_bytes));
    s->gbuf = malloc(s->grain_bytes);
    if (!s->seen || !s->cbuf || !s->gbuf || vmdk_inflater_new(&s->z) < 0)
        return fail(s, -ENOMEM, "out of memory for grain buffers");
    if (!stream_tables_ahead(s))
        return 0;
    s->tables = true;
    s->listed = calloc(s->ngrains / 64 + 1, sizeof *s->listed);
    if (!s->listed)
        return fail(s, -ENOMEM, "out of memory for the grain map");
    return setup_sparse(s);
}

/* A first sector without the sparse magic is another format (or none)
 * written here by mistake: say which, with the one errno every view
 * uses for "not this format". */
static int not_vmdk(struct vmdk_stream *s)
{
    const char *known = image_kind_name(s->first_kind);
    if (known)
        return fail(s, -EMEDIUMTYPE, "not a VMDK sparse extent: its first "
                    "sector is %s; nothing was written", known);
    return fail(s, -EMEDIUMTYPE, "not a VMDK sparse extent: its first "
                "sector has no \"KDMV\" magic (a raw disk image or "
                "another format); nothing was written");
}

static int header_done(struct vmdk_stream *s)
{
    struct nbdf_err e = { "" };
    s->first_kind = image_kind(s->sect, VMDK_SECTOR);
    if (memcmp(s->sect, "KDMV", 4) != 0)
        return not_vmdk(s);
    int r = vmdk_header_decode(s->sect, &s->h, &e);
    if (r < 0)
        return fail(s, r, "%s", e.msg);
    s->grain_bytes = vmdk_header_grain_bytes(&s->h);
    s->capacity = s->h.capacity * VMDK_SECTOR;
    s->ngrains = vmdk_header_grains(&s->h);
    s->overhead = s->h.overhead * VMDK_SECTOR;
    s->desc_off = s->h.desc_offset * VMDK_SECTOR;
    s->desc_len = s->h.desc_size * VMDK_SECTOR;
    s->descbuf = malloc(s->desc_len);
    if (!s->descbuf)
        return fail(s, -ENOMEM, "out of memory for the descriptor");
    s->st = ST_PRE;
    return s->h.flags & VMDK_FLAG_MARKERS ? setup_stream(s) : setup_sparse(s);
}

int64_t vmdk_step_header(struct vmdk_stream *s, const uint8_t *buf,
                         uint64_t len)
{
    size_t n = (size_t) MIN(len, VMDK_SECTOR - s->got);
    take(s->sect + s->got, buf, n);
    s->got += n;
    if (s->got == VMDK_SECTOR) {
        s->got = 0;
        int r = header_done(s);
        if (r < 0)
            return r;
    }
    return (int64_t) n;
}

/* ---- PRE: descriptor, grain directory, grain tables --------------------- */

static int desc_done(struct vmdk_stream *s)
{
    s->desc_done = true;
    /* qemu-img (convert -O vmdk, create) writes the header and the tables
     * first and the descriptor after, seeking back: in file order the
     * descriptor is still zeros.  Say so, rather than "no createType". */
    if (is_zero(s->descbuf, s->desc_len))
        return fail(s, -EINVAL, "the descriptor is empty (zeros): its "
                    "writer fills it in later, seeking back (qemu-img "
                    "does); a view takes a VMDK in file order only: copy a "
                    "VMDK file in, or qemu-img convert -n -O raw SRC "
                    "MNT/nbd");
    struct nbdf_err e = { "" };
    int r = vmdk_desc_parse(s->descbuf, s->desc_len, &s->h, &s->desc, &e);
    if (r < 0)
        return fail(s, r, "%s", e.msg);
    return 0;
}

static int cmp_gtloc(const void *a, const void *b)
{
    const struct gtloc *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

static int cmp_grain(const void *a, const void *b)
{
    const struct grain *x = a, *y = b;
    return x->sector < y->sector ? -1 : x->sector > y->sector;
}

static int check_gtloc(struct vmdk_stream *s, const struct gtloc *g)
{
    if (g->off < s->gd_off + s->gd_len)
        return fail(s, -EINVAL, "grain table %" PRIu32 " at sector %" PRIu64
                    " precedes the grain directory's end: the file cannot be "
                    "read in order", g->index, g->off / VMDK_SECTOR);
    if (g->off + s->gt_len > s->overhead)
        return fail(s, -EINVAL, "grain table %" PRIu32 " at sector %" PRIu64
                    " is not inside the overhead (%" PRIu64 " sectors)",
                    g->index, g->off / VMDK_SECTOR, s->h.overhead);
    if (overlaps(g->off, s->gt_len, s->desc_off, s->desc_len))
        return fail(s, -EINVAL, "grain table %" PRIu32 " overlaps the "
                    "descriptor", g->index);
    return 0;
}

static int gd_done(struct vmdk_stream *s)
{
    s->gd_done = true;
    s->gts = malloc((s->ngts ? s->ngts : 1) * sizeof *s->gts);
    if (!s->gts)
        return fail(s, -ENOMEM, "out of memory for grain tables");
    for (uint64_t i = 0; i < s->ngts; i++) {
        uint32_t v;
        memcpy(&v, s->gd + i * 4, 4);
        v = le32toh(v);
        if (v == 0)
            continue;                 /* no table: grains unallocated */
        struct gtloc g = { (uint64_t) v * VMDK_SECTOR, (uint32_t) i };
        if (check_gtloc(s, &g) < 0)
            return s->err;
        s->gts[s->ngtlocs++] = g;
    }
    qsort(s->gts, s->ngtlocs, sizeof *s->gts, cmp_gtloc);
    for (uint64_t i = 1; i < s->ngtlocs; i++)
        if (s->gts[i].off < s->gts[i - 1].off + s->gt_len)
            return fail(s, -EINVAL, "grain tables %" PRIu32 " and %" PRIu32
                        " overlap", s->gts[i - 1].index, s->gts[i].index);
    return 0;
}

static int add_grain(struct vmdk_stream *s, uint32_t sector, uint64_t index)
{
    if ((uint64_t) sector * VMDK_SECTOR < s->overhead)
        return fail(s, -EINVAL, "grain %" PRIu64 " at sector %" PRIu32
                    " lies inside the overhead (%" PRIu64 " sectors)", index,
                    sector, s->h.overhead);
    struct grain_vector *v = &s->grains;
    if (v->len == v->cap && v->cap >= ALLOC_MAX)
        return fail(s, -EFBIG, "more than %u allocated grains", ALLOC_MAX);
    if (grain_vector_append(v, (struct grain) { sector, (uint32_t) index }) < 0)
        return fail(s, -ENOMEM, "out of memory for the grain map");
    return 0;
}

/* streamOptimized with tables: grain index has a marker at sector. */
static int list_grain(struct vmdk_stream *s, uint32_t sector, uint64_t index)
{
    if ((uint64_t) sector * VMDK_SECTOR < s->overhead)
        return fail(s, -EINVAL, "grain %" PRIu64 " at sector %" PRIu32
                    " lies inside the overhead (%" PRIu64 " sectors)", index,
                    sector, s->h.overhead);
    s->listed[index / 64] |= 1ull << (index % 64);
    s->nlisted++;
    return 0;
}

static int gt_done(struct vmdk_stream *s)
{
    const struct gtloc *g = &s->gts[s->gt_cur++];
    for (uint32_t j = 0; j < s->h.gtes_per_gt; j++) {
        uint64_t index = (uint64_t) g->index * s->h.gtes_per_gt + j;
        uint32_t v;
        memcpy(&v, s->gtbuf + (size_t) j * 4, 4);
        v = le32toh(v);
        if (index >= s->ngrains || v == 0)
            continue;                 /* past the capacity, or unallocated */
        if (v == 1 && (s->h.flags & VMDK_FLAG_ZERO_GTE)) {
            s->stats.zero_grains++;
            continue;
        }
        if (s->tables) {
            if (list_grain(s, v, index) < 0)
                return s->err;
        } else if (add_grain(s, v, index) < 0)
            return s->err;
    }
    return 0;
}

/* End of the overhead: the map is complete.  monolithicSparse: sort it by
 * file offset, check for overlaps, begin. */
int vmdk_pre_done(struct vmdk_stream *s)
{
    if (!s->desc_done)
        return fail(s, -EINVAL, "descriptor incomplete");
    if (!(s->h.flags & VMDK_FLAG_MARKERS) || s->tables)
        if (!s->gd_done || s->gt_cur < s->ngtlocs)
            return fail(s, -EINVAL, "grain directory or tables incomplete");
    if (s->h.flags & VMDK_FLAG_MARKERS) {
        s->st = ST_MARKER;
        return 0;
    }
    const struct grain *g = s->grains.ptr;
    if (s->grains.len)
        qsort(s->grains.ptr, s->grains.len, sizeof *g, cmp_grain);
    for (uint64_t i = 1; i < s->grains.len; i++)
        if ((uint64_t) g[i].sector * VMDK_SECTOR <
            (uint64_t) g[i - 1].sector * VMDK_SECTOR + s->grain_bytes)
            return fail(s, -EINVAL, "grains %" PRIu32 " and %" PRIu32
                        " overlap in the file (sectors %" PRIu32 " and %"
                        PRIu32 ")", g[i - 1].index, g[i].index,
                        g[i - 1].sector, g[i].sector);
    s->st = ST_GRAINS;
    return begin(s);
}

/* The region PRE collects next: the one with the lowest start that still
 * ends after pos.  Returns false if none. */
static bool pre_target(struct vmdk_stream *s, uint64_t *off, uint64_t *len,
                       uint8_t **dst, int *which)
{
    bool found = false;
    uint64_t best = UINT64_MAX;
#define CONSIDER(o, l, d, w) \
    if ((o) + (l) > s->pos && (o) < best) { \
        best = (o); *off = (o); *len = (l); *dst = (uint8_t *) (d); \
        *which = (w); found = true; }
    if (!s->desc_done)
        CONSIDER(s->desc_off, s->desc_len, s->descbuf, 0);
    if (!(s->h.flags & VMDK_FLAG_MARKERS) || s->tables) {
        if (!s->gd_done)
            CONSIDER(s->gd_off, s->gd_len, s->gd, 1);
        if (s->gd_done && s->gt_cur < s->ngtlocs)
            CONSIDER(s->gts[s->gt_cur].off, s->gt_len, s->gtbuf, 2);
    }
#undef CONSIDER
    return found;
}

int64_t vmdk_step_pre(struct vmdk_stream *s, const uint8_t *buf,
                      uint64_t len)
{
    uint64_t off, rlen;
    uint8_t *dst;
    int which;

    if (s->pos >= s->overhead) {
        int r = vmdk_pre_done(s);
        return r < 0 ? r : 0;
    }
    bool found = pre_target(s, &off, &rlen, &dst, &which);
    if (!found || off > s->pos) {      /* skip up to the next region */
        uint64_t to = found ? MIN(off, s->overhead) : s->overhead;
        return (int64_t) MIN(len, to - s->pos);
    }
    uint64_t n = MIN(len, off + rlen - s->pos);
    take(dst + (s->pos - off), buf, (size_t) n);
    if (s->pos + n == off + rlen) {
        s->pos += n;                  /* the handlers may look at pos */
        int r = which == 0 ? desc_done(s) : which == 1 ? gd_done(s)
                                                       : gt_done(s);
        s->pos -= n;
        if (r < 0)
            return r;
    }
    return (int64_t) n;
}

