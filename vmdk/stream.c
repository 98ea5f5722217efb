/* vmdk/stream.c: forward-only decoder, VMDK file bytes in file order to
 * raw-disk writes.  See the contract in vmdk/vmdk.h.
 *
 * The file is consumed by a state machine, one step at a time:
 *
 *   HEADER   collect sector 0, validate it.
 *   PRE      [512, overhead): collect the descriptor and, for
 *            monolithicSparse and for a streamOptimized header whose grain
 *            directory lies in the overhead (qemu-img's), the grain
 *            directory and then each grain table (sorted by file offset);
 *            skip everything else.  At the overhead's end the grain map is
 *            complete and checked.
 *   GRAINS   monolithicSparse: bytes inside an allocated grain go to its
 *            LBA, other bytes are dropped.
 *   MARKER   streamOptimized: a 12-byte marker head; size != 0 is a grain
 *            (GRAIN: collect size bytes, inflate, place at its LBA; PAD to
 *            the next sector), size == 0 a metadata sector (META: GT/GD
 *            payloads skipped, FOOTER checked, EOS ends the stream).
 *   END      after the end-of-stream marker: only zeros may follow.
 *
 * Where a streamOptimized file ends: with an end-of-stream marker, or, when
 * its header's grain tables were read (s->tables), at any marker boundary
 * once every grain those tables list has arrived (qemu-img writes no EOS
 * marker and no footer).
 *
 * Input may be "zeros" (buf == NULL) for gaps and holes; they are never
 * materialized except into the small collection buffers.
 */
#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/fileorder.h"
#include "vmdk/vmdk-internal.h"

enum st { ST_HEADER, ST_PRE, ST_GRAINS, ST_MARKER, ST_GRAIN, ST_SKIP,
          ST_META, ST_FOOTER, ST_END };

#define GD_MAX_ENTRIES (1u << 22)             /* 16 MiB of directory */
#define ALLOC_MAX (1u << 25)                  /* 256 MiB of grain map */

struct gtloc {                                /* a grain table in the file */
    uint64_t off;                             /* bytes */
    uint32_t index;                           /* its GD entry */
};

struct grain {                                /* an allocated sparse grain */
    uint32_t sector;                          /* file sector (a GTE) */
    uint32_t index;                           /* grain number (LBA / grain) */
};

struct vmdk_stream {
    const struct vmdk_sink *sink;
    void *opaque;
    int err;                                  /* sticky, negative */
    struct nbdf_err e;
    enum st st;
    uint64_t pos;                             /* next file byte expected */
    bool began;

    struct vmdk_header h;
    struct vmdk_desc desc;
    uint64_t grain_bytes, capacity, ngrains, overhead;
    uint8_t sect[VMDK_SECTOR];                /* header/marker/footer */
    enum image_kind first_kind;               /* of sector 0, once read */
    size_t got;                               /* bytes collected */
    uint64_t skip_end;                        /* ST_SKIP: until here */

    char *descbuf;                            /* PRE: the descriptor */
    uint64_t desc_off, desc_len;
    bool desc_done;

    /* monolithicSparse */
    uint8_t *gd;
    uint64_t gd_off, gd_len, ngts;
    bool gd_done;
    struct gtloc *gts;
    uint64_t ngtlocs, gt_cur, gt_len;
    uint8_t *gtbuf;
    struct grain *grains;
    uint64_t nalloc, alloc_cap, a_cur;

    /* streamOptimized */
    uint8_t *cbuf, *gbuf;                     /* compressed, inflated grain */
    uint64_t cneed, glba, gat;
    uint64_t *seen;                           /* a bit per grain */
    bool tables;                              /* header GD/GTs in the overhead
                                               * were read: they are the map */
    uint64_t *listed;                         /* tables: a bit per grain */
    uint64_t nlisted;                         /* tables: bits set in listed */
    struct vmdk_inflater *z;

    struct fileorder order;       /* gaps and holes behind the position */
    struct vmdk_stream_stats stats;
};

