/* tools/verify/source-nbd.c: an NBD export read with libnbd.
 *
 * THREAD MODEL
 * One thread (the side's worker) owns every handle of the source and does
 * all of it: submits reads and block status, polls the handles' sockets with
 * poll(2) over nbd_aio_get_fd(), calls nbd_aio_notify_*(), and hashes.
 * Completion and extent callbacks run inside nbd_aio_notify_*() on that same
 * thread, so the pipeline state needs no lock.  No handle is ever touched by
 * another thread (libnbd 1.14's nbd_poll() would hold the handle lock while
 * sleeping; we don't use it).
 *
 * PIPELINE
 * Entries are scheduled in offset order into a ring (the reorder window).
 * A data entry owns one of 'requests' buffers; a zero entry (block status
 * said NBD_STATE_ZERO) has none and is complete at once.  Replies complete
 * out of order; the head entry is hashed as soon as it is complete, so the
 * digest sees the stream in order while up to 'requests' reads stay in
 * flight, spread round-robin over the connections.
 *
 * OWNERSHIP
 * A buffer belongs to libnbd from nbd_aio_pread() until read_done() runs;
 * it returns to the free stack only after it has been hashed.  If the run
 * stops with reads or block status still in flight (error, abort, non-zero
 * tail), their replies are read and dropped first (drain): nbdkit 1.32
 * aborts (raw_send_socket assertion) when a client closes while read
 * replies are still being sent, and takes every other client and a memory
 * disk with it.  Only a server silent for DRAIN_WAIT_MS is abandoned: the
 * handles are closed first, and only then are the buffers and the
 * pipeline (the callbacks' user_data) freed.
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libnbd.h>

#include "tools/verify/verify.h"

#define NBD_MAX_CONN   16
/* Shorter zero extents are read as data: one request beats a split. */
#define ZERO_SKIP_MIN  (64u << 10)
/* Zero entries are hashed in pieces of this size so that replies keep
 * being collected and new reads submitted between pieces. */
#define ZERO_PIECE     (8u << 20)
/* Bytes asked per block status request: the server's maximum block size,
 * or 32 MiB where it advertises none (the protocol's default limit; some
 * servers mishandle longer requests), but no more than this. */
#define BS_SPAN        (1ull << 30)
#define DEFAULT_MAX    (32u << 20)
/* How long replies still on their way are waited for before closing. */
#define DRAIN_WAIT_MS  30000

struct nbd_src {
    struct verify_source s;             /* first: the ops see this */
    struct nbd_handle *h[NBD_MAX_CONN]; /* owned; NULL once closed */
    unsigned nconn;
    bool block_status;                  /* base:allocation negotiated */
    size_t request_size;                /* clamped to the server maximum */
    uint64_t bs_span;                   /* block status request length */
};

enum ent_state { ENT_READING, ENT_DONE };

struct ent {
    uint64_t off;
    size_t len;
    unsigned char *buf;                 /* NULL: known zero */
    enum ent_state state;               /* set by read_done() */
    int err;                            /* errno from the reply, or 0 */
};

struct extent {
    uint64_t off, len;
    bool zero;
};

struct pipe {
    struct nbd_src *ns;                 /* borrowed */
    struct sink *k;                     /* borrowed */
    struct ent *ring;                   /* owned: cap entries */
    size_t cap, head, count;
    unsigned char **free_bufs;          /* owned stack of owned buffers */
    size_t nfree, nbufs;
    uint64_t sched;                     /* next offset to schedule */
    struct extent *ext;                 /* owned: known extents from sched */
    size_t ext_cap, ext_head, ext_count;
    uint64_t ext_end;                   /* extents known up to here */
    uint64_t bs_off;                    /* offset of the block status */
    bool use_bs;                        /* false: everything is data */
    bool bs_inflight;
    unsigned next_conn;
};

/* ---- extent queue ---- */

