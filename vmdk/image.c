/* vmdk/image.c: random-access parse of a VMDK file through its grain
 * directory and tables (the way qemu reads it).  No I/O: the caller
 * supplies the pieces the image asks for.  See vmdk/vmdk.h. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "vmdk/vmdk-internal.h"

#define GD_MAX_ENTRIES (1u << 22)         /* as the stream decoder */

enum want { W_DESC, W_FOOTER, W_GD, W_GT, W_DONE };

struct vmdk_image {
    struct vmdk_header h;                 /* the footer's, if GD_AT_END */
    uint64_t file_size, grain_bytes, capacity, ngrains, ngts;
    enum want want;
    uint64_t gt_next;                     /* next GD entry to fetch */
    uint32_t *gd;                         /* ngts entries */
    uint32_t *gte;                        /* ngrains entries */
};

void vmdk_marker_decode(const void *buf, uint64_t *lba, uint32_t *size)
{
    struct vmdk_marker_disk m;
    memcpy(&m, buf, VMDK_GRAIN_MARKER_SIZE);
    *lba = le64toh(m.lba);
    *size = le32toh(m.size);
}

void vmdk_image_free(struct vmdk_image *img)
{
    if (img) {
        free(img->gd);
        free(img->gte);
        free(img);
    }
}

const struct vmdk_header *vmdk_image_header(const struct vmdk_image *img)
{
    return &img->h;
}

/* Skip GD entries that are 0 (no table). */
static void next_gt(struct vmdk_image *img)
{
    while (img->gt_next < img->ngts && img->gd[img->gt_next] == 0)
        img->gt_next++;
    img->want = img->gt_next < img->ngts ? W_GT : W_DONE;
}

static int check_gd_room(const struct vmdk_image *img, struct nbdf_err *err)
{
    uint64_t gd_off = img->h.gd_offset;
    if (gd_off == 0 || gd_off == VMDK_GD_AT_END ||
        gd_off > img->file_size / VMDK_SECTOR ||
        img->ngts * 4 > img->file_size - gd_off * VMDK_SECTOR)
        return nbdf_errf(err, -EINVAL, "grain directory at sector %" PRIu64
                         " is not inside the file", gd_off);
    return 0;
}

int vmdk_image_new(const void *sector0, uint64_t file_size,
                   struct vmdk_image **out, struct nbdf_err *err)
{
    struct vmdk_image *img = calloc(1, sizeof *img);
    int r;

    if (!img)
        return -ENOMEM;
    if ((r = vmdk_header_decode(sector0, &img->h, err)) < 0)
        goto fail;
    img->file_size = file_size;
    img->grain_bytes = vmdk_header_grain_bytes(&img->h);
    img->capacity = img->h.capacity * VMDK_SECTOR;
    img->ngrains = vmdk_header_grains(&img->h);
    img->ngts = vmdk_header_gts(&img->h);
    if (img->ngrains > VMDK_IMAGE_MAX_GRAINS) {
        r = nbdf_errf(err, -EFBIG, "%" PRIu64 " grains: more than the "
                      "random-access parser holds (%u)", img->ngrains,
                      VMDK_IMAGE_MAX_GRAINS);
        goto fail;
    }
    if (img->ngts > GD_MAX_ENTRIES) {
        r = nbdf_errf(err, -EFBIG, "grain directory of %" PRIu64 " entries "
                      "(limit %u)", img->ngts, GD_MAX_ENTRIES);
        goto fail;
    }
    if (img->h.desc_offset + img->h.desc_size > file_size / VMDK_SECTOR) {
        r = nbdf_errf(err, -EINVAL, "descriptor is not inside the file");
        goto fail;
    }
    img->gd = calloc(img->ngts ? img->ngts : 1, 4);
    img->gte = calloc(img->ngrains, 4);
    if (!img->gd || !img->gte) {
        r = -ENOMEM;
        goto fail;
    }
    img->want = W_DESC;
    *out = img;
    return 0;
fail:
    vmdk_image_free(img);
    return r;
}

int vmdk_image_next(const struct vmdk_image *img, uint64_t *off, size_t *len)
{
    switch (img->want) {
    case W_DESC:
        *off = img->h.desc_offset * VMDK_SECTOR;
        *len = (size_t) (img->h.desc_size * VMDK_SECTOR);
        return 1;
    case W_FOOTER:
        *off = img->file_size - 3 * VMDK_SECTOR;
        *len = 3 * VMDK_SECTOR;
        return 1;
    case W_GD:
        *off = img->h.gd_offset * VMDK_SECTOR;
        *len = (size_t) (img->ngts * 4);
        return 1;
    case W_GT:
        *off = (uint64_t) img->gd[img->gt_next] * VMDK_SECTOR;
        *len = (size_t) img->h.gtes_per_gt * 4;
        return 1;
    case W_DONE:
        return 0;
    }
    return -EINVAL;
}

static int supply_footer(struct vmdk_image *img, const uint8_t *buf,
                         struct nbdf_err *err)
{
    struct vmdk_marker_disk fm, eos;
    struct vmdk_header f;

    memcpy(&fm, buf, sizeof fm);
    memcpy(&eos, buf + 2 * VMDK_SECTOR, sizeof eos);
    if (le32toh(fm.size) != 0 || le32toh(fm.type) != VMDK_MARKER_FOOTER ||
        le64toh(eos.lba) != 0 || le32toh(eos.size) != 0 ||
        le32toh(eos.type) != VMDK_MARKER_EOS)
        return nbdf_errf(err, -EINVAL, "GD_AT_END, but the file does not end "
                         "with footer marker, footer and end-of-stream marker");
    int r = vmdk_header_decode(buf + VMDK_SECTOR, &f, err);
    if (r < 0)
        return r;
    if (f.capacity != img->h.capacity || f.grain_size != img->h.grain_size ||
        f.gtes_per_gt != img->h.gtes_per_gt || f.gd_offset == VMDK_GD_AT_END)
        return nbdf_errf(err, -EINVAL, "footer does not match the header or "
                         "has no grain directory offset");
    img->h = f;
    return 0;
}

