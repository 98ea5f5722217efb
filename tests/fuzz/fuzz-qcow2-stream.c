/* tests/fuzz/fuzz-qcow2-stream.c: libFuzzer target for the qcow2 stream
 * decoder.
 *
 * Input: 4 control bytes, then a qcow2 file.  The control bytes seed how
 * the file is cut into writes (1 byte to 64 KiB), which all-zero pieces
 * become forward gaps or holes, whether compressed clusters go through the
 * hook, and the spool limit (0 to 1 MiB).  Oracles:
 *   - begin() exactly once, before any data/zero; zero() only for an
 *     overlay; writes only inside [0, size), each disk byte at most once;
 *   - every failure names its rule (a non-empty message);
 *   - every spooled cluster is dropped by the end, and the spool never
 *     holds more than its limit;
 *   - the cutting does not matter: the same file fed in one piece gives
 *     the same result and, for disks up to 1 MiB, the same bytes.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/iszero.h"
#include "qcow2/qcow2.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define DISK_CAP (1u << 20)
#define SPOOL_SLOTS 256

struct state {
    struct qcow2_stream *s;               /* the stream being run */
    bool began, overlay;
    uint64_t size;
    uint8_t *disk, *seen;                 /* DISK_CAP bytes each */
    struct qcow2_decompressor *dz;
    uint8_t *zout;
    /* spool */
    uint64_t keys[SPOOL_SLOTS];
    uint8_t *bufs[SPOOL_SLOTS];
    size_t lens[SPOOL_SLOTS];
    uint64_t held, limit;
};

static int s_begin(void *o, const struct nbdf_begin *b)
{
    enum qcow2_kind kind = (enum qcow2_kind) b->kind;
    uint64_t size = b->size;
    struct state *st = o;
    if (st->began || (kind != QCOW2_STANDALONE && kind != QCOW2_OVERLAY))
        abort();
    st->began = true;
    st->overlay = kind == QCOW2_OVERLAY;
    st->size = size;
    uint64_t n = size < DISK_CAP ? size : DISK_CAP;
    memset(st->disk, 0, n);
    memset(st->seen, 0, n);
    return 0;
}

static void mark(struct state *st, uint64_t off, uint64_t len)
{
    if (!st->began || len == 0 || off + len > st->size || off + len < off)
        abort();
    if (off + len <= DISK_CAP)
        for (uint64_t i = 0; i < len; i++)
            if (st->seen[off + i]++)
                abort();                  /* a disk byte placed twice */
}

static int s_data(void *o, uint64_t off, const void *buf, size_t len)
{
    struct state *st = o;
    mark(st, off, len);
    if (off + len <= DISK_CAP)
        memcpy(st->disk + off, buf, len);
    return 0;
}

static int s_zero(void *o, uint64_t off, uint64_t len)
{
    struct state *st = o;
    if (!st->overlay)
        abort();
    mark(st, off, len);
    return 0;
}

static int s_compressed(void *o, const void *unit, const void *cdata,
                        size_t clen)
{
    const struct qcow2_compressed *c = unit;
    (void) cdata, (void) clen;
    struct state *st = o;
    struct nbdf_err e = { "" };
    if (!st->dz && qcow2_decompressor_new(&st->dz) < 0)
        return -ENOMEM;
    if (!st->zout && !(st->zout = malloc(2u << 20)))
        return -ENOMEM;
    int64_t n = qcow2_compressed_decode(st->dz, c, st->zout, &e);
    if (n < 0) {
        if (!e.msg[0])
            abort();
        return (int) n;
    }
    return s_data(o, c->disk_off, st->zout, (size_t) n);
}

static int sp_put(void *o, uint64_t key, const void *buf, size_t len)
{
    struct state *st = o;
    if (st->held + len > st->limit)
        abort();                          /* the decoder counts first */
    for (int i = 0; i < SPOOL_SLOTS; i++)
        if (!st->bufs[i]) {
            if (!(st->bufs[i] = malloc(len)))
                return -ENOMEM;
            memcpy(st->bufs[i], buf, len);
            st->keys[i] = key;
            st->lens[i] = len;
            st->held += len;
            return 0;
        }
    return -ENOSPC;
}

static int sp_find(struct state *st, uint64_t key)
{
    for (int i = 0; i < SPOOL_SLOTS; i++)
        if (st->bufs[i] && st->keys[i] == key)
            return i;
    abort();                              /* get/drop of a key not held */
}

