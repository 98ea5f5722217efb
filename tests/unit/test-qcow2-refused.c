/* tests/unit/test-qcow2-refused.c: a refused table leaves the disk as it
 * was.  Images made here by qemu-img and qemu-io hold an L2 table whose
 * entry 0 is a zero cluster (qemu-io write -z, as qemu-img writes for
 * discards and zero runs) ahead of an entry that is damaged: a data
 * cluster whose refcount is 0, an entry into the L1 table's cluster, an
 * unaligned offset.  The decoder must refuse the image (EINVAL) with no
 * sink call at all: no begin() (which replaces a standalone disk), no
 * zero, no data, no map; the disk keeps every byte.  The same for an
 * overlay (its zero clusters are zero() calls), for an L2 table that comes
 * after the data it maps (that data is placed from the spool when the
 * table is applied), and for an L1 table written after two L2 tables of
 * which the second is damaged (the first would place its data).  Each
 * image undamaged lands as `qemu-img convert -O raw` says (the one whose
 * L1 table follows two L2 tables used to be refused: the map counted as
 * complete after the first table, and the spool holding the second was
 * dropped); each is fed whole and in pieces.  A missing tool is a
 * failure, not a skip. */
#include "qcow2-util.h"

#define MASK 0x00fffffffffffe00ull
#define COPIED (1ull << 63)
#define DISK (4u << 20)
#define MIN(a, b) ((a) < (b) ? (a) : (b))

static uint64_t maps;                             /* sink.map calls */

static int d_map(void *o, uint64_t off, uint64_t len, int what,
                 uint64_t file_off)
{
    (void) o, (void) off, (void) len, (void) what, (void) file_off;
    maps++;
    return 0;
}

static const struct nbdf_sink sink = {
    .begin = d_begin, .data = d_data, .zero = d_zero, .spool_put = d_put,
    .spool_get = d_get, .spool_drop = d_drop, .map = d_map,
};

/* Decode f[0, len) fed in pieces of 'chunk' onto a disk of DISK bytes
 * holding 'initial' (NULL: 0xee garbage); finish's result or the first
 * error, its message in msg. */
static int decode(const uint8_t *f, size_t len, size_t chunk,
                  const uint8_t *initial, struct disk *d, char msg[256])
{
    struct mspool ms = { 0 };
    struct qcow2_stream_opts o = { 64u << 20, "--spool", 0 };
    struct qcow2_stream *st;

    maps = 0;
    disk_init(d, DISK, initial);
    d->ms = &ms;
    CHECK(qcow2_stream_new(&sink, d, &o, &st) == 0);
    int r = 0;
    for (size_t off = 0; off < len && r == 0; off += chunk)
        r = qcow2_stream_feed(st, off, f + off, MIN(chunk, len - off));
    if (r == 0)
        r = qcow2_stream_finish(st);
    snprintf(msg, 256, "%s", qcow2_stream_error(st));
    qcow2_stream_free(st);
    CHECK(ms.live == 0);
    ms_free(&ms);
    return r;
}

static const size_t chunks[] = { SIZE_MAX, 4096, 65536 + 7 };

/* Undamaged, f lands as qemu-img reads 'name'. */
static void lands(const char *name, const uint8_t *f, size_t len,
                  const uint8_t *initial)
{
    size_t rlen;
    char ref[96], msg[256];
    snprintf(ref, sizeof ref, "%s.raw", name);
    sh("cd %s && qemu-img check -q %s && qemu-img convert -q -O raw %s %s",
       dir, name, name, ref);
    uint8_t *want = load(ref, &rlen);
    CHECK(rlen == DISK);
    for (size_t i = 0; i < sizeof chunks / sizeof *chunks; i++) {
        struct disk d;
        int r = decode(f, len, chunks[i], initial, &d, msg);
        if (r != 0)
            fprintf(stderr, "%s: %s\n", name, msg);
        CHECK(r == 0 && d.began && memcmp(d.buf, want, DISK) == 0);
        disk_free(&d);
    }
    printf("  %-22s lands\n", name);
    free(want);
}

