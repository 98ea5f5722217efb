/* vhd/table.c: the VHD library's row of the format contract
 * (common/format.h): its stream decoder, random-access reader (over
 * vhd_image_*) and synthesizer behind the table's hooks. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* ---- the random-access reader --------------------------------------------- */

/* vhd_image behind the contract: the footer (the file's last sector) is
 * asked for first, then what vhd_image_next() asks; a lookup's block
 * bitmap is kept, one block's, keyed by its file offset. */
struct vhd_ra {
    struct vhd_image *img;          /* owned; NULL until the footer came */
    uint64_t file_size;
    uint8_t *bm;                    /* owned: the bitmap held */
    uint64_t bm_off;                /* its file offset; UINT64_MAX: none */
    uint64_t need_off;              /* a lookup's bitmap to read */
    size_t need_len;                /* 0: none */
};

const struct vhd_image *vhd_format_image(const void *ra)
{
    return ((const struct vhd_ra *) ra)->img;
}

static int ra_new(uint64_t file_size, void **out, struct nbdf_err *err)
{
    struct vhd_ra *v;

    if (file_size < VHD_FOOTER_SIZE)
        return nbdf_errf(err, -EINVAL, "file of %" PRIu64 " bytes is "
                         "shorter than a VHD footer", file_size);
    if (!(v = calloc(1, sizeof *v)))
        return -ENOMEM;
    v->file_size = file_size;
    v->bm_off = UINT64_MAX;
    *out = v;
    return 0;
}

static int ra_next(const void *ra, uint64_t *off, size_t *len)
{
    const struct vhd_ra *v = ra;

    if (!v->img) {
        *off = v->file_size - VHD_FOOTER_SIZE;
        *len = VHD_FOOTER_SIZE;
        return 1;
    }
    if (v->need_len) {
        *off = v->need_off;
        *len = v->need_len;
        return 1;
    }
    return vhd_image_next(v->img, off, len);
}

/* A size past the library's limits is as invalid as a broken rule. */
static int ra_supply(void *ra, const void *buf, struct nbdf_err *err)
{
    struct vhd_ra *v = ra;
    int r;

    if (v->need_len) {                  /* a bitmap: one size per image */
        if (!v->bm && !(v->bm = malloc(v->need_len)))
            return -ENOMEM;
        memcpy(v->bm, buf, v->need_len);
        v->bm_off = v->need_off;
        v->need_len = 0;
        return 0;
    }
    r = v->img ? vhd_image_supply(v->img, buf, err)
               : vhd_image_new(buf, v->file_size, &v->img, err);
    return r == -EFBIG ? -EINVAL : r;
}

static int ra_lookup(void *ra, uint64_t off, struct nbdf_place *out,
                     struct nbdf_err *err)
{
    static const enum nbdf_place_kind kinds[] = {
        [VHD_SRC_FILE] = NBDF_PLACE_FILE, [VHD_SRC_ZERO] = NBDF_PLACE_ZERO,
        [VHD_SRC_PARENT] = NBDF_PLACE_BACKING,
    };
    struct vhd_ra *v = ra;
    struct vhd_place pl;
    int r = vhd_image_lookup(v->img, off, NULL, &pl);

    if (r == 0 && pl.src == VHD_SRC_BITMAP && pl.file_off == v->bm_off)
        r = vhd_image_lookup(v->img, off, v->bm, &pl);
    if (r < 0)
        return r;
    *out = (struct nbdf_place) { .len = pl.len, .file_off = pl.file_off };
    if (pl.src == VHD_SRC_BITMAP) {
        v->need_off = pl.file_off;
        v->need_len = (size_t) pl.len;
        out->kind = NBDF_PLACE_NEED;
        out->len = 0;
        return 0;
    }
    out->kind = kinds[pl.src];
    return 0;
}

static void ra_free(void *ra)
{
    struct vhd_ra *v = ra;

    if (v) {
        vhd_image_free(v->img);
        free(v->bm);
        free(v);
    }
}

static uint64_t ra_size(const void *ra)
{
    return vhd_image_size(((const struct vhd_ra *) ra)->img);
}

static uint64_t ra_unit(const void *ra)
{
    const struct vhd_image *img = ((const struct vhd_ra *) ra)->img;
    return vhd_image_block_size(img) ? vhd_image_block_size(img)
                                     : VHD_SECTOR;
}

static bool ra_has_backing(const void *ra)
{
    return vhd_image_kind(((const struct vhd_ra *) ra)->img) == VHD_DIFF;
}

/* Candidates in the order they are tried: the locators (MacX, then W2ru,
 * then W2ku), then the unicode parent name. */
static int ra_backing(const void *ra, unsigned i, char *buf, size_t n)
{
    static const uint32_t order[] = { VHD_PLAT_MACX, VHD_PLAT_W2RU,
                                      VHD_PLAT_W2KU };
    const struct vhd_image *img = ((const struct vhd_ra *) ra)->img;
    const struct vhd_header *h = vhd_image_header(img);
    unsigned k = 0;

    for (size_t o = 0; o < 3; o++)
        for (int l = 0; l < 8; l++) {
            size_t len;
            const uint8_t *p = vhd_image_locator_payload(img, l, &len);
            if (h->loc[l].code != order[o] || !p)
                continue;
            int r = vhd_locator_path(&h->loc[l], p, len, buf, n, NULL);
            if (r > 0 && k++ == i)
                return r;
        }
    int r = vhd_parent_name(h, buf, n);
    return r > 0 && k == i ? r : 0;
}

/* blktap takes a raw parent for a child without a parent id. */
static bool ra_backing_raw_ok(const void *ra)
{
    const struct vhd_header *h =
        vhd_image_header(((const struct vhd_ra *) ra)->img);
    for (int i = 0; i < 16; i++)
        if (h->parent_uuid[i])
            return false;
    return true;
}

static int ra_check_backing(const void *ra, const void *parent,
                            struct nbdf_err *err)
{
    return vhd_image_check_parent(((const struct vhd_ra *) ra)->img,
                                  ((const struct vhd_ra *) parent)->img, err);
}

const struct nbdf_format vhd_format = {
    .name = "VHD", .extension = ".vhd", .kind = IMAGE_VHD, .probe = probe,
    .stream_new = stream_new, .stream_feed = feed, .stream_hole = hole,
    .stream_finish = finish, .stream_free = stream_free,
    .stream_error = error, .stream_position = position,
    .stream_first_kind = first_kind,
    .image_new = ra_new, .image_next = ra_next, .image_supply = ra_supply,
    .image_lookup = ra_lookup, .image_free = ra_free, .image_size = ra_size,
    .image_unit = ra_unit, .image_backing_rule = NBDF_BACKING_LOCATED,
    .image_has_backing = ra_has_backing, .image_backing = ra_backing,
    .image_backing_raw_ok = ra_backing_raw_ok,
    .image_check_backing = ra_check_backing,
    .synth_new = synth_new, .synth_allocate = allocate, .synth_seal = seal,
    .synth_file_size = file_size, .synth_read = synth_read,
    .synth_free = synth_free,
};
