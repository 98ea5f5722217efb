/* digest/verify-sink.h: the verify library, shared by nbdferry-verify
 * (tools/verify/) and the mount's read-back (fs/readback.c).
 *
 * A sink takes the byte range [0, end) of one side in offset order, as
 * data it read (sink_data) and ranges it knows read as zero (sink_zero),
 * and computes the whole-stream digest of [0, digest_len) (one EVP
 * digest, or blkhash hashed on worker threads), optional per-block
 * fingerprints that locate mismatches, and the "tail reads as zero"
 * check of [digest_len, end).
 *
 * THREAD MODEL
 * A sink is used by one thread at a time (its producer); in blkhash mode
 * that thread hands data blocks to the hasher's worker threads
 * (verify-hasher.c).  verify_set_log() is called before any sink exists.
 */
#pragma once

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <openssl/evp.h>

#include "digest/blkhash.h"
#include "digest/fingerprint.h"

/* verify-log.c */
/* One line of diagnostics; embedded newlines (libnbd and OpenSSL
 * messages) are folded into spaces.  It goes to the function set with
 * verify_set_log(), by default to stderr prefixed "nbdferry-verify: ". */
void verify_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void verify_set_log(void (*fn)(const char *line));

/* verify-fingerprint.c: the multilinear block fingerprint (fp_t,
 * fp_update()), declared in digest/fingerprint.h. */

/* verify-hasher.c: blkhash_update() on worker threads, fed by one producer. */
struct hasher;
/* Jobs hold up to job_cap bytes; at most max_bytes / job_cap jobs wait in
 * the queue (memory: that many jobs, plus one per worker and the one being
 * filled). */
int  hasher_create(struct blkhash *bh, unsigned workers, size_t job_cap,
                   size_t max_bytes, struct hasher **out);
/* Copies p[0..len) (off block-aligned) into a job; waits while the queue
 * is full.  Returns 0 or the first worker's failure (-errno). */
int  hasher_submit(struct hasher *q, uint64_t off, const void *p, size_t len);
/* Reads exactly len bytes at off into buf, from any thread; 0 or -errno
 * (logged). */
typedef int hasher_read_fn(void *ctx, void *buf, size_t len, uint64_t off);
/* Like hasher_submit(), but a worker reads the bytes itself with
 * read(ctx, ...) into the job, then hashes them: no copy on the producer's
 * thread.  ctx must outlive hasher_drain(). */
int  hasher_submit_read(struct hasher *q, uint64_t off, size_t len,
                        hasher_read_fn *read, void *ctx);
int  hasher_drain(struct hasher *q);     /* waits until all are hashed */
void hasher_free(struct hasher *q);      /* drops queued jobs; NULL is fine */

/* verify-sink.c */
#define SINK_STOP 1                      /* sink_*() result: stop reading */

struct sink {
    EVP_MD_CTX *md;                      /* owned */
    uint64_t digest_len;                 /* [0, digest_len) enters the digest */
    uint64_t end;                        /* [digest_len, end) must read as 0 */
    uint64_t pos;                        /* next offset the source delivers */
    uint64_t block_size;
    uint64_t nblocks;                    /* ceil(digest_len / block_size) */
    fp_t *blocks;                        /* owned: nblocks fingerprints */
    uint64_t bytes_read;                 /* delivered by sink_data() */
    uint64_t bytes_zero;                 /* delivered by sink_zero() */
    int64_t tail_nonzero;                /* first non-zero tail byte, or -1 */
    atomic_bool *abort;                  /* borrowed, shared by both sides */
    bool open_ended;                     /* a stream: the length is pos
                                            at sink_finish() */
    /* blkhash mode (sink_blkhash()): data blocks go to the hasher, the
     * partial block at the current position waits in 'part'. */
    struct blkhash *bh;                  /* owned; NULL: plain digest */
    struct hasher *hq;                   /* owned */
    unsigned char *part;                 /* owned: one blkhash block */
    size_t part_len;                     /* bytes of it filled */
    uint64_t part_off;                   /* its offset (block-aligned) */
    bool fold;                           /* sink_fold(): bounded memory */
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned digest_size;                /* set by sink_finish() */
};

/* block_size 0: no fingerprints (one operand, nothing to locate). */
int  sink_init(struct sink *k, const EVP_MD *md, uint64_t digest_len,
               uint64_t end, uint64_t block_size, atomic_bool *abort);
/* Switch a fresh sink to blkhash: the digest becomes the blkhash of
 * [0, digest_len) with the given digest and block size, hashed on
 * 'workers' threads; all-zero blocks and holes are never hashed. */
int  sink_blkhash(struct sink *k, const char *digest, uint64_t block_size,
                  unsigned workers);
/* blkhash mode: fold the blocks the stream has passed into the outer
 * digest every SINK_FOLD_BYTES (blkhash_fold), so that memory stays
 * bounded on any length; blkhash_fingerprints() of k->bh then knows the
 * folded part in regions of 2^blkhash_fp_min_shift() blocks. */
#define SINK_FOLD_BYTES (256ull << 20)
void sink_fold(struct sink *k);
/* Both take the segment at k->pos.  Return 0, SINK_STOP (a non-zero tail
 * byte was found: the verdict is known) or -errno. */
int  sink_data(struct sink *k, const void *buf, size_t len);
int  sink_zero(struct sink *k, uint64_t len);
/* The data segment at k->pos, len bytes, that the source can read with
 * read(ctx, ...) from any thread: a blkhash sink with nothing else to
 * compute (no fingerprints, no tail to check) hands up to one job of whole
 * blocks to the hasher, whose workers read and hash them, and returns the
 * bytes it took.  Otherwise it returns 0 and sets *lead to the bytes to
 * deliver with sink_data() before asking again (those completing a
 * partial block), or to len if it can never take them.  -errno: a worker
 * failed. */
int64_t sink_defer(struct sink *k, uint64_t len, hasher_read_fn *read,
                   void *ctx, uint64_t *lead);
int  sink_finish(struct sink *k);        /* -EIO if the range is incomplete */
bool sink_aborted(const struct sink *k); /* the other side failed */
void sink_free(struct sink *k);

/* verify-ranges.c: naming where two sides differ. */
struct verify_range {
    uint64_t off, len;
};

/* The merged byte ranges of the regions i < nregions for which
 * differs(ctx, i) (their fingerprints differ); region i covers
 * [i * region, (i + 1) * region), clipped to length.  *out is malloc'ed
 * (may be NULL when *n is 0); *bytes is their total.  0 or -ENOMEM. */
int  verify_name_ranges(size_t nregions, uint64_t region, uint64_t length,
                        bool (*differs)(const void *ctx, size_t i),
                        const void *ctx, struct verify_range **out,
                        size_t *n, uint64_t *bytes);
