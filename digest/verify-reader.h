/* digest/verify-reader.h: the pipelined reader of the verify library.
 *
 * Delivers [0, k->end) of a disk to a sink in offset order while up to
 * 'requests' reads are in flight: the disk is cut into entries, in a
 * ring (the reorder window); a data entry owns one of the buffers, a
 * zero entry (block status said the range reads as zero) has none and
 * is complete at once.  Replies complete out of order; the head entry is
 * fed to the sink as soon as it is complete.  Block status is asked for
 * in windows of bs_span bytes ahead of the reads.
 *
 * A backend does the I/O: nbdferry-verify's own libnbd handles
 * (tools/verify/source-nbd.c) or the mount's connections
 * (fs/readback.c).
 *
 * THREAD MODEL
 * One thread runs the reader (vreader_run, vreader_drain).  vr_done()
 * may run on any thread (it publishes the entry with a release store);
 * vr_extent() and vr_extents_done() run on the reader's thread or while
 * it waits inside the backend's extents() call.
 */
#pragma once

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "digest/verify-sink.h"

struct vreader;

struct vr_ent {
    uint64_t off;
    size_t len;
    unsigned char *buf;                 /* NULL: known zero */
    atomic_bool done;                   /* vr_done() ran (zero: at once) */
    int err;                            /* errno from the reply, or 0 */
};

struct vr_backend {
    /* Start reading e->len bytes at e->off into e->buf; vr_done(e, err)
     * once it completes.  0 or -errno (logged). */
    int (*read)(void *ctx, struct vr_ent *e);
    /* Ask which of [off, off + len) reads as zero: vr_extent() for each
     * extent in order, then vr_extents_done(), possibly before it
     * returns.  0 or -errno (logged). */
    int (*extents)(void *ctx, struct vreader *r, uint64_t off, uint64_t len);
    /* Wait for completions, for at most timeout_ms (-1: no limit). */
    int (*wait)(void *ctx, int timeout_ms);
    unsigned (*in_flight)(void *ctx);   /* requests not yet answered */
    /* Optional: a zero extent at off that must be read all the same:
     * shortens *len to a run that must be read (true) or may be trusted
     * (false). */
    bool (*must_read)(void *ctx, uint64_t off, uint64_t *len);
    /* Optional: a read failed (default: verify_err with the name). */
    void (*read_failed)(void *ctx, const struct vr_ent *e);
    /* Optional: each entry once the sink took it. */
    void (*consumed)(void *ctx, const struct vr_ent *e);
};

struct vr_config {
    const char *name;                   /* for messages */
    unsigned requests;                  /* buffers: reads in flight */
    size_t request_size;                /* bytes per read */
    bool block_status;                  /* ask backend->extents() */
    uint64_t bs_span;                   /* bytes per block status request */
    uint64_t zero_skip_min;             /* shorter zero extents are read */
    uint64_t zero_piece;                /* zero entries at most this long */
    /* A block status that fails or says nothing: true, its window is read
     * as data and the next window asks again; false, block status is off
     * for the rest of the run. */
    bool bs_retry;
};

int  vreader_create(const struct vr_config *c, const struct vr_backend *b,
                    void *ctx, struct sink *k, struct vreader **out);
/* 0, -ECANCELED (the sink's abort flag), SINK_STOP or -errno (logged). */
int  vreader_run(struct vreader *r);
/* After vreader_run: wait for the replies still on their way, for at
 * most timeout_ms (-1: no limit).  True once nothing is in flight. */
bool vreader_drain(struct vreader *r, int timeout_ms);
/* Buffers still with the backend are freed: close it first. */
void vreader_free(struct vreader *r);

/* For the backend. */
void vr_done(struct vr_ent *e, int err);
int  vr_extent(struct vreader *r, uint64_t off, uint64_t len, bool zero);
void vr_extents_done(struct vreader *r, int err);
