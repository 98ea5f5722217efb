/* vhdx/table.c: the VHDX library's row of the format contract
 * (common/format.h): its stream decoder, random-access reader (over
 * vhdx_image_*, its log replayed through the patch hook) and synthesizer
 * behind the table's hooks; early blocks go to the caller's spool. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>

#include "vhdx/vhdx.h"

static bool probe(const void *buf, size_t len)
{
    return image_kind(buf, len) == IMAGE_VHDX;
}

static int stream_new(const struct nbdf_sink *sink, void *opaque,
                      const struct nbdf_stream_opts *o, void **out)
{
    struct vhdx_stream_config cfg = { 0 };

    if (o) {
        cfg.spool_max = o->spool_max;
        cfg.spool_option = o->spool_option;
    }
    return vhdx_stream_new(sink, opaque, &cfg, (struct vhdx_stream **) out);
}

static void summary(const void *s, char *buf, size_t n)
{
    struct vhdx_stream_stats st;

    vhdx_stream_stats(s, &st);
    snprintf(buf, n, ", %" PRIu64 " bytes of data, %" PRIu64 " spooled",
             st.data_bytes, st.spooled_bytes);
}

static int synth_new(uint64_t size, const struct nbdf_synth_opts *o,
                     void **out, struct nbdf_err *err)
{
    return vhdx_synth_new(size, o->uuid, (struct vhdx_synth **) out, err);
}

/* ---- the stream decoder -------------------------------------------------- */

static int feed(void *s, uint64_t off, const void *buf, size_t len)
{
    return vhdx_stream_feed(s, off, buf, len);
}

static int hole(void *s, uint64_t off, uint64_t len)
{
    return vhdx_stream_hole(s, off, len);
}

static int finish(void *s) { return vhdx_stream_finish(s); }
static void stream_free(void *s) { vhdx_stream_free(s); }
static const char *error(const void *s) { return vhdx_stream_error(s); }
static uint64_t position(const void *s) { return vhdx_stream_position(s); }

static enum image_kind first_kind(const void *s)
{
    return vhdx_stream_first_kind(s);
}

/* ---- the synthesizer ------------------------------------------------------ */

static int allocate(void *sy, uint64_t off, uint64_t len)
{
    return vhdx_synth_allocate(sy, off, len);
}

static int seal(void *sy) { return vhdx_synth_seal(sy); }
static void synth_free(void *sy) { vhdx_synth_free(sy); }

static uint64_t file_size(const void *sy)
{
    return vhdx_synth_file_size(sy);
}

static int64_t synth_read(void *sy, uint64_t off, void *buf, size_t len,
                          nbdf_read_disk_fn read_disk, void *opaque)
{
    return vhdx_synth_read(sy, off, buf, len, read_disk, opaque);
}

/* ---- the random-access reader --------------------------------------------- */

static int ra_new(uint64_t file_size, void **out, struct nbdf_err *err)
{
    return vhdx_image_new(file_size, (struct vhdx_image **) out);
}

static int ra_next(const void *img, uint64_t *off, size_t *len)
{
    return vhdx_image_next(img, off, len);
}

static int ra_supply(void *img, const void *buf, struct nbdf_err *err)
{
    return vhdx_image_supply(img, buf, err);
}

/* A present block's bytes are read only as far as the file reaches:
 * past that, -EINVAL (as the file's end is to vhdx_image_read()). */
static int ra_lookup(void *img, uint64_t off, struct nbdf_place *out,
                     struct nbdf_err *err)
{
    const struct vhdx_meta *m = vhdx_image_meta(img);
    uint64_t bs = m->block_size, within = off % bs;
    uint64_t len = bs - within < m->disk_size - off ? bs - within
                                                    : m->disk_size - off;
    uint64_t foff = vhdx_image_block(img, off / bs), reach;

    *out = (struct nbdf_place) { .kind = NBDF_PLACE_ZERO, .len = len };
    if (!foff)
        return 0;
    reach = vhdx_image_reach(img);
    if (foff + within >= reach)
        return -EINVAL;
    out->kind = NBDF_PLACE_FILE;
    out->file_off = foff + within;
    if (out->len > reach - out->file_off)
        out->len = reach - out->file_off;
    return 0;
}

static void ra_free(void *img) { vhdx_image_free(img); }

static uint64_t ra_size(const void *img)
{
    return vhdx_image_meta(img)->disk_size;
}

static uint64_t ra_unit(const void *img)
{
    return vhdx_image_meta(img)->block_size;
}

static void ra_patch(const void *img, uint64_t off, void *buf, size_t len)
{
    vhdx_image_patch(img, off, buf, len);
}

const struct nbdf_format vhdx_format = {
    .name = "VHDX", .extension = ".vhdx", .kind = IMAGE_VHDX, .probe = probe,
    .stream_new = stream_new, .stream_feed = feed, .stream_hole = hole,
    .stream_finish = finish, .stream_free = stream_free,
    .stream_error = error, .stream_position = position,
    .stream_first_kind = first_kind,
    .stream_summary = summary,
    .image_new = ra_new, .image_next = ra_next, .image_supply = ra_supply,
    .image_lookup = ra_lookup, .image_free = ra_free, .image_size = ra_size,
    .image_unit = ra_unit, .image_patch = ra_patch,
    .synth_new = synth_new, .synth_allocate = allocate, .synth_seal = seal,
    .synth_file_size = file_size, .synth_read = synth_read,
    .synth_free = synth_free,
};
