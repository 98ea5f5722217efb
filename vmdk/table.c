/* vmdk/table.c: the VMDK library's row of the format contract
 * (common/format.h): its stream decoder, random-access reader (over
 * vmdk_image_*) and synthesizer behind the table's hooks; compressed
 * grains are handed over for the caller's inflaters. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

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

/* ---- the random-access reader --------------------------------------------- */

#define MARKER_HEAD 12              /* lba (8), compressed size (4) */

/* vmdk_image behind the contract: the first sector is asked for first,
 * then what vmdk_image_next() asks.  A streamOptimized grain's marker
 * head is asked for by the lookup that meets it, and kept (one). */
struct vmdk_ra {
    struct vmdk_image *img;         /* owned; NULL until sector 0 came */
    uint64_t file_size;
    uint64_t grain_bytes;
    uint64_t mk_off;                /* the marker held: its file offset,
                                     * UINT64_MAX: none */
    uint64_t mk_lba;
    uint32_t mk_size;
    uint64_t need_off;              /* a marker to read; UINT64_MAX: none */
};

static int ra_new(uint64_t file_size, void **out, struct nbdf_err *err)
{
    struct vmdk_ra *v = calloc(1, sizeof *v);

    if (!v)
        return -ENOMEM;
    v->file_size = file_size;
    v->mk_off = v->need_off = UINT64_MAX;
    *out = v;
    return 0;
}

static int ra_next(const void *ra, uint64_t *off, size_t *len)
{
    const struct vmdk_ra *v = ra;

    if (!v->img) {
        *off = 0;
        *len = VMDK_SECTOR;
        return 1;
    }
    if (v->need_off != UINT64_MAX) {
        *off = v->need_off;
        *len = MARKER_HEAD;
        return 1;
    }
    return vmdk_image_next(v->img, off, len);
}

static int ra_supply(void *ra, const void *buf, struct nbdf_err *err)
{
    struct vmdk_ra *v = ra;
    int r;

    if (v->need_off != UINT64_MAX) {
        vmdk_marker_decode(buf, &v->mk_lba, &v->mk_size);
        v->mk_off = v->need_off;
        v->need_off = UINT64_MAX;
        return 0;
    }
    if (v->img)
        return vmdk_image_supply(v->img, buf, err);
    r = vmdk_image_new(buf, v->file_size, &v->img, err);
    if (r == 0)
        v->grain_bytes = vmdk_header_grain_bytes(vmdk_image_header(v->img));
    return r;
}

/* A compressed grain fits in twice a grain plus the marker (deflate grows
 * incompressible data by a few bytes per 64 KiB), and its marker must
 * name the grain whose table entry points at it. */
static int marker_place(struct vmdk_ra *v, uint64_t off,
                        const struct vmdk_place *p, struct nbdf_place *out,
                        struct nbdf_err *err)
{
    uint64_t goff = off - off % v->grain_bytes;

    if (v->mk_off != p->file_off) {
        v->need_off = p->file_off;
        *out = (struct nbdf_place) { .kind = NBDF_PLACE_NEED };
        return 0;
    }
    if (v->mk_size == 0 || v->mk_size > 2 * v->grain_bytes)
        return nbdf_errf(err, -EINVAL, "the grain marker at byte %llu "
                         "claims %u compressed bytes",
                         (unsigned long long) p->file_off, v->mk_size);
    if (v->mk_lba * VMDK_SECTOR != goff)
        return nbdf_errf(err, -EINVAL, "the grain table entry for byte %llu "
                         "of the disk points at the marker of LBA %llu",
                         (unsigned long long) goff,
                         (unsigned long long) v->mk_lba);
    *out = (struct nbdf_place) {
        .kind = NBDF_PLACE_COMPRESSED, .len = p->len,
        .file_off = p->file_off + MARKER_HEAD, .clen = v->mk_size,
        .unit_off = goff,
    };
    return 0;
}

static int ra_lookup(void *ra, uint64_t off, struct nbdf_place *out,
                     struct nbdf_err *err)
{
    struct vmdk_ra *v = ra;
    struct vmdk_place p;
    int r = vmdk_image_lookup(v->img, off, &p);

    if (r < 0)
        return r;
    if (p.src == VMDK_SRC_MARKER)
        return marker_place(v, off, &p, out, err);
    *out = (struct nbdf_place) {
        .kind = p.src == VMDK_SRC_FILE ? NBDF_PLACE_FILE : NBDF_PLACE_ZERO,
        .len = p.len, .file_off = p.file_off,
    };
    return 0;
}

static int ra_unpack_desc(const void *ra, const struct nbdf_place *p,
                          const void *cdata, void *desc, struct nbdf_err *err)
{
    const struct vmdk_ra *v = ra;

    vmdk_grain_init(desc, vmdk_image_header(v->img),
                    p->unit_off / VMDK_SECTOR, p->file_off - MARKER_HEAD,
                    cdata, (size_t) p->clen);
    return 0;
}

static void ra_free(void *ra)
{
    struct vmdk_ra *v = ra;

    if (v) {
        vmdk_image_free(v->img);
        free(v);
    }
}

static uint64_t ra_size(const void *ra)
{
    const struct vmdk_ra *v = ra;
    return vmdk_image_header(v->img)->capacity * VMDK_SECTOR;
}

static uint64_t ra_unit(const void *ra)
{
    return ((const struct vmdk_ra *) ra)->grain_bytes;
}

const struct nbdf_format vmdk_format = {
    .name = "VMDK", .extension = ".vmdk", .kind = IMAGE_VMDK, .probe = probe,
    .stream_new = stream_new, .stream_feed = feed, .stream_hole = hole,
    .stream_finish = finish, .stream_free = stream_free,
    .stream_error = error, .stream_position = position,
    .stream_first_kind = first_kind,
    .stream_summary = summary, .unpack = &unpack,
    .image_new = ra_new, .image_next = ra_next, .image_supply = ra_supply,
    .image_lookup = ra_lookup, .image_free = ra_free, .image_size = ra_size,
    .image_unit = ra_unit, .image_unpack_desc = ra_unpack_desc,
    .synth_new = synth_new, .synth_allocate = allocate, .synth_seal = seal,
    .synth_file_size = file_size, .synth_read = synth_read,
    .synth_free = synth_free,
    .synth_serial = true,       /* each caches a grain */
};
