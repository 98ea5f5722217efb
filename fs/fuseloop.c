/* fs/fuseloop.c: the FUSE receive loop.
 *
 * fuse_session_loop_mt() lets every idle worker wait in read() on
 * /dev/fuse, and the kernel wakes the one that has waited longest, so the
 * requests of a sequential writer (cp, dd: one write in flight) rotate
 * over the workers, each with its own 1 MiB buffer, and every write is
 * bracketed by the loop's bookkeeping lock.  Measured on a 1 GiB cp, that
 * costs the daemon about 0.05 CPU s per GiB over serving every request on
 * one thread (-s), which in turn would let one read waiting for the
 * server hold up every other request.  This loop does both: one thread
 * reads every request into one buffer and serves writes itself, in the
 * order they arrive; any other request is copied out (they are small: only
 * writes carry a payload) and served by a worker thread.
 *
 * THREAD MODEL
 * The receiver is the thread that calls fuseloop_run(): the only reader
 * of /dev/fuse.  It serves WRITE (but for a durable one, O_DSYNC or
 * O_SYNC, which waits for the server: a worker serves it), and the
 * requests that never wait
 * (FORGET, BATCH_FORGET, INTERRUPT) or must be served in order before or
 * after everything else (INIT, DESTROY, RELEASE), with
 * fuse_session_process_buf() on its buffer.  RELEASE: the kernel sends it
 * after close() has returned, and the next open() of the file may be the
 * very next request; handed to a worker, that open could be served
 * first and find the old handle still there (a view that takes one
 * writer at a time would answer EBUSY).  Releases only free what the
 * handle held.  It also serves a READ whose bytes have all arrived in
 * the read-ahead (landing->read(): nothing to wait for, only a copy to
 * the reader), since handing it to a worker costs more (a wakeup and a
 * switch) than the copy; a read that would wait for the server goes to a
 * worker.  So is an LSEEK (SEEK_DATA, SEEK_HOLE) of the raw file
 * (landing->seek(): the pool's map of holes, in memory).  Only the
 * receiver calls those hooks (the spare hands every request off).
 * Workers (started on demand, up to max_workers, kept until the loop ends) take the other requests from a FIFO queue and
 * serve them with fuse_session_process_buf() on their copy, as libfuse's
 * own workers do.  loop->lock protects the queue and the counters; it is
 * a leaf lock, never held while serving a request.
 *
 * A write may wait a long time: for a free pool buffer while the server
 * is slow, or paused for up to the request and retry timeouts.  Nothing
 * else may wait behind it (the status file must stay readable, a reader
 * of another range must go on), so a spare reader thread checks every
 * SPARE_CHECK_MS: if the receiver has been serving the same request since
 * the last check, the spare reads requests too, and hands every one off
 * to a worker (a write with a copy of its payload), until the receiver is
 * back.  The spare reads nothing otherwise: a second reader waiting on
 * /dev/fuse would get every other request.  The receiver publishes what
 * it does in l->seq (odd while serving a request), an atomic, so the hot
 * path takes no lock for it.
 *
 * Ordering is what fuse_session_loop_mt() gives, and a little more: a
 * write is served completely before the next request is read, so a FLUSH
 * or FSYNC that the kernel sends after a write's reply sees that write.
 * Workers and the spare block every signal (as libfuse's workers do), so
 * a SIGTERM interrupts the receiver's read() and the loop sees
 * fuse_session_exited().
 *
 * LANDINGS: ONE COPY OF A WRITE'S PAYLOAD
 * read() of /dev/fuse puts a write's header (fuse_in_header and
 * fuse_write_in, 80 bytes) and its payload in one buffer, and libfuse
 * hands the handler the payload where it lies; moving it into the pool
 * buffer it is sent from was the daemon's one user-space copy of the
 * data.  So before each read the receiver asks for a landing (struct
 * fuseloop_landing: the free tail of the pool buffer that the next
 * sequential write would extend, or a whole free buffer) and reads with
 * readv(): 80 bytes into a header buffer, then up to the landing's room
 * into the landing, the rest into the receive buffer.  The kernel copies
 * the payload straight to where it will be sent from.  A write whose
 * payload lies wholly in the landing is served by landing->write() and
 * answered here (libfuse never sees it: it has no request for it, so an
 * INTERRUPT for it is answered EAGAIN, as for any finished request).
 * Every other request (or a write the landing cannot take: another file,
 * another offset, a buffer sealed meanwhile) is put back together in the
 * receive buffer, the landing is given back, and it goes the usual way:
 * one copy of the landed part, a few bytes for anything but a write.
 */
