/* vmdk/vmdk-internal.h: private to vmdk/.  Other modules include vmdk/vmdk.h. */
#ifndef NBDFERRY_VMDK_INTERNAL_H
#define NBDFERRY_VMDK_INTERNAL_H

#include <endian.h>
#include <errno.h>
#include <stdarg.h>
#include <string.h>

#include "common/iszero.h"
#include "common/minmax.h"
#include "common/rounding.h"
#include "vmdk/vmdk.h"

/* ---- on-disk layout (little-endian, converted once in format.c) ---------- */

struct vmdk_header_disk {                /* sector 0 and the footer */
    uint32_t magic;                      /* "KDMV" */
    uint32_t version;
    uint32_t flags;
    uint64_t capacity;
    uint64_t grain_size;
    uint64_t desc_offset;
    uint64_t desc_size;
    uint32_t gtes_per_gt;
    uint64_t rgd_offset;
    uint64_t gd_offset;
    uint64_t overhead;
    uint8_t  unclean_shutdown;
    uint8_t  nl[4];                      /* '\n' ' ' '\r' '\n' */
    uint16_t compress;
    uint8_t  pad[433];
} __attribute__((packed));
_Static_assert(sizeof(struct vmdk_header_disk) == 512, "VMDK header is one sector");
_Static_assert(__builtin_offsetof(struct vmdk_header_disk, nl) == 73, "newline test at 73");

/* A grain marker is 12 bytes followed directly by the compressed data; a
 * metadata marker is a whole sector whose size field is 0. */
struct vmdk_marker_disk {
    uint64_t lba;                        /* grain: LBA; metadata: sectors */
    uint32_t size;                       /* grain: compressed bytes; else 0 */
    uint32_t type;                       /* metadata only */
} __attribute__((packed));
_Static_assert(sizeof(struct vmdk_marker_disk) == 16, "marker head");
#define VMDK_GRAIN_MARKER_SIZE 12u

/* ---- helpers --------------------------------------------------------------- */

static inline uint64_t vmdk_div_up(uint64_t x, uint64_t d)
{
    return x / d + (x % d != 0);
}

/* Worst case of a compressed grain: deflate's stored-block expansion plus
 * the zlib wrapper, with margin. */
static inline uint64_t vmdk_compressed_max(uint64_t grain_bytes)
{
    return grain_bytes + grain_bytes / 16 + 1024;
}

#endif /* NBDFERRY_VMDK_INTERNAL_H */
