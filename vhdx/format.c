/* vhdx/format.c: the fixed structures of a VHDX file: file identifier,
 * headers, region table, metadata items, BAT geometry.  See vhdx/vhdx.h.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "vhdx/vhdx-internal.h"

/* ---- little-endian fields --------------------------------------------- */

uint16_t vhdx_le16(const void *p)
{
    const uint8_t *b = p;
    return (uint16_t) (b[0] | b[1] << 8);
}

uint32_t vhdx_le32(const void *p)
{
    const uint8_t *b = p;
    return (uint32_t) b[0] | (uint32_t) b[1] << 8 | (uint32_t) b[2] << 16 |
           (uint32_t) b[3] << 24;
}

uint64_t vhdx_le64(const void *p)
{
    return vhdx_le32(p) | (uint64_t) vhdx_le32((const uint8_t *) p + 4) << 32;
}

/* ---- CRC-32C ------------------------------------------------------------ */

/* Reflected polynomial 0x82F63B78, table built once (a few hundred bytes
 * of a 4 KiB header or 64 KiB table at a time: no need for SSE4.2). */
static uint32_t crc_table[256];

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[i] = c;
    }
}

uint32_t vhdx_crc32c(uint32_t crc, const void *buf, size_t len)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, crc_init);
    const uint8_t *p = buf;
    crc = ~crc;
    while (len--)
        crc = crc_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

/* CRC of a structure whose checksum field (4 bytes at csum_off) counts as
 * zero. */
static uint32_t crc_with_hole(const uint8_t *buf, size_t len, size_t csum_off)
{
    static const uint8_t zero4[4];
    uint32_t c = vhdx_crc32c(0, buf, csum_off);
    c = vhdx_crc32c(c, zero4, 4);
    return vhdx_crc32c(c, buf + csum_off + 4, len - csum_off - 4);
}

/* ---- GUIDs ---------------------------------------------------------------
 * As stored: data1 (LE32), data2 (LE16), data3 (LE16), data4[8]. */
#define GUID(d1, d2, d3, a, b, c, d, e, f, g, h) {                          \
    (d1) & 0xff, (d1) >> 8 & 0xff, (d1) >> 16 & 0xff, (d1) >> 24 & 0xff,    \
    (d2) & 0xff, (d2) >> 8 & 0xff, (d3) & 0xff, (d3) >> 8 & 0xff,           \
    a, b, c, d, e, f, g, h }

const uint8_t vhdx_guid_bat[16] =
    GUID(0x2DC27766u, 0xF623u, 0x4200u, 0x9D, 0x64, 0x11, 0x5E, 0x9B, 0xFD,
         0x4A, 0x08);
const uint8_t vhdx_guid_metadata[16] =
    GUID(0x8B7CA206u, 0x4790u, 0x4B9Au, 0xB8, 0xFE, 0x57, 0x5F, 0x05, 0x0F,
         0x88, 0x6E);
const uint8_t vhdx_guid_file_params[16] =
    GUID(0xCAA16737u, 0xFA36u, 0x4D43u, 0xB3, 0xB6, 0x33, 0xF0, 0xAA, 0x44,
         0xE7, 0x6B);
const uint8_t vhdx_guid_disk_size[16] =
    GUID(0x2FA54224u, 0xCD1Bu, 0x4876u, 0xB2, 0x11, 0x5D, 0xBE, 0xD8, 0x3B,
         0xF4, 0xB8);
const uint8_t vhdx_guid_page83[16] =
    GUID(0xBECA12ABu, 0xB2E6u, 0x4523u, 0x93, 0xEF, 0xC3, 0x09, 0xE0, 0x00,
         0xC7, 0x46);
const uint8_t vhdx_guid_logical_sector[16] =
    GUID(0x8141BF1Du, 0xA96Fu, 0x4709u, 0xBA, 0x47, 0xF2, 0x33, 0xA8, 0xFA,
         0xAB, 0x5F);
