/* qcow2/synth.c: a qcow2 v3 of a raw disk, produced on read.
 *
 * Layout in clusters, metadata first (see qcow2/qcow2.h): header,
 * refcount table, refcount blocks, L1 table, L2 tables, data.  Every
 * cluster of the file has refcount 1 and nothing else is referenced, so
 * qemu-img check finds it clean.  The refcount blocks must count
 * themselves, so their number is a fixed point (layout()).  Every
 * metadata cluster is computed from the allocation list when read; data
 * clusters are read from the disk straight into the caller's buffer.
 */
#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/unitlist.h"
#include "qcow2/qcow2-internal.h"

struct layout {
    uint64_t clusters;                    /* of the disk */
    uint64_t l1_entries, l1_clusters;
    uint64_t rt_clusters, rb_clusters;
    uint64_t rt_at, rb_at, l1_at, l2_at, data_at, total;   /* clusters */
};

struct qcow2_synth {
    uint64_t disk_size, C;
    uint32_t cb;
    bool sealed;
    uint32_t *alloc;                      /* allocated clusters, increasing */
    uint64_t nalloc, alloc_cap;
    uint32_t *tlist;                      /* L1 indexes with an L2 table */
    uint64_t *tfirst;                     /* their first index in alloc */
    uint64_t ntables;
    struct layout l;
    uint8_t *tmp;                         /* one metadata cluster */
};

/* Sizes for 'clusters' allocated clusters in 'tables' L2 tables; false
 * past qemu's table limits. */
static bool layout(uint64_t disk_size, uint32_t cb, uint64_t clusters,
                   uint64_t tables, struct layout *l)
{
    uint64_t C = 1ull << cb, rb_entries = C / 2, l2_entries = C / 8;

    memset(l, 0, sizeof *l);
    l->clusters = DIV_ROUND_UP(disk_size, C);
    l->l1_entries = DIV_ROUND_UP(l->clusters, l2_entries);
    l->l1_clusters = DIV_ROUND_UP(l->l1_entries * 8, C);
    if (l->l1_entries * 8 > QCOW2_MAX_L1_BYTES || clusters > l->clusters ||
        tables > l->l1_entries)
        return false;
    uint64_t fixed = 1 + l->l1_clusters + tables + clusters;
    uint64_t rb = 1, rt = 1;
    for (;;) {
        uint64_t total = fixed + rt + rb;
        uint64_t rb2 = DIV_ROUND_UP(total, rb_entries);
        uint64_t rt2 = DIV_ROUND_UP(rb2 * 8, C);
        if (rb2 == rb && rt2 == rt)
            break;
        rb = MAX(rb, rb2);                /* grows only: terminates */
        rt = MAX(rt, rt2);
    }
    if (rt * C > QCOW2_MAX_REFTABLE_BYTES)
        return false;
    l->rt_clusters = rt;
    l->rb_clusters = rb;
    l->rt_at = 1;
    l->rb_at = l->rt_at + rt;
    l->l1_at = l->rb_at + rb;
    l->l2_at = l->l1_at + l->l1_clusters;
    l->data_at = l->l2_at + tables;
    l->total = l->data_at + clusters;
    return true;
}

uint64_t qcow2_synth_size(uint64_t disk_size, uint32_t cluster_bits,
                          uint64_t clusters, uint64_t tables)
{
    struct layout l;
    if (disk_size == 0 || cluster_bits < QCOW2_MIN_CLUSTER_BITS ||
        cluster_bits > QCOW2_MAX_CLUSTER_BITS ||
        !layout(disk_size, cluster_bits, clusters, tables, &l))
        return 0;
    return l.total << cluster_bits;
}

int qcow2_synth_new(uint64_t disk_size, uint32_t cluster_bits,
                    struct qcow2_synth **out, struct nbdf_err *err)
{
    struct layout l;

