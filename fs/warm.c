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
#include "fs/warm-int.h"

/* ---- open and close ------------------------------------------------- */

void warm_on_durable(void *disk, uint64_t gen)
{
    struct warm *w = warm_live(disk);
    if (w)
        manifest_durable(w->m, gen);
}

static void load(struct fs_disk *d, struct warm *w)
{
    struct nbdf_err why = { "" };
    int r = manifest_load(w->m, w->dirfd, w->name, &why);

    if (r == -ENOENT) {
        snprintf(w->trust, sizeof w->trust, "new");
        return;
    }
    if (r < 0) {
        snprintf(w->trust, sizeof w->trust, "refused");
        snprintf(w->why, sizeof w->why, "%.*s", (int)sizeof w->why - 1,
                 why.msg);                              /* cut to fit */
        log_warn(DISK_FMT "manifest %s refused: %s: this pass is a full "
                 "copy", DISK_ARG(d), w->path, why.msg);
        return;
    }
    warm_check_trust(d, w);
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
    manifest_forget_mtime(w->m);  /* another writer: the time is wrong too */
}

static uint64_t checkpoint_bytes(void)
{
    const char *s = getenv("NBDFERRY_DEBUG_CHECKPOINT_BYTES");
    uint64_t v = s ? strtoull(s, NULL, 10) : 0;
    return v ? v : CHECKPOINT_BYTES;
}

