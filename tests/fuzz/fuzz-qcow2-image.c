/* tests/fuzz/fuzz-qcow2-image.c: libFuzzer target for the qcow2
 * random-access image reader (qcow2_image_*).
 *
 * Input: a qcow2 file.  The reader is given the pieces it asks for, then
 * disk offsets are looked up (every place of a disk up to 4 MiB, 64
 * spread over a larger one), each L2 table supplied from the input when
 * asked, each compressed cluster decompressed.  Oracles:
 *   - every request, L2 table, data range and compressed range lies
 *     inside the file (the reader checked the file size, not the caller);
 *   - a place is never empty and never runs past the disk; a lookup
 *     given the L2 table it named never asks for a table again;
 *   - every refusal names its rule (a non-empty message).
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qcow2/qcow2.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define WALK_MAX (4u << 20)

static struct qcow2_decompressor *dz;
static uint8_t *cluster;                  /* 2 MiB: the largest cluster */

static bool inside(uint64_t off, uint64_t len, size_t size)
{
    return off <= size && len <= size - off;
}

/* The place of disk byte d; -1 if the image refused it. */
static int place(const struct qcow2_image *img, const uint8_t *data,
                 size_t size, uint64_t d, uint64_t disk,
                 struct qcow2_place *p)
{
    struct nbdf_err e = { "" };

    if (qcow2_image_lookup(img, d, NULL, 0, p, &e) < 0)
        return e.msg[0] ? -1 : (abort(), -1);
    if (p->src == QCOW2_SRC_L2) {
        uint64_t at = p->file_off;
        if (!inside(at, p->len, size))
            abort();
        if (qcow2_image_lookup(img, d, data + at, at, p, &e) < 0)
            return e.msg[0] ? -1 : (abort(), -1);
        if (p->src == QCOW2_SRC_L2)
            abort();
    }
    if (p->len == 0 || p->len > disk - d)
        abort();
    if (p->src == QCOW2_SRC_FILE && !inside(p->file_off, p->len, size))
        abort();
    if (p->src == QCOW2_SRC_COMPRESSED) {
        struct qcow2_compressed c;
        if (!inside(p->file_off, p->clen, size) || p->cluster > d)
            abort();
        qcow2_image_compressed(img, p, data + p->file_off, &c);
        if (c.cluster_size > (2u << 20))
            abort();
        e.msg[0] = '\0';
        if (qcow2_compressed_decode(dz, &c, cluster, &e) < 0 && !e.msg[0])
            abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct qcow2_image *img;
    struct nbdf_err e = { "" };
    uint64_t off;
    size_t n;
    int r;

    if (!dz && (qcow2_decompressor_new(&dz) < 0 ||
                !(cluster = malloc(2u << 20))))
        abort();
    if (qcow2_image_new(size, &img, &e) < 0) {
        if (!e.msg[0])
            abort();
        return 0;
    }
    while ((r = qcow2_image_next(img, &off, &n)) > 0) {
        if (!inside(off, n, size))
            abort();                    /* asked for bytes past the end */
        if ((r = qcow2_image_supply(img, data + off, &e)) < 0)
            break;
    }
    if (r < 0 && !e.msg[0])
        abort();
    if (r == 0) {
        uint64_t disk = qcow2_image_header(img)->size;
        uint64_t step = disk <= WALK_MAX ? 0 : disk / 64 + 1;
        for (uint64_t d = 0; d < disk;) {
            struct qcow2_place p;
            if (place(img, data, size, d, disk, &p) < 0)
                break;
            d = step ? d + step : d + p.len;
        }
    }
    qcow2_image_free(img);
    return 0;
}
