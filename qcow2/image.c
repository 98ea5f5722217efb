/* qcow2/image.c: random-access reading of a qcow2 file through its L1 and
 * L2 tables (the way qemu reads it).  No I/O: the caller supplies the
 * pieces the image asks for, and the L2 table a lookup names.  Entries
 * are decoded by the one entry parser (qcow2/entry.c); what is checked
 * here is what the file's size and the header's tables say about them.
 * See qcow2/qcow2.h. */
#include <inttypes.h>
#include <stdlib.h>

#include "qcow2/qcow2-internal.h"

#define HEAD_PROBE 24u                    /* magic .. cluster_bits */

enum want { W_PROBE, W_HEADER, W_L1, W_DONE, W_FAILED };

struct extent {
    const char *name;
    uint64_t off, len;
};

struct qcow2_image {
    enum want want;
    uint64_t file_size;
    size_t head_need;                     /* W_HEADER's length */
    struct qcow2_header h;
    bool have_header;
    uint64_t C;                           /* cluster size */
    unsigned cb;                          /* cluster bits */
    uint64_t E;                           /* L2 entries per table */
    uint64_t span;                        /* disk bytes per L2 table */
    uint32_t l1_n;                        /* L1 entries covering the disk */
    uint64_t *l1;                         /* their L2 tables (0: none) */
    struct extent meta[3];                /* header cluster, L1, refcounts */
};

static int fail(struct qcow2_image *img, int r)
{
    img->want = W_FAILED;
    return r;
}

int qcow2_image_new(uint64_t file_size, struct qcow2_image **out,
                    struct nbdf_err *err)
{
    if (file_size < QCOW2_V2_HEADER_LEN)
        return nbdf_errf(err, -EINVAL, "a file of %" PRIu64 " bytes is "
                         "shorter than a qcow2 header", file_size);
    struct qcow2_image *img = calloc(1, sizeof *img);
    if (!img)
        return nbdf_errf(err, -ENOMEM, "out of memory");
    img->file_size = file_size;
    img->want = W_PROBE;
    *out = img;
    return 0;
}

void qcow2_image_free(struct qcow2_image *img)
{
    if (img) {
        free(img->l1);
        free(img);
    }
}

const struct qcow2_header *qcow2_image_header(const struct qcow2_image *img)
{
    return img->have_header ? &img->h : NULL;
}

int qcow2_image_next(const struct qcow2_image *img, uint64_t *off,
                     size_t *len)
{
    switch (img->want) {
    case W_PROBE:
        *off = 0;
        *len = HEAD_PROBE;
        return 1;
    case W_HEADER:
        *off = 0;
        *len = img->head_need;
        return 1;
    case W_L1:
        *off = img->h.l1_table_offset;
        *len = (size_t) img->l1_n * 8;
        return 1;
    case W_DONE:
        return 0;
    default:
        return -EINVAL;
    }
}

/* ---- the header and the L1 table ---------------------------------------- */

/* Which of the header's metadata [off, off+len) overlaps, or NULL. */
static const char *in_metadata(const struct qcow2_image *img, uint64_t off,
                               uint64_t len)
{
    for (size_t i = 0; i < sizeof img->meta / sizeof *img->meta; i++) {
        const struct extent *m = &img->meta[i];
        if (m->len && off < m->off + m->len && m->off < off + len)
            return m->name;
    }
    return NULL;
}

static bool inside_file(const struct qcow2_image *img, uint64_t off,
                        uint64_t len)
{
    return off <= img->file_size && len <= img->file_size - off;
}