void warm_open(struct fs_disk *d, const struct warm_config *c,
               const char *key)
{
    struct nbdf_err why = { "" };
    if (c->off || d->readonly)
        return;
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
    warm_later_init(w);
    manifest_file_name(key, w->name, sizeof w->name);
    snprintf(w->path, sizeof w->path, "%s/%s", dir, w->name);
    w->dirfd = warm_open_state_dir(dir, &why);
    w->checkpoint_bytes = checkpoint_bytes();
    w->checkpoint_ns = mono_now_ns();
    if (w->dirfd < 0) {
        log_warn(DISK_FMT "no manifest kept: %s", DISK_ARG(d), why.msg);
        snprintf(w->trust, sizeof w->trust, "not kept");
        size_t k = strnlen(why.msg, sizeof w->why - 1);  /* cut to fit */
        memcpy(w->why, why.msg, k);
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

bool warm_stored_mtime(struct fs_disk *d, struct timespec *t)
{
    struct warm *w = warm_live(d);
    return w && strcmp(w->trust, "trusted") == 0 &&
           manifest_get_mtime(w->m, t);
}

void warm_close(struct fs_disk *d, const struct timespec *mtime, bool set)
{
    struct warm *w = d->warm;
    struct stat st;
    if (!w)
        return;
    __atomic_store_n(&d->warm, NULL, __ATOMIC_RELEASE);
    warm_later_fini(w);           /* every later digest in */
    /* Forgotten meanwhile (nbdferry --forget MNT): not written again. */
    if (w->dirfd >= 0 && fstatat(w->dirfd, w->name, &st,
                                 AT_SYMLINK_NOFOLLOW) == 0) {
        /* The mtime this mount ends with: one set by utimensat with no
         * change after it, else its last change's (none: kept). */
        if (set || mtime->tv_sec || mtime->tv_nsec)
            manifest_set_mtime(w->m, mtime);
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
    warm_hash_blocks(mem, nh, dg);
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

/* Skips are allowed only while the pool holds no damage: a write is how
 * damage is repaired, so while any is left every block is sent.  A
 * server that lost data an NBD flush had covered (a RAM disk restarted
 * under the mount) lost what the manifest holds too: it is forgotten,
 * and the rest of this pass (and the next) is a full copy. */
static bool may_skip(struct fs_disk *d, struct warm *w)
{
    /* A server given up on (and not found again by the open's try): the
     * write is sent, so that it fails; a copy of unchanged blocks must
     * not end with success against a server nobody reached. */
    if (nbdx_lost(d->x))
        return false;
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
                           const void *buf, size_t len,
                           struct digest_known *known)
{
    struct blk v[MAX_BLOCKS];
    size_t n = classify(w, off, buf, len, v);

    if (n == 0)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++)
        if (v[i].whole && !v[i].zero)
            digest_known_add(known, v[i].b, v[i].d);
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
                   size_t len, struct digest_known *known)
{
    struct warm *w = warm_live(d);
    if (!w)
        return pool_write(d->pool, off, buf, len);
    for (size_t done = 0; done < len;) {
        uint64_t pos = off + done;
        size_t n = len - done;
        if (n > FS_MAX_WRITE)
            n = FS_MAX_WRITE - (size_t) (pos % BS);
        ssize_t r = write_piece(d, w, pos, (const char *) buf + done, n,
                                known);
        if (r < 0)
            return r;
        done += n;
    }
    maybe_checkpoint(d, w, len);
    return (ssize_t) len;
}

int warm_fill(void *disk, uint64_t b, unsigned char *digest)
{
    struct warm *w = warm_live(disk);
    enum mf_kind k = w ? manifest_lookup(w->m, b, digest) : MF_NONE;
    return k == MF_ZERO ? 1 : k == MF_DATA ? 2 : 0;
}

bool warm_keeps_truncate(struct fs_disk *d)
{
    struct warm *w = warm_live(d);
    struct manifest_stats st;
    if (!w)
        return false;
    manifest_get_stats(w->m, &st);
    return st.data > 0;
}

bool warm_zero_copy_ok(struct fs_disk *d, uint64_t off, uint64_t len)
{
    struct warm *w = warm_live(d);
    return !w || manifest_all_unknown(w->m, off / BS, (off + len + BS - 1) /
                                                        BS);
}

bool warm_wants_holds(struct fs_disk *d)
{
    return warm_live(d) != NULL;
}

struct digest_later *warm_record(struct fs_disk *d, uint64_t off, uint64_t len,
                                 const struct pool_fill *f)
{
    struct warm *w = warm_live(d);
    if (!w || !len)
        return NULL;
    struct digest_later *l = warm_later_record(d, w, off, len, f);
    maybe_checkpoint(d, w, len);
    return l;
}

void warm_note_mtime(struct fs_disk *d, const struct timespec *mtime)
{
    struct warm *w = warm_live(d);
    if (w)
        manifest_set_mtime(w->m, mtime);  /* journaled: a crash keeps it */
}

uint64_t warm_skipped(struct fs_disk *d)
{
    struct warm *w = d->warm;
    return w ? __atomic_load_n(&w->skipped, __ATOMIC_RELAXED) : 0;
}

/* ---- other changes -------------------------------------------------- */

/* [off, off+len) zeroed: whole blocks zero (manifest_change_zero(): its
 * memory bounded however large the range), parts of blocks unknown. */
static void change_range(struct warm *w, uint64_t off, uint64_t len,
                         uint64_t gen)
{
    uint64_t end = off + len, b0 = (off + BS - 1) / BS, b1 = end / BS;
    if (b0 >= b1) {               /* within one block, or two parts */
        manifest_change(w->m, off / BS, MF_NONE, NULL, gen);
        if ((end - 1) / BS != off / BS)
            manifest_change(w->m, (end - 1) / BS, MF_NONE, NULL, gen);
        return;
    }
    if (off % BS)
        manifest_change(w->m, off / BS, MF_NONE, NULL, gen);
    manifest_change_zero(w->m, b0, b1, gen);
    if (end % BS)
        manifest_change(w->m, end / BS, MF_NONE, NULL, gen);
}

void warm_zero_begin(struct fs_disk *d, uint64_t off, uint64_t len)
{
    struct warm *w = warm_live(d);
    if (!w || !len)
        return;
    change_range(w, off, len, GEN_UNSET);
    manifest_sync(w->m);
}

void warm_zero_end(struct fs_disk *d, uint64_t off, uint64_t len)
{
    struct warm *w = warm_live(d);
    if (w && len)
        change_range(w, off, len, pool_gen(d->pool));
}

void warm_cut(struct fs_disk *d, uint64_t off, uint64_t len)
{
    struct warm *w = warm_live(d);
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
    struct warm *w = warm_live(d);
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
            warm_hash_blocks(mem, 1, dg);
        /* pool_gen() after the read: every write whose bytes it could
         * see is older, so the next flush that covers this is theirs. */
        manifest_resolve(w->m, b[i], seq[i], zero ? MF_ZERO : MF_DATA,
                         dg[0], pool_gen(d->pool));
    }
}

void warm_settle_end(struct fs_disk *d)
{
    struct warm *w = warm_live(d);
    if (!w)
        return;
    uint64_t gen = pool_gen(d->pool);
    manifest_settle_gen(w->m, gen);
    resolve_parts(d, w, gen);
}

void warm_forget_all(struct fs_disk *d)
{
    struct warm *w = warm_live(d);
    if (!w)
        return;
    __atomic_store_n(&w->dead, true, __ATOMIC_RELEASE);
    manifest_forget_all(w->m);
    log_info(DISK_FMT "manifest: the disk is changed through an image view: "
             "the manifest forgets it (the next pass is a full copy)",
             DISK_ARG(d));
}

