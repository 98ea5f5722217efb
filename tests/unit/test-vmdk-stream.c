/* tests/unit/test-vmdk-stream.c: the stream decoder and the random-access
 * parser against VMDKs made here by two independent writers, qemu-img
 * (streamOptimized, monolithicSparse) and python3-vmdkstream, and read
 * back by qemu-img and vmdkinfo.
 *
 * The source disk has data grains, all-zero grains, a partly zero grain and
 * a size that is not a multiple of the grain.  Each file is decoded with
 * several cuttings into writes (1 byte to 1 MiB, zero runs sent as gaps,
 * holes and backwards re-punches) and must give back the source byte for
 * byte.  Damaged files must fail with a message, before begin() where the
 * rule can be checked there.  A missing tool is a failure, not a skip. */
#undef NDEBUG
#include <assert.h>
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <libdeflate.h>

#include "common/iszero.h"
#include "vmdk/vmdk.h"
#include "stream-cuts.h"
#include "test-util.h"
#include "vmdk-util.h"

static void make_fixtures(void)
{
    sh("cd %s && qemu-img convert -q -f raw -O vmdk -o subformat=streamOptimized"
       " src.raw qemu-stream.vmdk", dir);
    sh("cd %s && qemu-img convert -q -f raw -O vmdk -o subformat=monolithicSparse"
       " src.raw qemu-sparse.vmdk", dir);
    sh("cd %s && /usr/bin/python3 -c 'import VMDKstream; "
       "VMDKstream.convert_to_stream(\"src.raw\", \"vmdkstream.vmdk\")'", dir);
    /* The independent reader agrees they are VMDKs of the right size.
     * (libvmdk refuses VMDKstream's descriptor: it is headed "# Disk
     * Descriptor File", not "# Disk DescriptorFile"; qemu-img reads it.) */
    sh("cd %s && vmdkinfo qemu-stream.vmdk | grep -q 'Stream optimized' && "
       "vmdkinfo qemu-sparse.vmdk | grep -q 'Media size.*(5255680 bytes)' && "
       "! vmdkinfo vmdkstream.vmdk >/dev/null 2>&1 && "
       "qemu-img convert -q -f vmdk -O raw vmdkstream.vmdk vs.raw && "
       "cmp vs.raw src.raw", dir);
}


/* Decode; expect failure with a message containing needle; began says
 * whether the disk may have been touched. */
static void decode_bad(const char *what, const uint8_t *f, size_t len,
                       const char *needle, bool may_begin)
{
    struct disk d;
    struct vmdk_stream *s;
    disk_init(&d, 64u << 20);
    CHECK(vmdk_stream_new(&sink, &d, &s) == 0);
    int r = decode(s, f, len, 7, 65536);
    if (r == 0 || !strstr(vmdk_stream_error(s), needle) ||
        (d.began && !may_begin)) {
        fprintf(stderr, "%s: got %d \"%s\" began=%d, wanted \"%s\"\n", what, r,
                vmdk_stream_error(s), d.began, needle);
        abort();
    }
    CHECK(vmdk_stream_finish(s) == r);              /* sticky */
    CHECK(vmdk_stream_feed(s, len, "x", 1) == r);
    printf("  refused (%s): %s\n", what, vmdk_stream_error(s));
    vmdk_stream_free(s);
    disk_free(&d);
}

static uint8_t *dup_buf(const uint8_t *f, size_t len)
{
    uint8_t *c = malloc(len);
    memcpy(c, f, len);
    return c;
}

static void image_bad(const char *what, const uint8_t *f, size_t len,
                      const char *needle)
{
    struct nbdf_err e = { "" };
    uint64_t cap;
    uint8_t *out = malloc(64u << 20);
    int r = image_decode(f, len, out, &cap, &e);
    if (r == 0 || !strstr(e.msg, needle)) {
        fprintf(stderr, "image %s: got %d \"%s\", wanted \"%s\"\n", what, r,
                e.msg, needle);
        abort();
    }
    printf("  image refused (%s): %s\n", what, e.msg);
    free(out);
}

/* ---- streamOptimized surgery -------------------------------------------- */

struct rec { size_t off, len; uint64_t lba; bool grain; uint32_t type; };

/* Split a streamOptimized file into marker records from the overhead on. */
static size_t records(const uint8_t *f, size_t len, struct rec *out, size_t max)
{
    uint64_t overhead;
    memcpy(&overhead, f + 0x40, 8);
    size_t pos = overhead * 512, n = 0;
    while (pos + 512 <= len && n < max) {
        uint64_t lba;
        uint32_t size, type;
        memcpy(&lba, f + pos, 8);
        memcpy(&size, f + pos + 8, 4);
        memcpy(&type, f + pos + 12, 4);
        struct rec r = { pos, 0, lba, size != 0, type };
        r.len = size ? (12 + size + 511) / 512 * 512 : 512 + lba * 512;
        out[n++] = r;
        pos += r.len;
        if (!size && type == 0)
            break;
    }
    return n;
}