    if (disk_size == 0)
        return nbdf_errf(err, -EINVAL, "disk size 0");
    if (cluster_bits < QCOW2_MIN_CLUSTER_BITS ||
        cluster_bits > QCOW2_MAX_CLUSTER_BITS)
        return nbdf_errf(err, -EINVAL, "cluster size 2^%" PRIu32 " (must be "
                         "512 B to 2 MiB)", cluster_bits);
    if (DIV_ROUND_UP(disk_size, 1ull << cluster_bits) >= QCOW2_MAX_GUEST_CLUSTERS ||
        !layout(disk_size, cluster_bits, DIV_ROUND_UP(disk_size,
                1ull << cluster_bits), DIV_ROUND_UP(disk_size,
                (1ull << cluster_bits) * ((1ull << cluster_bits) / 8)), &l))
        return nbdf_errf(err, -EFBIG, "a disk of %" PRIu64 " bytes needs "
                         "larger tables than qemu reads with %" PRIu64
                         "-byte clusters (use larger clusters)", disk_size,
                         (uint64_t) 1 << cluster_bits);
    struct qcow2_synth *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    s->disk_size = disk_size;
    s->cb = cluster_bits;
    s->C = 1ull << cluster_bits;
    *out = s;
    return 0;
}

void qcow2_synth_free(struct qcow2_synth *s)
{
    if (!s)
        return;
    free(s->alloc);
    free(s->tlist);
    free(s->tfirst);
    free(s->tmp);
    free(s);
}

int qcow2_synth_allocate(struct qcow2_synth *s, uint64_t disk_off,
                         uint64_t len)
{
    if (s->sealed)
        return -EINVAL;
    return unitlist_allocate(&s->alloc, &s->nalloc, &s->alloc_cap,
                             s->disk_size, s->C, disk_off, len);
}

int qcow2_synth_seal(struct qcow2_synth *s)
{
    if (s->sealed)
        return 0;
    uint64_t E = s->C / 8, n = s->nalloc ? s->nalloc : 1;
    s->tlist = malloc(n * sizeof *s->tlist);
    s->tfirst = malloc(n * sizeof *s->tfirst);
    s->tmp = malloc(s->C);
    if (!s->tlist || !s->tfirst || !s->tmp)
        return -ENOMEM;
    for (uint64_t i = 0; i < s->nalloc; i++) {
        uint32_t t = (uint32_t) (s->alloc[i] / E);
        if (s->ntables == 0 || s->tlist[s->ntables - 1] != t) {
            s->tlist[s->ntables] = t;
            s->tfirst[s->ntables++] = i;
        }
    }
    if (!layout(s->disk_size, s->cb, s->nalloc, s->ntables, &s->l))
        return -EFBIG;                    /* checked at new: cannot happen */
    s->sealed = true;
    return 0;
}

uint64_t qcow2_synth_file_size(const struct qcow2_synth *s)
{
    assert(s->sealed);
    return s->l.total << s->cb;
}

/* ---- metadata clusters ------------------------------------------------------ */

static void make_header(const struct qcow2_synth *s, uint8_t *out)
{
    struct qcow2_header h = {
        .version = 3, .cluster_bits = s->cb, .size = s->disk_size,
        .l1_size = (uint32_t) s->l.l1_entries,
        .l1_table_offset = s->l.l1_at << s->cb,
        .refcount_table_offset = s->l.rt_at << s->cb,
        .refcount_table_clusters = (uint32_t) s->l.rt_clusters,
        .refcount_order = 4, .header_length = QCOW2_V3_HEADER_LEN,
    };
    memset(out, 0, s->C);                 /* zeros: end of extensions */
    qcow2_header_encode(&h, out);
}

static void make_reftable(const struct qcow2_synth *s, uint64_t k, uint8_t *out)
{
    uint64_t per = s->C / 8;
    memset(out, 0, s->C);
    for (uint64_t i = 0; i < per; i++) {
        uint64_t j = k * per + i;
        if (j >= s->l.rb_clusters)
            break;
        qcow2_put64(out + i * 8, (s->l.rb_at + j) << s->cb);
    }
}

