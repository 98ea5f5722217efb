/* tests/unit/test-qcow2-format.c: the header checks and the decoder's
 * refusals.  A qemu-img image's header is mutated field by field (magic,
 * version, cluster bits, encryption, feature bits, table offsets and
 * sizes that overflow or overlap, extensions, the backing file name) and
 * must be refused with the right code and a message; real encrypted and
 * external-data-file images are refused; internal snapshots are not
 * landed but the active disk is; damaged tables (an L2 entry into the
 * header, unaligned, claimed twice, past the end of the file, reserved
 * bits) fail the stream, before begin() where the rule allows: every
 * damage in an L2 table that arrives before the data it maps (qemu-img's
 * layout) is found before begin(), so the disk is untouched. */
#include <zlib.h>

#include "qcow2-util.h"

static uint8_t *img;
static size_t img_len;

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = v >> 24, p[1] = v >> 16, p[2] = v >> 8, p[3] = (uint8_t) v;
}

/* Decode img with the 4 (or 8) bytes at 'at' set to v; want code. */
static void mutate(const char *what, size_t at, int width, uint64_t v,
                   int want, const char *needle)
{
    uint8_t *b = malloc(img_len);
    struct qcow2_header h;
    struct nbdf_err e = { "" };
    memcpy(b, img, img_len);
    if (width == 4)
        put32(b + at, (uint32_t) v);
    else
        qcow2_put64_t(b + at, v);
    int r = qcow2_header_decode(b, img_len, &h, &e);
    printf("  %-34s %-12s %s\n", what, r == 0 ? "ok" : r == -EINVAL ? "EINVAL"
           : r == -EMEDIUMTYPE ? "EMEDIUMTYPE" : r == -EFBIG ? "EFBIG" : "?",
           e.msg);
    CHECK(r == want);
    CHECK(r == 0 || e.msg[0]);
    if (needle)
        CHECK(strstr(e.msg, needle));
    free(b);
}

static int decode_file(const char *name, const char **msg)
{
    static char m[sizeof ((struct nbdf_err *) 0)->msg];
    size_t len;
    uint8_t *f = load(name, &len);
    struct qcow2_header h;
    struct nbdf_err e = { "" };
    int r = qcow2_header_decode(f, len, &h, &e);
    snprintf(m, sizeof m, "%s", e.msg);
    *msg = m;
    free(f);
    return r;
}

/* Stream f; returns the first error; *began says if begin() ran. */
static int stream(const uint8_t *f, size_t len, bool *began, char *msg)
{
    struct disk d;
    struct mspool ms = { 0 };
    struct qcow2_stream_opts o = { 16u << 20, "--spool", 0 };
    struct qcow2_stream *st;
    disk_init(&d, 64u << 20, NULL);
    d.ms = &ms;
    CHECK(qcow2_stream_new(&sink_sync, &d, &o, &st) == 0);
    int r = qcow2_stream_feed(st, 0, f, len);
    if (r == 0)
        r = qcow2_stream_finish(st);
    snprintf(msg, 256, "%s", qcow2_stream_error(st));
    *began = d.began;
    qcow2_stream_free(st);
    ms_free(&ms);
    disk_free(&d);
    return r;
}

static void damaged(const char *what, uint8_t *f, size_t len, int want,
                    bool may_begin)
{
    bool began;
    char msg[256];
    int r = stream(f, len, &began, msg);
    printf("  stream: %-28s %d %s%s\n", what, r, msg, began ? " (after begin)"
           : "");
    CHECK(r == want && msg[0]);
    CHECK(may_begin || !began);
}

/* Raw deflate (qemu's) of n bytes of src, ended with flush: Z_FINISH sets
 * the final block, Z_SYNC_FLUSH leaves the stream open. */
