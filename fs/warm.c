/* fs/warm.c: warm migration: the mount's use of the manifest (warm.h).
 *
 * THE SKIP (warm_write)
 * A write's whole blocks are hashed (SHA-256, the blkhash digest's
 * blocks).  A block whose durable entry has the same digest, with no
 * change of it since (the manifest's stale-entry rule: a pending change
 * hides the entry), is not sent: the server holds those bytes.  If the
 * block was cut by a truncate whose zeroing is still pending, the skip
 * cancels that pending zero (pool_note_unchanged()); if the zeroing was
 * already sent, the block is written.  Every block that is sent is first
 * recorded as changed (its entry forgotten, the FORGET record on stable
 * storage before the write goes out), then, once pool_write() returned,
 * as pending with the pool's generation, made durable by the next good
 * flush (warm_on_durable).  Parts of blocks are written as before and
 * make the block unknown.  A zero block over a block the manifest holds
 * as zero is not sent either (its pending zero cancelled: zero stays
 * zero); where the pool knows it zero already, the pool skips it.
 *
 * CHECKPOINTS
 * While a copy writes, a checkpoint (pool_checkpoint(): drain and flush,
 * the truncate's pending zeroes left pending) every 10 s or 1 GiB makes
 * what was written durable, so a crash resends at most that much.
 * XXX the write that crosses the mark waits for the drain; a flush
 * in the background (the pool's own periodic flush) would not.
 *
 * THE TRUST CHECK (check_trust, at mount, before anything is written)
 * The manifest is believed only if: the identity in the file matches
 * (the parse); where the block status scan is complete, no block the
 * manifest holds as data reads as zero on the server, and no block it
 * holds as zero shows data, unless reading it finds zeroes (a server
 * that allocated a write-zeroes; at most ZERO_READS blocks are read);
 * and a random sample of data blocks (SAMPLE_MIN, or 0.1%, at most
 * SAMPLE_MAX), read from the server, hashes as recorded.  Any difference
 * means someone else wrote the export (or a RAM-backed server restarted
 * empty): the whole manifest is forgotten, the status and the log say
 * why, and the pass is a full copy that builds it again.
 */
#include "fs/warm.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <openssl/evp.h>
#include <pwd.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/iszero.h"
#include "common/json.h"
#include "common/log.h"
#include "common/monotime.h"
#include "common/sha256x.h"
#include "fs/mountlock.h"
#include "manifest/manifest.h"

#define BS 65536u                 /* the blkhash digest's blocks */
#define GEN_UNSET UINT64_MAX      /* manifest.c: a change not yet sent */
#define SAMPLE_MIN 64u
#define SAMPLE_MAX 1024u
#define ZERO_READS 256u           /* zero blocks showing data, read */
#define CHECKPOINT_BYTES (1ull << 30)
#define CHECKPOINT_NS (10ull * 1000000000u)
#define MAX_BLOCKS (FS_MAX_WRITE / BS + 2)
#define RESOLVE_MAX 1024u         /* blocks written in part, read back
                                   * at a drain (64 MiB) */

/* A disk's name at the start of a log line, in a mount of several (as
 * fs/main.c). */
#define DISK_FMT "%s%s"
#define DISK_ARG(d) ((d)->fs->ndisks > 1 ? (d)->filename : ""), \
                    ((d)->fs->ndisks > 1 ? ": " : "")

struct warm {
    struct manifest *m;
    char path[PATH_MAX];          /* the manifest file */
    int dirfd;
    char name[64];
    char trust[16];               /* "new", "trusted", "distrusted",
                                   * "refused", "not kept" */
    char why[MF_WHY_MAX];
    uint64_t skipped;             /* __atomic */
    uint64_t lost_seen;           /* pool_stats.flushed_lost as last seen
                                   * (lost_lock) */
    pthread_mutex_t lost_lock;
    uint64_t since_checkpoint;    /* __atomic */
    uint64_t checkpoint_ns;       /* __atomic */
    uint64_t checkpoint_bytes;
    uint64_t checkpoints;         /* __atomic */
    bool dead;                    /* an image view changed the disk: the
                                   * manifest forgot everything and
                                   * follows nothing more; __atomic */
};

/* The disk's manifest, if it is still followed. */
static struct warm *live(struct fs_disk *d)
{
    struct warm *w = __atomic_load_n(&d->warm, __ATOMIC_ACQUIRE);
    return w && !__atomic_load_n(&w->dead, __ATOMIC_ACQUIRE) ? w : NULL;
}