static int supply_header(struct qcow2_image *img, const void *buf,
                         struct nbdf_err *err)
{
    int r = qcow2_header_decode(buf, img->head_need, &img->h, err);
    if (r < 0)
        return r;
    img->have_header = true;
    img->cb = img->h.cluster_bits;
    img->C = qcow2_cluster_size(&img->h);
    img->E = qcow2_l2_entries(&img->h);
    img->span = img->C * img->E;
    img->l1_n = (uint32_t) DIV_ROUND_UP(img->h.size, img->span);
    img->meta[0] = (struct extent) { "the header cluster", 0, img->C };
    img->meta[1] = (struct extent) { "the L1 table", img->h.l1_table_offset,
                                     (uint64_t) img->h.l1_size * 8 };
    img->meta[2] = (struct extent) {
        "the refcount table", img->h.refcount_table_offset,
        (uint64_t) img->h.refcount_table_clusters * img->C };
    if (img->l1_n == 0) {
        img->want = W_DONE;                       /* an empty disk */
        return 0;
    }
    if (!inside_file(img, img->h.l1_table_offset, (uint64_t) img->l1_n * 8))
        return nbdf_errf(err, -EINVAL, "the L1 table at byte %" PRIu64
                         " (%" PRIu64 " bytes) lies past the end of the file "
                         "(%" PRIu64 " bytes)", img->h.l1_table_offset,
                         (uint64_t) img->l1_n * 8, img->file_size);
    if (!(img->l1 = calloc(img->l1_n, 8)))
        return nbdf_errf(err, -ENOMEM, "out of memory for an L1 table of %"
                         PRIu32 " entries", img->l1_n);
    img->want = W_L1;
    return 0;
}

/* An L2 table: a whole cluster inside the file, not on the metadata. */
static int check_l2_table(const struct qcow2_image *img, uint32_t i,
                          uint64_t off, struct nbdf_err *err)
{
    const char *m = in_metadata(img, off, img->C);
    if (m)
        return nbdf_errf(err, -EINVAL, "L1 entry %" PRIu32 " puts an L2 "
                         "table at byte %" PRIu64 ", inside %s", i, off, m);
    if (!inside_file(img, off, img->C))
        return nbdf_errf(err, -EINVAL, "L1 entry %" PRIu32 " puts an L2 "
                         "table at byte %" PRIu64 ", past the end of the "
                         "file (%" PRIu64 " bytes)", i, off, img->file_size);
    return 0;
}

static int supply_l1(struct qcow2_image *img, const uint8_t *b,
                     struct nbdf_err *err)
{
    for (uint32_t i = 0; i < img->l1_n; i++) {
        int r = qcow2_l1_entry(&img->h, i, qcow2_be64(b + (uint64_t) i * 8),
                               &img->l1[i], err);
        if (r == 0 && img->l1[i])
            r = check_l2_table(img, i, img->l1[i], err);
        if (r < 0)
            return r;
    }
    img->want = W_DONE;
    return 0;
}

int qcow2_image_supply(struct qcow2_image *img, const void *buf,
                       struct nbdf_err *err)
{
    int r = 0;

    switch (img->want) {
    case W_PROBE:
        img->head_need = (size_t) MIN((uint64_t) qcow2_header_need(buf,
                                                                   HEAD_PROBE),
                                      img->file_size);
        img->want = W_HEADER;
        return 0;
    case W_HEADER:
        r = supply_header(img, buf, err);
        break;
    case W_L1:
        r = supply_l1(img, buf, err);
        break;
    case W_DONE:
        return nbdf_errf(err, -EINVAL, "image already complete");
    default:
        return nbdf_errf(err, -EINVAL, "image failed earlier");
    }
    return r < 0 ? fail(img, r) : 0;
}

/* ---- lookups ---------------------------------------------------------------- */

enum sub { SUB_UNALLOCATED, SUB_ZERO, SUB_DATA };

static enum sub sub_state(const struct qcow2_entry *en, unsigned k)
{
    return en->alloc >> k & 1 ? SUB_DATA
         : en->zero >> k & 1  ? SUB_ZERO : SUB_UNALLOCATED;
}

static enum qcow2_source absent(const struct qcow2_image *img)
{
    return img->h.backing_file[0] ? QCOW2_SRC_BACKING : QCOW2_SRC_ZERO;
}