static size_t deflate_raw(const uint8_t *src, size_t n, int flush,
                          uint8_t *out, size_t cap)
{
    z_stream z = { 0 };
    CHECK(deflateInit2(&z, 6, Z_DEFLATED, -12, 9, Z_DEFAULT_STRATEGY) == Z_OK);
    z.next_in = (Bytef *) src, z.avail_in = (uInt) n;
    z.next_out = out, z.avail_out = (uInt) cap;
    CHECK(deflate(&z, flush) != Z_STREAM_ERROR);
    CHECK(z.avail_in == 0);
    size_t len = cap - z.avail_out;
    deflateEnd(&z);
    return len;
}

/* qcow2_compressed_decode of the first clen bytes of cdata into a cluster
 * of C bytes: the result, and the output compared with want. */
static int64_t decode_one(struct qcow2_decompressor *dz, const uint8_t *cdata,
                          size_t clen, size_t C, const uint8_t *want)
{
    struct qcow2_compressed c = { .cdata = cdata, .clen = clen,
                                  .cluster_size = C, .place_len = C,
                                  .type = QCOW2_COMPRESS_ZLIB };
    struct nbdf_err e = { "" };
    uint8_t *out = malloc(C);
    int64_t n = qcow2_compressed_decode(dz, &c, out, &e);
    CHECK(n < 0 ? e.msg[0] != 0 : memcmp(out, want, C) == 0);
    free(out);
    return n;
}

/* The deflate streams qemu accepts for a cluster, and those it refuses,
 * whichever inflater (libdeflate, or zlib behind it) decodes them. */
static void test_inflate(const uint8_t *raw)
{
    const size_t C = 65536, cap = 2 * C + 1024;
    uint8_t *src = malloc(C), *z = malloc(cap + C);
    struct qcow2_decompressor *dz;
    CHECK(qcow2_decompressor_new(&dz) == 0);
    memcpy(src, raw + C, C / 2);                    /* some data, some zeros */
    memset(src + C / 2, 0, C / 2);

    size_t n = deflate_raw(src, C, Z_FINISH, z, cap);
    memset(z + n, 0xa5, C);                          /* the next cluster's */
    CHECK(decode_one(dz, z, n, C, src) == (int64_t) C);
    CHECK(decode_one(dz, z, n + 511, C, src) == (int64_t) C);
    CHECK(decode_one(dz, z, n / 2, C, src) == -EINVAL);       /* cut */
    n = deflate_raw(src, C, Z_SYNC_FLUSH, z, cap);  /* no final block */
    CHECK(decode_one(dz, z, n, C, src) == (int64_t) C);
    n = deflate_raw(src, C - 1, Z_FINISH, z, cap);  /* one byte short */
    CHECK(decode_one(dz, z, n, C, src) == -EINVAL);
    qcow2_decompressor_free(dz);
    free(src);
    free(z);
    printf("  inflate: whole, padded, open-ended streams decoded; cut and "
           "short refused\n");
}

