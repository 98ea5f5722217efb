/* vhd/table.c: the VHD library's row of the format contract
 * (common/format.h): its stream decoder and synthesizer behind the
 * table's hooks. */
#include "vhd/vhd.h"

static bool probe(const void *buf, size_t len)
{
    return image_kind(buf, len) == IMAGE_VHD;
}

static int stream_new(const struct nbdf_sink *sink, void *opaque,
                      const struct nbdf_stream_opts *o, void **out)
{
    struct vhd_stream *s;
    int r = vhd_stream_new(sink, opaque, &s);
    if (r == 0 && o)
        vhd_stream_limit(s, o->max_size ? o->max_size : VHD_MAX_SIZE,
                         o->accept_fixed);
    if (r == 0)
        *out = s;
    return r;
}

static int synth_new(uint64_t size, const struct nbdf_synth_opts *o,
                     void **out, struct nbdf_err *err)
{
    return vhd_synth_new(size, o->uuid, o->timestamp,
                         (struct vhd_synth **) out, err);
}

/* ---- the stream decoder -------------------------------------------------- */

static int feed(void *s, uint64_t off, const void *buf, size_t len)
{
    return vhd_stream_feed(s, off, buf, len);
}

static int hole(void *s, uint64_t off, uint64_t len)
{
    return vhd_stream_hole(s, off, len);
}

static int finish(void *s) { return vhd_stream_finish(s); }
static void stream_free(void *s) { vhd_stream_free(s); }
static const char *error(const void *s) { return vhd_stream_error(s); }
static uint64_t position(const void *s) { return vhd_stream_position(s); }

static enum image_kind first_kind(const void *s)
{
    return vhd_stream_first_kind(s);
}

/* ---- the synthesizer ------------------------------------------------------ */

static int allocate(void *sy, uint64_t off, uint64_t len)
{
    return vhd_synth_allocate(sy, off, len);
}

static int seal(void *sy) { return vhd_synth_seal(sy); }
static void synth_free(void *sy) { vhd_synth_free(sy); }

static uint64_t file_size(const void *sy)
{
    return vhd_synth_file_size(sy);
}

static int64_t synth_read(void *sy, uint64_t off, void *buf, size_t len,
                          nbdf_read_disk_fn read_disk, void *opaque)
{
    return vhd_synth_read(sy, off, buf, len, read_disk, opaque);
}

const struct nbdf_format vhd_format = {
    .name = "VHD", .extension = ".vhd", .kind = IMAGE_VHD, .probe = probe,
    .stream_new = stream_new, .stream_feed = feed, .stream_hole = hole,
    .stream_finish = finish, .stream_free = stream_free,
    .stream_error = error, .stream_position = position,
    .stream_first_kind = first_kind,
    .synth_new = synth_new, .synth_allocate = allocate, .synth_seal = seal,
    .synth_file_size = file_size, .synth_read = synth_read,
    .synth_free = synth_free,
};
