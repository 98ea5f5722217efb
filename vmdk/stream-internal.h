/* vmdk/stream-internal.h: the stream decoder's state, shared by
 * vmdk/stream.c (the public entry points: state dispatch, feed, finish),
 * vmdk/stream-head.c (the sparse header, then the descriptor, grain
 * directory and grain tables in the overhead) and vmdk/stream-grains.c
 * (monolithicSparse grains; streamOptimized markers, grains, metadata and
 * footer).  Private to those three files. */
#ifndef NBDFERRY_VMDK_STREAM_INTERNAL_H
#define NBDFERRY_VMDK_STREAM_INTERNAL_H

#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/fileorder.h"
#include "common/vector.h"
#include "vmdk/vmdk-internal.h"

enum st { ST_HEADER, ST_PRE, ST_GRAINS, ST_MARKER, ST_GRAIN, ST_SKIP,
          ST_META, ST_FOOTER, ST_END };

#define GD_MAX_ENTRIES (1u << 22)             /* 16 MiB of directory */
#define ALLOC_MAX (1u << 25)                  /* 256 MiB of grain map */

struct gtloc {                                /* a grain table in the file */
    uint64_t off;                             /* bytes */
    uint32_t index;                           /* its GD entry */
};

struct grain {                                /* an allocated sparse grain */
    uint32_t sector;                          /* file sector (a GTE) */
    uint32_t index;                           /* grain number (LBA / grain) */
};
DEFINE_VECTOR_TYPE(grain_vector, struct grain, 1024);

struct vmdk_stream {
    const struct nbdf_sink *sink;
    void *opaque;
    int err;                                  /* sticky, negative */
    struct nbdf_err e;
    enum st st;
    uint64_t pos;                             /* next file byte expected */
    bool began;

    struct vmdk_header h;
    struct vmdk_desc desc;
    uint64_t grain_bytes, capacity, ngrains, overhead;
    uint8_t sect[VMDK_SECTOR];                /* header/marker/footer */
    enum image_kind first_kind;               /* of sector 0, once read */
    size_t got;                               /* bytes collected */
    uint64_t skip_end;                        /* ST_SKIP: until here */

    char *descbuf;                            /* PRE: the descriptor */
    uint64_t desc_off, desc_len;
    bool desc_done;

    /* monolithicSparse */
    uint8_t *gd;
    uint64_t gd_off, gd_len, ngts;
    bool gd_done;
    struct gtloc *gts;
    uint64_t ngtlocs, gt_cur, gt_len;
    uint8_t *gtbuf;
    struct grain_vector grains;
    uint64_t a_cur;

    /* streamOptimized */
    uint8_t *cbuf, *gbuf;                     /* compressed, inflated grain */
    uint64_t cneed, glba, gat;
    uint64_t *seen;                           /* a bit per grain */
    bool tables;                              /* header GD/GTs in the overhead
                                               * were read: they are the map */
    uint64_t *listed;                         /* tables: a bit per grain */
    uint64_t nlisted;                         /* tables: bits set in listed */
    struct vmdk_inflater *z;

    struct fileorder order;       /* gaps and holes behind the position */
    struct vmdk_stream_stats stats;
};

/* The first error (sticky) with its message; returns it. */
#define fail(s, ...) nbdf_latchf(&(s)->err, &(s)->e, __VA_ARGS__)

/* What the header's flags make of the file (vmdk_stream_kind() once
 * begun). */
static inline enum vmdk_kind vmdk_kind_of(const struct vmdk_stream *s)
{
    return s->h.flags & VMDK_FLAG_MARKERS ? VMDK_STREAM_OPTIMIZED
                                          : VMDK_MONOLITHIC_SPARSE;
}

/* Copy n input bytes (zeros if buf is NULL) to dst. */
static inline void take(void *dst, const uint8_t *buf, size_t n)
{
    if (buf)
        memcpy(dst, buf, n);
    else
        memset(dst, 0, n);
}

static inline int begin(struct vmdk_stream *s)
{
    assert(!s->began);
    s->began = true;
    enum vmdk_kind k = vmdk_kind_of(s);
    struct nbdf_begin b = {
        .kind = k, .size = s->capacity, .unit = VMDK_SECTOR,
        .kind_name = k == VMDK_STREAM_OPTIMIZED ? "streamOptimized"
                                                : "monolithicSparse",
    };
    int r = s->sink->begin(s->opaque, &b);
    if (r < 0)
        return fail(s, r, "refused by the destination: %s", strerror(-r));
    return 0;
}

/* ---- stream-head.c: HEADER and PRE --------------------------------------- */

/* One step of each state: consume up to len bytes at s->pos (buf NULL:
 * zeros); return how many, or a negative errno (latched). */
int64_t vmdk_step_header(struct vmdk_stream *s, const uint8_t *buf,
                         uint64_t len);
int64_t vmdk_step_pre(struct vmdk_stream *s, const uint8_t *buf,
                      uint64_t len);
/* End of the overhead: the map is complete; on to GRAINS or MARKER. */
int vmdk_pre_done(struct vmdk_stream *s);

/* ---- stream-grains.c: GRAINS, MARKER, GRAIN, SKIP, META, FOOTER, END ----- */

int64_t vmdk_step_grains(struct vmdk_stream *s, const uint8_t *buf,
                         uint64_t len);
int64_t vmdk_step_marker(struct vmdk_stream *s, const uint8_t *buf,
                         uint64_t len);
int64_t vmdk_step_grain(struct vmdk_stream *s, const uint8_t *buf,
                        uint64_t len);
int64_t vmdk_step_skip(struct vmdk_stream *s, uint64_t len);
/* ST_META and ST_FOOTER. */
int64_t vmdk_step_sector(struct vmdk_stream *s, const uint8_t *buf,
                         uint64_t len);
int64_t vmdk_step_end(struct vmdk_stream *s, const uint8_t *buf,
                      uint64_t len);

#endif /* NBDFERRY_VMDK_STREAM_INTERNAL_H */
