/* vhdx/image.c: random access to a fixed or dynamic VHDX (vhdx/vhdx.h):
 * the header section, the current header (its log planned and replayed
 * over every later read of the file), the region table, the metadata and
 * the BAT, asked for in that order (vhdx_image_next/supply: the pull
 * loop of the format contract) or read at open through the caller's file
 * reader (vhdx_image_open); then the virtual disk's bytes, block by
 * block.  The library does no I/O: every byte of the file comes from the
 * caller.
 *
 * The image is read-only once open: lookups and reads are safe on any
 * thread if the caller's reader is. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "vhdx/vhdx-internal.h"

#define LOG_CLEAN "open it once in Hyper-V, or run qemu-img check -r all " \
    "on it"

enum step { STEP_HEAD, STEP_LOG, STEP_META, STEP_BAT, STEP_DONE };

struct vhdx_image {
    vhdx_read_file_fn rd;               /* vhdx_image_open's; else NULL */
    void *opaque;
    uint64_t file_size;
    enum step step;                     /* what next() asks for */
    uint8_t *head;                      /* owned: the header section, until
                                         * its region table is decoded */
    struct vhdx_header hdr;             /* the current header */
    struct vhdx_regions rg;
    struct vhdx_meta meta;
    struct vhdx_geom geom;
    uint64_t *bat;                      /* geom.bat_entries */
    struct vhdx_log_plan plan;          /* owned; empty: nothing replayed */
    uint64_t reach;                     /* the file's bytes end here (with
                                         * a log: zeros past its end) */
};

/* The file's bytes [off, off + len) as its log leaves them (those past
 * the file's end in buf already zero). */
void vhdx_image_patch(const struct vhdx_image *v, uint64_t off, void *buf,
                      size_t len)
{
    if (v->plan.entries)
        vhdx_log_apply(&v->plan, off, buf, len);
}

uint64_t vhdx_image_reach(const struct vhdx_image *v)
{
    return v->reach;
}

/* The file's bytes [off, off + len) as its log leaves them, through
 * vhdx_image_open's reader. */
static int file_read(const struct vhdx_image *v, void *buf, size_t len,
                     uint64_t off)
{
    if (!v->plan.entries)
        return v->rd(v->opaque, buf, len, off);
    if (off > v->reach || len > v->reach - off)
        return -EINVAL;                 /* past what the log says */
    uint64_t have = v->file_size > off ? v->file_size - off : 0;
    size_t n = have < len ? (size_t) have : len;
    int r = v->rd(v->opaque, buf, n, off);
    if (r < 0)
        return r;
    memset((char *) buf + n, 0, len - n);
    vhdx_image_patch(v, off, buf, len);
    return 0;
}

uint64_t vhdx_image_block(const struct vhdx_image *v, uint64_t blk)
{
    uint64_t e = v->bat[vhdx_bat_index(&v->geom, blk)];
    unsigned st = vhdx_bat_state(e);

    return st == VHDX_PB_FULLY_PRESENT || st == VHDX_PB_PARTIALLY_PRESENT
           ? vhdx_bat_offset(e) : 0;
}

int vhdx_image_read(const struct vhdx_image *v, void *buf, size_t len,
                    uint64_t off)
{
    uint64_t bs = v->meta.block_size;

    if (off > v->meta.disk_size || len > v->meta.disk_size - off)
        return -EINVAL;
    for (size_t k = 0; k < len;) {
        uint64_t at = off + k, within = at % bs;
        size_t n = bs - within < len - k ? (size_t) (bs - within) : len - k;
        uint64_t foff = vhdx_image_block(v, at / bs);
        int r = foff ? file_read(v, (char *) buf + k, n, foff + within) : 0;
        if (!foff)
            memset((char *) buf + k, 0, n);
        if (r < 0)
            return r;
        k += n;
    }
    return 0;
}

/* The log's writes, checked: none may change what found the log (the
 * header section, the log itself), and the file must be as long as the
 * log says it was. */
static int log_check(struct vhdx_image *v, const struct vhdx_header *h,
                     struct nbdf_err *e)
{
    const struct vhdx_log_plan *p = &v->plan;

