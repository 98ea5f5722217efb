/* vhd/format.c: footer and dynamic header codecs, checksums, geometry,
 * parent names and locators.  Pure functions over caller buffers. */
#include <stdio.h>
#include <stdlib.h>

#include "vhd/vhd-internal.h"

uint32_t vhd_checksum(const void *buf, size_t len, size_t csum_off)
{
    const uint8_t *b = buf;
    uint32_t sum = 0;
    for (size_t i = 0; i < len; i++)
        if (i - csum_off >= 4)          /* unsigned: false only inside the field */
            sum += b[i];
    return ~sum;
}

/* ---- footer --------------------------------------------------------------- */

static void footer_from_disk(const struct vhd_footer_disk *d,
                             struct vhd_footer *f)
{
    memset(f, 0, sizeof *f);
    memcpy(f->cookie, d->cookie, 8);
    f->features = be32toh(d->features);
    f->version = be32toh(d->version);
    f->data_offset = be64toh(d->data_offset);
    f->timestamp = be32toh(d->timestamp);
    memcpy(f->creator_app, d->creator_app, 4);
    f->creator_version = be32toh(d->creator_version);
    f->creator_os = be32toh(d->creator_os);
    f->original_size = be64toh(d->original_size);
    f->current_size = be64toh(d->current_size);
    f->cylinders = be16toh(d->cylinders);
    f->heads = d->heads;
    f->sectors = d->sectors;
    f->disk_type = be32toh(d->disk_type);
    f->checksum = be32toh(d->checksum);
    memcpy(f->uuid, d->uuid, 16);
    f->saved_state = d->saved_state;
    f->hidden = d->hidden;
    f->reserved_nonzero = !is_zero(d->reserved, sizeof d->reserved);
}

void vhd_footer_encode(const struct vhd_footer *f, void *sector)
{
    struct vhd_footer_disk d;
    memset(&d, 0, sizeof d);
    memcpy(d.cookie, f->cookie, 8);
    d.features = htobe32(f->features);
    d.version = htobe32(f->version);
    d.data_offset = htobe64(f->data_offset);
    d.timestamp = htobe32(f->timestamp);
    memcpy(d.creator_app, f->creator_app, 4);
    d.creator_version = htobe32(f->creator_version);
    d.creator_os = htobe32(f->creator_os);
    d.original_size = htobe64(f->original_size);
    d.current_size = htobe64(f->current_size);
    d.cylinders = htobe16(f->cylinders);
    d.heads = f->heads;
    d.sectors = f->sectors;
    d.disk_type = htobe32(f->disk_type);
    memcpy(d.uuid, f->uuid, 16);
    d.saved_state = f->saved_state;
    d.hidden = f->hidden;
    d.checksum = htobe32(vhd_checksum(&d, sizeof d, VHD_FOOTER_CSUM_OFF));
    memcpy(sector, &d, sizeof d);
}

bool vhd_footer_is_tap_legacy(const struct vhd_footer *f)
{
    return memcmp(f->creator_app, "tap\0", 4) == 0 &&
           (f->creator_version == 0x00000001 ||
            f->creator_version == 0x00010001);
}

/* Early tapdisk set the hidden byte without updating the checksum (libvhd
 * accepts it for creator "tap" 0.1 and 1.1). */
static bool tap_hidden_checksum_ok(const struct vhd_footer *f,
                                   const uint8_t *sector)
{
    if (!vhd_footer_is_tap_legacy(f) || f->hidden == 0)
        return false;
    return vhd_checksum(sector, 512, VHD_FOOTER_CSUM_OFF) + f->hidden ==
           f->checksum;
}

static int footer_check_checksum(struct vhd_footer *f, const uint8_t *sector,
                                 struct nbdf_err *err)
{
    uint32_t sum = vhd_checksum(sector, 512, VHD_FOOTER_CSUM_OFF);
    if (sum == f->checksum)
        return 0;
    if (tap_hidden_checksum_ok(f, sector)) {
        f->legacy_checksum = true;
        return 0;
    }
    return nbdf_errf(err, -EINVAL,
                     "footer checksum mismatch: stored 0x%08x, computed 0x%08x",
                     f->checksum, sum);
}