const uint8_t vhdx_guid_physical_sector[16] =
    GUID(0xCDA348C7u, 0x445Du, 0x4471u, 0x9C, 0xC9, 0xE9, 0x88, 0x52, 0x51,
         0xC5, 0x56);
const uint8_t vhdx_guid_parent_locator[16] =
    GUID(0xA8D35F2Du, 0xB30Bu, 0x454Du, 0xAB, 0xF7, 0xD3, 0xD8, 0x48, 0x34,
         0xAB, 0x0C);

static bool guid_eq(const uint8_t *a, const uint8_t *b)
{
    return memcmp(a, b, 16) == 0;
}

static bool all_zero(const uint8_t *p, size_t n)
{
    return n == 0 || (p[0] == 0 && memcmp(p, p + 1, n - 1) == 0);
}

/* ---- file identifier and headers ---------------------------------------- */

int vhdx_file_id_check(const void *buf, size_t len, struct nbdf_err *err)
{
    if (len < 8 || memcmp(buf, "vhdxfile", 8) != 0)
        return nbdf_errf(err, -EINVAL,
                         "file identifier: not \"vhdxfile\" (not a VHDX file)");
    return 0;
}

int vhdx_header_decode(const void *buf4k, struct vhdx_header *out,
                       struct nbdf_err *err)
{
    const uint8_t *b = buf4k;
    if (memcmp(b, "head", 4) != 0)
        return nbdf_errf(err, -EINVAL, "header: signature is not \"head\"");
    uint32_t want = vhdx_le32(b + 4), got = crc_with_hole(b, VHDX_HEADER_BYTES, 4);
    if (want != got)
        return nbdf_errf(err, -EINVAL,
                         "header: CRC-32C %08x, the header says %08x",
                         got, want);
    struct vhdx_header h = {
        .seq = vhdx_le64(b + 8),
        .log_version = vhdx_le16(b + 64), .version = vhdx_le16(b + 66),
        .log_length = vhdx_le32(b + 68), .log_offset = vhdx_le64(b + 72),
    };
    memcpy(h.file_write_guid, b + 16, 16);
    memcpy(h.data_write_guid, b + 32, 16);
    memcpy(h.log_guid, b + 48, 16);
    h.log_pending = !all_zero(h.log_guid, 16);
    if (h.version != 1)
        return nbdf_errf(err, -ENOTSUP, "header: version %u (only 1 exists)",
                         h.version);
    if (h.log_length % VHDX_MiB || h.log_offset % VHDX_MiB)
        return nbdf_errf(err, -EINVAL,
                         "header: log at %llu, %u bytes: not 1 MiB multiples",
                         (unsigned long long) h.log_offset, h.log_length);
    if (h.log_length && h.log_offset < VHDX_HEADER_SECTION)
        return nbdf_errf(err, -EINVAL,
                         "header: the log (at %llu) overlaps the header section",
                         (unsigned long long) h.log_offset);
    if (h.log_pending && h.log_length == 0)
        return nbdf_errf(err, -EINVAL, "header: a log GUID but no log");
    if (h.log_pending && h.log_version != 0)
        return nbdf_errf(err, -ENOTSUP, "header: log version %u (only 0 "
                         "exists)", h.log_version);
    *out = h;
    return 0;
}

int vhdx_header_pick(const struct vhdx_header *h1, const struct vhdx_header *h2,
                     struct nbdf_err *err)
{
    if (!h1 && !h2)
        return nbdf_errf(err, -EINVAL, "neither header is valid");
    if (!h2)
        return 1;
    if (!h1)
        return 2;
    return h1->seq >= h2->seq ? 1 : 2;
}

/* ---- region table ------------------------------------------------------- */

static bool overlap(uint64_t a, uint64_t alen, uint64_t b, uint64_t blen)
{
    return a < b + blen && b < a + alen;
}

