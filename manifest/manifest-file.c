/* manifest/manifest-file.c: the manifest's file (manifest/manifest.h):
 * its encoding, the journal of records appended as blocks change, the
 * parse of a file (header, records, a torn end), and the atomic store
 * (a new file renamed over the old).  The invariants are manifest.c's. */
#include "manifest/manifest-int.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "common/cleanup.h"

/* ---- encoding ------------------------------------------------------- */

static void put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char) (v >> (8 * i));
}

static void put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char) (v >> (8 * i));
}

static uint32_t get32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t) p[i] << (8 * i);
    return v;
}

static uint64_t get64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t) p[i] << (8 * i);
    return v;
}

/* FNV-1a, 64 bits, from seed: finds torn and flipped bytes (a checksum,
 * not a defence against a forger: the file is ours, mode 0600). */
static uint64_t fnv(uint64_t seed, const unsigned char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull ^ seed;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* ---- the journal ---------------------------------------------------- */

void mf_close_journal(struct manifest *m)
{
    if (m->jfd >= 0)
        close(m->jfd);
    m->jfd = -1;
    m->jlen = 0;
}

/* A write or fsync failed: the file may now say what is not so.  It is
 * removed, and nothing more is recorded on disk. */
static int journal_failed(struct manifest *m, int err)
{
    m->io_error = err;
    if (m->storing)
        return err;               /* the store undoes itself */
    mf_close_journal(m);
    if (m->dirfd >= 0)
        unlinkat(m->dirfd, m->name, 0);
    return err;
}

static int write_all(int fd, const unsigned char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return w < 0 ? -errno : -EIO;
        p += w;
        n -= (size_t) w;
    }
    return 0;
}

int mf_jflush(struct manifest *m)
{
    if (m->jfd < 0 || m->jlen == 0) {
        m->jlen = 0;
        return 0;
    }
    int r = write_all(m->jfd, m->jbuf, m->jlen);
    m->jlen = 0;
    if (r < 0)
        return journal_failed(m, r);
    m->unsynced = true;
    return 0;
}

static void encode_rec(const struct manifest *m, unsigned char *p,
                       enum rec_type t, uint64_t b, uint64_t count,
                       const unsigned char *d)
{
    memset(p, 0, REC_LEN);
    put32(p, t);
    put64(p + 8, b);
    put64(p + 16, count);
    if (d)
        memcpy(p + 24, d, MF_DIGEST);
    unsigned char s[8];
    put64(s, m->session);
    put64(p + REC_SUM, fnv(fnv(0, s, 8), p, REC_SUM));
}

void mf_jrec(struct manifest *m, enum rec_type t, uint64_t b,
                 uint64_t count, const unsigned char *d)
{
    if (m->jfd < 0)
        return;
    if (m->jlen + REC_LEN > sizeof m->jbuf && mf_jflush(m) < 0)
        return;
    encode_rec(m, m->jbuf + m->jlen, t, b, count, d);
    m->jlen += REC_LEN;
    m->records++;
}

uint64_t mf_now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t) t.tv_sec * 1000000000u + (uint64_t) t.tv_nsec;
}

int mf_sync_locked(struct manifest *m)
{
    int r = mf_jflush(m);
    if (r == 0 && m->jfd >= 0 && m->unsynced) {
        if (fdatasync(m->jfd) < 0)
            return journal_failed(m, -errno);
        m->unsynced = false;
        m->synced_ns = mf_now_ns();
    }
    return r;
}

/* Promotions need not be on stable storage at once (a record lost to a
 * power cut is a block sent again): written now, synced at most every
 * PROMOTE_SYNC_NS (a writer flushing every write, dd oflag=dsync, does
 * not pay an fdatasync of the journal per write). */
#define PROMOTE_SYNC_NS (5ull * 1000000000u)

void mf_promoted_locked(struct manifest *m)
{
    if (mf_jflush(m) == 0 && m->unsynced &&
        mf_now_ns() - m->synced_ns >= PROMOTE_SYNC_NS)
        mf_sync_locked(m);
}


static int refuse(struct manifest *m, struct nbdf_err *why, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int refuse(struct manifest *m, struct nbdf_err *why, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why->msg, sizeof why->msg, fmt, ap);
    va_end(ap);
    mf_clear_locked(m);
    return -EINVAL;
}

