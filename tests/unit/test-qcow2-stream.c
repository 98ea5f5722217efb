/* tests/unit/test-qcow2-stream.c: the stream decoder against images made
 * here by qemu-img and qemu-io, in every variant the library takes:
 * versions 2 and 3, clusters of 512 B to 2 MiB, compressed with zlib and
 * zstd, preallocated, lazy refcounts, extended L2 entries, refcount
 * widths, zero clusters, a backing file, and files whose L2 or L1 table
 * comes after the data it maps (spooled).  Each file is fed in several
 * cuttings (1 byte to 1 MiB, zero runs as gaps or holes) and the disk must
 * equal `qemu-img convert -O raw` of it byte for byte.  A cut file fails
 * at finish.  A missing tool is a failure, not a skip. */
#include "qcow2-util.h"

enum mode { M_CHUNK, M_SPARSE_HOLES, M_SPARSE_GAPS };

struct feedspec {
    enum mode mode;
    size_t chunk;
};

static const struct feedspec feeds[] = {
    { M_CHUNK, 1u << 20 }, { M_CHUNK, 4096 }, { M_CHUNK, 65536 + 7 },
    { M_CHUNK, 511 }, { M_SPARSE_HOLES, 4096 }, { M_SPARSE_GAPS, 512 },
};

static int feed_all(struct qcow2_stream *st, const uint8_t *f, size_t len,
                    const struct feedspec *fs)
{
    int r = 0;
    for (size_t off = 0; off < len && r == 0;) {
        size_t n = len - off < fs->chunk ? len - off : fs->chunk;
        bool zero = fs->mode != M_CHUNK;
        for (size_t i = 0; zero && i < n; i++)
            zero = f[off + i] == 0;
        if (zero && fs->mode == M_SPARSE_HOLES)
            r = qcow2_stream_hole(st, off, n);
        else if (!zero)
            r = qcow2_stream_feed(st, off, f + off, n);
        /* M_SPARSE_GAPS: zeros are skipped, the next feed jumps */
        off += n;
    }
    if (r == 0 && fs->mode == M_SPARSE_GAPS)
        r = qcow2_stream_hole(st, len, 0);          /* the file's length */
    return r;
}

struct run {
    uint64_t spool_max;
    bool async;
    struct qcow2_stream_stats stats;
    char err[256];
};

/* Decode f onto a disk holding 'initial' (NULL: garbage, the image must be
 * standalone) and return finish's result; the disk goes to *out. */
static int decode(const uint8_t *f, size_t len, const struct feedspec *fs,
                  const uint8_t *initial, uint64_t cap, struct run *run,
                  struct disk *d)
{
    struct mspool ms = { 0 };
    struct qcow2_stream_opts o = {
        .spool_max = run->spool_max, .spool_option = "--test-spool",
    };
    struct qcow2_stream *st;

    disk_init(d, cap, initial);
    d->ms = &ms;
    d->async_compressed = run->async;
    CHECK(qcow2_stream_new(run->async ? &sink_async : &sink_sync, d, &o,
                           &st) == 0);
    int r = feed_all(st, f, len, fs);
    if (r == 0)
        r = qcow2_stream_finish(st);
    snprintf(run->err, sizeof run->err, "%s", qcow2_stream_error(st));
    qcow2_stream_stats(st, &run->stats);
    qcow2_stream_free(st);
    CHECK(ms.live == 0);                            /* every put dropped */
    ms_free(&ms);
    return r;
}

static void compare(const char *what, const struct disk *d,
                    const uint8_t *want, uint64_t size)
{
    CHECK(d->size == size);
    if (memcmp(d->buf, want, size) != 0) {
        uint64_t i = 0;
        while (d->buf[i] == want[i])
            i++;
        fprintf(stderr, "%s: disk differs at byte %" PRIu64 " (0x%02x, want "
                "0x%02x)\n", what, i, d->buf[i], want[i]);
        abort();
    }
}

/* Every cutting of file 'name' lands 'want' (the disk starts as
 * 'initial' for an overlay). */
