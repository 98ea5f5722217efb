/* vhd/vhd-internal.h: private to vhd/.  Other modules include vhd/vhd.h. */
#ifndef NBDFERRY_VHD_INTERNAL_H
#define NBDFERRY_VHD_INTERNAL_H

#include <endian.h>
#include <errno.h>
#include <stdarg.h>
#include <string.h>

#include "common/iszero.h"
#include "common/minmax.h"
#include "common/rounding.h"
#include "vhd/vhd.h"

/* ---- on-disk layout (big-endian, converted once in format.c) ------------- */

struct vhd_footer_disk {                /* exactly one sector */
    char     cookie[8];                 /* "conectix" */
    uint32_t features;                  /* bit 1 reserved, always set */
    uint32_t version;                   /* 0x00010000 */
    uint64_t data_offset;               /* fixed: all-ones */
    uint32_t timestamp;
    char     creator_app[4];
    uint32_t creator_version;
    uint32_t creator_os;
    uint64_t original_size;
    uint64_t current_size;
    uint16_t cylinders;
    uint8_t  heads;
    uint8_t  sectors;
    uint32_t disk_type;
    uint32_t checksum;
    uint8_t  uuid[16];
    uint8_t  saved_state;
    uint8_t  hidden;                    /* blktap private */
    uint8_t  reserved[426];
} __attribute__((packed));
_Static_assert(sizeof(struct vhd_footer_disk) == 512, "VHD footer is one sector");

struct vhd_locator_disk {
    uint32_t code;
    uint32_t data_space;
    uint32_t data_length;
    uint32_t reserved;
    uint64_t data_offset;
} __attribute__((packed));
_Static_assert(sizeof(struct vhd_locator_disk) == 24, "locator entry");

struct vhd_header_disk {                /* two sectors */
    char     cookie[8];                 /* "cxsparse" */
    uint64_t data_offset;               /* all-ones */
    uint64_t table_offset;
    uint32_t version;                   /* 0x00010000 */
    uint32_t max_entries;
    uint32_t block_size;
    uint32_t checksum;
    uint8_t  parent_uuid[16];
    uint32_t parent_timestamp;
    uint32_t reserved1;
    uint8_t  parent_name[512];          /* UTF-16BE */
    struct vhd_locator_disk loc[8];
    uint8_t  reserved2[256];
} __attribute__((packed));
_Static_assert(sizeof(struct vhd_header_disk) == 1024, "VHD header is 1024 bytes");
_Static_assert(__builtin_offsetof(struct vhd_header_disk, loc) == 576, "locators at 576");

struct vhd_batmap_disk {                /* blktap, one sector after the BAT */
    char     cookie[8];                 /* "tdbatmap" */
    uint64_t map_offset;
    uint32_t map_sectors;
    uint32_t version;                   /* 0x00010002 */
    uint32_t checksum;
    uint8_t  marker;
    uint8_t  keyhash[65];
    uint8_t  reserved[418];
} __attribute__((packed));
_Static_assert(sizeof(struct vhd_batmap_disk) == 512, "batmap header is one sector");

#define VHD_COOKIE_FOOTER  "conectix"
#define VHD_COOKIE_POISON  "v_poison"
#define VHD_COOKIE_HEADER  "cxsparse"
#define VHD_COOKIE_BATMAP  "tdbatmap"
#define VHD_FOOTER_CSUM_OFF 64
#define VHD_HEADER_CSUM_OFF 36
#define VHD_VERSION        0x00010000u
#define VHD_BATMAP_VERSION 0x00010002u
#define VHD_FEATURE_RESERVED 0x2u

/* ---- helpers --------------------------------------------------------------- */

static inline bool vhd_ranges_overlap(uint64_t a, uint64_t alen,
                                      uint64_t b, uint64_t blen)
{
    return alen && blen && a < b + blen && b < a + alen;
}

/* ---- layout derived from footer + header ------------------------------ */

struct vhd_layout {
    uint64_t size;                      /* current_size */
    uint32_t block_size;
    uint32_t spb;                       /* sectors per block */
    uint32_t bitmap_bytes;              /* padded to 512 */
    uint32_t nblocks;                   /* entries needed */
    uint64_t header_off;
    uint64_t bat_off;
    uint64_t bat_bytes;                 /* on disk, padded to 512 */
    uint64_t meta_end;                  /* end of footer copy, header, BAT */
};

/* format.c */
void vhd_layout_from(const struct vhd_footer *f, const struct vhd_header *h,
                     struct vhd_layout *l);
bool vhd_footer_is_tap_legacy(const struct vhd_footer *f);

/* image.c / stream.c: the shared BAT checks. */
struct vhd_extent {
    uint64_t off, len;
    uint32_t block;                     /* BAT index, or one of: */
    const char *what;                   /* non-NULL: named metadata */
};
/* Sort blocks by file offset and check: every used entry starts at or
 * after meta_end, does not overflow 32-bit sectors, and no two overlap.
 * bat: host-order entries [0, l->nblocks).  *sorted (owned by the caller,
 * free()) receives the used entries in file order; *nused their count. */
int vhd_bat_sort_check(const struct vhd_layout *l, const uint32_t *bat,
                       struct vhd_extent **sorted, uint32_t *nused,
                       struct nbdf_err *err);
/* Check that the named extents (locators etc.) overlap neither each other
 * nor the sorted blocks. */
int vhd_extents_check(const struct vhd_extent *meta, size_t nmeta,
                      const struct vhd_extent *blocks, uint32_t nblocks,
                      uint32_t bitmap_bytes, struct nbdf_err *err);
/* The same checks in the stream decoder's memory budget (4 bytes per used
 * entry, no extent copies): *order (caller frees) receives the used BAT
 * indices in file order; meta (footer copy, header, BAT, locators) must
 * overlap neither each other nor any block. */
int vhd_bat_order(const struct vhd_layout *l, const uint32_t *bat,
                  const struct vhd_extent *meta, size_t nmeta,
                  uint32_t **order, uint32_t *nused, struct nbdf_err *err);
/* Locator extents of h that occupy file space (code != 0). */
size_t vhd_locator_extents(const struct vhd_header *h, struct vhd_extent *out);

#endif /* NBDFERRY_VHD_INTERNAL_H */
