/* digest/sha256x.h: SHA-256 of several messages at once, with the x86 SHA
 * extensions, for blkhash's blocks (digest/blkhash.c).
 *
 * Why not OpenSSL: OpenSSL hashes one message at a time, and one SHA-256
 * is a single chain of dependent rounds, so a core with the SHA
 * extensions sits waiting on each round's latency; and its reads of a
 * cold buffer (a pool buffer the kernel filled a moment ago) come one
 * stream at a time.  blkhash's blocks are independent messages of one
 * length: hashing two of them interleaved keeps the SHA unit busy, and
 * reading ahead keeps the loads in flight (the technique of the Linux
 * kernel's sha256_finup_2x for dm-verity).  Measured on this project's
 * 2-core machine, 64 KiB blocks out of a cold 96 MiB buffer, best of 5:
 * OpenSSL 1.2 GB/s, one lane 1.8 GB/s, two lanes 2.35 GB/s.
 *
 * Only plain SHA-256 is done here; every other digest, and a CPU without
 * the extensions, stay with OpenSSL (blkhash.c asks sha256x_available()).
 * The result is SHA-256 exactly: tests/unit/test-sha256x.c compares every
 * length from 0 to a few blocks, and random blocks, with OpenSSL's.
 *
 * THREAD MODEL: no state; any thread, any number at once.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>

#define SHA256X_DIGEST 32

/* True when this CPU has the SHA extensions or AVX-512 (CPUID) and the
 * environment does not say NBDFERRY_SHA256=openssl (the switch tests and a wary user
 * use to take the OpenSSL path).  Decided once, on the first call. */
bool sha256x_available(void);

/* Which code hashes: "avx512+sha-ni" (sixteen messages at a time with
 * AVX-512, digest/sha256x16.c, the rest two at a time on the SHA
 * lanes), "avx512", "sha-ni" or "openssl".  NBDFERRY_SHA256=sha-ni
 * keeps to the SHA lanes. */
const char *sha256x_path(void);

/* out[i] = SHA-256 of the len bytes at msg[i], for i < n: sixteen at a
 * time where the CPU has AVX-512, two at a time on the SHA lanes.  Only
 * after sha256x_available() said true. */
void sha256x_many(const unsigned char *const *msg, size_t n, size_t len,
                  unsigned char (*out)[SHA256X_DIGEST]);