static void decode_ok(const char *name, const uint8_t *initial,
                      uint64_t spool_max, uint64_t *spooled)
{
    char ref[128];
    size_t len, rlen;
    uint8_t *f = load(name, &len);
    snprintf(ref, sizeof ref, "%s.raw", name);
    sh("cd %s && qemu-img convert -q -O raw %s %s", dir, name, ref);
    uint8_t *want = load(ref, &rlen);
    *spooled = 0;
    for (size_t i = 0; i < sizeof feeds / sizeof *feeds; i++) {
        struct run run = { .spool_max = spool_max, .async = i % 2 };
        struct disk d;
        int r = decode(f, len, &feeds[i], initial, rlen, &run, &d);
        if (r != 0) {
            fprintf(stderr, "%s (feed %zu): %s\n", name, i, run.err);
            abort();
        }
        CHECK(run.stats.began);
        CHECK((d.kind == QCOW2_OVERLAY) == (initial != NULL));
        compare(name, &d, want, rlen);
        if (run.stats.spooled_clusters > *spooled)
            *spooled = run.stats.spooled_clusters;
        if (i == 0)
            printf("  %-14s %8zu bytes: %" PRIu64 " data, %" PRIu64
                   " compressed, %" PRIu64 " zero clusters, %" PRIu64
                   " L2 tables, %" PRIu64 " spooled\n", name, len,
                   run.stats.data_clusters, run.stats.compressed_clusters,
                   run.stats.zero_clusters, run.stats.l2_tables,
                   run.stats.spooled_clusters);
        disk_free(&d);
    }
    /* Byte by byte, once. */
    struct run run = { .spool_max = spool_max };
    struct disk d;
    struct feedspec one = { M_CHUNK, 1 };
    CHECK(decode(f, len, &one, initial, rlen, &run, &d) == 0);
    compare(name, &d, want, rlen);
    disk_free(&d);
    free(f);
    free(want);
}

/* Cut short anywhere after the header cluster: finish fails (or an
 * earlier call), nothing is ever written twice or out of range. */
static void cut_fails(const char *name, const uint8_t *initial)
{
    size_t len;
    uint8_t *f = load(name, &len);
    size_t cuts[] = { 100, 65536, len / 3, len / 2, len - 4096, len - 1 };
    for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
        if (cuts[i] >= len)
            continue;
        struct run run = { .spool_max = 64u << 20 };
        struct disk d;
        struct feedspec fs = { M_CHUNK, 65536 };
        int r = decode(f, cuts[i], &fs, initial, RAW_SIZE + (4u << 20),
                       &run, &d);
        /* A cut inside the trailing zero padding of a data cluster of
         * zeros is not a loss: only fail when data is missing. */
        if (r == 0) {
            bool tail_zero = true;
            for (size_t j = cuts[i]; j < len && tail_zero; j++)
                tail_zero = f[j] == 0;
            CHECK(tail_zero);
        } else
            CHECK(r == -EINVAL && run.err[0]);
        disk_free(&d);
    }
    printf("  %-14s cut short: refused (%s)\n", name, "finish");
    free(f);
}

/* ---- files whose tables come after their data -------------------------- */

static uint64_t hdr64(const uint8_t *f, size_t off) { return qcow2_be64_t(f + off); }

/* Move the cluster at 'from' to the end of the file (the copy becomes the
 * last cluster, the old place zeros), fix its refcounts (16-bit) and the
 * pointer 'ptr_at' (a byte offset of the 8-byte big-endian pointer, which
 * keeps its flag bits).  The image stays valid: qemu-img check is clean. */
