/* manifest/manifest.h: what the destination export holds for good, block
 * by block: the record that lets a second pass over the same export send
 * only what changed (docs/design/README.md, "The manifest").
 *
 * For each block (64 KiB, the blkhash digest's blocks: digest/blkhash.h)
 * the manifest knows one of: nothing (MF_NONE), "reads as zero"
 * (MF_ZERO), or the SHA-256 of its bytes (MF_DATA).  A block is known
 * only once the server acknowledged a FLUSH covering its last change: a
 * change is first *pending* (manifest_change(), with the pool generation
 * read after the change returned: transport/pool.h pool_gen()), then
 * *durable* when manifest_durable(D) says every change older than D is on
 * stable storage.  While a block has a pending change its durable entry
 * is not used (manifest_lookup() says MF_NONE): the server may hold
 * newer bytes than the entry says.
 *
 * THE FILE (docs/design/README.md has the layout): a header (magic, version,
 * the export's identity, a checksum) followed by fixed-size records, each
 * with its own checksum seeded by the header's session number: DATA
 * (block, digest), ZERO and FORGET (runs of blocks), MTIME.  A store
 * (manifest_store()) writes the whole state to a temporary file, fsyncs
 * it, renames it over the old one and fsyncs the directory; later
 * changes are appended to it (the journal): promotions when the server
 * flushed, and FORGET records that are on stable storage (fdatasync,
 * manifest_sync()) before the change they announce is sent.  A record
 * torn by a crash at the very end is ignored; a bad record followed by
 * more records, a bad header, another export's identity: the file is
 * refused (the caller starts empty: a full copy).  The journal is
 * compacted (stored again) when it holds many more records than the
 * state.
 *
 * Memory: one byte per block, plus 32 bytes per MF_DATA block (in chunks
 * allocated on first use), plus the pending changes.
 *
 * THREAD MODEL: every function takes m->lock; any thread.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "common/err.h"

#define MF_DIGEST 32              /* SHA-256 */
#define MF_KEY_MAX 1024           /* identity key, with its NUL */
#define MF_WHY_MAX 256            /* a refusal's reason kept for the status */

enum mf_kind {
    MF_NONE = 0,                  /* unknown */
    MF_ZERO = 1,                  /* reads as zero */
    MF_DATA = 2,                  /* digest known */
};

struct manifest;

/* The export the manifest is of: a key naming the server and export
 * (daemon/mountlock.c, mountlock_key()), its size and the block size. */
struct manifest_id {
    const char *key;
    uint64_t size;
    uint32_t block_size;
};

struct manifest_stats {
    uint64_t blocks;              /* of the export */
    uint64_t data, zero;          /* durable entries */
    uint64_t pending;             /* changes waiting for a flush */
    uint64_t cut;                 /* blocks truncated, not yet settled */
    uint64_t records;             /* appended since the last store */
    uint64_t stores;
    int io_error;                 /* the last write/fsync's -errno, or 0 */
};

/* An empty manifest for id.  -EINVAL (block size 0, key too long),
 * -ENOMEM. */
int  manifest_create(const struct manifest_id *id, struct manifest **out);
void manifest_free(struct manifest *m);       /* closes the journal */

/* Read a manifest file (len bytes at buf) into m, which must be empty.
 * 0; -EINVAL with why (common/err.h) when the file is refused: bad
 * magic, version, checksum, a record out of range, another export.  On
 * a refusal m is left empty. */
int  manifest_parse(struct manifest *m, const void *buf, size_t len,
                    struct nbdf_err *why);

/* manifest_parse() of the file name in dirfd, never following a link:
 * it must be a regular file of ours with one link, not writable by group
 * or others.  -ENOENT: none; -EINVAL (why): refused; other -errno (why). */
int  manifest_load(struct manifest *m, int dirfd, const char *name,
                   struct nbdf_err *why);

/* Write the whole state as name in dirfd, atomically (name.tmp, fsync,
 * rename, directory fsync), mode 0600, and keep it open to append the
 * journal.  0 or -errno (logged by the caller; the manifest goes on in
 * memory, and its journal is off). */
int  manifest_store(struct manifest *m, int dirfd, const char *name);

/* The block's durable entry, for a skip: MF_NONE while a change of it is
 * pending (a cut block still answers: see manifest_cut()).  digest
 * (MF_DIGEST bytes) filled for MF_DATA. */
enum mf_kind manifest_lookup(struct manifest *m, uint64_t b,
                             unsigned char *digest);

/* True if no block of [b0, b1) has a durable entry (a change of them
 * forgets nothing: it may be recorded after it is sent). */
bool manifest_all_unknown(struct manifest *m, uint64_t b0, uint64_t b1);

/* Block b was changed through the mount: it now holds kind (MF_NONE:
 * bytes not known, a partial write), digest for MF_DATA, and the change
 * is older than pool generation gen.  A durable entry it had is
 * forgotten (a FORGET record: manifest_sync() before the change is sent).
 * The cut flag of b is cleared. */
void manifest_change(struct manifest *m, uint64_t b, enum mf_kind kind,
                     const unsigned char *digest, uint64_t gen);

/* Block b was changed through the mount to whole bytes whose digest is
 * still being made (fs/warm.c, THE LATER DIGEST), older than pool
 * generation gen: manifest_change(MF_NONE), kept pending past any flush
 * until manifest_resolve(b, seq) says what it holds (MF_DATA and its
 * digest; MF_NONE if the digest could not be made).  Returns seq, or 0
 * (out of memory: the block just stays unknown). */
