/* tests/unit/test-vhd-format.c: footer/header codecs, checksums, geometry,
 * locators, and every validation rule broken on purpose, through the image
 * parser and the stream decoder (which must refuse before touching the
 * disk). */
#undef NDEBUG
#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vhd-util.h"

#define MiB (1ull << 20)

static uint8_t *qemu_file, *tapdyn_file, *tapdiff_file, *delta_file, *fixed_file;
static size_t qemu_len, tapdyn_len, tapdiff_len, delta_len, fixed_len;

static void expect_err(int r, int want, const struct nbdf_err *e,
                       const char *needle, const char *label)
{
    printf("%-34s -> %d %s\n", label, r, e->msg);
    if (r != want || !strstr(e->msg, needle)) {
        fprintf(stderr, "%s: want %d containing \"%s\", got %d \"%s\"\n",
                label, want, needle, r, e->msg);
        abort();
    }
}

/* ---- footer -------------------------------------------------------------- */

static void test_footer_decode(void)
{
    struct vhd_footer f;
    struct nbdf_err e = { "" };
    CHECK(vhd_footer_decode(qemu_file, &f, &e) == 0);
    CHECK(memcmp(f.creator_app, "qemu", 4) == 0);
    CHECK(f.creator_version == 0x00050003 && f.creator_os == 0x5769326B);
    CHECK(f.current_size == 10514432 && f.disk_type == VHD_DYNAMIC);
    CHECK(f.cylinders == 302 && f.heads == 4 && f.sectors == 17);
    CHECK(f.data_offset == 512 && f.features == 2 && f.version == 0x10000);
    CHECK(f.checksum == vhd_checksum(qemu_file, 512, 64));
    uint8_t again[512];
    vhd_footer_encode(&f, again);
    CHECK(memcmp(again, qemu_file, 512) == 0);      /* round trip */

    CHECK(vhd_footer_decode(fixed_file + fixed_len - 512, &f, &e) == 0);
    CHECK(f.disk_type == VHD_FIXED && f.data_offset == UINT64_MAX);
    CHECK(f.current_size == 8 * MiB && memcmp(f.creator_app, "tap", 4) == 0);
    CHECK(vhd_lint(&f, NULL, NULL, NULL) == 0);

    /* an all-zero structure never passes */
    static const uint8_t zero[512];
    CHECK(vhd_footer_decode(zero, &f, &e) == -EINVAL);
}

typedef void (*footer_patch)(struct vhd_footer *f);
static void p_version(struct vhd_footer *f) { f->version = 0x00020000; }
static void p_type0(struct vhd_footer *f) { f->disk_type = 0; }
static void p_type1(struct vhd_footer *f) { f->disk_type = 1; }
static void p_type5(struct vhd_footer *f) { f->disk_type = 5; }
static void p_size0(struct vhd_footer *f) { f->current_size = 0; }
static void p_size_odd(struct vhd_footer *f) { f->current_size += 100; }
static void p_size_huge(struct vhd_footer *f) { f->current_size = VHD_MAX_SIZE + 512; }
static void p_size_ovf(struct vhd_footer *f) { f->current_size = UINT64_MAX - 511; }
static void p_doff_ones(struct vhd_footer *f) { f->data_offset = UINT64_MAX; }
static void p_doff_odd(struct vhd_footer *f) { f->data_offset = 513; }
static void p_doff_zero(struct vhd_footer *f) { f->data_offset = 0; }
static void p_tap01(struct vhd_footer *f)
{
    memcpy(f->creator_app, "tap\0", 4);
    f->creator_version = 1;
}

static const struct {
    footer_patch fn;
    int err;
    const char *msg;
} footer_cases[] = {
    { p_version, -EINVAL, "format version" },
    { p_type0, -EINVAL, "disk type 0" },
    { p_type1, -EINVAL, "disk type 1" },
    { p_type5, -EINVAL, "disk type 5" },
    { p_size0, -EINVAL, "current size is 0" },
    { p_size_odd, -EINVAL, "not a multiple of 512" },
    { p_size_huge, -EFBIG, "2040 GiB" },
    { p_size_ovf, -EFBIG, "2040 GiB" },
    { p_doff_ones, -EINVAL, "data offset" },
    { p_doff_odd, -EINVAL, "data offset" },
    { p_doff_zero, -EINVAL, "data offset" },
    { p_tap01, -EINVAL, "tap 0.1" },
};