static int footer_check_size(const struct vhd_footer *f, struct nbdf_err *err)
{
    if (f->current_size == 0)
        return nbdf_errf(err, -EINVAL, "footer current size is 0");
    if (f->current_size % VHD_SECTOR)
        return nbdf_errf(err, -EINVAL,
                         "footer current size %llu is not a multiple of 512",
                         (unsigned long long) f->current_size);
    if (f->current_size > VHD_MAX_SIZE)
        return nbdf_errf(err, -EFBIG,
                         "footer current size %llu exceeds the VHD limit of "
                         "2040 GiB (%llu bytes)",
                         (unsigned long long) f->current_size,
                         (unsigned long long) VHD_MAX_SIZE);
    return 0;
}

static int footer_check_dynamic(const struct vhd_footer *f,
                                struct nbdf_err *err)
{
    if (f->data_offset == UINT64_MAX || f->data_offset < VHD_SECTOR ||
        f->data_offset % VHD_SECTOR || f->data_offset >= (1ull << 42))
        return nbdf_errf(err, -EINVAL,
                         "footer data offset 0x%llx is not a valid dynamic "
                         "header offset (512-aligned, >= 512)",
                         (unsigned long long) f->data_offset);
    if (memcmp(f->creator_app, "tap\0", 4) == 0 &&
        f->creator_version == 0x00000001)
        return nbdf_errf(err, -EINVAL,
                         "creator tap 0.1: sector bitmaps use an unknown bit "
                         "order, refusing to guess");
    return 0;
}

int vhd_footer_decode(const void *sector, struct vhd_footer *f,
                      struct nbdf_err *err)
{
    footer_from_disk(sector, f);
    if (memcmp(f->cookie, VHD_COOKIE_POISON, 8) == 0)
        return nbdf_errf(err, -EINVAL,
                         "footer cookie is \"v_poison\": blktap left a "
                         "metadata change unfinished, the file is unusable");
    if (memcmp(f->cookie, VHD_COOKIE_FOOTER, 8) != 0)
        return nbdf_errf(err, -EINVAL, "bad footer cookie (want \"conectix\")");
    int r = footer_check_checksum(f, sector, err);
    if (r < 0)
        return r;
    if (f->version >> 16 != 1)
        return nbdf_errf(err, -EINVAL, "unsupported footer format version 0x%08x",
                         f->version);
    if (f->disk_type != VHD_FIXED && f->disk_type != VHD_DYNAMIC &&
        f->disk_type != VHD_DIFF)
        return nbdf_errf(err, -EINVAL,
                         "unsupported disk type %u (want 2 fixed, 3 dynamic or "
                         "4 differencing)", f->disk_type);
    if ((r = footer_check_size(f, err)) < 0)
        return r;
    if (f->disk_type != VHD_FIXED)
        return footer_check_dynamic(f, err);
    return 0;
}

/* ---- dynamic header ------------------------------------------------------ */

/* libvhd: a data space below 512 counts sectors, otherwise bytes (Windows
 * writers store bytes); 0 if bytes that are not whole sectors. */
static uint64_t locator_space_bytes(uint32_t space)
{
    if (space < 512)
        return (uint64_t) space * VHD_SECTOR;
    return space % VHD_SECTOR ? 0 : space;
}

static void header_from_disk(const struct vhd_header_disk *d,
                             struct vhd_header *h)
{
    memset(h, 0, sizeof *h);
    memcpy(h->cookie, d->cookie, 8);
    h->data_offset = be64toh(d->data_offset);
    h->table_offset = be64toh(d->table_offset);
    h->version = be32toh(d->version);
    h->max_entries = be32toh(d->max_entries);
    h->block_size = be32toh(d->block_size);
    h->checksum = be32toh(d->checksum);
    memcpy(h->parent_uuid, d->parent_uuid, 16);
    h->parent_timestamp = be32toh(d->parent_timestamp);
    h->reserved1 = be32toh(d->reserved1);
    memcpy(h->parent_name, d->parent_name, 512);
    for (int i = 0; i < 8; i++) {
        struct vhd_locator *l = &h->loc[i];
        l->code = be32toh(d->loc[i].code);
        l->data_space = be32toh(d->loc[i].data_space);
        l->data_length = be32toh(d->loc[i].data_length);
        l->reserved = be32toh(d->loc[i].reserved);
        l->data_offset = be64toh(d->loc[i].data_offset);
        l->space_bytes = locator_space_bytes(l->data_space);
    }
    h->reserved_nonzero = !is_zero(d->reserved2, sizeof d->reserved2);
}

