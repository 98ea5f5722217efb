/* tests/unit/test-sha256x.c: digest/sha256x (SHA-256 of several messages
 * side by side) against OpenSSL's SHA-256: every length from 0 to past
 * two blocks in every message count to 35 (two groups of sixteen on the
 * AVX-512 path and the rest on the SHA lanes; the padding's one-block
 * and two-block cases), messages at odd addresses, lanes that differ
 * from one another, and random 64 KiB and odd-sized blocks out of a
 * buffer too large for the cache.  ctest runs it twice: as the machine
 * chooses (which must be the AVX-512 path where the CPU has AVX-512),
 * and with NBDFERRY_SHA256=sha-ni (the SHA lanes alone).  The machine
 * must have the SHA extensions: the CPU the project runs on has them,
 * and a test that cannot run fails. */
#undef NDEBUG
#include <assert.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "digest/sha256x.h"

#define MAXN 40

static void expect(const unsigned char *msg, size_t len,
                   const unsigned char *got)
{
    unsigned char want[EVP_MAX_MD_SIZE];

    assert(EVP_Digest(msg, len, want, NULL, EVP_sha256(), NULL) == 1);
    if (memcmp(want, got, SHA256X_DIGEST) != 0) {
        fprintf(stderr, "sha256x differs from OpenSSL at length %zu\n", len);
        abort();
    }
}

/* n messages of len bytes at buf + start[i]. */
static void check(const unsigned char *buf, const size_t *start, size_t n,
                  size_t len)
{
    const unsigned char *msg[MAXN];
    unsigned char out[MAXN][SHA256X_DIGEST];

    assert(n <= MAXN);
    for (size_t i = 0; i < n; i++)
        msg[i] = buf + start[i];
    memset(out, 0xa5, sizeof out);
    sha256x_many(msg, n, len, out);
    for (size_t i = 0; i < n; i++)
        expect(msg[i], len, out[i]);
}

int main(void)
{
    if (!sha256x_available()) {
        fprintf(stderr, "test-sha256x: this CPU has no SHA extensions (or "
                "NBDFERRY_SHA256=openssl is set): nothing here is tested\n");
        return 1;
    }
    const char *env = getenv("NBDFERRY_SHA256");
    printf("test-sha256x: path %s\n", sha256x_path());
    if (!env && __builtin_cpu_supports("avx512bw") &&
        strcmp(sha256x_path(), "avx512+sha-ni") != 0) {
        fprintf(stderr, "test-sha256x: the CPU has AVX-512 but the path is "
                "%s\n", sha256x_path());
        return 1;
    }
    size_t big = 96u << 20;
    unsigned char *buf = malloc(big + 64);
    assert(buf);
    srandom(42);
    for (size_t i = 0; i < big + 64; i++)
        buf[i] = (unsigned char) random();

    /* Every length through three blocks, 1 to 35 messages (16 + 16 + 2
     * + 1, ...), each its own message, odd offsets. */
    for (size_t len = 0; len <= 200; len++)
        for (size_t n = 1; n <= 35; n++) {
            size_t start[MAXN];
            for (size_t i = 0; i < n; i++)
                start[i] = i * 977 + len % 7;
            check(buf, start, n, len);
        }
    /* The same bytes in every lane: no lane may see another's state. */
    {
        size_t start[MAXN] = { 0 };
        check(buf, start, 8, 65536);
        check(buf, start, 32, 65536);
    }
    /* Sixteen lanes, one of them a byte off: in each position. */
    {
        unsigned char *same = malloc(17 * 4096);
        assert(same);
        memset(same, 3, 17 * 4096);
        same[16 * 4096 + 4095] = 4;
        for (size_t odd = 0; odd < 16; odd++) {
            size_t start[16];
            for (size_t i = 0; i < 16; i++)
                start[i] = (i == odd ? 16 : i) * 4096;
            check(same, start, 16, 4096);
        }
        free(same);
    }
    /* Lanes that differ in their last byte only. */
    {
        unsigned char *two = malloc(2 * 4096);
        assert(two);
        memset(two, 7, 2 * 4096);
        two[4095] = 8;
        size_t start[2] = { 0, 4096 };
        check(two, start, 2, 4096);
        free(two);
    }
    /* Random blocks across 96 MiB, the sizes blkhash uses and odd ones. */
    static const size_t sizes[] = { 65536, 4096, 1u << 20, 65535, 65537,
                                    512, 100000 };
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
        for (int round = 0; round < 40; round++) {
            size_t n = 1 + (size_t) random() % MAXN, start[MAXN];
            for (size_t i = 0; i < n; i++)
                start[i] = (size_t) random() % (big - sizes[s]);
            check(buf, start, n, sizes[s]);
        }
    free(buf);
    printf("test-sha256x: ok\n");
    return 0;
}
