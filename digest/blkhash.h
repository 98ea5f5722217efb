/* digest/blkhash.h: the block-based hash "blkhash" over OpenSSL EVP digests.
 *
 * The data is cut into blocks of block_size bytes (the last one may be
 * shorter); each block is hashed with the digest D; the result is
 *     D(D(block 0) || D(block 1) || ... || D(block n-1) || le64(length))
 * (Soffer and Waisbard's construction, as computed by blksum, libblkhash
 * and nbdcopy --blkhash).  Blocks are independent, so they may be hashed in
 * any order and on any thread; an all-zero block has a constant digest, so
 * holes and zeroed ranges cost no hashing at all.
 *
 * State is kept per *written* block, in chunks allocated on first use: a
 * block never updated, or zeroed, costs nothing and reads as zero at
 * blkhash_finish().  Memory is bounded by the data written, not by the
 * length hashed.
 *
 * THREAD MODEL
 * blkhash_update() and blkhash_zero() may be called from any number of
 * threads at once, for different blocks; each hashes outside the lock and
 * takes h->lock only to store the digest.  Two calls touching the same
 * block at once store one result or the other (the caller orders them).
 * blkhash_finish() must not run concurrently with updates.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <openssl/evp.h>

#include "common/err.h"
#include "digest/fingerprint.h"

#define BLKHASH_DEFAULT_DIGEST "sha256"
#define BLKHASH_DEFAULT_BLOCK  (64u << 10)
#define BLKHASH_MAX_BLOCK      (64u << 20)
#define BLKHASH_NAME_MAX       64          /* digest name, with its NUL */

struct blkhash;

/* Parses "", "DIGEST" or "DIGEST/SIZE" (SIZE: bytes, or with a k/K, m/M or
 * g/G suffix, powers of 1024; 1 <= SIZE <= BLKHASH_MAX_BLOCK) into name
 * (BLKHASH_NAME_MAX bytes) and *block_size; missing parts get the defaults.
 * Does not check that the digest exists (blkhash_create does).  Returns 0
 * or -EINVAL with a one-line reason in why (may be NULL). */
int blkhash_parse_spec(const char *spec, char *name, uint64_t *block_size,
                       struct nbdf_err *why);

/* Any OpenSSL digest with a fixed output size (not an XOF such as shake).
 * Returns 0, -EINVAL (unknown digest, bad block size) or -ENOMEM. */
int blkhash_create(const char *digest, uint64_t block_size,
                   struct blkhash **out);
void blkhash_free(struct blkhash *h);          /* NULL is fine */

uint64_t blkhash_block_size(const struct blkhash *h);
unsigned blkhash_digest_size(const struct blkhash *h);

/* Data at off (a multiple of the block size): each whole block is hashed,
 * or stored as zero without hashing if every byte is zero; a shorter tail
 * is the last block of the stream (blkhash_finish checks that the length
 * agrees).  'buf' is borrowed for the call.  Returns 0, -EINVAL
 * (misaligned), -ENOMEM or -EIO (OpenSSL failed). */
int blkhash_update(struct blkhash *h, uint64_t off, const void *buf,
                   size_t len);

/* n whole blocks (block_size bytes each), block blk[i] at mem[i], in any
 * order: as blkhash_update() of each (zero blocks stored without
 * hashing).  With sha256 on a CPU with the SHA extensions, blocks are
 * hashed several at once (digest/sha256x.h), so callers with many
 * blocks pass them together.  Returns 0, -ENOMEM or -EIO. */
int blkhash_update_blocks(struct blkhash *h, const uint64_t *blk,
                          const unsigned char *const *mem, size_t n);

/* Block b (a whole block, not the stream's short last one) has this
 * digest, known from elsewhere (fs/warm.c: the manifest's record of the
 * disk): stored as if hashed.  Returns 0, -ENOMEM or -ESTALE (folded). */
int blkhash_put_digest(struct blkhash *h, uint64_t b,
                       const unsigned char *digest);

/* [off, off + len) reads as zero from now on; off a multiple of the block
 * size, len too unless the range ends the stream.  Never hashes. */
int blkhash_zero(struct blkhash *h, uint64_t off, uint64_t len);

/* The blkhash of a stream of 'length' bytes: blocks never updated are
 * zero.  out needs EVP_MAX_MD_SIZE bytes; *out_len gets the digest size.
 * Returns 0, -EINVAL (a block was updated past 'length', or the short last
 * block does not end at 'length') or -EIO.  May be called again after
 * more updates. */
int blkhash_finish(struct blkhash *h, uint64_t length, unsigned char *out,
                   unsigned *out_len);

/* ---- fingerprints: where two blkhashes differ ------------------------
 * blkhash_fingerprints() and blkhash_fp_min_shift() are declared in
 * digest/fingerprint.h (included above), beside the verification
 * engine's other scheme. */

/* ---- folding: bounded memory for long streams -------------------------
 * Blocks [0, upto) are final: their digests go into the outer digest now
 * and their storage is freed (fingerprints are kept per region).  Updating
 * or zeroing a folded block afterwards fails with -ESTALE; upto must not
 * pass the short last block (-EINVAL).  Returns 0, -ENOMEM or -EIO. */
int blkhash_fold(struct blkhash *h, uint64_t upto);
uint64_t blkhash_folded(struct blkhash *h);      /* blocks folded */
/* Bytes of per-block state held now (digest chunks, their index, the
 * folded fingerprints): what the memory bound is about. */
size_t blkhash_memory(struct blkhash *h);