uint64_t manifest_change_later(struct manifest *m, uint64_t b, uint64_t gen);

/* Blocks [b0, b1) were zeroed through the mount (a zeroing or a punched
 * hole, older than pool generation gen): manifest_change(MF_ZERO) of each
 * block the manifest holds something about (a durable data entry, a
 * change not yet durable, a cut); a block known zero with no change
 * stays as it is.  A block it knows nothing about is recorded as zero
 * only while fewer than MF_LEARN_PENDING changes are pending: learning
 * that a block is zero is optional, its memory is bounded (a zeroing of
 * a whole 17 TiB export would otherwise hold a pending change for each
 * of its 285 million blocks).  Blocks with nothing to record cost a byte
 * read each. */
#define MF_LEARN_PENDING 65536u
void manifest_change_zero(struct manifest *m, uint64_t b0, uint64_t b1,
                          uint64_t gen);

/* The FORGET records written since the last sync on stable storage.  0,
 * or -errno (the journal is then closed: nothing more is recorded, and
 * the manifest file is removed, as it may be wrong). */
int  manifest_sync(struct manifest *m);

/* Every change older than gen is durable on the server: pending entries
 * with gen <= this (or an earlier call's, if larger) become the durable
 * state (appended to the journal;
 * fdatasync'd at most every 5 s: a record lost to a power cut is only a
 * block sent again).  May compact the journal. */
void manifest_durable(struct manifest *m, uint64_t gen);

/* Truncates: blocks [b0, b1) will read as zero, lazily (the pool's
 * pending zero).  Blocks the manifest knows nothing about (no durable
 * entry, no pending change) stay unknown (nothing to forget; the zero is
 * not learned: a cut of a whole large export stays as cheap as its
 * entries).  Their entries stay, flagged cut: a write of the same
 * bytes that cancels the pending zero (transport/pool.h,
 * pool_note_unchanged()) clears the flag (manifest_uncut()); a settle
 * (before the drain that sends what is still pending) turns each cut
 * block into a pending MF_ZERO change of generation unknown yet
 * (manifest_settle_cuts(), then manifest_settle_gen() after the drain). */
void manifest_cut(struct manifest *m, uint64_t b0, uint64_t b1);
bool manifest_is_cut(struct manifest *m, uint64_t b);
void manifest_uncut(struct manifest *m, uint64_t b0, uint64_t b1);
/* Returns the number of blocks settled (a cut block known zero just
 * stops being cut); FORGET records synced. */
uint64_t manifest_settle_cuts(struct manifest *m);
void manifest_settle_gen(struct manifest *m, uint64_t gen);

/* Blocks changed with bytes not known (MF_NONE: written in part), whose
 * change is recorded with a generation below gen: up to n of them, b[i]
 * and a change number seq[i] for manifest_resolve().  How many.  Such a
 * change stays to be resolved after manifest_durable() covered it (the
 * flush that drained its writes comes before the read back), at most
 * MF_UNRESOLVED_KEPT of them; past that bound they stay unknown. */
#define MF_UNRESOLVED_KEPT 4096u
size_t manifest_unknown_changes(struct manifest *m, uint64_t gen,
                                uint64_t *b, uint64_t *seq, size_t n);
/* Block b was read back whole after its change seq, at a moment when
 * pool_gen() read gen (or its later digest was made, gen the write's):
 * it holds kind (digest for MF_DATA).  Applied only if no change of b
 * came since (seq is still its last); the change takes generation gen
 * (durable with the next manifest_durable() call, of any gen, once a
 * flush covered gen: what was read may hold a write that was not yet
 * flushed).  true if applied. */
bool manifest_resolve(struct manifest *m, uint64_t b, uint64_t seq,
                      enum mf_kind kind, const unsigned char *digest,
                      uint64_t gen);

/* Forget every entry, durable and pending, and every cut (journaled,
 * synced): the disk changed in a way the manifest does not follow (an
 * image view replaced it). */
void manifest_forget_all(struct manifest *m);

/* Up to n blocks with a durable MF_DATA entry, drawn at random (seed),
 * in out[]: how many.  One pass over the blocks. */
size_t manifest_sample_data(struct manifest *m, uint64_t seed, uint64_t *out,
                            size_t n);

/* The next run [*b0, *b1) at or after pos of blocks whose durable entry
 * is kind (MF_ZERO or MF_DATA; pending blocks are not in any run).
 * false when none is left. */
bool manifest_next_run(struct manifest *m, enum mf_kind kind, uint64_t pos,
                       uint64_t *b0, uint64_t *b1);

/* The file's stored time (fs/: the raw file's mtime, utimensat). */
void manifest_set_mtime(struct manifest *m, const struct timespec *t);
bool manifest_get_mtime(struct manifest *m, struct timespec *t);
/* No stored time any more (in the file from its next store). */
void manifest_forget_mtime(struct manifest *m);

void manifest_get_stats(struct manifest *m, struct manifest_stats *out);

/* The SHA-256 of a block of block_size zero bytes. */
const unsigned char *manifest_zero_digest(struct manifest *m);

/* The file name for key: 32 hex digits of its SHA-256 and ".manifest"
 * (out: at least 48 bytes). */
int  manifest_file_name(const char *key, char *out, size_t n);