/* ---- the state directory -------------------------------------------- */

char *warm_default_state_dir(void)
{
    char *s = NULL;
    const char *xdg = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
    const char *env = getenv("NBDFERRY_STATE_DIR");

    if (env && env[0] == '/')
        return strdup(env);
    if (geteuid() == 0)
        return strdup("/var/lib/nbdferry");
    if (xdg && xdg[0] == '/')
        return asprintf(&s, "%s/nbdferry", xdg) < 0 ? NULL : s;
    if (!home || home[0] != '/') {
        struct passwd *pw = getpwuid(geteuid());
        home = pw ? pw->pw_dir : NULL;
    }
    if (!home)
        return NULL;
    return asprintf(&s, "%s/.local/state/nbdferry", home) < 0 ? NULL : s;
}

/* mkdir -p, the last component 0700; its fd, never through a link at
 * the end, and only if it is ours and closed to others.  -errno, why. */
static int open_state_dir(const char *dir, char *why, size_t n)
{
    char p[PATH_MAX];
    struct stat st;

    if (snprintf(p, sizeof p, "%s", dir) >= (int) sizeof p || p[0] != '/') {
        snprintf(why, n, "%s: not an absolute path", dir);
        return -EINVAL;
    }
    for (char *s = p + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = '\0';
        mkdir(p, 0755);           /* parents: as the system makes them */
        *s = '/';
    }
    if (mkdir(p, 0700) == 0)
        chmod(p, 0700);
    int fd = open(p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        int err = errno;
        snprintf(why, n, "%s: %s", dir, strerror(err));
        return -err;
    }
    if (fstat(fd, &st) < 0 || st.st_uid != geteuid() ||
        (st.st_mode & 022)) {
        snprintf(why, n, "%s: not ours, or writable by others", dir);
        close(fd);
        return -EPERM;
    }
    return fd;
}

/* ---- hashing -------------------------------------------------------- */

static void hash_blocks(const unsigned char *const *mem, size_t n,
                        unsigned char (*out)[MF_DIGEST])
{
    if (sha256x_available()) {
        sha256x_many(mem, n, BS, out);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned len = 0;
        if (EVP_Digest(mem[i], BS, out[i], &len, EVP_sha256(), NULL) != 1)
            memset(out[i], 0, MF_DIGEST);     /* matches no block */
    }
}

/* ---- the trust check ------------------------------------------------ */

static int distrust(struct warm *w, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int distrust(struct warm *w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->why, sizeof w->why, fmt, ap);
    va_end(ap);
    snprintf(w->trust, sizeof w->trust, "distrusted");
    return -1;
}

/* Does a hole of the server cover a whole block of [b0, b1)? */
static bool hole_in_run(struct fs_disk *d, uint64_t b0, uint64_t b1,
                        uint64_t *blk)
{
    uint64_t size = d->export_size, pos = b0 * BS;
    uint64_t end = b1 * BS < size ? b1 * BS : size;
    while (pos < end) {
        int64_t h = pool_seek(d->pool, pos, SEEK_HOLE, size);
        if (h < 0 || (uint64_t) h >= end)
            return false;
        int64_t e = pool_seek(d->pool, (uint64_t) h, SEEK_DATA, size);
        uint64_t hend = e < 0 ? size : (uint64_t) e;
        uint64_t first = ((uint64_t) h + BS - 1) / BS;
        if (first < b1 && (first * BS + BS <= hend ||
                           (hend == size && first * BS < size))) {
            *blk = first;
            return true;
        }
        pos = hend;
    }
    return false;
}

