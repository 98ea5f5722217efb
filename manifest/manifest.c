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

/* ---- pending changes ------------------------------------------------ */

static size_t hslot(const struct manifest *m, uint64_t b)
{
    uint64_t h = (b + 1) * 0x9e3779b97f4a7c15ull;
    return (size_t) (h >> 20) & (m->hcap - 1);
}

static void hindex(struct manifest *m, size_t i)
{
    size_t s = hslot(m, m->pend.ptr[i].b);
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
    for (size_t i = 0; i < m->pend.len; i++)
        hindex(m, i);
    return 0;
}

static struct pend *pend_find(struct manifest *m, uint64_t b)
{
    if (!(m->st[b] & ST_PENDING))
        return NULL;
    for (size_t s = hslot(m, b); m->hidx[s]; s = (s + 1) & (m->hcap - 1))
        if (m->pend.ptr[m->hidx[s] - 1].b == b)
            return &m->pend.ptr[m->hidx[s] - 1];
    abort();                      /* ST_PENDING without an entry */
}

/* A new pending entry for b (not pending yet); NULL: out of memory. */
static struct pend *pend_add(struct manifest *m, uint64_t b)
{
    /* hidx holds index + 1 in 32 bits: at most 2^31 entries (the
     * capacity, doubling from 1024, stays below 2^32). */
    if (m->pend.len > UINT32_MAX / 2 || pend_vector_reserve(&m->pend, 1) < 0)
        return NULL;
    if (2 * (m->pend.len + 1) >= m->hcap &&
        hrebuild(m, m->hcap ? 2 * m->hcap : 4096) < 0)
        return NULL;
    struct pend *p = &m->pend.ptr[m->pend.len++];
    p->b = b;
    hindex(m, m->pend.len - 1);
    m->st[b] |= ST_PENDING;
    return p;
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
        mf_sync_locked(m);
    mf_close_journal(m);
    if (m->dirfd >= 0)
        close(m->dirfd);
    for (uint64_t i = 0; m->chunk && i <= m->nblocks / CHUNK_BLOCKS; i++)
        free(m->chunk[i]);
    free(m->chunk);
    free(m->st);
    pend_vector_reset(&m->pend);
    free(m->hidx);
    free(m);
}

/* ---- changes -------------------------------------------------------- */

enum mf_kind manifest_lookup(struct manifest *m, uint64_t b,
                             unsigned char *digest)
{
    LOCK_FOR_SCOPE(&m->lock);
    if (b >= m->nblocks || (m->st[b] & ST_PENDING))
        return MF_NONE;
    enum mf_kind k = mf_kind_of(m, b);
    if (k == MF_DATA)
        memcpy(digest, mf_digest_slot(m, b, false), MF_DIGEST);
    return k;
}

bool manifest_all_unknown(struct manifest *m, uint64_t b0, uint64_t b1)
{
    LOCK_FOR_SCOPE(&m->lock);
    for (uint64_t b = b0; b < b1 && b < m->nblocks; b++)
        if (mf_kind_of(m, b) != MF_NONE)
            return false;
    return true;
}

static void forget_locked(struct manifest *m, uint64_t b)
{
    if (mf_kind_of(m, b) == MF_NONE)
        return;
    mf_set_durable(m, b, MF_NONE, NULL);
    mf_jrec(m, REC_FORGET, b, 1, NULL);
}

/* The block's pending change, or NULL (out of memory: it stays
 * unknown). */
static struct pend *change_locked(struct manifest *m, uint64_t b,
                                  enum mf_kind kind,
                                  const unsigned char *digest, uint64_t gen)
{
    forget_locked(m, b);
    if (m->st[b] & ST_CUT) {
        m->st[b] &= (uint8_t) ~ST_CUT;
        m->ncut--;
    }
    struct pend *p = pend_find(m, b);
    if (!p && !(p = pend_add(m, b)))
        return NULL;
    p->kind = (uint8_t) kind;
    p->later = false;
    p->gen = gen;
    p->seq = ++m->changes;
    if (kind == MF_DATA)
        memcpy(p->d, digest, MF_DIGEST);
    return p;
}

uint64_t manifest_change_later(struct manifest *m, uint64_t b, uint64_t gen)
{
    LOCK_FOR_SCOPE(&m->lock);
    struct pend *p = b < m->nblocks ? change_locked(m, b, MF_NONE, NULL, gen)
                                    : NULL;
    if (!p)
        return 0;                 /* unknown, nothing to resolve */
    p->later = true;
    return p->seq;
}

