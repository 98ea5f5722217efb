/* views/spool.h: bytes of an image kept until the table that places them
 * arrives.
 *
 * A format view decodes its image in file order, but some formats may
 * store data before the table that says where it goes on the disk (a
 * VHDX whose BAT comes after its blocks, a qcow2 whose L2 tables come
 * last).  The decoder hands such bytes to a spool and takes them back
 * once it can place them.  A spool keeps them in memory up to
 * cfg.mem_max, then in a file of cfg.dir (created at the first byte that
 * does not fit, with O_TMPFILE, else mkstemp() and unlink(): mode 0600,
 * never a name that exists, so a link planted there is never followed,
 * and nothing is left behind, not even after a crash), and refuses more
 * than cfg.max bytes held at once with -EFBIG and a message naming
 * --spool-max.
 *
 * Entries are byte ranges of the image file keyed by their first byte:
 *   put(key, buf, len)  keep [key, key+len); -EINVAL if it overlaps
 *                       what is held;
 *   get(key, buf, len)  give back [key, key+len), any sub-range of what
 *                       was put (several puts' bytes at once too);
 *                       -ENOENT if a byte of it is not held;
 *   drop(key)           forget the entry put at key (its room is used
 *                       again by a put of the same length).
 * The format contract's sink (common/format.h: spool_put, spool_get,
 * spool_drop) fits: vhdx keys by file offset and never drops, qcow2 keys
 * by cluster offset (views/imagesink.c; spool_cb_*: opaque is the struct
 * spool *).
 *
 * Errors are logged once, prefixed by cfg.name, and returned as -errno.
 *
 * THREAD MODEL: a spool belongs to one stream, used by the thread that
 * feeds it (under the view's ingest lock); no lock of its own. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#define SPOOL_MAX_DEFAULT     (1ull << 30)     /* --spool-max */
#define SPOOL_MEM_MAX_DEFAULT (64ull << 20)    /* then the file */

struct spool_config {
    const char *dir;              /* NULL: $TMPDIR, else /var/tmp */
    uint64_t mem_max;             /* bytes in memory before the file */
    uint64_t max;                 /* bytes held at once, in all */
    const char *name;             /* for messages: "disk.vhdx" */
};

struct spool;

/* What a spool bounded by max keeps in memory: SPOOL_MEM_MAX_DEFAULT, or
 * half of max if that is less (a small bound is a small machine). */
static inline uint64_t spool_mem_max(uint64_t max)
{
    return max / 2 < SPOOL_MEM_MAX_DEFAULT ? max / 2 : SPOOL_MEM_MAX_DEFAULT;
}

/* Nothing is allocated or created until the first put. */
int  spool_new(const struct spool_config *cfg, struct spool **out);
void spool_free(struct spool *sp);                 /* NULL: no-op */

int  spool_put(struct spool *sp, uint64_t key, const void *buf, size_t len);
int  spool_get(struct spool *sp, uint64_t key, void *buf, size_t len);
void spool_drop(struct spool *sp, uint64_t key);

struct spool_stats {
    uint64_t held;                /* bytes held now */
    uint64_t peak;                /* most held at once */
    uint64_t in_file;             /* of held, in the file */
    uint64_t file_size;           /* the file's size (room reused) */
};
void spool_stats(const struct spool *sp, struct spool_stats *out);

/* The decoders' callbacks; opaque is the struct spool *. */
int  spool_cb_put(void *opaque, uint64_t key, const void *buf, size_t len);
int  spool_cb_get(void *opaque, uint64_t key, void *buf, size_t len);
void spool_cb_drop(void *opaque, uint64_t key);
