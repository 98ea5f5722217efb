/* vhd/image.c: parse a whole VHD file from pieces the caller reads, then
 * answer "where does virtual byte x live".  No I/O here. */
#include <stdlib.h>

#include "vhd/vhd-internal.h"

enum img_state {
    IMG_COPY,                           /* footer copy at 0 */
    IMG_HEADER,
    IMG_BAT,
    IMG_BATMAP_HDR,                     /* the sector after the BAT */
    IMG_BATMAP,
    IMG_LOCATOR,                        /* loc_i */
    IMG_DONE,
    IMG_FAILED,
};

struct vhd_image {
    enum img_state state;
    uint64_t file_size;
    uint64_t footer_off;                /* file_size - 512 */
    uint8_t footer_raw[512];
    struct vhd_footer f;
    struct vhd_header h;
    struct vhd_layout l;
    uint32_t *bat;                      /* owned; host order, l.nblocks */
    struct vhd_extent *sorted;          /* owned; used entries by offset */
    uint32_t nused;
    bool has_batmap;
    uint64_t batmap_hdr_off, batmap_off;
    uint32_t batmap_sectors, batmap_version, batmap_csum;
    int loc_i;
    uint8_t *loc_payload[8];            /* owned */
    size_t loc_len[8];
    uint64_t req_off;                   /* current request */
    size_t req_len;
};

static int fail(struct vhd_image *img, int r)
{
    img->state = IMG_FAILED;
    return r;
}

/* ---- construction ------------------------------------------------------------ */

static int image_check_file_size(const struct vhd_image *img,
                                 struct nbdf_err *err)
{
    if (img->file_size < VHD_FOOTER_SIZE)
        return nbdf_errf(err, -EINVAL, "file of %llu bytes is shorter than a "
                         "footer", (unsigned long long) img->file_size);
    if (img->file_size % VHD_SECTOR)
        return nbdf_errf(err, -EINVAL, "file length %llu is not a multiple "
                         "of 512", (unsigned long long) img->file_size);
    return 0;
}

static int image_check_fixed(const struct vhd_image *img, struct nbdf_err *err)
{
    if (img->footer_off < img->f.current_size)
        return nbdf_errf(err, -EINVAL,
                         "fixed disk: file holds %llu bytes before the footer "
                         "but current size is %llu",
                         (unsigned long long) img->footer_off,
                         (unsigned long long) img->f.current_size);
    return 0;
}

static int image_check_header_pos(const struct vhd_image *img,
                                  struct nbdf_err *err)
{
    if (img->f.data_offset + VHD_HEADER_SIZE > img->footer_off)
        return nbdf_errf(err, -EINVAL,
                         "dynamic header at %llu does not fit before the "
                         "trailing footer at %llu",
                         (unsigned long long) img->f.data_offset,
                         (unsigned long long) img->footer_off);
    return 0;
}

int vhd_image_new(const void *footer, uint64_t file_size,
                  struct vhd_image **out, struct nbdf_err *err)
{
    struct vhd_image *img = calloc(1, sizeof *img);
    if (!img)
        return nbdf_errf(err, -ENOMEM, "out of memory");
    img->file_size = file_size;
    memcpy(img->footer_raw, footer, 512);
    int r = image_check_file_size(img, err);
    if (r == 0) {
        img->footer_off = file_size - VHD_FOOTER_SIZE;
        r = vhd_footer_decode(footer, &img->f, err);
    }
    if (r == 0 && img->f.disk_type == VHD_FIXED) {
        r = image_check_fixed(img, err);
        img->state = IMG_DONE;
    } else if (r == 0) {
        r = image_check_header_pos(img, err);
        img->state = IMG_COPY;
    }
    if (r < 0) {
        vhd_image_free(img);
        return r;
    }
    *out = img;
    return 0;
}

void vhd_image_free(struct vhd_image *img)
{
    if (!img)
        return;
    free(img->bat);
    free(img->sorted);
    for (int i = 0; i < 8; i++)
        free(img->loc_payload[i]);
    free(img);
}