static void test_footer_rules(void)
{
    struct vhd_footer f;
    struct nbdf_err e = { "" };
    uint8_t s[512];

    memcpy(s, qemu_file, 512);
    memcpy(s, "conectiX", 8);
    expect_err(vhd_footer_decode(s, &f, &e), -EINVAL, &e, "cookie", "bad cookie");
    memcpy(s, "v_poison", 8);
    expect_err(vhd_footer_decode(s, &f, &e), -EINVAL, &e, "v_poison", "poisoned");
    memcpy(s, qemu_file, 512);
    s[100] ^= 1;
    expect_err(vhd_footer_decode(s, &f, &e), -EINVAL, &e, "checksum", "bad checksum");

    for (size_t i = 0; i < sizeof footer_cases / sizeof footer_cases[0]; i++) {
        CHECK(vhd_footer_decode(qemu_file, &f, &e) == 0);
        footer_cases[i].fn(&f);
        vhd_footer_encode(&f, s);
        char label[40];
        snprintf(label, sizeof label, "footer case %zu", i);
        expect_err(vhd_footer_decode(s, &f, &e), footer_cases[i].err, &e,
                   footer_cases[i].msg, label);
    }

    /* tapdisk legacy: hidden byte set without updating the checksum */
    CHECK(vhd_footer_decode(tapdyn_file, &f, &e) == 0);
    f.creator_version = 0x00010001;
    vhd_footer_encode(&f, s);
    s[85] = 1;
    CHECK(vhd_footer_decode(s, &f, &e) == 0 && f.legacy_checksum && f.hidden);
    CHECK(vhd_lint(&f, NULL, NULL, NULL) >= 1);
    f.creator_version = 0x00010003;                 /* not legacy: refused */
    f.hidden = 0;
    vhd_footer_encode(&f, s);
    s[85] = 1;
    expect_err(vhd_footer_decode(s, &f, &e), -EINVAL, &e, "checksum",
               "tap 1.3 hidden w/o checksum");
}

/* ---- header ------------------------------------------------------------- */

static void test_header_decode(void)
{
    struct vhd_footer f;
    struct vhd_header h;
    struct nbdf_err e = { "" };
    CHECK(vhd_footer_decode(tapdiff_file, &f, &e) == 0);
    CHECK(vhd_header_decode(tapdiff_file + 512, &h, &e) == 0);
    CHECK(vhd_header_check(&f, &h, &e) == 0);
    CHECK(h.table_offset == 1536 && h.max_entries == 32 &&
          h.block_size == 2 * MiB && h.data_offset == UINT64_MAX);
    uint8_t again[1024];
    vhd_header_encode(&h, again);
    CHECK(memcmp(again, tapdiff_file + 512, 1024) == 0);

    char name[600], path[600];
    CHECK(vhd_parent_name(&h, name, sizeof name) == 15);
    CHECK(strcmp(name, "tap-dyn-64m.vhd") == 0);
    CHECK(h.loc[0].code == VHD_PLAT_MACX && h.loc[1].code == VHD_PLAT_W2KU &&
          h.loc[2].code == VHD_PLAT_W2RU && h.loc[3].code == 0);
    CHECK(h.loc[0].space_bytes == 512);             /* 0x200: bytes */
    for (int i = 0; i < 3; i++) {
        const struct vhd_locator *l = &h.loc[i];
        int n = vhd_locator_path(l, tapdiff_file + l->data_offset,
                                 l->data_length, path, sizeof path, &e);
        CHECK(n > 0 && strcmp(path, "./tap-dyn-64m.vhd") == 0);
    }
    /* the footer uuid of the parent is the child's parent id */
    CHECK(memcmp(h.parent_uuid, tapdyn_file + 68, 16) == 0);

    /* vhd-tool delta: locator points at zeros -> ENOENT, still valid */
    CHECK(vhd_footer_decode(delta_file, &f, &e) == 0);
    CHECK(vhd_header_decode(delta_file + 512, &h, &e) == 0);
    CHECK(vhd_header_check(&f, &h, &e) == 0);
    CHECK(h.table_offset == 2048 && h.loc[0].code == VHD_PLAT_MACX &&
          h.loc[0].space_bytes == 512);
    CHECK(vhd_locator_path(&h.loc[0], delta_file + 1536, h.loc[0].data_length,
                           path, sizeof path, &e) == -ENOENT);
    CHECK(vhd_parent_name(&h, name, sizeof name) > 0);
    CHECK(strcmp(name, "./tap-dyn-64m.vhd") == 0);
}

static void test_strings(void)
{
    char out[64];
    /* "a" U+1F600 "é" in UTF-16BE */
    static const uint8_t be[] = { 0, 'a', 0xD8, 0x3D, 0xDE, 0x00, 0x00, 0xE9, 0, 0 };
    CHECK(vhd_utf16_to_utf8(be, sizeof be, true, out, sizeof out) == 7);
    CHECK(strcmp(out, "a\xF0\x9F\x98\x80\xC3\xA9") == 0);
    static const uint8_t lone[] = { 0xDE, 0x00, 0, 'a' };
    CHECK(vhd_utf16_to_utf8(lone, sizeof lone, true, out, sizeof out) == -EILSEQ);
    static const uint8_t cut[] = { 0, 'a', 0xD8, 0x3D };
    CHECK(vhd_utf16_to_utf8(cut, sizeof cut, true, out, sizeof out) == -EILSEQ);
    CHECK(vhd_utf16_to_utf8(be, sizeof be, true, out, 3) == -ENAMETOOLONG);
    struct vhd_locator l = { .code = VHD_PLAT_MACX, .data_length = 30 };
    struct nbdf_err e;
    CHECK(vhd_locator_path(&l, "file://./a%20b.vhd", 18, out, sizeof out, &e) == 9);
    CHECK(strcmp(out, "./a b.vhd") == 0);
    CHECK(vhd_locator_path(&l, "file://x%0", 10, out, sizeof out, &e) == -EINVAL);
    CHECK(vhd_locator_path(&l, "file://x%00y", 12, out, sizeof out, &e) == -EINVAL);
    l.code = VHD_PLAT_MAC;
    CHECK(vhd_locator_path(&l, "blob", 4, out, sizeof out, &e) == -ENOTSUP);
}

