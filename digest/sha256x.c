/* digest/sha256x.c: SHA-256 of several messages at once (sha256x.h).
 *
 * FIPS 180-4 SHA-256 with the SHA extensions' instructions
 * (sha256rnds2, sha256msg1, sha256msg2: Intel's "New Instructions
 * Supporting the Secure Hash Algorithm", 2013), the state kept as the
 * instructions want it (ABEF, CDGH).  compress() runs the 64 rounds of
 * one 64-byte block for 'lanes' messages, their instructions
 * interleaved round by round: each lane is its own dependency chain, so
 * the core overlaps them.  Two lanes are the fastest here (three and
 * four spill more of SSE's 16 registers than they gain: 2.1 and 2.2
 * GB/s against two's 2.35); each lane's reads are started eight cache
 * lines ahead, which alone makes one lane faster than OpenSSL on a cold
 * buffer.
 *
 * Only the x86-64 build has the code; elsewhere sha256x_available() is
 * false and blkhash stays with OpenSSL.
 */
#include "digest/sha256x.h"
#include "digest/sha256x-int.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>

#define SHA_TARGET __attribute__((target("sha,sse4.1,ssse3")))
#define MAX_LANES 2

/* One lane's state: ABEF and CDGH, as sha256rnds2 takes them. */
struct lane {
    __m128i abef, cdgh;
};

SHA_TARGET static struct lane initial_state(void)
{
    __m128i dcba = _mm_loadu_si128((const __m128i *) &sha256x_H0[0]);
    __m128i hgfe = _mm_loadu_si128((const __m128i *) &sha256x_H0[4]);
    __m128i cdab = _mm_shuffle_epi32(dcba, 0xB1);
    __m128i efgh = _mm_shuffle_epi32(hgfe, 0x1B);

    return (struct lane) { .abef = _mm_alignr_epi8(cdab, efgh, 8),
                           .cdgh = _mm_blend_epi16(efgh, cdab, 0xF0) };
}

SHA_TARGET static void store_digest(struct lane s, unsigned char *out)
{
    __m128i feba = _mm_shuffle_epi32(s.abef, 0x1B);
    __m128i dchg = _mm_shuffle_epi32(s.cdgh, 0xB1);
    __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bull,
                                   0x0405060700010203ull);
    __m128i dcba = _mm_blend_epi16(feba, dchg, 0xF0);
    __m128i hgfe = _mm_alignr_epi8(dchg, feba, 8);

    _mm_storeu_si128((__m128i *) out, _mm_shuffle_epi8(dcba, bswap));
    _mm_storeu_si128((__m128i *) (out + 16), _mm_shuffle_epi8(hgfe, bswap));
}

/* nblocks 64-byte blocks of each of 'lanes' messages, block i of lane j
 * at p[j] + 64 * i, into s[j].  Inlined with lanes constant, so the
 * loops over j unroll into interleaved chains. */
SHA_TARGET __attribute__((always_inline)) static inline void
compress(unsigned lanes, struct lane *s, const unsigned char *const *p,
         size_t nblocks)
{
    const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bull,
                                         0x0405060700010203ull);

    for (size_t b = 0; b < nblocks; b++) {
        __m128i w[MAX_LANES][4], msg[MAX_LANES];
        struct lane saved[MAX_LANES];

        for (unsigned j = 0; j < lanes; j++) {
            saved[j] = s[j];
            _mm_prefetch((const char *) (p[j] + 64 * b + 512), _MM_HINT_T0);
        }
#pragma GCC unroll 16
        for (unsigned i = 0; i < 16; i++) {
            /* Rounds 4i .. 4i+3; w[j][i % 4] holds W[4i .. 4i+3]. */
            __m128i k = _mm_loadu_si128((const __m128i *) &sha256x_K[4 * i]);
            for (unsigned j = 0; j < lanes; j++) {
                __m128i *v = w[j];
                if (i < 4)
                    v[i] = _mm_shuffle_epi8(
                        _mm_loadu_si128((const __m128i *)
                                        (p[j] + 64 * b + 16 * i)), bswap);
                msg[j] = _mm_add_epi32(v[i & 3], k);
                s[j].cdgh = _mm_sha256rnds2_epu32(s[j].cdgh, s[j].abef,
                                                  msg[j]);
                if (i >= 3 && i < 15) {  /* W[4i+4 ..], second half */
                    __m128i t = _mm_alignr_epi8(v[i & 3], v[(i + 3) & 3], 4);
                    v[(i + 1) & 3] = _mm_sha256msg2_epu32(
                        _mm_add_epi32(v[(i + 1) & 3], t), v[i & 3]);
                }
                msg[j] = _mm_shuffle_epi32(msg[j], 0x0E);
                s[j].abef = _mm_sha256rnds2_epu32(s[j].abef, s[j].cdgh,
                                                  msg[j]);
                if (i >= 1 && i < 13)    /* W[4i+8 ..], first half */
                    v[(i + 3) & 3] = _mm_sha256msg1_epu32(v[(i + 3) & 3],
                                                          v[i & 3]);
            }
        }
        for (unsigned j = 0; j < lanes; j++) {
            s[j].abef = _mm_add_epi32(s[j].abef, saved[j].abef);
            s[j].cdgh = _mm_add_epi32(s[j].cdgh, saved[j].cdgh);
        }
    }
}

