/* qcow2/format.c: header codec and checks, lint, decompression.  Pure
 * functions over caller buffers. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include <libdeflate.h>
#include <zlib.h>
#include <zstd.h>

#include "qcow2/qcow2-internal.h"

/* ---- fixed header ---------------------------------------------------------- */

static void header_from_disk(const uint8_t *b, size_t len,
                             struct qcow2_header *h)
{
    struct qcow2_header_disk d;

    memset(&d, 0, sizeof d);
    memcpy(&d, b, MIN(len, sizeof d));
    memset(h, 0, sizeof *h);
    h->version = be32toh(d.version);
    h->backing_file_offset = be64toh(d.backing_file_offset);
    h->backing_file_size = be32toh(d.backing_file_size);
    h->cluster_bits = be32toh(d.cluster_bits);
    h->size = be64toh(d.size);
    h->crypt_method = be32toh(d.crypt_method);
    h->l1_size = be32toh(d.l1_size);
    h->l1_table_offset = be64toh(d.l1_table_offset);
    h->refcount_table_offset = be64toh(d.refcount_table_offset);
    h->refcount_table_clusters = be32toh(d.refcount_table_clusters);
    h->nb_snapshots = be32toh(d.nb_snapshots);
    h->snapshots_offset = be64toh(d.snapshots_offset);
    if (h->version == 2) {
        h->refcount_order = 4;
        h->header_length = QCOW2_V2_HEADER_LEN;
        return;
    }
    h->incompatible = be64toh(d.incompatible_features);
    h->compatible = be64toh(d.compatible_features);
    h->autoclear = be64toh(d.autoclear_features);
    h->refcount_order = be32toh(d.refcount_order);
    h->header_length = be32toh(d.header_length);
    if (h->header_length > 104 && len > 104)
        h->compression_type = d.compression_type;
}

void qcow2_header_encode(const struct qcow2_header *h, void *buf)
{
    struct qcow2_header_disk d;

    memset(&d, 0, sizeof d);
    d.magic = htobe32(QCOW2_MAGIC);
    d.version = htobe32(3);
    d.backing_file_offset = htobe64(h->backing_file_offset);
    d.backing_file_size = htobe32(h->backing_file_size);
    d.cluster_bits = htobe32(h->cluster_bits);
    d.size = htobe64(h->size);
    d.crypt_method = htobe32(h->crypt_method);
    d.l1_size = htobe32(h->l1_size);
    d.l1_table_offset = htobe64(h->l1_table_offset);
    d.refcount_table_offset = htobe64(h->refcount_table_offset);
    d.refcount_table_clusters = htobe32(h->refcount_table_clusters);
    d.nb_snapshots = htobe32(h->nb_snapshots);
    d.snapshots_offset = htobe64(h->snapshots_offset);
    d.incompatible_features = htobe64(h->incompatible);
    d.compatible_features = htobe64(h->compatible);
    d.autoclear_features = htobe64(h->autoclear);
    d.refcount_order = htobe32(h->refcount_order);
    d.header_length = htobe32(h->header_length);
    d.compression_type = h->compression_type;
    memset(buf, 0, h->header_length);
    memcpy(buf, &d, MIN((size_t) h->header_length, sizeof d));
}

size_t qcow2_header_need(const void *buf, size_t len)
{
    if (len < 24)
        return 24;
    uint32_t bits = qcow2_be32((const uint8_t *) buf + 20);
    if (bits < QCOW2_MIN_CLUSTER_BITS || bits > QCOW2_MAX_CLUSTER_BITS)
        return 24;                    /* decode says why */
    return (size_t) 1 << bits;
}

