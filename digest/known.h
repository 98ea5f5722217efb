/* digest/known.h: block digests a writer already has.
 *
 * The manifest (fs/warm.c) hashes every whole block a write brings, to
 * decide whether it must be sent; the default inline digest (blkhash
 * with SHA-256 over 64 KiB blocks) needs the very same digests.  A write
 * hands them along with its bytes, and the pass stores them instead of
 * hashing the bytes a second time: one hash per block written.  Only
 * blocks that are not all zero are listed (a zero block is the pass's
 * own cheap case), in ascending order.
 */
#pragma once
#include <stddef.h>
#include <stdint.h>

#define DIGEST_KNOWN_BS 65536u    /* the blocks hashed: 64 KiB ... */
#define DIGEST_KNOWN_LEN 32u      /* ... with SHA-256 */
#define DIGEST_KNOWN_MAX 18u      /* a 1 MiB write's blocks, and more */

struct digest_known {
    size_t n;
    uint64_t block[DIGEST_KNOWN_MAX];       /* ascending */
    unsigned char digest[DIGEST_KNOWN_MAX][DIGEST_KNOWN_LEN];
};

/* Add block b's digest to k, if there is room (else the pass hashes the
 * block itself).  Blocks must come in ascending order. */
static inline void digest_known_add(struct digest_known *k, uint64_t b,
                                    const unsigned char *digest)
{
    if (!k || k->n == DIGEST_KNOWN_MAX ||
        (k->n && k->block[k->n - 1] >= b))
        return;
    k->block[k->n] = b;
    for (unsigned i = 0; i < DIGEST_KNOWN_LEN; i++)
        k->digest[k->n][i] = digest[i];
    k->n++;
}
