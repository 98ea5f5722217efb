/* views/spool.c: a bounded spool, in memory then in a file (views/spool.h).
 *
 * The entries are a sorted array (puts come in file order, so almost
 * always appended); a drop leaves a tombstone, and the array is
 * compacted once half of it is tombstones, so a stream of puts and drops
 * costs amortized O(1) each.  File room freed by a drop is kept on a
 * free list and taken by the next put of the same length (a qcow2's
 * clusters are all one size), so the file grows only with what is held
 * at once. */
#include "views/spool.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/vector.h"

struct entry {
    uint64_t key, len;            /* len 0: a tombstone */
    uint64_t pos;                 /* in the file, when !mem */
    uint8_t *mem;                 /* in memory, or NULL */
};
DEFINE_VECTOR_TYPE(entry_vector, struct entry, 64);

struct room {
    uint64_t pos, len;
};
DEFINE_VECTOR_TYPE(room_vector, struct room, 16);

struct spool {
    struct spool_config cfg;
    struct entry_vector e;
    size_t dead;                  /* tombstones in e */
    struct room_vector free;      /* file room to use again */
    int fd;                       /* -1 until the first byte spills */
    uint64_t file_end;
    uint64_t mem, held, peak, in_file;
    bool full_logged;
};

int spool_new(const struct spool_config *cfg, struct spool **out)
{
    struct spool *sp = calloc(1, sizeof *sp);

    if (!sp)
        return -ENOMEM;
    sp->cfg = *cfg;
    sp->fd = -1;
    *out = sp;
    return 0;
}

void spool_free(struct spool *sp)
{
    if (!sp)
        return;
    for (size_t i = 0; i < sp->e.len; i++)
        free(sp->e.ptr[i].mem);
    entry_vector_reset(&sp->e);
    room_vector_reset(&sp->free);
    if (sp->fd >= 0)
        close(sp->fd);
    free(sp);
}

static const char *spool_dir(const struct spool *sp)
{
    const char *t = getenv("TMPDIR");

    return sp->cfg.dir ? sp->cfg.dir : t && *t ? t : "/var/tmp";
}

/* The file, unnamed from the start where the file system can (O_TMPFILE),
 * else a fresh name (O_EXCL: never an existing file or link) unlinked at
 * once. */
static int open_file(struct spool *sp)
{
    const char *dir = spool_dir(sp);
    int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);

    if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR ||
                   errno == EINVAL)) {
        char path[4096];
        if (snprintf(path, sizeof path, "%s/.nbdferry-spool-XXXXXX", dir) >=
            (int) sizeof path) {
            errno = ENAMETOOLONG;
        } else if ((fd = mkostemp(path, O_CLOEXEC)) >= 0) {
            unlink(path);
            fchmod(fd, 0600);
        }
    }
    if (fd < 0) {
        int e = errno;
        log_err("%s: cannot make a spool file in %s (--spool-dir): %s",
                sp->cfg.name, dir, strerror(e));
        return -e;
    }
    sp->fd = fd;
    return 0;
}

/* The first entry whose range ends past off (sp->e.len if none). */
static size_t find(const struct spool *sp, uint64_t off)
{
    size_t lo = 0, hi = sp->e.len;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const struct entry *m = &sp->e.ptr[mid];
        if (m->key + m->len <= off && (m->len || m->key < off))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int too_much(struct spool *sp)
{
    if (!sp->full_logged)
        log_err("%s: more than %" PRIu64 " bytes of the image arrived "
                "before the tables that place them: raise --spool-max "
                "(or write the image with its tables first)", sp->cfg.name,
                sp->cfg.max);
    sp->full_logged = true;
    return -EFBIG;
}

/* Room in the file for len bytes: a dropped entry's of that length, or
 * the end. */
static int file_room(struct spool *sp, uint64_t len, uint64_t *pos)
{
    for (size_t i = sp->free.len; i-- > 0;) {
        if (sp->free.ptr[i].len == len) {
            *pos = sp->free.ptr[i].pos;
            sp->free.ptr[i] = sp->free.ptr[--sp->free.len];
            return 0;
        }
    }
    if (sp->fd < 0) {
        int r = open_file(sp);
        if (r < 0)
            return r;
    }
    *pos = sp->file_end;
    sp->file_end += len;
    return 0;
}

static int store(struct spool *sp, struct entry *n, const void *buf)
{
    if (sp->mem + n->len <= sp->cfg.mem_max) {
        if (!(n->mem = malloc(n->len ? n->len : 1)))
            return -ENOMEM;
        memcpy(n->mem, buf, n->len);
        sp->mem += n->len;
        return 0;
    }
    int r = file_room(sp, n->len, &n->pos);
    if (r < 0)
        return r;
    for (uint64_t done = 0; done < n->len;) {
        ssize_t w = pwrite(sp->fd, (const uint8_t *) buf + done,
                           n->len - done, (off_t) (n->pos + done));
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            int e = w < 0 ? errno : ENOSPC;
            log_err("%s: cannot write the spool file in %s (--spool-dir): "
                    "%s", sp->cfg.name, spool_dir(sp), strerror(e));
            return -e;
        }
        done += (uint64_t) w;
    }
    sp->in_file += n->len;
    return 0;
}