void vhd_header_encode(const struct vhd_header *h, void *buf)
{
    struct vhd_header_disk d;
    memset(&d, 0, sizeof d);
    memcpy(d.cookie, h->cookie, 8);
    d.data_offset = htobe64(h->data_offset);
    d.table_offset = htobe64(h->table_offset);
    d.version = htobe32(h->version);
    d.max_entries = htobe32(h->max_entries);
    d.block_size = htobe32(h->block_size);
    memcpy(d.parent_uuid, h->parent_uuid, 16);
    d.parent_timestamp = htobe32(h->parent_timestamp);
    d.reserved1 = htobe32(h->reserved1);
    memcpy(d.parent_name, h->parent_name, 512);
    for (int i = 0; i < 8; i++) {
        d.loc[i].code = htobe32(h->loc[i].code);
        d.loc[i].data_space = htobe32(h->loc[i].data_space);
        d.loc[i].data_length = htobe32(h->loc[i].data_length);
        d.loc[i].reserved = htobe32(h->loc[i].reserved);
        d.loc[i].data_offset = htobe64(h->loc[i].data_offset);
    }
    d.checksum = htobe32(vhd_checksum(&d, sizeof d, VHD_HEADER_CSUM_OFF));
    memcpy(buf, &d, sizeof d);
}

int vhd_header_decode(const void *buf, struct vhd_header *h,
                      struct nbdf_err *err)
{
    header_from_disk(buf, h);
    if (memcmp(h->cookie, VHD_COOKIE_HEADER, 8) != 0)
        return nbdf_errf(err, -EINVAL,
                         "bad dynamic header cookie (want \"cxsparse\")");
    uint32_t sum = vhd_checksum(buf, VHD_HEADER_SIZE, VHD_HEADER_CSUM_OFF);
    if (sum != h->checksum)
        return nbdf_errf(err, -EINVAL,
                         "dynamic header checksum mismatch: stored 0x%08x, "
                         "computed 0x%08x", h->checksum, sum);
    if (h->version != VHD_VERSION)
        return nbdf_errf(err, -EINVAL,
                         "unsupported dynamic header version 0x%08x", h->version);
    if (!IS_POWER_OF_2(h->block_size) || h->block_size < VHD_SECTOR ||
        h->block_size > VHD_BLOCK_SIZE_MAX)
        return nbdf_errf(err, -EINVAL,
                         "block size %u is not a power of two in [512, %u]",
                         h->block_size, VHD_BLOCK_SIZE_MAX);
    return 0;
}

/* ---- header against footer ------------------------------------------------ */

static bool locator_is_known(uint32_t code)
{
    switch (code) {
    case VHD_PLAT_WI2R: case VHD_PLAT_WI2K: case VHD_PLAT_W2RU:
    case VHD_PLAT_W2KU: case VHD_PLAT_MAC: case VHD_PLAT_MACX:
        return true;
    }
    return false;
}

static int locator_check(const struct vhd_locator *l, int i,
                         struct nbdf_err *err)
{
    if (l->code == VHD_PLAT_NONE) {
        if (l->data_space || l->data_length || l->reserved || l->data_offset)
            return nbdf_errf(err, -EINVAL,
                             "parent locator %d: platform code 0 but entry "
                             "not zero", i);
        return 0;
    }
    if (!locator_is_known(l->code))
        return nbdf_errf(err, -EINVAL,
                         "parent locator %d: unknown platform code 0x%08x",
                         i, l->code);
    if (l->reserved)
        return nbdf_errf(err, -EINVAL, "parent locator %d: reserved field set", i);
    if (!l->data_offset || !l->data_length || !l->space_bytes)
        return nbdf_errf(err, -EINVAL,
                         "parent locator %d: zero data offset, length or "
                         "space (or space %u is not whole sectors)",
                         i, l->data_space);
    if (l->data_length > l->space_bytes ||
        l->data_length > VHD_MAX_LOCATOR_LEN)
        return nbdf_errf(err, -EINVAL,
                         "parent locator %d: length %u exceeds its space %llu "
                         "or the %u-byte cap", i, l->data_length,
                         (unsigned long long) l->space_bytes,
                         VHD_MAX_LOCATOR_LEN);
    if (l->data_offset >= (1ull << 42))
        return nbdf_errf(err, -EINVAL, "parent locator %d: offset 0x%llx "
                         "out of range", i,
                         (unsigned long long) l->data_offset);
    return 0;
}