/* Block status (the pool's scan) against the zero map. */
static int check_zero_map(struct fs_disk *d, struct warm *w)
{
    uint64_t b0, b1, blk, pos = 0, size = d->export_size;
    unsigned reads = 0;
    CLEANUP_FREE unsigned char *buf = malloc(BS);

    if (!buf)
        return 0;
    /* Data the manifest holds, reading as zero on the server. */
    for (; manifest_next_run(w->m, MF_DATA, pos, &b0, &b1); pos = b1)
        if (hole_in_run(d, b0, b1, &blk))
            return distrust(w, "block %" PRIu64 " (offset %" PRIu64
                            ") reads as zero on the server, but the "
                            "manifest holds data there", blk, blk * BS);
    /* Zero blocks showing data: read (a write-zeroes the server
     * allocated reads as zero). */
    for (pos = 0; manifest_next_run(w->m, MF_ZERO, pos, &b0, &b1);
         pos = b1) {
        uint64_t off = b0 * BS, end = b1 * BS < size ? b1 * BS : size;
        while (off < end) {
            int64_t dpos = pool_seek(d->pool, off, SEEK_DATA, size);
            if (dpos < 0 || (uint64_t) dpos >= end)
                break;
            uint64_t zb = (uint64_t) dpos / BS, boff = zb * BS;
            size_t len = boff + BS < size ? BS : (size_t) (size - boff);
            if (reads++ == ZERO_READS)
                return distrust(w, "more than %u blocks the manifest holds "
                                "as zero show data on the server", ZERO_READS);
            if (pool_read(d->pool, boff, buf, len) < 0)
                return distrust(w, "cannot read block %" PRIu64, zb);
            if (!is_zero(buf, len))
                return distrust(w, "block %" PRIu64 " (offset %" PRIu64 ") "
                                "holds data on the server, but the manifest "
                                "holds it as zero", zb, boff);
            off = boff + BS;
        }
    }
    return 0;
}

/* A random sample of data blocks, re-hashed from the server. */
static int check_sample(struct fs_disk *d, struct warm *w)
{
    struct manifest_stats st;
    manifest_get_stats(w->m, &st);
    size_t n = st.data / 1000;
    n = n < SAMPLE_MIN ? SAMPLE_MIN : n > SAMPLE_MAX ? SAMPLE_MAX : n;
    CLEANUP_FREE uint64_t *blk = calloc(n, sizeof *blk);
    CLEANUP_FREE unsigned char *buf = malloc(BS);
    if (!blk || !buf)
        return 0;
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    n = manifest_sample_data(w->m, (uint64_t) t.tv_nsec ^ (uint64_t) getpid(),
                             blk, n);
    for (size_t i = 0; i < n; i++) {
        unsigned char want[MF_DIGEST], got[1][MF_DIGEST];
        const unsigned char *mem[1] = { buf };
        uint64_t off = blk[i] * BS;
        if (off + BS > d->export_size)
            continue;             /* a short last block: not sampled */
        if (manifest_lookup(w->m, blk[i], want) != MF_DATA)
            continue;
        if (pool_read(d->pool, off, buf, BS) < 0)
            return distrust(w, "cannot read block %" PRIu64, blk[i]);
        hash_blocks(mem, 1, got);
        if (memcmp(got[0], want, MF_DIGEST) != 0)
            return distrust(w, "block %" PRIu64 " (offset %" PRIu64 ") on "
                            "the server differs from the manifest (a sample "
                            "of %zu blocks re-hashed)", blk[i], off, n);
    }
    return 0;
}

static void check_trust(struct fs_disk *d, struct warm *w)
{
    struct pool_stats ps;
    pool_get_stats(d->pool, &ps);
    if (strcmp(ps.scan, "complete") == 0 && check_zero_map(d, w) < 0)
        return;
    if (check_sample(d, w) < 0)
        return;
    snprintf(w->trust, sizeof w->trust, "trusted");
}

/* ---- open and close ------------------------------------------------- */

void warm_on_durable(void *disk, uint64_t gen)
{
    struct warm *w = live(disk);
    if (w)
        manifest_durable(w->m, gen);
}

static void load(struct fs_disk *d, struct warm *w)
{
    char why[MF_WHY_MAX] = "";
    int r = manifest_load(w->m, w->dirfd, w->name, why);

    if (r == -ENOENT) {
        snprintf(w->trust, sizeof w->trust, "new");
        return;
    }
    if (r < 0) {
        snprintf(w->trust, sizeof w->trust, "refused");
        snprintf(w->why, sizeof w->why, "%s", why);
        log_warn(DISK_FMT "manifest %s refused: %s: this pass is a full "
                 "copy", DISK_ARG(d), w->path, why);
        return;
    }
    check_trust(d, w);
    struct manifest_stats st;
    manifest_get_stats(w->m, &st);
    if (strcmp(w->trust, "trusted") == 0) {
        log_info(DISK_FMT "manifest %s: %" PRIu64 " blocks known (%" PRIu64
                 " data, %" PRIu64 " zero), trusted", DISK_ARG(d), w->path,
                 st.data + st.zero, st.data, st.zero);
        return;
    }
    log_warn(DISK_FMT "manifest %s distrusted: %s: someone else wrote the "
             "export since the last pass (or the server lost it); this pass "
             "is a full copy", DISK_ARG(d), w->path, w->why);
    manifest_forget_all(w->m);
}

