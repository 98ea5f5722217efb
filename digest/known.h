/* digest/known.h: block digests a writer already has.
 *
 * The manifest (fs/warm.c) hashes every whole block a write brings, to
 * decide whether it must be sent; the default inline digest (blkhash
 * with SHA-256 over 64 KiB blocks) needs the very same digests.  A write
 * hands them along with its bytes, and the pass stores them instead of
 * hashing the bytes a second time: one hash per block written.  Only
 * blocks that are not all zero are listed (a zero block is the pass's
 * own cheap case), in ascending order.  A first pass's writes hand them
 * over before they are made (struct digest_later, below): the manifest
 * hashes those blocks on the hasher workers after the write was
 * answered (fs/warm-later.c), and the pass waits for them.
 */
#pragma once
#include <stddef.h>
#include <stdint.h>

#define DIGEST_KNOWN_BS 65536u    /* the blocks hashed: 64 KiB ... */
#define DIGEST_KNOWN_LEN 32u      /* ... with SHA-256 */
#define DIGEST_KNOWN_MAX 18u      /* a 1 MiB write's blocks, and more */

struct digest_later;

struct digest_known {
    struct digest_later *later;   /* set: the digests are later->known,
                                   * still being made (below) */
    size_t n;
    uint64_t block[DIGEST_KNOWN_MAX];       /* ascending */
    unsigned char digest[DIGEST_KNOWN_MAX][DIGEST_KNOWN_LEN];
};

/* Add block b's digest to k, if there is room (else the pass hashes the
 * block itself).  Blocks must come in ascending order. */
static inline void digest_known_add(struct digest_known *k, uint64_t b,
                                    const unsigned char *digest)
{
    if (!k || k->later || k->n == DIGEST_KNOWN_MAX ||
        (k->n && k->block[k->n - 1] >= b))
        return;
    k->block[k->n] = b;
    for (unsigned i = 0; i < DIGEST_KNOWN_LEN; i++)
        k->digest[k->n][i] = digest[i];
    k->n++;
}

/* Digests a writer is still making (fs/warm.c, THE LATER DIGEST: on the
 * hasher workers, so that the write is answered without waiting for
 * them).  The pass takes its own count (get) for each change it queues
 * with them, waits for them (wait: returns once known is final) when it
 * takes the change in, and gives its count back (put) when it lets the
 * change go, taken in or not.  wait never depends on the pass. */
struct digest_later {
    void (*wait)(struct digest_later *l);
    void (*get)(struct digest_later *l);
    void (*put)(struct digest_later *l);
    struct digest_known known;    /* read only after wait() returned */
};