/* The first error (sticky) with its message; returns it. */
#define fail(s, ...) nbdf_latchf(&(s)->err, &(s)->e, __VA_ARGS__)

int vmdk_stream_new(const struct vmdk_sink *sink, void *opaque,
                    struct vmdk_stream **out)
{
    struct vmdk_stream *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    s->sink = sink;
    s->opaque = opaque;
    s->st = ST_HEADER;
    *out = s;
    return 0;
}

void vmdk_stream_free(struct vmdk_stream *s)
{
    if (!s)
        return;
    free(s->descbuf);
    free(s->gd);
    free(s->gts);
    free(s->gtbuf);
    free(s->grains);
    free(s->cbuf);
    free(s->gbuf);
    free(s->seen);
    free(s->listed);
    vmdk_inflater_free(s->z);
    free(s);
}

const char *vmdk_stream_error(const struct vmdk_stream *s) { return s->e.msg; }
enum image_kind vmdk_stream_first_kind(const struct vmdk_stream *s)
{
    return s->first_kind;
}
uint64_t vmdk_stream_position(const struct vmdk_stream *s) { return s->pos; }

enum vmdk_kind vmdk_stream_kind(const struct vmdk_stream *s)
{
    if (!s->began)
        return 0;
    return s->h.flags & VMDK_FLAG_MARKERS ? VMDK_STREAM_OPTIMIZED
                                          : VMDK_MONOLITHIC_SPARSE;
}

uint64_t vmdk_stream_capacity(const struct vmdk_stream *s)
{
    return s->began ? s->capacity : 0;
}

const struct vmdk_header *vmdk_stream_header(const struct vmdk_stream *s)
{
    return s->st == ST_HEADER ? NULL : &s->h;
}

const struct vmdk_desc *vmdk_stream_desc(const struct vmdk_stream *s)
{
    return s->desc_done ? &s->desc : NULL;
}

void vmdk_stream_stats(const struct vmdk_stream *s,
                       struct vmdk_stream_stats *out)
{
    *out = s->stats;
}

/* ---- small pieces ---------------------------------------------------------- */

/* Copy n input bytes (zeros if buf is NULL) to dst. */
static void take(void *dst, const uint8_t *buf, size_t n)
{
    if (buf)
        memcpy(dst, buf, n);
    else
        memset(dst, 0, n);
}

static int begin(struct vmdk_stream *s)
{
    assert(!s->began);
    s->began = true;
    int r = s->sink->begin(s->opaque, vmdk_stream_kind(s), s->capacity);
    if (r < 0)
        return fail(s, r, "refused by the destination: %s", strerror(-r));
    return 0;
}

static int emit(struct vmdk_stream *s, uint64_t disk_off, const void *buf,
                uint64_t len)
{
    if (disk_off >= s->capacity)
        return 0;                     /* the last grain's tail */
    len = MIN(len, s->capacity - disk_off);
    int r = s->sink->data(s->opaque, disk_off, buf, (size_t) len);
    if (r < 0)
        return fail(s, r, "placing %" PRIu64 " bytes at disk offset %" PRIu64
                    ": %s", len, disk_off, strerror(-r));
    return 0;
}

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

