/* views/unpackers.h: threads that decompress a format view's compressed
 * units (VMDK grains, qcow2 clusters) and place them on the disk.
 *
 * A format's decoder hands each compressed unit over (its sink, under the
 * ingest lock); unpackers_queue() copies it into a bounded ring, and
 * worker threads, helped by the writing thread, decompress and place it
 * through the format's run hook, so decompression uses several cores.
 * The skeleton (views/imageview.h, its unpack hook) owns the workers and
 * drains them after every request: every
 * unit queued by a write is placed before that write is answered, no job
 * outlives a FUSE request, and a damaged unit fails the write that
 * completed it (and every later one, and close()).  The first error is
 * logged once, here.  Below the skeleton: it knows the view only as the
 * opaque its place hook gets and the name its messages carry.
 *
 * THREAD MODEL
 * Worker threads take jobs from the ring under u->lock (held only to move
 * jobs and counters and to log a job's error, never across a run hook:
 * only the log's lock is taken inside it).  The writing thread, holding
 * the ingest lock (views/imageview.h), runs queued jobs itself when the ring
 * is full or must drain, then waits on u->cond for the jobs workers still
 * run.  Workers never take the ingest lock, so
 * that wait cannot deadlock.  What the writer stores before queueing a
 * job (under the ingest lock) the job's run sees: the ring's lock orders
 * them.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>         /* offsetof */
#include <stdint.h>

#include "common/err.h"

struct unpackers;

/* A format's unit is a struct (its descriptor) with a 'uint64_t disk_off'
 * (where it lands) and a 'const void *cdata' (its compressed bytes, which
 * the queue copies and points at the copy). */
struct unpackers_ops {
    const char *what;             /* "inflater": in messages */
    size_t desc_size, disk_off_at, cdata_at;      /* sizeof, offsetof */
    size_t out_max;               /* room for the largest unit, decompressed */
    /* A decompressor for one thread (the writer has its own). */
    int  (*new_ctx)(void **out);
    void (*free_ctx)(void *ctx);
    /* Decompress a unit into out: its length, or a negative errno with a
     * message, if any, in err; any thread. */
    int64_t (*decode)(void *ctx, const void *desc, void *out,
                      struct nbdf_err *err);
    /* Place decoded bytes on the disk (opaque: unpackers_start()'s, the
     * struct imageview *); any thread. */
    int  (*place)(void *opaque, uint64_t off, const void *buf, size_t len);
};

/* const struct unpackers_ops var for units of type T decompressed by a
 * library's DECODE(C *ctx, const T *unit, void *out, struct nbdf_err *),
 * whose contexts NEW(C **) makes and FREE(C *) frees. */
#define UNPACKERS_OPS(var, what_, T, C, NEW, FREE, DECODE, max, place_)      \
    static int var##_new(void **out) { return NEW((C **) out); }             \
    static void var##_free(void *ctx) { FREE(ctx); }                         \
    static int64_t var##_decode(void *ctx, const void *unit, void *out,      \
                                struct nbdf_err *err)                        \
    {                                                                        \
        return DECODE(ctx, unit, out, err);                                  \
    }                                                                        \
    static const struct unpackers_ops var = {                                \
        .what = what_, .desc_size = sizeof(T),                               \
        .disk_off_at = offsetof(T, disk_off), .cdata_at = offsetof(T, cdata),\
        .out_max = max, .new_ctx = var##_new, .free_ctx = var##_free,        \
        .decode = var##_decode, .place = place_,                             \
    }

/* Start the workers (one fewer than the cores, 1 to 4) for the view
 * named name (borrowed for their life: "disk.vmdk", in messages).  On
 * failure (logged) nothing is left running. */
int  unpackers_start(const char *name, void *opaque,
                     const struct unpackers_ops *ops, struct unpackers **out);
/* Stop and free (NULL is fine); nothing may be queued (drained). */
void unpackers_stop(struct unpackers *u);
/* Queue a copy of the unit desc and its clen compressed bytes (valid
 * during the call only), helping while the ring is full.  The first
 * error of the ingest (already logged) instead. */
int  unpackers_queue(struct unpackers *u, const void *desc,
                     const void *cdata, size_t clen);
/* Every queued unit placed (the writer helping); the first error of the
 * ingest (already logged), cleared for the next ingest if asked. */
int  unpackers_drain(struct unpackers *u, bool clear);
