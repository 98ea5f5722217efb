/* vmdk/synth.c: a streamOptimized VMDK of a raw disk, produced on read.
 *
 * Every grain is a zlib stream of two STORED deflate blocks (65535 + 1
 * bytes), so its size does not depend on its content and the whole layout
 * (see vmdk/vmdk.h) is known once the allocation is frozen.  The price is
 * no compression: the file is the allocated data plus 0.8%.  Only the
 * Adler-32 trailer needs the grain's bytes, so a grain is read whole and
 * cached.
 */
#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include <libdeflate.h>

#include "common/unitlist.h"
#include "vmdk/vmdk-internal.h"

#define G_SECT      VMDK_SYNTH_GRAIN_SECTORS              /* 128 */
#define G_BYTES     (G_SECT * VMDK_SECTOR)                /* 65536 */
#define GTES        512u
#define OVERHEAD    128u                                  /* sectors */
#define DESC_SECT   2u
#define ZHDR        2u                                    /* 0x78 0x01 */
#define BLK1        65535u                                /* stored block max */
#define CSIZE       (ZHDR + 5 + BLK1 + 5 + (G_BYTES - BLK1) + 4)
#define GRAIN_SECT  ((VMDK_GRAIN_MARKER_SIZE + CSIZE + VMDK_SECTOR - 1) / VMDK_SECTOR)
#define GRAIN_FILE  (GRAIN_SECT * VMDK_SECTOR)            /* 66048 */
#define GT_SECT     (GTES * 4 / VMDK_SECTOR)              /* 4 */
_Static_assert(CSIZE == 65552, "stored grain size");
_Static_assert(GRAIN_SECT == 129, "a grain takes 129 sectors");

struct vmdk_synth {
    uint64_t disk_size, capacity;         /* bytes, sectors */
    uint64_t ngrains, ngts;
    uint32_t cid;
    char name[65];
    bool sealed;
    uint32_t *alloc;                      /* allocated grains, increasing */
    uint64_t nalloc, alloc_cap;
    uint32_t *gtlist;                     /* GTs with an allocated grain */
    uint64_t *gtfirst;                    /* their first index in alloc */
    uint64_t ngtlist;
    uint8_t *gd;                          /* the directory, built at seal */
    uint64_t gd_sectors;
    /* Layout, in sectors. */
    uint64_t grains_at, gts_at, gd_marker_at, footer_marker_at, eos_at, end;
    char desc[DESC_SECT * VMDK_SECTOR];
    uint8_t *cache;                       /* GRAIN_FILE bytes */
    uint64_t cached;                      /* rank + 1 of the cached grain */
};

int vmdk_synth_new(uint64_t disk_size, uint32_t cid, const char *name,
                   struct vmdk_synth **out, struct nbdf_err *err)
{
    if (disk_size == 0)
        return nbdf_errf(err, -EINVAL, "disk size 0");
    uint64_t grains = vmdk_div_up(disk_size, G_BYTES);
    if (grains > VMDK_MAX_GRAINS)
        return nbdf_errf(err, -EFBIG, "disk of %" PRIu64 " bytes: more than "
                         "%llu grains of 64 KiB", disk_size,
                         (unsigned long long) VMDK_MAX_GRAINS);
    struct vmdk_synth *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    s->disk_size = disk_size;
    s->capacity = vmdk_div_up(disk_size, VMDK_SECTOR);
    s->ngrains = grains;
    s->ngts = vmdk_div_up(grains, GTES);
    s->cid = cid;
    snprintf(s->name, sizeof s->name, "%s", name);
    *out = s;
    return 0;
}

void vmdk_synth_free(struct vmdk_synth *s)
{
    if (!s)
        return;
    free(s->alloc);
    free(s->gtlist);
    free(s->gtfirst);
    free(s->gd);
    free(s->cache);
    free(s);
}