static int64_t step_header(struct vmdk_stream *s, const uint8_t *buf,
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
    if (s->nalloc == s->alloc_cap) {
        if (s->alloc_cap >= ALLOC_MAX)
            return fail(s, -EFBIG, "more than %u allocated grains", ALLOC_MAX);
        uint64_t cap = s->alloc_cap ? s->alloc_cap * 2 : 1024;
        struct grain *g = realloc(s->grains, cap * sizeof *g);
        if (!g)
            return fail(s, -ENOMEM, "out of memory for the grain map");
        s->grains = g;
        s->alloc_cap = cap;
    }
    s->grains[s->nalloc++] = (struct grain) { sector, (uint32_t) index };
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
static int pre_done(struct vmdk_stream *s)
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
    if (s->nalloc)
        qsort(s->grains, s->nalloc, sizeof *s->grains, cmp_grain);
    for (uint64_t i = 1; i < s->nalloc; i++)
        if ((uint64_t) s->grains[i].sector * VMDK_SECTOR <
            (uint64_t) s->grains[i - 1].sector * VMDK_SECTOR + s->grain_bytes)
            return fail(s, -EINVAL, "grains %" PRIu32 " and %" PRIu32
                        " overlap in the file (sectors %" PRIu32 " and %"
                        PRIu32 ")", s->grains[i - 1].index,
                        s->grains[i].index, s->grains[i - 1].sector,
                        s->grains[i].sector);
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

static int64_t step_pre(struct vmdk_stream *s, const uint8_t *buf,
                        uint64_t len)
{
    uint64_t off, rlen;
    uint8_t *dst;
    int which;

    if (s->pos >= s->overhead) {
        int r = pre_done(s);
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

/* ---- GRAINS (monolithicSparse) ---------------------------------------- */

static int64_t step_grains(struct vmdk_stream *s, const uint8_t *buf,
                           uint64_t len)
{
    if (s->a_cur == s->nalloc)
        return (int64_t) len;         /* after the last grain: dropped */
    const struct grain *g = &s->grains[s->a_cur];
    uint64_t start = (uint64_t) g->sector * VMDK_SECTOR;
    uint64_t end = start + s->grain_bytes;
    if (s->pos < start)
        return (int64_t) MIN(len, start - s->pos);
    uint64_t n = MIN(len, end - s->pos);
    if (buf) {
        uint64_t disk = (uint64_t) g->index * s->grain_bytes + (s->pos - start);
        int r = emit(s, disk, buf, n);
        if (r < 0)
            return r;
    }
    if (s->pos + n == end) {
        s->a_cur++;
        s->stats.grains++;
    }
    return (int64_t) n;
}

/* ---- MARKER, GRAIN, META, FOOTER (streamOptimized) --------------------- */

static int grain_marker(struct vmdk_stream *s, uint64_t lba, uint32_t size)
{
    uint64_t at = s->pos - VMDK_GRAIN_MARKER_SIZE;

    if (size > vmdk_compressed_max(s->grain_bytes))
        return fail(s, -EINVAL, "grain marker at byte %" PRIu64 ": %" PRIu32
                    " compressed bytes for a %" PRIu64 "-byte grain", at,
                    size, s->grain_bytes);
    if (lba % s->h.grain_size || lba >= s->h.capacity)
        return fail(s, -EINVAL, "grain marker at byte %" PRIu64 ": LBA %"
                    PRIu64 " is %s", at, lba, lba >= s->h.capacity
                    ? "past the capacity" : "not at a grain boundary");
    uint64_t g = lba / s->h.grain_size;
    if (s->seen[g / 64] & (1ull << (g % 64)))
        return fail(s, -EINVAL, "grain marker at byte %" PRIu64 ": LBA %"
                    PRIu64 " appears twice", at, lba);
    if (s->tables && !(s->listed[g / 64] & (1ull << (g % 64))))
        return fail(s, -EINVAL, "grain marker at byte %" PRIu64 ": LBA %"
                    PRIu64 " is not in the header's grain tables (a reader "
                    "that follows the tables would not see it)", at, lba);
    s->seen[g / 64] |= 1ull << (g % 64);
    s->glba = lba;
    s->gat = at;
    s->cneed = size;
    s->got = 0;
    s->st = ST_GRAIN;
    return 0;
}

static int marker_head(struct vmdk_stream *s)
{
    struct vmdk_marker_disk m;

    memcpy(&m, s->sect, VMDK_GRAIN_MARKER_SIZE);
    uint32_t size = le32toh(m.size);
    if (size) {
        int r = grain_marker(s, le64toh(m.lba), size);
        if (r < 0)
            return r;
    } else
        s->st = ST_META;              /* collect the rest of the sector */
    /* streamOptimized: header and descriptor are all there is to check up
     * front; waiting for the first marker, and checking it, also leaves
     * the disk alone when the file ends inside the overhead or its first
     * grain marker breaks a rule (past the capacity, say). */
    if (!s->began && begin(s) < 0)
        return s->err;
    return 0;
}

static int64_t step_marker(struct vmdk_stream *s, const uint8_t *buf,
                           uint64_t len)
{
    size_t n = (size_t) MIN(len, VMDK_GRAIN_MARKER_SIZE - s->got);
    take(s->sect + s->got, buf, n);
    s->got += n;
    if (s->got == VMDK_GRAIN_MARKER_SIZE) {
        s->pos += n;
        int r = marker_head(s);
        s->pos -= n;
        if (r < 0)
            return r;
    }
    return (int64_t) n;
}

static void skip_to(struct vmdk_stream *s, uint64_t end)
{
    s->skip_end = end;
    s->st = ST_SKIP;
}

static int grain_done(struct vmdk_stream *s, const uint8_t *cdata)
{
    struct vmdk_grain g;

    vmdk_grain_init(&g, &s->h, s->glba, s->gat, cdata, (size_t) s->cneed);
    s->stats.grains++;
    s->stats.compressed_bytes += s->cneed;
    if (s->sink->grain) {             /* the caller inflates */
        int r = s->sink->grain(s->opaque, &g);
        if (r < 0)
            return fail(s, r, "grain for LBA %" PRIu64 " (marker at byte %"
                        PRIu64 "): %s", s->glba, s->gat, strerror(-r));
        return 0;
    }
    struct nbdf_err e = { "" };
    int64_t n = vmdk_grain_inflate(s->z, &g, s->gbuf, &e);
    if (n < 0)
        return fail(s, (int) n, "%s", e.msg);
    return n ? emit(s, g.disk_off, s->gbuf, (uint64_t) n) : 0;
}

static int64_t step_grain(struct vmdk_stream *s, const uint8_t *buf,
                          uint64_t len)
{
    uint64_t n = MIN(len, s->cneed - s->got);
    const uint8_t *whole = NULL;

    if (s->got == 0 && n == s->cneed && buf)
        whole = buf;                  /* all there: inflate in place */
    else
        take(s->cbuf + s->got, buf, (size_t) n);
    s->got += n;
    if (s->got == s->cneed) {
        s->got = 0;
        int r = grain_done(s, whole ? whole : s->cbuf);
        if (r < 0)
            return r;
        uint64_t end = s->pos + n;
        skip_to(s, vmdk_div_up(end, VMDK_SECTOR) * VMDK_SECTOR);
    }
    return (int64_t) n;
}

static int footer_done(struct vmdk_stream *s)
{
    struct vmdk_header f;
    struct nbdf_err e;
    const struct vmdk_header *h = &s->h;
    uint64_t at = s->pos - VMDK_SECTOR;

    int r = vmdk_header_decode(s->sect, &f, &e);
    if (r < 0)
        return fail(s, r, "footer at byte %" PRIu64 ": %s", at, e.msg);
    if (f.capacity != h->capacity || f.grain_size != h->grain_size ||
        f.gtes_per_gt != h->gtes_per_gt || f.flags != h->flags ||
        f.desc_offset != h->desc_offset || f.desc_size != h->desc_size ||
        f.overhead != h->overhead || f.compress != h->compress)
        return fail(s, -EINVAL, "footer at byte %" PRIu64 " does not match "
                    "the header (capacity %" PRIu64 "/%" PRIu64 ", grain %"
                    PRIu64 "/%" PRIu64 ", flags 0x%" PRIx32 "/0x%" PRIx32 ")",
                    at, f.capacity, h->capacity, f.grain_size, h->grain_size,
                    f.flags, h->flags);
    if (f.gd_offset == VMDK_GD_AT_END)
        return fail(s, -EINVAL, "footer at byte %" PRIu64 " has no grain "
                    "directory offset (GD_AT_END)", at);
    s->stats.footer = true;
    s->st = ST_MARKER;
    return 0;
}

static int meta_done(struct vmdk_stream *s)
{
    struct vmdk_marker_disk m;
    uint64_t at = s->pos - VMDK_SECTOR;
    memcpy(&m, s->sect, sizeof m);
    uint64_t nsec = le64toh(m.lba);
    uint32_t type = le32toh(m.type);

    switch (type) {
    case VMDK_MARKER_EOS:
        if (nsec != 0)
            return fail(s, -EINVAL, "end-of-stream marker at byte %" PRIu64
                        " claims %" PRIu64 " sectors", at, nsec);
        s->stats.eos = true;
        s->st = ST_END;
        return 0;
    case VMDK_MARKER_GT:
    case VMDK_MARKER_GD:
        if (nsec == 0 || nsec > VMDK_META_MAX_SECTORS)
            return fail(s, -EINVAL, "%s marker at byte %" PRIu64 " claims %"
                        PRIu64 " sectors", type == VMDK_MARKER_GT ? "grain "
                        "table" : "grain directory", at, nsec);
        if (type == VMDK_MARKER_GT)
            s->stats.gt_markers++;
        else
            s->stats.gd_markers++;
        skip_to(s, s->pos + nsec * VMDK_SECTOR);
        return 0;
    case VMDK_MARKER_FOOTER:
        if (nsec != 1)
            return fail(s, -EINVAL, "footer marker at byte %" PRIu64
                        " claims %" PRIu64 " sectors (must be 1)", at, nsec);
        if (s->stats.footer)
            return fail(s, -EINVAL, "second footer at byte %" PRIu64, at);
        s->st = ST_FOOTER;
        return 0;
    default:
        return fail(s, -EINVAL, "unknown marker type %" PRIu32 " at byte %"
                    PRIu64, type, at);
    }
}

/* ST_META and ST_FOOTER: fill the sector buffer up to 512 bytes. */
static int64_t step_sector(struct vmdk_stream *s, const uint8_t *buf,
                           uint64_t len)
{
    size_t n = (size_t) MIN(len, VMDK_SECTOR - s->got);
    take(s->sect + s->got, buf, n);
    s->got += n;
    if (s->got == VMDK_SECTOR) {
        s->got = 0;
        s->pos += n;
        int r = s->st == ST_META ? meta_done(s) : footer_done(s);
        s->pos -= n;
        if (r < 0)
            return r;
    }
    return (int64_t) n;
}

static int64_t step_skip(struct vmdk_stream *s, uint64_t len)
{
    if (s->pos >= s->skip_end) {
        s->st = ST_MARKER;
        s->got = 0;
        return 0;
    }
    return (int64_t) MIN(len, s->skip_end - s->pos);
}

/* After the end-of-stream marker only zeros may follow (qemu-img pads its
 * files): anything else means a zero sector was taken for the EOS marker
 * in the middle of the grains, and the grains after it would be lost. */
static int64_t step_end(struct vmdk_stream *s, const uint8_t *buf,
                        uint64_t len)
{
    if (buf && !is_zero(buf, (size_t) len)) {
        const uint8_t *p = buf;
        while (!*p)
            p++;
        return fail(s, -EINVAL, "data at byte %" PRIu64 " after the "
                    "end-of-stream marker", s->pos + (uint64_t) (p - buf));
    }
    return (int64_t) len;
}

/* ---- driving ------------------------------------------------------------------ */

static int64_t step(struct vmdk_stream *s, const uint8_t *buf, uint64_t len)
{
    switch (s->st) {
    case ST_HEADER: return step_header(s, buf, len);
    case ST_PRE:    return step_pre(s, buf, len);
    case ST_GRAINS: return step_grains(s, buf, len);
    case ST_MARKER: return step_marker(s, buf, len);
    case ST_GRAIN:  return step_grain(s, buf, len);
    case ST_SKIP:   return step_skip(s, len);
    case ST_META:
    case ST_FOOTER: return step_sector(s, buf, len);
    case ST_END:    return step_end(s, buf, len);
    }
    return fail(s, -EINVAL, "internal: bad state");
}

static int64_t step_cb(void *s, const uint8_t *buf, uint64_t len)
{
    return step(s, buf, len);
}

static int accept(struct vmdk_stream *s, uint64_t off, const uint8_t *buf,
                  uint64_t len)
{
    struct fileorder_decoder d = { &s->pos, step_cb, s, &s->err, &s->e };
    return fileorder_accept(&s->order, &d, "a VMDK", off, buf, len);
}

int vmdk_stream_feed(struct vmdk_stream *s, uint64_t file_off,
                     const void *buf, size_t len)
{
    return accept(s, file_off, buf, len);
}

int vmdk_stream_hole(struct vmdk_stream *s, uint64_t file_off, uint64_t len)
{
    return accept(s, file_off, NULL, len);
}

static const char *where(const struct vmdk_stream *s)
{
    switch (s->st) {
    case ST_GRAIN: return "inside a compressed grain";
    case ST_SKIP:  return "inside grain padding or a metadata payload";
    case ST_META:  return "inside a marker";
    case ST_FOOTER: return "inside the footer";
    default:       return "between markers";
    }
}

/* streamOptimized whose header's grain tables were read (qemu-img writes
 * them, and no EOS marker or footer): the stream may end at any marker
 * boundary, or after an EOS marker, once every grain the tables list has
 * arrived.  A file cut short loses a grain the tables list, or stops
 * inside a grain, marker or padding. */
static int finish_tables(struct vmdk_stream *s)
{
    bool boundary = s->st == ST_END || (s->st == ST_MARKER && s->got == 0) ||
                    (s->st == ST_SKIP && s->pos >= s->skip_end);
    if (!boundary)
        return fail(s, -EINVAL, "the file ended at byte %" PRIu64 " %s",
                    s->pos, where(s));
    if (s->stats.grains != s->nlisted)
        return fail(s, -EINVAL, "the file ended at byte %" PRIu64 " with %"
                    PRIu64 " of the %" PRIu64 " grains its grain tables list "
                    "still missing", s->pos, s->nlisted - s->stats.grains,
                    s->nlisted);
    if (!s->began && begin(s) < 0)      /* no marker at all: an empty disk */
        return s->err;
    return 0;
}

int vmdk_stream_finish(struct vmdk_stream *s)
{
    if (s->err)
        return s->err;
    if (s->st == ST_HEADER)
        return fail(s, -EINVAL, "the file ended after %" PRIu64 " bytes, "
                    "inside the sparse header", s->pos);
    if (s->st == ST_PRE) {
        bool sparse = !(s->h.flags & VMDK_FLAG_MARKERS);
        if (s->pos >= s->overhead ||
            (sparse && s->desc_done && s->gd_done && s->gt_cur == s->ngtlocs &&
             s->nalloc == 0)) {
            if (pre_done(s) < 0)
                return s->err;
        } else
            return fail(s, -EINVAL, "the file ended at byte %" PRIu64
                        ", inside the metadata (%s)", s->pos,
                        !s->desc_done ? "descriptor" : !sparse ? "overhead"
                        : !s->gd_done ? "grain directory" : "grain tables");
    }
    if (s->st == ST_GRAINS && s->a_cur < s->nalloc) {
        const struct grain *g = &s->grains[s->a_cur];
        return fail(s, -EINVAL, "the file ended at byte %" PRIu64 " but grain "
                    "%" PRIu32 " lies at byte %" PRIu64 " (%" PRIu64 " of %"
                    PRIu64 " grains missing)", s->pos, g->index,
                    (uint64_t) g->sector * VMDK_SECTOR, s->nalloc - s->a_cur,
                    s->nalloc);
    }
    if (s->tables)
        return finish_tables(s);
    if (s->h.flags & VMDK_FLAG_MARKERS) {
        if (s->st != ST_END)
            return fail(s, -EINVAL, "the file ended at byte %" PRIu64 " %s, "
                        "without an end-of-stream marker", s->pos, where(s));
        if (s->h.gd_offset == VMDK_GD_AT_END && !s->stats.footer)
            return fail(s, -EINVAL, "no footer, but the header defers the "
                        "grain directory to it (GD_AT_END)");
    }
    return 0;
}
