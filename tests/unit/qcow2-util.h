/* tests/unit/qcow2-util.h: files, tools, a disk and a spool for the
 * qcow2 unit tests.  Header-only (each test is one executable). */
#ifndef NBDFERRY_QCOW2_TEST_UTIL_H
#define NBDFERRY_QCOW2_TEST_UTIL_H

#undef NDEBUG
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qcow2/qcow2.h"
#include "test-util.h"

static inline void mkscratch(void)
{
    snprintf(dir, sizeof dir, "/tmp/qcow2-test-XXXXXX");
    CHECK(mkdtemp(dir));
}

static inline void rmscratch(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

/* 5 MiB + 12800 bytes in 64 KiB pieces: random data, all-zero pieces, a
 * piece half zero, pieces of one repeated byte (they compress to a few
 * dozen bytes, so compressed clusters share sectors), a short tail. */
#define RAW_SIZE ((5u << 20) + 12800u)
static inline uint8_t *make_raw(const char *name)
{
    uint8_t *raw = calloc(1, RAW_SIZE);
    uint64_t x = 42;
    CHECK(raw);
    for (size_t g = 0; g * 65536 < RAW_SIZE; g++) {
        size_t end = (g + 1) * 65536 < RAW_SIZE ? (g + 1) * 65536 : RAW_SIZE;
        size_t start = g * 65536 + (g == 11 ? 32768 : 0);
        if (g % 5 == 2 || g == 7 || g == 8)
            continue;                               /* zero */
        if (g % 7 == 3) {
            memset(raw + start, (int) (g & 0xff) | 1, end - start);
            continue;                               /* compressible */
        }
        for (size_t i = start; i < end; i += 8) {
            uint64_t v = rnd(&x);
            memcpy(raw + i, &v, end - i < 8 ? end - i : 8);
        }
    }
    save(name, raw, RAW_SIZE);
    return raw;
}

static inline uint64_t qcow2_be64_t(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

static inline void qcow2_put64_t(uint8_t *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t) v;
}

/* ---- a disk the decoder writes into ------------------------------------ */

struct disk {
    uint8_t *buf;
    uint64_t cap;
    bool began;
    enum qcow2_kind kind;
    uint64_t size;
    uint8_t *written;                               /* a byte per disk byte */
    uint64_t data_calls, zero_calls;
    bool async_compressed;                          /* use sink.compressed */
    struct mspool *ms;                              /* the sink's spool */
    struct qcow2_decompressor *dz;
    uint8_t *zout;
};

static inline int d_begin(void *o, const struct nbdf_begin *b)
{
    struct disk *d = o;
    enum qcow2_kind kind = (enum qcow2_kind) b->kind;
    uint64_t size = b->size;
    CHECK(b->overlay == (kind == QCOW2_OVERLAY) && b->info);
    CHECK(!d->began);
    CHECK(size <= d->cap);
    d->began = true;
    d->kind = kind;
    d->size = size;
    if (kind == QCOW2_STANDALONE)
        memset(d->buf, 0, size);                    /* the caller zeroes */
    return 0;
}

static inline void d_mark(struct disk *d, uint64_t off, uint64_t len)
{
    CHECK(d->began);
    CHECK(off + len <= d->size);
    for (uint64_t i = off; i < off + len; i++) {
        CHECK(!d->written[i]);                      /* each byte at most once */
        d->written[i] = 1;
    }
}

static inline int d_data(void *o, uint64_t off, const void *buf, size_t len)
{
    struct disk *d = o;
    d_mark(d, off, len);
    memcpy(d->buf + off, buf, len);
    d->data_calls++;
    return 0;
}

static inline int d_zero(void *o, uint64_t off, uint64_t len)
{
    struct disk *d = o;
    CHECK(d->kind == QCOW2_OVERLAY);
    d_mark(d, off, len);
    memset(d->buf + off, 0, len);
    d->zero_calls++;
    return 0;
}

/* The view decompresses on worker threads; here, at once, but through
 * the same hook and qcow2_compressed_decode(). */
static inline int d_compressed(void *o, const void *unit, const void *cdata,
                               size_t clen)
{
    struct disk *d = o;
    const struct qcow2_compressed *c = unit;
    CHECK(cdata == c->cdata && clen == c->clen);
    struct nbdf_err e = { "" };
    if (!d->dz)
        CHECK(qcow2_decompressor_new(&d->dz) == 0);
    if (!d->zout)
        CHECK((d->zout = malloc(2u << 20)));
    int64_t n = qcow2_compressed_decode(d->dz, c, d->zout, &e);
    if (n < 0) {
        fprintf(stderr, "  decompress: %s\n", e.msg);
        return (int) n;
    }
    return d_data(o, c->disk_off, d->zout, (size_t) n);
}


static inline void disk_init(struct disk *d, uint64_t cap, const uint8_t *initial)
{
    memset(d, 0, sizeof *d);
    d->cap = cap;
    d->buf = malloc(cap);
    d->written = calloc(1, cap);
    CHECK(d->buf && d->written);
    if (initial)
        memcpy(d->buf, initial, cap);
    else
        memset(d->buf, 0xee, cap);                  /* begin() must zero */
}

static inline void disk_free(struct disk *d)
{
    free(d->buf);
    free(d->written);
    qcow2_decompressor_free(d->dz);
    free(d->zout);
}

/* ---- a spool in memory --------------------------------------------------- */

struct mspool {
    struct { uint64_t key; uint8_t *buf; size_t len; } *e;
    size_t n, cap, live, peak;
};

static inline int ms_put(void *o, uint64_t key, const void *buf, size_t len)
{
    struct mspool *m = o;
    for (size_t i = 0; i < m->n; i++)
        CHECK(m->e[i].key != key || !m->e[i].buf);  /* put once */
    if (m->n == m->cap) {
        m->cap = m->cap ? m->cap * 2 : 16;
        m->e = realloc(m->e, m->cap * sizeof *m->e);
        CHECK(m->e);
    }
    m->e[m->n].key = key;
    m->e[m->n].buf = malloc(len);
    m->e[m->n].len = len;
    CHECK(m->e[m->n].buf);
    memcpy(m->e[m->n].buf, buf, len);
    m->n++;
    m->live++;
    if (m->live > m->peak)
        m->peak = m->live;
    return 0;
}

static inline int ms_get(void *o, uint64_t key, void *buf, size_t len)
{
    struct mspool *m = o;
    for (size_t i = 0; i < m->n; i++)
        if (m->e[i].key == key && m->e[i].buf) {
            CHECK(m->e[i].len == len);
            memcpy(buf, m->e[i].buf, len);
            return 0;
        }
    CHECK(!"get of a key never put");
    return -ENOENT;
}

static inline void ms_drop(void *o, uint64_t key)
{
    struct mspool *m = o;
    for (size_t i = 0; i < m->n; i++)
        if (m->e[i].key == key && m->e[i].buf) {
            free(m->e[i].buf);
            m->e[i].buf = NULL;
            m->live--;
            return;
        }
    CHECK(!"drop of a key not held");
}

/* The sink's spool: the disk's (d->ms). */
static inline int d_put(void *o, uint64_t key, const void *buf, size_t len)
{
    return ms_put(((struct disk *) o)->ms, key, buf, len);
}

static inline int d_get(void *o, uint64_t key, void *buf, size_t len)
{
    return ms_get(((struct disk *) o)->ms, key, buf, len);
}

static inline void d_drop(void *o, uint64_t key)
{
    ms_drop(((struct disk *) o)->ms, key);
}

static const struct nbdf_sink sink_sync = {
    .begin = d_begin, .data = d_data, .zero = d_zero,
    .spool_put = d_put, .spool_get = d_get, .spool_drop = d_drop,
};
static const struct nbdf_sink sink_async = {
    .begin = d_begin, .data = d_data, .zero = d_zero,
    .compressed = d_compressed,
    .spool_put = d_put, .spool_get = d_get, .spool_drop = d_drop,
};

static inline void ms_free(struct mspool *m)
{
    for (size_t i = 0; i < m->n; i++)
        free(m->e[i].buf);
    free(m->e);
    memset(m, 0, sizeof *m);
}

#endif /* NBDFERRY_QCOW2_TEST_UTIL_H */
