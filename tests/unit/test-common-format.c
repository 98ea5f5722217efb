/* tests/unit/test-common-format.c: the format contract (common/format.h)
 * run over every library's row (vhd_format, vmdk_format, qcow2_format,
 * vhdx_format) through the table alone: each row is complete, its probe
 * takes its own synthesized image and refuses the others', and a disk
 * (data, a hole, a partly zero unit, a size of no format's block) comes
 * back byte for byte when its synthesized image, read in odd pieces, is
 * fed to its own stream decoder (in file order, its zero runs sent as
 * holes) into one struct nbdf_sink; compressed units, if the row hands
 * them over, are decoded with the row's unpack hooks.  A row a new
 * format adds joins by a line in rows[]. */
#undef NDEBUG
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/format.h"
#include "common/iszero.h"
#include "qcow2/qcow2.h"
#include "vhd/vhd.h"
#include "vhdx/vhdx.h"
#include "vmdk/vmdk.h"
#include "test-util.h"

#define DISK ((5u << 20) + 3u * 4096u)      /* whole 4 KiB, no whole MiB */

static const struct nbdf_format *const rows[] = {
    &vhd_format, &vmdk_format, &qcow2_format, &vhdx_format,
};

static uint8_t *disk;

static int read_disk(void *o, uint64_t off, void *buf, size_t len)
{
    CHECK(o == disk && off + len <= DISK);
    memcpy(buf, disk + off, len);
    return 0;
}

/* Allocate the disk's data extents, as the views do from the zero maps. */
static int allocate(const struct nbdf_format *f, void *sy)
{
    for (uint64_t off = 0; off < DISK; off += 4096) {
        uint64_t end = off;
        while (end < DISK && !is_zero(disk + end, 4096))
            end += 4096;
        if (end > off) {
            int r = f->synth_allocate(sy, off, end - off);
            if (r < 0)
                return r;
            off = end;
        }
    }
    return 0;
}

/* ---- the sink: a disk in memory ------------------------------------------ */

struct out {
    const struct nbdf_format *f;
    uint8_t *buf;
    bool began;
    uint64_t size, data, zero, units;
    void *ctx;                          /* the row's unpack context */
    uint8_t *unit_out;
};

static int o_begin(void *o, const struct nbdf_begin *b)
{
    struct out *d = o;
    CHECK(!d->began && b->kind_name && b->kind_name[0] && !b->overlay);
    CHECK(b->size >= DISK && b->size - DISK < (b->unit ? b->unit : 1));
    d->began = true;
    d->size = b->size;
    memset(d->buf, 0, DISK);            /* a standalone image: zeros */
    return 0;
}

static int o_data(void *o, uint64_t off, const void *buf, size_t len)
{
    struct out *d = o;
    CHECK(d->began && off + len <= d->size);
    if (off + len > DISK) {             /* past the disk: zeros only */
        uint64_t keep = off < DISK ? DISK - off : 0;
        CHECK(is_zero((const uint8_t *) buf + keep, len - keep));
        len = keep;
    }
    memcpy(d->buf + off, buf, len);
    d->data += len;
    return 0;
}

static int o_zero(void *o, uint64_t off, uint64_t len)
{
    struct out *d = o;
    CHECK(d->began && off + len <= d->size);
    d->zero += len;
    return 0;
}

static int o_compressed(void *o, const void *unit, const void *cdata,
                        size_t clen)
{
    struct out *d = o;
    const struct nbdf_unpack *u = d->f->unpack;
    struct nbdf_err e = { "" };
    uint64_t at;
    const void *c;

    CHECK(u && clen > 0);
    memcpy(&c, (const char *) unit + u->cdata_at, sizeof c);
    memcpy(&at, (const char *) unit + u->disk_off_at, sizeof at);
    CHECK(c == cdata);
    if (!d->ctx)
        CHECK(u->new_ctx(&d->ctx) == 0);
    if (!d->unit_out)
        CHECK((d->unit_out = malloc(u->out_max)));
    int64_t n = u->decode(d->ctx, unit, d->unit_out, &e);
    if (n < 0) {
        fprintf(stderr, "%s: unit at %" PRIu64 ": %s\n", d->f->name, at,
                e.msg);
        return (int) n;
    }
    d->units++;
    return o_data(o, at, d->unit_out, (size_t) n);
}

/* Every member a decoder may use, a spool included (none of the
 * synthesized images needs one). */
static int o_put(void *o, uint64_t off, const void *buf, size_t len)
{
    (void) o, (void) off, (void) buf, (void) len;
    CHECK(!"a synthesized image is in file order: nothing to spool");
    return -EIO;
}

static int o_get(void *o, uint64_t off, void *buf, size_t len)
{
    (void) o, (void) off, (void) buf, (void) len;
    return -EIO;
}

static const struct nbdf_sink sink = {
    .begin = o_begin, .data = o_data, .zero = o_zero,
    .compressed = o_compressed, .spool_put = o_put, .spool_get = o_get,
};

/* ---- the contract, row by row ------------------------------------------- */

static void check_row(const struct nbdf_format *f)
{
    CHECK(f->name && f->extension && f->extension[0] == '.' && f->probe);
    CHECK(f->stream_new && f->stream_feed && f->stream_hole &&
          f->stream_finish && f->stream_free && f->stream_error &&
          f->stream_position && f->stream_first_kind);
    CHECK(f->synth_new && f->synth_allocate && f->synth_seal &&
          f->synth_file_size && f->synth_read && f->synth_free);
    if (f->unpack)
        CHECK(f->unpack->new_ctx && f->unpack->free_ctx &&
              f->unpack->decode && f->unpack->out_max > 0 &&
              f->unpack->desc_size > f->unpack->disk_off_at &&
              f->unpack->desc_size > f->unpack->cdata_at);
}