size_t manifest_unknown_changes(struct manifest *m, uint64_t gen,
                                uint64_t *b, uint64_t *seq, size_t n)
{
    LOCK_FOR_SCOPE(&m->lock);
    size_t k = 0;
    for (size_t i = 0; i < m->pend.len && k < n; i++) {
        const struct pend *p = &m->pend.ptr[i];
        if (p->kind != MF_NONE || p->later || p->gen == GEN_UNSET ||
            p->gen > gen)
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
    p->later = false;
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
    return mf_sync_locked(m);
}

void manifest_durable(struct manifest *m, uint64_t gen)
{
    LOCK_FOR_SCOPE(&m->lock);
    size_t keep = 0, unresolved = 0;
    if (gen > m->durable)
        m->durable = gen;
    gen = m->durable;             /* durable is for good: a call with an
                                   * older gen promotes what resolved */
    for (size_t i = 0; i < m->pend.len; i++) {
        struct pend *p = &m->pend.ptr[i];
        /* A block written in part stays a change to resolve (read back
         * after this very flush: manifest_resolve()), up to a bound;
         * past it, it is simply unknown.  One whose digest is being
         * made stays until it comes (bounded by the writes in flight). */
        if (p->gen == GEN_UNSET || p->gen > gen || p->later ||
            (p->kind == MF_NONE && unresolved++ < MF_UNRESOLVED_KEPT)) {
            m->pend.ptr[keep++] = *p;
            continue;
        }
        m->st[p->b] &= (uint8_t) ~ST_PENDING;
        mf_set_durable(m, p->b, (enum mf_kind) p->kind, p->d);
        enum mf_kind k = mf_kind_of(m, p->b);
        if (k != MF_NONE)
            mf_jrec(m, k == MF_ZERO ? REC_ZERO : REC_DATA, p->b, 1,
                 k == MF_DATA ? p->d : NULL);
    }
    if (keep != m->pend.len) {
        m->pend.len = keep;
        memset(m->hidx, 0, m->hcap * sizeof *m->hidx);
        for (size_t i = 0; i < m->pend.len; i++)
            hindex(m, i);
    }
    mf_promoted_locked(m);
    /* Compaction: the journal holds many more records than the state. */
    if (m->jfd >= 0 && m->records > COMPACT_MIN &&
        m->records > 2 * (m->ndata + m->nzero / 64))
        mf_store_locked(m, m->dirfd, m->name);
}

void manifest_cut(struct manifest *m, uint64_t b0, uint64_t b1)
{
    LOCK_FOR_SCOPE(&m->lock);
    uint64_t end = b1 < m->nblocks ? b1 : m->nblocks;
    for (uint64_t b = mf_next_known(m, b0, end); b < end;
         b = mf_next_known(m, b + 1, end))
        if ((m->st[b] & (ST_KIND | ST_PENDING)) && !(m->st[b] & ST_CUT)) {
            m->st[b] |= ST_CUT;
            m->ncut++;
        }
}

void manifest_change_zero(struct manifest *m, uint64_t b0, uint64_t b1,
                          uint64_t gen)
{
    LOCK_FOR_SCOPE(&m->lock);
    uint64_t end = b1 < m->nblocks ? b1 : m->nblocks;
    for (uint64_t b = b0; b < end; b++) {
        if (!m->st[b] && m->pend.len >= MF_LEARN_PENDING) {
            b = mf_next_known(m, b, end);   /* nothing to learn past the bound */
            if (b == end)
                break;
        }
        uint8_t st = m->st[b];
        if ((st & ST_KIND) == MF_ZERO && !(st & ST_PENDING))
            continue;                    /* zero stays zero */
        change_locked(m, b, MF_ZERO, NULL, gen);
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
    for (uint64_t b = mf_next_known(m, 0, m->nblocks); m->ncut && b < m->nblocks;
         b = mf_next_known(m, b + 1, m->nblocks)) {
        if (!(m->st[b] & ST_CUT))
            continue;
        if (mf_kind_of(m, b) == MF_ZERO) {   /* zeroing it changes nothing */
            m->st[b] &= (uint8_t) ~ST_CUT;
            m->ncut--;
            continue;
        }
        change_locked(m, b, MF_ZERO, NULL, GEN_UNSET);
        n++;
    }
    mf_sync_locked(m);
    return n;
}

void manifest_settle_gen(struct manifest *m, uint64_t gen)
{
    LOCK_FOR_SCOPE(&m->lock);
    for (size_t i = 0; i < m->pend.len; i++)
        if (m->pend.ptr[i].gen == GEN_UNSET)
            m->pend.ptr[i].gen = gen;
}

void manifest_forget_all(struct manifest *m)
{
    LOCK_FOR_SCOPE(&m->lock);
    if (m->ndata + m->nzero)
        mf_jrec(m, REC_FORGET, 0, m->nblocks, NULL);
    bool mt = m->has_mtime;
    mf_clear_locked(m);              /* pending changes and cuts too */
    m->has_mtime = mt;
    mf_sync_locked(m);
}

/* ---- queries -------------------------------------------------------- */

size_t manifest_sample_data(struct manifest *m, uint64_t seed, uint64_t *out,
                            size_t n)
{
    LOCK_FOR_SCOPE(&m->lock);
    uint64_t seen = 0, x = seed | 1;
    for (uint64_t b = 0; b < m->nblocks && n; b++) {
        if (mf_kind_of(m, b) != MF_DATA)
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
    while (b < m->nblocks && (mf_kind_of(m, b) != kind ||
                              (m->st[b] & ST_PENDING)))
        b++;
    if (b >= m->nblocks)
        return false;
    *b0 = b;
    while (b < m->nblocks && mf_kind_of(m, b) == kind &&
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
    mf_jrec(m, REC_MTIME, (uint64_t) t->tv_sec, (uint64_t) t->tv_nsec, NULL);
}

void manifest_forget_mtime(struct manifest *m)
{
    LOCK_FOR_SCOPE(&m->lock);
    m->has_mtime = false;
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
    for (size_t i = 0; i < m->pend.len; i++)
        pending += !(m->pend.ptr[i].kind == MF_NONE &&
                     m->pend.ptr[i].gen != GEN_UNSET &&
                     m->pend.ptr[i].gen <= m->durable);
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