static void test_stream_surgery(const uint8_t *f, size_t len,
                                const uint8_t *raw)
{
    struct rec rec[512];
    size_t n = records(f, len, rec, 512), ngr = 0;
    while (ngr < n && rec[ngr].grain)
        ngr++;
    CHECK(ngr > 10 && ngr < n);
    size_t start = rec[0].off;

    /* Grains in reverse LBA order: still the same disk. */
    uint8_t *c = dup_buf(f, len);
    size_t at = start;
    for (size_t i = ngr; i-- > 0; ) {
        memcpy(c + at, f + rec[i].off, rec[i].len);
        at += rec[i].len;
    }
    decode_ok("vmdkstream, grains reversed", c, len, raw, RAW_SIZE,
              VMDK_STREAM_OPTIMIZED);

    /* A damaged deflate stream fails at that grain (after begin). */
    memcpy(c, f, len);
    c[rec[3].off + 40] ^= 0x55;
    decode_bad("corrupt deflate", c, len, "deflate data corrupt", true);
    /* Adler-32 trailer wrong. */
    memcpy(c, f, len);
    uint32_t size;
    memcpy(&size, f + rec[4].off + 8, 4);
    c[rec[4].off + 12 + size - 1] ^= 1;
    decode_bad("adler32", c, len, "corrupt", true);
    /* LBA not on a grain boundary, past the capacity, twice. */
    uint64_t lba;
    memcpy(c, f, len);
    lba = rec[2].lba + 1;
    memcpy(c + rec[2].off, &lba, 8);
    decode_bad("unaligned lba", c, len, "not at a grain boundary", true);
    memcpy(c, f, len);
    lba = 1ull << 40;
    memcpy(c + rec[2].off, &lba, 8);
    decode_bad("lba past capacity", c, len, "past the capacity", true);
    memcpy(c, f, len);
    memcpy(c + rec[2].off, &rec[1].lba, 8);
    decode_bad("lba twice", c, len, "appears twice", true);
    /* Compressed size absurd. */
    memcpy(c, f, len);
    size = 1u << 30;
    memcpy(c + rec[2].off + 8, &size, 4);
    decode_bad("huge grain", c, len, "compressed bytes", true);
    /* Unknown marker type. */
    memcpy(c, f, len);
    uint32_t t = 9;
    memcpy(c + rec[ngr].off + 12, &t, 4);
    decode_bad("marker type", c, len, "unknown marker type 9", true);
    /* Footer that does not match the header. */
    for (size_t i = ngr; i < n; i++)
        if (!rec[i].grain && rec[i].type == VMDK_MARKER_FOOTER) {
            memcpy(c, f, len);
            c[rec[i].off + 512 + 12] ^= 1;          /* capacity */
            decode_bad("footer", c, len, "does not match the header", true);
            memcpy(c, f, len);
            memset(c + rec[i].off + 512 + 56, 0xff, 8);   /* gd_offset */
            decode_bad("footer gd", c, len, "GD_AT_END", true);
            /* Footer removed: the header defers the GD to it. */
            memcpy(c, f, rec[i].off);
            memcpy(c + rec[i].off, f + rec[i].off + 1024, len - rec[i].off - 1024);
            decode_bad("no footer", c, len - 1024, "no footer", true);
            image_bad("no footer", c, len - 1024, "does not end with footer");
        }
    /* A zeroed grain record reads as an end-of-stream marker: the grains
     * after it must not be silently dropped. */
    memcpy(c, f, len);
    memset(c + rec[3].off, 0, rec[3].len);
    decode_bad("zeroed grain", c, len, "after the end-of-stream marker", true);
    /* A grain that inflates short and is not the disk's last. */
    {
        struct libdeflate_compressor *z = libdeflate_alloc_compressor(6);
        uint8_t *small = calloc(1, 1000);
        memcpy(c, f, len);
        memset(c + rec[2].off, 0, rec[2].len);
        size_t zn = libdeflate_zlib_compress(z, small, 1000, c + rec[2].off + 12,
                                             rec[2].len - 12);
        uint32_t zs = (uint32_t) zn;
        memcpy(c + rec[2].off, &rec[2].lba, 8);
        memcpy(c + rec[2].off + 8, &zs, 4);
        decode_bad("short grain", c, len, "inflates to 1000 bytes", true);
        free(small);
        libdeflate_free_compressor(z);
    }
    /* Truncated: no end-of-stream marker; every cut fails at finish. */
    static const size_t cuts[] = { 100, 511, 513, 65536, 70000, 1 << 20 };
    for (unsigned i = 0; i < sizeof cuts / sizeof *cuts; i++)
        decode_bad("truncated", f, cuts[i], cuts[i] < 65536 ? "ended" :
                   "end-of-stream", cuts[i] >= 65536);
    decode_bad("truncated at eos", f, len - 512, "end-of-stream", true);
    /* Header damage: refused before begin. */
    memcpy(c, f, len);
    c[0] = 'X';
    decode_bad("magic", c, len, "magic", false);
    /* Another format's header: named, and EMEDIUMTYPE as in every view. */
    memcpy(c, f, len);
    memcpy(c, "QFI\xfb", 4);
    decode_bad("qcow2", c, len, "its first sector is a qcow2 image", false);
    {
        struct disk d;
        struct vmdk_stream *s;
        disk_init(&d, 64u << 20);
        CHECK(vmdk_stream_new(&sink, &d, &s) == 0);
        CHECK(decode(s, c, len, 7, 65536) == -EMEDIUMTYPE);
        CHECK(vmdk_stream_first_kind(s) == IMAGE_QCOW2);
        vmdk_stream_free(s);
        disk_free(&d);
    }
    /* A descriptor still zero (qemu-img writes it last, seeking back). */
    memcpy(c, f, len);
    {
        uint64_t doff, dsize;
        memcpy(&doff, c + 28, 8);
        memcpy(&dsize, c + 36, 8);
        memset(c + le64toh(doff) * 512, 0, le64toh(dsize) * 512);
    }
    decode_bad("zero descriptor", c, len, "the descriptor is empty", false);
    memcpy(c, f, len);
    c[75] = '\n';                                   /* "\n \r\n" -> text mode */
    decode_bad("newline", c, len, "newline", false);
    memcpy(c, f, len);
    uint8_t *ct = memmem(c + 512, 1024, "createType=\"streamOptimized\"", 28);
    CHECK(ct);
    memcpy(ct, "createType=\"vmfs\"           ", 28);
    decode_bad("descriptor", c, len, "createType", false);
    free(c);
}