static int place_compressed(const struct qcow2_image *img, uint64_t disk_off,
                            uint64_t cl, const struct qcow2_entry *en,
                            struct qcow2_place *out, struct nbdf_err *err)
{
    const char *m = in_metadata(img, en->off, en->clen);
    if (m || en->off >= img->file_size)
        return nbdf_errf(err, -EINVAL, "compressed cluster for disk offset %"
                         PRIu64 " at file byte %" PRIu64 " lies %s%s", cl,
                         en->off, m ? "inside " : "past the end of the file",
                         m ? m : "");
    *out = (struct qcow2_place) {
        QCOW2_SRC_COMPRESSED, en->off, MIN(cl + img->C, img->h.size) - disk_off,
        cl, MIN(en->clen, img->file_size - en->off) };
    return 0;
}

/* Disk bytes [disk_off, ...) of cluster cl (entry en, of the L2 table at
 * l2_off): the run of subclusters alike (a standard entry is one run). */
static int place_run(const struct qcow2_image *img, uint64_t disk_off,
                     uint64_t cl, uint64_t l2_off,
                     const struct qcow2_entry *en, struct qcow2_place *out,
                     struct nbdf_err *err)
{
    uint64_t sc = img->C / 32, in = disk_off - cl;
    unsigned k0 = (unsigned) (in / sc), k1 = k0 + 1;
    enum sub st = sub_state(en, k0);

    while (k1 < 32 && sub_state(en, k1) == st)
        k1++;
    out->len = MIN(cl + k1 * sc, img->h.size) - disk_off;
    out->file_off = 0;
    if (st != SUB_DATA) {
        out->src = st == SUB_ZERO ? QCOW2_SRC_ZERO : absent(img);
        return 0;
    }
    out->src = QCOW2_SRC_FILE;
    out->file_off = en->off + in;
    const char *m = in_metadata(img, en->off, img->C);
    if (!m && en->off < l2_off + img->C && l2_off < en->off + img->C)
        m = "its own L2 table";
    if (m)
        return nbdf_errf(err, -EINVAL, "data cluster for disk offset %" PRIu64
                         " at file byte %" PRIu64 " lies inside %s", cl,
                         en->off, m);
    if (!inside_file(img, out->file_off, out->len))
        return nbdf_errf(err, -EINVAL, "data cluster for disk offset %" PRIu64
                         " at file byte %" PRIu64 " lies past the end of the "
                         "file (%" PRIu64 " bytes)", cl, en->off,
                         img->file_size);
    return 0;
}

int qcow2_image_lookup(const struct qcow2_image *img, uint64_t disk_off,
                       const void *l2, uint64_t l2_off_held,
                       struct qcow2_place *out, struct nbdf_err *err)
{
    if (img->want != W_DONE || disk_off >= img->h.size)
        return nbdf_errf(err, -EINVAL, "lookup of disk offset %" PRIu64
                         " outside the disk or before the image is parsed",
                         disk_off);
    uint64_t g = disk_off >> img->cb, l1i = disk_off / img->span;
    uint64_t l2_off = img->l1[l1i];
    memset(out, 0, sizeof *out);
    if (l2_off == 0) {
        out->src = absent(img);
        out->len = MIN((l1i + 1) * img->span, img->h.size) - disk_off;
        return 0;
    }
    if (!l2 || l2_off_held != l2_off) {
        *out = (struct qcow2_place) { QCOW2_SRC_L2, l2_off, img->C, 0, 0 };
        return 0;
    }
    struct qcow2_entry en;
    const uint8_t *p = (const uint8_t *) l2 +
                       (g % img->E) * (qcow2_extended_l2(&img->h) ? 16 : 8);
    int r = qcow2_entry_decode(&img->h, g, p, &en, err);
    if (r < 0)
        return r;
    uint64_t cl = g << img->cb;
    if (en.compressed)
        return place_compressed(img, disk_off, cl, &en, out, err);
    return place_run(img, disk_off, cl, l2_off, &en, out, err);
}

void qcow2_image_compressed(const struct qcow2_image *img,
                            const struct qcow2_place *p, const void *cdata,
                            struct qcow2_compressed *out)
{
    *out = (struct qcow2_compressed) {
        .disk_off = p->cluster, .file_off = p->file_off, .cdata = cdata,
        .clen = (size_t) p->clen, .cluster_size = (size_t) img->C,
        .place_len = (size_t) MIN(img->C, img->h.size - p->cluster),
        .type = img->h.compression_type,
    };
}
