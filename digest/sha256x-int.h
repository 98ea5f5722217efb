/* digest/sha256x-int.h: between sha256x.c (the SHA-NI lanes and the
 * choice of path) and sha256x16.c (sixteen messages with AVX-512). */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "digest/sha256x.h"

/* SHA-256's round constants and initial hash value (FIPS 180-4), defined
 * in sha256x-k.c. */
extern const uint32_t sha256x_K[64];
extern const uint32_t sha256x_H0[8];

/* CPUID and XCR0 say AVX-512 F and BW can run here. */
bool sha256x16_cpu(void);

/* out[i] = SHA-256 of the len bytes at msg[i], for i < 16. */
void sha256x16_hash(const unsigned char *const *msg, size_t len,
                    unsigned char (*out)[SHA256X_DIGEST]);

/* The last of a len-byte message's bytes and its padding (0x80, zeros,
 * the bit length big-endian) into tail: one block, or two when fewer
 * than 9 bytes are left in the last.  Returns the number of blocks. */
static inline size_t sha256x_pad(unsigned char tail[128],
                                 const unsigned char *msg, size_t len)
{
    size_t rest = len % 64, ntail = rest < 56 ? 1 : 2;
    uint64_t bits = (uint64_t) len * 8;

    memset(tail, 0, 128);
    memcpy(tail, msg + (len - rest), rest);
    tail[rest] = 0x80;
    for (unsigned i = 0; i < 8; i++)
        tail[ntail * 64 - 1 - i] = (unsigned char) (bits >> (8 * i));
    return ntail;
}
