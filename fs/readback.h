/* fs/readback.h: read-back verification (--verify-readback).
 *
 * Once the inline digest knows the raw file's whole content (state
 * complete), the disk is read back from the server — not through the
 * pool, whose known-zero map would answer for ranges the server was only
 * asked to zero — hashed the same way and compared with the digest; the
 * bytes past the file's end, up to the export's size, must read as zero.
 * Where the server has block status, ranges it reports as zero are not
 * read (hashed as zeros: free with blkhash), but only where this mount
 * never sent a write or a write-zeroes (pool_touched_next): a server that
 * acknowledges a zeroing it did not do would report the range as zero
 * too.  With --no-extents block status is never trusted.  Reads are pipelined in a
 * fixed window (READBACK_SLOTS x READBACK_CHUNK bytes) by the verify
 * library's reader, hashed by its sink (digest/verify-sink.h), as
 * nbdferry-verify does.  With --blkhash
 * the differing ranges are named (block granularity up to 2^18 blocks,
 * coarser beyond); with sha256 only the verdict is known.
 *
 * A difference, a read that fails, or a verification that cannot run
 * (an NBD request failed, the digest does not cover the file, the file
 * changed during the read) fails the close/fsync that asked for the
 * verification with EIO, is logged and shown in the status; at unmount
 * it makes the daemon exit non-zero.  Nothing written yet (or a pass
 * still being written, at an fsync) is nothing to verify.
 */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

struct fs_disk;
struct readback;

enum readback_when {
    READBACK_OFF,
    READBACK_CLOSE,           /* a writer's close/fsync, and the unmount */
    READBACK_UNMOUNT,         /* the unmount only */
};

#define READBACK_SLOTS 8
#define READBACK_CHUNK (2u << 20)

/* "close" or "unmount" ("" or NULL: close).  -EINVAL otherwise. */
int  readback_parse_when(const char *s, enum readback_when *out);

/* md NULL: the inline digest is sha256; else blkhash with md and
 * block_size.  extents false (--no-extents): never trust block status,
 * read everything.  when READBACK_OFF: *out = NULL, every call is a
 * no-op. */
int  readback_create(enum readback_when when, const char *md,
                     uint64_t block_size, bool extents,
                     struct readback **out);
void readback_destroy(struct readback *rb);   /* NULL is fine */

/* A writer's close (after digest_close) or an fsync, the pool drained:
 * verify if the digest is complete and the disk changed since the last
 * verification.  0 (passed, or nothing to verify) or -EIO.  Blocks for
 * the read. */
int  readback_at_close(struct fs_disk *d);
/* The same at unmount, after the final flush; logs the outcome. */
int  readback_at_unmount(struct fs_disk *d);

/* The status file's "readback" member, with its trailing ",\n". */
void readback_put_status(FILE *f, struct fs_disk *d);