static int check_identity(const uint8_t *b, size_t len,
                          const struct qcow2_header *h, struct nbdf_err *err)
{
    if (len < 4 || qcow2_be32(b) != QCOW2_MAGIC)
        return nbdf_errf(err, -EMEDIUMTYPE, "not a qcow2 image: no \"QFI\\xfb\" "
                         "magic at byte 0");
    /* The version and cluster_bits lie in the first 24 bytes, which is
     * all a stream waits for when cluster_bits is out of range: name
     * them, not a short header. */
    if (len >= 8 && h->version != 2 && h->version != 3)
        return nbdf_errf(err, -EMEDIUMTYPE, "qcow2 version %" PRIu32 " (only "
                         "2 and 3 are defined; version 1 is qcow, not qcow2)",
                         h->version);
    if (len >= 24 && (h->cluster_bits < QCOW2_MIN_CLUSTER_BITS ||
                      h->cluster_bits > QCOW2_MAX_CLUSTER_BITS))
        return nbdf_errf(err, -EINVAL, "cluster_bits %" PRIu32 " (must be "
                         "%u..%u: 512 B to 2 MiB clusters)", h->cluster_bits,
                         QCOW2_MIN_CLUSTER_BITS, QCOW2_MAX_CLUSTER_BITS);
    if (len < QCOW2_V2_HEADER_LEN)
        return nbdf_errf(err, -EINVAL, "the header is cut short (%zu bytes)",
                         len);
    if (h->version == 3) {
        if (h->header_length < QCOW2_V3_HEADER_LEN ||
            h->header_length % 8 != 0 ||
            h->header_length > qcow2_cluster_size(h))
            return nbdf_errf(err, -EINVAL, "header_length %" PRIu32 " (must be "
                             "a multiple of 8 from 104 to the cluster size)",
                             h->header_length);
        if (len < h->header_length)
            return nbdf_errf(err, -EINVAL, "the header is cut short (%zu of "
                             "%" PRIu32 " bytes)", len, h->header_length);
    }
    if (h->refcount_order > 6)
        return nbdf_errf(err, -EINVAL, "refcount_order %" PRIu32 " (at most 6: "
                         "64-bit refcounts)", h->refcount_order);
    return 0;
}

/* ---- header extensions ------------------------------------------------------ */

struct exts {
    const uint8_t *features;                      /* feature name table */
    uint32_t features_len;
    bool data_file, crypto;
};

