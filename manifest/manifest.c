/* manifest/manifest.c: the block table, its pending changes and its
 * file (manifest/manifest.h).
 *
 * INVARIANTS
 * 1. A block with a pending change (ST_PENDING) has durable kind MF_NONE:
 *    the change forgot the entry (a FORGET record) before it was sent.
 * 2. Each block has at most one pending entry, the latest change's, with
 *    the generation of that change: so an entry is promoted only once the
 *    block's last change is durable.
 * 3. The file holds, after its header, records whose replay gives the
 *    durable state as of the last manifest_sync()/manifest_durable(); the
 *    records of jbuf are not yet in it.
 */
#include "manifest/manifest.h"

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

#define MAGIC "NBDFMANI"
#define VERSION 1
#define HDR_LEN 1088
#define HDR_KEY 56
#define HDR_SUM 1080
#define REC_LEN 64
#define REC_SUM 56
#define FLAG_MTIME 1u

enum rec_type { REC_DATA = 1, REC_ZERO = 2, REC_FORGET = 3, REC_MTIME = 4 };

/* Per block: the durable kind in the low bits, and flags. */
#define ST_KIND 3u
#define ST_PENDING 4u
#define ST_CUT 8u

#define CHUNK_BLOCKS 1024u        /* digests per chunk (32 KiB) */
#define GEN_UNSET UINT64_MAX      /* a settled cut, before its drain */
#define JBUF_RECS 256             /* records buffered before a write */
#define COMPACT_MIN 65536u        /* records appended before compaction */

struct pend {
    uint64_t b, gen;
    uint64_t seq;                 /* the change's number (m->changes) */
    uint8_t kind;
    unsigned char d[MF_DIGEST];
};

struct manifest {
    pthread_mutex_t lock;
    char key[MF_KEY_MAX];
    uint64_t size, nblocks;
    uint32_t bs;
    uint8_t *st;
    unsigned char **chunk;        /* nblocks / CHUNK_BLOCKS, rounded up */
    uint64_t ndata, nzero, ncut;
    uint64_t changes;             /* manifest_change() calls: seq */
    uint64_t durable;             /* the last manifest_durable() gen */
    struct pend *pend;            /* pending changes, unordered */
    size_t npend, cappend;
    uint32_t *hidx;               /* open addressing: pend index + 1 */
    size_t hcap;                  /* power of two, > 2 * npend */
    unsigned char zero_digest[MF_DIGEST];
    struct timespec mtime;
    bool has_mtime;
    /* The file. */
    int jfd, dirfd;               /* -1: no journal */
    char name[64];
    uint64_t session, records, stores;
    unsigned char jbuf[JBUF_RECS * REC_LEN];
    size_t jlen;
    bool unsynced;                /* records written, not fdatasync'd */
    bool storing;                 /* store_locked() writes m->jfd */
    uint64_t synced_ns;           /* the last fdatasync, CLOCK_MONOTONIC */
    int io_error;
};

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

/* ---- the block table ------------------------------------------------ */

static unsigned char *digest_slot(struct manifest *m, uint64_t b, bool make)
{
    unsigned char **c = &m->chunk[b / CHUNK_BLOCKS];
    if (!*c && make)
        *c = malloc((size_t) CHUNK_BLOCKS * MF_DIGEST);
    return *c ? *c + (b % CHUNK_BLOCKS) * MF_DIGEST : NULL;
}

static enum mf_kind kind_of(const struct manifest *m, uint64_t b)
{
    return (enum mf_kind) (m->st[b] & ST_KIND);
}

/* Set the durable entry of b.  A digest of zero bytes is MF_ZERO; a
 * digest without memory for it is forgotten (MF_NONE: never wrong). */