/* ---- the request sequence --------------------------------------------------- */

static void request(struct vhd_image *img, enum img_state st, uint64_t off,
                    size_t len)
{
    img->state = st;
    img->req_off = off;
    img->req_len = len;
}

int vhd_image_next(const struct vhd_image *img, uint64_t *off, size_t *len)
{
    switch (img->state) {
    case IMG_DONE:
        return 0;
    case IMG_FAILED:
        return -EINVAL;
    case IMG_COPY:
        *off = 0;
        *len = VHD_FOOTER_SIZE;
        return 1;
    default:
        *off = img->req_off;
        *len = img->req_len;
        return 1;
    }
}

static int finish_parse(struct vhd_image *img, struct nbdf_err *err);

/* Next locator with a payload, or the final checks. */
static int next_locator(struct vhd_image *img, int from, struct nbdf_err *err)
{
    for (int i = from; img->f.disk_type == VHD_DIFF && i < 8; i++) {
        const struct vhd_locator *l = &img->h.loc[i];
        if (l->code == VHD_PLAT_NONE)
            continue;
        if (l->data_offset + l->space_bytes > img->footer_off)
            return nbdf_errf(err, -EINVAL,
                             "parent locator %d [%llu, +%llu) extends past the "
                             "trailing footer", i,
                             (unsigned long long) l->data_offset,
                             (unsigned long long) l->space_bytes);
        img->loc_i = i;
        request(img, IMG_LOCATOR, l->data_offset, l->data_length);
        return 0;
    }
    return finish_parse(img, err);
}

static int supply_copy(struct vhd_image *img, const void *buf,
                       struct nbdf_err *err)
{
    if (memcmp(buf, img->footer_raw, VHD_FOOTER_SIZE) != 0) {
        struct vhd_footer copy;
        struct nbdf_err e2;
        if (vhd_footer_decode(buf, &copy, &e2) < 0)
            return nbdf_errf(err, -EINVAL, "footer copy at offset 0 is "
                             "invalid: %s", e2.msg);
        return nbdf_errf(err, -EINVAL, "footer copy at offset 0 differs from "
                         "the trailing footer");
    }
    request(img, IMG_HEADER, img->f.data_offset, VHD_HEADER_SIZE);
    return 0;
}

static int supply_header(struct vhd_image *img, const void *buf,
                         struct nbdf_err *err)
{
    int r = vhd_header_decode(buf, &img->h, err);
    if (r == 0)
        r = vhd_header_check(&img->f, &img->h, err);
    if (r < 0)
        return r;
    vhd_layout_from(&img->f, &img->h, &img->l);
    if (img->l.bat_off + img->l.bat_bytes > img->footer_off)
        return nbdf_errf(err, -EINVAL,
                         "BAT [%llu, +%llu) extends past the trailing footer "
                         "at %llu", (unsigned long long) img->l.bat_off,
                         (unsigned long long) img->l.bat_bytes,
                         (unsigned long long) img->footer_off);
    img->bat = malloc(((size_t) img->l.nblocks + 1) * 4);
    if (!img->bat)
        return nbdf_errf(err, -ENOMEM, "out of memory for %u BAT entries",
                         img->l.nblocks);
    request(img, IMG_BAT, img->l.bat_off, (size_t) img->l.nblocks * 4);
    return 0;
}

static int blocks_inside_file(const struct vhd_image *img, struct nbdf_err *err)
{
    if (img->nused == 0)
        return 0;
    const struct vhd_extent *last = &img->sorted[img->nused - 1];
    if (last->off + last->len > img->footer_off)
        return nbdf_errf(err, -EINVAL,
                         "BAT entry %u: block [%llu, +%llu) extends past the "
                         "trailing footer at %llu", last->block,
                         (unsigned long long) last->off,
                         (unsigned long long) last->len,
                         (unsigned long long) img->footer_off);
    return 0;
}