int vmdk_synth_allocate(struct vmdk_synth *s, uint64_t disk_off, uint64_t len)
{
    if (s->sealed)
        return -EINVAL;
    return unitlist_allocate(&s->alloc, &s->nalloc, &s->alloc_cap,
                             s->disk_size, G_BYTES, disk_off, len);
}

/* ---- layout --------------------------------------------------------------- */

static uint64_t grain_sector(const struct vmdk_synth *s, uint64_t rank)
{
    return s->grains_at + rank * GRAIN_SECT;
}

static void make_desc(struct vmdk_synth *s)
{
    uint64_t cyl = s->capacity / (16 * 63);
    if (cyl > 16383)
        cyl = 16383;
    snprintf(s->desc, sizeof s->desc,
             "# Disk DescriptorFile\n"
             "version=1\n"
             "CID=%08" PRIx32 "\n"
             "parentCID=ffffffff\n"
             "createType=\"streamOptimized\"\n"
             "\n"
             "# Extent description\n"
             "RW %" PRIu64 " SPARSE \"%s\"\n"
             "\n"
             "# The Disk Data Base\n"
             "#DDB\n"
             "\n"
             "ddb.virtualHWVersion = \"4\"\n"
             "ddb.geometry.cylinders = \"%" PRIu64 "\"\n"
             "ddb.geometry.heads = \"16\"\n"
             "ddb.geometry.sectors = \"63\"\n"
             "ddb.adapterType = \"lsilogic\"\n"
             "ddb.toolsVersion = \"2147483647\"\n",
             s->cid, s->capacity, s->name, cyl);
}

static int build_tables(struct vmdk_synth *s)
{
    s->gtlist = malloc((s->nalloc ? s->nalloc : 1) * sizeof *s->gtlist);
    s->gtfirst = malloc((s->nalloc ? s->nalloc : 1) * sizeof *s->gtfirst);
    s->gd_sectors = vmdk_div_up(s->ngts * 4, VMDK_SECTOR);
    s->gd = calloc(s->gd_sectors, VMDK_SECTOR);
    s->cache = malloc(GRAIN_FILE);
    if (!s->gtlist || !s->gtfirst || !s->gd || !s->cache)
        return -ENOMEM;
    for (uint64_t i = 0; i < s->nalloc; i++) {
        uint32_t gt = s->alloc[i] / GTES;
        if (s->ngtlist == 0 || s->gtlist[s->ngtlist - 1] != gt) {
            s->gtlist[s->ngtlist] = gt;
            s->gtfirst[s->ngtlist++] = i;
        }
    }
    s->grains_at = OVERHEAD;
    s->gts_at = grain_sector(s, s->nalloc);
    s->gd_marker_at = s->gts_at + s->ngtlist * (1 + GT_SECT);
    s->footer_marker_at = s->gd_marker_at + 1 + s->gd_sectors;
    s->eos_at = s->footer_marker_at + 2;
    s->end = s->eos_at + 1;
    for (uint64_t j = 0; j < s->ngtlist; j++) {
        uint32_t v = htole32((uint32_t) (s->gts_at + j * (1 + GT_SECT) + 1));
        memcpy(s->gd + (uint64_t) s->gtlist[j] * 4, &v, 4);
    }
    return 0;
}

int vmdk_synth_seal(struct vmdk_synth *s)
{
    if (s->sealed)
        return 0;
    int r = build_tables(s);
    if (r < 0)
        return r;
    make_desc(s);
    s->sealed = true;
    return 0;
}

uint64_t vmdk_synth_file_size(const struct vmdk_synth *s)
{
    assert(s->sealed);
    assert(s->end * VMDK_SECTOR ==
           vmdk_synth_size(s->disk_size, s->nalloc, s->ngtlist));
    return s->end * VMDK_SECTOR;
}