static int sp_get(void *o, uint64_t key, void *buf, size_t len)
{
    struct state *st = o;
    int i = sp_find(st, key);
    if (st->lens[i] != len)
        abort();
    memcpy(buf, st->bufs[i], len);
    return 0;
}

static void sp_drop(void *o, uint64_t key)
{
    struct state *st = o;
    int i = sp_find(st, key);
    free(st->bufs[i]);
    st->bufs[i] = NULL;
    st->held -= st->lens[i];
}

/* The map hook reports inside the disk (it may run before begin(), which
 * waits for the first write: the header says the size then). */
static int s_map(void *o, uint64_t off, uint64_t len, int what,
                 uint64_t file_off)
{
    struct state *st = o;
    uint64_t size = st->began ? st->size : qcow2_stream_header(st->s)->size;
    if (len == 0 || off + len < off || off + len > size ||
        what < QCOW2_MAP_DATA || what > QCOW2_MAP_COMPRESSED ||
        (what == QCOW2_MAP_ZERO && file_off != 0))
        abort();
    return 0;
}

static const struct nbdf_sink sink_sync = {
    .begin = s_begin, .data = s_data, .zero = s_zero,
    .spool_put = sp_put, .spool_get = sp_get, .spool_drop = sp_drop,
};
static const struct nbdf_sink sink_hook = {
    .begin = s_begin, .data = s_data, .zero = s_zero,
    .compressed = s_compressed, .map = s_map,
    .spool_put = sp_put, .spool_get = sp_get, .spool_drop = sp_drop,
};

static uint32_t next(uint32_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 17;
    *x ^= *x << 5;
    return *x;
}

static int feed(struct qcow2_stream *s, const uint8_t *f, size_t len,
                uint32_t seed)
{
    uint32_t x = seed | 1;
    unsigned maxp = 1 + (seed & 0xFFFF);
    int r = 0;
    for (size_t off = 0; off < len && r == 0;) {
        size_t n = 1 + next(&x) % maxp;
        if (n > len - off)
            n = len - off;
        if (is_zero(f + off, n) && (next(&x) & 1))
            r = (next(&x) & 1) ? qcow2_stream_hole(s, off, n) : 0;
        else
            r = qcow2_stream_feed(s, off, f + off, n);
        off += n;
    }
    if (r == 0)
        r = qcow2_stream_hole(s, len, 0);
    return r;
}

static int run(const uint8_t *f, size_t len, uint32_t seed, bool whole,
               struct state *st)
{
    struct qcow2_stream *s;
    struct qcow2_stream_opts o = {
        .spool_option = "--spool",
        .spool_max = st->limit, .max_size = 1ull << 40,
    };
    if (qcow2_stream_new(seed & 0x10000 ? &sink_hook : &sink_sync, st, &o,
                         &s) < 0)
        abort();
    st->s = s;
    int r = whole ? qcow2_stream_feed(s, 0, f, len) : feed(s, f, len, seed);
    if (r == 0)
        r = qcow2_stream_finish(s);
    if (getenv("FUZZ_QCOW2_DEBUG"))
        fprintf(stderr, "%s: %d %s (spool %llu)\n", whole ? "whole" : "cut",
                r, qcow2_stream_error(s), (unsigned long long) st->held);
    if (r < 0 && !qcow2_stream_error(s)[0])
        abort();
    qcow2_stream_free(s);
    if (st->held != 0)
        abort();                          /* every put dropped */
    return r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 4)
        return 0;
    uint32_t seed;
    memcpy(&seed, data, 4);
    data += 4, size -= 4;
    static uint8_t *bufs[4];          /* made once: 4 MiB per input is slow */
    for (int i = 0; i < 4; i++)
        if (!bufs[i] && !(bufs[i] = malloc(DISK_CAP)))
            abort();
    struct state a = { 0 }, b = { 0 };
    a.disk = bufs[0], a.seen = bufs[1], b.disk = bufs[2], b.seen = bufs[3];
    a.limit = b.limit = (uint64_t) (seed >> 24) << 12;   /* 0 .. ~1 MiB */
    int ra = run(data, size, seed, false, &a);
    int rb = run(data, size, seed, true, &b);
    /* A cutting may only add -EINVAL for a write going backwards, which
     * the gaps never cause: results must agree. */
    if ((ra == 0) != (rb == 0))
        abort();
    if (ra == 0 && a.size == b.size && a.size <= DISK_CAP &&
        memcmp(a.disk, b.disk, a.size) != 0)
        abort();
    qcow2_decompressor_free(a.dz), qcow2_decompressor_free(b.dz);
    free(a.zout), free(b.zout);
    return 0;
}
