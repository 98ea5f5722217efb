/* vmdk/table.c: the VMDK library's row of the format contract
 * (common/format.h): its stream decoder and synthesizer behind the
 * table's hooks; compressed grains are handed over for the caller's inflaters. */
#include <inttypes.h>
#include <stdio.h>

#include "vmdk/vmdk.h"

static bool probe(const void *buf, size_t len)
{
    return image_kind(buf, len) == IMAGE_VMDK;
}

static int stream_new(const struct nbdf_sink *sink, void *opaque,
                      const struct nbdf_stream_opts *o, void **out)
{
    (void) o;
    return vmdk_stream_new(sink, opaque, (struct vmdk_stream **) out);
}

static void summary(const void *s, char *buf, size_t n)
{
    struct vmdk_stream_stats st;

    vmdk_stream_stats(s, &st);
    snprintf(buf, n, ", %" PRIu64 " grains", st.grains);
}

static int new_ctx(void **out)
{
    return vmdk_inflater_new((struct vmdk_inflater **) out);
}

static void free_ctx(void *z) { vmdk_inflater_free(z); }

static int64_t decode(void *z, const void *g, void *out, struct nbdf_err *e)
{
    return vmdk_grain_inflate(z, g, out, e);
}

static const struct nbdf_unpack unpack = {
    .what = "inflater", .desc_size = sizeof(struct vmdk_grain),
    .disk_off_at = offsetof(struct vmdk_grain, disk_off),
    .cdata_at = offsetof(struct vmdk_grain, cdata),
    .out_max = VMDK_GRAIN_MAX_SECTORS * VMDK_SECTOR,
    .new_ctx = new_ctx, .free_ctx = free_ctx, .decode = decode,
};

static int synth_new(uint64_t size, const struct nbdf_synth_opts *o,
                     void **out, struct nbdf_err *err)
{
    return vmdk_synth_new(size, o->cid, o->name, (struct vmdk_synth **) out,
                          err);
}

/* ---- the stream decoder -------------------------------------------------- */

static int feed(void *s, uint64_t off, const void *buf, size_t len)
{
    return vmdk_stream_feed(s, off, buf, len);
}

static int hole(void *s, uint64_t off, uint64_t len)
{
    return vmdk_stream_hole(s, off, len);
}

static int finish(void *s) { return vmdk_stream_finish(s); }
static void stream_free(void *s) { vmdk_stream_free(s); }
static const char *error(const void *s) { return vmdk_stream_error(s); }
static uint64_t position(const void *s) { return vmdk_stream_position(s); }

static enum image_kind first_kind(const void *s)
{
    return vmdk_stream_first_kind(s);
}

/* ---- the synthesizer ------------------------------------------------------ */

static int allocate(void *sy, uint64_t off, uint64_t len)
{
    return vmdk_synth_allocate(sy, off, len);
}

static int seal(void *sy) { return vmdk_synth_seal(sy); }
static void synth_free(void *sy) { vmdk_synth_free(sy); }

static uint64_t file_size(const void *sy)
{
    return vmdk_synth_file_size(sy);
}

static int64_t synth_read(void *sy, uint64_t off, void *buf, size_t len,
                          nbdf_read_disk_fn read_disk, void *opaque)
{
    return vmdk_synth_read(sy, off, buf, len, read_disk, opaque);
}

const struct nbdf_format vmdk_format = {
    .name = "VMDK", .extension = ".vmdk", .kind = IMAGE_VMDK, .probe = probe,
    .stream_new = stream_new, .stream_feed = feed, .stream_hole = hole,
    .stream_finish = finish, .stream_free = stream_free,
    .stream_error = error, .stream_position = position,
    .stream_first_kind = first_kind,
    .stream_summary = summary, .unpack = &unpack,
    .synth_new = synth_new, .synth_allocate = allocate, .synth_seal = seal,
    .synth_file_size = file_size, .synth_read = synth_read,
    .synth_free = synth_free,
    .synth_serial = true,       /* each caches a grain */
};