static int ext_append(struct pipe *p, uint64_t len, bool zero)
{
    if (p->ext_count) {
        struct extent *last = &p->ext[p->ext_head + p->ext_count - 1];
        if (last->zero == zero) {
            last->len += len;
            p->ext_end += len;
            return 0;
        }
    }
    if (p->ext_head + p->ext_count == p->ext_cap) {
        if (p->ext_head > 0) {
            memmove(p->ext, p->ext + p->ext_head, p->ext_count * sizeof *p->ext);
            p->ext_head = 0;
        } else {
            size_t cap = p->ext_cap ? 2 * p->ext_cap : 256;
            struct extent *e = realloc(p->ext, cap * sizeof *e);
            if (!e)
                return -ENOMEM;
            p->ext = e;
            p->ext_cap = cap;
        }
    }
    p->ext[p->ext_head + p->ext_count++] =
        (struct extent) { .off = p->ext_end, .len = len, .zero = zero };
    p->ext_end += len;
    return 0;
}

/* Runs inside nbd_aio_notify_read() on the worker thread. */
static int extent_cb(void *user_data, const char *metacontext,
                     uint64_t offset, uint32_t *entries, size_t nr_entries,
                     int *error)
{
    struct pipe *p = user_data;
    uint64_t end = p->k->end;

    /* Only base:allocation, and only once per request. */
    if (strcmp(metacontext, LIBNBD_CONTEXT_BASE_ALLOCATION) != 0 ||
        offset != p->ext_end)
        return 0;
    for (size_t i = 0; i + 1 < nr_entries && p->ext_end < end; i += 2) {
        uint64_t len = entries[i];
        bool zero = (entries[i + 1] & LIBNBD_STATE_ZERO) && len >= ZERO_SKIP_MIN;
        if (len == 0)
            break;
        if (len > end - p->ext_end)
            len = end - p->ext_end;
        if (ext_append(p, len, zero) < 0) {
            *error = ENOMEM;
            return -1;
        }
    }
    return 0;
}

/* A failed or empty answer turns block status off: the rest is read. */
static int bs_done(void *user_data, int *error)
{
    struct pipe *p = user_data;

    p->bs_inflight = false;
    if (*error || p->ext_end == p->bs_off)
        p->use_bs = false;
    return 1;
}

static uint64_t lookahead(const struct pipe *p)
{
    uint64_t window = (uint64_t) p->nbufs * p->ns->request_size * 4;
    return window > p->ns->bs_span / 2 ? window : p->ns->bs_span / 2;
}

static int request_extents(struct pipe *p)
{
    struct nbd_handle *h = p->ns->h[0];
    uint64_t count;

    if (!p->use_bs || p->bs_inflight || p->ext_end >= p->k->end ||
        p->ext_end - p->sched >= lookahead(p))
        return 0;
    count = p->k->end - p->ext_end;
    if (count > p->ns->bs_span)
        count = p->ns->bs_span;
    p->bs_off = p->ext_end;
    if (nbd_aio_block_status(h, count, p->ext_end,
                             (nbd_extent_callback) { .callback = extent_cb,
                                                     .user_data = p },
                             (nbd_completion_callback) { .callback = bs_done,
                                                         .user_data = p },
                             0) == -1) {
        int err = nbd_get_errno();
        verify_err("%s: block status: %s", p->ns->s.name, nbd_get_error());
        return err ? -err : -EIO;
    }
    p->bs_inflight = true;
    return 0;
}

/* The extent at p->sched, if known yet.  Returns false: wait for block
 * status. */
static bool next_extent(struct pipe *p, uint64_t *len, bool *zero)
{
    if (p->ext_count) {
        *len = p->ext[p->ext_head].len;
        *zero = p->ext[p->ext_head].zero;
        return true;
    }
    if (p->use_bs)
        return false;
    *len = p->k->end - p->sched;
    *zero = false;
    return true;
}

static void consume(struct pipe *p, uint64_t n)
{
    p->sched += n;
    if (!p->ext_count)
        return;                         /* block status is off */
    struct extent *e = &p->ext[p->ext_head];
    e->off += n;
    e->len -= n;
    if (e->len == 0) {
        p->ext_head++;
        p->ext_count--;
    }
    if (!p->ext_count) {
        p->ext_head = 0;
        if (!p->use_bs)
            p->ext_end = p->sched;
    }
}