static void test_geometry(void)
{
    uint16_t c; uint8_t h, s;
    vhd_geometry(10514432, &c, &h, &s);
    CHECK(c == 302 && h == 4 && s == 17);
    vhd_geometry(1073995776, &c, &h, &s);           /* qemu's 1 GiB */
    CHECK((uint64_t) c * h * s * 512 == 1073995776);
    vhd_geometry(VHD_MAX_SIZE, &c, &h, &s);
    CHECK(c == 65535 && h == 16 && s == 255);
    vhd_geometry(65535ull * 16 * 63 * 512, &c, &h, &s);
    CHECK(s == 255 && h == 16);
    vhd_geometry(64 * MiB, &c, &h, &s);             /* tap-dyn-64m */
    CHECK(c == 963 && h == 8 && s == 17);
    struct vhd_footer f;
    struct nbdf_err e;
    CHECK(vhd_footer_decode(qemu_file, &f, &e) == 0);
    CHECK(vhd_qemu_size(&f) == f.current_size);     /* CHS exact */
    uint8_t caml[512];
    CHECK(vhd_footer_decode(delta_file, &f, &e) == 0);
    CHECK(vhd_qemu_size(&f) == 67055616);           /* vhd-format.md §9 */
    /* qemu 10 turned the rule round: current_size but for "vpc "/"qemu" */
    CHECK(vhd_qemu10_size(&f) == f.current_size && f.current_size == 64 * MiB);
    memcpy(f.creator_app, "win ", 4);
    vhd_footer_encode(&f, caml);
    CHECK(vhd_footer_decode(caml, &f, &e) == 0 && vhd_qemu_size(&f) == 64 * MiB);
    CHECK(vhd_qemu10_size(&f) == 64 * MiB);
    memcpy(f.creator_app, "vpc ", 4);
    CHECK(vhd_qemu_size(&f) == 67055616 && vhd_qemu10_size(&f) == 67055616);
    memcpy(f.creator_app, "qemu", 4);
    CHECK(vhd_qemu_size(&f) == 67055616 && vhd_qemu10_size(&f) == 67055616);
    f.cylinders = 65535; f.heads = 16; f.sectors = 255;     /* maximal */
    CHECK(vhd_qemu10_size(&f) == 64 * MiB);
}

/* ---- whole files broken on purpose --------------------------------------- */

struct mut {
    uint8_t *f;
    size_t len;
};

static struct mut copy_of(const uint8_t *f, size_t len)
{
    struct mut m = { malloc(len), len };
    CHECK(m.f);
    memcpy(m.f, f, len);
    return m;
}

/* Re-encode both footers / the header after editing them. */
static void edit_footers(struct mut *m, footer_patch fn)
{
    struct vhd_footer f;
    struct nbdf_err e;
    CHECK(vhd_footer_decode(m->f + m->len - 512, &f, &e) == 0);
    fn(&f);
    vhd_footer_encode(&f, m->f + m->len - 512);
    memcpy(m->f, m->f + m->len - 512, 512);
}

typedef void (*header_patch)(struct vhd_header *h);
static void edit_header(struct mut *m, header_patch fn)
{
    struct vhd_header h;
    struct nbdf_err e;
    CHECK(vhd_header_decode(m->f + 512, &h, &e) == 0);
    fn(&h);
    vhd_header_encode(&h, m->f + 512);
}

static void set_bat(struct mut *m, uint64_t bat_off, uint32_t i, uint32_t v)
{
    uint32_t be = htobe32(v);
    memcpy(m->f + bat_off + 4ull * i, &be, 4);
}

static uint32_t get_bat(const struct mut *m, uint64_t bat_off, uint32_t i)
{
    uint32_t be;
    memcpy(&be, m->f + bat_off + 4ull * i, 4);
    return be32toh(be);
}

