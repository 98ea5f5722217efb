/* tests/unit/test-vhdx-stream.c: the VHDX stream decoder against files
 * made by qemu-img (dynamic and fixed, block sizes 1 to 256 MiB, ZERO block
 * states on and off) and files built here for what qemu-img cannot write
 * (differencing with partially present blocks and sector bitmaps, 4096-byte
 * logical sectors, the BAT and metadata after the data, a log to replay:
 * replayed as qemu-img replays it, its torn, foreign and tail-less entries
 * ignored, refused when it writes behind itself).
 *
 * Each file is fed in several cuttings (1 byte to 4 MiB pieces, zero runs
 * sent as gaps) onto a disk that starts dirty, and the disk must equal
 * what qemu-img convert -O raw gives (or, for the built files, the image
 * the builder meant).  Damaged files must fail with a message, and before
 * begin() where the rule can be checked there.  A missing tool is a
 * failure, not a skip. */
#undef NDEBUG
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vhdx/vhdx.h"
#include "test-util.h"
#include "vhdx-build.h"

#define MiB (1ull << 20)

/* ---- the sink: a disk in memory, and a spool ------------------------------- */

struct piece { uint64_t off, len; uint8_t *data; };

struct disk {
    uint8_t *bytes;
    uint64_t size;
    bool began, diff;
    struct piece *spool;
    size_t nspool;
    uint64_t written;
};

static int d_begin(void *o, const struct nbdf_begin *b)
{
    const struct vhdx_info *info = b->info;
    CHECK(b->size == info->meta.disk_size &&
          b->overlay == info->meta.has_parent);
    struct disk *d = o;
    CHECK(!d->began);
    CHECK(info->meta.disk_size == d->size);
    d->began = true;
    d->diff = info->meta.has_parent;
    if (!d->diff)
        memset(d->bytes, 0, d->size);        /* the caller zeroes the disk */
    return 0;
}

static int d_data(void *o, uint64_t off, const void *buf, size_t len)
{
    struct disk *d = o;
    CHECK(d->began && off + len <= d->size && len > 0);
    memcpy(d->bytes + off, buf, len);
    d->written += len;
    return 0;
}

static int d_zero(void *o, uint64_t off, uint64_t len)
{
    struct disk *d = o;
    CHECK(d->began && d->diff && off + len <= d->size);
    memset(d->bytes + off, 0, len);
    return 0;
}

static int d_put(void *o, uint64_t off, const void *buf, size_t len)
{
    struct disk *d = o;
    d->spool = realloc(d->spool, (d->nspool + 1) * sizeof *d->spool);
    CHECK(d->spool);
    uint8_t *c = malloc(len);
    CHECK(c);
    memcpy(c, buf, len);
    d->spool[d->nspool++] = (struct piece){ off, len, c };
    return 0;
}

static int d_get(void *o, uint64_t off, void *buf, size_t len)
{
    struct disk *d = o;
    for (size_t i = d->nspool; i-- > 0;) {   /* newest first: re-spools */
        struct piece *p = &d->spool[i];
        if (p->off <= off && off + len <= p->off + p->len) {
            memcpy(buf, p->data + (off - p->off), len);
            return 0;
        }
    }
    CHECK(!"spool_get of bytes never put");
    return -EIO;
}

static const struct nbdf_sink sink = { .begin = d_begin, .data = d_data,
                                       .zero = d_zero, .spool_put = d_put,
                                       .spool_get = d_get };

static void disk_free(struct disk *d)
{
    for (size_t i = 0; i < d->nspool; i++)
        free(d->spool[i].data);
    free(d->spool);
    free(d->bytes);
}

static bool is_zero(const uint8_t *p, size_t n)
{
    return n == 0 || (p[0] == 0 && memcmp(p, p + 1, n - 1) == 0);
}

/* Feed file[0, len) cut by 'cut' (0: random pieces; else that size); zero
 * pieces at 64 KiB boundaries may go as gaps.  Returns the decoder's
 * result; *st gets its stats. */