/* ---- reads ---- */

/* Runs inside nbd_aio_notify_read() on the worker thread. */
static int read_done(void *user_data, int *error)
{
    struct ent *e = user_data;

    e->err = *error;
    e->state = ENT_DONE;
    return 1;                           /* retire the command */
}

static int submit_read(struct pipe *p, struct ent *e)
{
    struct nbd_src *ns = p->ns;
    struct nbd_handle *h = ns->h[p->next_conn++ % ns->nconn];

    if (nbd_aio_pread(h, e->buf, e->len, e->off,
                      (nbd_completion_callback) { .callback = read_done,
                                                  .user_data = e },
                      0) == -1) {
        int err = nbd_get_errno();
        verify_err("%s: read %zu bytes at %llu: %s", ns->s.name, e->len,
                   (unsigned long long) e->off, nbd_get_error());
        return err ? -err : -EIO;
    }
    return 0;
}

static struct ent *ring_push(struct pipe *p, uint64_t len, unsigned char *buf)
{
    struct ent *e = &p->ring[(p->head + p->count++) % p->cap];

    *e = (struct ent) { .off = p->sched, .len = len, .buf = buf,
                        .state = buf ? ENT_READING : ENT_DONE };
    return e;
}

/* Returns 1 if an entry was scheduled, 0 if nothing can be now, -errno. */
static int schedule_one(struct pipe *p)
{
    uint64_t len;
    bool zero;

    if (p->sched >= p->k->end || p->count == p->cap ||
        !next_extent(p, &len, &zero))
        return 0;
    if (zero) {
        len = len < ZERO_PIECE ? len : ZERO_PIECE;
        ring_push(p, len, NULL);
        consume(p, len);
        return 1;
    }
    if (!p->nfree)
        return 0;
    len = len < p->ns->request_size ? len : p->ns->request_size;
    struct ent *e = ring_push(p, len, p->free_bufs[--p->nfree]);
    consume(p, len);
    int r = submit_read(p, e);
    return r < 0 ? r : 1;
}

static int schedule(struct pipe *p)
{
    int r;

    do {
        if ((r = request_extents(p)) < 0)
            return r;
    } while ((r = schedule_one(p)) > 0);
    return r;
}

/* ---- the event loop ---- */

static int notify(struct nbd_src *ns, struct nbd_handle *h, short revents)
{
    int r = 0;

    /* One event per round, in the order nbd_poll() uses. */
    if (revents & (POLLIN | POLLHUP))
        r = nbd_aio_notify_read(h);
    else if (revents & POLLOUT)
        r = nbd_aio_notify_write(h);
    else if (revents & (POLLERR | POLLNVAL)) {
        verify_err("%s: server closed the connection", ns->s.name);
        return -ENOTCONN;
    }
    if (r == -1) {
        int err = nbd_get_errno();
        verify_err("%s: %s", ns->s.name, nbd_get_error());
        return err ? -err : -EIO;
    }
    return 0;
}

static int wait_io(struct pipe *p, int timeout)
{
    struct nbd_src *ns = p->ns;
    struct pollfd fds[NBD_MAX_CONN];

    for (unsigned i = 0; i < ns->nconn; i++) {
        unsigned dir = nbd_aio_get_direction(ns->h[i]);
        fds[i].fd = nbd_aio_get_fd(ns->h[i]);
        fds[i].events = ((dir & LIBNBD_AIO_DIRECTION_READ) ? POLLIN : 0) |
                        ((dir & LIBNBD_AIO_DIRECTION_WRITE) ? POLLOUT : 0);
        fds[i].revents = 0;
        if (fds[i].fd == -1) {
            verify_err("%s: %s", ns->s.name, nbd_get_error());
            return -ENOTCONN;
        }
    }
    int n = poll(fds, ns->nconn, timeout);
    if (n == -1)
        return errno == EINTR ? 0 : -errno;
    for (unsigned i = 0; n > 0 && i < ns->nconn; i++) {
        int r = notify(ns, ns->h[i], fds[i].revents);
        if (r < 0)
            return r;
    }
    return 0;
}