/* ---- monolithicSparse surgery ----------------------------------------------- */

static void test_sparse_surgery(const uint8_t *f, size_t len,
                                const uint8_t *raw)
{
    uint64_t gd, overhead;
    uint32_t gt0, e0, e1;
    memcpy(&gd, f + 0x38, 8);
    memcpy(&overhead, f + 0x40, 8);
    memcpy(&gt0, f + gd * 512, 4);
    memcpy(&e0, f + gt0 * 512, 4);
    memcpy(&e1, f + gt0 * 512 + 4, 4);
    CHECK(e0 >= overhead && e1 > e0);

    /* Grains in another file order (swap the first two and their GTEs). */
    uint8_t *c = dup_buf(f, len);
    memcpy(c + (size_t) e0 * 512, f + (size_t) e1 * 512, 65536);
    memcpy(c + (size_t) e1 * 512, f + (size_t) e0 * 512, 65536);
    memcpy(c + gt0 * 512, &e1, 4);
    memcpy(c + gt0 * 512 + 4, &e0, 4);
    decode_ok("qemu monolithicSparse, grains swapped", c, len, raw, RAW_SIZE,
              VMDK_MONOLITHIC_SPARSE);
    image_ok("qemu monolithicSparse, grains swapped", c, len, raw, RAW_SIZE);

    /* Map errors are refused before begin. */
    uint32_t v;
    memcpy(c, f, len);
    v = 3;
    memcpy(c + gt0 * 512 + 8, &v, 4);
    decode_bad("grain in overhead", c, len, "inside the overhead", false);
    image_bad("grain in overhead", c, len, "inside the overhead");
    memcpy(c, f, len);
    v = e0 + 1;
    memcpy(c + gt0 * 512 + 4, &v, 4);
    decode_bad("grains overlap", c, len, "overlap in the file", false);
    image_bad("grains overlap", c, len, "overlap");
    memcpy(c, f, len);
    v = (uint32_t) overhead + 10;
    memcpy(c + gd * 512, &v, 4);
    decode_bad("gt outside overhead", c, len, "not inside the overhead", false);
    memcpy(c, f, len);
    v = 2;
    memcpy(c + gd * 512, &v, 4);
    decode_bad("gt before gd", c, len, "precedes the grain directory", false);
    /* Truncated in the grains: fails at finish, naming the missing grain. */
    decode_bad("truncated", f, len - 70000, "grains missing", true);
    image_bad("truncated", f, len - 70000, "past the end of the file");
    decode_bad("truncated in metadata", f, 30 * 512, "inside the metadata",
               false);
    /* Backwards data. */
    struct disk d;
    struct vmdk_stream *s;
    disk_init(&d, 64u << 20);
    CHECK(vmdk_stream_new(&sink, &d, &s) == 0);
    CHECK(vmdk_stream_feed(s, 0, f, 200000) == 0);
    CHECK(vmdk_stream_feed(s, 100000, f + 100000, 512) == -EINVAL);
    CHECK(strstr(vmdk_stream_error(s), "goes backwards"));
    vmdk_stream_free(s);
    disk_free(&d);
    /* A sink error stops the stream and is returned as is. */
    disk_init(&d, 64u << 20);
    d.fail_after = 3;
    CHECK(vmdk_stream_new(&sink, &d, &s) == 0);
    CHECK(decode(s, f, len, 0, 0) == -EIO);
    CHECK(strstr(vmdk_stream_error(s), "placing"));
    vmdk_stream_free(s);
    disk_free(&d);
    free(c);
}