static int feed(const uint8_t *file, size_t len, struct disk *d,
                uint64_t cut, bool gaps, uint64_t spool_max, char *msg,
                struct vhdx_stream_stats *st)
{
    struct vhdx_stream *s;
    struct vhdx_stream_config cfg = { spool_max, "--spool-max" };
    CHECK(vhdx_stream_new(&sink, d, &cfg, &s) == 0);
    int r = 0;
    uint64_t off = 0;
    unsigned seed = (unsigned) len;
    while (off < len && r == 0) {
        uint64_t n = cut ? cut : 1 + rand_r(&seed) % (4 * MiB);
        if (n > len - off)
            n = len - off;
        if (gaps && off % 65536 == 0 && n >= 65536)
            n = 65536;
        if (gaps && n == 65536 && is_zero(file + off, n))
            ;                                /* a gap: skip it */
        else
            r = vhdx_stream_feed(s, off, file + off, n);
        off += n;
    }
    if (r == 0)                              /* trailing zeros skipped */
        r = vhdx_stream_feed(s, len, NULL, 0);
    if (r == 0)
        r = vhdx_stream_finish(s);
    if (msg)
        snprintf(msg, 256, "%s", vhdx_stream_error(s));
    if (st)
        vhdx_stream_stats(s, st);
    vhdx_stream_free(s);
    return r;
}

static void disk_init(struct disk *d, uint64_t size, const uint8_t *start)
{
    memset(d, 0, sizeof *d);
    d->size = size;
    d->bytes = malloc(size);
    CHECK(d->bytes);
    if (start)
        memcpy(d->bytes, start, size);
    else
        memset(d->bytes, 0xEE, size);        /* dirty: old data */
}

/* Decode file in every cutting and compare with want. */
static void check_decodes(const char *what, const uint8_t *file, size_t len,
                          const uint8_t *want, uint64_t size,
                          const uint8_t *base)
{
    static const uint64_t cuts[] = { 0, 1 << 20, 65536, 4096 + 512, 4 << 20 };
    for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++)
        for (int gaps = 0; gaps < 2; gaps++) {
            if (cuts[c] && cuts[c] < 65536 && len > (64 << 20))
                continue;                    /* small cuts: small files */
            struct disk d;
            disk_init(&d, size, base);
            char msg[256];
            int r = feed(file, len, &d, cuts[c], gaps, 256 * MiB, msg, NULL);
            if (r != 0 || memcmp(d.bytes, want, size) != 0) {
                fprintf(stderr, "%s: cut %" PRIu64 " gaps %d: r=%d (%s), "
                        "disk %s\n", what, cuts[c], gaps, r, msg,
                        r ? "-" : "differs");
                abort();
            }
            disk_free(&d);
        }
    printf("ok %s\n", what);
}

/* ---- the source disk -------------------------------------------------------- */

/* Data runs, all-zero runs, holes; a size that is not a multiple of the
 * block size. */
static uint8_t *make_raw(uint64_t size)
{
    uint8_t *b = calloc(1, size);
    CHECK(b);
    unsigned seed = 7;
    for (uint64_t off = 0; off < size; off += 3 * MiB + 12288) {
        uint64_t n = 512 + rand_r(&seed) % (2 * MiB);
        if (off + n > size)
            n = size - off;
        for (uint64_t i = 0; i < n; i++)
            b[off + i] = (uint8_t) (rand_r(&seed) >> 3) | 1;
    }
    memset(b + size - 4096, 0x5A, 4096);     /* the last sectors */
    return b;
}

static void qemu_case(const char *opts, uint64_t size)
{
    uint8_t *raw = make_raw(size);
    save("src.raw", raw, size);
    sh("qemu-img convert -q -f raw -O vhdx -o %s %s/src.raw %s/t.vhdx",
       opts, dir, dir);
    sh("qemu-img convert -q -f vhdx -O raw %s/t.vhdx %s/back.raw", dir, dir);
    size_t blen, flen;
    uint8_t *back = load("back.raw", &blen);
    CHECK(blen == size && memcmp(back, raw, size) == 0);  /* qemu agrees */
    uint8_t *file = load("t.vhdx", &flen);
    char what[128];
    snprintf(what, sizeof what, "qemu-img %s, %" PRIu64 " bytes", opts, size);
    check_decodes(what, file, flen, raw, size, NULL);
    free(file);
    free(back);
    free(raw);
}

/* ---- files built here -------------------------------------------------------- */

static uint8_t *pattern(uint64_t size, unsigned seed)
{
    uint8_t *b = malloc(size);
    CHECK(b);
    for (uint64_t i = 0; i < size; i++)
        b[i] = (uint8_t) (rand_r(&seed) >> 5);
    memset(b + MiB, 0, 256 * 1024);          /* zeros inside data */
    return b;
}

