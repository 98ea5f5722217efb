/* tools/verify/source-vhdx.c: fixed and dynamic VHDX images as SOURCE,
 * decoded to their virtual disk through the vhdx/ library.
 *
 * At open the header section, the current headers, the region table, the
 * metadata region and the BAT are read and checked (vhdx/vhdx.h); then it
 * is a simple source:
 *   - size:   the metadata's virtual disk size;
 *   - extent: blocks not present (and zero, unmapped, undefined) are known
 *             zero; runs of the same kind are merged up to EXTENT_MAX;
 *   - read:   pread the present blocks' bytes.
 * A differencing VHDX is refused (its parent is not followed).
 *
 * A file not closed cleanly (a header with a log GUID) has its log
 * replayed as the view replays it (vhdx/log.c): the log region is read
 * and planned at open, and every byte read of the file after that (the
 * metadata, the BAT, the blocks) carries the log's writes; the file
 * reaches as far as the log says it did (zeros past its end).  A log
 * that writes into the header section or into itself is refused (the
 * headers and the log were already used to find it), as is a file
 * shorter than the log says it was.
 *
 * pread only, and the plan is read-only after open: read() is safe on
 * any thread.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/verify/verify.h"
#include "vhdx/vhdx.h"

#define EXTENT_MAX (256ull << 20)

struct vhdx_src {
    struct verify_source s;             /* first: the ops see this */
    int fd;
    struct vhdx_meta meta;
    struct vhdx_geom geom;
    uint64_t *bat;                      /* geom.bat_entries */
    struct vhdx_log_plan plan;          /* owned; empty: nothing replayed */
    uint64_t reach;                     /* with a log: the file's bytes
                                         * end here (zeros past its end) */
};

#define LOG_CLEAN "open it once in Hyper-V, or run qemu-img check -r all " \
    "on it"

