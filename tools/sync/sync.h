/* tools/sync/sync.h: internal interfaces of nbdferry-sync.
 *
 * Data flow:
 *
 *   change list (a file, or the source's dirty bitmap)
 *       --parse and validate, whole--> struct sync_list (one bit a block)
 *   struct sync_source --read listed runs--> pwrite to MNT/FILE
 *   MNT/.nbdferry-status --> the whole-disk digest
 *
 * Nothing is written before the whole list has been read and validated:
 * a list that is malformed, too short or reaches past the disk touches
 * nothing.  One thread.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* The unit of every change list: XAPI's CBT block, the manifest's block. */
#define SYNC_BLOCK ((uint64_t) 64 << 10)

/* ---- changed.c: the list of blocks to copy and its parsers ---- */

struct sync_list {
    uint64_t size;                      /* the disk's size in bytes */
    uint64_t nblocks;                   /* ceil(size / SYNC_BLOCK) */
    uint8_t *bits;                      /* owned; block b is bit b % 8
                                         * (LSB first) of bits[b / 8] */
};

enum sync_list_kind {
    SYNC_LIST_AUTO,                     /* a file: xapi or extents, told
                                         * from its text */
    SYNC_LIST_XAPI,                     /* VDI.list_changed_blocks */
    SYNC_LIST_EXTENTS,                  /* OFFSET LENGTH lines */
    SYNC_LIST_DIRTY_BITMAP,             /* qemu:dirty-bitmap:NAME of an
                                         * NBD source */
};

/* A list with nothing listed for a disk of 'size' bytes.  -ENOMEM. */
int  sync_list_init(struct sync_list *l, uint64_t size);
void sync_list_free(struct sync_list *l);
static inline bool sync_list_has(const struct sync_list *l, uint64_t b)
{
    return (l->bits[b / 8] >> (b % 8)) & 1;
}
/* List every block [off, off + len) touches; off + len <= l->size. */
void sync_list_add(struct sync_list *l, uint64_t off, uint64_t len);
void sync_list_all(struct sync_list *l);
uint64_t sync_list_count(const struct sync_list *l);

/* "xapi:FILE", "extents:FILE", "dirty-bitmap:NAME", or FILE (AUTO).
 * *what points into arg (the file or the bitmap's name). */
enum sync_list_kind sync_list_kind_of(const char *arg, const char **what);
const char *sync_list_kind_name(enum sync_list_kind k);

/* Parse text (len bytes, need not be NUL-terminated) as kind (AUTO: tell
 * xapi from extents by the text) into l, which sync_list_init() made for
 * the disk.  On error: -EINVAL and err says which rule the text broke;
 * l may then hold part of the list (the caller writes nothing).
 * *kind_out (may be NULL) says which parser ran. */
int  sync_list_parse(enum sync_list_kind kind, const char *text, size_t len,
                     struct sync_list *l, enum sync_list_kind *kind_out,
                     struct nbdf_err *err);
int  sync_parse_xapi(const char *text, size_t len, struct sync_list *l,
                     struct nbdf_err *err);
int  sync_parse_extents(const char *text, size_t len, struct sync_list *l,
                        struct nbdf_err *err);

/* ---- source.c: the disk to copy from, a file or an NBD export ---- */

struct nbd_handle;

struct sync_source {
    const char *name;                   /* borrowed: the operand */
    int fd;                             /* a file or block device, or -1 */
    struct nbd_handle *h;               /* an NBD export, or NULL */
    char *meta_context;                 /* owned: the dirty bitmap's
                                         * context, or NULL */
    uint64_t size;
    size_t max_read;                    /* bytes per read request */
    uint64_t bytes_read;                /* data read so far */
    unsigned timeout_s;                 /* NBD: no progress for this long
                                         * fails a step; 0: wait forever */
};

/* Opens operand: an NBD URI if it contains "://", else a file or block
 * device.  bitmap (may be NULL) names a qemu dirty bitmap the NBD server
 * must offer (qemu:dirty-bitmap:NAME).  timeout_s: see struct sync_source.
 * Logs the reason on failure. */
int  sync_source_open(const char *operand, const char *bitmap,
                      unsigned timeout_s, struct sync_source *s);
/* Exactly len bytes at off (off + len <= size). */
int  sync_source_read(struct sync_source *s, void *buf, size_t len,
                      uint64_t off);
/* Lists into l every block the dirty bitmap marks, asking block status
 * for the whole disk, page after page to its end. */
int  sync_source_dirty(struct sync_source *s, struct sync_list *l);
void sync_source_close(struct sync_source *s);

/* ---- status.c: the mount's whole-disk digest ---- */

struct sync_digest {
    bool found;                         /* a status file was read */
    char algorithm[64];
    char state[32];                     /* complete, incomplete, ... */
    char value[160];                    /* hex, "" if none */
    char reason[256];
    bool have_skipped;
    uint64_t skipped;                   /* the mount's progress.skipped_bytes:
                                         * written to it, not sent */
    char why[320];                      /* found false: why not */
};

/* Reads dest's mount status (the .nbdferry-status beside it) until the
 * digest is no longer "computing", waiting at most timeout_s seconds
 * without the hashing moving on.  Fills d; never fails (d->found false
 * and d->why say what went wrong). */
void sync_digest_read(const char *dest, unsigned timeout_s,
                      struct sync_digest *d);

/* ---- log ---- */
void sync_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
