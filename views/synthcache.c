/* views/synthcache.c: shared, bounded synthesizers of a format view
 * (views/synthcache.h). */
#include "views/synthcache.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "fs/rawfile.h"

/* What identifies a disk state: every change of its size or bytes counts
 * in rawfile_changes() and moves the pool's counters; the block status
 * scan moves known_zero.  Never the mtime: utimensat sets it, back to
 * what it was when a synthesizer was built too (fs/rawfile.c, THE
 * TIMES).  begun, quiet: the changes begun and whether none was in
 * progress (fs/rawfile.h rawfile_change_count()): a state in the middle
 * of a change is not one a reader may be given as the disk at its open. */
struct synth_key {
    uint64_t changes;
    uint64_t written, zeroed, skipped, known_zero, pending_zero;
    uint64_t begun;
    bool quiet;
};

/* refs: open handles and stats using it, plus one while it is current. */
struct synth_ref {
    void *synth;                  /* NULL: building failed with err */
    int err;
    unsigned refs;
    struct synth_key key;
    struct synth_ref *next;       /* retired list */
};

struct synthcache {
    const struct synthcache_ops *ops;
    void *opaque;
    const char *name;
    pthread_mutex_t lock;
    struct synth_ref *current;    /* the latest disk state's, or NULL */
    struct synth_ref *retired;    /* replaced, still open somewhere */
    unsigned live;                /* current + retired */
};

static void disk_key(struct fs_disk *d, struct synth_key *k)
{
    struct pool_stats st;

    pool_get_stats(d->pool, &st);
    memset(k, 0, sizeof *k);
    k->quiet = rawfile_change_count(d, &k->begun);     /* before the rest */
    k->changes = rawfile_changes(d);
    k->written = st.bytes_written;
    k->zeroed = st.bytes_zeroed;
    k->skipped = st.bytes_zero_skipped;
    k->known_zero = st.known_zero;
    k->pending_zero = st.pending_zero;
}

static bool same_key(const struct synth_key *a, const struct synth_key *b)
{
    return a->changes == b->changes && a->written == b->written &&
           a->zeroed == b->zeroed && a->skipped == b->skipped &&
           a->known_zero == b->known_zero &&
           a->pending_zero == b->pending_zero &&
           a->begun == b->begun && a->quiet == b->quiet;
}

int synthcache_new(const struct synthcache_ops *ops, void *opaque,
                   const char *name, struct synthcache **out)
{
    struct synthcache *c = calloc(1, sizeof *c);

    if (!c)
        return -ENOMEM;
    c->ops = ops;
    c->opaque = opaque;
    c->name = name;
    pthread_mutex_init(&c->lock, NULL);
    *out = c;
    return 0;
}

static void free_ref(struct synthcache *c, struct synth_ref *r)
{
    if (r->synth)
        c->ops->free(c->opaque, r->synth);
    free(r);
    c->live--;
}

void synthcache_free(struct synthcache *c)
{
    if (!c)
        return;
    if (c->current)
        free_ref(c, c->current);
    while (c->retired) {          /* handles the kernel never released */
        struct synth_ref *r = c->retired;
        c->retired = r->next;
        free_ref(c, r);
    }
    assert(c->live == 0);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

static void unref_locked(struct synthcache *c, struct synth_ref *r)
{
    if (!r || --r->refs > 0)
        return;
    if (c->current == r)
        c->current = NULL;
    for (struct synth_ref **p = &c->retired; *p; p = &(*p)->next)
        if (*p == r) {
            *p = r->next;
            break;
        }
    free_ref(c, r);
}

/* Would building one more pass the cap?  The current one is freed when
 * replaced unless a handle holds it. */
static bool at_cap_locked(const struct synthcache *c)
{
    unsigned kept = c->live - (c->current && c->current->refs == 1);
    return kept + 1 > SYNTHCACHE_MAX;
}

/* Retire the current synthesizer (its handles keep it) and build one for
 * the disk as it is now. */
static int replace_locked(struct synthcache *c, struct fs_disk *d,
                          const struct synth_key *key)
{
    struct synth_ref *r = calloc(1, sizeof *r);

    if (!r)
        return -ENOMEM;
    if (c->current) {
        struct synth_ref *old = c->current;
        if (old->refs > 1) {
            old->next = c->retired;
            c->retired = old;
        }
        c->current = NULL;
        unref_locked(c, old);
    }
    r->key = *key;
    r->refs = 1;
    r->err = c->ops->build(c->opaque, d, &r->synth);
    if (r->err > 0)
        r->err = -r->err;
    c->current = r;
    c->live++;
    return 0;
}

void *synthcache_get(struct synthcache *c, struct fs_disk *d, bool stale_ok,
                     int *err, uint64_t *snapshot)
{
    struct synth_key key;
    struct synth_ref *r = NULL;

    disk_key(d, &key);
    LOCK_FOR_SCOPE(&c->lock);
    *err = 0;
    if (!c->current || !same_key(&c->current->key, &key)) {
        if (!at_cap_locked(c))
            *err = replace_locked(c, d, &key);
        else if (!stale_ok || !c->current) {
            log_notice("%s: %u versions of the disk are already open (a "
                       "reader kept open across each change); close some "
                       "to open it again", c->name, SYNTHCACHE_MAX);
            *err = -EMFILE;
        }
    }
    if (*err == 0) {
        r = c->current;
        if (r->err) {
            *err = r->err;
            r = NULL;
        } else {
            r->refs++;
            if (snapshot)
                *snapshot = r->key.quiet ? r->key.begun
                                         : SYNTHCACHE_NO_SNAPSHOT;
        }
    }
    return r ? r->synth : NULL;
}

void synthcache_put(struct synthcache *c, void *synth)
{
    if (!synth)
        return;
    LOCK_FOR_SCOPE(&c->lock);
    struct synth_ref *r = c->current && c->current->synth == synth
                          ? c->current : NULL;
    for (struct synth_ref *p = c->retired; !r && p; p = p->next)
        if (p->synth == synth)
            r = p;
    assert(r);
    unref_locked(c, r);
}