static void set_durable(struct manifest *m, uint64_t b, enum mf_kind k,
                        const unsigned char *d)
{
    if (k == MF_DATA && memcmp(d, m->zero_digest, MF_DIGEST) == 0)
        k = MF_ZERO;
    unsigned char *slot = k == MF_DATA ? digest_slot(m, b, true) : NULL;
    if (k == MF_DATA && !slot)
        k = MF_NONE;
    enum mf_kind old = kind_of(m, b);
    m->ndata -= old == MF_DATA;
    m->nzero -= old == MF_ZERO;
    m->ndata += k == MF_DATA;
    m->nzero += k == MF_ZERO;
    m->st[b] = (uint8_t) ((m->st[b] & ~ST_KIND) | k);
    if (slot)
        memcpy(slot, d, MF_DIGEST);
}

/* ---- pending changes ------------------------------------------------ */

static size_t hslot(const struct manifest *m, uint64_t b)
{
    uint64_t h = (b + 1) * 0x9e3779b97f4a7c15ull;
    return (size_t) (h >> 20) & (m->hcap - 1);
}

static void hindex(struct manifest *m, size_t i)
{
    size_t s = hslot(m, m->pend[i].b);
    while (m->hidx[s])
        s = (s + 1) & (m->hcap - 1);
    m->hidx[s] = (uint32_t) (i + 1);
}

static int hrebuild(struct manifest *m, size_t cap)
{
    uint32_t *h = calloc(cap, sizeof *h);
    if (!h)
        return -ENOMEM;
    free(m->hidx);
    m->hidx = h;
    m->hcap = cap;
    for (size_t i = 0; i < m->npend; i++)
        hindex(m, i);
    return 0;
}

static struct pend *pend_find(struct manifest *m, uint64_t b)
{
    if (!(m->st[b] & ST_PENDING))
        return NULL;
    for (size_t s = hslot(m, b); m->hidx[s]; s = (s + 1) & (m->hcap - 1))
        if (m->pend[m->hidx[s] - 1].b == b)
            return &m->pend[m->hidx[s] - 1];
    abort();                      /* ST_PENDING without an entry */
}

/* A new pending entry for b (not pending yet); NULL: out of memory. */
static struct pend *pend_add(struct manifest *m, uint64_t b)
{
    if (m->npend == m->cappend) {
        size_t n = m->cappend ? 2 * m->cappend : 1024;
        struct pend *p = realloc(m->pend, n * sizeof *p);
        if (!p || n >= UINT32_MAX)
            return NULL;
        m->pend = p;
        m->cappend = n;
    }
    if (2 * (m->npend + 1) >= m->hcap &&
        hrebuild(m, m->hcap ? 2 * m->hcap : 4096) < 0)
        return NULL;
    struct pend *p = &m->pend[m->npend++];
    p->b = b;
    hindex(m, m->npend - 1);
    m->st[b] |= ST_PENDING;
    return p;
}

/* ---- the journal ---------------------------------------------------- */

static void close_journal(struct manifest *m)
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
    close_journal(m);
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

static int jflush(struct manifest *m)
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

static void jrec(struct manifest *m, enum rec_type t, uint64_t b,
                 uint64_t count, const unsigned char *d)
{
    if (m->jfd < 0)
        return;
    if (m->jlen + REC_LEN > sizeof m->jbuf && jflush(m) < 0)
        return;
    encode_rec(m, m->jbuf + m->jlen, t, b, count, d);
    m->jlen += REC_LEN;
    m->records++;
}

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t) t.tv_sec * 1000000000u + (uint64_t) t.tv_nsec;
}

static int sync_locked(struct manifest *m)
{
    int r = jflush(m);
    if (r == 0 && m->jfd >= 0 && m->unsynced) {
        if (fdatasync(m->jfd) < 0)
            return journal_failed(m, -errno);
        m->unsynced = false;
        m->synced_ns = now_ns();
    }
    return r;
}

/* Promotions need not be on stable storage at once (a record lost to a
 * power cut is a block sent again): written now, synced at most every
 * PROMOTE_SYNC_NS (a writer flushing every write, dd oflag=dsync, does
 * not pay an fdatasync of the journal per write). */