/* Damaged, f is refused with no sink call and the disk as it was. */
static void refused(const char *what, const uint8_t *f, size_t len,
                    const uint8_t *initial, const char *needle)
{
    char msg[256];
    for (size_t i = 0; i < sizeof chunks / sizeof *chunks; i++) {
        struct disk d;
        int r = decode(f, len, chunks[i], initial, &d, msg);
        if (r != -EINVAL || !strstr(msg, needle) || d.began || d.data_calls ||
            d.zero_calls || maps) {
            fprintf(stderr, "%s (pieces of %zu): %d \"%s\" (want \"%s\"), "
                    "began %d, %" PRIu64 " data, %" PRIu64 " zero, %" PRIu64
                    " map calls\n", what, chunks[i], r, msg, needle, d.began,
                    d.data_calls, d.zero_calls, maps);
            abort();
        }
        for (size_t j = 0; j < DISK; j++)
            CHECK(d.buf[j] == (initial ? initial[j] : 0xee));
        disk_free(&d);
        if (i == 0)
            printf("  refused, disk untouched: %s: %s\n", what, msg);
    }
}

static uint64_t l1_of(const uint8_t *f) { return qcow2_be64_t(f + 40); }
static uint64_t l2_of(const uint8_t *f, unsigned i)
{
    return qcow2_be64_t(f + l1_of(f) + 8 * i) & MASK;
}

/* Entry j of L2 table i. */
static uint8_t *entry(uint8_t *f, unsigned i, unsigned j)
{
    return f + l2_of(f, i) + 8 * j;
}

/* Move the cluster at 'from' to the end of the file (the old place
 * zeros), fix the 16-bit refcounts and the pointer at 'ptr_at' (flags
 * kept): the image stays valid. */
static uint8_t *relocate(uint8_t *f, size_t *len, uint64_t from,
                         uint64_t ptr_at, unsigned cb)
{
    uint64_t c = 1ull << cb, to = (*len + c - 1) & ~(c - 1);
    CHECK((f = realloc(f, to + c)));
    memset(f + *len, 0, to - *len);
    memcpy(f + to, f + from, c);
    memset(f + from, 0, c);
    *len = to + c;
    uint64_t p = qcow2_be64_t(f + ptr_at);
    qcow2_put64_t(f + ptr_at, (p & ~MASK) | to);
    uint64_t rb = qcow2_be64_t(f + qcow2_be64_t(f + 48));
    CHECK(rb && (to >> cb) < c / 2);
    f[rb + (from >> cb) * 2] = 0, f[rb + (from >> cb) * 2 + 1] = 0;
    f[rb + (to >> cb) * 2] = 0, f[rb + (to >> cb) * 2 + 1] = 1;
    return f;
}

static uint8_t *copy(const uint8_t *f, size_t len)
{
    uint8_t *c = malloc(len);
    CHECK(c);
    return memcpy(c, f, len);
}

/* The three damages of entry j of table 0 (entry 0 the zero cluster
 * before it): refcount 0, into the L1 cluster, unaligned. */
static void damages(const char *name, const uint8_t *img, size_t len,
                    unsigned j, const uint8_t *initial)
{
    char what[128];
    uint8_t *f = copy(img, len);
    CHECK(qcow2_be64_t(entry(f, 0, 0)) == 1);     /* a zero cluster, no offset */
    uint64_t e = qcow2_be64_t(entry(f, 0, j)), x = e & MASK;
    CHECK(x && (e & 1) == 0);

    uint64_t rb = qcow2_be64_t(f + qcow2_be64_t(f + 48));
    f[rb + (x >> 16) * 2] = 0, f[rb + (x >> 16) * 2 + 1] = 0;
    snprintf(what, sizeof what, "%s, data cluster with refcount 0", name);
    refused(what, f, len, initial, "refcount is 0");

    memcpy(f, img, len);
    qcow2_put64_t(entry(f, 0, j), COPIED | l1_of(f));
    snprintf(what, sizeof what, "%s, entry into the L1 table", name);
    refused(what, f, len, initial, "claimed twice");

    memcpy(f, img, len);
    qcow2_put64_t(entry(f, 0, j), e + 512);
    snprintf(what, sizeof what, "%s, unaligned entry", name);
    refused(what, f, len, initial, "not cluster-aligned");
    free(f);
}