static int parse_header(struct manifest *m, const unsigned char *p,
                        size_t len, struct nbdf_err *why)
{
    if (len < HDR_LEN)
        return refuse(m, why, "truncated: %zu bytes, shorter than its "
                      "header", len);
    if (memcmp(p, MAGIC, 8) != 0)
        return refuse(m, why, "not a manifest (bad magic)");
    if (get32(p + 8) != VERSION || get32(p + 12) != HDR_LEN)
        return refuse(m, why, "version %" PRIu32 ", not %d", get32(p + 8),
                      VERSION);
    if (get64(p + HDR_SUM) != fnv(0, p, HDR_SUM))
        return refuse(m, why, "corrupt header (bad checksum)");
    uint32_t klen = get32(p + 20);
    if (klen >= MF_KEY_MAX || p[HDR_KEY + klen] != '\0' ||
        strlen((const char *) p + HDR_KEY) != klen)
        return refuse(m, why, "corrupt header (key)");
    if (strcmp((const char *) p + HDR_KEY, m->key) != 0)
        return refuse(m, why, "of another export (%s)",
                      (const char *) p + HDR_KEY);
    if (get64(p + 24) != m->size || get32(p + 16) != m->bs)
        return refuse(m, why, "of an export of %" PRIu64 " bytes in "
                      "blocks of %" PRIu32 ", not %" PRIu64 " in %" PRIu32,
                      get64(p + 24), get32(p + 16), m->size, m->bs);
    m->session = get64(p + 32);
    if (get32(p + 52) & FLAG_MTIME) {
        m->has_mtime = true;
        m->mtime.tv_sec = (time_t) get64(p + 40);
        m->mtime.tv_nsec = get32(p + 48) % 1000000000u;
    }
    return 0;
}

static bool in_range(const struct manifest *m, uint64_t b, uint64_t n)
{
    return b < m->nblocks && n <= m->nblocks - b;
}

/* Apply one record whose checksum is good.  0, or -EINVAL with why. */
static int apply_rec(struct manifest *m, const unsigned char *p, size_t i,
                     struct nbdf_err *why)
{
    uint32_t t = get32(p);
    uint64_t b = get64(p + 8), n = get64(p + 16);

    switch (t) {
    case REC_DATA:
        if (!in_range(m, b, 1))
            break;
        mf_set_durable(m, b, MF_DATA, p + 24);
        return 0;
    case REC_ZERO:
    case REC_FORGET:
        if (!n || !in_range(m, b, n))
            break;
        for (uint64_t j = b; j < b + n; j++)
            mf_set_durable(m, j, t == REC_ZERO ? MF_ZERO : MF_NONE, NULL);
        return 0;
    case REC_MTIME:
        m->has_mtime = true;
        m->mtime.tv_sec = (time_t) b;
        m->mtime.tv_nsec = (long) (n % 1000000000u);
        return 0;
    }
    return refuse(m, why, "record %zu: bad type or block (%" PRIu32 ", %"
                  PRIu64 "+%" PRIu64 ")", i, t, b, n);
}

static bool all_zero(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return false;
    return true;
}

int manifest_parse(struct manifest *m, const void *buf, size_t len,
                   struct nbdf_err *why)
{
    const unsigned char *p = buf;
    LOCK_FOR_SCOPE(&m->lock);
    assert(!m->ndata && !m->nzero && !m->pend.len);
    int r = parse_header(m, p, len, why);
    if (r < 0)
        return r;
    unsigned char s[8];
    put64(s, m->session);
    uint64_t seed = fnv(0, s, 8);
    size_t nrec = (len - HDR_LEN) / REC_LEN;
    for (size_t i = 0; i < nrec; i++) {
        const unsigned char *q = p + HDR_LEN + i * REC_LEN;
        if (get64(q + REC_SUM) == fnv(seed, q, REC_SUM)) {
            if ((r = apply_rec(m, q, i, why)) < 0)
                return r;
            continue;
        }
        /* A torn end (a crash while appending): the last record, or only
         * zero bytes after it.  Anything else is corruption. */
        const unsigned char *rest = q + REC_LEN;
        size_t left = len - (size_t) (rest - p);
        if (left && !all_zero(rest, left))
            return refuse(m, why, "corrupt record %zu of %zu (bad "
                          "checksum)", i, nrec);
        break;
    }
    return 0;
}

int manifest_load(struct manifest *m, int dirfd, const char *name,
                  struct nbdf_err *why)
{
    struct stat st;
    int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC |
                    O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        int err = errno;
        if (err == ELOOP || err == EMLINK)
            nbdf_errf(why, 0, "a symbolic link (never followed)");
        else
            nbdf_errf(why, 0, "%s", strerror(err));
        return err == ENOENT ? -ENOENT : err == ELOOP ? -EINVAL : -err;
    }
    int r = 0;
    if (fstat(fd, &st) < 0) {
        r = -errno;
        nbdf_errf(why, r, "%s", strerror(-r));
    } else if (!S_ISREG(st.st_mode) || st.st_nlink != 1 ||
               st.st_uid != geteuid() || (st.st_mode & 022)) {
        nbdf_errf(why, 0, "not a regular file of ours with one link, "
                  "closed to others");
        r = -EINVAL;
    }
    CLEANUP_FREE unsigned char *buf = NULL;
    size_t len = r == 0 ? (size_t) st.st_size : 0, got = 0;
    if (r == 0 && !(buf = malloc(len ? len : 1)))
        r = -ENOMEM;
    while (r == 0 && got < len) {
        ssize_t n = read(fd, buf + got, len - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;                /* shorter than fstat said: parse it */
        got += (size_t) n;
    }
    close(fd);
    if (r == -ENOMEM)
        nbdf_errf(why, r, "out of memory");
    return r < 0 ? r : manifest_parse(m, buf, got, why);
}

