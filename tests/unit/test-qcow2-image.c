/* tests/unit/test-qcow2-image.c: the random-access image reader
 * (qcow2_image_*) over images qemu-img and qemu-io make: versions 2 and
 * 3, cluster sizes 512 B to 2 MiB, compressed clusters (zlib, zstd),
 * extended L2 entries with subclusters allocated, zero and unallocated,
 * zero clusters, and a three-level backing chain.  Every image is read
 * whole through lookups (the L2 tables supplied when asked, compressed
 * clusters decompressed, backing files opened by name here) and must
 * equal `qemu-img convert -O raw` of it.  Damaged images (the L1 table or
 * an L2 table past the end of the file, an L2 table or a data cluster on
 * the metadata, reserved bits, a cut file) fail with the rule; an L2
 * entry's damage gives the same message from the reader as from the
 * stream decoder (one entry parser). */
#include "common/minmax.h"
#include "qcow2-util.h"

struct file {
    uint8_t *b;
    size_t len;
    struct qcow2_image *img;           /* NULL: raw */
    uint64_t size;
    struct file *backing;
};

static struct qcow2_decompressor *dz;
static uint8_t cluster[2u << 20];

/* Parse dir/name; 0 or the first failure (its message in e). */
static int open_file(const char *name, struct file *f, struct nbdf_err *e)
{
    uint64_t off;
    size_t n;
    int r;

    memset(f, 0, sizeof *f);
    f->b = load(name, &f->len);
    if ((r = qcow2_image_new(f->len, &f->img, e)) < 0)
        return r;
    while ((r = qcow2_image_next(f->img, &off, &n)) > 0) {
        CHECK(off <= f->len && n <= f->len - off);  /* asks inside the file */
        if ((r = qcow2_image_supply(f->img, f->b + off, e)) < 0)
            return r;
    }
    f->size = qcow2_image_header(f->img)->size;
    return r;
}

/* The backing chain below f, named by the headers (relative to dir). */
static void open_chain(struct file *f)
{
    const struct qcow2_header *h = qcow2_image_header(f->img);
    struct nbdf_err e = { "" };
    char name[128];

    if (!h->backing_file[0])
        return;
    CHECK(strlen(h->backing_file) < sizeof name);    /* made here: short */
    memcpy(name, h->backing_file, strlen(h->backing_file) + 1);
    CHECK((f->backing = calloc(1, sizeof *f->backing)));
    if (strcmp(h->backing_format, "raw") == 0) {
        f->backing->b = load(name, &f->backing->len);
        f->backing->size = f->backing->len;
        return;
    }
    CHECK(strcmp(h->backing_format, "qcow2") == 0);
    CHECK(open_file(name, f->backing, &e) == 0);
    open_chain(f->backing);
}

static void close_file(struct file *f)
{
    if (f->backing) {
        close_file(f->backing);
        free(f->backing);
    }
    qcow2_image_free(f->img);
    free(f->b);
}

/* Disk bytes [off, off+len) of f; 0 or the first failure. */
static int read_at(struct file *f, uint64_t off, uint8_t *out, uint64_t len,
                   struct nbdf_err *e)
{
    while (len > 0) {
        struct qcow2_place p, q;
        int r;
        if (off >= f->size) {
            memset(out, 0, len);
            return 0;
        }
        if (!f->img) {                                  /* raw backing */
            uint64_t n = MIN(len, f->size - off);
            memcpy(out, f->b + off, n);
            off += n, out += n, len -= n;
            continue;
        }
        if ((r = qcow2_image_lookup(f->img, off, NULL, 0, &p, e)) < 0)
            return r;
        if (p.src == QCOW2_SRC_L2) {
            CHECK(p.file_off + p.len <= f->len);
            /* Another table held: the lookup names the one it needs. */
            if (p.file_off != f->len - p.len) {
                CHECK(qcow2_image_lookup(f->img, off, f->b + f->len - p.len,
                                         f->len - p.len, &q, e) == 0);
                CHECK(q.src == QCOW2_SRC_L2 && q.file_off == p.file_off);
            }
            if ((r = qcow2_image_lookup(f->img, off, f->b + p.file_off,
                                        p.file_off, &q, e)) < 0)
                return r;
            CHECK(q.src != QCOW2_SRC_L2);
            p = q;
        }
        CHECK(p.len >= 1 && p.len <= f->size - off);
        uint64_t n = MIN(len, p.len);
        switch (p.src) {
        case QCOW2_SRC_FILE:
            CHECK(p.file_off + n <= f->len);
            memcpy(out, f->b + p.file_off, n);
            break;
        case QCOW2_SRC_ZERO:
            memset(out, 0, n);
            break;
        case QCOW2_SRC_BACKING:
            CHECK(f->backing);
            if ((r = read_at(f->backing, off, out, n, e)) < 0)
                return r;
            break;
        case QCOW2_SRC_COMPRESSED: {
            struct qcow2_compressed c;
            CHECK(p.file_off + p.clen <= f->len);
            qcow2_image_compressed(f->img, &p, f->b + p.file_off, &c);
            if (qcow2_compressed_decode(dz, &c, cluster, e) < 0)
                return -EINVAL;
            memcpy(out, cluster + (off - p.cluster), n);
            break;
        }
        default:
            CHECK(!"a place of no kind");
        }
        off += n, out += n, len -= n;
    }
    return 0;
}

