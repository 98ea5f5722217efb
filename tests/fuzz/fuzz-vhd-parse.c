/* tests/fuzz/fuzz-vhd-parse.c: libFuzzer target for the footer/header
 * codecs, the image parser, lookups and the string decoders.
 * Input: a whole VHD file; it is parsed as is and again with its
 * checksums recomputed (fuzz-vhd-fixup.h) so mutations reach the BAT,
 * batmap, locator and overlap rules.  Build: -DFUZZ=ON with clang (see
 * docs/design/format-vhd.md). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vhd/vhd.h"
#include "fuzz-vhd-fixup.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void strings(const struct vhd_image *img)
{
    const struct vhd_header *h = vhd_image_header(img);
    char out[1024];
    if (!h)
        return;
    vhd_parent_name(h, out, sizeof out);
    for (int i = 0; i < 8; i++) {
        size_t len;
        const uint8_t *p = vhd_image_locator_payload(img, i, &len);
        if (p)
            vhd_locator_path(&h->loc[i], p, len, out, sizeof out, NULL);
    }
}

/* Walk the start of the disk through lookups, reading bitmaps from data;
 * every placement must lie inside the file and advance. */
static void walk(const struct vhd_image *img, const uint8_t *data, size_t size)
{
    uint64_t off = 0, vsize = vhd_image_size(img);
    for (int steps = 0; off < vsize && steps < 4096; steps++) {
        struct vhd_place p;
        if (vhd_image_lookup(img, off, NULL, &p) < 0)
            abort();
        if (p.src == VHD_SRC_BITMAP) {
            if (p.file_off + p.len > size)
                abort();
            if (vhd_image_lookup(img, off, data + p.file_off, &p) < 0)
                abort();
        }
        if (p.len == 0 || off + p.len > vsize)
            abort();
        if (p.src == VHD_SRC_FILE && p.file_off + p.len > size)
            abort();
        off += p.len;
    }
}

static void parse_one(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    parse_one(data, size);
    uint8_t *copy = size >= 1024 ? malloc(size) : NULL;
    if (copy) {
        memcpy(copy, data, size);
        fixup_vhd(copy, size);
        parse_one(copy, size);
        free(copy);
    }
    return 0;
}

static void parse_one(const uint8_t *data, size_t size)
{
    struct nbdf_err err;
    struct vhd_footer f;
    struct vhd_header h;
    if (size >= 512 && vhd_footer_decode(data, &f, &err) == 0) {
        vhd_lint(&f, NULL, NULL, NULL);
        vhd_qemu_size(&f);
        if (size >= 1536 && vhd_header_decode(data + 512, &h, &err) == 0)
            vhd_header_check(&f, &h, &err);
    }
    if (size < 512)
        return;
    struct vhd_image *img;
    if (vhd_image_new(data + size - 512, size, &img, &err) < 0)
        return;
    uint64_t off;
    size_t len;
    int r;
    while ((r = vhd_image_next(img, &off, &len)) > 0) {
        if (off > size || len > size - off)
            abort();                    /* asked for bytes outside the file */
        if (vhd_image_supply(img, data + off, &err) < 0)
            break;
    }
    if (r == 0) {
        vhd_lint(vhd_image_footer(img), vhd_image_header(img), NULL, NULL);
        strings(img);
        walk(img, data, size);
        for (uint32_t i = 0; i < vhd_image_blocks(img) && i < 64; i++)
            vhd_image_block_offset(img, i);
    }
    vhd_image_free(img);
}