/* Both decoders must refuse m; the stream must not have called begin(). */
static void expect_invalid(struct mut *m, int want, const char *needle,
                           const char *label, bool stream_before_begin)
{
    struct vhd_image *img;
    struct nbdf_err e = { "" };
    expect_err(vt_image_parse(m->f, m->len, &img, &e), want, &e, needle, label);

    struct vt_disk d = { .cap = 128 * MiB };
    d.buf = calloc(1, d.cap);
    struct vhd_stream *s;
    CHECK(vhd_stream_new(&vt_disk_sink, &d, &s) == 0);
    int r = 0;
    for (size_t off = 0; off < m->len && r == 0; off += 65536)
        r = vhd_stream_feed(s, off, m->f + off,
                            m->len - off < 65536 ? m->len - off : 65536);
    if (r == 0)
        r = vhd_stream_finish(s);
    struct nbdf_err se;
    snprintf(se.msg, sizeof se.msg, "%s", vhd_stream_error(s));
    char slabel[64];
    snprintf(slabel, sizeof slabel, "  (stream) %s", label);
    expect_err(r, want, &se, needle, slabel);
    if (stream_before_begin)
        CHECK(!d.began && d.data_bytes == 0 && d.zero_bytes == 0);
    CHECK(vhd_stream_feed(s, m->len, "x", 1) == r);     /* sticky */
    vhd_stream_free(s);
    free(d.buf);
    free(m->f);
}

static void h_cookie(struct vhd_header *h) { memcpy(h->cookie, "cxsparsE", 8); }
static void h_version(struct vhd_header *h) { h->version = 0x00010001; }
static void h_bs_odd(struct vhd_header *h) { h->block_size = 3 * MiB; }
static void h_bs_huge(struct vhd_header *h) { h->block_size = 1u << 31; }
static void h_bs_small(struct vhd_header *h) { h->block_size = 256; }
static void h_entries_few(struct vhd_header *h) { h->max_entries = 5; }
static void h_entries_many(struct vhd_header *h) { h->max_entries = 0xFFFFFFFF; }
static void h_table_odd(struct vhd_header *h) { h->table_offset = 1537; }
static void h_table_hdr(struct vhd_header *h) { h->table_offset = 1024; }
static void h_table_zero(struct vhd_header *h) { h->table_offset = 0; }
static void h_parent(struct vhd_header *h) { h->parent_uuid[3] = 1; }
static void h_locator(struct vhd_header *h)
{
    h->loc[0].code = VHD_PLAT_MACX;
    h->loc[0].data_offset = 1024;
}
static void h_loc_code(struct vhd_header *h) { h->loc[3].code = 0x41424344; }
static void h_loc_len(struct vhd_header *h) { h->loc[0].data_length = 513; }
static void h_loc_junk(struct vhd_header *h) { h->loc[5].data_offset = 4096; }
static void h_loc_overlap(struct vhd_header *h) { h->loc[1].data_offset = 1536; }
static void h_loc_block(struct vhd_header *h) { h->loc[2].data_offset = 0xf * 512 + 4096; }