static void make_refblock(const struct qcow2_synth *s, uint64_t j, uint8_t *out)
{
    uint64_t per = s->C / 2;
    memset(out, 0, s->C);
    for (uint64_t i = 0; i < per && j * per + i < s->l.total; i++)
        out[i * 2 + 1] = 1;               /* big-endian 16-bit 1 */
}

/* Rank of L2 table t among the allocated ones, or -1. */
static int64_t table_rank(const struct qcow2_synth *s, uint64_t t)
{
    uint64_t lo = 0, hi = s->ntables;
    while (lo < hi) {
        uint64_t mid = (lo + hi) / 2;
        if (s->tlist[mid] < t)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < s->ntables && s->tlist[lo] == t ? (int64_t) lo : -1;
}

static void make_l1(const struct qcow2_synth *s, uint64_t k, uint8_t *out)
{
    uint64_t per = s->C / 8;
    memset(out, 0, s->C);
    for (uint64_t i = 0; i < per && k * per + i < s->l.l1_entries; i++) {
        int64_t rank = table_rank(s, k * per + i);
        if (rank >= 0)
            qcow2_put64(out + i * 8, ((s->l.l2_at + (uint64_t) rank) << s->cb) |
                        QCOW2_OFLAG_COPIED);
    }
}

static void make_l2(const struct qcow2_synth *s, uint64_t t, uint8_t *out)
{
    uint64_t E = s->C / 8, base = (uint64_t) s->tlist[t] * E;
    memset(out, 0, s->C);
    for (uint64_t i = s->tfirst[t]; i < s->nalloc && s->alloc[i] < base + E;
         i++)
        qcow2_put64(out + (s->alloc[i] - base) * 8,
                    ((s->l.data_at + i) << s->cb) | QCOW2_OFLAG_COPIED);
}

static void make_meta(const struct qcow2_synth *s, uint64_t ci, uint8_t *out)
{
    const struct layout *l = &s->l;
    if (ci == 0)
        make_header(s, out);
    else if (ci < l->rb_at)
        make_reftable(s, ci - l->rt_at, out);
    else if (ci < l->l1_at)
        make_refblock(s, ci - l->rb_at, out);
    else if (ci < l->l2_at)
        make_l1(s, ci - l->l1_at, out);
    else
        make_l2(s, ci - l->l2_at, out);
}

/* Bytes [in, in+n) of data cluster 'rank' into out. */
static int read_data(const struct qcow2_synth *s, uint64_t rank, uint64_t in,
                     uint8_t *out, uint64_t n, qcow2_read_disk_fn rd,
                     void *opaque)
{
    uint64_t disk = ((uint64_t) s->alloc[rank] << s->cb) + in;
    uint64_t have = disk < s->disk_size ? MIN(n, s->disk_size - disk) : 0;
    if (have) {
        int r = rd(opaque, disk, out, (size_t) have);
        if (r < 0)
            return r;
    }
    memset(out + have, 0, n - have);      /* past the disk's end */
    return 0;
}

int64_t qcow2_synth_read(struct qcow2_synth *s, uint64_t off, void *buf,
                         size_t len, qcow2_read_disk_fn read_disk,
                         void *opaque)
{
    uint64_t size = qcow2_synth_file_size(s), done = 0;

    if (off >= size)
        return 0;
    len = (size_t) MIN((uint64_t) len, size - off);
    while (done < len) {
        uint64_t at = off + done, ci = at >> s->cb, in = at & (s->C - 1);
        uint64_t n = MIN(len - done, s->C - in);
        uint8_t *out = (uint8_t *) buf + done;
        if (ci >= s->l.data_at) {
            int r = read_data(s, ci - s->l.data_at, in, out, n, read_disk,
                              opaque);
            if (r < 0)
                return r;
        } else {
            make_meta(s, ci, s->tmp);
            memcpy(out, s->tmp + in, n);
        }
        done += n;
    }
    return (int64_t) done;
}
