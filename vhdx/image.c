/* vhdx/image.c: random access to a fixed or dynamic VHDX (vhdx/vhdx.h):
 * the header section, the current header (its log planned and replayed
 * over every later read of the file), the region table, the metadata and
 * the BAT, read at open through the caller's file reader; then the
 * virtual disk's bytes, block by block.  The library does no I/O: every
 * byte of the file comes through that reader.
 *
 * The image is read-only after open: lookups and reads are safe on any
 * thread if the caller's reader is. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "vhdx/vhdx-internal.h"

#define LOG_CLEAN "open it once in Hyper-V, or run qemu-img check -r all " \
    "on it"

struct vhdx_image {
    vhdx_read_file_fn rd;
    void *opaque;
    uint64_t file_size;
    struct vhdx_meta meta;
    struct vhdx_geom geom;
    uint64_t *bat;                      /* geom.bat_entries */
    struct vhdx_log_plan plan;          /* owned; empty: nothing replayed */
    uint64_t reach;                     /* with a log: the file's bytes
                                         * end here (zeros past its end) */
};

/* The file's bytes [off, off + len) as its log leaves them. */
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
    vhdx_log_apply(&v->plan, off, buf, len);
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
    v->reach = v->file_size;
    if (p->last_file_offset > v->reach)
        v->reach = p->last_file_offset;
    if (p->hi > v->reach)
        v->reach = p->hi;
    return 0;
}

/* A header with a log GUID: read the log and plan its replay (nothing to
 * replay leaves the plan empty). */
static int read_log(struct vhdx_image *v, const struct vhdx_header *h,
                    struct nbdf_err *e)
{
    if (h->log_length > VHDX_LOG_MAX)
        return nbdf_errf(e, -EFBIG, "a log to replay (not closed cleanly) "
                         "of %" PRIu32 " bytes, more than %llu: " LOG_CLEAN,
                         h->log_length, VHDX_LOG_MAX);
    uint8_t *log = malloc(h->log_length ? h->log_length : 1);
    int r = log ? v->rd(v->opaque, log, h->log_length, h->log_offset)
                : -ENOMEM;

    if (r == 0)
        r = vhdx_log_plan(log, h->log_length, h->log_guid, &v->plan, e);
    free(log);
    if (r == 0 && v->plan.entries)
        r = log_check(v, h, e);
    return r;
}

/* The header section: the current header (and its log, replayed), the
 * region table (the first copy, else the second). */
static int read_head(struct vhdx_image *v, struct vhdx_regions *rg,
                     struct nbdf_err *e)
{
    uint8_t *head = malloc(VHDX_HEADER_SECTION);
    struct vhdx_header h1, h2;
    int r = head ? v->rd(v->opaque, head, VHDX_HEADER_SECTION, 0) : -ENOMEM;

    if (r == 0)
        r = vhdx_file_id_check(head, VHDX_HEADER_SECTION, e);
    if (r == 0) {
        bool ok1 = vhdx_header_decode(head + VHDX_HEADER1_OFF, &h1, e) == 0;
        bool ok2 = vhdx_header_decode(head + VHDX_HEADER2_OFF, &h2, e) == 0;
        int pick = vhdx_header_pick(ok1 ? &h1 : NULL, ok2 ? &h2 : NULL, e);
        r = pick < 0 ? pick : 0;
        if (r == 0 && (pick == 1 ? h1 : h2).log_pending)
            r = read_log(v, pick == 1 ? &h1 : &h2, e);
    }
    if (r == 0 && vhdx_region_table_decode(head + VHDX_REGION1_OFF, rg, e) < 0)
        r = vhdx_region_table_decode(head + VHDX_REGION2_OFF, rg, e);
    free(head);
    return r;
}

static int read_bat(struct vhdx_image *v, const struct vhdx_regions *rg,
                    struct nbdf_err *e)
{
    vhdx_geom(&v->meta, &v->geom);
    uint64_t need = v->geom.bat_entries * 8;
    if (need > rg->bat.len || need > VHDX_BAT_MAX_BYTES)
        return nbdf_errf(e, -EINVAL, "the BAT region (%llu bytes) cannot "
                         "hold %llu entries",
                         (unsigned long long) rg->bat.len,
                         (unsigned long long) v->geom.bat_entries);
    if (!(v->bat = malloc(need ? need : 1)))
        return -ENOMEM;
    uint8_t *raw = (uint8_t *) v->bat;
    int r = file_read(v, raw, need, rg->bat.off);
    if (r < 0)
        return r;
    for (uint64_t i = 0; i < v->geom.bat_entries; i++)
        v->bat[i] = vhdx_le64(raw + i * 8);   /* in place: i*8 read first */
    return 0;
}

int vhdx_image_open(vhdx_read_file_fn rd, void *opaque, uint64_t file_size,
                    struct vhdx_image **out, struct nbdf_err *e)
{
    struct vhdx_image *v = calloc(1, sizeof *v);
    struct vhdx_regions rg;
    uint8_t *meta = NULL;

    *out = NULL;
    if (!v)
        return -ENOMEM;
    v->rd = rd;
    v->opaque = opaque;
    v->file_size = file_size;
    int r = read_head(v, &rg, e);
    if (r == 0 && !(meta = malloc(rg.meta.len)))
        r = -ENOMEM;
    if (r == 0)
        r = file_read(v, meta, rg.meta.len, rg.meta.off);
    if (r == 0)
        r = vhdx_metadata_decode(meta, rg.meta.len, &v->meta, e);
    free(meta);
    if (r == 0 && v->meta.has_parent)
        r = nbdf_errf(e, -EMEDIUMTYPE, "a differencing VHDX: its parent "
                      "is not followed");
    if (r == 0)
        r = read_bat(v, &rg, e);
    if (r < 0) {
        vhdx_image_free(v);
        return r;
    }
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
    vhdx_log_plan_free(&v->plan);
    free(v);
}