static int header_check_parent_fields(const struct vhd_footer *f,
                                      const struct vhd_header *h,
                                      struct nbdf_err *err)
{
    if (f->disk_type == VHD_DYNAMIC) {
        bool loc_zero = true;
        for (int i = 0; i < 8; i++)
            loc_zero &= h->loc[i].code == 0 && h->loc[i].data_offset == 0 &&
                        h->loc[i].data_length == 0 && h->loc[i].data_space == 0;
        if (!is_zero(h->parent_uuid, 16) || h->parent_timestamp ||
            !is_zero(h->parent_name, 512) || !loc_zero)
            return nbdf_errf(err, -EINVAL,
                             "dynamic disk has parent fields set (id, "
                             "timestamp, name or locators)");
        return 0;
    }
    for (int i = 0; i < 8; i++) {
        int r = locator_check(&h->loc[i], i, err);
        if (r < 0)
            return r;
    }
    return 0;
}

static int header_check_bat(const struct vhd_footer *f,
                            const struct vhd_header *h, struct nbdf_err *err)
{
    uint64_t needed = (f->current_size + h->block_size - 1) / h->block_size;
    uint64_t cap = (VHD_MAX_SIZE + h->block_size - 1) / h->block_size;
    if (h->max_entries < needed)
        return nbdf_errf(err, -EINVAL,
                         "BAT has %u entries but a disk of %llu bytes needs "
                         "%llu blocks of %u", h->max_entries,
                         (unsigned long long) f->current_size,
                         (unsigned long long) needed, h->block_size);
    if (h->max_entries > cap)
        return nbdf_errf(err, -EINVAL,
                         "BAT has %u entries, more than the %llu a 2040 GiB "
                         "disk needs with %u-byte blocks", h->max_entries,
                         (unsigned long long) cap, h->block_size);
    if (needed > VHD_MAX_BAT_ENTRIES)
        return nbdf_errf(err, -EFBIG,
                         "%llu BAT entries exceed the memory cap of %u",
                         (unsigned long long) needed, VHD_MAX_BAT_ENTRIES);
    uint64_t bat_bytes = ROUND_UP(4ull * h->max_entries, VHD_SECTOR);
    if (h->table_offset % VHD_SECTOR || h->table_offset < VHD_SECTOR ||
        h->table_offset >= (1ull << 42))
        return nbdf_errf(err, -EINVAL,
                         "BAT offset 0x%llx is not 512-aligned or overlaps "
                         "the footer copy", (unsigned long long) h->table_offset);
    if (vhd_ranges_overlap(h->table_offset, bat_bytes, f->data_offset,
                           VHD_HEADER_SIZE))
        return nbdf_errf(err, -EINVAL,
                         "BAT [0x%llx, +%llu) overlaps the dynamic header at "
                         "0x%llx", (unsigned long long) h->table_offset,
                         (unsigned long long) bat_bytes,
                         (unsigned long long) f->data_offset);
    return 0;
}

int vhd_header_check(const struct vhd_footer *f, const struct vhd_header *h,
                     struct nbdf_err *err)
{
    if (f->disk_type == VHD_FIXED)
        return nbdf_errf(err, -EINVAL, "fixed disk has no dynamic header");
    int r = header_check_bat(f, h, err);
    if (r < 0)
        return r;
    return header_check_parent_fields(f, h, err);
}

void vhd_layout_from(const struct vhd_footer *f, const struct vhd_header *h,
                     struct vhd_layout *l)
{
    memset(l, 0, sizeof *l);
    l->size = f->current_size;
    l->block_size = h->block_size;
    l->spb = h->block_size / VHD_SECTOR;
    l->bitmap_bytes = ROUND_UP((l->spb + 7) / 8, VHD_SECTOR);
    l->nblocks = (f->current_size + h->block_size - 1) / h->block_size;
    l->header_off = f->data_offset;
    l->bat_off = h->table_offset;
    l->bat_bytes = ROUND_UP(4ull * h->max_entries, VHD_SECTOR);
    l->meta_end = l->header_off + VHD_HEADER_SIZE;
    if (l->bat_off + l->bat_bytes > l->meta_end)
        l->meta_end = l->bat_off + l->bat_bytes;
}