static int hash_head(struct pipe *p)
{
    struct ent *e = &p->ring[p->head];
    int r;

    if (e->err) {
        verify_err("%s: read %zu bytes at %llu: %s", p->ns->s.name, e->len,
                   (unsigned long long) e->off, strerror(e->err));
        return -e->err;
    }
    r = e->buf ? sink_data(p->k, e->buf, e->len) : sink_zero(p->k, e->len);
    if (e->buf)
        p->free_bufs[p->nfree++] = e->buf;
    p->head = (p->head + 1) % p->cap;
    p->count--;
    return r;
}

static int pipe_run(struct pipe *p)
{
    while (p->k->pos < p->k->end) {
        int r;

        if (sink_aborted(p->k))
            return -ECANCELED;
        if ((r = schedule(p)) < 0)
            return r;
        if (p->count && p->ring[p->head].state == ENT_DONE) {
            bool was_read = p->ring[p->head].buf != NULL;
            if ((r = hash_head(p)) != 0)
                return r;               /* error or SINK_STOP */
            /* Collect replies that arrived while we hashed. */
            if (was_read && (r = wait_io(p, 0)) < 0)
                return r;
            continue;
        }
        if (!p->count && !p->bs_inflight) {
            verify_err("%s: internal error: pipeline stalled at %llu",
                       p->ns->s.name, (unsigned long long) p->sched);
            return -EIO;
        }
        if ((r = wait_io(p, -1)) < 0)
            return r;
    }
    return 0;
}

/* ---- setup and teardown ---- */

static int pipe_init(struct pipe *p, struct nbd_src *ns, struct sink *k)
{
    memset(p, 0, sizeof *p);
    p->ns = ns;
    p->k = k;
    p->use_bs = ns->block_status;
    p->nbufs = ns->s.opt->requests;
    p->cap = p->nbufs * 4 + 64;
    p->ring = calloc(p->cap, sizeof *p->ring);
    p->free_bufs = calloc(p->nbufs, sizeof *p->free_bufs);
    if (!p->ring || !p->free_bufs)
        goto oom;
    for (; p->nfree < p->nbufs; p->nfree++)
        if (!(p->free_bufs[p->nfree] = malloc(ns->request_size)))
            goto oom;
    return 0;
oom:
    verify_err("out of memory");
    return -ENOMEM;
}

static bool pipe_busy(const struct pipe *p)
{
    if (p->bs_inflight)
        return true;
    for (size_t i = 0; i < p->count; i++)
        if (p->ring[(p->head + i) % p->cap].state == ENT_READING)
            return true;
    return false;
}

static unsigned in_flight(const struct nbd_src *ns)
{
    unsigned n = 0;

    for (unsigned i = 0; i < ns->nconn; i++) {
        int k = nbd_aio_in_flight(ns->h[i]);
        n += k > 0 ? (unsigned) k : 0;
    }
    return n;
}

static int64_t mono_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t) t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Read the replies of the commands still in flight (their results are
 * dropped), for up to DRAIN_WAIT_MS: see OWNERSHIP above. */
static void drain(struct pipe *p)
{
    int64_t due = mono_ms() + DRAIN_WAIT_MS;
    unsigned n;

    while ((n = in_flight(p->ns)) > 0) {
        int64_t left = due - mono_ms();
        if (left <= 0) {
            verify_err("%s: abandoning %u request(s): no reply within %d s",
                       p->ns->s.name, n, DRAIN_WAIT_MS / 1000);
            return;
        }
        if (wait_io(p, (int) left) < 0)
            return;                     /* the connection is gone */
    }
}

static void close_handles(struct nbd_src *ns)
{
    for (unsigned i = 0; i < ns->nconn; i++) {
        nbd_close(ns->h[i]);
        ns->h[i] = NULL;
    }
    ns->nconn = 0;
}