int main(void)
{
    size_t len;

    setvbuf(stdout, NULL, _IOLBF, 0);
    mkscratch();

    /* Standalone: entry 0 zero, entry 1 data, entry 16 data. */
    sh("cd %s && qemu-img create -q -f qcow2 zd.qcow2 4M && qemu-io -f qcow2 "
       "-c 'write -z 0 64k' -c 'write -P 0x5a 64k 64k' -c 'write -P 0x6b 1M "
       "64k' zd.qcow2 >/dev/null", dir);
    uint8_t *zd = load("zd.qcow2", &len);
    lands("zd.qcow2", zd, len, NULL);
    damages("standalone", zd, len, 1, NULL);

    /* The same L2 table after the data it maps: entry 1's cluster has
     * passed (spooled), entry 16 is damaged. */
    zd = relocate(zd, &len, l2_of(zd, 0), l1_of(zd), 16);
    save("late.qcow2", zd, len);
    lands("late.qcow2", zd, len, NULL);
    uint8_t *f = copy(zd, len);
    qcow2_put64_t(entry(f, 0, 16), qcow2_be64_t(entry(f, 0, 16)) + 512);
    refused("L2 after its data, entry 16 unaligned", f, len, NULL,
            "not cluster-aligned");
    memcpy(f, zd, len);
    qcow2_put64_t(entry(f, 0, 16), COPIED | l1_of(f));
    refused("L2 after its data, entry 16 into the L1", f, len, NULL,
            "claimed twice");
    free(f);
    free(zd);

    /* An overlay: its zero clusters are zero() calls over the backing
     * file's data; the disk holds the base. */
    uint64_t x = 7;
    uint8_t *base = malloc(DISK);
    for (size_t i = 0; i < DISK; i++)
        base[i] = (uint8_t) rnd(&x);
    save("base.raw", base, DISK);
    sh("cd %s && qemu-img convert -q -f raw -O qcow2 base.raw base.qcow2 && "
       "qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 top.qcow2 && "
       "qemu-io -f qcow2 -c 'write -z 0 64k' -c 'write -P 0x5a 64k 64k' "
       "-c 'write -P 0x6b 1M 64k' top.qcow2 >/dev/null", dir);
    uint8_t *top = load("top.qcow2", &len);
    lands("top.qcow2", top, len, base);
    damages("overlay", top, len, 1, base);
    free(top);

    /* 4 KiB clusters, an L2 table per 2 MiB; both tables and then the L1
     * table moved to the end: the L1 table arrives last, both L2 tables
     * come from the spool, the first whole and good (data, a zero
     * cluster), the second damaged. */
    sh("cd %s && qemu-img create -q -f qcow2 -o cluster_size=4k two.qcow2 4M "
       "&& qemu-io -f qcow2 -c 'write -P 0x21 0 4k' -c 'write -z 4k 4k' "
       "-c 'write -P 0x22 2M 4k' -c 'write -P 0x23 2052k 4k' two.qcow2 "
       ">/dev/null", dir);
    uint8_t *two = load("two.qcow2", &len);
    CHECK(l2_of(two, 0) && l2_of(two, 1));
    two = relocate(two, &len, l2_of(two, 0), l1_of(two), 12);
    two = relocate(two, &len, l2_of(two, 1), l1_of(two) + 8, 12);
    two = relocate(two, &len, l1_of(two), 40, 12);
    save("l1-last.qcow2", two, len);
    lands("l1-last.qcow2", two, len, NULL);
    f = copy(two, len);
    qcow2_put64_t(entry(f, 1, 1), qcow2_be64_t(entry(f, 1, 1)) + 512);
    refused("L1 last, second L2 table unaligned", f, len, NULL,
            "not cluster-aligned");
    memcpy(f, two, len);
    uint64_t y = qcow2_be64_t(entry(f, 1, 1)) & MASK;
    uint64_t rb = qcow2_be64_t(f + qcow2_be64_t(f + 48));
    f[rb + (y >> 12) * 2] = 0, f[rb + (y >> 12) * 2 + 1] = 0;
    refused("L1 last, second L2 table, refcount 0", f, len, NULL,
            "refcount is 0");
    free(f);
    free(two);

    free(base);
    rmscratch();
    printf("test-qcow2-refused: ok\n");
    return 0;
}