/* ---- warnings --------------------------------------------------------------- */

static int warn(vhd_warn_fn fn, void *opaque, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int warn(vhd_warn_fn fn, void *opaque, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (fn)
        fn(opaque, msg);
    return 1;
}

static int lint_footer(const struct vhd_footer *f, vhd_warn_fn fn, void *o)
{
    int n = 0;
    if (!(f->features & VHD_FEATURE_RESERVED))
        n += warn(fn, o, "footer features 0x%08x lack the reserved bit 1",
                  f->features);
    if (f->features & ~3u)
        n += warn(fn, o, "footer features 0x%08x has unknown bits", f->features);
    if (f->reserved_nonzero)
        n += warn(fn, o, "footer reserved bytes are not zero");
    if (f->saved_state)
        n += warn(fn, o, "footer saved-state flag is set");
    if (f->legacy_checksum)
        n += warn(fn, o, "footer checksum only matches with the hidden byte "
                  "ignored (early tapdisk)");
    if (f->disk_type == VHD_FIXED && f->data_offset != UINT64_MAX)
        n += warn(fn, o, "fixed disk data offset 0x%llx is not all-ones",
                  (unsigned long long) f->data_offset);
    uint16_t c; uint8_t h, s;
    vhd_geometry(f->current_size, &c, &h, &s);
    if (c != f->cylinders || h != f->heads || s != f->sectors)
        n += warn(fn, o, "geometry %u/%u/%u differs from %u/%u/%u computed "
                  "from the size", f->cylinders, f->heads, f->sectors, c, h, s);
    return n;
}

int vhd_lint(const struct vhd_footer *f, const struct vhd_header *h,
             vhd_warn_fn fn, void *o)
{
    int n = lint_footer(f, fn, o);
    if (!h)
        return n;
    if (h->data_offset != UINT64_MAX)
        n += warn(fn, o, "dynamic header data offset 0x%llx is not all-ones",
                  (unsigned long long) h->data_offset);
    if (h->reserved1 || h->reserved_nonzero)
        n += warn(fn, o, "dynamic header reserved bytes are not zero");
    if (f->disk_type == VHD_DIFF && is_zero(h->parent_uuid, 16))
        n += warn(fn, o, "differencing disk has a zero parent id (raw parent)");
    return n;
}

/* ---- geometry and sizes ----------------------------------------------------- */

void vhd_geometry(uint64_t size, uint16_t *cyl, uint8_t *heads, uint8_t *spt)
{
    uint64_t total = size / VHD_SECTOR, cth;
    uint32_t s, h;
    if (total > 65535ull * 16 * 255)
        total = 65535ull * 16 * 255;
    if (total >= 65535ull * 16 * 63) {
        s = 255; h = 16; cth = total / s;
    } else {
        s = 17; cth = total / s;
        h = (cth + 1023) / 1024;
        if (h < 4)
            h = 4;
        if (cth >= h * 1024ull || h > 16) {
            s = 31; h = 16; cth = total / s;
        }
        if (cth >= h * 1024ull) {
            s = 63; h = 16; cth = total / s;
        }
    }
    *cyl = cth / h;
    *heads = h;
    *spt = s;
}

uint64_t vhd_qemu_size(const struct vhd_footer *f)
{
    /* [5]: room for the literals' NUL (GCC 15 warns of a dropped one);
     * four bytes are compared. */
    static const char trusted[][5] = { "win ", "qem2", "d2v ", "CTXS",
                                       { 't', 'a', 'p', 0 } };
    for (size_t i = 0; i < sizeof trusted / sizeof trusted[0]; i++)
        if (memcmp(f->creator_app, trusted[i], 4) == 0)
            return f->current_size;
    if (f->cylinders == 65535 && f->heads == 16 && f->sectors == 255)
        return f->current_size;
    return (uint64_t) f->cylinders * f->heads * f->sectors * VHD_SECTOR;
}

uint64_t vhd_qemu10_size(const struct vhd_footer *f)
{
    if ((memcmp(f->creator_app, "vpc ", 4) != 0 &&
         memcmp(f->creator_app, "qemu", 4) != 0) ||
        (f->cylinders == 65535 && f->heads == 16 && f->sectors == 255))
        return f->current_size;
    return (uint64_t) f->cylinders * f->heads * f->sectors * VHD_SECTOR;
}

/* ---- strings -------------------------------------------------------------- */

static int put_utf8(uint32_t cp, char *out, size_t outlen, size_t *n)
{
    uint8_t b[4];
    size_t k;
    if (cp < 0x80) { b[0] = cp; k = 1; }
    else if (cp < 0x800) { b[0] = 0xC0 | cp >> 6; b[1] = 0x80 | (cp & 0x3F); k = 2; }
    else if (cp < 0x10000) {
        b[0] = 0xE0 | cp >> 12; b[1] = 0x80 | ((cp >> 6) & 0x3F);
        b[2] = 0x80 | (cp & 0x3F); k = 3;
    } else {
        b[0] = 0xF0 | cp >> 18; b[1] = 0x80 | ((cp >> 12) & 0x3F);
        b[2] = 0x80 | ((cp >> 6) & 0x3F); b[3] = 0x80 | (cp & 0x3F); k = 4;
    }
    if (*n + k + 1 > outlen)
        return -ENAMETOOLONG;
    memcpy(out + *n, b, k);
    *n += k;
    return 0;
}

int vhd_utf16_to_utf8(const uint8_t *in, size_t inlen, bool be, char *out,
                      size_t outlen)
{
    size_t n = 0;
    if (outlen == 0)
        return -ENAMETOOLONG;
    for (size_t i = 0; i + 1 < inlen; i += 2) {
        uint32_t u = be ? (in[i] << 8 | in[i + 1]) : (in[i + 1] << 8 | in[i]);
        if (u == 0)
            break;
        if (u >= 0xDC00 && u <= 0xDFFF)
            return -EILSEQ;
        if (u >= 0xD800 && u <= 0xDBFF) {
            if (i + 3 >= inlen)
                return -EILSEQ;
            uint32_t lo = be ? (in[i + 2] << 8 | in[i + 3])
                             : (in[i + 3] << 8 | in[i + 2]);
            if (lo < 0xDC00 || lo > 0xDFFF)
                return -EILSEQ;
            u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
            i += 2;
        }
        int r = put_utf8(u, out, outlen, &n);
        if (r < 0)
            return r;
    }
    out[n] = 0;
    return n;
}

int vhd_parent_name(const struct vhd_header *h, char *out, size_t outlen)
{
    return vhd_utf16_to_utf8(h->parent_name, sizeof h->parent_name, true,
                             out, outlen);
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* "file://./x.vhd" -> "./x.vhd"; %XX decoded; NUL padding ends it. */
static int macx_path(const char *p, size_t len, char *out, size_t outlen,
                     struct nbdf_err *err)
{
    size_t n = 0;
    if (len >= 7 && memcmp(p, "file://", 7) == 0) {
        p += 7;
        len -= 7;
    }
    for (size_t i = 0; i < len && p[i]; i++) {
        char c = p[i];
        if (c == '%') {
            int hi = i + 2 < len ? hexval(p[i + 1]) : -1;
            int lo = hi >= 0 ? hexval(p[i + 2]) : -1;
            if (lo < 0 || (hi == 0 && lo == 0))
                return nbdf_errf(err, -EINVAL, "MacX locator: bad %% escape");
            c = hi << 4 | lo;
            i += 2;
        }
        if (n + 2 > outlen)
            return nbdf_errf(err, -ENAMETOOLONG, "locator path too long");
        out[n++] = c;
    }
    out[n] = 0;
    return n;
}

int vhd_locator_path(const struct vhd_locator *l, const void *payload,
                     size_t len, char *out, size_t outlen,
                     struct nbdf_err *err)
{
    if (len > l->data_length)
        len = l->data_length;
    if (len == 0 || is_zero(payload, len))
        return nbdf_errf(err, -ENOENT, "locator payload is empty");
    if (l->code == VHD_PLAT_MACX)
        return macx_path(payload, len, out, outlen, err);
    if (l->code != VHD_PLAT_W2RU && l->code != VHD_PLAT_W2KU)
        return nbdf_errf(err, -ENOTSUP, "locator code 0x%08x has no path",
                         l->code);
    int r = vhd_utf16_to_utf8(payload, len, false, out, outlen);
    if (r < 0)
        return nbdf_errf(err, r, "locator: bad UTF-16LE path");
    for (int i = 0; i < r; i++)
        if (out[i] == '\\')
            out[i] = '/';
    return r;
}
