/* digest/fingerprint.h: the two block-fingerprint schemes, side by side.
 *
 * Both say *where* two copies of a disk differ; neither decides *whether*
 * they do (the whole-stream digest does).  There are two because they
 * answer for different inputs:
 *
 * - The multilinear fingerprint (fp_*, verify-fingerprint.c, verify
 *   library) hashes the block's bytes themselves, per --block-size block
 *   (1 MiB by default).  nbdferry-verify computes it on both sides as they
 *   are read (digest/verify-sink.c, compared in tools/verify/report.c),
 *   whatever the digest: an EVP digest such as sha256 has no per-block
 *   state to compare, so something must hash the blocks a second time,
 *   and this is several times cheaper than any EVP digest.
 *
 * - The blkhash region fingerprint (blkhash_fp_*, blkhash.c, blkhash
 *   library) costs no hashing at all: it is folded from the per-block
 *   digests a blkhash computes anyway, and survives blkhash_fold() (one
 *   value per region), so it can be kept for a whole mount.  The inline
 *   digest keeps it for what landed (blkpass.c, digest_fingerprints()),
 *   and the mount's read-back compares it with its own blkhash of what
 *   the server returns (fs/readback.c).  It exists only where a blkhash
 *   does, with the blkhash's block size.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* ---- multilinear: per block, from the bytes (verify-fingerprint.c) ----
 * A block fingerprint is a 128-bit multilinear hash of the block's bytes,
 * read as little-endian 64-bit words w_i at their offset inside the block:
 *     F = sum_i w_i * m_i  (mod 2^128),  every m_i odd and pseudo-random.
 * It is linear, so zero bytes contribute nothing (holes are never hashed)
 * and the result does not depend on how the block was cut into segments.
 * A difference in a single word always changes F (m_i is odd).  It only
 * locates mismatches; the verdict comes from the EVP digest. */
typedef unsigned __int128 fp_t;
#define FP_SUB_BYTES 8192u               /* one multiplier table span */
void fp_init(void);                      /* idempotent, thread-safe */
/* 'off' is the offset of p[0] inside its block; off + len <= block size. */
fp_t fp_update(fp_t acc, uint64_t off, const void *p, size_t len);

/* ---- blkhash regions: from the block digests (blkhash.c) --------------
 * Where two blkhashes differ.  A region is 2^shift consecutive blocks;
 * its fingerprint is the XOR of blkhash_fp_term(b, D(block b)) over its
 * blocks that hold data (an all-zero block, full or short, adds nothing).
 * Two streams whose region fingerprints differ differ in that region;
 * equal fingerprints say nothing for certain (the final value decides).
 * Fingerprints of a region merge by XOR, so a coarser shift is computed
 * from a finer one. */
static inline uint64_t blkhash_fp_term(uint64_t b, const unsigned char *d)
{
    uint64_t v = 0;

    for (int i = 0; i < 8; i++)
        v |= (uint64_t) d[i] << (8 * i);
    v ^= (b + 1) * 0x9e3779b97f4a7c15ull;     /* position matters */
    v ^= v >> 31;
    v *= 0xbf58476d1ce4e5b9ull;
    return v ^ (v >> 29);
}

struct blkhash;                          /* digest/blkhash.h */
/* fp[i] ^= the fingerprint of region i of a stream of 'length' bytes, for
 * i < n (regions past n are left out).  Does not run concurrently with
 * updates (like blkhash_finish).  Returns 0, or -EINVAL if shift is below
 * blkhash_fp_min_shift() (folded blocks are known only that coarsely). */
int blkhash_fingerprints(struct blkhash *h, uint64_t length, unsigned shift,
                         uint64_t *fp, size_t n);
unsigned blkhash_fp_min_shift(struct blkhash *h);