static uint8_t *relocate(uint8_t *f, size_t *len, uint64_t from,
                         uint64_t ptr_at, uint32_t cluster_bits)
{
    uint64_t c = 1ull << cluster_bits, to = (*len + c - 1) & ~(c - 1);
    f = realloc(f, to + c);
    CHECK(f);
    memset(f + *len, 0, to - *len);
    memcpy(f + to, f + from, c);
    memset(f + from, 0, c);
    *len = to + c;
    uint64_t p = qcow2_be64_t(f + ptr_at);
    qcow2_put64_t(f + ptr_at, (p & ~0x00fffffffffffe00ull) | to);
    uint64_t rt = hdr64(f, 48);
    uint64_t rb = qcow2_be64_t(f + rt);             /* refcount block 0 */
    CHECK(rb && (to >> cluster_bits) < c / 2);
    uint8_t *e = f + rb + (from >> cluster_bits) * 2;
    e[0] = 0, e[1] = 0;
    e = f + rb + (to >> cluster_bits) * 2;
    e[0] = 0, e[1] = 1;
    return f;
}

static void relocated(const char *src, const uint8_t *raw)
{
    uint64_t spooled;
    size_t len;

    (void) raw;
    /* L2 table of the first 512 MiB after all data. */
    sh("cd %s && qemu-img convert -q -f raw -O qcow2 %s late-l2.qcow2", dir,
       src);
    uint8_t *f = load("late-l2.qcow2", &len);
    uint64_t l1 = hdr64(f, 40), l2 = qcow2_be64_t(f + l1) & 0x00fffffffffffe00ull;
    f = relocate(f, &len, l2, l1, 16);
    save("late-l2.qcow2", f, len);
    free(f);
    sh("cd %s && qemu-img check -q late-l2.qcow2", dir);   /* still valid */
    decode_ok("late-l2.qcow2", NULL, 64u << 20, &spooled);
    CHECK(spooled > 0);
    printf("  late L2: %" PRIu64 " clusters spooled\n", spooled);

    /* Not enough spool: a clear error naming the option. */
    f = load("late-l2.qcow2", &len);
    struct run run = { .spool_max = 128u << 10 };
    struct disk d;
    CHECK(decode(f, len, &feeds[0], NULL, RAW_SIZE, &run, &d) == -EFBIG);
    CHECK(strstr(run.err, "--test-spool"));
    CHECK(!run.stats.began || run.stats.data_clusters == 0 ||
          run.stats.spooled_clusters > 0);
    printf("  late L2 with 128 KiB of spool: %s\n", run.err);
    disk_free(&d);
    /* No spool at all: the same. */
    run = (struct run) { .spool_max = 0 };
    CHECK(decode(f, len, &feeds[0], NULL, RAW_SIZE, &run, &d) == -EFBIG);
    disk_free(&d);
    free(f);

    /* The L1 table after everything (begin only then), and compressed
     * clusters whose L2 table comes after them. */
    sh("cd %s && qemu-img convert -q -c -f raw -O qcow2 %s late-l1.qcow2",
       dir, src);
    f = load("late-l1.qcow2", &len);
    l1 = hdr64(f, 40);
    l2 = qcow2_be64_t(f + l1) & 0x00fffffffffffe00ull;
    f = relocate(f, &len, l2, l1, 16);
    f = relocate(f, &len, l1, 40, 16);
    save("late-l1.qcow2", f, len);
    free(f);
    sh("cd %s && qemu-img check -q late-l1.qcow2", dir);
    decode_ok("late-l1.qcow2", NULL, 64u << 20, &spooled);
    CHECK(spooled > 0);
    printf("  late L1 and L2 (compressed): %" PRIu64 " clusters spooled\n",
           spooled);
}

/* qemu-img convert -c packs compressed clusters byte by byte; the first
 * one of a new L2 table goes into the tail of the previous host cluster,
 * before the table, and a tiny one (a cluster of one byte value) lies
 * wholly inside the last sector of the compressed cluster before it.
 * 4 KiB clusters: an L2 table every 2 MiB.  Each cluster has 2 bits of
 * entropy per byte (about 1 KiB compressed), those at 2 and 4 MiB are
 * constant (a few bytes). */