static void test_file_rules(void)
{
    struct mut m;
    uint8_t b;

    /* footer copy / trailing footer */
    m = copy_of(qemu_file, qemu_len);
    m.f[m.len - 512 + 30] ^= 1;                 /* trailing footer checksum */
    b = 0;
    expect_invalid(&m, -EINVAL, "", "trailing footer corrupt", false);
    m = copy_of(qemu_file, qemu_len);
    m.f[5] = 'X';       /* no cookie: the stream takes it for fixed data */
    expect_invalid(&m, -EINVAL, "", "footer copy cookie", false);
    m = copy_of(qemu_file, qemu_len);
    m.f[100] = 'X';
    expect_invalid(&m, -EINVAL, "checksum", "footer copy checksum", true);
    m = copy_of(qemu_file, qemu_len);
    {   /* copy valid but different from the trailing footer */
        struct vhd_footer f;
        struct nbdf_err e;
        CHECK(vhd_footer_decode(m.f, &f, &e) == 0);
        f.timestamp++;
        vhd_footer_encode(&f, m.f + m.len - 512);
    }
    expect_invalid(&m, -EINVAL, "differs", "footer copy differs", false);
    (void) b;

    /* sizes */
    m = copy_of(qemu_file, qemu_len);
    edit_footers(&m, p_size_huge);
    expect_invalid(&m, -EFBIG, "2040 GiB", "absurd size", true);
    m = copy_of(qemu_file, qemu_len);
    m.len -= 4096;                              /* truncated (no footer) */
    expect_invalid(&m, -EINVAL, "", "truncated", false);
    m = copy_of(qemu_file, qemu_len);
    m.len = 300;
    expect_invalid(&m, -EINVAL, "", "300 bytes", true);

    /* header */
    static const struct { header_patch fn; int err; const char *msg; } hc[] = {
        { h_cookie, -EINVAL, "cookie" },
        { h_version, -EINVAL, "header version" },
        { h_bs_odd, -EINVAL, "power of two" },
        { h_bs_huge, -EINVAL, "power of two" },
        { h_bs_small, -EINVAL, "power of two" },
        { h_entries_few, -EINVAL, "needs 6 blocks" },
        { h_entries_many, -EINVAL, "more than" },
        { h_table_odd, -EINVAL, "512-aligned" },
        { h_table_hdr, -EINVAL, "overlaps the dynamic header" },
        { h_table_zero, -EINVAL, "footer copy" },
        { h_parent, -EINVAL, "parent fields" },
        { h_locator, -EINVAL, "parent fields" },
    };
    for (size_t i = 0; i < sizeof hc / sizeof hc[0]; i++) {
        char label[40];
        snprintf(label, sizeof label, "header case %zu", i);
        m = copy_of(qemu_file, qemu_len);
        edit_header(&m, hc[i].fn);
        expect_invalid(&m, hc[i].err, hc[i].msg, label, true);
    }
    m = copy_of(qemu_file, qemu_len);
    m.f[512 + 700] ^= 0x40;
    expect_invalid(&m, -EINVAL, "header checksum", "header checksum", true);

    /* locators (differencing) */
    static const struct { header_patch fn; const char *msg; } lc[] = {
        { h_loc_code, "unknown platform code" },
        { h_loc_len, "exceeds its space" },
        { h_loc_junk, "code 0 but entry not zero" },
        { h_loc_overlap, "overlaps" },
        { h_loc_block, "overlaps" },
    };
    for (size_t i = 0; i < sizeof lc / sizeof lc[0]; i++) {
        char label[40];
        snprintf(label, sizeof label, "locator case %zu", i);
        m = copy_of(tapdiff_file, tapdiff_len);
        edit_header(&m, lc[i].fn);
        expect_invalid(&m, -EINVAL, lc[i].msg, label, true);
    }

    /* BAT (qemu file: BAT at 1536, 6 entries, blocks from sector 4) */
    m = copy_of(qemu_file, qemu_len);
    set_bat(&m, 1536, 1, 3);                    /* inside the BAT */
    expect_invalid(&m, -EINVAL, "clobbers", "BAT entry in metadata", true);
    m = copy_of(qemu_file, qemu_len);
    set_bat(&m, 1536, 1, 1);                    /* the header */
    expect_invalid(&m, -EINVAL, "clobbers", "BAT entry in header", true);
    m = copy_of(qemu_file, qemu_len);
    set_bat(&m, 1536, 2, get_bat(&m, 1536, 0));  /* duplicate */
    expect_invalid(&m, -EINVAL, "overlap", "BAT duplicate", true);
    m = copy_of(qemu_file, qemu_len);
    set_bat(&m, 1536, 2, get_bat(&m, 1536, 0) + 8);
    expect_invalid(&m, -EINVAL, "overlap", "BAT overlapping blocks", true);
    m = copy_of(qemu_file, qemu_len);
    set_bat(&m, 1536, 5, (m.len - 512) / 512);    /* runs past the footer */
    expect_invalid(&m, -EINVAL, "", "BAT entry past the end", false);
    m = copy_of(qemu_file, qemu_len);
    set_bat(&m, 1536, 5, 0xFFFFFFF0);            /* far past the end */
    expect_invalid(&m, -EINVAL, "", "BAT entry far past the end", false);

    /* blktap batmap */
    m = copy_of(tapdyn_file, tapdyn_len);
    m.f[0xa00 + 7] = 0x80;                      /* map byte changed */
    {
        struct vhd_image *img;
        struct nbdf_err e = { "" };
        expect_err(vt_image_parse(m.f, m.len, &img, &e), -EINVAL, &e,
                   "batmap checksum", "batmap checksum");
    }
    free(m.f);
}