static void copy_string(char *dst, size_t cap, const uint8_t *src, size_t n)
{
    n = MIN(n, cap - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
    for (size_t i = 0; i < n; i++)            /* printable: it is logged */
        if ((unsigned char) dst[i] < 0x20 || dst[i] == 0x7f)
            dst[i] = '?';
}

static int read_extensions(const uint8_t *b, size_t len, struct qcow2_header *h,
                           struct exts *x, struct nbdf_err *err)
{
    uint64_t end = MIN((uint64_t) len, qcow2_cluster_size(h));
    uint64_t off = h->header_length;

    for (;;) {
        if (off + 8 > end)
            return nbdf_errf(err, -EINVAL, "header extension at byte %" PRIu64
                             " runs past the first cluster", off);
        uint32_t type = qcow2_be32(b + off), elen = qcow2_be32(b + off + 4);
        if (type == QCOW2_EXT_END) {
            h->ext_end = off + 8;
            return 0;
        }
        if (elen > end - off - 8)
            return nbdf_errf(err, -EINVAL, "header extension 0x%08" PRIx32
                             " at byte %" PRIu64 " claims %" PRIu32 " bytes, "
                             "past the first cluster", type, off, elen);
        const uint8_t *p = b + off + 8;
        switch (type) {
        case QCOW2_EXT_BACKING_FMT:
            copy_string(h->backing_format, sizeof h->backing_format, p, elen);
            break;
        case QCOW2_EXT_FEATURES:
            x->features = p;
            x->features_len = elen;
            break;
        case QCOW2_EXT_BITMAPS:
            h->has_bitmaps = true;
            break;
        case QCOW2_EXT_CRYPTO:
            x->crypto = true;
            break;
        case QCOW2_EXT_DATA_FILE:
            x->data_file = true;
            break;
        default:
            break;                            /* unknown: skipped by length */
        }
        off += 8 + ROUND_UP((uint64_t) elen, 8);
    }
}

/* The name of incompatible bit 'bit' from the feature name table. */
static void feature_name(const struct exts *x, unsigned bit, char *out,
                         size_t cap)
{
    snprintf(out, cap, "bit %u", bit);
    for (uint32_t i = 0; i + 48 <= x->features_len; i += 48) {
        const uint8_t *e = x->features + i;
        if (e[0] == 0 && e[1] == bit) {
            char name[47];
            copy_string(name, sizeof name, e + 2, strnlen((const char *) e + 2, 46));
            snprintf(out, cap, "bit %u, \"%s\"", bit, name);
            return;
        }
    }
}

static int check_features(const struct qcow2_header *h, const struct exts *x,
                          struct nbdf_err *err)
{
    const uint64_t known = QCOW2_INCOMPAT_DIRTY | QCOW2_INCOMPAT_CORRUPT |
                           QCOW2_INCOMPAT_DATA_FILE | QCOW2_INCOMPAT_COMPRESSION |
                           QCOW2_INCOMPAT_EXTL2;
    char name[80];

    if (h->crypt_method != 0 || x->crypto)
        return nbdf_errf(err, -EMEDIUMTYPE, "the image is encrypted (%s): "
                         "decrypt it first (qemu-img convert with the key)",
                         h->crypt_method == 1 ? "AES" : h->crypt_method == 2
                         ? "LUKS" : "unknown method");
    if (h->incompatible & ~known) {
        unsigned bit = (unsigned) __builtin_ctzll(h->incompatible & ~known);
        feature_name(x, bit, name, sizeof name);
        return nbdf_errf(err, -EMEDIUMTYPE, "unknown incompatible feature "
                         "(%s): this image needs a newer reader", name);
    }
    if (h->incompatible & QCOW2_INCOMPAT_DIRTY)
        return nbdf_errf(err, -EMEDIUMTYPE, "the dirty bit is set: the image "
                         "was not closed cleanly and its refcounts may be "
                         "wrong (run qemu-img check -r all on it first)");
    if (h->incompatible & QCOW2_INCOMPAT_CORRUPT)
        return nbdf_errf(err, -EMEDIUMTYPE, "the corrupt bit is set: qemu "
                         "found this image's metadata damaged (qemu-img "
                         "check -r all may repair it)");
    if ((h->incompatible & QCOW2_INCOMPAT_DATA_FILE) || x->data_file ||
        (h->autoclear & QCOW2_AUTOCLEAR_DATA_RAW))
        return nbdf_errf(err, -EMEDIUMTYPE, "the image keeps its data in an "
                         "external data file, which is not read here (that "
                         "file is itself the raw disk: copy or verify it "
                         "instead)");
    bool ctype = h->incompatible & QCOW2_INCOMPAT_COMPRESSION;
    if (ctype && (h->header_length <= 104 || h->compression_type == 0))
        return nbdf_errf(err, -EINVAL, "the compression type bit is set but "
                         "the header has no non-zero compression_type");
    if (!ctype && h->compression_type != 0)
        return nbdf_errf(err, -EINVAL, "compression_type %u without the "
                         "compression type bit", h->compression_type);
    if (h->compression_type > QCOW2_COMPRESS_ZSTD)
        return nbdf_errf(err, -EMEDIUMTYPE, "compression type %u (only 0, "
                         "zlib, and 1, zstd, are defined)", h->compression_type);
    if ((h->incompatible & QCOW2_INCOMPAT_EXTL2) && h->cluster_bits < 14)
        return nbdf_errf(err, -EINVAL, "extended L2 entries with %" PRIu64
                         "-byte clusters (they need 16 KiB or more)",
                         qcow2_cluster_size(h));
    return 0;
}

/* ---- tables --------------------------------------------------------------- */

struct extent {
    const char *name;
    uint64_t off, len;
};

static int check_table(const struct qcow2_header *h, const char *name,
                       uint64_t off, uint64_t len, struct nbdf_err *err)
{
    if (!IS_ALIGNED(off, qcow2_cluster_size(h)))
        return nbdf_errf(err, -EINVAL, "%s at byte %" PRIu64 " is not "
                         "cluster-aligned", name, off);
    if (off >= QCOW2_MAX_HOST_OFFSET || len > QCOW2_MAX_HOST_OFFSET - off)
        return nbdf_errf(err, -EINVAL, "%s at byte %" PRIu64 " (%" PRIu64
                         " bytes) lies past 2^56", name, off, len);
    return 0;
}

static int check_tables(const struct qcow2_header *h, struct nbdf_err *err)
{
    uint64_t c = qcow2_cluster_size(h);
    uint64_t per_l1 = c * qcow2_l2_entries(h);        /* disk bytes per L1 entry */
    uint64_t need = h->size / per_l1 + (h->size % per_l1 != 0);
    int r;

    if ((uint64_t) h->l1_size * 8 > QCOW2_MAX_L1_BYTES)
        return nbdf_errf(err, -EFBIG, "L1 table of %" PRIu32 " entries "
                         "(qemu's limit is %u)", h->l1_size,
                         QCOW2_MAX_L1_BYTES / 8);
    if (h->l1_size < need)
        return nbdf_errf(err, -EINVAL, "L1 table of %" PRIu32 " entries is "
                         "too small for a %" PRIu64 "-byte disk (needs %"
                         PRIu64 ")", h->l1_size, h->size, need);
    if (h->size / c + 1 > QCOW2_MAX_GUEST_CLUSTERS)
        return nbdf_errf(err, -EFBIG, "disk of %" PRIu64 " bytes: more than "
                         "2^32 clusters of %" PRIu64 " bytes", h->size, c);
    if (h->l1_size && h->l1_table_offset == 0)
        return nbdf_errf(err, -EINVAL, "L1 table at byte 0 (the header)");
    if ((r = check_table(h, "the L1 table", h->l1_table_offset,
                         (uint64_t) h->l1_size * 8, err)) < 0)
        return r;
    if (h->refcount_table_clusters == 0 || h->refcount_table_offset == 0)
        return nbdf_errf(err, -EINVAL, "no refcount table (offset %" PRIu64
                         ", %" PRIu32 " clusters)", h->refcount_table_offset,
                         h->refcount_table_clusters);
    if ((uint64_t) h->refcount_table_clusters * c > QCOW2_MAX_REFTABLE_BYTES)
        return nbdf_errf(err, -EFBIG, "refcount table of %" PRIu32 " clusters "
                         "(qemu's limit is %u bytes)",
                         h->refcount_table_clusters, QCOW2_MAX_REFTABLE_BYTES);
    if ((r = check_table(h, "the refcount table", h->refcount_table_offset,
                         (uint64_t) h->refcount_table_clusters * c, err)) < 0)
        return r;
    if (h->nb_snapshots > QCOW2_MAX_SNAPSHOTS)
        return nbdf_errf(err, -EINVAL, "%" PRIu32 " snapshots (at most %u)",
                         h->nb_snapshots, QCOW2_MAX_SNAPSHOTS);
    if (h->nb_snapshots && (h->snapshots_offset == 0 ||
        (r = check_table(h, "the snapshot table", h->snapshots_offset, c,
                         err)) < 0))
        return r ? r : nbdf_errf(err, -EINVAL, "snapshot table at byte 0");
    return 0;
}

static bool overlap(const struct extent *a, const struct extent *b)
{
    return a->len && b->len && a->off < b->off + b->len &&
           b->off < a->off + a->len;
}

static int check_overlaps(const struct qcow2_header *h, struct nbdf_err *err)
{
    uint64_t c = qcow2_cluster_size(h);
    /* The snapshot table's length needs the table; its first byte is
     * enough to find it inside another table. */
    struct extent e[] = {
        { "the header cluster", 0, c },
        { "the L1 table", h->l1_table_offset, (uint64_t) h->l1_size * 8 },
        { "the refcount table", h->refcount_table_offset,
          (uint64_t) h->refcount_table_clusters * c },
        { "the snapshot table", h->snapshots_offset, h->nb_snapshots ? 8 : 0 },
    };
    for (size_t i = 0; i < sizeof e / sizeof *e; i++)
        for (size_t j = i + 1; j < sizeof e / sizeof *e; j++)
            if (overlap(&e[i], &e[j]))
                return nbdf_errf(err, -EINVAL, "%s (byte %" PRIu64 ") and %s "
                                 "(byte %" PRIu64 ") overlap", e[i].name,
                                 e[i].off, e[j].name, e[j].off);
    return 0;
}

static int read_backing(const uint8_t *b, size_t len, struct qcow2_header *h,
                        struct nbdf_err *err)
{
    uint64_t off = h->backing_file_offset, n = h->backing_file_size;

    if (off == 0)
        return 0;
    if (n == 0 || n > QCOW2_MAX_BACKING_NAME)
        return nbdf_errf(err, -EINVAL, "backing file name of %" PRIu64
                         " bytes (must be 1..%u)", n, QCOW2_MAX_BACKING_NAME);
    if (off < h->ext_end || off > qcow2_cluster_size(h) ||
        n > qcow2_cluster_size(h) - off)
        return nbdf_errf(err, -EINVAL, "backing file name at byte %" PRIu64
                         " (%" PRIu64 " bytes) is not in the first cluster "
                         "after the header extensions", off, n);
    if (off + n > len)
        return nbdf_errf(err, -EINVAL, "the header cluster is cut short "
                         "(%zu bytes) before the backing file name", len);
    copy_string(h->backing_file, sizeof h->backing_file, b + off, n);
    return 0;
}

int qcow2_header_decode(const void *buf, size_t len, struct qcow2_header *out,
                        struct nbdf_err *err)
{
    const uint8_t *b = buf;
    struct exts x = { 0 };
    int r;

    header_from_disk(b, len, out);
    if ((r = check_identity(b, len, out, err)) < 0 ||
        (r = read_extensions(b, len, out, &x, err)) < 0 ||
        (r = check_features(out, &x, err)) < 0 ||
        (r = check_tables(out, err)) < 0 ||
        (r = check_overlaps(out, err)) < 0 ||
        (r = read_backing(b, len, out, err)) < 0)
        return r;
    return 0;
}

int qcow2_lint(const struct qcow2_header *h, qcow2_warn_fn warn, void *opaque)
{
    char msg[160];
    int n = 0;

    if (h->nb_snapshots) {
        snprintf(msg, sizeof msg, "%" PRIu32 " internal snapshot%s not landed "
                 "(only the active disk is)", h->nb_snapshots,
                 h->nb_snapshots == 1 ? "" : "s");
        warn(opaque, msg), n++;
    }
    if (h->has_bitmaps) {
        warn(opaque, "persistent dirty bitmaps are not landed"), n++;
    }
    if (h->compatible & QCOW2_COMPAT_LAZY_REFCOUNTS) {
        warn(opaque, "lazy refcounts (clean image: refcounts are trusted)"), n++;
    }
    if (h->compatible & ~QCOW2_COMPAT_LAZY_REFCOUNTS) {
        snprintf(msg, sizeof msg, "unknown compatible feature bits 0x%" PRIx64,
                 h->compatible & ~QCOW2_COMPAT_LAZY_REFCOUNTS);
        warn(opaque, msg), n++;
    }
    if (h->autoclear & ~(QCOW2_AUTOCLEAR_BITMAPS | QCOW2_AUTOCLEAR_DATA_RAW)) {
        snprintf(msg, sizeof msg, "unknown autoclear feature bits 0x%" PRIx64,
                 h->autoclear);
        warn(opaque, msg), n++;
    }
    return n;
}

/* ---- decompression ---------------------------------------------------------- */

/* Deflate goes through libdeflate first (whole-buffer, 2-3x faster than
 * zlib's inflate); a stream libdeflate does not take as a whole cluster
 * (one that fills the cluster without reaching its final block, which
 * qemu accepts, or damage) is decoded again by zlib, whose verdict
 * stands: what is accepted, and what it decodes to, is zlib's. */
struct qcow2_decompressor {
    struct libdeflate_decompressor *fast;
    z_stream z;
    bool z_ready;
    ZSTD_DCtx *zstd;
};

int qcow2_decompressor_new(struct qcow2_decompressor **out)
{
    struct qcow2_decompressor *d = calloc(1, sizeof *d);
    if (!d)
        return -ENOMEM;
    /* Raw deflate (negative window bits), as qemu writes it; 15 bits
     * accepts qemu's 12-bit window and any smaller. */
    if (!(d->fast = libdeflate_alloc_decompressor()) ||
        inflateInit2(&d->z, -15) != Z_OK) {
        libdeflate_free_decompressor(d->fast);
        free(d);
        return -ENOMEM;
    }
    d->z_ready = true;
    *out = d;
    return 0;
}

void qcow2_decompressor_free(struct qcow2_decompressor *d)
{
    if (!d)
        return;
    libdeflate_free_decompressor(d->fast);
    if (d->z_ready)
        inflateEnd(&d->z);
    ZSTD_freeDCtx(d->zstd);
    free(d);
}

/* qemu accepts a stream that fills the cluster, whether or not it reaches
 * its final block within the bytes given (the tail may be the next
 * cluster's). */
static int inflate_cluster(struct qcow2_decompressor *d,
                           const struct qcow2_compressed *c, void *out)
{
    /* A final block that ends with the cluster exactly (the rest of the
     * input is the next cluster's or padding): the common case. */
    size_t used = 0, got = 0;
    if (libdeflate_deflate_decompress_ex(d->fast, c->cdata, c->clen, out,
                                         c->cluster_size, &used, &got) ==
            LIBDEFLATE_SUCCESS && got == c->cluster_size)
        return 0;
    if (inflateReset(&d->z) != Z_OK)
        return -EINVAL;
    d->z.next_in = (Bytef *) c->cdata;
    d->z.avail_in = (uInt) c->clen;
    d->z.next_out = out;
    d->z.avail_out = (uInt) c->cluster_size;
    int r = inflate(&d->z, Z_FINISH);
    if ((r == Z_STREAM_END || r == Z_BUF_ERROR || r == Z_OK) &&
        d->z.avail_out == 0)
        return 0;
    return -EINVAL;
}

static int zstd_cluster(struct qcow2_decompressor *d,
                        const struct qcow2_compressed *c, void *out)
{
    if (!d->zstd && !(d->zstd = ZSTD_createDCtx()))
        return -ENOMEM;
    ZSTD_DCtx_reset(d->zstd, ZSTD_reset_session_only);
    ZSTD_inBuffer in = { c->cdata, c->clen, 0 };
    ZSTD_outBuffer o = { out, c->cluster_size, 0 };
    while (o.pos < o.size) {
        size_t in_before = in.pos, out_before = o.pos;
        size_t r = ZSTD_decompressStream(d->zstd, &o, &in);
        if (ZSTD_isError(r))
            return -EINVAL;
        if (o.pos < o.size && (r == 0 ||              /* frame ended short */
            (in.pos == in_before && o.pos == out_before)))
            return -EINVAL;                           /* input used up */
    }
    return 0;
}

int64_t qcow2_compressed_decode(struct qcow2_decompressor *d,
                                const struct qcow2_compressed *c, void *out,
                                struct nbdf_err *err)
{
    int r = c->type == QCOW2_COMPRESS_ZSTD ? zstd_cluster(d, c, out)
                                           : inflate_cluster(d, c, out);
    if (r == -ENOMEM)
        return nbdf_errf(err, r, "out of memory for a zstd context");
    if (r < 0)
        return nbdf_errf(err, -EINVAL, "compressed cluster for disk offset %"
                         PRIu64 " (%zu bytes at file offset %" PRIu64 ") is "
                         "not a valid %s stream of %zu bytes", c->disk_off,
                         c->clen, c->file_off,
                         c->type == QCOW2_COMPRESS_ZSTD ? "zstd" : "deflate",
                         c->cluster_size);
    return (int64_t) c->place_len;
}