#include "fs/fuseloop.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>

#include "common/cleanup.h"
#include "common/log.h"

/* The receive buffer.  The kernel never sends more than max_write (1 MiB,
 * fs/ops.c) plus a page of headers; libfuse asks read() for its own
 * buffer size, of which the kernel fills only one request.  2 MiB
 * aligned and huge-page backed: one TLB entry, and fewer page-table walks
 * for the kernel's copy of each payload into it. */
#define RECV_BUF_SIZE (4u << 20)
#define RECV_BUF_ALIGN (2u << 20)

#define SPARE_CHECK_MS 20         /* a request served longer than this
                                   * lets the spare read the next ones */

struct job {
    struct job *next;
    size_t size;
    char mem[];               /* the request, as read from /dev/fuse */
};

struct loop {
    struct fuse_session *se;
    unsigned max_workers;

    pthread_mutex_t lock;
    pthread_cond_t cond;      /* a job was queued, or stop */
    struct job *head, *tail;
    unsigned queued;          /* jobs in the queue */
    unsigned idle;            /* workers waiting on cond */
    unsigned nworkers;
    bool stop;
    pthread_t *workers;       /* [max_workers] */

    const struct fuseloop_landing *hooks;  /* NULL: none */
    atomic_uint_fast64_t seq; /* receiver: odd while serving a request */
    pthread_t spare;
    bool spare_started;
    void *spare_mem;          /* the spare's receive buffer */
};

/* Requests the receiver serves itself. */
static bool served_inline(uint32_t opcode)
{
    switch (opcode) {
    case FUSE_WRITE:          /* the hot path: no copy, no hand-off */
    case FUSE_RELEASE:        /* in order: see THREAD MODEL */
    case FUSE_FORGET:
    case FUSE_BATCH_FORGET:
    case FUSE_INTERRUPT:
    case FUSE_INIT:
    case FUSE_DESTROY:
        return true;
    default:
        return false;
    }
}

/* A write that must be durable before its reply: O_DSYNC or O_SYNC (which
 * includes it), from the file's open flags or pwritev2()'s RWF_DSYNC or
 * RWF_SYNC; the kernel passes both in every write's flags.  Or the write
 * that ends a copy (the hooks' waits(): it is answered once everything
 * before it is acknowledged).  Such a write waits for the server, so it
 * is served by a worker and the receiver goes on reading; it is never
 * landed (a landing is served on the receiver). */
static bool write_is_sync(const struct loop *l, const void *mem, size_t size)
{
    const struct fuse_in_header *in = mem;
    const struct fuse_write_in *w = (const void *) (in + 1);

    if (size < sizeof *in + sizeof *w || in->opcode != FUSE_WRITE)
        return false;
    return (w->flags & O_DSYNC) ||
           (l->hooks && l->hooks->waits &&
            l->hooks->waits(l->hooks->opaque, in->nodeid, w->fh,
                              w->offset, w->size));
}

/* The next job, once there is one; NULL once stopping with the queue
 * empty. */
static struct job *take_job(struct loop *l)
{
    LOCK_FOR_SCOPE(&l->lock);
    while (!l->head && !l->stop) {
        l->idle++;
        pthread_cond_wait(&l->cond, &l->lock);
        l->idle--;
    }
    struct job *j = l->head;
    if (!j)
        return NULL;              /* stop, and the queue is empty */
    l->head = j->next;
    if (!l->head)
        l->tail = NULL;
    l->queued--;
    return j;
}

static void *worker_main(void *arg)
{
    struct loop *l = arg;

    for (;;) {
        struct job *j = take_job(l);
        if (!j)
            return NULL;

        struct fuse_buf b = { .size = j->size, .mem = j->mem };
        fuse_session_process_buf(l->se, &b);
        free(j);
    }
}

