/* qcow2/stream-internal.h: the stream decoder's state, shared by
 * qcow2/stream.c (the state machine that walks the file) and
 * qcow2/tables.c (what the tables say: the heaps of things ahead, cluster
 * ownership and refcounts, the spool, table parsing, compressed clusters)
 * and qcow2/l2.c (L2 tables: checked whole, then applied).  Private to
 * those files. */
#ifndef NBDFERRY_QCOW2_STREAM_INTERNAL_H
#define NBDFERRY_QCOW2_STREAM_INTERNAL_H

#include "common/fileorder.h"
#include "common/vector.h"
#include "qcow2/qcow2-internal.h"

enum st { ST_HEAD, ST_BODY };

/* Item kinds, kept in the low bits of a cluster-aligned offset. */
enum { IT_NONE = 0, IT_L1, IT_RT, IT_RB, IT_L2, IT_DATA, IT_SKIP, IT_HEAD,
       IT_ANY };
#define IT_MASK ((uint64_t) 0xf)

/* Two-level bitmaps: pages of 2^15 bits (4 KiB) made when first touched,
 * so a far-away claim costs a page, not a bitmap up to it. */
#define PAGE_SHIFT 15
#define NPAGES (QCOW2_MAX_HOST_CLUSTERS >> PAGE_SHIFT)
#define NLOOK 4                       /* passed compressed clusters kept */
#define MAX_ACTIVE 64                 /* compressed ranges open at once */
#define MAX_ITEMS (1u << 24)          /* clusters mapped ahead: 256 MiB */

struct item {                         /* a cluster-aligned thing ahead */
    uint64_t key;                     /* file offset | kind */
    uint32_t arg;                     /* guest cluster, L1 or refcount index */
    uint32_t aux;                     /* DATA: subclusters; L1/RT: bytes */
};

struct citem {                        /* a compressed range */
    uint64_t off;
    uint32_t guest;
    uint32_t len;
};

struct active {                       /* a compressed range being collected */
    struct citem c;
    uint32_t got;
    uint8_t *buf;
};

enum { SP_LIVE = 1, SP_ZERO = 2, SP_DEAD = 3 };
struct spent {                        /* a passed cluster run kept for later */
    uint64_t off, len;                /* LIVE: one cluster; ZERO: a run */
    int state;
};
DEFINE_VECTOR_TYPE(spent_vector, struct spent, 64);
DEFINE_VECTOR_TYPE(page_vector, uint64_t *, 16);

struct heap {
    void *v;
    size_t n, cap, size;              /* size: bytes per element */
};

struct qcow2_stream {
    const struct nbdf_sink *sink;
    void *opaque;
    struct qcow2_stream_opts o;
    int err;                          /* sticky, negative */
    struct nbdf_err e;
    enum st st;
    uint64_t pos;                     /* next file byte expected */

    struct qcow2_header h;
    enum image_kind first;              /* the first write's, if at 0 */
    bool first_seen;
    bool have_header;
    uint64_t C;                       /* cluster size */
    unsigned cb;                      /* cluster bits */
    uint64_t E;                       /* L2 entries per table */
    bool extl2, overlay;
    uint8_t hsmall[24];
    uint8_t *hbuf;                    /* HEAD: the first cluster */
    size_t hgot, hneed;

    /* BODY */
    struct heap items, citems;        /* struct item, struct citem */
    struct item cur;                  /* the current cluster's item */
    uint64_t cur_end;                 /* end of cur (file offset) */
    uint8_t *mbuf;                    /* cur's metadata bytes */
    uint64_t mgot, mlen, mcap;
    uint8_t *cbuf;                    /* an unknown cluster, assembled */
    bool c_nonzero, c_uncovered;      /* any byte / any uncovered byte != 0 */
    uint8_t *tbuf, *xbuf;             /* a cluster each: spool, inflate */
    struct active act[MAX_ACTIVE];
    unsigned nact;
    uint64_t cov_end;                 /* end of the compressed ranges begun */

    bool l1_seen, rt_seen, began, map_complete;
    uint64_t pending_l2, pending_rb;
    uint64_t *reftable;               /* refcount block offsets */
    uint64_t rt_entries;

    uint64_t **used, **comp;          /* a bit per host cluster, paged */
    uint64_t **rczero;                /* refcount 0, from blocks arrived */
    uint8_t *rb_seen;                 /* a byte per refcount table entry */
    unsigned rb_shift;                /* log2(refcount entries per block) */
    struct page_vector pages;         /* every page made, to free */

    struct spent_vector sp;           /* increasing off */
    uint64_t spool_bytes;