#define PROMOTE_SYNC_NS (5ull * 1000000000u)

static void promoted_locked(struct manifest *m)
{
    if (jflush(m) == 0 && m->unsynced &&
        now_ns() - m->synced_ns >= PROMOTE_SYNC_NS)
        sync_locked(m);
}

/* ---- create, parse -------------------------------------------------- */

int manifest_create(const struct manifest_id *id, struct manifest **out)
{
    if (!id->block_size || strlen(id->key) >= MF_KEY_MAX)
        return -EINVAL;
    struct manifest *m = calloc(1, sizeof *m);
    if (!m)
        return -ENOMEM;
    snprintf(m->key, sizeof m->key, "%s", id->key);
    m->size = id->size;
    m->bs = id->block_size;
    m->nblocks = (id->size + id->block_size - 1) / id->block_size;
    m->st = calloc(m->nblocks ? m->nblocks : 1, 1);
    m->chunk = calloc(m->nblocks / CHUNK_BLOCKS + 1, sizeof *m->chunk);
    unsigned char *z = calloc(1, id->block_size);
    unsigned len = 0;
    if (!m->st || !m->chunk || !z ||
        EVP_Digest(z, id->block_size, m->zero_digest, &len, EVP_sha256(),
                   NULL) != 1) {
        free(z);
        m->jfd = m->dirfd = -1;
        manifest_free(m);
        return -ENOMEM;
    }
    free(z);
    pthread_mutex_init(&m->lock, NULL);
    m->jfd = m->dirfd = -1;
    *out = m;
    return 0;
}

void manifest_free(struct manifest *m)
{
    if (!m)
        return;
    if (m->jfd >= 0)
        sync_locked(m);
    close_journal(m);
    if (m->dirfd >= 0)
        close(m->dirfd);
    for (uint64_t i = 0; m->chunk && i <= m->nblocks / CHUNK_BLOCKS; i++)
        free(m->chunk[i]);
    free(m->chunk);
    free(m->st);
    free(m->pend);
    free(m->hidx);
    free(m);
}

static void clear_locked(struct manifest *m)
{
    memset(m->st, 0, m->nblocks ? m->nblocks : 1);
    m->ndata = m->nzero = m->ncut = 0;
    m->npend = 0;
    if (m->hidx)
        memset(m->hidx, 0, m->hcap * sizeof *m->hidx);
    m->has_mtime = false;
}

static int refuse(struct manifest *m, char *why, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int refuse(struct manifest *m, char *why, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, MF_WHY_MAX, fmt, ap);
    va_end(ap);
    clear_locked(m);
    return -EINVAL;
}

