/* digest/verify-fingerprint.c: per-block fingerprints (digest/fingerprint.h).
 *
 * Word i of a block (byte offset 8i) gets multiplier m_i = K[i % 1024] *
 * P(i / 1024) mod 2^128: a small table that stays in L1 for the inner loop,
 * and one multiply per 8 KiB span for the span's position.  Both factors are
 * odd, so m_i is odd.  Cost: one 64x64->128 multiply per data word, several
 * times faster than any EVP digest; holes cost nothing.
 */
#include <endian.h>
#include <pthread.h>
#include <string.h>

#include "digest/fingerprint.h"

#define FP_WORDS (FP_SUB_BYTES / 8)

static uint64_t K[FP_WORDS];            /* written once by init_tables() */
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static void init_tables(void)
{
    for (unsigned j = 0; j < FP_WORDS; j++)
        K[j] = splitmix64(0x6e6264666572ULL + j) | 1;
}

void fp_init(void)
{
    pthread_once(&tables_once, init_tables);
}

static uint64_t span_multiplier(uint64_t span)
{
    return splitmix64(span ^ 0x7665726966790000ULL) | 1;
}

/* Bytes p[0..n) sit at byte offset o, o + n <= 8 * (o / 8 + 1): a part of
 * one word, other bytes zero (linearity makes the parts add up). */
static uint64_t partial_word(const unsigned char *p, size_t o, size_t n)
{
    uint64_t w = 0;

    for (size_t k = 0; k < n; k++)
        w |= (uint64_t) p[k] << (8 * ((o + k) % 8));
    return w;
}

/* Sum over one 8 KiB span: p[0..n) at offset o inside the span. */
static fp_t span_sum(const unsigned char *p, size_t o, size_t n)
{
    fp_t s = 0;
    size_t j = o / 8;

    if (o % 8) {
        size_t head = 8 - o % 8 < n ? 8 - o % 8 : n;
        s += (fp_t) partial_word(p, o, head) * K[j++];
        p += head;
        n -= head;
    }
    for (; n >= 8; n -= 8, p += 8, j++) {
        uint64_t w;
        memcpy(&w, p, 8);
        s += (fp_t) le64toh(w) * K[j];
    }
    if (n)
        s += (fp_t) partial_word(p, 0, n) * K[j];
    return s;
}

fp_t fp_update(fp_t acc, uint64_t off, const void *buf, size_t len)
{
    const unsigned char *p = buf;

    while (len > 0) {
        uint64_t span = off / FP_SUB_BYTES;
        size_t in_span = off % FP_SUB_BYTES;
        size_t n = FP_SUB_BYTES - in_span < len ? FP_SUB_BYTES - in_span : len;

        acc += span_sum(p, in_span, n) * span_multiplier(span);
        off += n;
        p += n;
        len -= n;
    }
    return acc;
}