    /* The last NLOOK passed clusters that held only compressed data of
     * known clusters: qemu puts the first compressed cluster of a new L2
     * table in the tail of the previous host cluster, before the table,
     * where it may lie wholly inside the last sector of a known range. */
    struct { uint64_t off; uint8_t *buf; } look[NLOOK];
    unsigned look_next;

    struct qcow2_decompressor *dz;
    struct fileorder order;       /* gaps and holes behind the position */
    struct qcow2_stream_stats stats;
};

/* ---- stream.c ------------------------------------------------------------ */

/* Record the first error (sticky) with its message; returns it. */
#define qcow2_fail(s, ...) nbdf_latchf(&(s)->err, &(s)->e, __VA_ARGS__)
/* Drop everything in the spool (the map is complete, or the end). */
void qcow2_spool_drop_all(struct qcow2_stream *s);

/* ---- tables.c ------------------------------------------------------------ */

/* Min-heaps keyed by the first uint64_t of an element. */
int  qcow2_heap_push(struct heap *h, const void *e);    /* -EFBIG, -ENOMEM */
bool qcow2_heap_peek(const struct heap *h, void *e);
void qcow2_heap_pop(struct heap *h);

const char *qcow2_kind_name(int kind);
/* Place bytes (buf NULL: zeros, emitted for an overlay only), clipped to
 * the disk. */
int qcow2_emit_data(struct qcow2_stream *s, uint64_t disk_off,
                    const void *buf, uint64_t len);
int qcow2_emit_zero(struct qcow2_stream *s, uint64_t disk_off, uint64_t len);
/* Tell the sink's optional map hook what an L2 entry says. */
int qcow2_emit_map(struct qcow2_stream *s, uint64_t disk_off, uint64_t len,
                   enum qcow2_map what, uint64_t file_off);

/* Claim host clusters [off, off+len) for a kind (IT_NONE: compressed,
 * shared with other compressed ranges only); refuses a second claim and
 * a claimed cluster whose refcount is 0. */
int  qcow2_claim(struct qcow2_stream *s, uint64_t off, uint64_t len, int what);
bool qcow2_known_free(const struct qcow2_stream *s, uint64_t hc);

/* Passed clusters: a zero run, a spooled cluster. */
/* Bytes [off, off+len) already passed, from the spool or the zero record
 * (-EINVAL if they were not kept); take: a whole cluster, for one use
 * (dropped from the spool after); kept: would read_passed find them? */
int qcow2_read_passed(struct qcow2_stream *s, uint64_t off, uint8_t *out,
                      uint64_t len, const char *what);
int qcow2_take_passed(struct qcow2_stream *s, uint64_t off, uint8_t *out,
                      const char *what);
int qcow2_passed_kept(struct qcow2_stream *s, uint64_t off, uint64_t len,
                      const char *what);
int qcow2_spool_zero_run(struct qcow2_stream *s, uint64_t off, uint64_t len,
                         int state);
int qcow2_spool_put(struct qcow2_stream *s, uint64_t off, const uint8_t *buf);

/* -EINVAL unless off is cluster-aligned ("<what> <index> points at"). */
int qcow2_check_cluster_off(struct qcow2_stream *s, uint64_t off,
                            const char *what, uint64_t index);
int  qcow2_push_item(struct qcow2_stream *s, uint64_t off, int kind,
                     uint32_t arg, uint32_t aux);
int  qcow2_begin(struct qcow2_stream *s);
void qcow2_check_complete(struct qcow2_stream *s);
/* Decompress (or hand over) one collected compressed cluster. */
int qcow2_dispatch(struct qcow2_stream *s, const struct citem *c,
                   const uint8_t *data, size_t len);

/* A table has arrived whole: push or serve what it names.  The L1 table
 * checks every L2 table the stream has passed before applying any. */
int qcow2_l1_parse(struct qcow2_stream *s, const uint8_t *b);
int qcow2_rt_parse(struct qcow2_stream *s, const uint8_t *b);
int qcow2_rb_parse(struct qcow2_stream *s, uint32_t rti, const uint8_t *b);

/* ---- l2.c ---------------------------------------------------------------- */

/* L2 table l1i (b: its cluster).  check: every entry's rules and claims,
 * no sink call; apply: what a checked table says (zeros, data from the
 * spool, clusters ahead pushed); parse: both. */
int qcow2_l2_check(struct qcow2_stream *s, uint32_t l1i, const uint8_t *b);
int qcow2_l2_apply(struct qcow2_stream *s, uint32_t l1i, const uint8_t *b);
int qcow2_l2_parse(struct qcow2_stream *s, uint32_t l1i, const uint8_t *b);

#endif /* NBDFERRY_QCOW2_STREAM_INTERNAL_H */
