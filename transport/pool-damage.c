/* transport/pool-damage.c: the bottom layer: failure records, the
 * damage set (see "DAMAGE" in struct pool) and the one update of the
 * zero maps that the layers below the zeroing need (a range made
 * pending).  Nothing here sends, waits or drops the lock.
 *
 * THREAD MODEL
 * Everything runs under pool->lock, on whichever thread records a
 * result: nbdx I/O threads (req_done()), the threads that write, zero,
 * flush or drain.
 */
#include "transport/pool-internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "common/minmax.h"

/* ---- failures -------------------------------------------------------- */

const char *pool_kind_name(enum pool_counter_kind k)
{
    static const char *const names[] = {
        [POOL_WRITE] = "write", [POOL_ZERO] = "zero",
        [POOL_FLUSH] = "flush", [POOL_READ] = "read",
    };
    assert((unsigned) k < sizeof names / sizeof names[0]);
    return names[k];
}

/* ---- damage ---------------------------------------------------------- */

/* Add [start, end) to a bounded set.  Past its bound the set becomes one
 * range covering all it held and the new one: more damage, never less.
 * Only a failed allocation of that one range loses the set, and then all
 * of the disk counts as damaged. */
void pool_set_add_cover_locked(struct pool *p, struct extmap *m,
                               uint64_t start, uint64_t end)
{
    struct ext e;
    uint64_t lo = start, hi = end;

    if (start >= end || extmap_add(m, start, end) == 0)
        return;
    for (uint64_t pos = 0; extmap_next(m, pos, &e); pos = e.end) {
        lo = MIN(lo, e.start);
        hi = MAX(hi, e.end);
    }
    extmap_remove(m, 0, UINT64_MAX);          /* no split: cannot fail */
    if (extmap_add(m, lo, hi) < 0) {
        if (!p->damage_everything)
            log_err("out of memory: every byte of the disk now counts as "
                    "possibly wrong");
        p->damage_everything = true;
        p->damage_err = EIO;
    }
}

bool pool_damaged_locked(const struct pool *p)
{
    return p->damage_everything || p->flush_failed ||
           extmap_count(&p->damage) > 0;
}

/* Mark the failures no damage covers any more as repaired. */
void pool_mark_repaired_locked(struct pool *p, uint64_t off, uint64_t len,
                               bool flush)
{
    for (unsigned i = 0; i < p->nfailures; i++) {
        struct pool_failure *f = &p->failures[i];
        if (f->repaired || (f->kind == POOL_FLUSH) != flush)
            continue;
        if (!flush && (!pool_overlaps(f->off, f->len, off, len) ||
                       extmap_covered(&p->damage, f->off, f->off + f->len)))
            continue;
        f->repaired = true;
        f->repaired_s = time(NULL);
        p->repairs++;
        log_info("%s of %" PRIu64 " bytes at offset %" PRIu64 " repaired",
                 f->lost ? "lost write" : pool_kind_name(f->kind), f->len,
                 f->off);
    }
}

/* A write or zero over [off, off+len) succeeded: what it covers is
 * repaired (it is the last request made there: invariant 2). */
void pool_damage_clear_locked(struct pool *p, uint64_t off, uint64_t len)
{
    if (extmap_covered(&p->damage, off, off + len) == 0)
        return;
    if (extmap_remove(&p->damage, off, off + len) < 0)
        return;                   /* a split past the bound: stays damaged */
    pool_mark_repaired_locked(p, off, len, false);
}

void pool_note_failure_locked(struct pool *p, enum pool_counter_kind kind,
                              uint64_t off, uint64_t len, int err, bool lost)
{
    p->err_seq++;
    p->last_err = err;
    p->st.errors++;
    if (lost)
        p->st.errors_lost++;
    if (p->nfailures < MAX_FAILURES)
        p->failures[p->nfailures++] = (struct pool_failure){
            .seq = p->err_seq, .off = off, .len = len, .err = err,
            .kind = kind, .lost = lost, .time_s = time(NULL) };
    p->damage_err = err;
    if (kind == POOL_FLUSH)
        p->flush_failed = true;
    else if (kind != POOL_READ)
        pool_set_add_cover_locked(p, &p->damage, off, off + len);
}

void pool_record_failure_locked(struct pool *p, enum pool_counter_kind kind,
                                uint64_t off, uint64_t len, int err)
{
    pool_note_failure_locked(p, kind, off, len, err, false);
    if (pool_conn_lost_err(err))
        p->lost = true;               /* reconnecting failed: latch it */
    log_err("%s of %" PRIu64 " bytes at offset %" PRIu64 " failed: %s",
            pool_kind_name(kind), len, off, strerror(err));
}

/* ---- freeing requests ------------------------------------------------ */

/* Free a request that is in no list; a held buffer waits for its last
 * pool_hold_release() (invariant 3 plus: never reused while held). */
void pool_free_req_locked(struct pool *p, struct pool_req *r)
{
    if (r->holds > 0) {
        r->state = REQ_DONE;
        if (r->kind == REQ_WRITE)
            p->nheld++;
        return;
    }
    struct pool_req *parent = r->parent;
    if (r->kind == REQ_WRITE && !parent)
        p->free_bufs[p->nfree++] = r->data;
    else if (r->kind == REQ_COPY)
        free(r->data);
    free(r);
    /* A piece of a resent write: the buffer goes with the last one. */
    if (parent) {
        assert(parent->state == REQ_SPLIT && parent->pieces > 0);
        if (--parent->pieces == 0)
            pool_free_req_locked(p, parent);
    }
}

/* ---- canaries -------------------------------------------------------- */

uint64_t pool_canary_hash(const void *buf, size_t len)
{
    const unsigned char *b = buf;
    uint64_t h = 1469598103934665603ull;      /* FNV-1a */
    for (size_t i = 0; i < len; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

void pool_canary_wait_locked(struct pool *p)
{
    while (p->canary_check || p->canary_busy)
        pool_cond_wait_locked(p, "canary");
}

/* ---- pending zeroes ------------------------------------------------- */

/* Add the parts of [off, end) not known zero to pending_zero, keeping
 * the two maps disjoint.  When that would take too many ranges (known
 * zero is fragmented there), forget known zero in the range and make it
 * all pending: more zeroing at the drain, never less. */
int pool_add_pending_locked(struct pool *p, uint64_t off, uint64_t end)
{
    size_t k = extmap_count_in(&p->known_zero, off, end);

    if (extmap_count(&p->pending_zero) == 0)
        p->pending_gen0 = p->next_seq;    /* this change's generation */
    for (unsigned i = 0; i < NCANARIES; i++)
        if (p->canaries[i].valid &&
            pool_overlaps(p->canaries[i].off, CANARY_LEN, off, end - off))
            p->canaries[i].valid = false; /* changed since its flush */

    if (extmap_count(&p->pending_zero) + k + 2 > p->map_max) {
        extmap_remove(&p->known_zero, off, end);  /* lossy: cannot fail */
        return extmap_add(&p->pending_zero, off, end);
    }
    uint64_t pos = off;
    struct ext z;
    while (pos < end) {
        uint64_t stop = end;
        if (extmap_next(&p->known_zero, pos, &z) && z.start < end)
            stop = z.start > pos ? z.start : pos;
        int r = extmap_add(&p->pending_zero, pos, stop);
        if (r < 0)
            return r;
        if (stop == end)
            break;
        pos = z.end < end ? z.end : end;
    }
    return 0;
}
