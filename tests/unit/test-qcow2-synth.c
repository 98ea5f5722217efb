/* tests/unit/test-qcow2-synth.c: the synthesizer.  A disk's allocation
 * (its non-zero 4 KiB blocks, in order) is frozen, the qcow2 is read in
 * shuffled pieces of odd sizes, and the file must be what qemu-img check
 * finds clean and qemu-img compare finds equal to the disk; our own stream
 * decoder must read it back too.  Cluster sizes 512 B (many L2 tables,
 * refcount blocks and refcount-table clusters), 64 KiB and 2 MiB; a disk
 * size that is not a multiple of the cluster; an all-zero disk. */
#include "qcow2-util.h"

struct src {
    const uint8_t *raw;
    uint64_t size, reads;
};

static int read_disk(void *o, uint64_t off, void *buf, size_t len)
{
    struct src *s = o;
    CHECK(off + len <= s->size);
    memcpy(buf, s->raw + off, len);
    s->reads++;
    return 0;
}

static int read_fail(void *o, uint64_t off, void *buf, size_t len)
{
    (void) o, (void) off, (void) buf, (void) len;
    return -EIO;
}

/* Allocate the non-zero 4 KiB blocks; count clusters and L2 tables as a
 * view would without a synthesizer. */
static void allocate(struct qcow2_synth *q, const uint8_t *raw, uint64_t size,
                     uint32_t cb, uint64_t *clusters, uint64_t *tables)
{
    uint64_t last_c = UINT64_MAX, last_t = UINT64_MAX, per = (1ull << cb) / 8;
    *clusters = *tables = 0;
    for (uint64_t off = 0; off < size; off += 4096) {
        uint64_t n = size - off < 4096 ? size - off : 4096;
        bool zero = true;
        for (uint64_t i = 0; i < n && zero; i++)
            zero = raw[off + i] == 0;
        if (zero)
            continue;
        CHECK(qcow2_synth_allocate(q, off, n) == 0);
        for (uint64_t c = off >> cb; c <= (off + n - 1) >> cb; c++) {
            if (c == last_c)
                continue;
            (*clusters)++;
            if (c / per != last_t)
                (*tables)++;
            last_c = c;
            last_t = c / per;
        }
    }
}

static void one(const char *rawname, const uint8_t *raw, uint64_t size,
                uint32_t cb)
{
    struct nbdf_err e = { "" };
    struct qcow2_synth *q;
    uint64_t clusters, tables, x = cb;

    CHECK(qcow2_synth_new(size, cb, &q, &e) == 0);
    allocate(q, raw, size, cb, &clusters, &tables);
    CHECK(qcow2_synth_allocate(q, 0, 0) == -EINVAL);
    CHECK(qcow2_synth_seal(q) == 0);
    CHECK(qcow2_synth_allocate(q, 0, 512) == -EINVAL);     /* sealed */
    uint64_t fsize = qcow2_synth_file_size(q);
    CHECK(fsize == qcow2_synth_size(size, cb, clusters, tables));
    uint8_t *f = malloc(fsize);
    CHECK(f);
    memset(f, 0xee, fsize);
    /* Shuffled pieces of odd sizes, each read once. */
    uint64_t npieces = fsize / 7777 + 1;
    uint64_t *order = malloc(npieces * sizeof *order);
    for (uint64_t i = 0; i < npieces; i++)
        order[i] = i;
    for (uint64_t i = npieces - 1; i > 0; i--) {
        uint64_t j = rnd(&x) % (i + 1), t = order[i];
        order[i] = order[j], order[j] = t;
    }
    struct src s = { raw, size, 0 };
    for (uint64_t i = 0; i < npieces; i++) {
        uint64_t off = order[i] * 7777;
        size_t n = (size_t) (fsize - off < 7777 ? fsize - off : 7777);
        CHECK(qcow2_synth_read(q, off, f + off, n, read_disk, &s) ==
              (int64_t) n);
    }
    CHECK(qcow2_synth_read(q, fsize, f, 10, read_disk, &s) == 0);
    CHECK(qcow2_synth_read(q, fsize - 3, f + fsize - 3, 10, read_disk, &s) == 3);
    if (clusters)
        CHECK(qcow2_synth_read(q, fsize - (1u << cb), f, 512,
                               read_fail, NULL) == -EIO);
    CHECK(qcow2_synth_read(q, 0, f, 512, read_disk, &s) == 512);
    char name[64];
    snprintf(name, sizeof name, "synth-%u.qcow2", cb);
    save(name, f, fsize);
    sh("cd %s && qemu-img check -q %s && qemu-img compare -q -f raw -F qcow2 "
       "%s %s", dir, name, rawname, name);

    /* Our decoder reads it back with no spool: metadata comes first. */
    struct disk d;
    struct qcow2_stream *st;
    struct qcow2_stream_opts o = { 0 };
    disk_init(&d, size, NULL);
    CHECK(qcow2_stream_new(&sink_sync, &d, &o, &st) == 0);
    for (uint64_t off = 0; off < fsize; off += 100000)
        CHECK(qcow2_stream_feed(st, off, f + off, (size_t) (fsize - off <
              100000 ? fsize - off : 100000)) == 0);
    CHECK(qcow2_stream_finish(st) == 0);
    CHECK(d.size == size && memcmp(d.buf, raw, size) == 0);
    qcow2_stream_free(st);
    disk_free(&d);
    printf("  %s, %u-byte clusters: %" PRIu64 " data clusters in %" PRIu64
           " L2 tables, file %" PRIu64 " bytes; qemu-img check and compare "
           "agree\n", rawname, 1u << cb, clusters, tables, fsize);
    free(order);
    free(f);
    qcow2_synth_free(q);
}

int main(void)
{
    struct nbdf_err e = { "" };
    struct qcow2_synth *q;

    setvbuf(stdout, NULL, _IOLBF, 0);
    mkscratch();
    uint8_t *raw = make_raw("src.raw");
    one("src.raw", raw, RAW_SIZE, 9);
    one("src.raw", raw, RAW_SIZE, 16);
    one("src.raw", raw, RAW_SIZE, 21);

    /* 12 MiB of data in 512-byte clusters: several refcount-table
     * clusters. */
    uint64_t big = 12u << 20, x = 7;
    uint8_t *b = malloc(big);
    for (uint64_t i = 0; i < big; i += 8) {
        uint64_t v = rnd(&x);
        memcpy(b + i, &v, 8);
    }
    save("big.raw", b, big);
    one("big.raw", b, big, 9);
    free(b);

    uint8_t *z = calloc(1, 1u << 20);
    save("zero.raw", z, 1u << 20);
    one("zero.raw", z, 1u << 20, 16);
    free(z);

    CHECK(qcow2_synth_new(0, 16, &q, &e) == -EINVAL);
    CHECK(qcow2_synth_new(1u << 20, 8, &q, &e) == -EINVAL);
    CHECK(qcow2_synth_new(1ull << 50, 9, &q, &e) == -EFBIG && e.msg[0]);
    CHECK(qcow2_synth_size(0, 16, 0, 0) == 0);
    free(raw);
    rmscratch();
    printf("test-qcow2-synth: ok\n");
    return 0;
}