/* The image API on the real files: allocation, batmap, payloads. */
static void test_images(void)
{
    struct vhd_image *img;
    struct nbdf_err e = { "" };
    uint64_t off;
    CHECK(vt_image_parse(tapdyn_file, tapdyn_len, &img, &e) == 0);
    CHECK(vhd_image_kind(img) == VHD_DYNAMIC && vhd_image_blocks(img) == 32);
    CHECK(vhd_image_allocated(img) == 5);
    CHECK(vhd_image_has_batmap(img, &off) && off == 0xa00);
    CHECK(vhd_image_block_offset(img, 0) == 0x100full * 512);
    CHECK(vhd_image_block_offset(img, 2) == VHD_NO_BLOCK);
    CHECK(vhd_image_block_offset(img, 99) == VHD_NO_BLOCK);
    struct vhd_place p;
    CHECK(vhd_image_lookup(img, 64 * MiB, NULL, &p) == -EINVAL);
    CHECK(vhd_image_lookup(img, 4 * MiB + 3, NULL, &p) == 0);
    CHECK(p.src == VHD_SRC_ZERO && p.len == 2 * MiB - 3);
    CHECK(vhd_image_lookup(img, 0, NULL, &p) == 0 && p.src == VHD_SRC_BITMAP);
    CHECK(p.file_off == 0x100full * 512 && p.len == 512);
    vhd_image_free(img);

    CHECK(vt_image_parse(tapdiff_file, tapdiff_len, &img, &e) == 0);
    CHECK(vhd_image_kind(img) == VHD_DIFF);
    size_t n;
    const uint8_t *pl = vhd_image_locator_payload(img, 0, &n);
    CHECK(pl && n == 0x18 && memcmp(pl, "file://./tap-dyn-64m.vhd", 24) == 0);
    struct vhd_image *parent;
    CHECK(vt_image_parse(tapdyn_file, tapdyn_len, &parent, &e) == 0);
    CHECK(vhd_image_check_parent(img, parent, &e) == 0);
    CHECK(vhd_image_check_parent(parent, parent, &e) == -EINVAL);
    struct vhd_image *q;
    CHECK(vt_image_parse(qemu_file, qemu_len, &q, &e) == 0);
    expect_err(vhd_image_check_parent(img, q, &e), -EINVAL, &e, "unique id",
               "wrong parent");
    vhd_image_free(q);
    vhd_image_free(parent);
    vhd_image_free(img);

    CHECK(vt_image_parse(fixed_file, fixed_len, &img, &e) == 0);
    CHECK(vhd_image_kind(img) == VHD_FIXED && !vhd_image_header(img));
    CHECK(vhd_image_lookup(img, 4096, NULL, &p) == 0);
    CHECK(p.src == VHD_SRC_FILE && p.file_off == 4096 && p.len == 8 * MiB - 4096);
    vhd_image_free(img);
    /* fixed: current size larger than the data */
    struct mut m = copy_of(fixed_file, fixed_len);
    {
        struct vhd_footer f;
        CHECK(vhd_footer_decode(m.f + m.len - 512, &f, &e) == 0);
        f.current_size += 512;
        vhd_footer_encode(&f, m.f + m.len - 512);
    }
    expect_err(vt_image_parse(m.f, m.len, &img, &e), -EINVAL, &e,
               "current size", "fixed size mismatch");
    free(m.f);
}

/* ---- stream-only rules --------------------------------------------------- */

static struct vhd_stream *new_stream(struct vt_disk *d)
{
    struct vhd_stream *s;
    memset(d, 0, sizeof *d);
    d->cap = 128 * MiB;
    d->buf = calloc(1, d->cap);
    CHECK(d->buf && vhd_stream_new(&vt_disk_sink, d, &s) == 0);
    return s;
}

static void end_stream(struct vhd_stream *s, struct vt_disk *d)
{
    vhd_stream_free(s);
    free(d->buf);
}

static void stream_expect(struct vhd_stream *s, int r, int want,
                          const char *needle, const char *label)
{
    struct nbdf_err e;
    snprintf(e.msg, sizeof e.msg, "%s", vhd_stream_error(s));
    expect_err(r, want, &e, needle, label);
}