/* pthread_create() with every signal blocked in the new thread. */
static int start_thread(pthread_t *t, void *(*fn)(void *), void *arg)
{
    sigset_t all, old;

    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int r = pthread_create(t, NULL, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return r;
}

/* Queue a copy of the request for a worker, starting one if every worker
 * is busy.  0 or -errno (the caller then serves the request itself). */
static int hand_off(struct loop *l, const struct fuse_buf *b)
{
    struct job *j = malloc(sizeof *j + b->size);
    if (!j)
        return -ENOMEM;
    j->next = NULL;
    j->size = b->size;
    memcpy(j->mem, b->mem, b->size);

    LOCK_FOR_SCOPE(&l->lock);
    if (l->queued + 1 > l->idle && l->nworkers < l->max_workers) {
        int r = start_thread(&l->workers[l->nworkers], worker_main, l);
        if (r == 0)
            l->nworkers++;
        else if (l->nworkers == 0) {
            free(j);
            return -r;
        }
    }
    if (l->tail)
        l->tail->next = j;
    else
        l->head = j;
    l->tail = j;
    l->queued++;
    pthread_cond_signal(&l->cond);
    return 0;
}

/* Write a reply (iov[0] its header).  ENOENT: the request was
 * interrupted and is gone; not an error. */
static void send_reply(struct loop *l, const struct iovec *iov, int n)
{
    if (writev(fuse_session_fd(l->se), iov, n) == -1 && errno != ENOENT &&
        !fuse_session_exited(l->se))
        log_err("fuse: writing /dev/fuse: %s", strerror(errno));
}

/* The reply to a read, as fuse_reply_iov() sends it. */
static void reply_data(struct loop *l, uint64_t unique, struct iovec *iov,
                       unsigned n)
{
    struct fuse_out_header out = { .unique = unique, .len = sizeof out };

    iov[0] = (struct iovec) { &out, sizeof out };
    for (unsigned i = 1; i <= n; i++)
        out.len += (uint32_t) iov[i].iov_len;
    send_reply(l, iov, (int) n + 1);
}

/* A reply of one struct (arg, size bytes), or for res < 0 the error
 * alone, as fuse_reply_write(), fuse_reply_lseek() and fuse_reply_err()
 * send them. */
static void reply_struct(struct loop *l, uint64_t unique, int64_t res,
                         const void *arg, size_t size)
{
    struct fuse_out_header out = { .unique = unique };
    struct iovec iov[2] = { { &out, sizeof out }, { (void *) arg, size } };
    int n = res >= 0 ? 2 : 1;

    out.error = res < 0 ? (int32_t) res : 0;
    out.len = (uint32_t) (sizeof out + (n == 2 ? size : 0));
    send_reply(l, iov, n);
}

/* The reply to a write, as fuse_reply_write() / fuse_reply_err() send it. */
static void reply_write(struct loop *l, uint64_t unique, ssize_t res)
{
    struct fuse_write_out wo = { .size = res > 0 ? (uint32_t) res : 0 };
    reply_struct(l, unique, res, &wo, sizeof wo);
}

/* A READ whose bytes have arrived is served here: handing it to a worker
 * costs more (a wakeup and a switch each way) than the copy to the
 * reader.  A read that would wait goes to a worker. */
static bool read_inline(struct loop *l, const struct fuse_buf *b)
{
    const struct fuse_in_header *in = b->mem;
    const struct fuse_read_in *rd = (const void *) (in + 1);
    const struct fuseloop_landing *h = l->hooks;
    struct iovec iov[1 + FUSELOOP_READ_IOV];
    unsigned n = 0;

    if (!h || !h->read || in->opcode != FUSE_READ ||
        b->size < sizeof *in + sizeof *rd)
        return false;
    atomic_fetch_add_explicit(&l->seq, 1, memory_order_relaxed);
    bool served = h->read(h->opaque, in->nodeid, rd->fh, rd->offset,
                          rd->size, in->pid, iov + 1, &n) == 1;
    if (served) {
        assert(n <= FUSELOOP_READ_IOV);
        reply_data(l, in->unique, iov, n);
        h->read_done(h->opaque);
    }
    atomic_fetch_add_explicit(&l->seq, 1, memory_order_relaxed);
    return served;
}

/* An LSEEK whose answer is in memory is served here too: cp
 * --sparse=always asks two per extent (SEEK_DATA, then SEEK_HOLE), and a
 * worker's wakeup and switch each way cost more than the answer. */
static bool seek_inline(struct loop *l, const struct fuse_buf *b)
{
    const struct fuse_in_header *in = b->mem;
    const struct fuse_lseek_in *sk = (const void *) (in + 1);
    const struct fuseloop_landing *h = l->hooks;
    int64_t res;

    if (!h || !h->seek || in->opcode != FUSE_LSEEK ||
        b->size < sizeof *in + sizeof *sk)
        return false;
    atomic_fetch_add_explicit(&l->seq, 1, memory_order_relaxed);
    bool served = h->seek(h->opaque, in->nodeid, sk->fh, sk->offset,
                          sk->whence, in->pid, &res) == 1;
    if (served) {
        struct fuse_lseek_out lo = { .offset = res >= 0 ? (uint64_t) res
                                                       : 0 };
        reply_struct(l, in->unique, res, &lo, sizeof lo);
    }
    atomic_fetch_add_explicit(&l->seq, 1, memory_order_relaxed);
    return served;
}

static void dispatch(struct loop *l, struct fuse_buf *b)
{
    const struct fuse_in_header *in = b->mem;

    if (!(b->flags & FUSE_BUF_IS_FD) && b->size >= sizeof *in &&
        (read_inline(l, b) || seek_inline(l, b)))
        return;
    if ((b->flags & FUSE_BUF_IS_FD) || b->size < sizeof *in ||
        (served_inline(in->opcode) && !write_is_sync(l, b->mem, b->size)) ||
        hand_off(l, b) < 0) {
        atomic_fetch_add_explicit(&l->seq, 1, memory_order_relaxed);
        fuse_session_process_buf(l->se, b);
        atomic_fetch_add_explicit(&l->seq, 1, memory_order_relaxed);
    }
}

/* The spare reader: see THREAD MODEL.  Cancelled (in its sleep or its
 * read(), the only cancellation points it enables) when the loop ends. */
static void *spare_main(void *arg)
{
    struct loop *l = arg;
    const struct timespec check = { .tv_nsec = SPARE_CHECK_MS * 1000000L };
    uint_fast64_t seen = 0;

    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
    while (!fuse_session_exited(l->se)) {
        uint_fast64_t now = atomic_load_explicit(&l->seq,
                                                 memory_order_relaxed);
        if (!(now & 1) || now != seen) {
            seen = now;
            pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL);
            nanosleep(&check, NULL);
            pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
            continue;
        }
        /* The receiver is stuck in one request: read the next one. */
        struct fuse_buf b = { .mem = l->spare_mem };
        pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL);
        int r = fuse_session_receive_buf(l->se, &b);
        pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
        if (r == -EINTR)
            continue;
        if (r <= 0)
            break;
        if ((b.flags & FUSE_BUF_IS_FD) || hand_off(l, &b) < 0)
            fuse_session_process_buf(l->se, &b);
    }
    return NULL;
}

