/* vmdk/format.c: sparse header codec, descriptor parser, lint, inflate.
 * Pure functions over caller buffers. */
#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include <libdeflate.h>

#include "vmdk/vmdk-internal.h"

/* ---- header ---------------------------------------------------------------- */

static void header_from_disk(const struct vmdk_header_disk *d,
                             struct vmdk_header *h)
{
    memset(h, 0, sizeof *h);
    h->magic = le32toh(d->magic);
    h->version = le32toh(d->version);
    h->flags = le32toh(d->flags);
    h->capacity = le64toh(d->capacity);
    h->grain_size = le64toh(d->grain_size);
    h->desc_offset = le64toh(d->desc_offset);
    h->desc_size = le64toh(d->desc_size);
    h->gtes_per_gt = le32toh(d->gtes_per_gt);
    h->rgd_offset = le64toh(d->rgd_offset);
    h->gd_offset = le64toh(d->gd_offset);
    h->overhead = le64toh(d->overhead);
    h->unclean_shutdown = d->unclean_shutdown;
    memcpy(h->nl, d->nl, 4);
    h->compress = le16toh(d->compress);
}

void vmdk_header_encode(const struct vmdk_header *h, void *sector)
{
    struct vmdk_header_disk d;
    memset(&d, 0, sizeof d);
    d.magic = htole32(h->magic);
    d.version = htole32(h->version);
    d.flags = htole32(h->flags);
    d.capacity = htole64(h->capacity);
    d.grain_size = htole64(h->grain_size);
    d.desc_offset = htole64(h->desc_offset);
    d.desc_size = htole64(h->desc_size);
    d.gtes_per_gt = htole32(h->gtes_per_gt);
    d.rgd_offset = htole64(h->rgd_offset);
    d.gd_offset = htole64(h->gd_offset);
    d.overhead = htole64(h->overhead);
    d.unclean_shutdown = h->unclean_shutdown;
    memcpy(d.nl, h->nl, 4);
    d.compress = htole16(h->compress);
    memcpy(sector, &d, sizeof d);
}

uint64_t vmdk_header_grains(const struct vmdk_header *h)
{
    return vmdk_div_up(h->capacity, h->grain_size);
}

uint64_t vmdk_header_gts(const struct vmdk_header *h)
{
    return vmdk_div_up(vmdk_header_grains(h), h->gtes_per_gt);
}

/* Overhead and offsets are kept below 2^40 sectors (512 TiB) so that every
 * sum of two of them, times 512, fits in 64 bits. */
#define SECTORS_SANE (1ull << 40)

static int check_identity(const struct vmdk_header *h, struct nbdf_err *err)
{
    if (h->magic != VMDK_MAGIC)
        return nbdf_errf(err, -EINVAL, "not a VMDK sparse extent: magic "
                         "0x%08" PRIx32 " is not \"KDMV\"", h->magic);
    if (h->version < 1 || h->version > 3)
        return nbdf_errf(err, -ENOTSUP, "sparse header version %" PRIu32
                         " (only 1 to 3 are defined)", h->version);
    if ((h->flags & VMDK_FLAG_NL_TEST) && memcmp(h->nl, "\n \r\n", 4) != 0)
        return nbdf_errf(err, -EINVAL, "newline test bytes altered: the "
                         "file went through a text-mode transfer");
    return 0;
}

static int check_geometry(const struct vmdk_header *h, struct nbdf_err *err)
{
    if (!IS_POWER_OF_2(h->grain_size) ||
        h->grain_size < VMDK_GRAIN_MIN_SECTORS ||
        h->grain_size > VMDK_GRAIN_MAX_SECTORS)
        return nbdf_errf(err, -EINVAL, "grain size %" PRIu64 " sectors: "
                         "must be a power of two from %u to %u",
                         h->grain_size, VMDK_GRAIN_MIN_SECTORS,
                         VMDK_GRAIN_MAX_SECTORS);
    if (h->capacity == 0)
        return nbdf_errf(err, -EINVAL, "capacity is 0 sectors");
    if (h->capacity > VMDK_MAX_GRAINS * h->grain_size)
        return nbdf_errf(err, -EFBIG, "capacity %" PRIu64 " sectors: more "
                         "than %llu grains", h->capacity,
                         (unsigned long long) VMDK_MAX_GRAINS);
    if (h->gtes_per_gt < 1 || h->gtes_per_gt > VMDK_GTES_MAX)
        return nbdf_errf(err, -EINVAL, "%" PRIu32 " entries per grain table "
                         "(must be 1 to %u)", h->gtes_per_gt, VMDK_GTES_MAX);
    return 0;
}

