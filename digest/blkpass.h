/* digest/blkpass.h: what the inline blkhash knows about the raw file's
 * content, fed the file's changes in the order they were made.
 *
 * The blkhash (digest/blkhash.h) is kept per block, so writes may come in
 * any order; the pass only has to know, for every block, the bytes it
 * ends up holding.  It tracks the bytes written in this pass, the bytes
 * known to read as zero (beyond a truncate, punched, zeroed) and, for a
 * bounded number of blocks written only in part so far, a copy of the
 * block.  A block written whole is hashed from the caller's buffer at
 * once and kept only as its digest; a block written in part is copied
 * and hashed once it is whole, or at a close, or when it is the least
 * recently touched of too many.  What cannot be known makes the pass fail
 * with the reason: part of a block rewritten (or zeroed, or cut by a
 * truncate) after the block was hashed and its bytes let go; a block in
 * part written whose other bytes hold data older than the pass.
 *
 * Memory: one digest per block written and not yet folded (digest/blkhash:
 * known blocks more than 256 MiB behind the end of the data, and behind
 * where it ended 256 blocks of writing ago, are folded into the outer
 * digest and freed; a later change to one of them ends the pass), the block copies (partial_budget), and the written and
 * zeroed ranges, at most 2^19 each, and 16 MiB of per-block state in all
 * (more scattered writes end the pass: "too scattered").
 *
 * THREAD MODEL: one thread (the digest thread) owns a pass; the pass
 * hashes a write's whole blocks on its own helper threads too (one per
 * online CPU beside it, blkpass.c THE HASHERS) and returns once they are
 * stored.
 */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "digest/known.h"

struct blkpass;


/* partial_budget: bytes of block copies kept at once (at least two
 * blocks are).  -EINVAL: unknown digest or bad block size; -ENOMEM. */
int  blkpass_create(const char *md, uint64_t block_size, size_t partial_budget,
                    struct blkpass **out);
void blkpass_free(struct blkpass *p);      /* NULL is fine */

/* THE READER: with one, a block whose bytes the pass let go (hashed
 * whole) and that is then changed in part is read back from the disk
 * (read(ctx, off, buf, len): the disk as it is now, every change made so
 * far included), and so is a block copy whose other bytes hold older
 * data when it must be let go: the pass follows rewrites over any
 * earlier content instead of failing.  Bytes read may be newer than the
 * change being applied; the changes after it, applied next, make them
 * right again (they are fed in the order they were made).  size: the
 * disk's size (bytes past it read as zero).  Without a reader (NULL)
 * those cases fail as described above. */
void blkpass_set_reader(struct blkpass *p,
                        int (*read)(void *ctx, uint64_t off, void *buf,
                                    size_t len),
                        void *ctx, uint64_t size);

/* THE FILLER: at a finish, a whole block this pass never wrote, zeroed
 * nor cut is asked of fill(ctx, b, digest): 0 unknown (the value stays
 * "incomplete"), 1 it reads as zero, 2 digest (the pass's digest, of a
 * whole block) holds its bytes.  A writer that writes only what changed
 * (rsync --inplace, dd of some blocks) so ends with a complete value.
 * The caller answers only for blocks whose bytes nothing has changed
 * but by this pass (fs/warm.c: the manifest's durable entries).  NULL:
 * none. */
void blkpass_set_filler(struct blkpass *p,
                        int (*fill)(void *ctx, uint64_t b,
                                    unsigned char *digest),
                        void *ctx);

/* Forget everything: a new pass over a file whose content is unknown. */
int  blkpass_reset(struct blkpass *p);

/* Each returns 0, or a negative errno with why (common/err.h)
 * saying what the pass lost; the pass is then useless until a reset. */
/* known (may be NULL): the digests of some of the write's whole blocks
 * (known.h), of a pass over SHA-256 of 64 KiB blocks only: stored
 * instead of hashing those blocks' bytes. */
int  blkpass_write(struct blkpass *p, uint64_t off, const void *buf,
                   size_t len, const struct digest_known *known,
                   struct nbdf_err *why);
/* [off, off + len) reads as zero now (len may run to UINT64_MAX - off). */
int  blkpass_zero(struct blkpass *p, uint64_t off, uint64_t len,
                  struct nbdf_err *why);
/* The file is size bytes long: every byte at or beyond size reads as zero
 * (size 0: the whole file is known to be zero). */
int  blkpass_truncate(struct blkpass *p, uint64_t size, struct nbdf_err *why);

/* The changes of this pass come in groups (a view's write request:
 * decoded on several threads, its data arrive in any order) whose
 * every change is fed before blkpass_settle() is called: blocks are
 * folded there only, never in the middle of a group, whatever the
 * order inside it, and only once the per-block state passes state
 * bytes, so that below it the groups may come in any order too (an
 * image whose clusters are stored in the order a VM wrote them).
 * Until the next reset. */
#define BLKPASS_SETTLE_STATE (8u << 20)  /* a view's pass: 8 MiB of
                                          * state, a disk of 16 GiB
                                          * at 64 KiB blocks */
void blkpass_fold_at_settle(struct blkpass *p, size_t state);
int  blkpass_settle(struct blkpass *p, struct nbdf_err *why);

/* The value for a file of 'size' bytes, in hex (hex: 2 * EVP_MAX_MD_SIZE
 * + 1 bytes).  Returns 0; -ENODATA with why when bytes below size hold
 * data older than the pass (no value: "incomplete"); other negative
 * errno with why when the pass lost track.  The pass may go on after. */
int  blkpass_finish(struct blkpass *p, uint64_t size, char *hex,
                    struct nbdf_err *why);

/* Bytes hashed so far (data blocks, whole or in part), and of them, those
 * whose digests the writer gave (known). */
uint64_t blkpass_hashed(const struct blkpass *p);
uint64_t blkpass_reused(const struct blkpass *p);

/* The region fingerprints of the blocks hashed so far, for a file of
 * 'size' bytes (digest/blkhash.h, blkhash_fingerprints()): after a
 * blkpass_finish() at that size they cover the whole file. */
int  blkpass_fingerprints(struct blkpass *p, uint64_t size, unsigned shift,
                          uint64_t *fp, size_t n);
/* The finest shift blkpass_fingerprints() takes (folded blocks). */
unsigned blkpass_fp_min_shift(const struct blkpass *p);
/* Blocks folded; bytes of per-block state held (digests, fingerprints,
 * block copies): the memory bound, for tests. */
uint64_t blkpass_folded(const struct blkpass *p);
size_t   blkpass_memory(const struct blkpass *p);
/* Fold known blocks this many bytes (and at least 1024 blocks) behind
 * the end of the data (default 256 MiB); for tests. */
void     blkpass_set_fold_lag(struct blkpass *p, uint64_t bytes);
