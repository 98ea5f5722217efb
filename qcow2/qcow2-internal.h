/* qcow2/qcow2-internal.h: private to qcow2/.  Other modules include
 * qcow2/qcow2.h. */
#ifndef NBDFERRY_QCOW2_INTERNAL_H
#define NBDFERRY_QCOW2_INTERNAL_H

#include <endian.h>
#include <errno.h>
#include <stdarg.h>
#include <string.h>

#include "common/iszero.h"
#include "common/minmax.h"
#include "common/rounding.h"
#include "qcow2/qcow2.h"

/* ---- on-disk layout (big-endian, converted once in format.c) ------------ */

struct qcow2_header_disk {
    uint32_t magic;
    uint32_t version;
    uint64_t backing_file_offset;
    uint32_t backing_file_size;
    uint32_t cluster_bits;
    uint64_t size;
    uint32_t crypt_method;
    uint32_t l1_size;
    uint64_t l1_table_offset;
    uint64_t refcount_table_offset;
    uint32_t refcount_table_clusters;
    uint32_t nb_snapshots;
    uint64_t snapshots_offset;
    /* version 3 */
    uint64_t incompatible_features;
    uint64_t compatible_features;
    uint64_t autoclear_features;
    uint32_t refcount_order;
    uint32_t header_length;
    uint8_t  compression_type;                    /* if header_length > 104 */
    uint8_t  pad[7];
} __attribute__((packed));
_Static_assert(sizeof(struct qcow2_header_disk) == 112, "v3 header + type");
_Static_assert(__builtin_offsetof(struct qcow2_header_disk,
                                  incompatible_features) == 72, "v2 ends at 72");

/* L1 entry: bits 9..55 the L2 table's offset, bit 63 "copied". */
#define QCOW2_OFLAG_COPIED     ((uint64_t) 1 << 63)
#define QCOW2_OFLAG_COMPRESSED ((uint64_t) 1 << 62)
#define QCOW2_OFLAG_ZERO       ((uint64_t) 1)
#define QCOW2_L1_OFFSET_MASK   ((uint64_t) 0x00fffffffffffe00)
#define QCOW2_L1_RESERVED      ((uint64_t) 0x7f000000000001ff)
/* Standard L2 entry: bits 9..55 offset; 1..8 and 56..61 reserved. */
#define QCOW2_L2_OFFSET_MASK   ((uint64_t) 0x00fffffffffffe00)
#define QCOW2_L2_RESERVED      ((uint64_t) 0x3f000000000001fe)
/* Refcount table entry: bits 9..63 the block's offset, 0..8 reserved. */
#define QCOW2_RT_OFFSET_MASK   ((uint64_t) 0xfffffffffffffe00)

static inline uint64_t qcow2_be64(const void *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return be64toh(v);
}
static inline uint32_t qcow2_be32(const void *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return be32toh(v);
}
static inline void qcow2_put64(void *p, uint64_t v)
{
    v = htobe64(v);
    memcpy(p, &v, 8);
}

/* A compressed L2 entry's host byte offset and the length its sectors
 * cover (to the end of the last one), for clusters of 2^cluster_bits. */
static inline void qcow2_compressed_range(uint64_t entry, uint32_t cluster_bits,
                                          uint64_t *off, uint64_t *len)
{
    unsigned x = 62 - (cluster_bits - 8);
    uint64_t sectors = ((entry >> x) & ((1ull << (cluster_bits - 8)) - 1)) + 1;
    *off = entry & ((1ull << x) - 1);
    *len = sectors * 512 - (*off & 511);
}

/* ---- entry.c: one L1 or L2 entry, decoded and checked (the one parser
 * of table entries, for the stream decoder and the image reader) ------- */

#define QCOW2_ALL_SUBCLUSTERS UINT32_MAX

/* What an L2 entry says.  Standard entries are all or nothing: a data
 * cluster has every subcluster allocated, a zero cluster every one zero. */
struct qcow2_entry {
    bool compressed;
    uint64_t off;                 /* the host cluster (0: none; a zero
                                   * cluster may keep its preallocated
                                   * one), or the compressed data's byte */
    uint64_t clen;                /* compressed: bytes its sectors cover */
    uint32_t alloc, zero;         /* subclusters (bit k: the k-th 32nd) */
};

/* The L2 entry of guest cluster g at p (8 bytes, 16 with extended L2
 * entries), checked: reserved bits, alignment, the zero flag of version
 * 2, subclusters both allocated and zero or allocated without a cluster,
 * a compressed entry with a bitmap, compressed data in the header or past
 * 2^56.  -EINVAL with the rule. */
int qcow2_entry_decode(const struct qcow2_header *h, uint64_t g,
                       const uint8_t *p, struct qcow2_entry *out,
                       struct nbdf_err *err);

/* L1 entry i (e, host order): *off is its L2 table (0: none).  Reserved
 * bits and alignment checked; -EINVAL with the rule. */
int qcow2_l1_entry(const struct qcow2_header *h, uint32_t i, uint64_t e,
                   uint64_t *off, struct nbdf_err *err);

#endif /* NBDFERRY_QCOW2_INTERNAL_H */