static int supply_bat(struct vhd_image *img, const void *buf,
                      struct nbdf_err *err)
{
    const uint8_t *b = buf;
    for (uint32_t i = 0; i < img->l.nblocks; i++) {
        uint32_t v;
        memcpy(&v, b + 4ull * i, 4);
        img->bat[i] = be32toh(v);
    }
    int r = vhd_bat_sort_check(&img->l, img->bat, &img->sorted, &img->nused,
                               err);
    if (r == 0)
        r = blocks_inside_file(img, err);
    if (r < 0)
        return r;
    /* blktap puts its batmap in the sector after the BAT; peek at it. */
    uint64_t off = img->l.bat_off + img->l.bat_bytes;
    bool room = off + VHD_SECTOR <= img->footer_off &&
                (img->nused == 0 || off + VHD_SECTOR <= img->sorted[0].off);
    if (room) {
        request(img, IMG_BATMAP_HDR, off, VHD_SECTOR);
        return 0;
    }
    return next_locator(img, 0, err);
}

static int batmap_header_check(struct vhd_image *img,
                               const struct vhd_batmap_disk *d,
                               struct nbdf_err *err)
{
    img->batmap_off = be64toh(d->map_offset);
    img->batmap_sectors = be32toh(d->map_sectors);
    img->batmap_version = be32toh(d->version);
    img->batmap_csum = be32toh(d->checksum);
    if (img->batmap_version >> 16 != 1 ||
        (img->batmap_version & 0xFFFF) > 2)
        return nbdf_errf(err, -EINVAL, "batmap version 0x%08x is not <= 1.2",
                         img->batmap_version);
    uint64_t need = (img->l.nblocks + 8ull * VHD_SECTOR - 1) /
                    (8ull * VHD_SECTOR);
    if (img->batmap_sectors < need || img->batmap_sectors > need + 4096)
        return nbdf_errf(err, -EINVAL, "batmap of %u sectors does not fit "
                         "%u blocks", img->batmap_sectors, img->l.nblocks);
    uint64_t bytes = (uint64_t) img->batmap_sectors * VHD_SECTOR;
    if (img->batmap_off % VHD_SECTOR || img->batmap_off < VHD_SECTOR ||
        img->batmap_off >= img->footer_off ||
        bytes > img->footer_off - img->batmap_off)
        return nbdf_errf(err, -EINVAL, "batmap at %llu (+%llu) is misaligned "
                         "or outside the file",
                         (unsigned long long) img->batmap_off,
                         (unsigned long long) bytes);
    return 0;
}

static int supply_batmap_hdr(struct vhd_image *img, const void *buf,
                             struct nbdf_err *err)
{
    const struct vhd_batmap_disk *d = buf;
    /* vhd-tool's optional batmap has no cookie: opaque, like padding. */
    if (memcmp(d->cookie, VHD_COOKIE_BATMAP, 8) != 0)
        return next_locator(img, 0, err);
    img->batmap_hdr_off = img->req_off;
    int r = batmap_header_check(img, d, err);
    if (r < 0)
        return r;
    request(img, IMG_BATMAP, img->batmap_off,
            (size_t) img->batmap_sectors * VHD_SECTOR);
    return 0;
}

/* blktap 1.2: complement of the unsigned byte sum; 1.1 summed signed chars. */
static uint32_t batmap_sum(const uint8_t *b, size_t n, uint32_t version)
{
    uint32_t sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += version < VHD_BATMAP_VERSION ? (uint32_t) (int8_t) b[i] : b[i];
    return ~sum;
}

