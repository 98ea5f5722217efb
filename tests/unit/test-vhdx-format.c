/* tests/unit/test-vhdx-format.c: the header section's rules (vhdx/format.c)
 * on their own: CRC-32C, the file identifier, the two headers and which one
 * is current, the region table and the metadata region, on a VHDX that
 * qemu-img makes here and on copies of it damaged one rule at a time
 * (checksums made right again, so that the rule itself is what refuses).
 * The stream decoder's use of them is test-vhdx-stream.c's.  A missing
 * tool is a failure, not a skip. */
#undef NDEBUG
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "vhdx/vhdx.h"
#include "test-util.h"

#define DISK (64ull << 20)

/* Item GUID of the file parameters (the metadata table, little-endian
 * fields as stored). */
static const uint8_t G_PARAMS[16] = { 0x37, 0x67, 0xA1, 0xCA, 0x36, 0xFA,
                                      0x43, 0x4D, 0xB3, 0xB6, 0x33, 0xF0,
                                      0xAA, 0x44, 0xE7, 0x6B };

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t) p[0] | (uint32_t) p[1] << 8 | (uint32_t) p[2] << 16 |
           (uint32_t) p[3] << 24;
}

static uint64_t le64(const uint8_t *p)
{
    return le32(p) | (uint64_t) le32(p + 4) << 32;
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t) (v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    put32(p, (uint32_t) v);
    put32(p + 4, (uint32_t) (v >> 32));
}

/* The checksum at offset 4 of a len-byte structure, made right. */
static void fix_crc(uint8_t *p, size_t len)
{
    put32(p + 4, 0);
    put32(p + 4, vhdx_crc32c(0, p, len));
}

static void test_crc(void)
{
    /* The CRC-32C check value (RFC 3720, B.4). */
    CHECK(vhdx_crc32c(0, "123456789", 9) == 0xE3069283u);
    CHECK(vhdx_crc32c(vhdx_crc32c(0, "1234", 4), "56789", 5) == 0xE3069283u);
    printf("ok CRC-32C check value, in pieces too\n");
}

static void test_file_id(const uint8_t *f)
{
    struct nbdf_err e = { "" };
    CHECK(vhdx_file_id_check(f, 8, &e) == 0);
    CHECK(vhdx_file_id_check(f, 7, &e) == -EINVAL);
    CHECK(vhdx_file_id_check("QFI\xfb\0\0\0\3", 8, &e) == -EINVAL);
    CHECK(strstr(e.msg, "not a VHDX file"));
    printf("ok file identifier\n");
}

static int header(const uint8_t *f, size_t at, void (*spoil)(uint8_t *),
                  struct vhdx_header *h, struct nbdf_err *e)
{
    uint8_t b[VHDX_HEADER_BYTES];
    memcpy(b, f + at, sizeof b);
    if (spoil) {
        spoil(b);
        fix_crc(b, sizeof b);
    }
    return vhdx_header_decode(b, h, e);
}

static void h_version(uint8_t *b) { b[66] = 2; }
static void h_log_align(uint8_t *b) { put64(b + 72, le64(b + 72) + 4096); }
static void h_log_in_section(uint8_t *b) { put64(b + 72, 0); }
static void h_guid_no_log(uint8_t *b) { b[48] = 1; put32(b + 68, 0); }
static void h_log_version(uint8_t *b) { b[48] = 1; b[64] = 1; }
static void h_signature(uint8_t *b) { b[0] = 'H'; }