static void tail_sector(void)
{
    uint64_t spooled, x = 99, size = 6u << 20;
    uint8_t *b = malloc(size);
    for (uint64_t i = 0; i < size; i++)
        b[i] = (uint8_t) (rnd(&x) & 3);
    memset(b + (2u << 20), 0x41, 4096);
    memset(b + (4u << 20), 0x42, 4096);
    save("pack.raw", b, size);
    free(b);
    sh("cd %s && qemu-img convert -q -c -f raw -O qcow2 -o cluster_size=4k "
       "pack.raw pack.qcow2", dir);
    decode_ok("pack.qcow2", NULL, 1u << 20, &spooled);
}

/* ---- variants -------------------------------------------------------------- */

static const struct { const char *name, *opts; } variants[] = {
    { "v3", "-o compat=1.1" },
    { "v2", "-o compat=0.10" },
    { "c512", "-o cluster_size=512" },
    { "c4k", "-o cluster_size=4k" },
    { "c2m", "-o cluster_size=2M" },
    { "zlib", "-c" },
    { "zlib-c4k", "-c -o cluster_size=4k" },
    { "zlib-v2", "-c -o compat=0.10" },
    { "zstd", "-c -o compression_type=zstd" },
    { "zstd-c2m", "-c -o compression_type=zstd,cluster_size=2M" },
    { "pre-meta", "-o preallocation=metadata" },
    { "pre-falloc", "-o preallocation=falloc" },
    { "pre-full", "-o preallocation=full" },
    { "lazy", "-o lazy_refcounts=on" },
    { "extl2", "-o extended_l2=on" },
    { "extl2-zlib", "-c -o extended_l2=on" },
    { "rc1", "-o refcount_bits=1" },
    { "rc2", "-o refcount_bits=2" },
    { "rc4", "-o refcount_bits=4" },
    { "rc8", "-o refcount_bits=8" },
    { "rc32", "-o refcount_bits=32" },
    { "rc64", "-o refcount_bits=64" },
};