int main(void)
{
    const char *msg;

    setvbuf(stdout, NULL, _IOLBF, 0);
    mkscratch();
    uint8_t *raw = make_raw("src.raw");
    sh("cd %s && qemu-img convert -q -f raw -O qcow2 src.raw v3.qcow2", dir);
    img = load("v3.qcow2", &img_len);
    struct qcow2_header h;
    CHECK(qcow2_header_decode(img, img_len, &h, NULL) == 0);
    CHECK(h.version == 3 && h.cluster_bits == 16 && h.size == RAW_SIZE);

    mutate("magic", 0, 4, 0x514649fc, -EMEDIUMTYPE, "not a qcow2");
    mutate("version 1", 4, 4, 1, -EMEDIUMTYPE, "version 1");
    mutate("version 4", 4, 4, 4, -EMEDIUMTYPE, NULL);
    mutate("cluster_bits 8", 20, 4, 8, -EINVAL, "cluster_bits");
    mutate("cluster_bits 22", 20, 4, 22, -EINVAL, "cluster_bits");
    {
        /* A stream waits for 24 bytes only when cluster_bits is out of
         * range: refused there, naming it (not "cut short"). */
        uint8_t b[24];
        bool began;
        char m[256];
        memcpy(b, img, sizeof b);
        put32(b + 20, 23);
        CHECK(stream(b, sizeof b, &began, m) == -EINVAL && !began);
        printf("  stream: %-28s %s\n", "cluster_bits 23, 24 bytes", m);
        CHECK(strstr(m, "cluster_bits 23"));
        /* Another format written here: named from the first sector. */
        uint8_t v[512] = "vhdxfile";
        CHECK(stream(v, sizeof v, &began, m) == -EMEDIUMTYPE && !began);
        printf("  stream: %-28s %s\n", "a VHDX's first sector", m);
        CHECK(strstr(m, "its first sector is a VHDX image"));
        memset(v, 0x33, sizeof v);
        CHECK(stream(v, sizeof v, &began, m) == -EMEDIUMTYPE && !began);
        CHECK(strstr(m, "a raw disk image or another format"));
    }
    mutate("AES", 32, 4, 1, -EMEDIUMTYPE, "AES");
    mutate("LUKS", 32, 4, 2, -EMEDIUMTYPE, "LUKS");
    mutate("dirty bit", 72, 8, 1, -EMEDIUMTYPE, "dirty");
    mutate("corrupt bit", 72, 8, 2, -EMEDIUMTYPE, "corrupt");
    mutate("external data file bit", 72, 8, 4, -EMEDIUMTYPE, "external");
    mutate("compression bit, no type", 72, 8, 8, -EINVAL, "compression");
    mutate("unknown incompatible bit", 72, 8, 1u << 9, -EMEDIUMTYPE, "bit 9");
    mutate("refcount_order 7", 96, 4, 7, -EINVAL, "refcount_order");
    mutate("header_length 100", 100, 4, 100, -EINVAL, "header_length");
    mutate("header_length 108", 100, 4, 108, -EINVAL, "header_length");
    mutate("size past the L1 table", 24, 8, 1ull << 40, -EINVAL, "too small");
    mutate("size 2^63", 24, 8, 1ull << 63, -EINVAL, NULL);
    mutate("l1_size 2^32-1", 36, 4, 0xffffffffu, -EFBIG, "L1");
    mutate("L1 unaligned", 40, 8, h.l1_table_offset + 512, -EINVAL,
           "aligned");
    mutate("L1 on the refcount table", 40, 8, h.refcount_table_offset,
           -EINVAL, "overlap");
    mutate("L1 at byte 0", 40, 8, 0, -EINVAL, NULL);
    mutate("L1 past 2^56", 40, 8, 1ull << 56, -EINVAL, "2^56");
    mutate("L1 wraps", 40, 8, 0xffffffffffff0000ull, -EINVAL, NULL);
    mutate("no refcount table", 56, 4, 0, -EINVAL, "refcount");
    mutate("refcount table 2^32-1 clusters", 56, 4, 0xffffffffu, -EFBIG,
           "refcount");
    mutate("refcount table on the header", 48, 8, 0, -EINVAL, NULL);
    mutate("snapshots at byte 0", 60, 4, 1, -EINVAL, "snapshot");
    mutate("backing name of 0 bytes", 8, 8, 1024, -EINVAL, "backing");
    {
        size_t ext = h.header_length;   /* first extension: claim too much */
        mutate("extension past the cluster", ext + 4, 4, 70000, -EINVAL,
               "extension");
    }

    /* Real images qemu-img makes that the library does not land. */
    /* qemu-img times the LUKS key derivation first and gives up ("Unable
     * to get accurate CPU usage") on a loaded machine: try a few times. */
    sh("cd %s && for i in 1 2 3 4 5 6 7 8; do qemu-img create -q -f qcow2 "
       "--object secret,id=s,data=x "
       "-o encrypt.format=luks,encrypt.key-secret=s,encrypt.iter-time=10 "
       "luks.qcow2 1M 2>/dev/null && break; sleep 0.2; done && "
       "test -s luks.qcow2 && qemu-img create -q -f qcow2 --object "
       "secret,id=s,data=x -o encrypt.format=aes,encrypt.key-secret=s "
       "aes.qcow2 1M && qemu-img create -q -f qcow2 -o data_file=data.raw "
       "ext.qcow2 1M", dir);
    CHECK(decode_file("luks.qcow2", &msg) == -EMEDIUMTYPE && strstr(msg, "LUKS"));
    printf("  luks.qcow2: %s\n", msg);
    CHECK(decode_file("aes.qcow2", &msg) == -EMEDIUMTYPE && strstr(msg, "AES"));
    CHECK(decode_file("ext.qcow2", &msg) == -EMEDIUMTYPE &&
          strstr(msg, "external"));
    printf("  ext.qcow2: %s\n", msg);

    /* A v3 image names its features: an unknown bit is named with qemu's
     * table if present (qemu writes one). */
    {
        uint8_t *b = malloc(img_len);
        struct nbdf_err e = { "" };
        memcpy(b, img, img_len);
        qcow2_put64_t(b + 72, 1ull << 4);        /* extended L2 at 64 KiB: ok */
        CHECK(qcow2_header_decode(b, img_len, &h, &e) == 0);
        put32(b + 20, 12);                       /* ... not at 4 KiB */
        CHECK(qcow2_header_decode(b, img_len, &h, &e) == -EINVAL);
        CHECK(strstr(e.msg, "extended L2"));
        free(b);
    }

    /* Internal snapshots: the header says how many, the active disk
     * lands (the snapshot's own clusters are not). */
    sh("cd %s && cp v3.qcow2 snap.qcow2 && qemu-img snapshot -c s1 snap.qcow2"
       " && qemu-io -f qcow2 -c 'write -P 0x66 0 64k' snap.qcow2 >/dev/null && "
       "qemu-img convert -q -O raw snap.qcow2 snap.raw", dir);
    {
        size_t len, rlen;
        uint8_t *f = load("snap.qcow2", &len), *want = load("snap.raw", &rlen);
        CHECK(qcow2_header_decode(f, len, &h, NULL) == 0 && h.nb_snapshots == 1);
        struct disk d;
        struct mspool ms = { 0 };
        struct qcow2_stream_opts o = { 16u << 20, "--s", 0 };
        struct qcow2_stream *st;
        disk_init(&d, rlen, NULL);
        d.ms = &ms;
        CHECK(qcow2_stream_new(&sink_sync, &d, &o, &st) == 0);
        CHECK(qcow2_stream_feed(st, 0, f, len) == 0);
        CHECK(qcow2_stream_finish(st) == 0);
        CHECK(memcmp(d.buf, want, rlen) == 0);
        CHECK(ms.live == 0);
        qcow2_stream_free(st);
        ms_free(&ms);
        disk_free(&d);
        free(f);
        free(want);
        printf("  snap.qcow2: 1 snapshot left out, the active disk lands\n");
    }

    /* Damaged tables. */
    uint64_t l1 = h.l1_table_offset;
    sh("cd %s && qemu-img convert -q -f raw -O qcow2 src.raw v3.qcow2", dir);
    free(img);
    img = load("v3.qcow2", &img_len);
    CHECK(qcow2_header_decode(img, img_len, &h, NULL) == 0);
    l1 = h.l1_table_offset;
    uint64_t l2 = qcow2_be64_t(img + l1) & 0x00fffffffffffe00ull;
    uint8_t *f = malloc(img_len);
#define RESET() memcpy(f, img, img_len)
    RESET();
    qcow2_put64_t(f + l1, qcow2_be64_t(f + l1) | 2);
    damaged("L1 reserved bits", f, img_len, -EINVAL, false);
    RESET();
    qcow2_put64_t(f + l1, (1ull << 63) | (l2 + 512));
    damaged("L1 unaligned", f, img_len, -EINVAL, false);
    RESET();
    qcow2_put64_t(f + l2, (1ull << 63) | 0);
    qcow2_put64_t(f + l2 + 8, (1ull << 63) | 65536);   /* header cluster? */
    qcow2_put64_t(f + l2 + 8, (1ull << 63) | 0x10000000000ull);
    damaged("L2 past the end of the file", f, img_len, -EINVAL, false);
    RESET();
    qcow2_put64_t(f + l2, (1ull << 63) | 0);            /* unallocated */
    qcow2_put64_t(f + l2 + 8, (1ull << 63) | 0);        /* bit 63 only: off 0 */
    qcow2_put64_t(f + l2 + 16, 0);
    qcow2_put64_t(f + l2 + 24, (1ull << 63) | h.l1_table_offset);
    damaged("L2 into the L1 table", f, img_len, -EINVAL, false);
    RESET();
    qcow2_put64_t(f + l2 + 8, qcow2_be64_t(f + l2));
    damaged("two L2 entries, one cluster", f, img_len, -EINVAL, false);
    RESET();
    qcow2_put64_t(f + l2, qcow2_be64_t(f + l2) + 512);
    damaged("L2 unaligned", f, img_len, -EINVAL, false);
    RESET();
    qcow2_put64_t(f + l2, qcow2_be64_t(f + l2) | (1ull << 57));
    damaged("L2 reserved bits", f, img_len, -EINVAL, false);
    RESET();
    qcow2_put64_t(f + l1, (1ull << 63) | h.refcount_table_offset);
    damaged("L1 names the refcount table", f, img_len, -EINVAL, false);
    damaged("cut inside the L1 table", f, (size_t) l1 + 4, -EINVAL, false);
    /* Refcounts that matter: a cluster in use with refcount 0. */
    uint64_t rb = qcow2_be64_t(img + h.refcount_table_offset);
    uint64_t d0 = qcow2_be64_t(img + l2) & 0x00fffffffffffe00ull;
    RESET();
    f[rb + (d0 >> 16) * 2] = 0, f[rb + (d0 >> 16) * 2 + 1] = 0;
    damaged("data cluster with refcount 0", f, img_len, -EINVAL, false);
    CHECK(stream(f, img_len, &(bool) { 0 }, (char[256]) { 0 }) == -EINVAL);
    RESET();
    f[rb + (l1 >> 16) * 2] = 0, f[rb + (l1 >> 16) * 2 + 1] = 0;
    damaged("L1 table with refcount 0", f, img_len, -EINVAL, false);
    RESET();
    qcow2_put64_t(f + h.refcount_table_offset, 0);
    damaged("no refcount block", f, img_len, -EINVAL, false);
    RESET();
    damaged("a raw disk", raw, 65536, -EMEDIUMTYPE, false);

    /* A disk larger than the destination: -ENOSPC at the header.  A
     * write that goes backwards over data: -EINVAL; zeros rewritten over
     * a gap the stream skipped are a no-op. */
    {
        struct disk d;
        struct qcow2_stream *st;
        struct qcow2_stream_opts o = { .max_size = RAW_SIZE - 1 };
        disk_init(&d, RAW_SIZE, NULL);
        CHECK(qcow2_stream_new(&sink_sync, &d, &o, &st) == 0);
        CHECK(qcow2_stream_feed(st, 0, img, 65536) == -ENOSPC);
        CHECK(strstr(qcow2_stream_error(st), "larger than"));
        CHECK(!d.began);
        qcow2_stream_free(st);
        o.max_size = 0;
        CHECK(qcow2_stream_new(&sink_sync, &d, &o, &st) == 0);
        CHECK(qcow2_stream_feed(st, 0, img, 200000) == 0);
        CHECK(qcow2_stream_hole(st, 300000, 1000) == 0);  /* gap 200000.. */
        uint8_t zeros[4096] = { 0 };
        CHECK(qcow2_stream_feed(st, 250000, zeros, sizeof zeros) == 0);
        CHECK(qcow2_stream_feed(st, 100000, img + 100000, 4096) == -EINVAL);
        CHECK(strstr(qcow2_stream_error(st), "backwards"));
        qcow2_stream_free(st);
        disk_free(&d);
        printf("  stream: a larger disk -ENOSPC, a backwards write -EINVAL\n");
    }
    free(f);

    test_inflate(raw);
    free(raw);
    free(img);
    rmscratch();
    printf("test-qcow2-format: ok\n");
    return 0;
}