static uint64_t checkpoint_bytes(void)
{
    const char *s = getenv("NBDFERRY_DEBUG_CHECKPOINT_BYTES");
    uint64_t v = s ? strtoull(s, NULL, 10) : 0;
    return v ? v : CHECKPOINT_BYTES;
}

void warm_open(struct fs_disk *d, const struct warm_config *c,
               struct nbdx *x, const struct nbdx_config *nc)
{
    char why[PATH_MAX + 64] = "";
    if (c->off || d->readonly)
        return;
    CLEANUP_FREE char *key = mountlock_key(x, nc);
    CLEANUP_FREE char *dflt = c->state_dir ? NULL : warm_default_state_dir();
    const char *dir = c->state_dir ? c->state_dir : dflt;
    if (!key || !dir) {
        log_info(DISK_FMT "no manifest: %s", DISK_ARG(d),
                 !key ? "the export has no stable name (a server of our "
                        "own, --fd)" : "no state directory");
        return;
    }
    struct warm *w = calloc(1, sizeof *w);
    if (w)
        pthread_mutex_init(&w->lost_lock, NULL);
    struct manifest_id id = { .key = key, .size = d->export_size,
                              .block_size = BS };
    if (!w || manifest_create(&id, &w->m) < 0) {
        free(w);
        log_warn(DISK_FMT "no manifest: out of memory", DISK_ARG(d));
        return;
    }
    manifest_file_name(key, w->name, sizeof w->name);
    snprintf(w->path, sizeof w->path, "%s/%s", dir, w->name);
    w->dirfd = open_state_dir(dir, why, sizeof why);
    w->checkpoint_bytes = checkpoint_bytes();
    w->checkpoint_ns = mono_now_ns();
    if (w->dirfd < 0) {
        log_warn(DISK_FMT "no manifest kept: %s", DISK_ARG(d), why);
        snprintf(w->trust, sizeof w->trust, "not kept");
        size_t k = strnlen(why, sizeof w->why - 1);    /* cut to fit */
        memcpy(w->why, why, k);
        w->why[k] = '\0';
    } else {
        load(d, w);
        int r = manifest_store(w->m, w->dirfd, w->name);
        if (r < 0) {
            log_warn(DISK_FMT "manifest %s: cannot write it: %s",
                     DISK_ARG(d), w->path, strerror(-r));
            snprintf(w->trust, sizeof w->trust, "not kept");
            snprintf(w->why, sizeof w->why, "cannot write it: %s",
                     strerror(-r));
        }
    }
    __atomic_store_n(&d->warm, w, __ATOMIC_RELEASE);
}

void warm_close(struct fs_disk *d)
{
    struct warm *w = d->warm;
    struct stat st;
    if (!w)
        return;
    __atomic_store_n(&d->warm, NULL, __ATOMIC_RELEASE);
    /* Forgotten meanwhile (nbdferry --forget MNT): not written again. */
    if (w->dirfd >= 0 && fstatat(w->dirfd, w->name, &st,
                                 AT_SYMLINK_NOFOLLOW) == 0) {
        int r = manifest_store(w->m, w->dirfd, w->name);   /* compacts */
        if (r < 0)
            log_warn(DISK_FMT "manifest %s: cannot write it: %s",
                     DISK_ARG(d), w->path, strerror(-r));
    }
    manifest_free(w->m);
    if (w->dirfd >= 0)
        close(w->dirfd);
    free(w);
}

/* ---- writes --------------------------------------------------------- */

struct blk {
    uint64_t b;
    bool whole, zero, skip;
    bool zero_kept;               /* zero over a block known zero: the pool
                                   * sends nothing (or zeroes it again),
                                   * the entry stays true */
    unsigned char d[MF_DIGEST];
};