    if (p->npatches && (p->lo < VHDX_HEADER_SECTION ||
                        vhdx_log_overlaps(p, h->log_offset, h->log_length)))
        return nbdf_errf(e, -ENOTSUP, "its log to replay (not closed "
                         "cleanly) writes into the header section or the "
                         "log: " LOG_CLEAN);
    if (v->file_size < p->flushed_file_offset)
        return nbdf_errf(e, -EINVAL, "the file ends at %lld, cut short: its "
                         "log says it was at least %" PRIu64 " bytes",
                         (long long) v->file_size, p->flushed_file_offset);
    if (p->last_file_offset > v->reach)
        v->reach = p->last_file_offset;
    if (p->hi > v->reach)
        v->reach = p->hi;
    return 0;
}

/* The region table (the first copy, else the second); the header section
 * is no longer needed. */
static int take_regions(struct vhdx_image *v, struct nbdf_err *e)
{
    int r = vhdx_region_table_decode(v->head + VHDX_REGION1_OFF, &v->rg, e);

    if (r < 0)
        r = vhdx_region_table_decode(v->head + VHDX_REGION2_OFF, &v->rg, e);
    free(v->head);
    v->head = NULL;
    v->step = STEP_META;
    return r;
}

/* The header section: the current header; a log GUID asks for the log
 * next (a log too large to plan is refused), else the region table. */
static int take_head(struct vhdx_image *v, const uint8_t *buf,
                     struct nbdf_err *e)
{
    struct vhdx_header h1, h2;
    int r = vhdx_file_id_check(buf, VHDX_HEADER_SECTION, e);

    if (r < 0)
        return r;
    bool ok1 = vhdx_header_decode(buf + VHDX_HEADER1_OFF, &h1, e) == 0;
    bool ok2 = vhdx_header_decode(buf + VHDX_HEADER2_OFF, &h2, e) == 0;
    int pick = vhdx_header_pick(ok1 ? &h1 : NULL, ok2 ? &h2 : NULL, e);
    if (pick < 0)
        return pick;
    v->hdr = pick == 1 ? h1 : h2;
    if (!(v->head = malloc(VHDX_HEADER_SECTION)))
        return -ENOMEM;
    memcpy(v->head, buf, VHDX_HEADER_SECTION);
    if (!v->hdr.log_pending)
        return take_regions(v, e);
    if (v->hdr.log_length > VHDX_LOG_MAX)
        return nbdf_errf(e, -EFBIG, "a log to replay (not closed cleanly) "
                         "of %" PRIu32 " bytes, more than %llu: " LOG_CLEAN,
                         v->hdr.log_length, VHDX_LOG_MAX);
    v->step = STEP_LOG;
    return 0;
}

/* The log: its replay planned (nothing to replay leaves the plan empty)
 * and checked. */
static int take_log(struct vhdx_image *v, const uint8_t *buf,
                    struct nbdf_err *e)
{
    int r = vhdx_log_plan(buf, v->hdr.log_length, v->hdr.log_guid, &v->plan,
                          e);

    if (r == 0 && v->plan.entries)
        r = log_check(v, &v->hdr, e);
    return r < 0 ? r : take_regions(v, e);
}

static int take_meta(struct vhdx_image *v, const uint8_t *buf,
                     struct nbdf_err *e)
{
    int r = vhdx_metadata_decode(buf, v->rg.meta.len, &v->meta, e);

    if (r == 0 && v->meta.has_parent)
        r = nbdf_errf(e, -EMEDIUMTYPE, "a differencing VHDX: its parent "
                      "is not followed");
    if (r < 0)
        return r;
    vhdx_geom(&v->meta, &v->geom);
    uint64_t need = v->geom.bat_entries * 8;
    if (need > v->rg.bat.len || need > VHDX_BAT_MAX_BYTES)
        return nbdf_errf(e, -EINVAL, "the BAT region (%llu bytes) cannot "
                         "hold %llu entries",
                         (unsigned long long) v->rg.bat.len,
                         (unsigned long long) v->geom.bat_entries);
    if (!(v->bat = malloc(need ? need : 1)))
        return -ENOMEM;
    v->step = STEP_BAT;
    return 0;
}