/* ---- store ---------------------------------------------------------- */

static void encode_header(const struct manifest *m, unsigned char *p)
{
    memset(p, 0, HDR_LEN);
    memcpy(p, MAGIC, 8);
    put32(p + 8, VERSION);
    put32(p + 12, HDR_LEN);
    put32(p + 16, m->bs);
    put32(p + 20, (uint32_t) strlen(m->key));
    put64(p + 24, m->size);
    put64(p + 32, m->session);
    if (m->has_mtime) {
        put64(p + 40, (uint64_t) m->mtime.tv_sec);
        put32(p + 48, (uint32_t) m->mtime.tv_nsec);
        put32(p + 52, FLAG_MTIME);
    }
    memcpy(p + HDR_KEY, m->key, strlen(m->key));
    put64(p + HDR_SUM, fnv(0, p, HDR_SUM));
}

static uint64_t new_session(const struct manifest *m)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    uint64_t v[3] = { (uint64_t) t.tv_sec, (uint64_t) t.tv_nsec,
                      (uint64_t) getpid() ^ m->stores };
    return fnv(0, (const unsigned char *) v, sizeof v);
}

/* Every durable entry as records, into fd (through jbuf). */
static int write_state(struct manifest *m)
{
    uint64_t b = mf_next_known(m, 0, m->nblocks);
    while (b < m->nblocks) {
        enum mf_kind k = mf_kind_of(m, b);
        uint64_t e = b + 1;
        if (k == MF_ZERO)
            while (e < m->nblocks && mf_kind_of(m, e) == MF_ZERO)
                e++;
        if (k == MF_ZERO)
            mf_jrec(m, REC_ZERO, b, e - b, NULL);
        else if (k == MF_DATA)
            mf_jrec(m, REC_DATA, b, 1, mf_digest_slot(m, b, false));
        b = mf_next_known(m, e, m->nblocks);
        if (m->io_error)
            return m->io_error;
    }
    if (m->has_mtime)
        mf_jrec(m, REC_MTIME, (uint64_t) m->mtime.tv_sec, (uint64_t)
             m->mtime.tv_nsec, NULL);
    return mf_jflush(m);
}

int mf_store_locked(struct manifest *m, int dirfd, const char *name)
{
    char tmp[80], nm[sizeof m->name];
    unsigned char h[HDR_LEN];

    if (strlen(name) >= sizeof nm)
        return -ENAMETOOLONG;
    snprintf(nm, sizeof nm, "%s", name);      /* name may be m->name */
    snprintf(tmp, sizeof tmp, "%s.tmp", nm);
    mf_sync_locked(m);               /* the old journal complete, if any */
    unlinkat(dirfd, tmp, 0);      /* a left-over, or a planted link */
    int fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_APPEND |
                    O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    fchmod(fd, 0600);             /* whatever the umask took */
    /* The old journal stays the file until the rename: a failure here
     * leaves it as it was, still appended to. */
    int old_fd = m->jfd;
    uint64_t old_session = m->session, old_records = m->records;
    m->stores++;
    m->session = new_session(m);
    encode_header(m, h);
    m->jfd = fd;
    m->storing = true;
    m->io_error = 0;
    int r = write_all(fd, h, HDR_LEN);
    if (r == 0)
        r = write_state(m);
    m->storing = false;
    if (r == 0 && fsync(fd) < 0)
        r = -errno;
    if (r == 0 && renameat(dirfd, tmp, dirfd, nm) < 0)
        r = -errno;
    if (r == 0 && fsync(dirfd) < 0)
        r = -errno;
    if (r < 0) {
        close(fd);
        unlinkat(dirfd, tmp, 0);
        m->jfd = old_fd;
        m->jlen = 0;
        m->session = old_session;
        m->records = old_records;
        m->io_error = r;
        return r;
    }
    if (old_fd >= 0)
        close(old_fd);
    m->unsynced = false;
    m->records = 0;
    if (m->dirfd != dirfd) {
        if (m->dirfd >= 0)
            close(m->dirfd);
        m->dirfd = fcntl(dirfd, F_DUPFD_CLOEXEC, 0);
    }
    snprintf(m->name, sizeof m->name, "%s", nm);
    return 0;
}

int manifest_store(struct manifest *m, int dirfd, const char *name)
{
    LOCK_FOR_SCOPE(&m->lock);
    return mf_store_locked(m, dirfd, name);
}

int manifest_file_name(const char *key, char *out, size_t n)
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned len = 0;

    if (n < 48 || EVP_Digest(key, strlen(key), md, &len, EVP_sha256(),
                             NULL) != 1)
        return -EINVAL;
    for (unsigned i = 0; i < 16; i++)
        snprintf(out + 2 * i, 3, "%02x", md[i]);
    snprintf(out + 32, n - 32, ".manifest");
    return 0;
}