/* ---- landings ------------------------------------------------------------ */

/* A write's whole header; most other requests fit in it too. */
#define HDR_SIZE (sizeof(struct fuse_in_header) + sizeof(struct fuse_write_in))

/* One request, as fuse_session_receive_buf() reads it (same errors), but
 * split: HDR_SIZE bytes to hdr, up to room to zone, the rest to mem.
 * Bytes read; 0 at unmount; -errno. */
static ssize_t read_split(struct loop *l, void *hdr, void *zone, size_t room,
                          void *mem)
{
    struct iovec iov[3] = { { hdr, HDR_SIZE }, { zone, room },
                            { mem, RECV_BUF_SIZE - HDR_SIZE - room } };
    int fd = fuse_session_fd(l->se);

    for (;;) {
        ssize_t n = readv(fd, iov, 3);
        int err = errno;
        if (fuse_session_exited(l->se))
            return 0;
        if (n >= (ssize_t) sizeof(struct fuse_in_header))
            return n;
        if (n >= 0) {
            log_err("fuse: short read on /dev/fuse (%zd bytes)", n);
            return -EIO;
        }
        if (err == ENOENT)        /* the request was interrupted */
            continue;
        if (err == ENODEV) {      /* unmounted, or the connection aborted */
            fuse_session_exit(l->se);
            return 0;
        }
        if (err != EINTR && err != EAGAIN)
            log_err("fuse: reading /dev/fuse: %s", strerror(err));
        return -err;
    }
}