/* VMDKstream of a file whose size is not a multiple of 512: the last
 * grain inflates to the file's remaining bytes, short of the capacity. */
static void test_short_last_grain(void)
{
    uint8_t *raw = malloc(100000);
    uint64_t x = 5;
    for (size_t i = 0; i < 100000; i++)
        raw[i] = (uint8_t) rnd(&x);
    save("odd.raw", raw, 100000);
    sh("cd %s && /usr/bin/python3 -c 'import VMDKstream; "
       "VMDKstream.convert_to_stream(\"odd.raw\", \"odd.vmdk\")'", dir);
    size_t len;
    uint8_t *f = load("odd.vmdk", &len);
    uint8_t *padded = calloc(1, 100352);
    memcpy(padded, raw, 100000);
    decode_ok("vmdkstream, 100000-byte source", f, len, padded, 100352,
              VMDK_STREAM_OPTIMIZED);
    free(padded);
    free(f);
    free(raw);
}

/* qemu-img's streams end without an EOS marker when the last grain does
 * not compress (random data): the header's grain tables say when the
 * stream is complete. */
static uint32_t *qemu_gte(uint8_t *f, unsigned i)
{
    uint64_t gd;
    uint32_t gt;
    memcpy(&gd, f + 0x38, 8);
    memcpy(&gt, f + gd * 512, 4);
    return (uint32_t *) (f + (size_t) gt * 512 + 4 * i);
}

static void test_qemu_without_eos(const uint8_t *raw)
{
    enum { RSZ = 5u << 20 };            /* whole grains: no zero tail */
    uint8_t *rand_raw = malloc(RAW_SIZE);
    uint64_t x = 7;
    for (size_t i = 0; i < RAW_SIZE; i++)
        rand_raw[i] = (uint8_t) rnd(&x);
    save("rand.raw", rand_raw, RSZ);
    sh("cd %s && qemu-img convert -q -f raw -O vmdk -o "
       "subformat=streamOptimized rand.raw rand.vmdk", dir);
    size_t len;
    uint8_t *f = load("rand.vmdk", &len);
    struct rec rec[512];
    size_t n = records(f, len, rec, 512);
    for (size_t i = 0; i < n; i++)
        CHECK(rec[i].grain);                        /* no EOS, no footer */
    CHECK(n == RSZ / 65536);
    CHECK(rec[n - 1].off + rec[n - 1].len == len);
    decode_ok("qemu-img stream without EOS", f, len, rand_raw, RSZ,
              VMDK_STREAM_OPTIMIZED);
    image_ok("qemu-img stream without EOS", f, len, rand_raw, RSZ);

    /* Cut at a grain boundary: a grain the tables list is missing. */
    decode_bad("qemu cut before last grain", f, rec[n - 1].off,
               "1 of the 80 grains", true);
    decode_bad("qemu cut after first grain", f, rec[1].off, "still missing",
               true);
    decode_bad("qemu cut at overhead", f, rec[0].off, "still missing", false);
    decode_bad("qemu cut in last grain", f, rec[n - 1].off + 600,
               "inside a compressed grain", true);
    decode_bad("qemu cut in last padding", f, len - 1, "padding", true);
    /* Tables and markers disagree. */
    uint8_t *c = dup_buf(f, len);
    *qemu_gte(c, 3) = 0;
    decode_bad("qemu grain not in the tables", c, len,
               "not in the header's grain tables", true);
    memcpy(c, f, len);
    *qemu_gte(c, 100) = htole32(200);               /* past the capacity */
    decode_ok("qemu entry past the capacity ignored", c, len, rand_raw,
              RSZ, VMDK_STREAM_OPTIMIZED);
    memcpy(c, f, len);
    *qemu_gte(c, 3) = htole32(5);
    decode_bad("qemu table entry in the overhead", c, len,
               "inside the overhead", false);
    free(c);
    free(f);

    /* The fixture's own qemu-img stream (compressible): an extra table
     * entry for an all-zero grain is a grain that never comes. */
    f = load("qemu-stream.vmdk", &len);
    c = dup_buf(f, len);
    *qemu_gte(c, 2) = *qemu_gte(c, 3);
    decode_bad("qemu listed grain never comes", c, len, "still missing", true);
    free(c);
    free(f);

    /* An all-zero disk: no grains at all; the file is the overhead. */
    memset(rand_raw, 0, RAW_SIZE);
    save("zero.raw", rand_raw, RAW_SIZE);
    sh("cd %s && qemu-img convert -q -f raw -O vmdk -o "
       "subformat=streamOptimized zero.raw zero.vmdk", dir);
    f = load("zero.vmdk", &len);
    struct disk d;
    struct vmdk_stream *s;
    disk_init(&d, RAW_SIZE + 65536);
    CHECK(vmdk_stream_new(&sink, &d, &s) == 0);
    CHECK(decode(s, f, len, 3, 4096) == 0);
    CHECK(d.began && d.capacity == (RAW_SIZE + 511) / 512 * 512 && !d.calls);
    vmdk_stream_free(s);
    disk_free(&d);
    printf("  qemu-img all-zero stream (%zu bytes): begins, no data\n", len);
    free(f);
    free(rand_raw);
    (void) raw;
}