static void compact(struct spool *sp)
{
    size_t j = 0;

    for (size_t i = 0; i < sp->e.len; i++)
        if (sp->e.ptr[i].len)
            sp->e.ptr[j++] = sp->e.ptr[i];
    sp->e.len = j;
    sp->dead = 0;
}

int spool_put(struct spool *sp, uint64_t key, const void *buf, size_t len)
{
    if (len == 0)
        return 0;
    if (key + len < key)
        return -EINVAL;
    if (len > sp->cfg.max || sp->held > sp->cfg.max - len)
        return too_much(sp);
    if (sp->dead > 64 && sp->dead * 2 > sp->e.len)
        compact(sp);
    size_t i = find(sp, key);
    /* Live entries past i must start at or past key + len. */
    for (size_t k = i; k < sp->e.len; k++) {
        if (!sp->e.ptr[k].len)
            continue;
        if (sp->e.ptr[k].key < key + len)
            return -EINVAL;               /* overlaps what is held */
        break;
    }
    if (entry_vector_reserve(&sp->e, 1) < 0)
        return -ENOMEM;
    struct entry n = { .key = key, .len = len };
    int r = store(sp, &n, buf);
    if (r < 0)
        return r;
    memmove(&sp->e.ptr[i + 1], &sp->e.ptr[i],
            (sp->e.len - i) * sizeof *sp->e.ptr);
    sp->e.ptr[i] = n;
    sp->e.len++;
    sp->held += len;
    if (sp->held > sp->peak)
        sp->peak = sp->held;
    return 0;
}

static int read_entry(struct spool *sp, const struct entry *e, uint64_t at,
                      uint8_t *out, size_t len)
{
    if (e->mem) {
        memcpy(out, e->mem + at, len);
        return 0;
    }
    for (size_t done = 0; done < len;) {
        ssize_t r = pread(sp->fd, out + done, len - done,
                          (off_t) (e->pos + at + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int err = r < 0 ? errno : EIO;
            log_err("%s: cannot read the spool file: %s", sp->cfg.name,
                    strerror(err));
            return -err;
        }
        done += (size_t) r;
    }
    return 0;
}

int spool_get(struct spool *sp, uint64_t key, void *buf, size_t len)
{
    uint8_t *out = buf;
    uint64_t off = key, end = key + len;

    for (size_t i = find(sp, key); off < end; i++) {
        while (i < sp->e.len && !sp->e.ptr[i].len)
            i++;
        if (i == sp->e.len || sp->e.ptr[i].key > off)
            return -ENOENT;               /* a byte not held */
        const struct entry *e = &sp->e.ptr[i];
        uint64_t at = off - e->key;
        uint64_t n = e->len - at < end - off ? e->len - at : end - off;
        int r = read_entry(sp, e, at, out + (off - key), (size_t) n);
        if (r < 0)
            return r;
        off += n;
    }
    return 0;
}

void spool_drop(struct spool *sp, uint64_t key)
{
    size_t i = find(sp, key);

    while (i < sp->e.len && !sp->e.ptr[i].len)
        i++;
    if (i == sp->e.len || sp->e.ptr[i].key != key)
        return;
    struct entry *e = &sp->e.ptr[i];
    if (e->mem) {
        free(e->mem);
        sp->mem -= e->len;
    } else {
        sp->in_file -= e->len;
        /* Out of memory: the room is lost. */
        (void) room_vector_append(&sp->free, (struct room) { e->pos, e->len });
    }
    sp->held -= e->len;
    e->len = 0;
    e->mem = NULL;
    sp->dead++;
}

void spool_stats(const struct spool *sp, struct spool_stats *out)
{
    *out = (struct spool_stats) { .held = sp->held, .peak = sp->peak,
                                  .in_file = sp->in_file,
                                  .file_size = sp->file_end };
}

int spool_cb_put(void *opaque, uint64_t key, const void *buf, size_t len)
{
    return spool_put(opaque, key, buf, len);
}

int spool_cb_get(void *opaque, uint64_t key, void *buf, size_t len)
{
    return spool_get(opaque, key, buf, len);
}

void spool_cb_drop(void *opaque, uint64_t key)
{
    spool_drop(opaque, key);
}
