/* transport/nbdx-issue.c: issuing an op on a connection's handle and
 * collecting its result: the bottom of the I/O thread.
 *
 * THREAD MODEL
 * All but nbdx_kick() run on the connection's I/O thread, the only
 * thread that calls libnbd on its handle after the handshake.
 * op_completed() and op_extents() run inside nbd_aio_notify_*() with
 * the handle lock held: they only record (the op moves to the done
 * list, private to the I/O thread).  nbdx_kick() runs on any thread
 * (an eventfd write: never blocks, takes no lock).
 */
#include "transport/nbdx-internal.h"

#include <errno.h>
#include <inttypes.h>
#include <unistd.h>

#include "common/list.h"
#include "common/log.h"
#include "common/monotime.h"
#include "config.h"
#include "transport/nbdpoll.h"

const char *const nbdx_kind_name[NBDX_NKINDS] = {
    [NBDX_OP_READ] = "read", [NBDX_OP_WRITE] = "write",
    [NBDX_OP_ZERO] = "zero", [NBDX_OP_FLUSH] = "flush",
    [NBDX_OP_BLOCK_STATUS] = "block-status",
};

void nbdx_push_done(struct nbdx_conn *c, struct nbdx_op *op)
{
    op->completed = true;
    QUEUE_APPEND(c->done_head, c->done_tail, op);
}

/* The ops libnbd holds, so that a handle given up on can hand them back
 * (retire_conn). */
static void wire_add(struct nbdx_conn *c, struct nbdx_op *op)
{
    op->on_wire = true;
    op->wprev = NULL;
    op->wnext = c->wire;
    if (c->wire)
        c->wire->wprev = op;
    c->wire = op;
}

void nbdx_wire_remove(struct nbdx_conn *c, struct nbdx_op *op)
{
    if (!op->on_wire)
        return;
    op->on_wire = false;
    DLIST_UNLINK(c->wire, op, wprev, wnext);
    op->wprev = op->wnext = NULL;
}

/* libnbd completion callback: runs inside libnbd, records only. */
static int op_completed(void *user_data, int *error)
{
    struct nbdx_op *op = user_data;

    /* Each op completes once: one no longer on the wire was handed back
     * already (retire_conn), and a second done() would reach the pool
     * for a request it released. */
    if (!op->on_wire)
        return 1;
    op->err = *error;
    nbdx_wire_remove(op->conn, op);
    nbdx_push_done(op->conn, op);
    return 1;                             /* retire the command */
}

static int op_extent(void *opaque, uint64_t off, uint64_t len,
                     uint32_t flags)
{
    struct nbdx_op *op = opaque;

    op->extent(op, off, len, flags);
    return 0;
}

/* libnbd extent callback: runs inside libnbd, records only. */
static int op_extents(void *user_data, const char *metacontext,
                      uint64_t offset, uint32_t *entries, size_t nr,
                      int *error)
{
    return nbdpoll_extents(metacontext, offset, entries, nr, error,
                           op_extent, user_data);
}

/* Without extended headers a request length is 32 bits.  The pool makes
 * longer ones only when every connection negotiated them, and a
 * reconnection that loses them is refused (nbdx_server_changed()); a
 * block status count is a hint, so one is cut here all the same (the
 * scan asks again for the rest).  A longer zero is left to libnbd,
 * which fails it (ERANGE): an error, never a short zero. */
#define NBDX_LEN32_MAX (UINT32_MAX & ~0xfffffu) /* 1 MiB aligned */

#if HAVE_NBD_EXTENDED_HEADERS
/* The same, 64-bit: with extended headers one extent may exceed 4 GiB
 * (the 32-bit callback would see it cut). */
static int op_extents64(void *user_data, const char *metacontext,
                        uint64_t offset, nbd_extent *entries, size_t nr,
                        int *error)
{
    return nbdpoll_extents64(metacontext, offset, entries, nr, error,
                             op_extent, user_data);
}
#endif

static int64_t start_block_status(struct nbdx_conn *c, struct nbdx_op *op,
                                  nbd_completion_callback cb)
{
#if HAVE_NBD_EXTENDED_HEADERS
    if (c->ext_headers) {
        nbd_extent64_callback ecb = { .callback = op_extents64,
                                      .user_data = op };
        return nbd_aio_block_status_64(c->h, op->len, op->off, ecb, cb, 0);
    }
#endif
    nbd_extent_callback ecb = { .callback = op_extents, .user_data = op };
    uint64_t len = op->len < NBDX_LEN32_MAX ? op->len : NBDX_LEN32_MAX;
    return nbd_aio_block_status(c->h, len, op->off, ecb, cb, 0);
}

static int64_t start_op(struct nbdx_conn *c, struct nbdx_op *op)
{
    nbd_completion_callback cb = { .callback = op_completed,
                                   .user_data = op };
    struct nbd_handle *h = c->h;

    switch (op->kind) {
    case NBDX_OP_READ:
        return nbd_aio_pread(h, op->buf, op->len, op->off, cb, 0);
    case NBDX_OP_WRITE:
        return nbd_aio_pwrite(h, op->buf, op->len, op->off, cb, op->flags);
    case NBDX_OP_ZERO:
        return nbd_aio_zero(h, op->len, op->off, cb, op->flags);
    case NBDX_OP_FLUSH:
        return nbd_aio_flush(h, cb, 0);
    case NBDX_OP_BLOCK_STATUS:
        return start_block_status(c, op, cb);
    }
    return -1;
}

void nbdx_push_retry(struct nbdx_conn *c, struct nbdx_op *op)
{
    QUEUE_APPEND(c->retry_head, c->retry_tail, op);
}

void nbdx_issue(struct nbdx_conn *c, struct nbdx_op *op)
{
    op->conn = c;
    op->completed = false;
    op->err = 0;
    if (c->stalled && !c->dead) {
        nbdx_push_retry(c, op);           /* sent once the server answers */
        return;
    }
    if (c->dead || c->closing) {
        op->err = ENOTCONN;               /* run_done() may queue a retry */
        nbdx_push_done(c, op);
        return;
    }
    /* The request timeout runs from the moment the connection has
     * something outstanding. */
    if (nbd_aio_in_flight(c->h) <= 0)
        atomic_store(&c->progress_ns, mono_now_ns());
    wire_add(c, op);
    if (start_op(c, op) == -1 && !op->completed) {
        nbdx_wire_remove(c, op);
        int err = nbd_get_errno();
        log_err("nbd %s %" PRIu64 "@%" PRIu64 ": %s", nbdx_kind_name[op->kind],
                op->len, op->off, nbd_get_error());
        op->err = err ? err : EIO;
        nbdx_push_done(c, op);
    }
}

void nbdx_drain_kicks(struct nbdx_conn *c)
{
    uint64_t v;
    if (read(c->efd, &v, sizeof v) < 0) { /* EAGAIN: already drained */
    }
}

void nbdx_kick(struct nbdx_conn *c)
{
    uint64_t one = 1;
    if (write(c->efd, &one, sizeof one) < 0) {
        /* EAGAIN: the counter is already non-zero, the thread will wake */
    }
}