/* dir/name read through the reader equals qemu-img's raw of it. */
static void check_image(const char *name)
{
    struct file f;
    struct nbdf_err e = { "" };
    char raw[128];
    size_t rlen;

    sh("cd %s && qemu-img convert -q -O raw %s want.raw", dir, name);
    snprintf(raw, sizeof raw, "want.raw");
    uint8_t *want = load(raw, &rlen);
    int r = open_file(name, &f, &e);
    if (r < 0)
        fprintf(stderr, "  %s: %s\n", name, e.msg);
    CHECK(r == 0);
    open_chain(&f);
    CHECK(f.size == rlen);
    uint8_t *got = malloc(rlen + 1);
    CHECK(got);
    r = read_at(&f, 0, got, rlen, &e);
    if (r < 0)
        fprintf(stderr, "  %s: %s\n", name, e.msg);
    CHECK(r == 0);
    CHECK(memcmp(got, want, rlen) == 0);
    /* Unaligned reads across clusters and subclusters. */
    for (uint64_t off = 1; off < rlen; off += 777777) {
        uint64_t n = MIN((uint64_t) 300001, rlen - off);
        CHECK(read_at(&f, off, got, n, &e) == 0);
        CHECK(memcmp(got, want + off, n) == 0);
    }
    printf("  %-22s %" PRIu64 " bytes, equal to qemu-img's raw\n", name, f.size);
    free(got);
    free(want);
    close_file(&f);
}

static void test_variants(void)
{
    static const char *const opts[][2] = {
        { "v2.qcow2", "-o compat=0.10" },
        { "v3.qcow2", "-o compat=1.1" },
        { "c512.qcow2", "-o cluster_size=512" },
        { "c2m.qcow2", "-o cluster_size=2M" },
        { "zlib.qcow2", "-c" },
        { "zstd.qcow2", "-c -o compression_type=zstd" },
        { "zlib4k.qcow2", "-c -o cluster_size=4k" },
        { "extl2.qcow2", "-o extended_l2=on" },
        { "extl2-16k.qcow2", "-o extended_l2=on,cluster_size=16k" },
    };
    printf("variants:\n");
    for (size_t i = 0; i < sizeof opts / sizeof *opts; i++) {
        sh("cd %s && qemu-img convert -q -f raw -O qcow2 %s src.raw %s", dir,
           opts[i][1], opts[i][0]);
        check_image(opts[i][0]);
    }
}

/* Zero clusters (v3 write -z), subclusters allocated, zero and left
 * unallocated (a backing file shows through them), a compressed cluster
 * in an overlay, a raw backing file, an overlay larger than its base. */
static void test_chain(void)
{
    printf("backing chains:\n");
    sh("cd %s && qemu-img convert -q -f raw -O qcow2 src.raw base.qcow2 && "
       "qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 -o extended_l2=on "
       "mid.qcow2 7M && qemu-io -c 'write -P 0x11 100k 3k' "
       "-c 'write -z 3M 40k' -c 'write -P 0x22 6M 100k' -c 'discard 2M 64k' "
       "mid.qcow2 >/dev/null && "
       "qemu-img create -q -f qcow2 -b mid.qcow2 -F qcow2 -o compat=0.10 "
       "top2.qcow2 7M && qemu-io -c 'write -P 0x33 1M 64k' "
       "-c 'write -P 0x44 130k 1k' top2.qcow2 >/dev/null && "
       "qemu-img create -q -f qcow2 -b mid.qcow2 -F qcow2 top3.qcow2 8M && "
       "qemu-io -c 'write -z 256k 128k' -c 'write -c -P 0x55 4M 64k' "
       "-c 'write -z -u 5M 64k' top3.qcow2 >/dev/null && "
       "qemu-img create -q -f qcow2 -b src.raw -F raw rawtop.qcow2 6M && "
       "qemu-io -c 'write -P 0x66 2M 1M' rawtop.qcow2 >/dev/null", dir);
    check_image("base.qcow2");
    check_image("mid.qcow2");
    check_image("top2.qcow2");
    check_image("top3.qcow2");
    check_image("rawtop.qcow2");
}

/* ---- damage --------------------------------------------------------------- */

static uint8_t *img;
static size_t img_len;

/* A copy of img with 8 bytes at 'at' set to v, saved as bad.qcow2 and cut
 * to len bytes (0: whole); read whole, the reader must fail with
 * 'needle' in its message.  Returns the message. */