static int supply_batmap(struct vhd_image *img, const void *buf,
                         struct nbdf_err *err)
{
    uint32_t sum = batmap_sum(buf, img->req_len, img->batmap_version);
    if (sum != img->batmap_csum)
        return nbdf_errf(err, -EINVAL, "batmap checksum mismatch: stored "
                         "0x%08x, computed 0x%08x", img->batmap_csum, sum);
    for (uint32_t i = 0; i < img->l.nblocks; i++)
        if (vhd_bitmap_test(buf, i) && img->bat[i] == VHD_BAT_UNUSED)
            return nbdf_errf(err, -EINVAL, "batmap marks block %u full but "
                             "its BAT entry is unallocated", i);
    img->has_batmap = true;
    return next_locator(img, 0, err);
}

static int supply_locator(struct vhd_image *img, const void *buf,
                          struct nbdf_err *err)
{
    int i = img->loc_i;
    img->loc_payload[i] = malloc(img->req_len ? img->req_len : 1);
    if (!img->loc_payload[i])
        return nbdf_errf(err, -ENOMEM, "out of memory");
    memcpy(img->loc_payload[i], buf, img->req_len);
    img->loc_len[i] = img->req_len;
    return next_locator(img, i + 1, err);
}

/* Every extent of the file, checked against every other. */
static int finish_parse(struct vhd_image *img, struct nbdf_err *err)
{
    struct vhd_extent meta[16];
    size_t n = 0;
    meta[n++] = (struct vhd_extent) { 0, VHD_FOOTER_SIZE, 0, "footer copy" };
    meta[n++] = (struct vhd_extent) { img->l.header_off, VHD_HEADER_SIZE, 0,
                                      "dynamic header" };
    meta[n++] = (struct vhd_extent) { img->l.bat_off, img->l.bat_bytes, 0,
                                      "BAT" };
    meta[n++] = (struct vhd_extent) { img->footer_off, VHD_FOOTER_SIZE, 0,
                                      "trailing footer" };
    if (img->has_batmap) {
        meta[n++] = (struct vhd_extent) { img->batmap_hdr_off, VHD_SECTOR, 0,
                                          "batmap header" };
        meta[n++] = (struct vhd_extent) {
            img->batmap_off, (uint64_t) img->batmap_sectors * VHD_SECTOR, 0,
            "batmap" };
    }
    n += vhd_locator_extents(&img->h, meta + n);
    int r = vhd_extents_check(meta, n, img->sorted, img->nused,
                              img->l.bitmap_bytes, err);
    if (r < 0)
        return r;
    img->state = IMG_DONE;
    return 0;
}

int vhd_image_supply(struct vhd_image *img, const void *buf,
                     struct nbdf_err *err)
{
    int r;
    switch (img->state) {
    case IMG_COPY:       r = supply_copy(img, buf, err); break;
    case IMG_HEADER:     r = supply_header(img, buf, err); break;
    case IMG_BAT:        r = supply_bat(img, buf, err); break;
    case IMG_BATMAP_HDR: r = supply_batmap_hdr(img, buf, err); break;
    case IMG_BATMAP:     r = supply_batmap(img, buf, err); break;
    case IMG_LOCATOR:    r = supply_locator(img, buf, err); break;
    case IMG_DONE:
        return nbdf_errf(err, -EINVAL, "image already complete");
    default:
        return nbdf_errf(err, -EINVAL, "image failed earlier");
    }
    return r < 0 ? fail(img, r) : 0;
}

/* ---- accessors ----------------------------------------------------------------- */

enum vhd_kind vhd_image_kind(const struct vhd_image *img)
{
    return img->f.disk_type;
}

const struct vhd_footer *vhd_image_footer(const struct vhd_image *img)
{
    return &img->f;
}

const struct vhd_header *vhd_image_header(const struct vhd_image *img)
{
    return img->f.disk_type == VHD_FIXED ? NULL : &img->h;
}

uint64_t vhd_image_size(const struct vhd_image *img)
{
    return img->f.current_size;
}

uint32_t vhd_image_block_size(const struct vhd_image *img)
{
    return img->l.block_size;
}

uint32_t vhd_image_bitmap_bytes(const struct vhd_image *img)
{
    return img->l.bitmap_bytes;
}

uint32_t vhd_image_blocks(const struct vhd_image *img)
{
    return img->l.nblocks;
}