static int region_entry(const uint8_t *e, struct vhdx_region *r, bool *seen,
                        const char *what, struct nbdf_err *err)
{
    if (*seen)
        return nbdf_errf(err, -EINVAL, "region table: two %s entries", what);
    *seen = true;
    r->off = vhdx_le64(e + 16);
    r->len = vhdx_le32(e + 24);
    if (r->off % VHDX_MiB || r->len % VHDX_MiB || r->len == 0)
        return nbdf_errf(err, -EINVAL,
                         "region table: %s at %llu, %llu bytes: not a 1 MiB "
                         "multiple", what, (unsigned long long) r->off,
                         (unsigned long long) r->len);
    if (r->off < VHDX_HEADER_SECTION)
        return nbdf_errf(err, -EINVAL,
                         "region table: %s inside the header section", what);
    return 0;
}

int vhdx_region_table_decode(const void *buf64k, struct vhdx_regions *out,
                             struct nbdf_err *err)
{
    const uint8_t *b = buf64k;
    if (memcmp(b, "regi", 4) != 0)
        return nbdf_errf(err, -EINVAL, "region table: signature is not \"regi\"");
    uint32_t want = vhdx_le32(b + 4), got = crc_with_hole(b, VHDX_REGION_BYTES, 4);
    if (want != got)
        return nbdf_errf(err, -EINVAL,
                         "region table: CRC-32C %08x, the table says %08x",
                         got, want);
    uint32_t n = vhdx_le32(b + 8);
    if (n > VHDX_REGION_MAX_ENTRIES)
        return nbdf_errf(err, -EINVAL, "region table: %u entries (at most %u)",
                         n, VHDX_REGION_MAX_ENTRIES);
    bool have_bat = false, have_meta = false;
    struct vhdx_regions r = { { 0, 0 }, { 0, 0 } };
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *e = b + 16 + 32 * (size_t) i;
        int rc = 0;
        if (guid_eq(e, vhdx_guid_bat))
            rc = region_entry(e, &r.bat, &have_bat, "BAT", err);
        else if (guid_eq(e, vhdx_guid_metadata))
            rc = region_entry(e, &r.meta, &have_meta, "metadata", err);
        else if (vhdx_le32(e + 28) & 1)
            rc = nbdf_errf(err, -ENOTSUP,
                           "region table: entry %u is a required region "
                           "this reader does not know", i);
        if (rc < 0)
            return rc;
    }
    if (!have_bat || !have_meta)
        return nbdf_errf(err, -EINVAL, "region table: no %s region",
                         have_bat ? "metadata" : "BAT");
    if (overlap(r.bat.off, r.bat.len, r.meta.off, r.meta.len))
        return nbdf_errf(err, -EINVAL,
                         "region table: the BAT and the metadata overlap");
    *out = r;
    return 0;
}

/* ---- metadata ----------------------------------------------------------- */

/* UTF-16LE to UTF-8, truncated to cap - 1 bytes, NUL-terminated. */
static void utf16_to_utf8(const uint8_t *in, size_t bytes, char *out,
                          size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i + 1 < bytes; i += 2) {
        unsigned c = vhdx_le16(in + i);
        if (c >= 0xD800 && c < 0xE000)
            c = '?';                              /* surrogates: not names */
        char tmp[3];
        size_t n = c < 0x80 ? 1 : c < 0x800 ? 2 : 3;
        if (n == 1)
            tmp[0] = (char) c;
        else if (n == 2) {
            tmp[0] = (char) (0xC0 | c >> 6);
            tmp[1] = (char) (0x80 | (c & 0x3F));
        } else {
            tmp[0] = (char) (0xE0 | c >> 12);
            tmp[1] = (char) (0x80 | (c >> 6 & 0x3F));
            tmp[2] = (char) (0x80 | (c & 0x3F));
        }
        if (o + n >= cap)
            break;
        memcpy(out + o, tmp, n);
        o += n;
    }
    out[o] = 0;
}