static void built_case(const char *what, const struct spec *sp)
{
    uint8_t *content = pattern(sp->disk_size, 3), *base = pattern(sp->disk_size, 9);
    uint8_t *want = malloc(sp->disk_size);
    size_t flen;
    uint8_t *f = build(sp, content, base, want, &flen);
    if (sp->diff)
        check_decodes(what, f, flen, want, sp->disk_size, base);
    else
        check_decodes(what, f, flen, want, sp->disk_size, NULL);
    if (!sp->diff && sp->lsec == 512 && !sp->regions_last) {
        /* qemu-img reads what we built the same way. */
        save("built.vhdx", f, flen);
        sh("qemu-img convert -q -f vhdx -O raw %s/built.vhdx %s/built.raw", dir, dir);
        size_t blen;
        uint8_t *back = load("built.raw", &blen);
        CHECK(blen == sp->disk_size && memcmp(back, want, blen) == 0);
        free(back);
    }
    free(f); free(want); free(content); free(base);
}

/* ---- refusals ------------------------------------------------------------------ */

static void expect_refusal(const char *what, uint8_t *f, size_t len, int code,
                           const char *needle, bool before_begin,
                           uint64_t spool_max)
{
    struct disk d;
    disk_init(&d, 8 * MiB, NULL);             /* every case: an 8 MiB disk */
    char msg[256];
    int r = feed(f, len, &d, 0, false, spool_max, msg, NULL);
    if (r != code || !strstr(msg, needle) || (before_begin && d.began)) {
        fprintf(stderr, "%s: r=%d (want %d) msg '%s' (want '%s') began %d\n",
                what, r, code, msg, needle, d.began);
        abort();
    }
    disk_free(&d);
    printf("ok refused: %s: %s\n", what, msg);
}

/* The BAT's file offset, from the first region table. */
static uint64_t bat_at(const uint8_t *f)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | f[192 * 1024 + 32 + i];
    return v;
}

static void refusals(void)
{
    struct spec sp = { .disk_size = 8 * MiB, .block_size = MiB, .lsec = 512 };
    uint8_t *content = pattern(sp.disk_size, 1), *want = malloc(sp.disk_size);
    size_t len;
    uint8_t *f;

#define CASE(mutate, code, needle, early, smax) do {                     \
        f = build(&sp, content, content, want, &len);                    \
        mutate;                                                          \
        expect_refusal(#mutate, f, len, code, needle, early, smax);      \
        free(f); } while (0)

    CASE(memcpy(f, "qcow", 4), -EMEDIUMTYPE, "not a VHDX", true, 0);
    CASE((f[64 * 1024 + 20] ^= 1, f[128 * 1024 + 20] ^= 1), -EINVAL, "CRC-32C", true, 0);
    CASE((f[192 * 1024 + 8] = 0, fix_crc(f + 192 * 1024, 65536),
          f[256 * 1024 + 8] = 0, fix_crc(f + 256 * 1024, 65536)),
         -EINVAL, "no BAT region", true, 0);
    CASE((put64(f + 4 * MiB, 0 | 6)), -EINVAL, "overlaps the header section", true, 0);
    CASE((put64(f + 4 * MiB + 8, (4 * MiB) | 6)), -EINVAL, "overlaps the BAT", true, 0);
    CASE((put64(f + 4 * MiB + 8, (5 * MiB) | 6)), -EINVAL, "two blocks overlap", true, 0);
    CASE((put64(f + 4 * MiB, (5 * MiB) | 4)), -EINVAL, "unknown block state", true, 0);
    CASE((put32(f + 3 * MiB + 65536, 3 * MiB)), -EINVAL, "block size", true, 0);
    CASE((put32(f + 3 * MiB + 65536 + 8192, 1024)), -EINVAL, "sector sizes", true, 0);
    CASE(memset(f + 3 * MiB + 32, 0xAB, 16), -ENOTSUP, "required item", true, 0);
    CASE(len -= 3 * MiB / 2, -EINVAL, "cut short", false, 0);   /* into the last block */
    CASE(len = 200 * 1024, -EINVAL, "header section", true, 0);
    sp.log_pending = true;
    sp.log_flags = LOG_BEHIND;
    CASE((void) 0, -ENOTSUP, "qemu-img check -r all", true, 0);
    sp.log_flags = LOG_CUT;
    CASE((void) 0, -EINVAL, "its log says", false, 0);
    sp.log_flags = 0;
    CASE((put64(f + 64 * 1024 + 72, 6 * MiB), fix_crc(f + 64 * 1024, 4096),
          put64(f + 128 * 1024 + 72, 6 * MiB), fix_crc(f + 128 * 1024, 4096)),
         -ENOTSUP, "after the metadata or BAT", true, 0);
    sp.log_pending = false;
    sp.regions_last = true;
    CASE((void) 0, -EFBIG, "--spool-max", true, 2 * MiB);
    /* A zero block of a differencing file (a zero() call once begun)
     * ahead of an entry into the BAT, the BAT before and after the
     * blocks: the BAT is refused whole, nothing is called. */
    static const uint8_t zero_first[8] = {
        VHDX_PB_ZERO, VHDX_PB_FULLY_PRESENT, VHDX_PB_FULLY_PRESENT,
        VHDX_PB_FULLY_PRESENT, VHDX_PB_FULLY_PRESENT, VHDX_PB_FULLY_PRESENT,
        VHDX_PB_FULLY_PRESENT, VHDX_PB_FULLY_PRESENT };
    sp.diff = true;
    sp.states = zero_first;
    for (int last = 0; last < 2; last++) {
        sp.regions_last = last;
        CASE((put64(f + bat_at(f) + 8, bat_at(f) | 6)), -EINVAL,
             "overlaps the BAT", true, 16 * MiB);
    }
    sp.diff = false;
    sp.states = NULL;
#undef CASE
    /* A damaged first region table: the second copy is used. */
    sp.regions_last = false;
    f = build(&sp, content, content, want, &len);
    f[192 * 1024 + 40] ^= 1;
    struct disk d;
    disk_init(&d, sp.disk_size, NULL);
    CHECK(feed(f, len, &d, 0, false, 0, NULL, NULL) == 0);
    CHECK(memcmp(d.bytes, want, sp.disk_size) == 0);
    disk_free(&d);
    free(f);
    printf("ok a bad first region table falls back to the second\n");
    free(content);
    free(want);
}