/* Cut [off, off+len) into blocks, hash the whole ones, decide. */
static size_t classify(struct warm *w, uint64_t off, const unsigned char *buf,
                       size_t len, struct blk *v)
{
    const unsigned char *mem[MAX_BLOCKS];
    size_t n = 0, nh = 0, hi[MAX_BLOCKS];
    uint64_t end = off + len;

    for (uint64_t pos = off; pos < end; n++) {
        uint64_t b = pos / BS, bend = (b + 1) * BS;
        v[n] = (struct blk) { .b = b, .whole = pos == b * BS && bend <= end };
        if (v[n].whole) {
            const unsigned char *p = buf + (pos - off);
            v[n].zero = is_zero(p, BS);
            if (!v[n].zero) {
                mem[nh] = p;
                hi[nh++] = n;
            }
        }
        pos = bend < end ? bend : end;
    }
    unsigned char (*dg)[MF_DIGEST] = malloc((nh ? nh : 1) * MF_DIGEST);
    if (!dg)
        return 0;
    hash_blocks(mem, nh, dg);
    for (size_t i = 0; i < nh; i++)
        memcpy(v[hi[i]].d, dg[i], MF_DIGEST);
    free(dg);
    for (size_t i = 0; i < n; i++) {
        unsigned char have[MF_DIGEST];
        if (!v[i].whole)
            continue;
        enum mf_kind k = manifest_lookup(w->m, v[i].b, have);
        v[i].zero_kept = v[i].zero && k == MF_ZERO;
        v[i].skip = !v[i].zero && k == MF_DATA &&
                    memcmp(have, v[i].d, MF_DIGEST) == 0;
    }
    return n;
}

/* A block to skip: its pending zero (a truncate's) cancelled, or none.
 * false: it must be written after all. */
static bool confirm_skip(struct fs_disk *d, struct warm *w, uint64_t b)
{
    int r = pool_note_unchanged(d->pool, b * BS, BS);
    if (r == 1 || (r == 0 && !manifest_is_cut(w->m, b))) {
        manifest_uncut(w->m, b, b + 1);
        return true;
    }
    return false;
}