static const char *damaged(const char *what, size_t at, uint64_t v,
                           size_t len, const char *needle)
{
    static struct nbdf_err e;
    struct file f;
    uint8_t *b = malloc(img_len);
    CHECK(b);
    memcpy(b, img, img_len);
    if (at)
        qcow2_put64_t(b + at, v);
    save("bad.qcow2", b, len ? len : img_len);
    free(b);
    memset(&e, 0, sizeof e);
    int r = open_file("bad.qcow2", &f, &e);
    if (r == 0) {
        uint8_t *buf = malloc(f.size);
        CHECK(buf);
        r = read_at(&f, 0, buf, f.size, &e);
        free(buf);
    }
    close_file(&f);
    printf("  %-36s %s\n", what, e.msg);
    CHECK(r == -EINVAL && strstr(e.msg, needle));
    return e.msg;
}

/* The stream decoder's message for bad.qcow2. */
static const char *stream_message(void)
{
    static char m[1024];
    struct disk d;
    struct qcow2_stream *s;
    size_t len;
    uint8_t *b = load("bad.qcow2", &len);
    disk_init(&d, 64u << 20, NULL);
    CHECK(qcow2_stream_new(&sink_sync, &d, NULL, &s) == 0);
    if (qcow2_stream_feed(s, 0, b, len) == 0)
        CHECK(qcow2_stream_finish(s) < 0);
    snprintf(m, sizeof m, "%s", qcow2_stream_error(s));
    qcow2_stream_free(s);
    disk_free(&d);
    free(b);
    return m;
}

static void test_damage(void)
{
    printf("damage:\n");
    sh("cd %s && qemu-img convert -q -f raw -O qcow2 src.raw d.qcow2", dir);
    img = load("d.qcow2", &img_len);
    uint64_t l1 = qcow2_be64_t(img + 40), rt = qcow2_be64_t(img + 48);
    uint64_t e0 = qcow2_be64_t(img + l1), l2 = e0 & 0x00fffffffffffe00ull;
    uint64_t d0 = qcow2_be64_t(img + l2), data = d0 & 0x00fffffffffffe00ull;
    CHECK(l2 && data);

    damaged("L1 table past the end", 40, 1ull << 30, 0,
            "the L1 table at byte 1073741824");
    damaged("L2 table past the end", l1, (1ull << 63) | (1ull << 40), 0,
            "past the end of the file");
    damaged("L2 table on the L1 table", l1, (1ull << 63) | l1, 0,
            "inside the L1 table");
    damaged("L2 table on the refcount table", l1, rt, 0,
            "inside the refcount table");
    damaged("L1 entry reserved bits", l1, e0 | 1, 0, "reserved bits");
    damaged("L1 entry not aligned", l1, e0 + 512, 0, "not cluster-aligned");
    damaged("data on the L1 table", l2, (1ull << 63) | l1, 0,
            "inside the L1 table");
    damaged("data on its own L2 table", l2, (1ull << 63) | l2, 0,
            "inside its own L2 table");
    damaged("data past the end", l2, (1ull << 63) | (1ull << 40), 0,
            "past the end of the file");
    damaged("compressed past the end", l2,
            (1ull << 62) | (4ull << 40), 0, "past the end of the file");
    damaged("compressed in the header", l2, (1ull << 62) | 512, 0,
            "inside the header");
    damaged("cut after the first L2 table", 0, 0, (size_t) data + 4096,
            "past the end of the file");
    damaged("shorter than a header", 0, 0, 40, "shorter than a qcow2 header");

    /* One entry parser: the reader and the stream say the same. */
    const char *m = damaged("L2 entry reserved bits", l2, d0 | 2, 0,
                            "reserved bits set");
    char copy[1024];
    snprintf(copy, sizeof copy, "%s", m);
    const char *sm = stream_message();
    printf("  %-36s %s\n", "  the stream decoder:", sm);
    CHECK(strcmp(copy, sm) == 0);
    free(img);

    sh("cd %s && qemu-img convert -q -f raw -O qcow2 -o compat=0.10 src.raw "
       "d2.qcow2", dir);
    img = load("d2.qcow2", &img_len);
    l1 = qcow2_be64_t(img + 40);
    l2 = qcow2_be64_t(img + l1) & 0x00fffffffffffe00ull;
    d0 = qcow2_be64_t(img + l2);
    m = damaged("zero flag in version 2", l2, d0 | 1, 0,
                "which version 2 does not have");
    snprintf(copy, sizeof copy, "%s", m);
    CHECK(strcmp(copy, stream_message()) == 0);
    free(img);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    mkscratch();
    free(make_raw("src.raw"));
    CHECK(qcow2_decompressor_new(&dz) == 0);
    test_variants();
    test_chain();
    test_damage();
    qcow2_decompressor_free(dz);
    rmscratch();
    printf("test-qcow2-image: ok\n");
    return 0;
}