/* Serve the n bytes read by read_split(), then end the landing. */
static void serve_split(struct loop *l, const struct fuseloop_landing *land,
                        char *hdr, const char *zone, size_t room, char *mem,
                        size_t n)
{
    const struct fuse_in_header *in = (const void *) hdr;
    const struct fuse_write_in *w = (const void *) (hdr + sizeof *in);

    if (in->opcode == FUSE_WRITE && n >= HDR_SIZE && in->len == n &&
        w->size == n - HDR_SIZE && w->size <= room &&
        !write_is_sync(l, hdr, n)) {
        atomic_fetch_add_explicit(&l->seq, 1, memory_order_relaxed);
        ssize_t r = land->write(land->opaque, in->nodeid, w->fh, w->offset,
                                w->size, in->pid);
        if (r != -EAGAIN)
            reply_write(l, in->unique, r);
        atomic_fetch_add_explicit(&l->seq, 1, memory_order_relaxed);
        if (r != -EAGAIN) {
            land->end(land->opaque);
            return;
        }
    }
    /* The usual way: the request in one piece in mem, the landing given
     * back before it is served (a write may then extend that buffer). */
    size_t h = n < HDR_SIZE ? n : HDR_SIZE;
    size_t z = n - h < room ? n - h : room;
    assert(n <= RECV_BUF_SIZE);
    memmove(mem + h + z, mem, n - h - z);
    memcpy(mem + h, zone, z);
    memcpy(mem, hdr, h);
    land->end(land->opaque);
    struct fuse_buf b = { .size = n, .mem = mem };
    dispatch(l, &b);
}

/* Tell the workers to finish the queue and exit; wait for them. */
static void stop_workers(struct loop *l)
{
    {
        LOCK_FOR_SCOPE(&l->lock);
        l->stop = true;
        pthread_cond_broadcast(&l->cond);
    }
    for (unsigned i = 0; i < l->nworkers; i++)
        pthread_join(l->workers[i], NULL);
    assert(!l->head && l->queued == 0);
}

int fuseloop_run(struct fuse_session *se, unsigned max_workers,
                 const struct fuseloop_landing *landing)
{
    char hdr[HDR_SIZE] __attribute__((aligned(8)));
    struct loop l = { .se = se, .max_workers = max_workers,
                      .hooks = landing };
    void *mem = NULL;
    int r;

    assert(max_workers > 0);
    l.workers = calloc(max_workers, sizeof *l.workers);
    if (!l.workers)
        return -ENOMEM;
    r = posix_memalign(&mem, RECV_BUF_ALIGN, RECV_BUF_SIZE);
    if (r) {
        free(l.workers);
        return -r;
    }
    (void) madvise(mem, RECV_BUF_SIZE, MADV_HUGEPAGE);  /* a hint only */
    pthread_mutex_init(&l.lock, NULL);
    pthread_cond_init(&l.cond, NULL);
    l.spare_mem = malloc(RECV_BUF_SIZE);
    r = l.spare_mem ? -start_thread(&l.spare, spare_main, &l) : -ENOMEM;
    l.spare_started = r == 0;
    if (r < 0)
        log_err("fuse: cannot start the spare reader: %s", strerror(-r));

    /* As fuse_session_loop(): EINTR (a signal) goes round again, to see
     * fuse_session_exited(); 0 is the unmount. */
    while (r == 0 && !fuse_session_exited(se)) {
        size_t room = 0;
        void *zone = NULL;
        if (landing) {            /* may wait for a buffer: as serving */
            atomic_fetch_add_explicit(&l.seq, 1, memory_order_relaxed);
            zone = landing->begin(landing->opaque, &room);
            atomic_fetch_add_explicit(&l.seq, 1, memory_order_relaxed);
        }
        if (zone) {
            /* The receive buffer keeps room for a whole request besides
             * (a write carries at most FS_MAX_WRITE). */
            if (room > RECV_BUF_SIZE / 2)
                room = RECV_BUF_SIZE / 2;
            ssize_t n = read_split(&l, hdr, zone, room, mem);
            if (n > 0) {
                serve_split(&l, landing, hdr, zone, room, mem, (size_t) n);
                r = 0;
                continue;
            }
            landing->end(landing->opaque);
            r = n == -EINTR ? 0 : (int) n;
            if (n == 0)
                break;
            continue;
        }
        struct fuse_buf b = { .mem = mem };
        r = fuse_session_receive_buf(se, &b);
        if (r == -EINTR) {
            r = 0;
            continue;
        }
        if (r <= 0)
            break;
        assert(b.mem == mem);     /* libfuse allocates only if mem is NULL */
        dispatch(&l, &b);
        r = 0;
    }
    /* r < 0: libfuse has logged the failure to read. */

    if (l.spare_started) {
        pthread_cancel(l.spare);
        pthread_join(l.spare, NULL);
    }
    stop_workers(&l);
    fuse_session_reset(se);
    pthread_cond_destroy(&l.cond);
    pthread_mutex_destroy(&l.lock);
    free(l.workers);
    free(l.spare_mem);
    free(mem);
    return r;
}