static int check_compression(const struct vmdk_header *h, struct nbdf_err *err)
{
    bool flag = h->flags & VMDK_FLAG_COMPRESSED;

    if (h->compress > VMDK_COMPRESS_DEFLATE)
        return nbdf_errf(err, -ENOTSUP, "compression algorithm %u (only 0, "
                         "none, and 1, deflate, are defined)", h->compress);
    if (flag != (h->compress == VMDK_COMPRESS_DEFLATE))
        return nbdf_errf(err, -EINVAL, "compressed-grains flag %s but "
                         "compression algorithm %u", flag ? "set" : "clear",
                         h->compress);
    if ((h->flags & VMDK_FLAG_MARKERS) && !flag)
        return nbdf_errf(err, -EINVAL, "markers flag set on uncompressed "
                         "grains");
    if (flag && !(h->flags & VMDK_FLAG_MARKERS))
        return nbdf_errf(err, -ENOTSUP, "compressed grains without markers "
                         "(only streamOptimized VMDKs compress)");
    return 0;
}

static int check_layout(const struct vmdk_header *h, struct nbdf_err *err)
{
    if (h->overhead < 1 || h->overhead >= SECTORS_SANE)
        return nbdf_errf(err, -EINVAL, "overhead %" PRIu64 " sectors: must "
                         "cover the header and be below 2^40", h->overhead);
    if (h->desc_offset == 0)
        return nbdf_errf(err, -ENOTSUP, "no embedded descriptor: this is one "
                         "extent of a multi-file VMDK (convert it to a single "
                         "file first)");
    if (h->desc_size == 0)
        return nbdf_errf(err, -EINVAL, "descriptor at sector %" PRIu64
                         " has size 0", h->desc_offset);
    if (h->desc_size > VMDK_DESC_MAX / VMDK_SECTOR)
        return nbdf_errf(err, -EFBIG, "descriptor of %" PRIu64 " sectors "
                         "(limit %u)", h->desc_size, VMDK_DESC_MAX / VMDK_SECTOR);
    if (h->desc_offset >= h->overhead ||
        h->desc_size > h->overhead - h->desc_offset)
        return nbdf_errf(err, -EINVAL, "descriptor (sectors %" PRIu64 "+%"
                         PRIu64 ") is not inside the overhead (%" PRIu64
                         " sectors)", h->desc_offset, h->desc_size,
                         h->overhead);
    if (h->flags & VMDK_FLAG_MARKERS)
        return 0;                     /* the stream's tables are skipped */
    uint64_t gd_sectors = vmdk_div_up(vmdk_header_gts(h) * 4, VMDK_SECTOR);
    if (h->gd_offset == 0 || h->gd_offset == VMDK_GD_AT_END ||
        h->gd_offset >= h->overhead || gd_sectors > h->overhead - h->gd_offset)
        return nbdf_errf(err, -EINVAL, "grain directory (sector %" PRIu64
                         ", %" PRIu64 " sectors) is not inside the overhead "
                         "(%" PRIu64 " sectors)", h->gd_offset, gd_sectors,
                         h->overhead);
    if (h->gd_offset < h->desc_offset + h->desc_size &&
        h->desc_offset < h->gd_offset + gd_sectors)
        return nbdf_errf(err, -EINVAL, "grain directory overlaps the "
                         "descriptor");
    return 0;
}

int vmdk_header_decode(const void *sector, struct vmdk_header *out,
                       struct nbdf_err *err)
{
    struct vmdk_header_disk d;
    int r;

    memcpy(&d, sector, sizeof d);
    header_from_disk(&d, out);
    if ((r = check_identity(out, err)) < 0 ||
        (r = check_geometry(out, err)) < 0 ||
        (r = check_compression(out, err)) < 0 ||
        (r = check_layout(out, err)) < 0)
        return r;
    return 0;
}

int vmdk_lint(const struct vmdk_header *h, vmdk_warn_fn warn, void *opaque)
{
    uint32_t known = VMDK_FLAG_NL_TEST | VMDK_FLAG_RGD | VMDK_FLAG_ZERO_GTE |
                     VMDK_FLAG_COMPRESSED | VMDK_FLAG_MARKERS;
    char msg[160];
    int n = 0;

    if (h->flags & ~known) {
        snprintf(msg, sizeof msg, "unknown header flag bits 0x%08" PRIx32,
                 h->flags & ~known);
        warn(opaque, msg), n++;
    }
    if (h->unclean_shutdown)
        warn(opaque, "unclean shutdown flag set: the image was not closed "
                     "cleanly"), n++;
    if (!(h->flags & VMDK_FLAG_NL_TEST))
        warn(opaque, "newline test not flagged: text-mode damage cannot be "
                     "detected"), n++;
    if ((h->flags & VMDK_FLAG_MARKERS) && h->gd_offset != VMDK_GD_AT_END)
        warn(opaque, "streamOptimized header with a grain directory offset "
                     "(qemu-img writes this; VMware writes GD_AT_END)"), n++;
    return n;
}

