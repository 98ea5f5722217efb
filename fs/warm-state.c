/* fs/warm-state.c: warm migration's state directory, the trust check
 * at mount (THE TRUST CHECK, fs/warm.c), the status and --forget. */
#include "fs/warm-int.h"

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
int warm_open_state_dir(const char *dir, struct nbdf_err *why)
{
    char p[PATH_MAX];
    struct stat st;

    if (snprintf(p, sizeof p, "%s", dir) >= (int) sizeof p || p[0] != '/')
        return nbdf_errf(why, -EINVAL, "%s: not an absolute path", dir);
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
        return nbdf_errf(why, -err, "%s: %s", dir, strerror(err));
    }
    if (fstat(fd, &st) < 0 || st.st_uid != geteuid() ||
        (st.st_mode & 022)) {
        close(fd);
        return nbdf_errf(why, -EPERM, "%s: not ours, or writable by others",
                         dir);
    }
    return fd;
}

/* ---- hashing -------------------------------------------------------- */

void warm_hash_blocks(const unsigned char *const *mem, size_t n,
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
        warm_hash_blocks(mem, 1, got);
        if (memcmp(got[0], want, MF_DIGEST) != 0)
            return distrust(w, "block %" PRIu64 " (offset %" PRIu64 ") on "
                            "the server differs from the manifest (a sample "
                            "of %zu blocks re-hashed)", blk[i], off, n);
    }
    return 0;
}

void warm_check_trust(struct fs_disk *d, struct warm *w)
{
    struct pool_stats ps;
    pool_get_stats(d->pool, &ps);
    if (strcmp(ps.scan, "complete") == 0 && check_zero_map(d, w) < 0)
        return;
    if (check_sample(d, w) < 0)
        return;
    snprintf(w->trust, sizeof w->trust, "trusted");
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
                const char *key)
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
        char name[64];
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