/* The whole of 'lanes' messages of len bytes: their blocks, then each
 * one's padding (0x80, zeros, the bit length big-endian: one block, or
 * two when fewer than 9 bytes are left in the last). */
SHA_TARGET __attribute__((always_inline)) static inline void
hash_lanes(unsigned lanes, const unsigned char *const *msg, size_t len,
           unsigned char (*out)[SHA256X_DIGEST])
{
    struct lane s[MAX_LANES];
    unsigned char tail[MAX_LANES][128];
    const unsigned char *tp[MAX_LANES];
    size_t ntail = 0;

    for (unsigned j = 0; j < lanes; j++)
        s[j] = initial_state();
    compress(lanes, s, msg, len / 64);
    for (unsigned j = 0; j < lanes; j++) {
        ntail = sha256x_pad(tail[j], msg[j], len);
        tp[j] = tail[j];
    }
    compress(lanes, s, tp, ntail);
    for (unsigned j = 0; j < lanes; j++)
        store_digest(s[j], out[j]);
}

SHA_TARGET static void hash2(const unsigned char *const *msg, size_t len,
                             unsigned char (*out)[SHA256X_DIGEST])
{
    hash_lanes(2, msg, len, out);
}

SHA_TARGET static void hash1(const unsigned char *const *msg, size_t len,
                             unsigned char (*out)[SHA256X_DIGEST])
{
    hash_lanes(1, msg, len, out);
}

static bool cpu_has_sha(void)
{
    unsigned a, b, c, d;

    if (!__get_cpuid(1, &a, &b, &c, &d) ||
        !(c & bit_SSSE3) || !(c & bit_SSE4_1))
        return false;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return false;
    return (b & bit_SHA) != 0;
}

/* Which path, decided once (a benign race: every thread computes the
 * same answer): 0 none (OpenSSL), 1 the SHA-NI lanes, 2 sixteen at a
 * time with AVX-512 and the rest on the SHA-NI lanes where the CPU has
 * them.  NBDFERRY_SHA256=openssl or =sha-ni chooses less. */
static int path(void)
{
    static int known = -1;
    int k = __atomic_load_n(&known, __ATOMIC_RELAXED);

    if (k < 0) {
        const char *env = getenv("NBDFERRY_SHA256");
        bool sha = cpu_has_sha(), avx = sha256x16_cpu();
        if (env && strcmp(env, "openssl") == 0)
            k = 0;
        else if (env && strcmp(env, "sha-ni") == 0)
            k = sha;
        else
            k = !avx ? sha : sha ? 2 : 3;   /* 3: AVX-512 alone */
        __atomic_store_n(&known, k, __ATOMIC_RELAXED);
    }
    return k;
}

bool sha256x_available(void)
{
    return path() != 0;
}

const char *sha256x_path(void)
{
    static const char *names[] = { "openssl", "sha-ni", "avx512+sha-ni",
                                   "avx512" };
    return names[path()];
}

void sha256x_many(const unsigned char *const *msg, size_t n, size_t len,
                  unsigned char (*out)[SHA256X_DIGEST])
{
    size_t i = 0;
    int k = path();

    if (k >= 2)
        for (; i + 16 <= n; i += 16)
            sha256x16_hash(msg + i, len, out + i);
    if (k == 3 && i < n) {
        /* No SHA-NI: the last few ride in a group of 16, the spare lanes
         * hashing the last message again. */
        const unsigned char *m[16];
        unsigned char o[16][SHA256X_DIGEST];
        for (size_t j = 0; j < 16; j++)
            m[j] = msg[i + j < n ? i + j : n - 1];
        sha256x16_hash(m, len, o);
        memcpy(out + i, o, (n - i) * sizeof *o);
        return;
    }
    for (; i + 2 <= n; i += 2)
        hash2(msg + i, len, out + i);
    if (i < n)
        hash1(msg + i, len, out + i);
}

#else  /* not x86-64 */

bool sha256x_available(void)
{
    return false;
}

const char *sha256x_path(void)
{
    return "openssl";
}

void sha256x_many(const unsigned char *const *msg, size_t n, size_t len,
                  unsigned char (*out)[SHA256X_DIGEST])
{
    (void) msg, (void) n, (void) len, (void) out;
    abort();                     /* callers ask sha256x_available() */
}

#endif