static int supply_gt(struct vmdk_image *img, const uint8_t *buf,
                     struct nbdf_err *err)
{
    bool stream = img->h.flags & VMDK_FLAG_MARKERS;
    uint64_t base = img->gt_next * img->h.gtes_per_gt;

    for (uint32_t j = 0; j < img->h.gtes_per_gt; j++) {
        uint32_t v;
        memcpy(&v, buf + (size_t) j * 4, 4);
        v = le32toh(v);
        if (base + j >= img->ngrains || v == 0 ||
            (v == 1 && (img->h.flags & VMDK_FLAG_ZERO_GTE)))
            goto keep;
        uint64_t at = (uint64_t) v * VMDK_SECTOR;
        uint64_t need = stream ? VMDK_GRAIN_MARKER_SIZE : img->grain_bytes;
        if (v < img->h.overhead || at > img->file_size ||
            need > img->file_size - at)
            return nbdf_errf(err, -EINVAL, "grain %" PRIu64 " at sector %"
                             PRIu32 " is %s", base + j, v,
                             v < img->h.overhead ? "inside the overhead"
                                                 : "past the end of the file");
keep:
        if (base + j < img->ngrains)
            img->gte[base + j] = v;
    }
    img->gt_next++;
    next_gt(img);
    return 0;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *) a, y = *(const uint32_t *) b;
    return x < y ? -1 : x > y;
}

/* monolithicSparse: no two grains overlap. */
static int check_overlaps(struct vmdk_image *img, struct nbdf_err *err)
{
    uint32_t *s = malloc(img->ngrains * 4);
    uint64_t n = 0;
    int r = 0;

    if (!s)
        return -ENOMEM;
    for (uint64_t i = 0; i < img->ngrains; i++)
        if (img->gte[i] > 1 || (img->gte[i] == 1 &&
                                !(img->h.flags & VMDK_FLAG_ZERO_GTE)))
            s[n++] = img->gte[i];
    if (n)
        qsort(s, n, 4, cmp_u32);
    for (uint64_t i = 1; i < n && r == 0; i++)
        if ((uint64_t) s[i] * VMDK_SECTOR <
            (uint64_t) s[i - 1] * VMDK_SECTOR + img->grain_bytes)
            r = nbdf_errf(err, -EINVAL, "grains at sectors %" PRIu32 " and %"
                          PRIu32 " overlap", s[i - 1], s[i]);
    free(s);
    return r;
}

int vmdk_image_supply(struct vmdk_image *img, const void *buf,
                      struct nbdf_err *err)
{
    struct vmdk_desc d;
    int r = 0;

    switch (img->want) {
    case W_DESC:
        if ((r = vmdk_desc_parse(buf, (size_t) (img->h.desc_size * VMDK_SECTOR),
                                 &img->h, &d, err)) < 0)
            return r;
        if (img->h.gd_offset == VMDK_GD_AT_END) {
            if (img->file_size < 3 * VMDK_SECTOR)
                return nbdf_errf(err, -EINVAL, "GD_AT_END in a file too "
                                 "short for a footer");
            img->want = W_FOOTER;
            return 0;
        }
        img->want = W_GD;
        return check_gd_room(img, err);
    case W_FOOTER:
        if ((r = supply_footer(img, buf, err)) < 0)
            return r;
        img->want = W_GD;
        return check_gd_room(img, err);
    case W_GD:
        memcpy(img->gd, buf, (size_t) (img->ngts * 4));
        for (uint64_t i = 0; i < img->ngts; i++) {
            img->gd[i] = le32toh(img->gd[i]);
            uint64_t at = (uint64_t) img->gd[i] * VMDK_SECTOR;
            if (img->gd[i] && (at > img->file_size ||
                               (uint64_t) img->h.gtes_per_gt * 4 >
                               img->file_size - at))
                return nbdf_errf(err, -EINVAL, "grain table %" PRIu64 " at "
                                 "sector %" PRIu32 " is past the end of the "
                                 "file", i, img->gd[i]);
        }
        next_gt(img);
        break;
    case W_GT:
        if ((r = supply_gt(img, buf, err)) < 0)
            return r;
        break;
    case W_DONE:
        return -EINVAL;
    }
    if (img->want == W_DONE && !(img->h.flags & VMDK_FLAG_MARKERS))
        return check_overlaps(img, err);
    return 0;
}

int vmdk_image_lookup(const struct vmdk_image *img, uint64_t disk_off,
                      struct vmdk_place *out)
{
    if (img->want != W_DONE || disk_off >= img->capacity)
        return -EINVAL;
    uint64_t g = disk_off / img->grain_bytes;
    uint64_t end = (g + 1) * img->grain_bytes;
    uint32_t v = img->gte[g];
    out->len = (end < img->capacity ? end : img->capacity) - disk_off;
    if (v == 0 || (v == 1 && (img->h.flags & VMDK_FLAG_ZERO_GTE))) {
        out->src = VMDK_SRC_ZERO;
        out->file_off = 0;
    } else if (img->h.flags & VMDK_FLAG_MARKERS) {
        out->src = VMDK_SRC_MARKER;
        out->file_off = (uint64_t) v * VMDK_SECTOR;
    } else {
        out->src = VMDK_SRC_FILE;
        out->file_off = (uint64_t) v * VMDK_SECTOR + disk_off % img->grain_bytes;
    }
    return 0;
}