/* Buffers still with libnbd are freed only after close_handles(). */
static void pipe_free(struct pipe *p)
{
    for (size_t i = 0; i < p->count; i++)
        free(p->ring[(p->head + i) % p->cap].buf);
    for (size_t i = 0; i < p->nfree; i++)
        free(p->free_bufs[i]);
    free(p->free_bufs);
    free(p->ring);
    free(p->ext);
}

static int nbd_run(struct verify_source *s, struct sink *k)
{
    struct nbd_src *ns = (struct nbd_src *) s;
    struct pipe p;
    int r = pipe_init(&p, ns, k);

    if (r == 0)
        r = pipe_run(&p);
    if (pipe_busy(&p)) {
        drain(&p);
        if (in_flight(ns) > 0)
            close_handles(ns);          /* abandoned: buffers freed after */
    }
    pipe_free(&p);
    return r;
}

static void nbd_src_close(struct verify_source *s)
{
    struct nbd_src *ns = (struct nbd_src *) s;

    for (unsigned i = 0; i < ns->nconn; i++)
        nbd_shutdown(ns->h[i], 0);
    close_handles(ns);
    free(ns);
}

static const struct verify_source_ops nbd_ops = {
    .kind = "nbd",
    .run = nbd_run,
    .close = nbd_src_close,
};

static int connect_one(const char *uri, bool want_bs, struct nbd_handle **out)
{
    struct nbd_handle *h = nbd_create();
    int err;

    if (!h)
        goto fail;
    /* No zeroing of each buffer before its read: a failed read is never
     * hashed, and libnbd still zeroes the holes a server answers with. */
    nbd_set_pread_initialize(h, false);
    if (want_bs && nbd_add_meta_context(h, LIBNBD_CONTEXT_BASE_ALLOCATION) == -1)
        goto fail;
    if (nbd_connect_uri(h, uri) == -1)
        goto fail;
    *out = h;
    return 0;
fail:
    err = nbd_get_errno();
    verify_err("%s: %s", uri, nbd_get_error());
    nbd_close(h);
    return err ? -err : -EIO;
}

/* Server limits, block status and multi-conn, learnt from the first
 * connection. */
static int negotiate(struct nbd_src *ns, const struct source_options *opt)
{
    struct nbd_handle *h = ns->h[0];
    int64_t size = nbd_get_size(h);
    int64_t max = nbd_get_block_size(h, LIBNBD_SIZE_MAXIMUM);

    if (size < 0) {
        verify_err("%s: %s", ns->s.name, nbd_get_error());
        return -EIO;
    }
    ns->s.size = (uint64_t) size;
    ns->request_size = opt->request_size;
    if (max > 0 && (uint64_t) max < ns->request_size)
        ns->request_size = (size_t) max;
    ns->bs_span = max > 0 ? (uint64_t) max : DEFAULT_MAX;
    if (ns->bs_span > BS_SPAN)
        ns->bs_span = BS_SPAN;
    ns->block_status = opt->use_extents &&
        nbd_can_meta_context(h, LIBNBD_CONTEXT_BASE_ALLOCATION) == 1;
    return 0;
}

int src_nbd_open(const char *uri, const struct source_options *opt,
                 struct verify_source **out)
{
    struct nbd_src *ns = calloc(1, sizeof *ns);
    int r;

    if (!ns) {
        verify_err("out of memory");
        return -ENOMEM;
    }
    ns->s = (struct verify_source) { .ops = &nbd_ops, .name = uri, .opt = opt };
    if ((r = connect_one(uri, opt->use_extents, &ns->h[0])) < 0)
        goto fail;
    ns->nconn = 1;
    if ((r = negotiate(ns, opt)) < 0)
        goto fail;
    /* Extra connections only where the server says they see the same data. */
    unsigned want = opt->connections < NBD_MAX_CONN ? opt->connections : NBD_MAX_CONN;
    if (want > 1 && nbd_can_multi_conn(ns->h[0]) == 1)
        for (; ns->nconn < want; ns->nconn++)
            if ((r = connect_one(uri, ns->block_status, &ns->h[ns->nconn])) < 0)
                goto fail;
    *out = &ns->s;
    return 0;
fail:
    close_handles(ns);
    free(ns);
    return r;
}