static int parent_locator(const uint8_t *p, uint32_t len, struct vhdx_meta *m,
                          struct nbdf_err *err)
{
    if (len < 20)
        return nbdf_errf(err, -EINVAL, "metadata: parent locator too short");
    unsigned pairs = vhdx_le16(p + 18);
    if (20 + (uint64_t) pairs * 12 > len)
        return nbdf_errf(err, -EINVAL,
                         "metadata: parent locator: %u pairs do not fit", pairs);
    m->parent_pairs = 0;
    for (unsigned i = 0; i < pairs; i++) {
        const uint8_t *e = p + 20 + 12 * (size_t) i;
        uint32_t ko = vhdx_le32(e), vo = vhdx_le32(e + 4);
        uint16_t kl = vhdx_le16(e + 8), vl = vhdx_le16(e + 10);
        if (!ko || !vo || !kl || !vl || (uint64_t) ko + kl > len ||
            (uint64_t) vo + vl > len)
            return nbdf_errf(err, -EINVAL,
                             "metadata: parent locator pair %u out of bounds", i);
        if (m->parent_pairs < VHDX_PARENT_MAX_PAIRS) {
            utf16_to_utf8(p + ko, kl, m->parent[m->parent_pairs].key,
                          sizeof m->parent[0].key);
            utf16_to_utf8(p + vo, vl, m->parent[m->parent_pairs].value,
                          sizeof m->parent[0].value);
            m->parent_pairs++;
        }
    }
    return 0;
}

struct item {
    const uint8_t *guid;
    uint32_t off, len;
};

static int item_check(const uint8_t *e, size_t region_len, struct item *it,
                      unsigned i, struct nbdf_err *err)
{
    it->guid = e;
    it->off = vhdx_le32(e + 16);
    it->len = vhdx_le32(e + 20);
    if (it->len == 0)
        return 0;
    if (it->off < (64u << 10) || it->len > VHDX_META_ITEM_MAX ||
        (uint64_t) it->off + it->len > region_len)
        return nbdf_errf(err, -EINVAL,
                         "metadata: item %u at %u, %u bytes, outside the "
                         "region's items", i, it->off, it->len);
    return 0;
}

/* Fixed-size items: which GUID, how long it must be. */
static int item_value(const struct item *it, const uint8_t *base,
                      struct vhdx_meta *m, unsigned *seen, struct nbdf_err *err)
{
    const uint8_t *p = base + it->off;
    if (guid_eq(it->guid, vhdx_guid_file_params) && it->len >= 8) {
        m->block_size = vhdx_le32(p);
        uint32_t bits = vhdx_le32(p + 4);
        m->leave_blocks_allocated = bits & 1;
        m->has_parent = bits & 2;
        *seen |= 1;
    } else if (guid_eq(it->guid, vhdx_guid_disk_size) && it->len >= 8) {
        m->disk_size = vhdx_le64(p);
        *seen |= 2;
    } else if (guid_eq(it->guid, vhdx_guid_logical_sector) && it->len >= 4) {
        m->logical_sector = vhdx_le32(p);
        *seen |= 4;
    } else if (guid_eq(it->guid, vhdx_guid_physical_sector) && it->len >= 4) {
        m->physical_sector = vhdx_le32(p);
        *seen |= 8;
    } else if (guid_eq(it->guid, vhdx_guid_page83) && it->len >= 16) {
        memcpy(m->page83, p, 16);
        m->have_page83 = true;
    } else if (guid_eq(it->guid, vhdx_guid_parent_locator)) {
        int r = parent_locator(p, it->len, m, err);
        if (r < 0)
            return r;
        *seen |= 16;
    } else if (vhdx_le32(it->guid + 24) & 4)
        return nbdf_errf(err, -ENOTSUP,
                         "metadata: a required item this reader does not know");
    return 0;
}