/* ---- descriptor ------------------------------------------------------------ */

/* Trim spaces and one pair of double quotes in place. */
static char *trim(char *s)
{
    while (isspace((unsigned char) *s))
        s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char) e[-1]))
        *--e = '\0';
    if (e - s >= 2 && s[0] == '"' && e[-1] == '"') {
        e[-1] = '\0';
        s++;
    }
    return s;
}

static int parse_hex32(const char *v, uint32_t *out)
{
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 16);
    if (errno || end == v || *end || x > UINT32_MAX)
        return -1;
    *out = (uint32_t) x;
    return 0;
}

/* "RW 8192 SPARSE "name.vmdk" [offset]" */
static int parse_extent(char *line, const char *access, struct vmdk_desc *d,
                        struct nbdf_err *err)
{
    char *p = line + strlen(access), *end;

    d->extents++;
    if (d->extents > 1)
        return 0;
    snprintf(d->extent_access, sizeof d->extent_access, "%s", access);
    while (isspace((unsigned char) *p))
        p++;
    if (!isdigit((unsigned char) *p))
        return nbdf_errf(err, -EINVAL, "descriptor: extent line without a "
                         "size: \"%.60s\"", line);
    errno = 0;
    d->extent_sectors = strtoull(p, &end, 10);
    if (errno || !isspace((unsigned char) *end))
        return nbdf_errf(err, -EINVAL, "descriptor: extent size not a number: "
                         "\"%.60s\"", line);
    p = end;
    while (isspace((unsigned char) *p))
        p++;
    size_t n = strcspn(p, " \t");
    snprintf(d->extent_type, sizeof d->extent_type, "%.*s", (int) n, p);
    p = strchr(p + n, '"');
    if (p) {
        char *q = strchr(p + 1, '"');
        size_t fl = q ? (size_t) (q - p - 1) : strlen(p + 1);
        snprintf(d->extent_file, sizeof d->extent_file, "%.*s", (int) fl, p + 1);
    }
    return 0;
}

static int parse_kv(char *line, struct vmdk_desc *d, bool *has_type,
                    struct nbdf_err *err)
{
    char *eq = strchr(line, '=');
    if (!eq)
        return 0;                     /* not ours to judge */
    *eq = '\0';
    char *k = trim(line), *v = trim(eq + 1);
    if (strcasecmp(k, "createType") == 0) {
        snprintf(d->create_type, sizeof d->create_type, "%s", v);
        *has_type = true;
    } else if (strcasecmp(k, "CID") == 0) {
        if (parse_hex32(v, &d->cid) < 0)
            return nbdf_errf(err, -EINVAL, "descriptor: CID \"%.20s\" is not "
                             "32-bit hex", v);
    } else if (strcasecmp(k, "parentCID") == 0) {
        if (parse_hex32(v, &d->parent_cid) < 0)
            return nbdf_errf(err, -EINVAL, "descriptor: parentCID \"%.20s\" "
                             "is not 32-bit hex", v);
    }
    return 0;
}

static int parse_line(char *line, struct vmdk_desc *d, bool *has_type,
                      struct nbdf_err *err)
{
    static const char *access[] = { "RW", "RDONLY", "NOACCESS" };

    line = trim(line);
    if (line[0] == '#' || line[0] == '\0')
        return 0;
    for (size_t i = 0; i < sizeof access / sizeof *access; i++) {
        size_t n = strlen(access[i]);
        if (strncmp(line, access[i], n) == 0 && isspace((unsigned char) line[n]))
            return parse_extent(line, access[i], d, err);
    }
    return parse_kv(line, d, has_type, err);
}

static int check_desc(const struct vmdk_desc *d, bool has_type,
                      const struct vmdk_header *h, struct nbdf_err *err)
{
    bool stream = h->flags & VMDK_FLAG_MARKERS;

    if (!has_type)
        return nbdf_errf(err, -EINVAL, "descriptor: no createType");
    if (strcmp(d->create_type, "streamOptimized") != 0 &&
        strcmp(d->create_type, "monolithicSparse") != 0)
        return nbdf_errf(err, -ENOTSUP, "descriptor: createType \"%s\" "
                         "(only streamOptimized and monolithicSparse files "
                         "are decoded)", d->create_type);
    if (stream != (strcmp(d->create_type, "streamOptimized") == 0))
        return nbdf_errf(err, -EINVAL, "descriptor says %s but the header "
                         "%s markers", d->create_type,
                         stream ? "has" : "has no");
    if (d->parent_cid != 0xffffffffu)
        return nbdf_errf(err, -ENOTSUP, "descriptor: parentCID %08" PRIx32
                         ": a delta disk needs its parent (not supported)",
                         d->parent_cid);
    if (d->extents != 1)
        return nbdf_errf(err, -EINVAL, "descriptor: %" PRIu32 " extents "
                         "(a single-file VMDK has exactly one)", d->extents);
    if (strcmp(d->extent_type, "SPARSE") != 0)
        return nbdf_errf(err, -EINVAL, "descriptor: extent type \"%s\" in a "
                         "sparse file (must be SPARSE)", d->extent_type);
    if (d->extent_sectors != h->capacity)
        return nbdf_errf(err, -EINVAL, "descriptor: extent of %" PRIu64
                         " sectors but header capacity %" PRIu64,
                         d->extent_sectors, h->capacity);
    return 0;
}