static void take_bat(struct vhdx_image *v, const uint8_t *buf)
{
    for (uint64_t i = 0; i < v->geom.bat_entries; i++)
        v->bat[i] = vhdx_le64(buf + i * 8);
    v->step = STEP_DONE;
}

/* What the current step reads: the file's raw bytes (the header section,
 * the log), or bytes the log's replay applies to (*patched). */
static void step_range(const struct vhdx_image *v, uint64_t *off,
                       uint64_t *len, bool *patched)
{
    *patched = v->step == STEP_META || v->step == STEP_BAT;
    switch (v->step) {
    case STEP_HEAD: *off = 0; *len = VHDX_HEADER_SECTION; break;
    case STEP_LOG: *off = v->hdr.log_offset; *len = v->hdr.log_length; break;
    case STEP_META: *off = v->rg.meta.off; *len = v->rg.meta.len; break;
    default: *off = v->rg.bat.off; *len = v->geom.bat_entries * 8; break;
    }
}

int vhdx_image_new(uint64_t file_size, struct vhdx_image **out)
{
    struct vhdx_image *v = calloc(1, sizeof *v);

    if (!v)
        return -ENOMEM;
    v->file_size = v->reach = file_size;
    *out = v;
    return 0;
}

/* A request past the file's end (past where its log says it reaches, for
 * patched bytes) is -EINVAL; of patched bytes, only those inside the file
 * are asked for (the rest read as zero). */
int vhdx_image_next(const struct vhdx_image *v, uint64_t *off, size_t *len)
{
    uint64_t o, n;
    bool patched;

    if (v->step == STEP_DONE)
        return 0;
    step_range(v, &o, &n, &patched);
    uint64_t end = patched ? v->reach : v->file_size;
    if (o > end || n > end - o)
        return -EINVAL;
    if (patched && o + n > v->file_size)
        n = o < v->file_size ? v->file_size - o : 0;
    *off = o;
    *len = (size_t) n;
    return 1;
}

int vhdx_image_supply(struct vhdx_image *v, const void *buf,
                      struct nbdf_err *e)
{
    uint64_t off, len;
    bool patched;
    int r = 0;

    step_range(v, &off, &len, &patched);
    if (!patched)
        return v->step == STEP_HEAD ? take_head(v, buf, e)
                                    : take_log(v, buf, e);
    uint8_t *b = malloc(len ? len : 1);
    if (!b)
        return -ENOMEM;
    size_t have = off < v->file_size ? v->file_size - off : 0;
    have = have < len ? have : len;
    memcpy(b, buf, have);
    memset(b + have, 0, len - have);
    vhdx_image_patch(v, off, b, len);
    if (v->step == STEP_META)
        r = take_meta(v, b, e);
    else
        take_bat(v, b);
    free(b);
    return r;
}

int vhdx_image_open(vhdx_read_file_fn rd, void *opaque, uint64_t file_size,
                    struct vhdx_image **out, struct nbdf_err *e)
{
    struct vhdx_image *v = NULL;
    uint8_t *buf = NULL;
    uint64_t off;
    size_t len;
    int r = vhdx_image_new(file_size, &v);

    *out = NULL;
    while (r == 0 && (r = vhdx_image_next(v, &off, &len)) > 0) {
        uint8_t *b = realloc(buf, len ? len : 1);
        if (!b) {
            r = -ENOMEM;
            break;
        }
        buf = b;
        if ((r = rd(opaque, buf, len, off)) == 0)
            r = vhdx_image_supply(v, buf, e);
    }
    free(buf);
    if (r < 0) {
        vhdx_image_free(v);
        return r;
    }
    v->rd = rd;
    v->opaque = opaque;
    *out = v;
    return 0;
}

const struct vhdx_meta *vhdx_image_meta(const struct vhdx_image *v)
{
    return &v->meta;
}

void vhdx_image_free(struct vhdx_image *v)
{
    if (!v)
        return;
    free(v->bat);
    free(v->head);
    vhdx_log_plan_free(&v->plan);
    free(v);
}