static int meta_values_check(const struct vhdx_meta *m, unsigned seen,
                             struct nbdf_err *err)
{
    if ((seen & 15) != 15)
        return nbdf_errf(err, -EINVAL, "metadata: no %s item",
                         !(seen & 1) ? "file parameters" :
                         !(seen & 2) ? "virtual disk size" :
                         !(seen & 4) ? "logical sector size" :
                                       "physical sector size");
    if (m->block_size < VHDX_BLOCK_MIN || m->block_size > VHDX_BLOCK_MAX ||
        (m->block_size & (m->block_size - 1)))
        return nbdf_errf(err, -EINVAL,
                         "metadata: block size %u is not a power of 2 from "
                         "1 to 256 MiB", m->block_size);
    if ((m->logical_sector != 512 && m->logical_sector != 4096) ||
        (m->physical_sector != 512 && m->physical_sector != 4096))
        return nbdf_errf(err, -EINVAL,
                         "metadata: sector sizes %u/%u (512 or 4096 only)",
                         m->logical_sector, m->physical_sector);
    if (m->disk_size == 0 || m->disk_size % m->logical_sector ||
        m->disk_size > VHDX_DISK_MAX)
        return nbdf_errf(err, -EINVAL,
                         "metadata: virtual disk size %llu is not a positive "
                         "multiple of %u up to 64 TiB",
                         (unsigned long long) m->disk_size, m->logical_sector);
    if (m->has_parent && !(seen & 16))
        return nbdf_errf(err, -EINVAL,
                         "metadata: a differencing file without a parent locator");
    return 0;
}

int vhdx_metadata_decode(const void *buf, size_t len, struct vhdx_meta *out,
                         struct nbdf_err *err)
{
    const uint8_t *b = buf;
    if (len < 32 || memcmp(b, "metadata", 8) != 0)
        return nbdf_errf(err, -EINVAL,
                         "metadata: table signature is not \"metadata\"");
    unsigned n = vhdx_le16(b + 10);
    if (n > VHDX_META_MAX_ENTRIES || 32 + 32 * (size_t) n > (64u << 10))
        return nbdf_errf(err, -EINVAL, "metadata: %u entries (at most %u)", n,
                         VHDX_META_MAX_ENTRIES);
    struct vhdx_meta m;
    memset(&m, 0, sizeof m);
    struct item items[VHDX_META_MAX_ENTRIES];
    unsigned seen = 0;
    for (unsigned i = 0; i < n; i++) {
        int r = item_check(b + 32 + 32 * (size_t) i, len, &items[i], i, err);
        if (r < 0)
            return r;
        for (unsigned j = 0; j < i; j++)
            if (items[i].len && items[j].len &&
                overlap(items[i].off, items[i].len, items[j].off, items[j].len))
                return nbdf_errf(err, -EINVAL,
                                 "metadata: items %u and %u overlap", j, i);
        if (items[i].len && (r = item_value(&items[i], b, &m, &seen, err)) < 0)
            return r;
    }
    int r = meta_values_check(&m, seen, err);
    if (r < 0)
        return r;
    *out = m;
    return 0;
}

void vhdx_geom(const struct vhdx_meta *m, struct vhdx_geom *g)
{
    g->chunk_ratio = VHDX_SECTORS_PER_CHUNK * m->logical_sector / m->block_size;
    g->payload_blocks = (m->disk_size + m->block_size - 1) / m->block_size;
    g->bitmap_blocks = (g->payload_blocks + g->chunk_ratio - 1) / g->chunk_ratio;
    /* Differencing files have every bitmap entry; others need entries only
     * up to the last payload block (the spec's two formulas). */
    g->bat_entries = m->has_parent
        ? g->bitmap_blocks * (g->chunk_ratio + 1)
        : g->payload_blocks + (g->payload_blocks - 1) / g->chunk_ratio;
}