int main(void)
{
    uint64_t spooled;
    char name[64];

    setvbuf(stdout, NULL, _IOLBF, 0);
    mkscratch();
    uint8_t *raw = make_raw("src.raw");
    sh("cd %s && qemu-img --version >/dev/null && qemu-io --version "
       ">/dev/null", dir);

    for (size_t i = 0; i < sizeof variants / sizeof *variants; i++) {
        snprintf(name, sizeof name, "%s.qcow2", variants[i].name);
        sh("cd %s && qemu-img convert -q -f raw -O qcow2 %s src.raw %s", dir,
           variants[i].opts, name);
        /* qemu-img convert writes each L2 table before the clusters it
         * maps, except that compressed data may fill the tail of the
         * previous host cluster before a new L2 table is written. */
        decode_ok(name, NULL, 1u << 20, &spooled);
    }
    cut_fails("v3.qcow2", NULL);
    cut_fails("zlib.qcow2", NULL);

    /* Zero clusters: the v3 flag, with and without a preallocated offset,
     * discarded clusters, rewritten data. */
    sh("cd %s && cp v3.qcow2 zero.qcow2 && qemu-io -f qcow2 "
       "-c 'write -z 0 128k' -c 'write -z -u 1M 64k' -c 'discard 2M 64k' "
       "-c 'write -P 0x5a 4M 4k' -c 'write -P 0x33 5M 12800' zero.qcow2 >/dev/null", dir);
    decode_ok("zero.qcow2", NULL, 0, &spooled);

    /* Subclusters: 4 KiB writes and zeroes inside 64 KiB clusters. */
    sh("cd %s && qemu-img create -q -f qcow2 -o extended_l2=on sub.qcow2 %u "
       "&& qemu-io -f qcow2 -c 'write -P 0x11 4k 4k' -c 'write -P 0x22 "
       "70k 10k' -c 'write -z 200k 8k' -c 'write -P 0x44 1M 64k' "
       "-c 'write -z 1028k 4k' sub.qcow2 >/dev/null", dir, RAW_SIZE);
    decode_ok("sub.qcow2", NULL, 0, &spooled);

    /* A backing file: the overlay lands on top of the base's disk. */
    sh("cd %s && qemu-img convert -q -f raw -O qcow2 src.raw base.qcow2 && "
       "qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 top.qcow2 && "
       "qemu-io -f qcow2 -c 'write -P 0xab 64k 128k' -c 'write -z 1M 256k' "
       "-c 'write -P 0xcd 3M 4k' -c 'discard 4M 64k' top.qcow2 >/dev/null", dir);
    decode_ok("top.qcow2", raw, 0, &spooled);
    sh("cd %s && qemu-img create -q -f qcow2 -o extended_l2=on -b base.qcow2 "
       "-F qcow2 top-sub.qcow2 && qemu-io -f qcow2 -c 'write -P 0xab 4k 4k' "
       "-c 'write -z 100k 8k' -c 'write -P 0x77 2M 100k' top-sub.qcow2 >/dev/null", dir);
    decode_ok("top-sub.qcow2", raw, 0, &spooled);
    sh("cd %s && qemu-img convert -q -c -O qcow2 -B base.qcow2 -F qcow2 "
       "top.qcow2 top-zlib.qcow2", dir);
    decode_ok("top-zlib.qcow2", raw, 0, &spooled);

    /* A chain base <- mid <- top lands as base, then mid, then top; after
     * `qemu-img rebase` top lands on base alone, after `qemu-img commit`
     * mid holds top's writes. */
    sh("cd %s && qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 mid.qcow2 "
       "&& qemu-io -f qcow2 -c 'write -P 0x21 0 1M' -c 'write -z 2M 64k' "
       "mid.qcow2 >/dev/null && qemu-img create -q -f qcow2 -b mid.qcow2 -F "
       "qcow2 chain-top.qcow2 && qemu-io -f qcow2 -c 'write -P 0x42 512k 1M' "
       "-c 'write -z 4M 4k' chain-top.qcow2 >/dev/null && qemu-img convert -q "
       "-O raw mid.qcow2 mid.raw", dir);
    size_t midlen;
    uint8_t *mid = load("mid.raw", &midlen);
    decode_ok("mid.qcow2", raw, 0, &spooled);
    decode_ok("chain-top.qcow2", mid, 0, &spooled);
    free(mid);
    sh("cd %s && cp chain-top.qcow2 rebased.qcow2 && qemu-img rebase -q -b "
       "base.qcow2 -F qcow2 rebased.qcow2", dir);
    decode_ok("rebased.qcow2", raw, 0, &spooled);
    sh("cd %s && qemu-img commit -q chain-top.qcow2 && cp mid.qcow2 "
       "committed.qcow2", dir);         /* into mid, base unchanged */
    decode_ok("committed.qcow2", raw, 1u << 20, &spooled);

    relocated("src.raw", raw);
    tail_sector();

    /* A discarded cluster reused by a later write whose L2 table lies
     * after it (4 KiB clusters: an L2 table per 2 MiB). */
    sh("cd %s && qemu-img create -q -f qcow2 -o cluster_size=4k reuse.qcow2 "
       "8M && qemu-io -f qcow2 -c 'write -P 1 0 4k' -c 'write -P 2 4k 4k' "
       "-c 'write -P 3 4M 4k' -c 'discard 0 4k' -c 'write -P 4 4100k 4k' "
       "reuse.qcow2 >/dev/null", dir);
    decode_ok("reuse.qcow2", NULL, 1u << 20, &spooled);
    CHECK(spooled == 1);
    /* A discarded cluster left with its stale bytes before a table that
     * comes later: free by its refcount, so not spooled. */
    sh("cd %s && qemu-img create -q -f qcow2 -o cluster_size=4k freed.qcow2 "
       "8M && qemu-io -f qcow2 -c 'write -P 1 0 64k' -c 'write -P 3 4M 4k' "
       "freed.qcow2 >/dev/null && qemu-io -c 'discard 0 64k' --image-opts "
       "driver=qcow2,pass-discard-request=off,file.filename=freed.qcow2 "
       ">/dev/null", dir);
    decode_ok("freed.qcow2", NULL, 0, &spooled);
    CHECK(spooled == 0);

    free(raw);
    rmscratch();
    printf("test-qcow2-stream: ok\n");
    return 0;
}