int vmdk_desc_parse(const char *text, size_t len, const struct vmdk_header *h,
                    struct vmdk_desc *out, struct nbdf_err *err)
{
    size_t n = strnlen(text, len);
    char *copy = malloc(n + 1);
    bool has_type = false;
    int r = 0;

    if (!copy)
        return -ENOMEM;
    memcpy(copy, text, n);
    copy[n] = '\0';
    memset(out, 0, sizeof *out);
    out->parent_cid = 0xffffffffu;    /* absent: no parent (qemu agrees) */
    char *save = NULL;
    for (char *line = strtok_r(copy, "\n", &save); line && r == 0;
         line = strtok_r(NULL, "\n", &save))
        r = parse_line(line, out, &has_type, err);
    free(copy);
    if (r == 0)
        r = check_desc(out, has_type, h, err);
    return r;
}

/* ---- inflate ---------------------------------------------------------------- */

struct vmdk_inflater {
    struct libdeflate_decompressor *d;
};

int vmdk_inflater_new(struct vmdk_inflater **out)
{
    struct vmdk_inflater *z = malloc(sizeof *z);
    if (!z)
        return -ENOMEM;
    z->d = libdeflate_alloc_decompressor();
    if (!z->d) {
        free(z);
        return -ENOMEM;
    }
    *out = z;
    return 0;
}

void vmdk_inflater_free(struct vmdk_inflater *z)
{
    if (z) {
        libdeflate_free_decompressor(z->d);
        free(z);
    }
}

int64_t vmdk_inflate(struct vmdk_inflater *z, const void *in, size_t len,
                     void *out, size_t cap)
{
    size_t n = 0;
    enum libdeflate_result r =
        libdeflate_zlib_decompress(z->d, in, len, out, cap, &n);
    return r == LIBDEFLATE_SUCCESS ? (int64_t) n : -EINVAL;
}

void vmdk_grain_init(struct vmdk_grain *g, const struct vmdk_header *h,
                     uint64_t lba, uint64_t file_off, const void *cdata,
                     size_t clen)
{
    uint64_t grain = vmdk_header_grain_bytes(h);

    g->disk_off = lba * VMDK_SECTOR;
    g->file_off = file_off;
    g->cdata = cdata;
    g->clen = clen;
    g->grain_bytes = (size_t) grain;
    g->capacity = h->capacity * VMDK_SECTOR;
    /* Only the disk's last grain may be short, and only by less than a
     * sector past the capacity's end (VMDKstream compresses what remains
     * of a source file whose size is not a multiple of 512). */
    g->min_len = (size_t) grain;
    if (lba + h->grain_size >= h->capacity)
        g->min_len = (size_t) ((h->capacity - lba) * VMDK_SECTOR -
                               (VMDK_SECTOR - 1));
}

int64_t vmdk_grain_inflate(struct vmdk_inflater *z, const struct vmdk_grain *g,
                           void *out, struct nbdf_err *err)
{
    uint64_t lba = g->disk_off / VMDK_SECTOR;
    int64_t n = vmdk_inflate(z, g->cdata, g->clen, out, g->grain_bytes);

    if (n < 0)
        return nbdf_errf(err, -EINVAL, "grain for LBA %" PRIu64 " (marker at "
                         "byte %" PRIu64 "): deflate data corrupt or longer "
                         "than the grain", lba, g->file_off);
    if ((uint64_t) n < g->min_len)
        return nbdf_errf(err, -EINVAL, "grain for LBA %" PRIu64 " (marker at "
                         "byte %" PRIu64 ") inflates to %" PRId64 " bytes, "
                         "not %zu", lba, g->file_off, n,
                         g->min_len == g->grain_bytes
                         ? g->grain_bytes : g->min_len + VMDK_SECTOR - 1);
    if (g->disk_off >= g->capacity)
        return 0;
    return (uint64_t) n < g->capacity - g->disk_off
           ? n : (int64_t) (g->capacity - g->disk_off);
}