/* ---- the log ---------------------------------------------------------------- */

/* Decode f once (random cutting) onto a dirty disk of size; the disk. */
static uint8_t *decode(const uint8_t *f, size_t len, uint64_t size,
                       const uint8_t *base)
{
    struct disk d;
    disk_init(&d, size, base);
    char msg[256];
    int r = feed(f, len, &d, 0, true, 256 * MiB, msg, NULL);
    if (r != 0) {
        fprintf(stderr, "decode: r=%d (%s)\n", r, msg);
        abort();
    }
    uint8_t *b = d.bytes;
    d.bytes = NULL;
    disk_free(&d);
    return b;
}

static void clear_log_guid(uint8_t *f)
{
    for (int h = 0; h < 2; h++) {
        memset(f + (h ? 128 : 64) * 1024 + 48, 0, 16);
        fix_crc(f + (h ? 128 : 64) * 1024, 4096);
    }
}

/* A log to replay (it restores the BAT's first sector, zeros a block's
 * first 64 KiB) lands in every cutting, as qemu-img replays it; the same
 * file with its log spoiled each way decodes as if it had none. */
static void log_case(const char *what, struct spec sp)
{
    uint64_t size = sp.disk_size;
    uint8_t *content = pattern(size, 5), *base = pattern(size, 6);
    uint8_t *want = malloc(size);
    size_t len;
    sp.log_pending = true;
    sp.log_flags = 0;
    uint8_t *f = build(&sp, content, base, want, &len);
    check_decodes(what, f, len, want, size, sp.diff ? base : NULL);
    if (!sp.diff) {
        save("log.vhdx", f, len);
        sh("qemu-img check -q -r all %s/log.vhdx >/dev/null", dir);
        sh("qemu-img convert -q -f vhdx -O raw %s/log.vhdx %s/log.raw", dir, dir);
        size_t blen;
        uint8_t *back = load("log.raw", &blen);
        CHECK(blen == size && memcmp(back, want, size) == 0);
        free(back);
        printf("ok %s: qemu-img replays it the same\n", what);
    }
    /* Without its log the file says something else: the log matters. */
    clear_log_guid(f);
    uint8_t *unreplayed = decode(f, len, size, sp.diff ? base : NULL);
    CHECK(memcmp(unreplayed, want, size) != 0);
    free(f);
    static const struct { unsigned flag; const char *name; } spoil[] = {
        { LOG_TORN, "a torn entry" }, { LOG_OLD_GUID, "another log's GUID" },
        { LOG_BAD_TAIL, "a tail outside the sequence" } };
    for (size_t i = 0; i < sizeof spoil / sizeof spoil[0]; i++) {
        sp.log_flags = spoil[i].flag;
        f = build(&sp, content, base, want, &len);
        uint8_t *got = decode(f, len, size, sp.diff ? base : NULL);
        CHECK(memcmp(got, unreplayed, size) == 0);
        printf("ok %s: %s is ignored\n", what, spoil[i].name);
        free(got);
        free(f);
    }
    free(unreplayed); free(want); free(content); free(base);
}