static void maybe_checkpoint(struct fs_disk *d, struct warm *w, size_t len)
{
    uint64_t since = __atomic_add_fetch(&w->since_checkpoint, len,
                                        __ATOMIC_RELAXED);
    uint64_t now = mono_now_ns();
    uint64_t last = __atomic_load_n(&w->checkpoint_ns, __ATOMIC_RELAXED);
    if (since < w->checkpoint_bytes && now - last < CHECKPOINT_NS)
        return;
    if (!__atomic_compare_exchange_n(&w->checkpoint_ns, &last, now, false,
                                     __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        return;                   /* another thread does it */
    __atomic_store_n(&w->since_checkpoint, 0, __ATOMIC_RELAXED);
    __atomic_add_fetch(&w->checkpoints, 1, __ATOMIC_RELAXED);
    pool_checkpoint(d->pool);     /* a failure: the next close says so */
}

/* One piece of at most FS_MAX_WRITE bytes. */
/* Skips are allowed only while the pool holds no damage: a write is how
 * damage is repaired, so while any is left every block is sent.  A
 * server that lost data an NBD flush had covered (a RAM disk restarted
 * under the mount) lost what the manifest holds too: it is forgotten,
 * and the rest of this pass (and the next) is a full copy. */
static bool may_skip(struct fs_disk *d, struct warm *w)
{
    if (pool_damage(d->pool) == 0)
        return true;
    struct pool_stats st;
    pool_get_stats(d->pool, &st);
    pthread_mutex_lock(&w->lost_lock);
    bool lost = st.flushed_lost > w->lost_seen;
    w->lost_seen = st.flushed_lost;
    pthread_mutex_unlock(&w->lost_lock);
    if (lost) {
        log_warn(DISK_FMT "manifest %s: the server lost data a flush had "
                 "covered; the manifest is forgotten and every block is "
                 "sent", DISK_ARG(d), w->path);
        manifest_forget_all(w->m);
    }
    return false;
}

static ssize_t write_piece(struct fs_disk *d, struct warm *w, uint64_t off,
                           const void *buf, size_t len)
{
    struct blk v[MAX_BLOCKS];
    size_t n = classify(w, off, buf, len, v);

    if (n == 0)
        return -ENOMEM;
    if (!may_skip(d, w))
        for (size_t i = 0; i < n; i++)
            v[i].skip = v[i].zero_kept = false;
    /* Confirm the skips, then forget what will be sent: on stable
     * storage before it is sent. */
    uint64_t skipped = 0;
    for (size_t i = 0; i < n; i++) {
        if (v[i].skip)
            v[i].skip = confirm_skip(d, w, v[i].b);
        if (v[i].zero_kept) {
            /* Zero stays zero: nothing to send, unless the pool must
             * see it (part of it known zero, or pending in part). */
            int r = pool_note_unchanged(d->pool, v[i].b * BS, BS);
            v[i].skip = r == 0 || r == 1;
            manifest_uncut(w->m, v[i].b, v[i].b + 1);
        }
        if (!v[i].skip && !v[i].zero_kept)
            manifest_change(w->m, v[i].b, !v[i].whole ? MF_NONE
                            : v[i].zero ? MF_ZERO : MF_DATA, v[i].d,
                            GEN_UNSET);
    }
    manifest_sync(w->m);          /* a failure: the file is removed */
    /* The runs to send. */
    for (size_t i = 0; i < n;) {
        uint64_t s = i == 0 ? off : v[i].b * BS;
        size_t j = i;
        while (j < n && v[j].skip == v[i].skip)
            j++;
        uint64_t e = j == n ? off + len : v[j].b * BS;
        if (v[i].skip) {
            skipped += e - s;
        } else {
            ssize_t r = pool_write(d->pool, s, (const char *) buf + (s - off),
                                   (size_t) (e - s));
            if (r < 0)
                return r;         /* the changes stay unknown */
        }
        i = j;
    }
    uint64_t gen = pool_gen(d->pool);
    for (size_t i = 0; i < n; i++)
        if (!v[i].skip && !v[i].zero_kept)
            manifest_change(w->m, v[i].b, !v[i].whole ? MF_NONE
                            : v[i].zero ? MF_ZERO : MF_DATA, v[i].d, gen);
    if (skipped)
        __atomic_add_fetch(&w->skipped, skipped, __ATOMIC_RELAXED);
    return (ssize_t) len;
}

ssize_t warm_write(struct fs_disk *d, uint64_t off, const void *buf,
                   size_t len)
{
    struct warm *w = live(d);
    if (!w)
        return pool_write(d->pool, off, buf, len);
    for (size_t done = 0; done < len;) {
        uint64_t pos = off + done;
        size_t n = len - done;
        if (n > FS_MAX_WRITE)
            n = FS_MAX_WRITE - (size_t) (pos % BS);
        ssize_t r = write_piece(d, w, pos, (const char *) buf + done, n);
        if (r < 0)
            return r;
        done += n;
    }
    maybe_checkpoint(d, w, len);
    return (ssize_t) len;
}

int warm_fill(void *disk, uint64_t b, unsigned char *digest)
{
    struct warm *w = live(disk);
    enum mf_kind k = w ? manifest_lookup(w->m, b, digest) : MF_NONE;
    return k == MF_ZERO ? 1 : k == MF_DATA ? 2 : 0;
}

bool warm_keeps_truncate(struct fs_disk *d)
{
    struct warm *w = live(d);
    struct manifest_stats st;
    if (!w)
        return false;
    manifest_get_stats(w->m, &st);
    return st.data > 0;
}

bool warm_zero_copy_ok(struct fs_disk *d, uint64_t off, uint64_t len)
{
    struct warm *w = live(d);
    return !w || manifest_all_unknown(w->m, off / BS, (off + len + BS - 1) /
                                                        BS);
}

bool warm_wants_holds(struct fs_disk *d)
{
    return live(d) != NULL;
}

/* Bytes [pos, pos+n) of a committed write, from its holds: in place if
 * one hold has them all, else copied into tmp. */
static const unsigned char *from_holds(const struct pool_fill *f,
                                       uint64_t pos, size_t n,
                                       unsigned char *tmp)
{
    size_t done = 0;
    for (unsigned i = 0; i < f->nhold && done < n; i++) {
        const struct pool_hold *h = &f->hold[i];
        uint64_t at = pos + done;
        if (at < h->off || at >= h->off + h->len)
            continue;
        size_t k = (size_t) (h->off + h->len - at);
        if (k > n - done)
            k = n - done;
        if (done == 0 && k == n)
            return (const unsigned char *) h->mem + (at - h->off);
        memcpy(tmp + done, (const char *) h->mem + (at - h->off), k);
        done += k;
    }
    return done == n ? tmp : NULL;
}

void warm_record(struct fs_disk *d, uint64_t off, uint64_t len,
                 const struct pool_fill *f)
{
    struct warm *w = live(d);
    const unsigned char *mem[MAX_BLOCKS];
    uint64_t blk[MAX_BLOCKS];
    unsigned char dg[MAX_BLOCKS][MF_DIGEST];
    size_t nh = 0;
    if (!w || !len)
        return;
    uint64_t gen = pool_gen(d->pool), end = off + len;
    CLEANUP_FREE unsigned char *tmp = malloc((size_t) MAX_BLOCKS * BS);
    for (uint64_t b = off / BS; b * BS < end; b++) {
        bool whole = b * BS >= off && (b + 1) * BS <= end;
        const unsigned char *p = whole && tmp && nh < MAX_BLOCKS
            ? from_holds(f, b * BS, BS, tmp + nh * BS) : NULL;
        if (p && is_zero(p, BS))
            manifest_change(w->m, b, MF_ZERO, NULL, gen);
        else if (p) {
            blk[nh] = b;
            mem[nh++] = p;
        } else
            manifest_change(w->m, b, MF_NONE, NULL, gen);
    }
    hash_blocks(mem, nh, dg);
    for (size_t i = 0; i < nh; i++)
        manifest_change(w->m, blk[i], MF_DATA, dg[i], gen);
    maybe_checkpoint(d, w, len);
}

uint64_t warm_skipped(struct fs_disk *d)
{
    struct warm *w = d->warm;
    return w ? __atomic_load_n(&w->skipped, __ATOMIC_RELAXED) : 0;
}

/* ---- other changes -------------------------------------------------- */

/* Each block [off, off+len) touches: whole ones as kind, parts unknown. */
static void change_range(struct warm *w, uint64_t off, uint64_t len,
                         uint64_t gen)
{
    uint64_t end = off + len;
    for (uint64_t b = off / BS; b * BS < end; b++) {
        bool whole = b * BS >= off && (b + 1) * BS <= end;
        manifest_change(w->m, b, whole ? MF_ZERO : MF_NONE, NULL, gen);
    }
}

void warm_zero_begin(struct fs_disk *d, uint64_t off, uint64_t len)
{
    struct warm *w = live(d);
    if (!w || !len)
        return;
    change_range(w, off, len, GEN_UNSET);
    manifest_sync(w->m);
}

void warm_zero_end(struct fs_disk *d, uint64_t off, uint64_t len)
{
    struct warm *w = live(d);
    if (w && len)
        change_range(w, off, len, pool_gen(d->pool));
}

void warm_cut(struct fs_disk *d, uint64_t off, uint64_t len)
{
    struct warm *w = live(d);
    if (!w || !len)
        return;
    uint64_t end = off + len, b0 = (off + BS - 1) / BS, b1 = end / BS;
    if (end >= d->export_size)
        b1 = (d->export_size + BS - 1) / BS;     /* the short last block */
    /* Parts of blocks: unknown now (their zeroing comes with the next
     * drain; the settle gives them its generation). */
    if (off % BS)
        manifest_change(w->m, off / BS, MF_NONE, NULL, GEN_UNSET);
    if (end % BS && end < d->export_size && end / BS >= b0)
        manifest_change(w->m, end / BS, MF_NONE, NULL, GEN_UNSET);
    manifest_sync(w->m);
    if (b0 < b1)
        manifest_cut(w->m, b0, b1);
}

void warm_settle_begin(struct fs_disk *d)
{
    struct warm *w = live(d);
    if (w)
        manifest_settle_cuts(w->m);
}

/* Blocks written in part, all of whose changes are on the server now
 * (after a drain): read back whole and recorded, so that a copy writing
 * a block in pieces (cp --sparse at a hole's 4 KiB edge) still leaves it
 * known.  A change of the block meanwhile wins (manifest_resolve()). */
static void resolve_parts(struct fs_disk *d, struct warm *w, uint64_t gen)
{
    CLEANUP_FREE uint64_t *b = malloc(2 * RESOLVE_MAX * sizeof *b);
    CLEANUP_FREE unsigned char *buf = malloc(BS);
    uint64_t *seq = b ? b + RESOLVE_MAX : NULL;
    size_t n = buf && b ? manifest_unknown_changes(w->m, gen, b, seq,
                                                   RESOLVE_MAX) : 0;
    for (size_t i = 0; i < n; i++) {
        const unsigned char *mem[1] = { buf };
        unsigned char dg[1][MF_DIGEST];
        if ((b[i] + 1) * BS > d->export_size ||
            pool_read(d->pool, b[i] * BS, buf, BS) < 0)
            continue;
        bool zero = is_zero(buf, BS);
        if (!zero)
            hash_blocks(mem, 1, dg);
        /* pool_gen() after the read: every write whose bytes it could
         * see is older, so the next flush that covers this is theirs. */
        manifest_resolve(w->m, b[i], seq[i], zero ? MF_ZERO : MF_DATA,
                         dg[0], pool_gen(d->pool));
    }
}

void warm_settle_end(struct fs_disk *d)
{
    struct warm *w = live(d);
    if (!w)
        return;
    uint64_t gen = pool_gen(d->pool);
    manifest_settle_gen(w->m, gen);
    resolve_parts(d, w, gen);
}

void warm_forget_all(struct fs_disk *d)
{
    struct warm *w = live(d);
    if (!w)
        return;
    __atomic_store_n(&w->dead, true, __ATOMIC_RELEASE);
    manifest_forget_all(w->m);
    log_info(DISK_FMT "manifest: the disk is changed through an image view: "
             "the manifest forgets it (the next pass is a full copy)",
             DISK_ARG(d));
}

/* ---- status --------------------------------------------------------- */

void warm_put_status(FILE *f, struct fs_disk *d)
{
    struct warm *w = d->warm;
    struct manifest_stats st;
    if (!w) {
        fputs("  \"manifest\": null,\n", f);
        return;
    }
    manifest_get_stats(w->m, &st);
    fputs("  \"manifest\": {\"path\": ", f);
    json_put_string(f, w->path);
    fprintf(f, ", \"trust\": \"%s\", \"why\": ", w->trust);
    json_put_string(f, w->why);
    fprintf(f, ", \"blocks\": %" PRIu64 ", \"blocks_known\": %" PRIu64
               ", \"data_blocks\": %" PRIu64 ", \"zero_blocks\": %" PRIu64
               ", \"pending_blocks\": %" PRIu64 ", \"skipped_bytes\": %"
               PRIu64 ", \"checkpoints\": %" PRIu64 ", \"journal_error\": %s"
               "},\n", st.blocks, st.data + st.zero, st.data, st.zero,
            st.pending, __atomic_load_n(&w->skipped, __ATOMIC_RELAXED),
            __atomic_load_n(&w->checkpoints, __ATOMIC_RELAXED),
            st.io_error ? "true" : "false");
}

/* ---- --forget ------------------------------------------------------- */

/* The manifest path a mount's status names ("path": "..."), or NULL. */
static char *path_from_status(const char *mnt)
{
    char p[PATH_MAX], *text = NULL;
    size_t cap = 0;
    snprintf(p, sizeof p, "%s/%s", mnt, FS_STATUS_NAME);
    FILE *f = fopen(p, "r");
    if (!f)
        return NULL;
    ssize_t n = getdelim(&text, &cap, '\0', f);
    fclose(f);
    char *k = n > 0 ? strstr(text, "\"manifest\": {\"path\": \"") : NULL;
    char *out = NULL;
    if (k) {
        k += strlen("\"manifest\": {\"path\": \"");
        char *e = strchr(k, '"');
        if (e)
            out = strndup(k, (size_t) (e - k));
    }
    free(text);
    return out;
}

int warm_forget(const char *target, const struct warm_config *c,
                const struct nbdx_config *base)
{
    struct stat st;
    CLEANUP_FREE char *path = NULL;

    if (stat(target, &st) == 0 && S_ISDIR(st.st_mode)) {
        if (!(path = path_from_status(target))) {
            log_err("--forget %s: not an nbdferry mount with a manifest "
                    "(no status naming one)", target);
            return EXIT_FAILURE;
        }
    } else {
        struct nbdx_config nc = *base;
        struct nbdx *x;
        char name[64];
        nc.mode = NBDX_URI;
        nc.uri = target;
        if (nbdx_open(&nc, &x) < 0)
            return EXIT_FAILURE;  /* logged */
        CLEANUP_FREE char *key = mountlock_key(x, &nc);
        nbdx_close(x);
        CLEANUP_FREE char *dflt = c->state_dir ? NULL
                                               : warm_default_state_dir();
        const char *dir = c->state_dir ? c->state_dir : dflt;
        if (!key || !dir || manifest_file_name(key, name, sizeof name) < 0) {
            log_err("--forget %s: no manifest can exist for it", target);
            return EXIT_FAILURE;
        }
        if (asprintf(&path, "%s/%s", dir, name) < 0)
            return EXIT_FAILURE;
    }
    if (unlink(path) < 0 && errno != ENOENT) {
        log_err("--forget %s: %s: %s", target, path, strerror(errno));
        return EXIT_FAILURE;
    }
    log_notice("manifest %s dropped: the next pass over the export is a "
               "full copy", path);
    return EXIT_SUCCESS;
}
