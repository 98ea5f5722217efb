/* tests/unit/test-util.h: what the format unit tests share: CHECK (on in
 * every build), a scratch directory 'dir' the test makes, shell commands
 * that must succeed (a missing tool fails the test), whole files in and
 * out of dir, and a seeded random stream.  Header-only (each test is one
 * executable). */
#ifndef NBDFERRY_TEST_UTIL_H
#define NBDFERRY_TEST_UTIL_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#define CHECK(cond) do { if (!(cond)) { \
    fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
    abort(); } } while (0)

static char dir[64];

__attribute__((format(printf, 1, 2)))
static inline void sh(const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    if (system(cmd) != 0) {
        fprintf(stderr, "command failed: %s\n", cmd);
        abort();
    }
}

/* dir/name, whole (one byte more allocated), its length in *len. */
static inline uint8_t *load(const char *name, size_t *len)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    CHECK(f);
    struct stat st;
    CHECK(fstat(fileno(f), &st) == 0);
    uint8_t *b = malloc((size_t) st.st_size + 1);
    CHECK(b);
    CHECK(fread(b, 1, (size_t) st.st_size, f) == (size_t) st.st_size);
    fclose(f);
    *len = (size_t) st.st_size;
    return b;
}

static inline void save(const char *name, const void *buf, size_t len)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(buf, 1, len, f) == len && fclose(f) == 0);
}

/* xorshift64*: the same bytes on every run for a seed. */
static inline uint64_t rnd(uint64_t *x)
{
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    return *x * 2685821657736338717ull;
}

#endif /* NBDFERRY_TEST_UTIL_H */