/* The parser alone: an empty log plans nothing; a log whose every sector
 * starts a bogus header with the log's GUID and a 1 MiB length is refused
 * once the search's work bound is spent, not searched for minutes nor
 * taken as empty. */
static void log_parser_cases(void)
{
    uint8_t *log = calloc(1, MiB);
    struct vhdx_log_plan p;
    struct nbdf_err e = { "" };
    CHECK(vhdx_log_plan(log, MiB, G_LOG, &p, &e) == 0 && p.npatches == 0 &&
          p.entries == 0);
    vhdx_log_plan_free(&p);
    CHECK(vhdx_log_plan(log, 1000, G_LOG, &p, &e) == -EINVAL);
    for (uint64_t at = 0; at < MiB; at += 4096) {
        memcpy(log + at, "loge", 4);
        put32(log + at + 8, MiB);
        put64(log + at + 16, 7);
        memcpy(log + at + 32, G_LOG, 16);
    }
    CHECK(vhdx_log_plan(log, MiB, G_LOG, &p, &e) == -EINVAL);
    CHECK(strstr(e.msg, "too many entry headers"));
    vhdx_log_plan_free(&p);
    free(log);
    printf("ok log parser: empty, bad length, too damaged to search\n");
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    snprintf(dir, sizeof dir, "/tmp/vhdx-test.XXXXXX");
    CHECK(mkdtemp(dir));
    if (system("qemu-img --version >/dev/null") != 0) {
        fprintf(stderr, "qemu-img is needed (qemu-utils)\n");
        return 1;
    }
    uint32_t crc = vhdx_crc32c(0, "123456789", 9);
    CHECK(crc == 0xE3069283u);               /* the CRC-32C check value */

    qemu_case("subformat=dynamic", 40 * MiB + 4096);
    qemu_case("subformat=dynamic,block_state_zero=off", 40 * MiB + 4096);
    qemu_case("subformat=dynamic,block_size=1M", 20 * MiB + 512);
    qemu_case("subformat=dynamic,block_size=256M", 300 * MiB);
    qemu_case("subformat=fixed,block_size=8M", 24 * MiB + 1024);

    struct spec sp = { .disk_size = 24 * MiB + 4096, .block_size = MiB, .lsec = 512 };
    built_case("built dynamic, 1 MiB blocks", &sp);
    sp.lsec = 4096;
    built_case("built 4096-byte logical sectors", &sp);
    sp.lsec = 512;
    sp.regions_last = true;
    built_case("built with the metadata and BAT after the blocks", &sp);
    uint8_t states[25];
    for (int i = 0; i < 25; i++)
        states[i] = (uint8_t[]){ VHDX_PB_FULLY_PRESENT, VHDX_PB_PARTIALLY_PRESENT,
                                 VHDX_PB_ZERO, VHDX_PB_NOT_PRESENT,
                                 VHDX_PB_UNMAPPED }[i % 5];
    sp.regions_last = false;
    sp.diff = true;
    sp.states = states;
    built_case("built differencing (full, partial, zero, absent, unmapped)", &sp);
    sp.regions_last = true;
    built_case("built differencing, regions after the blocks", &sp);
    sp.diff = false;
    sp.regions_last = false;
    for (int i = 0; i < 25; i++)               /* and qemu's UNMAPPED (5) */
        if (states[i] == VHDX_PB_PARTIALLY_PRESENT)
            states[i] = i % 2 ? VHDX_PB_UNDEFINED : VHDX_PB_UNMAPPED_QEMU;
    built_case("built dynamic with every other state", &sp);

    log_parser_cases();
    struct spec lg = { .disk_size = 8 * MiB + 4096, .block_size = MiB, .lsec = 512 };
    log_case("log replayed", lg);
    lg.regions_last = true;
    log_case("log replayed, regions after the blocks", lg);
    lg.regions_last = false;
    lg.diff = true;
    lg.states = states;
    log_case("log replayed, differencing", lg);

    refusals();
    sh("rm -rf %s", dir);
    return 0;
}
