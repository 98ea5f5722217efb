/* qcow2/table.c: the qcow2 library's row of the format contract
 * (common/format.h): its stream decoder, random-access reader (over
 * qcow2_image_*) and synthesizer behind the table's hooks; compressed
 * clusters are handed over for the caller's decompressors. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qcow2/qcow2.h"

static bool probe(const void *buf, size_t len)
{
    return image_kind(buf, len) == IMAGE_QCOW2;
}

static int stream_new(const struct nbdf_sink *sink, void *opaque,
                      const struct nbdf_stream_opts *o, void **out)
{
    struct qcow2_stream_opts opts = { 0 };

    if (o) {
        opts.spool_max = o->spool_max;
        opts.spool_option = o->spool_option;
    }
    return qcow2_stream_new(sink, opaque, &opts, (struct qcow2_stream **) out);
}

static void summary(const void *s, char *buf, size_t n)
{
    struct qcow2_stream_stats st;

    qcow2_stream_stats(s, &st);
    snprintf(buf, n, ", %" PRIu64 " data clusters, %" PRIu64 " compressed, %"
             PRIu64 " spooled", st.data_clusters, st.compressed_clusters,
             st.spooled_clusters);
}

static int new_ctx(void **out)
{
    return qcow2_decompressor_new((struct qcow2_decompressor **) out);
}

static void free_ctx(void *z) { qcow2_decompressor_free(z); }

static int64_t decode(void *z, const void *c, void *out, struct nbdf_err *e)
{
    return qcow2_compressed_decode(z, c, out, e);
}

static const struct nbdf_unpack unpack = {
    .what = "decompressor", .desc_size = sizeof(struct qcow2_compressed),
    .disk_off_at = offsetof(struct qcow2_compressed, disk_off),
    .cdata_at = offsetof(struct qcow2_compressed, cdata),
    .out_max = 1u << QCOW2_MAX_CLUSTER_BITS,
    .new_ctx = new_ctx, .free_ctx = free_ctx, .decode = decode,
};

static int synth_new(uint64_t size, const struct nbdf_synth_opts *o,
                     void **out, struct nbdf_err *err)
{
    return qcow2_synth_new(size, o->cluster_bits, (struct qcow2_synth **) out,
                           err);
}

/* ---- the stream decoder -------------------------------------------------- */

static int feed(void *s, uint64_t off, const void *buf, size_t len)
{
    return qcow2_stream_feed(s, off, buf, len);
}

static int hole(void *s, uint64_t off, uint64_t len)
{
    return qcow2_stream_hole(s, off, len);
}

static int finish(void *s) { return qcow2_stream_finish(s); }
static void stream_free(void *s) { qcow2_stream_free(s); }
static const char *error(const void *s) { return qcow2_stream_error(s); }
static uint64_t position(const void *s) { return qcow2_stream_position(s); }

static enum image_kind first_kind(const void *s)
{
    return qcow2_stream_first_kind(s);
}

/* ---- the synthesizer ------------------------------------------------------ */

static int allocate(void *sy, uint64_t off, uint64_t len)
{
    return qcow2_synth_allocate(sy, off, len);
}

static int seal(void *sy) { return qcow2_synth_seal(sy); }
static void synth_free(void *sy) { qcow2_synth_free(sy); }

static uint64_t file_size(const void *sy)
{
    return qcow2_synth_file_size(sy);
}

static int64_t synth_read(void *sy, uint64_t off, void *buf, size_t len,
                          nbdf_read_disk_fn read_disk, void *opaque)
{
    return qcow2_synth_read(sy, off, buf, len, read_disk, opaque);
}

/* ---- the random-access reader --------------------------------------------- */

/* qcow2_image behind the contract; the L2 table a lookup last needed is
 * kept (one), keyed by its file offset. */
struct qcow2_ra {
    struct qcow2_image *img;        /* owned */
    uint8_t *l2;                    /* owned: the table held */
    size_t l2_cap;
    uint64_t l2_off;                /* its file offset; 0: none */
    uint64_t need_off;              /* a table to read */
    size_t need_len;                /* 0: none */
};

static int ra_new(uint64_t file_size, void **out, struct nbdf_err *err)
{
    struct qcow2_ra *q = calloc(1, sizeof *q);
    int r = q ? qcow2_image_new(file_size, &q->img, err) : -ENOMEM;

    if (r < 0) {
        free(q);
        return r;
    }
    *out = q;
    return 0;
}

static int ra_next(const void *ra, uint64_t *off, size_t *len)
{
    const struct qcow2_ra *q = ra;

    if (q->need_len) {
        *off = q->need_off;
        *len = q->need_len;
        return 1;
    }
    return qcow2_image_next(q->img, off, len);
}