uint64_t vmdk_synth_size(uint64_t disk_size, uint64_t grains, uint64_t tables)
{
    uint64_t ngrains = vmdk_div_up(disk_size, G_BYTES);
    if (disk_size == 0 || ngrains > VMDK_MAX_GRAINS)
        return 0;
    uint64_t gd_sectors = vmdk_div_up(vmdk_div_up(ngrains, GTES) * 4,
                                      VMDK_SECTOR);
    /* Overhead, grains, tables with markers, GD marker + GD, footer
     * marker + footer, EOS: the layout of build_tables(). */
    return (OVERHEAD + grains * GRAIN_SECT + tables * (1 + GT_SECT) +
            1 + gd_sectors + 2 + 1) * VMDK_SECTOR;
}

uint64_t vmdk_synth_grains_allocated(const struct vmdk_synth *s)
{
    return s->nalloc;
}

/* ---- producing bytes -------------------------------------------------------- */

static void header(const struct vmdk_synth *s, bool footer, uint8_t *out)
{
    struct vmdk_header h = {
        .magic = VMDK_MAGIC, .version = 3,
        .flags = VMDK_FLAG_NL_TEST | VMDK_FLAG_COMPRESSED | VMDK_FLAG_MARKERS,
        .capacity = s->capacity, .grain_size = G_SECT,
        .desc_offset = 1, .desc_size = DESC_SECT, .gtes_per_gt = GTES,
        .rgd_offset = 0,
        .gd_offset = footer ? s->gd_marker_at + 1 : VMDK_GD_AT_END,
        .overhead = OVERHEAD, .nl = { '\n', ' ', '\r', '\n' },
        .compress = VMDK_COMPRESS_DEFLATE,
    };
    vmdk_header_encode(&h, out);
}

static void meta_marker(uint64_t sectors, uint32_t type, uint8_t *out)
{
    struct vmdk_marker_disk m = { htole64(sectors), 0, htole32(type) };
    memset(out, 0, VMDK_SECTOR);
    memcpy(out, &m, sizeof m);
}

static void put16(uint8_t *p, uint16_t v) { p[0] = v & 0xff; p[1] = v >> 8; }

/* Build grain 'rank' (marker, zlib stored blocks, padding) in the cache. */
static int fill_grain(struct vmdk_synth *s, uint64_t rank,
                      vmdk_read_disk_fn read_disk, void *opaque)
{
    uint8_t *c = s->cache;
    uint64_t g = s->alloc[rank], off = g * G_BYTES;
    uint8_t *data = c + VMDK_GRAIN_MARKER_SIZE + ZHDR + 5;
    uint64_t n = s->disk_size - off < G_BYTES ? s->disk_size - off : G_BYTES;

    s->cached = 0;
    int r = read_disk(opaque, off, data, (size_t) n);
    if (r < 0)
        return r;
    memset(data + n, 0, G_BYTES - n);
    uint32_t adler = libdeflate_adler32(1, data, G_BYTES);
    uint8_t last = data[BLK1];
    struct vmdk_marker_disk m = { htole64(g * G_SECT), htole32(CSIZE), 0 };
    memcpy(c, &m, VMDK_GRAIN_MARKER_SIZE);
    uint8_t *z = c + VMDK_GRAIN_MARKER_SIZE;
    z[0] = 0x78;                          /* deflate, 32 KiB window */
    z[1] = 0x01;                          /* fastest; (0x7801 % 31) == 0 */
    z[2] = 0x00;                          /* stored, not final */
    put16(z + 3, BLK1);
    put16(z + 5, (uint16_t) ~BLK1);
    uint8_t *b2 = data + BLK1;
    b2[0] = 0x01;                         /* stored, final */
    put16(b2 + 1, G_BYTES - BLK1);
    put16(b2 + 3, (uint16_t) ~(G_BYTES - BLK1));
    b2[5] = last;
    uint8_t *t = b2 + 6;
    t[0] = adler >> 24, t[1] = adler >> 16, t[2] = adler >> 8, t[3] = adler;
    assert(t + 4 == c + VMDK_GRAIN_MARKER_SIZE + CSIZE);
    memset(t + 4, 0, (size_t) (c + GRAIN_FILE - (t + 4)));
    s->cached = rank + 1;
    return 0;
}

