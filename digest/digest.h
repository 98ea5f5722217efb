/* digest/digest.h: the inline digest — a running sha256 of the raw file while
 * one forward pass (cp, dd, cat) writes it, so `sha256sum source` can be
 * compared without reading the disk back.
 *
 * ops.c reports what happens to the raw file's content; the digest
 * decides whether it is still one forward pass and hashes on its own
 * thread.  Every function accepts d == NULL (--no-digest) and does
 * nothing.  None of them blocks on hashing.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "digest/known.h"

struct digest;

enum digest_state {
    DIGEST_DISABLED,          /* --no-digest */
    DIGEST_IDLE,              /* nothing written since the mount */
    DIGEST_COMPUTING,         /* a forward pass is being written/hashed */
    DIGEST_COMPLETE,          /* closed, hashed, covers the whole file */
    DIGEST_INCOMPLETE,        /* closed, but covers only a prefix: the
                               * rest holds data this pass did not write */
    DIGEST_NOT_FORWARD,       /* writes were not one forward pass */
    DIGEST_ABANDONED,         /* hashing fell too far behind the writes */
    DIGEST_CANNOT_COMPLETE,   /* blkhash: a block's bytes were lost (part
                               * of a hashed block rewritten, ...) */
};

#define DIGEST_HEX_MAX 129        /* 64-byte digests (sha512) in hex, NUL */

struct digest_info {
    enum digest_state state;
    const char *algorithm;    /* "sha256", "blkhash/DIGEST/BLOCKSIZE",
                               * or "none" (--digest=none) */
    char check[160];          /* how to compute the same value from the
                               * source with other tools */
    uint64_t covered;         /* bytes hashed so far, from offset 0 */
    uint64_t position;        /* bytes accepted (hashed or queued) */
    uint64_t queued;          /* bytes waiting for the thread: copies'
                               * payload and each item's bookkeeping */
    uint64_t held, hold_limit;   /* bytes of pool buffers held; budget */
    uint64_t copied;          /* bytes copied past the hold budget */
    uint64_t copy_wait_ns;    /* writers waited for room in the queue */
    uint64_t reused;          /* bytes whose block digests the writer had
                               * (known.h): not hashed a second time */
    char hex[DIGEST_HEX_MAX]; /* "" unless state == DIGEST_COMPLETE */
    char reason[160];         /* NOT_FORWARD, ABANDONED, INCOMPLETE,
                               * CANNOT_COMPLETE: why */
};

/* queue_limit: bytes of copies that may wait for hashing (held pool
 * buffers are bounded apart: digest_set_hold_limit()).  A writer that
 * finds the queue full waits for the digest thread, for at most a few
 * seconds; past that the digest is abandoned rather than the copy held
 * up.  Starts the digest thread. */
int  digest_create(size_t queue_limit, struct digest **out);
/* The same, computing blkhash (digest/blkhash.h) with this OpenSSL digest
 * and block size instead of sha256: writes may come in any order; see
 * digest.c, THE BLKHASH PASS.  -EINVAL: unknown digest or bad size. */
int  digest_create_blkhash(size_t queue_limit, const char *md,
                           uint64_t block_size, struct digest **out);
/* The most bytes of pool buffers the digest holds at once
 * (digest_write_held()); past it a held write is copied and its buffer
 * given back at once.  Default: queue_limit. */
void digest_set_hold_limit(struct digest *d, size_t bytes);
/* blkhash only: how the pass reads a block back from the disk when a
 * change leaves part of it unknown (digest/blkpass.h, THE READER): read()
 * must see every change reported so far (pool_read()).  size: the
 * disk's.  Runs on the digest thread, with no digest lock held but the
 * pass's (bp_lock: lock order bp_lock, then the reader's). */
void digest_set_reader(struct digest *d,
                       int (*read)(void *ctx, uint64_t off, void *buf,
                                   size_t len),
                       void *ctx, uint64_t size);
/* blkhash with sha256 over 64 KiB blocks only (else ignored): the blocks
 * a pass never wrote, taken from a record of the disk at a close
 * (digest/blkpass.h, THE FILLER; fs/warm.c).  Runs on the digest thread. */
void digest_set_filler(struct digest *d,
                       int (*fill)(void *ctx, uint64_t b,
                                   unsigned char *digest),
                       void *ctx);
/* Stops the thread (abandoning queued work) and frees. */
void digest_destroy(struct digest *d);

/* The raw file was truncated to size; old is the size before.  Size 0
 * starts a new pass. */
void digest_truncate(struct digest *d, uint64_t size, uint64_t old);
/* buf[0..len) was written at off (and accepted by the pool).  Copies.
 * known (may be NULL): digests the writer has of some of its whole
 * blocks (digest/known.h); the default blkhash takes them instead of
 * hashing those blocks again, the other digests ignore them. */
void digest_write(struct digest *d, uint64_t off, const void *buf, size_t len,
                  const struct digest_known *known);
/* Like digest_write(), without the copy: the digest reads buf until it
 * calls release(ref), exactly once (at once if it does not need the
 * bytes).  The caller keeps buf unchanged until then (a pool hold). */
void digest_write_held(struct digest *d, uint64_t off, const void *buf,
                       size_t len, void (*release)(void *), void *ref,
                       const struct digest_known *known);
/* [off, off+len) now reads as zero (punch hole, zero range); apparent is
 * the file's size afterwards. */
void digest_zero(struct digest *d, uint64_t off, uint64_t len,
                 uint64_t apparent);
/* The raw file was closed (FUSE flush) at this apparent size: the pass
 * covers the file up to it. */
void digest_close(struct digest *d, uint64_t apparent);

/* The disk is about to be changed another way (through the VHD or VMDK
 * view): the raw file's pass, if any, is over.  what (a static string)
 * names it for the status. */
void digest_foreign(struct digest *d, const char *what);
/* That view's image replaces the disk by one of size bytes that reads as
 * zero: a new pass starts, which the decoded data and zeroes feed like a
 * raw file's writes (sha256 while they come in disk order, blkhash in
 * any), closed by digest_close() when the image is complete. */
void digest_replace(struct digest *d, uint64_t size);
/* A view's request is done: every write of it has been reported (sha256
 * holds out-of-order writes of a view's pass until then; see digest.c,
 * THE REORDER HOLD). */
void digest_barrier(struct digest *d);

/* Wait until the digest thread has taken in everything queued so far
 * (a close's value is then known), for at most timeout_s seconds.
 * 0, or -ETIMEDOUT. */
int  digest_settle(struct digest *d, unsigned timeout_s);

/* blkhash only: the region fingerprints of the pass's blocks for a file
 * of 'size' bytes (blkpass_fingerprints()), regions of 2^*shift blocks:
 * *shift is raised to the finest the pass still knows.  *fp (*n
 * entries) is malloc'd, the caller's.  Meaningful while digest_get()
 * shows that size complete.  -ENOTSUP for sha256 or --no-digest. */
int  digest_fingerprints(struct digest *d, uint64_t size, unsigned *shift,
                         uint64_t **fp, size_t *n);

/* What the status shows.  apparent: the raw file's size now. */
void digest_get(struct digest *d, uint64_t apparent, struct digest_info *out);
const char *digest_state_name(enum digest_state s);