static int ra_supply(void *ra, const void *buf, struct nbdf_err *err)
{
    struct qcow2_ra *q = ra;

    if (!q->need_len)
        return qcow2_image_supply(q->img, buf, err);
    if (q->need_len > q->l2_cap) {
        uint8_t *b = realloc(q->l2, q->need_len);
        if (!b)
            return -ENOMEM;
        q->l2 = b;
        q->l2_cap = q->need_len;
    }
    memcpy(q->l2, buf, q->need_len);
    q->l2_off = q->need_off;
    q->need_len = 0;
    return 0;
}

static int ra_lookup(void *ra, uint64_t off, struct nbdf_place *out,
                     struct nbdf_err *err)
{
    static const enum nbdf_place_kind kinds[] = {
        [QCOW2_SRC_ZERO] = NBDF_PLACE_ZERO,
        [QCOW2_SRC_BACKING] = NBDF_PLACE_BACKING,
        [QCOW2_SRC_FILE] = NBDF_PLACE_FILE,
        [QCOW2_SRC_COMPRESSED] = NBDF_PLACE_COMPRESSED,
    };
    struct qcow2_ra *q = ra;
    struct qcow2_place p;
    int r = qcow2_image_lookup(q->img, off, q->l2_off ? q->l2 : NULL,
                               q->l2_off, &p, err);

    if (r < 0)
        return r;
    if (p.src == QCOW2_SRC_L2) {
        q->need_off = p.file_off;
        q->need_len = (size_t) p.len;
        *out = (struct nbdf_place) { .kind = NBDF_PLACE_NEED };
        return 0;
    }
    *out = (struct nbdf_place) {
        .kind = kinds[p.src], .len = p.len, .file_off = p.file_off,
        .clen = p.clen, .unit_off = p.cluster,
    };
    return 0;
}

static int ra_unpack_desc(const void *ra, const struct nbdf_place *p,
                          const void *cdata, void *desc, struct nbdf_err *err)
{
    const struct qcow2_ra *q = ra;
    struct qcow2_place qp = {
        .src = QCOW2_SRC_COMPRESSED, .file_off = p->file_off, .len = p->len,
        .cluster = p->unit_off, .clen = p->clen,
    };

    qcow2_image_compressed(q->img, &qp, cdata, desc);
    return 0;
}

static void ra_free(void *ra)
{
    struct qcow2_ra *q = ra;

    if (q) {
        qcow2_image_free(q->img);
        free(q->l2);
        free(q);
    }
}

static const struct qcow2_header *ra_header(const void *ra)
{
    return qcow2_image_header(((const struct qcow2_ra *) ra)->img);
}

static uint64_t ra_size(const void *ra) { return ra_header(ra)->size; }

static uint64_t ra_unit(const void *ra)
{
    return 1ull << ra_header(ra)->cluster_bits;
}

static bool ra_has_backing(const void *ra)
{
    return ra_header(ra)->backing_file[0] != 0;
}

static int ra_backing(const void *ra, unsigned i, char *buf, size_t n)
{
    const char *name = ra_header(ra)->backing_file;
    size_t len = strlen(name);

    if (i > 0 || !name[0] || len >= n)
        return 0;
    memcpy(buf, name, len + 1);
    return (int) len;
}

static const char *ra_backing_format(const void *ra)
{
    return ra_header(ra)->backing_format;
}

const struct nbdf_format qcow2_format = {
    .name = "qcow2", .extension = ".qcow2", .kind = IMAGE_QCOW2, .probe = probe,
    .stream_new = stream_new, .stream_feed = feed, .stream_hole = hole,
    .stream_finish = finish, .stream_free = stream_free,
    .stream_error = error, .stream_position = position,
    .stream_first_kind = first_kind,
    .stream_summary = summary, .unpack = &unpack,
    .image_new = ra_new, .image_next = ra_next, .image_supply = ra_supply,
    .image_lookup = ra_lookup, .image_free = ra_free, .image_size = ra_size,
    .image_unit = ra_unit, .image_unpack_desc = ra_unpack_desc,
    .image_backing_rule = NBDF_BACKING_NAMED,
    .image_has_backing = ra_has_backing, .image_backing = ra_backing,
    .image_backing_format = ra_backing_format,
    .synth_new = synth_new, .synth_allocate = allocate, .synth_seal = seal,
    .synth_file_size = file_size, .synth_read = synth_read,
    .synth_free = synth_free,
    .synth_serial = true,       /* each caches a table */
};