static int read_at(int fd, void *buf, size_t len, uint64_t off)
{
    for (size_t done = 0; done < len;) {
        ssize_t n = pread(fd, (char *) buf + done, len - done,
                          (off_t) (off + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            return -EINVAL;             /* the file ends too soon */
        done += (size_t) n;
    }
    return 0;
}

/* The file's bytes [off, off + len) as its log leaves them. */
static int file_read(const struct vhdx_src *v, void *buf, size_t len,
                     uint64_t off)
{
    if (!v->plan.entries)
        return read_at(v->fd, buf, len, off);
    if (off > v->reach || len > v->reach - off)
        return -EINVAL;                 /* past what the log says */
    off_t end = lseek(v->fd, 0, SEEK_END);
    if (end < 0)
        return -errno;
    uint64_t have = (uint64_t) end > off ? (uint64_t) end - off : 0;
    size_t n = have < len ? (size_t) have : len;
    int r = read_at(v->fd, buf, n, off);
    if (r < 0)
        return r;
    memset((char *) buf + n, 0, len - n);
    vhdx_log_apply(&v->plan, off, buf, len);
    return 0;
}

/* The block's file offset, or 0 if it reads as zero. */
static uint64_t block_at(const struct vhdx_src *v, uint64_t blk)
{
    uint64_t e = v->bat[vhdx_bat_index(&v->geom, blk)];
    unsigned st = vhdx_bat_state(e);

    return st == VHDX_PB_FULLY_PRESENT || st == VHDX_PB_PARTIALLY_PRESENT
           ? vhdx_bat_offset(e) : 0;
}

static int vhdx_extent(struct verify_source *s, uint64_t off, uint64_t end,
                       uint64_t *len, bool *zero)
{
    struct vhdx_src *v = (struct vhdx_src *) s;
    uint64_t bs = v->meta.block_size;
    uint64_t limit = end - off < EXTENT_MAX ? end : off + EXTENT_MAX;
    uint64_t pos = off;

    *zero = s->opt->use_extents && block_at(v, off / bs) == 0;
    if (!s->opt->use_extents) {
        *len = end - off;
        return 0;
    }
    while (pos < limit && (block_at(v, pos / bs) == 0) == *zero)
        pos = (pos / bs + 1) * bs;
    *len = (pos < end ? pos : end) - off;
    return 0;
}

static int vhdx_read(struct verify_source *s, void *buf, size_t len,
                     uint64_t off)
{
    struct vhdx_src *v = (struct vhdx_src *) s;
    uint64_t bs = v->meta.block_size;

    for (size_t k = 0; k < len;) {
        uint64_t at = off + k, within = at % bs;
        size_t n = bs - within < len - k ? (size_t) (bs - within) : len - k;
        uint64_t foff = block_at(v, at / bs);
        int r = foff ? file_read(v, (char *) buf + k, n, foff + within) : 0;
        if (!foff)
            memset((char *) buf + k, 0, n);
        if (r < 0) {
            verify_err("%s: read %zu bytes at %llu of the virtual disk: %s",
                       s->name, n, (unsigned long long) at, strerror(-r));
            return r;
        }
        k += n;
    }
    return 0;
}

static void vhdx_close(struct verify_source *s)
{
    struct vhdx_src *v = (struct vhdx_src *) s;

    close(v->fd);
    free(v->bat);
    vhdx_log_plan_free(&v->plan);
    free(v);
}

static const struct verify_source_ops vhdx_ops = {
    .kind = "vhdx",
    .extent = vhdx_extent,
    .read = vhdx_read,
    .read_any_thread = true,
    .close = vhdx_close,
};

/* The log's writes, checked: none may change what found the log (the
 * header section, the log itself), and the file must be as long as the
 * log says it was. */
static int log_check(struct vhdx_src *v, const struct vhdx_header *h,
                     struct nbdf_err *e)
{
    const struct vhdx_log_plan *p = &v->plan;
    off_t end = lseek(v->fd, 0, SEEK_END);

    if (end < 0)
        return -errno;
    if (p->npatches && (p->lo < VHDX_HEADER_SECTION ||
                        vhdx_log_overlaps(p, h->log_offset, h->log_length)))
        return nbdf_errf(e, -ENOTSUP, "its log to replay (not closed "
                         "cleanly) writes into the header section or the "
                         "log: " LOG_CLEAN);
    if ((uint64_t) end < p->flushed_file_offset)
        return nbdf_errf(e, -EINVAL, "the file ends at %lld, cut short: its "
                         "log says it was at least %" PRIu64 " bytes",
                         (long long) end, p->flushed_file_offset);
    v->reach = (uint64_t) end;
    if (p->last_file_offset > v->reach)
        v->reach = p->last_file_offset;
    if (p->hi > v->reach)
        v->reach = p->hi;
    return 0;
}

/* A header with a log GUID: read the log and plan its replay (nothing to
 * replay leaves the plan empty). */
static int read_log(struct vhdx_src *v, const struct vhdx_header *h,
                    struct nbdf_err *e)
{
    if (h->log_length > VHDX_LOG_MAX)
        return nbdf_errf(e, -EFBIG, "a log to replay (not closed cleanly) "
                         "of %" PRIu32 " bytes, more than %llu: " LOG_CLEAN,
                         h->log_length, VHDX_LOG_MAX);
    uint8_t *log = malloc(h->log_length ? h->log_length : 1);
    int r = log ? read_at(v->fd, log, h->log_length, h->log_offset)
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
static int read_head(struct vhdx_src *v, struct vhdx_regions *rg,
                     struct nbdf_err *e)
{
    uint8_t *head = malloc(VHDX_HEADER_SECTION);
    struct vhdx_header h1, h2;
    int r = head ? read_at(v->fd, head, VHDX_HEADER_SECTION, 0) : -ENOMEM;

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

static int read_tables(struct vhdx_src *v, struct nbdf_err *e)
{
    struct vhdx_regions rg;
    int r = read_head(v, &rg, e);
    uint8_t *meta = NULL;

    if (r == 0 && !(meta = malloc(rg.meta.len)))
        r = -ENOMEM;
    if (r == 0)
        r = file_read(v, meta, rg.meta.len, rg.meta.off);
    if (r == 0)
        r = vhdx_metadata_decode(meta, rg.meta.len, &v->meta, e);
    free(meta);
    if (r == 0 && v->meta.has_parent) {
        snprintf(e->msg, sizeof e->msg, "a differencing VHDX: its parent "
                 "is not followed (verify the disk it lands on instead)");
        r = -EMEDIUMTYPE;
    }
    if (r < 0)
        return r;
    vhdx_geom(&v->meta, &v->geom);
    uint64_t need = v->geom.bat_entries * 8;
    if (need > rg.bat.len || need > VHDX_BAT_MAX_BYTES) {
        snprintf(e->msg, sizeof e->msg, "the BAT region (%llu bytes) cannot "
                 "hold %llu entries", (unsigned long long) rg.bat.len,
                 (unsigned long long) v->geom.bat_entries);
        return -EINVAL;
    }
    if (!(v->bat = malloc(need ? need : 1)))
        return -ENOMEM;
    uint8_t *raw = (uint8_t *) v->bat;
    if ((r = file_read(v, raw, need, rg.bat.off)) < 0)
        return r;
    for (uint64_t i = 0; i < v->geom.bat_entries; i++) {
        uint64_t x = 0;
        for (int b = 7; b >= 0; b--)
            x = x << 8 | raw[i * 8 + (unsigned) b];
        v->bat[i] = x;
    }
    return 0;
}

int src_vhdx_open(const char *path, int fd, const struct source_options *opt,
                  struct verify_source **out)
{
    struct nbdf_err e = { "" };
    struct vhdx_src *v = calloc(1, sizeof *v);

    *out = NULL;
    if (!v) {
        close(fd);
        verify_err("out of memory");
        return -ENOMEM;
    }
    v->fd = fd;
    int r = read_tables(v, &e);
    if (r == -EMEDIUMTYPE)
        verify_err("%s: %s", path, e.msg);
    else if (r < 0)
        verify_err("%s: invalid VHDX: %s (--raw hashes the file as it is)",
                   path, e.msg[0] ? e.msg : strerror(-r));
    if (r < 0) {
        vhdx_close(&v->s);
        return r;
    }
    v->s = (struct verify_source) { .ops = &vhdx_ops, .name = path,
                                    .size = v->meta.disk_size, .opt = opt };
    *out = &v->s;
    return 0;
}