static void test_headers(const uint8_t *f)
{
    struct nbdf_err e = { "" };
    struct vhdx_header h1, h2, h;

    CHECK(header(f, VHDX_HEADER1_OFF, NULL, &h1, &e) == 0);
    CHECK(header(f, VHDX_HEADER2_OFF, NULL, &h2, &e) == 0);
    CHECK(h1.version == 1 && !h1.log_pending && h1.log_offset >= VHDX_MiB &&
          h1.log_length % VHDX_MiB == 0 && h1.seq != h2.seq);
    /* The current one: the larger sequence number, either copy alone. */
    int cur = vhdx_header_pick(&h1, &h2, &e);
    CHECK(cur == (h1.seq >= h2.seq ? 1 : 2));
    CHECK(vhdx_header_pick(NULL, &h2, &e) == 2);
    CHECK(vhdx_header_pick(&h1, NULL, &e) == 1);
    CHECK(vhdx_header_pick(NULL, NULL, &e) == -EINVAL);
    CHECK(strstr(e.msg, "neither header"));
    h = h1;
    h.seq = h2.seq + 1;
    CHECK(vhdx_header_pick(&h, &h2, &e) == 1);

    static const struct {
        void (*spoil)(uint8_t *);
        int code;
        const char *needle;
    } bad[] = {
        { h_version, -ENOTSUP, "version 2" },
        { h_log_align, -EINVAL, "not 1 MiB multiples" },
        { h_log_in_section, -EINVAL, "overlaps the header section" },
        { h_guid_no_log, -EINVAL, "a log GUID but no log" },
        { h_log_version, -ENOTSUP, "log version 1" },
        { h_signature, -EINVAL, "signature" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        e.msg[0] = '\0';
        int r = header(f, VHDX_HEADER1_OFF, bad[i].spoil, &h, &e);
        if (r != bad[i].code || !strstr(e.msg, bad[i].needle)) {
            fprintf(stderr, "header case %zu: %d \"%s\", wanted \"%s\"\n", i,
                    r, e.msg, bad[i].needle);
            abort();
        }
        printf("ok header refused: %s\n", e.msg);
    }
    /* A checksum that does not match: the CRC names both values. */
    uint8_t b[VHDX_HEADER_BYTES];
    memcpy(b, f + VHDX_HEADER1_OFF, sizeof b);
    b[100] ^= 1;
    CHECK(vhdx_header_decode(b, &h, &e) == -EINVAL && strstr(e.msg, "CRC-32C"));
    printf("ok header refused: %s\n", e.msg);
}

/* Entry i of a region table (qemu-img writes two: the BAT, the metadata). */
static uint8_t *entry(uint8_t *t, unsigned i) { return t + 16 + 32 * i; }

static int regions(const uint8_t *f, void (*spoil)(uint8_t *),
                   struct vhdx_regions *r, struct nbdf_err *e)
{
    uint8_t *t = malloc(VHDX_REGION_BYTES);
    memcpy(t, f + VHDX_REGION1_OFF, VHDX_REGION_BYTES);
    if (spoil) {
        spoil(t);
        fix_crc(t, VHDX_REGION_BYTES);
    }
    int rc = vhdx_region_table_decode(t, r, e);
    free(t);
    return rc;
}

static void r_no_first(uint8_t *t)
{
    entry(t, 0)[0] ^= 0xFF;                  /* an unknown optional region */
    put32(entry(t, 0) + 28, 0);
}
static void r_required(uint8_t *t)
{
    memmove(entry(t, 1), entry(t, 0), 64);
    memset(entry(t, 0), 0x77, 16);
    put32(entry(t, 0) + 28, 1);
    put32(t + 8, le32(t + 8) + 1);
}
static void r_twice(uint8_t *t) { memcpy(entry(t, 1), entry(t, 0), 32); }
static void r_unaligned(uint8_t *t) { put64(entry(t, 0) + 16, 3 * VHDX_MiB + 512); }
static void r_in_section(uint8_t *t) { put64(entry(t, 0) + 16, 0); }
static void r_overlap(uint8_t *t)
{
    memcpy(entry(t, 0) + 16, entry(t, 1) + 16, 12);
}
static void r_count(uint8_t *t) { put32(t + 8, VHDX_REGION_MAX_ENTRIES + 1); }

static void test_regions(const uint8_t *f, size_t len, struct vhdx_regions *out)
{
    struct nbdf_err e = { "" };
    struct vhdx_regions r;

    CHECK(regions(f, NULL, out, &e) == 0);
    CHECK(out->bat.off >= VHDX_HEADER_SECTION && out->bat.off % VHDX_MiB == 0);
    CHECK(out->meta.off >= VHDX_HEADER_SECTION && out->meta.len >= VHDX_MiB);
    CHECK(out->meta.off + out->meta.len <= len && out->bat.off + 8 <= len);
    /* The second copy says the same. */
    CHECK(vhdx_region_table_decode(f + VHDX_REGION2_OFF, &r, &e) == 0);
    CHECK(memcmp(&r, out, sizeof r) == 0);
    static const struct {
        void (*spoil)(uint8_t *);
        int code;
        const char *needle;
    } bad[] = {
        { r_no_first, -EINVAL, "no " },
        { r_required, -ENOTSUP, "required region" },
        { r_twice, -EINVAL, "two " },
        { r_unaligned, -EINVAL, "1 MiB" },
        { r_in_section, -EINVAL, "inside the header section" },
        { r_overlap, -EINVAL, "overlap" },
        { r_count, -EINVAL, "entries (at most 2047)" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        e.msg[0] = '\0';
        int rc = regions(f, bad[i].spoil, &r, &e);
        if (rc != bad[i].code || !strstr(e.msg, bad[i].needle)) {
            fprintf(stderr, "region case %zu: %d \"%s\", wanted \"%s\"\n", i,
                    rc, e.msg, bad[i].needle);
            abort();
        }
        printf("ok region table refused: %s\n", e.msg);
    }
}

/* The file parameters item's value in the metadata region m. */
static uint8_t *params(uint8_t *m)
{
    uint16_t n = (uint16_t) (m[10] | m[11] << 8);
    for (unsigned i = 0; i < n; i++) {
        uint8_t *e = m + 32 + 32 * i;
        if (memcmp(e, G_PARAMS, 16) == 0)
            return m + le32(e + 16);
    }
    CHECK(!"no file parameters item");
    return NULL;
}

static int meta(const uint8_t *f, const struct vhdx_regions *rg,
                void (*spoil)(uint8_t *), struct vhdx_meta *out,
                struct nbdf_err *e)
{
    uint8_t *m = malloc(rg->meta.len);
    memcpy(m, f + rg->meta.off, rg->meta.len);
    if (spoil)
        spoil(m);
    int r = vhdx_metadata_decode(m, rg->meta.len, out, e);
    free(m);
    return r;
}

static void m_block_3m(uint8_t *m) { put32(params(m), 3 * VHDX_MiB); }
static void m_block_512m(uint8_t *m) { put32(params(m), 512 * VHDX_MiB); }
static void m_parent(uint8_t *m) { params(m)[4] |= 2; }
static void m_signature(uint8_t *m) { m[0] = 'M'; }
static void m_no_params(uint8_t *m)
{
    uint16_t n = (uint16_t) (m[10] | m[11] << 8);
    for (unsigned i = 0; i < n; i++)
        if (memcmp(m + 32 + 32 * i, G_PARAMS, 16) == 0) {
            m[32 + 32 * i] ^= 0xFF;   /* now an unknown item ... */
            put32(m + 32 + 32 * i + 24, 0);   /* ... and optional */
        }
}

static void test_meta(const uint8_t *f, const struct vhdx_regions *rg)
{
    struct nbdf_err e = { "" };
    struct vhdx_meta m;

    CHECK(meta(f, rg, NULL, &m, &e) == 0);
    CHECK(m.disk_size == DISK && m.block_size == VHDX_MiB * 8);
    CHECK(m.logical_sector == 512 && !m.has_parent);
    CHECK(!m.leave_blocks_allocated && m.parent_pairs == 0);
    struct vhdx_geom g;
    vhdx_geom(&m, &g);
    CHECK(g.payload_blocks == DISK / (8 * VHDX_MiB));
    CHECK(g.chunk_ratio == (1ull << 23) * 512 / (8 * VHDX_MiB));
    CHECK(g.bat_entries >= g.payload_blocks);
    printf("ok metadata: %llu bytes, %u-byte blocks, chunk ratio %llu\n",
           (unsigned long long) m.disk_size, m.block_size,
           (unsigned long long) g.chunk_ratio);
    static const struct {
        void (*spoil)(uint8_t *);
        const char *needle;
    } bad[] = {
        { m_block_3m, "not a power of 2" },
        { m_block_512m, "not a power of 2" },
        { m_parent, "without a parent locator" },
        { m_signature, "metadata" },
        { m_no_params, "no file parameters item" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        e.msg[0] = '\0';
        int rc = meta(f, rg, bad[i].spoil, &m, &e);
        if (rc >= 0 || !strstr(e.msg, bad[i].needle)) {
            fprintf(stderr, "metadata case %zu: %d \"%s\", wanted \"%s\"\n",
                    i, rc, e.msg, bad[i].needle);
            abort();
        }
        printf("ok metadata refused: %s\n", e.msg);
    }
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    snprintf(dir, sizeof dir, "/tmp/vhdx-test-XXXXXX");
    CHECK(mkdtemp(dir));
    sh("cd %s && qemu-img create -q -f vhdx -o block_size=8M,subformat=dynamic "
       "f.vhdx %llu", dir, (unsigned long long) DISK);
    size_t len;
    uint8_t *f = load("f.vhdx", &len);
    CHECK(len >= 4 * VHDX_MiB);

    struct vhdx_regions rg;
    test_crc();
    test_file_id(f);
    test_headers(f);
    test_regions(f, len, &rg);
    test_meta(f, &rg);
    free(f);
    sh("rm -rf %s", dir);
    printf("test-vhdx-format: ok\n");
    return 0;
}