/* The row's synthesized image of the disk, read in odd pieces. */
static uint8_t *synthesize(const struct nbdf_format *f, uint64_t *len)
{
    static const uint8_t uuid[16] = { 1, 2, 3, 4, 5, 6, 7, 8, 9 };
    struct nbdf_synth_opts o = { .uuid = uuid, .timestamp = 1000,
                                 .cid = 0x1234, .name = "disk.img",
                                 .cluster_bits = 16 };
    struct nbdf_err e = { "" };
    void *sy;

    if (f->synth_new(DISK, &o, &sy, &e) < 0) {
        fprintf(stderr, "%s: synth_new: %s\n", f->name, e.msg);
        abort();
    }
    CHECK(allocate(f, sy) == 0 && f->synth_seal(sy) == 0);
    uint64_t n = f->synth_file_size(sy), x = 3;
    uint8_t *img = malloc(n);
    CHECK(img && n > DISK / 2);
    for (uint64_t off = 0; off < n; ) {
        size_t piece = 1 + rnd(&x) % 300000;
        int64_t r = f->synth_read(sy, off, img + off, piece, read_disk, disk);
        CHECK(r > 0 && (uint64_t) r == (piece < n - off ? piece : n - off));
        off += (uint64_t) r;
    }
    CHECK(f->synth_read(sy, n, img, 1, read_disk, disk) == 0);
    f->synth_free(sy);
    *len = n;
    return img;
}

/* Feed img through the row's decoder: its all-zero 64 KiB runs as holes
 * (as cp --sparse does), the rest in 1 MiB writes. */
static void decode(const struct nbdf_format *f, const uint8_t *img,
                   uint64_t len)
{
    struct out d = { .f = f, .buf = malloc(DISK) };
    struct nbdf_stream_opts o = { .accept_fixed = true,
                                  .spool_max = 64u << 20,
                                  .spool_option = "--spool-max" };
    void *s;

    CHECK(d.buf && f->stream_new(&sink, &d, &o, &s) == 0);
    CHECK(f->stream_position(s) == 0 &&
          f->stream_first_kind(s) == IMAGE_UNKNOWN);
    int r = 0;
    for (uint64_t off = 0; off < len && r == 0; ) {
        uint64_t n = len - off < 65536 ? len - off : 65536;
        if (off > 0 && is_zero(img + off, n))
            r = f->stream_hole(s, off, n);
        else
            r = f->stream_feed(s, off, img + off, (size_t) n);
        off += n;
    }
    if (r == 0)
        r = f->stream_finish(s);
    if (r != 0) {
        fprintf(stderr, "%s: decode: %d %s\n", f->name, r, f->stream_error(s));
        abort();
    }
    CHECK(f->stream_error(s)[0] == '\0' && f->stream_position(s) == len);
    CHECK(f->stream_first_kind(s) == f->kind);
    CHECK(d.began && memcmp(d.buf, disk, DISK) == 0);
    char sum[256] = "";
    if (f->stream_summary)
        f->stream_summary(s, sum, sizeof sum);
    printf("ok %s: %" PRIu64 "-byte image decoded back, %" PRIu64 " data "
           "bytes, %" PRIu64 " units handed over%s\n", f->name, len, d.data,
           d.units, sum);
    f->stream_free(s);
    if (d.ctx)
        f->unpack->free_ctx(d.ctx);
    free(d.unit_out);
    free(d.buf);
}

/* A stream that is not the row's format is refused, naming what it is. */
static void refuse_other(const struct nbdf_format *f, const uint8_t *other,
                         uint64_t len, enum image_kind kind)
{
    struct out d = { .f = f, .buf = malloc(DISK) };
    struct nbdf_stream_opts o = { .accept_fixed = false };
    void *s;

    CHECK(f->stream_new(&sink, &d, &o, &s) == 0);
    int r = f->stream_feed(s, 0, other, len < 65536 ? (size_t) len : 65536);
    if (r == 0)
        r = f->stream_finish(s);
    CHECK(r < 0 && f->stream_error(s)[0] && !d.began);
    CHECK(f->stream_first_kind(s) == kind);
    f->stream_free(s);
    free(d.buf);
}

int main(void)
{
    const size_t nrows = sizeof rows / sizeof *rows;
    uint8_t *img[sizeof rows / sizeof *rows];
    uint64_t len[sizeof rows / sizeof *rows], x = 11;

    setvbuf(stdout, NULL, _IOLBF, 0);
    (void) dir;                         /* no files: nothing to keep */
    CHECK((disk = calloc(1, DISK)));
    for (uint64_t off = 0; off < DISK; off += 8) {
        uint64_t blk = off >> 16;
        if (blk % 4 == 1 || (blk == 6 && (off & 0xffff) >= 0x8000))
            continue;                   /* a hole; half of block 6 */
        uint64_t v = rnd(&x);
        memcpy(disk + off, &v, 8);
    }
    for (size_t i = 0; i < nrows; i++) {
        check_row(rows[i]);
        img[i] = synthesize(rows[i], &len[i]);
        CHECK(rows[i]->probe(img[i], 512));
        decode(rows[i], img[i], len[i]);
    }
    for (size_t i = 0; i < nrows; i++)
        for (size_t j = 0; j < nrows; j++)
            if (i != j) {
                CHECK(!rows[i]->probe(img[j], 512));
                refuse_other(rows[i], img[j], len[j], rows[j]->kind);
            }
    printf("ok every row refuses the others' images\n");
    for (size_t i = 0; i < nrows; i++)
        free(img[i]);
    free(disk);
    printf("test-common-format: ok\n");
    return 0;
}