uint32_t vhd_image_allocated(const struct vhd_image *img)
{
    return img->nused;
}

uint64_t vhd_image_block_offset(const struct vhd_image *img, uint32_t i)
{
    if (!img->bat || img->state != IMG_DONE || i >= img->l.nblocks ||
        img->bat[i] == VHD_BAT_UNUSED)
        return VHD_NO_BLOCK;
    return (uint64_t) img->bat[i] * VHD_SECTOR;
}

bool vhd_image_has_batmap(const struct vhd_image *img, uint64_t *off)
{
    if (img->has_batmap && off)
        *off = img->batmap_off;
    return img->has_batmap;
}

const uint8_t *vhd_image_locator_payload(const struct vhd_image *img, int i,
                                         size_t *len)
{
    if (i < 0 || i >= 8 || !img->loc_payload[i])
        return NULL;
    *len = img->loc_len[i];
    return img->loc_payload[i];
}

int vhd_image_check_parent(const struct vhd_image *child,
                           const struct vhd_image *parent,
                           struct nbdf_err *err)
{
    if (child->f.disk_type != VHD_DIFF)
        return nbdf_errf(err, -EINVAL, "not a differencing disk");
    if (memcmp(child->h.parent_uuid, parent->f.uuid, 16) != 0)
        return nbdf_errf(err, -EINVAL, "parent unique id does not match the "
                         "child's parent id");
    return 0;
}

/* ---- lookup --------------------------------------------------------------------- */

/* Bytes from disk_off (inside block bi) whose bitmap bit equals 'bit'. */
static uint64_t bit_run(const struct vhd_image *img, const uint8_t *bm,
                        uint64_t disk_off, uint64_t blk_start, uint64_t blk_end,
                        bool bit)
{
    uint32_t j = (disk_off - blk_start) / VHD_SECTOR;
    uint32_t last = (blk_end - blk_start + VHD_SECTOR - 1) / VHD_SECTOR;
    while (j + 1 < last && vhd_bitmap_test(bm, j + 1) == bit)
        j++;
    return MIN(blk_start + (uint64_t) (j + 1) * VHD_SECTOR, blk_end) -
           disk_off;
}

int vhd_image_lookup(const struct vhd_image *img, uint64_t disk_off,
                     const void *bitmap, struct vhd_place *out)
{
    if (img->state != IMG_DONE || disk_off >= img->f.current_size)
        return -EINVAL;
    if (img->f.disk_type == VHD_FIXED) {
        *out = (struct vhd_place) { VHD_SRC_FILE, disk_off,
                                    img->f.current_size - disk_off };
        return 0;
    }
    uint32_t bi = disk_off / img->l.block_size;
    uint64_t blk_start = (uint64_t) bi * img->l.block_size;
    uint64_t blk_end = MIN(blk_start + img->l.block_size, img->f.current_size);
    enum vhd_source absent = img->f.disk_type == VHD_DIFF ? VHD_SRC_PARENT
                                                          : VHD_SRC_ZERO;
    uint32_t e = img->bat[bi];
    if (e == VHD_BAT_UNUSED) {
        *out = (struct vhd_place) { absent, 0, blk_end - disk_off };
        return 0;
    }
    uint64_t bm_off = (uint64_t) e * VHD_SECTOR;
    if (!bitmap) {
        *out = (struct vhd_place) { VHD_SRC_BITMAP, bm_off, img->l.bitmap_bytes };
        return 0;
    }
    bool bit = vhd_bitmap_test(bitmap, (disk_off - blk_start) / VHD_SECTOR);
    uint64_t len = bit_run(img, bitmap, disk_off, blk_start, blk_end, bit);
    if (bit)
        *out = (struct vhd_place) {
            VHD_SRC_FILE, bm_off + img->l.bitmap_bytes + (disk_off - blk_start),
            len };
    else
        *out = (struct vhd_place) { absent, 0, len };
    return 0;
}