static void gt_sectors(const struct vmdk_synth *s, uint64_t j, uint8_t *out)
{
    memset(out, 0, GT_SECT * VMDK_SECTOR);
    uint64_t base = (uint64_t) s->gtlist[j] * GTES;
    for (uint64_t i = s->gtfirst[j];
         i < s->nalloc && s->alloc[i] < base + GTES; i++) {
        uint32_t v = htole32((uint32_t) grain_sector(s, i));
        memcpy(out + (s->alloc[i] - base) * 4, &v, 4);
    }
}

/* Point *p at the bytes of the region holding 'off' (sector granular for
 * everything but grains); *n: how many are valid from off. */
static int piece(struct vmdk_synth *s, uint64_t off, uint8_t *tmp,
                 const uint8_t **p, uint64_t *n, vmdk_read_disk_fn rd,
                 void *opaque)
{
    uint64_t sec = off / VMDK_SECTOR;
    uint64_t base;                        /* region start, bytes */

    if (sec >= s->grains_at && sec < s->gts_at) {
        uint64_t rank = (sec - s->grains_at) / GRAIN_SECT;
        if (s->cached != rank + 1) {
            int r = fill_grain(s, rank, rd, opaque);
            if (r < 0)
                return r;
        }
        base = grain_sector(s, rank) * VMDK_SECTOR;
        *p = s->cache + (off - base);
        *n = GRAIN_FILE - (off - base);
        return 0;
    }
    memset(tmp, 0, GT_SECT * VMDK_SECTOR);
    base = sec * VMDK_SECTOR;
    *n = VMDK_SECTOR;
    if (sec == 0)
        header(s, false, tmp);
    else if (sec >= 1 && sec < 1 + DESC_SECT)
        memcpy(tmp, s->desc + (sec - 1) * VMDK_SECTOR, VMDK_SECTOR);
    else if (sec >= s->gts_at && sec < s->gd_marker_at) {
        uint64_t j = (sec - s->gts_at) / (1 + GT_SECT);
        uint64_t k = (sec - s->gts_at) % (1 + GT_SECT);
        if (k == 0)
            meta_marker(GT_SECT, VMDK_MARKER_GT, tmp);
        else {
            gt_sectors(s, j, tmp);
            memmove(tmp, tmp + (k - 1) * VMDK_SECTOR, VMDK_SECTOR);
        }
    } else if (sec == s->gd_marker_at)
        meta_marker(s->gd_sectors, VMDK_MARKER_GD, tmp);
    else if (sec > s->gd_marker_at && sec < s->footer_marker_at)
        memcpy(tmp, s->gd + (sec - s->gd_marker_at - 1) * VMDK_SECTOR,
               VMDK_SECTOR);
    else if (sec == s->footer_marker_at)
        meta_marker(1, VMDK_MARKER_FOOTER, tmp);
    else if (sec == s->footer_marker_at + 1)
        header(s, true, tmp);
    else if (sec == s->eos_at)
        meta_marker(0, VMDK_MARKER_EOS, tmp);
    /* else: padding in the overhead, zeros */
    *p = tmp + (off - base);
    *n -= off - base;
    return 0;
}

int64_t vmdk_synth_read(struct vmdk_synth *s, uint64_t off, void *buf,
                        size_t len, vmdk_read_disk_fn read_disk, void *opaque)
{
    uint8_t tmp[GT_SECT * VMDK_SECTOR];
    uint64_t size = vmdk_synth_file_size(s), done = 0;

    if (off >= size)
        return 0;
    if (len > size - off)
        len = (size_t) (size - off);
    while (done < len) {
        const uint8_t *p;
        uint64_t n;
        int r = piece(s, off + done, tmp, &p, &n, read_disk, opaque);
        if (r < 0)
            return r;
        if (n > len - done)
            n = len - done;
        memcpy((uint8_t *) buf + done, p, n);
        done += n;
    }
    return (int64_t) done;
}