static int parse_header(struct manifest *m, const unsigned char *p,
                        size_t len, char *why)
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
                     char *why)
{
    uint32_t t = get32(p);
    uint64_t b = get64(p + 8), n = get64(p + 16);

    switch (t) {
    case REC_DATA:
        if (!in_range(m, b, 1))
            break;
        set_durable(m, b, MF_DATA, p + 24);
        return 0;
    case REC_ZERO:
    case REC_FORGET:
        if (!n || !in_range(m, b, n))
            break;
        for (uint64_t j = b; j < b + n; j++)
            set_durable(m, j, t == REC_ZERO ? MF_ZERO : MF_NONE, NULL);
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

int manifest_parse(struct manifest *m, const void *buf, size_t len, char *why)
{
    const unsigned char *p = buf;
    LOCK_FOR_SCOPE(&m->lock);
    assert(!m->ndata && !m->nzero && !m->npend);
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

int manifest_load(struct manifest *m, int dirfd, const char *name, char *why)
{
    struct stat st;
    int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC |
                    O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        int err = errno;
        if (err == ELOOP || err == EMLINK)
            snprintf(why, MF_WHY_MAX, "a symbolic link (never followed)");
        else
            snprintf(why, MF_WHY_MAX, "%s", strerror(err));
        return err == ENOENT ? -ENOENT : err == ELOOP ? -EINVAL : -err;
    }
    int r = 0;
    if (fstat(fd, &st) < 0) {
        r = -errno;
        snprintf(why, MF_WHY_MAX, "%s", strerror(-r));
    } else if (!S_ISREG(st.st_mode) || st.st_nlink != 1 ||
               st.st_uid != geteuid() || (st.st_mode & 022)) {
        snprintf(why, MF_WHY_MAX, "not a regular file of ours with one "
                 "link, closed to others");
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
        snprintf(why, MF_WHY_MAX, "out of memory");
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
    uint64_t b = 0;
    while (b < m->nblocks) {
        enum mf_kind k = kind_of(m, b);
        uint64_t e = b + 1;
        if (k == MF_ZERO)
            while (e < m->nblocks && kind_of(m, e) == MF_ZERO)
                e++;
        if (k == MF_ZERO)
            jrec(m, REC_ZERO, b, e - b, NULL);
        else if (k == MF_DATA)
            jrec(m, REC_DATA, b, 1, digest_slot(m, b, false));
        b = e;
        if (m->io_error)
            return m->io_error;
    }
    if (m->has_mtime)
        jrec(m, REC_MTIME, (uint64_t) m->mtime.tv_sec, (uint64_t)
             m->mtime.tv_nsec, NULL);
    return jflush(m);
}

static int store_locked(struct manifest *m, int dirfd, const char *name)
{
    char tmp[80], nm[sizeof m->name];
    unsigned char h[HDR_LEN];

    if (strlen(name) >= sizeof nm)
        return -ENAMETOOLONG;
    snprintf(nm, sizeof nm, "%s", name);      /* name may be m->name */
    snprintf(tmp, sizeof tmp, "%s.tmp", nm);
    sync_locked(m);               /* the old journal complete, if any */
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
    return store_locked(m, dirfd, name);
}

/* ---- changes -------------------------------------------------------- */

enum mf_kind manifest_lookup(struct manifest *m, uint64_t b,
                             unsigned char *digest)
{
    LOCK_FOR_SCOPE(&m->lock);
    if (b >= m->nblocks || (m->st[b] & ST_PENDING))
        return MF_NONE;
    enum mf_kind k = kind_of(m, b);
    if (k == MF_DATA)
        memcpy(digest, digest_slot(m, b, false), MF_DIGEST);
    return k;
}

bool manifest_all_unknown(struct manifest *m, uint64_t b0, uint64_t b1)
{
    LOCK_FOR_SCOPE(&m->lock);
    for (uint64_t b = b0; b < b1 && b < m->nblocks; b++)
        if (kind_of(m, b) != MF_NONE)
            return false;
    return true;
}

static void forget_locked(struct manifest *m, uint64_t b)
{
    if (kind_of(m, b) == MF_NONE)
        return;
    set_durable(m, b, MF_NONE, NULL);
    jrec(m, REC_FORGET, b, 1, NULL);
}

static void change_locked(struct manifest *m, uint64_t b, enum mf_kind kind,
                          const unsigned char *digest, uint64_t gen)
{
    forget_locked(m, b);
    if (m->st[b] & ST_CUT) {
        m->st[b] &= (uint8_t) ~ST_CUT;
        m->ncut--;
    }
    struct pend *p = pend_find(m, b);
    if (!p && !(p = pend_add(m, b)))
        return;                   /* out of memory: the block stays unknown */
    p->kind = (uint8_t) kind;
    p->gen = gen;
    p->seq = ++m->changes;
    if (kind == MF_DATA)
        memcpy(p->d, digest, MF_DIGEST);
}

size_t manifest_unknown_changes(struct manifest *m, uint64_t gen,
                                uint64_t *b, uint64_t *seq, size_t n)
{
    LOCK_FOR_SCOPE(&m->lock);
    size_t k = 0;
    for (size_t i = 0; i < m->npend && k < n; i++) {
        const struct pend *p = &m->pend[i];
        if (p->kind != MF_NONE || p->gen == GEN_UNSET || p->gen > gen)
            continue;
        b[k] = p->b;
        seq[k++] = p->seq;
    }
    return k;
}

bool manifest_resolve(struct manifest *m, uint64_t b, uint64_t seq,
                      enum mf_kind kind, const unsigned char *digest,
                      uint64_t gen)
{
    LOCK_FOR_SCOPE(&m->lock);
    struct pend *p = b < m->nblocks ? pend_find(m, b) : NULL;
    if (!p || p->seq != seq || p->kind != MF_NONE)
        return false;
    p->kind = (uint8_t) kind;
    p->gen = gen;
    if (kind == MF_DATA)
        memcpy(p->d, digest, MF_DIGEST);
    return true;
}

void manifest_change(struct manifest *m, uint64_t b, enum mf_kind kind,
                     const unsigned char *digest, uint64_t gen)
{
    LOCK_FOR_SCOPE(&m->lock);
    if (b < m->nblocks)
        change_locked(m, b, kind, digest, gen);
}

int manifest_sync(struct manifest *m)
{
    LOCK_FOR_SCOPE(&m->lock);
    return sync_locked(m);
}

void manifest_durable(struct manifest *m, uint64_t gen)
{
    LOCK_FOR_SCOPE(&m->lock);
    size_t keep = 0, unresolved = 0;
    if (gen > m->durable)
        m->durable = gen;
    for (size_t i = 0; i < m->npend; i++) {
        struct pend *p = &m->pend[i];
        /* A block written in part stays a change to resolve (read back
         * after this very flush: manifest_resolve()), up to a bound;
         * past it, it is simply unknown. */
        if (p->gen == GEN_UNSET || p->gen > gen ||
            (p->kind == MF_NONE && unresolved++ < MF_UNRESOLVED_KEPT)) {
            m->pend[keep++] = *p;
            continue;
        }
        m->st[p->b] &= (uint8_t) ~ST_PENDING;
        set_durable(m, p->b, (enum mf_kind) p->kind, p->d);
        enum mf_kind k = kind_of(m, p->b);
        if (k != MF_NONE)
            jrec(m, k == MF_ZERO ? REC_ZERO : REC_DATA, p->b, 1,
                 k == MF_DATA ? p->d : NULL);
    }
    if (keep != m->npend) {
        m->npend = keep;
        memset(m->hidx, 0, m->hcap * sizeof *m->hidx);
        for (size_t i = 0; i < m->npend; i++)
            hindex(m, i);
    }
    promoted_locked(m);
    /* Compaction: the journal holds many more records than the state. */
    if (m->jfd >= 0 && m->records > COMPACT_MIN &&
        m->records > 2 * (m->ndata + m->nzero / 64))
        store_locked(m, m->dirfd, m->name);
}

void manifest_cut(struct manifest *m, uint64_t b0, uint64_t b1)
{
    LOCK_FOR_SCOPE(&m->lock);
    for (uint64_t b = b0; b < b1 && b < m->nblocks; b++)
        if (!(m->st[b] & ST_CUT)) {
            m->st[b] |= ST_CUT;
            m->ncut++;
        }
}

bool manifest_is_cut(struct manifest *m, uint64_t b)
{
    LOCK_FOR_SCOPE(&m->lock);
    return b < m->nblocks && (m->st[b] & ST_CUT);
}

void manifest_uncut(struct manifest *m, uint64_t b0, uint64_t b1)
{
    LOCK_FOR_SCOPE(&m->lock);
    for (uint64_t b = b0; b < b1 && b < m->nblocks; b++)
        if (m->st[b] & ST_CUT) {
            m->st[b] &= (uint8_t) ~ST_CUT;
            m->ncut--;
        }
}

uint64_t manifest_settle_cuts(struct manifest *m)
{
    LOCK_FOR_SCOPE(&m->lock);
    uint64_t n = 0;
    for (uint64_t b = 0; m->ncut && b < m->nblocks; b++) {
        if (!(m->st[b] & ST_CUT))
            continue;
        if (kind_of(m, b) == MF_ZERO) {   /* zeroing it changes nothing */
            m->st[b] &= (uint8_t) ~ST_CUT;
            m->ncut--;
            continue;
        }
        change_locked(m, b, MF_ZERO, NULL, GEN_UNSET);
        n++;
    }
    sync_locked(m);
    return n;
}

void manifest_settle_gen(struct manifest *m, uint64_t gen)
{
    LOCK_FOR_SCOPE(&m->lock);
    for (size_t i = 0; i < m->npend; i++)
        if (m->pend[i].gen == GEN_UNSET)
            m->pend[i].gen = gen;
}

void manifest_forget_all(struct manifest *m)
{
    LOCK_FOR_SCOPE(&m->lock);
    if (m->ndata + m->nzero)
        jrec(m, REC_FORGET, 0, m->nblocks, NULL);
    bool mt = m->has_mtime;
    clear_locked(m);              /* pending changes and cuts too */
    m->has_mtime = mt;
    sync_locked(m);
}

/* ---- queries -------------------------------------------------------- */

size_t manifest_sample_data(struct manifest *m, uint64_t seed, uint64_t *out,
                            size_t n)
{
    LOCK_FOR_SCOPE(&m->lock);
    uint64_t seen = 0, x = seed | 1;
    for (uint64_t b = 0; b < m->nblocks && n; b++) {
        if (kind_of(m, b) != MF_DATA)
            continue;
        /* Reservoir sampling, xorshift64 as the source. */
        if (seen < n) {
            out[seen++] = b;
            continue;
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        uint64_t j = x % ++seen;
        if (j < n)
            out[j] = b;
    }
    return seen < n ? (size_t) seen : n;
}

bool manifest_next_run(struct manifest *m, enum mf_kind kind, uint64_t pos,
                       uint64_t *b0, uint64_t *b1)
{
    LOCK_FOR_SCOPE(&m->lock);
    uint64_t b = pos;
    while (b < m->nblocks && (kind_of(m, b) != kind ||
                              (m->st[b] & ST_PENDING)))
        b++;
    if (b >= m->nblocks)
        return false;
    *b0 = b;
    while (b < m->nblocks && kind_of(m, b) == kind &&
           !(m->st[b] & ST_PENDING))
        b++;
    *b1 = b;
    return true;
}

void manifest_set_mtime(struct manifest *m, const struct timespec *t)
{
    LOCK_FOR_SCOPE(&m->lock);
    m->mtime = *t;
    m->has_mtime = true;
    jrec(m, REC_MTIME, (uint64_t) t->tv_sec, (uint64_t) t->tv_nsec, NULL);
}

bool manifest_get_mtime(struct manifest *m, struct timespec *t)
{
    LOCK_FOR_SCOPE(&m->lock);
    if (m->has_mtime)
        *t = m->mtime;
    return m->has_mtime;
}

void manifest_get_stats(struct manifest *m, struct manifest_stats *out)
{
    LOCK_FOR_SCOPE(&m->lock);
    size_t pending = 0;           /* not counting parts left to resolve */
    for (size_t i = 0; i < m->npend; i++)
        pending += !(m->pend[i].kind == MF_NONE &&
                     m->pend[i].gen != GEN_UNSET &&
                     m->pend[i].gen <= m->durable);
    *out = (struct manifest_stats) {
        .blocks = m->nblocks, .data = m->ndata, .zero = m->nzero,
        .pending = pending, .cut = m->ncut, .records = m->records,
        .stores = m->stores, .io_error = m->io_error,
    };
}

const unsigned char *manifest_zero_digest(struct manifest *m)
{
    return m->zero_digest;
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