static void test_stream_rules(void)
{
    struct vt_disk d;
    struct vhd_stream *s;
    const uint8_t *q = qemu_file;

    /* backwards data write */
    s = new_stream(&d);
    CHECK(vhd_stream_feed(s, 0, q, 4096) == 0);
    stream_expect(s, vhd_stream_feed(s, 1000, q + 1000, 10), -EINVAL,
                  "goes backwards", "backwards write");
    CHECK(vhd_stream_feed(s, 4096, q + 4096, 10) == -EINVAL);   /* sticky */
    CHECK(vhd_stream_finish(s) == -EINVAL);
    end_stream(s, &d);

    /* gap bookkeeping: re-punch inside a gap is fine, outside is not */
    s = new_stream(&d);
    CHECK(vhd_stream_feed(s, 0, q, 2048) == 0);            /* footer+header+BAT */
    CHECK(vhd_stream_feed(s, 8192, q + 8192, 512) == 0);   /* gap 2048..8192 */
    CHECK(vhd_stream_hole(s, 2048, 6144) == 0);
    CHECK(vhd_stream_hole(s, 4096, 100) == 0);
    static const uint8_t z[600];
    CHECK(vhd_stream_feed(s, 3000, z, 600) == 0);          /* zeros into the gap */
    CHECK(vhd_stream_position(s) == 8704);
    stream_expect(s, vhd_stream_hole(s, 1024, 2048), -EINVAL, "backwards",
                  "punch over consumed data");
    end_stream(s, &d);
    s = new_stream(&d);
    CHECK(vhd_stream_feed(s, 0, q, 2048) == 0);
    CHECK(vhd_stream_feed(s, 8192, q + 8192, 512) == 0);
    uint8_t nz[16] = { 1 };
    stream_expect(s, vhd_stream_feed(s, 4096, nz, 16), -EINVAL, "backwards",
                  "non-zero data into a gap");
    end_stream(s, &d);

    /* a hole straddling the position: back part was a gap */
    s = new_stream(&d);
    CHECK(vhd_stream_feed(s, 0, q, 2048) == 0);
    CHECK(vhd_stream_hole(s, 2048, 1000) == 0);
    CHECK(vhd_stream_hole(s, 2048, 3000) == 0);
    CHECK(vhd_stream_position(s) == 5048);
    end_stream(s, &d);

    /* the destination's error stops decoding, with its errno */
    s = new_stream(&d);
    d.fail_after = 1;
    int r = vhd_stream_feed(s, 0, q, qemu_len);
    stream_expect(s, r, -EIO, "destination write", "sink failure");
    end_stream(s, &d);

    /* input after finish */
    s = new_stream(&d);
    CHECK(vhd_stream_feed(s, 0, q, qemu_len) == 0);
    CHECK(vhd_stream_finish(s) == 0 && vhd_stream_finish(s) == 0);
    CHECK(vhd_stream_kind(s) == VHD_DYNAMIC);
    CHECK(vhd_stream_virtual_size(s) == 10514432);
    stream_expect(s, vhd_stream_feed(s, qemu_len, "x", 1), -EINVAL,
                  "after the end", "data after finish");
    end_stream(s, &d);

    /* empty input; a hole far beyond any VHD */
    s = new_stream(&d);
    stream_expect(s, vhd_stream_finish(s), -EINVAL, "before the first sector",
                  "empty stream");
    end_stream(s, &d);
    s = new_stream(&d);
    stream_expect(s, vhd_stream_hole(s, 0, 1ull << 50), -EFBIG,
                  "largest possible VHD", "absurd hole");
    end_stream(s, &d);
    s = new_stream(&d);
    stream_expect(s, vhd_stream_hole(s, UINT64_MAX - 10, 100), -EFBIG,
                  "largest possible VHD", "offset overflow");
    end_stream(s, &d);

    /* BAT placed before the header cannot be decoded forward */
    struct mut m = copy_of(qemu_file, qemu_len);
    {
        struct vhd_footer f;
        struct vhd_header h;
        struct nbdf_err e;
        CHECK(vhd_footer_decode(m.f, &f, &e) == 0);
        CHECK(vhd_header_decode(m.f + 512, &h, &e) == 0);
        uint8_t bat[512];
        memcpy(bat, m.f + 1536, 512);
        f.data_offset = 1024;                   /* header moves to 1024 */
        vhd_footer_encode(&f, m.f);
        memcpy(m.f + m.len - 512, m.f, 512);
        memcpy(m.f + 512, bat, 512);            /* BAT moves to 512 */
        h.table_offset = 512;
        vhd_header_encode(&h, m.f + 1024);
    }
    s = new_stream(&d);
    r = vhd_stream_feed(s, 0, m.f, m.len);
    stream_expect(s, r, -EINVAL, "precedes the dynamic header", "BAT first");
    CHECK(!d.began);
    end_stream(s, &d);
    {   /* the image parser (random access) accepts that layout */
        struct vhd_image *img;
        struct nbdf_err e = { "" };
        r = vt_image_parse(m.f, m.len, &img, &e);
        printf("image with BAT before header: %d %s\n", r, e.msg);
        CHECK(r == 0);
        vhd_image_free(img);
    }
    free(m.f);

    /* fixed: a footer whose size disagrees; garbage at the end */
    m = copy_of(fixed_file, fixed_len);
    {
        struct vhd_footer f;
        struct nbdf_err e;
        CHECK(vhd_footer_decode(m.f + m.len - 512, &f, &e) == 0);
        f.current_size -= 512;
        vhd_footer_encode(&f, m.f + m.len - 512);
    }
    s = new_stream(&d);
    CHECK(vhd_stream_feed(s, 0, m.f, m.len) == 0);
    CHECK(d.began && d.kind == VHD_FIXED && d.high <= m.len - 512);
    stream_expect(s, vhd_stream_finish(s), -EINVAL, "bytes precede the footer",
                  "fixed size mismatch");
    end_stream(s, &d);
    memset(m.f + m.len - 512, 0x11, 512);
    s = new_stream(&d);
    CHECK(vhd_stream_feed(s, 0, m.f, m.len) == 0);
    stream_expect(s, vhd_stream_finish(s), -EINVAL, "not a valid footer",
                  "fixed without footer");
    end_stream(s, &d);
    free(m.f);
    /* every truncation of a dynamic file is refused, by finish at the latest */
    static const size_t cuts[] = { 1, 511, 512, 513, 1000, 1536, 2047, 2048,
                                   2560, 4096, 1 << 20 };
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < sizeof cuts / sizeof cuts[0] + 3; i++) {
            size_t cut = i < sizeof cuts / sizeof cuts[0] ? cuts[i]
                         : qemu_len - 1 - 511 * (i - sizeof cuts / sizeof cuts[0]);
            const uint8_t *src = pass ? tapdiff_file : qemu_file;
            s = new_stream(&d);
            r = vhd_stream_feed(s, 0, src, cut);
            if (r == 0)
                r = vhd_stream_finish(s);
            CHECK(r == -EINVAL && vhd_stream_error(s)[0]);
            end_stream(s, &d);
        }
    /* a raw file shorter than a sector */
    s = new_stream(&d);
    CHECK(vhd_stream_feed(s, 0, fixed_file, 100) == 0);
    stream_expect(s, vhd_stream_finish(s), -EINVAL, "first sector",
                  "short raw file");
    end_stream(s, &d);
}

