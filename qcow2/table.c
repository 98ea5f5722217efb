/* qcow2/table.c: the qcow2 library's row of the format contract
 * (common/format.h): its stream decoder and synthesizer behind the
 * table's hooks; compressed clusters are handed over for the caller's decompressors. */
#include <inttypes.h>
#include <stdio.h>

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

const struct nbdf_format qcow2_format = {
    .name = "qcow2", .extension = ".qcow2", .kind = IMAGE_QCOW2, .probe = probe,
    .stream_new = stream_new, .stream_feed = feed, .stream_hole = hole,
    .stream_finish = finish, .stream_free = stream_free,
    .stream_error = error, .stream_position = position,
    .stream_first_kind = first_kind,
    .stream_summary = summary, .unpack = &unpack,
    .synth_new = synth_new, .synth_allocate = allocate, .synth_seal = seal,
    .synth_file_size = file_size, .synth_read = synth_read,
    .synth_free = synth_free,
    .synth_serial = true,       /* each caches a table */
};
