/* qcow2/entry.c: what one L1 or L2 entry says, checked.  The one parser
 * of table entries: the stream decoder (qcow2/l2.c) adds its ownership
 * and file-order rules on top, the image reader (qcow2/image.c) its
 * file-size and metadata rules.  Pure functions. */
#include <inttypes.h>

#include "qcow2/qcow2-internal.h"

static int check_aligned(const struct qcow2_header *h, uint64_t off,
                         const char *what, uint64_t index,
                         struct nbdf_err *err)
{
    if (!IS_ALIGNED(off, qcow2_cluster_size(h)))
        return nbdf_errf(err, -EINVAL, "%s %" PRIu64 " points at byte %"
                         PRIu64 ", not cluster-aligned", what, index, off);
    return 0;
}

int qcow2_l1_entry(const struct qcow2_header *h, uint32_t i, uint64_t e,
                   uint64_t *off, struct nbdf_err *err)
{
    if (e & QCOW2_L1_RESERVED)
        return nbdf_errf(err, -EINVAL, "L1 entry %" PRIu32 " (0x%016" PRIx64
                         ") has reserved bits set", i, e);
    *off = e & QCOW2_L1_OFFSET_MASK;
    return check_aligned(h, *off, "L1 entry", i, err);
}

static int decode_compressed(const struct qcow2_header *h, uint64_t g,
                             uint64_t e, const uint8_t *p,
                             struct qcow2_entry *out, struct nbdf_err *err)
{
    uint64_t d = g << h->cluster_bits;

    if (qcow2_extended_l2(h) && qcow2_be64(p + 8) != 0)
        return nbdf_errf(err, -EINVAL, "compressed L2 entry for disk offset %"
                         PRIu64 " with a subcluster bitmap", d);
    e &= ~(QCOW2_OFLAG_COMPRESSED | QCOW2_OFLAG_COPIED);
    out->compressed = true;
    qcow2_compressed_range(e, h->cluster_bits, &out->off, &out->clen);
    if (out->off < qcow2_cluster_size(h) || out->off >= QCOW2_MAX_HOST_OFFSET)
        return nbdf_errf(err, -EINVAL, "compressed cluster for disk offset %"
                         PRIu64 " at file byte %" PRIu64 " (inside the header "
                         "or past 2^56)", d, out->off);
    return 0;
}

static int decode_standard(const struct qcow2_header *h, uint64_t g,
                           uint64_t e, struct qcow2_entry *out,
                           struct nbdf_err *err)
{
    uint64_t d = g << h->cluster_bits;

    if (e & QCOW2_L2_RESERVED)
        return nbdf_errf(err, -EINVAL, "L2 entry for disk offset %" PRIu64
                         " (0x%016" PRIx64 ") has reserved bits set", d, e);
    out->off = e & QCOW2_L2_OFFSET_MASK;
    if (check_aligned(h, out->off, "the L2 entry for disk cluster", g, err) < 0)
        return -EINVAL;
    if (e & QCOW2_OFLAG_ZERO) {
        if (h->version == 2)
            return nbdf_errf(err, -EINVAL, "L2 entry for disk offset %" PRIu64
                             " has the zero flag, which version 2 does not "
                             "have", d);
        out->zero = QCOW2_ALL_SUBCLUSTERS;
    } else if (out->off)
        out->alloc = QCOW2_ALL_SUBCLUSTERS;
    return 0;
}

static int decode_extended(const struct qcow2_header *h, uint64_t g,
                           uint64_t e, uint64_t bm, struct qcow2_entry *out,
                           struct nbdf_err *err)
{
    uint64_t d = g << h->cluster_bits;

    out->off = e & QCOW2_L2_OFFSET_MASK;
    out->alloc = (uint32_t) bm;
    out->zero = (uint32_t) (bm >> 32);
    if (e & (QCOW2_L2_RESERVED | QCOW2_OFLAG_ZERO))
        return nbdf_errf(err, -EINVAL, "L2 entry for disk offset %" PRIu64
                         " (0x%016" PRIx64 ") has reserved bits set", d, e);
    if (out->alloc & out->zero)
        return nbdf_errf(err, -EINVAL, "L2 entry for disk offset %" PRIu64
                         ": subclusters both allocated and zero (bitmap "
                         "0x%016" PRIx64 ")", d, bm);
    if (check_aligned(h, out->off, "the L2 entry for disk cluster", g, err) < 0)
        return -EINVAL;
    if (out->alloc && out->off == 0)
        return nbdf_errf(err, -EINVAL, "L2 entry for disk offset %" PRIu64
                         ": allocated subclusters but no cluster offset", d);
    return 0;
}

int qcow2_entry_decode(const struct qcow2_header *h, uint64_t g,
                       const uint8_t *p, struct qcow2_entry *out,
                       struct nbdf_err *err)
{
    uint64_t e = qcow2_be64(p);

    memset(out, 0, sizeof *out);
    if (e & QCOW2_OFLAG_COMPRESSED)
        return decode_compressed(h, g, e, p, out, err);
    if (qcow2_extended_l2(h))
        return decode_extended(h, g, e, qcow2_be64(p + 8), out, err);
    return decode_standard(h, g, e, out, err);
}