/* ---- bitmap semantics: a clear bit wins over the bytes in the file ----- */

/* Clear the bitmap bit of the first non-zero data sector of m's first
 * allocated block; return that sector's virtual byte offset. */
static uint64_t clear_first_data_bit(struct mut *m)
{
    struct vhd_image *img;
    struct nbdf_err e;
    CHECK(vt_image_parse(m->f, m->len, &img, &e) == 0);
    uint32_t bs = vhd_image_block_size(img), bm = vhd_image_bitmap_bytes(img);
    for (uint32_t b = 0; b < vhd_image_blocks(img); b++) {
        uint64_t off = vhd_image_block_offset(img, b);
        if (off == VHD_NO_BLOCK)
            continue;
        for (uint32_t j = 0; j < bs / 512; j++) {
            uint8_t *bits = m->f + off;
            if (!vhd_bitmap_test(bits, j) ||
                is_zero(m->f + off + bm + 512ull * j, 512))
                continue;
            bits[j / 8] &= ~(0x80 >> (j % 8));
            vhd_image_free(img);
            return (uint64_t) b * bs + 512ull * j;
        }
    }
    abort();
}

static void decode_both(const struct mut *m, const uint8_t *base, size_t cap,
                        uint8_t *via_stream, uint8_t *via_image)
{
    struct vt_disk d = { .cap = cap, .buf = via_stream };
    if (base)
        memcpy(via_stream, base, cap);
    struct vhd_stream *s;
    CHECK(vhd_stream_new(&vt_disk_sink, &d, &s) == 0);
    for (size_t off = 0; off < m->len; off += 4097)
        CHECK(vhd_stream_feed(s, off, m->f + off,
                              m->len - off < 4097 ? m->len - off : 4097) == 0);
    CHECK(vhd_stream_finish(s) == 0);
    vhd_stream_free(s);
    struct vhd_image *img;
    struct nbdf_err e;
    CHECK(vt_image_parse(m->f, m->len, &img, &e) == 0);
    if (base)
        memcpy(via_image, base, cap);
    else
        memset(via_image, 0x77, cap);
    vt_image_decode(img, m->f, via_image);
    vhd_image_free(img);
}

static void test_bitmap_semantics(void)
{
    /* dynamic: the cleared sector reads zero although the file holds data
     * there (qemu 7.2 would return the stale bytes) */
    struct mut m = copy_of(qemu_file, qemu_len);
    uint64_t v = clear_first_data_bit(&m);
    size_t cap = 10514432;
    uint8_t *a = malloc(cap), *b = malloc(cap);
    CHECK(a && b);
    decode_both(&m, NULL, cap, a, b);
    CHECK(is_zero(a + v, 512) && is_zero(b + v, 512));
    CHECK(memcmp(a, b, cap) == 0);
    printf("dynamic: cleared bit at %llu reads zero\n", (unsigned long long) v);
    free(m.f);
    free(a);
    free(b);

    /* differencing: the cleared sector keeps the parent's bytes */
    uint8_t *parent;
    size_t plen;
    vt_load_fixture("tap-dyn-64m.raw", &parent, &plen);
    m = copy_of(tapdiff_file, tapdiff_len);
    v = clear_first_data_bit(&m);
    a = malloc(plen);
    b = malloc(plen);
    CHECK(a && b);
    decode_both(&m, parent, plen, a, b);
    CHECK(memcmp(a + v, parent + v, 512) == 0);
    CHECK(memcmp(tapdiff_file, m.f, 512) == 0);
    CHECK(memcmp(a, b, plen) == 0);
    printf("differencing: cleared bit at %llu keeps the parent\n",
           (unsigned long long) v);
    free(m.f);
    free(a);
    free(b);
    free(parent);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    vt_load_fixture("qemu-dyn-10m.vhd", &qemu_file, &qemu_len);
    vt_load_fixture("tap-dyn-64m.vhd", &tapdyn_file, &tapdyn_len);
    vt_load_fixture("tap-diff-64m.vhd", &tapdiff_file, &tapdiff_len);
    vt_load_fixture("vhdtool-delta-64m.vhd", &delta_file, &delta_len);
    vt_load_fixture("tap-fixed-8m.vhd", &fixed_file, &fixed_len);
    test_footer_decode();
    test_footer_rules();
    test_header_decode();
    test_strings();
    test_geometry();
    test_file_rules();
    test_images();
    test_stream_rules();
    test_bitmap_semantics();
    printf("ok\n");
    return 0;
}