/* A zero grain (GTE 1: qemu-img's zeroed_grain, written by write -z)
 * ahead of a GTE that lies in the overhead: the grain map is refused
 * whole at the overhead's end, before begin(), nothing placed. */
static void test_zero_grain_first(void)
{
    size_t len, rlen;
    uint64_t gd;
    uint32_t gt0, e0, e16, v = 3;
    sh("cd %s && qemu-img create -q -f vmdk -o zeroed_grain=on zg.vmdk 4M && "
       "qemu-io -f vmdk -c 'write -z 0 64k' -c 'write -P 0x5a 64k 64k' "
       "-c 'write -P 0x6b 1M 64k' zg.vmdk >/dev/null && qemu-img convert -q "
       "-O raw zg.vmdk zg.raw", dir);
    uint8_t *f = load("zg.vmdk", &len), *raw = load("zg.raw", &rlen);
    memcpy(&gd, f + 0x38, 8);
    memcpy(&gt0, f + gd * 512, 4);
    memcpy(&e0, f + gt0 * 512, 4);
    memcpy(&e16, f + gt0 * 512 + 64, 4);
    CHECK(e0 == 1 && e16 > 1);                      /* zero grain; data */
    decode_ok("qemu monolithicSparse, zeroed_grain", f, len, raw, rlen,
              VMDK_MONOLITHIC_SPARSE);
    memcpy(f + gt0 * 512 + 64, &v, 4);
    decode_bad("zero grain ahead of a grain in the overhead", f, len,
               "inside the overhead", false);
    free(f);
    free(raw);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    snprintf(dir, sizeof dir, "/tmp/vmdk-test-XXXXXX");
    CHECK(mkdtemp(dir));
    uint8_t *raw = make_raw();
    make_fixtures();
    static const struct { const char *name; enum vmdk_kind kind; } fx[] = {
        { "qemu-stream.vmdk", VMDK_STREAM_OPTIMIZED },
        { "qemu-sparse.vmdk", VMDK_MONOLITHIC_SPARSE },
        { "vmdkstream.vmdk", VMDK_STREAM_OPTIMIZED },
    };
    for (unsigned i = 0; i < 3; i++) {
        size_t len;
        uint8_t *f = load(fx[i].name, &len);
        decode_ok(fx[i].name, f, len, raw, RAW_SIZE, fx[i].kind);
        image_ok(fx[i].name, f, len, raw, RAW_SIZE);
        if (i == 1)
            test_sparse_surgery(f, len, raw);
        if (i == 2)
            test_stream_surgery(f, len, raw);
        free(f);
    }
    test_short_last_grain();
    test_qemu_without_eos(raw);
    test_zero_grain_first();
    sh("rm -rf %s", dir);
    free(raw);
    printf("test-vmdk-stream: ok\n");
    return 0;
}
