/* qcow2/qcow2.h: everything other modules may know about the qcow2 library.
 *
 * The library does no I/O and starts no threads.  Callers hand it bytes of
 * a qcow2 file and get back decoded structures or raw-disk writes; the
 * stream decoder keeps clusters that arrive before their L2 table in a
 * caller-provided spool; the synthesizer asks the caller for disk bytes
 * through a callback; the image reader reads a file at random from the
 * pieces it asks the caller for.  See docs/design/format-qcow2.md for the
 * format, qemu-img's write order and what is refused and why.
 *
 * Scope: versions 2 and 3, cluster sizes 512 B to 2 MiB, every refcount
 * width, zero clusters, extended L2 entries (subclusters), compressed
 * clusters (deflate, zstd), a backing file (the image is then an overlay),
 * header extensions skipped by their length.  Refused: encryption (AES,
 * LUKS), an external data file, the dirty and corrupt bits, unknown
 * incompatible features.  Internal snapshots are not landed: only the
 * active L1 table is read (qcow2_header.nb_snapshots says how many were
 * left out).
 *
 * Conventions: every function that can fail returns 0 (or a count) or a
 * negative errno: -EINVAL for a malformed file, -EMEDIUMTYPE for a valid
 * image this library does not land (encrypted, external data file, an
 * unknown incompatible feature, or not a qcow2 at all), -EFBIG past a
 * limit.  Functions that validate input take an optional 'struct nbdf_err
 * *' (may be NULL) which receives a one-line message naming the rule that
 * was broken.  Offsets and sizes are bytes.  Nothing here is thread-safe
 * on a shared object; distinct objects may be used from distinct threads.
 */
#ifndef NBDFERRY_QCOW2_H
#define NBDFERRY_QCOW2_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/format.h"

#define QCOW2_MAGIC            0x514649fbu        /* "QFI\xfb" */
#define QCOW2_MIN_CLUSTER_BITS 9u                 /* 512 B */
#define QCOW2_MAX_CLUSTER_BITS 21u                /* 2 MiB, qemu's limit */
#define QCOW2_V2_HEADER_LEN    72u
#define QCOW2_V3_HEADER_LEN    104u
/* qemu's own limits (it refuses larger tables). */
#define QCOW2_MAX_L1_BYTES     (32u << 20)
#define QCOW2_MAX_REFTABLE_BYTES (8u << 20)
#define QCOW2_MAX_SNAPSHOTS    65536u
#define QCOW2_MAX_BACKING_NAME 1023u
/* Host offsets are 56 bits in L1/L2 entries. */
#define QCOW2_MAX_HOST_OFFSET  ((uint64_t) 1 << 56)
/* The decoder keeps a bit per host cluster and names guest clusters in 32
 * bits: 2^30 host clusters (64 TiB of file at 64 KiB clusters, 512 GiB at
 * 512 B) and 2^32 guest clusters. */
#define QCOW2_MAX_HOST_CLUSTERS ((uint64_t) 1 << 30)
#define QCOW2_MAX_GUEST_CLUSTERS ((uint64_t) 1 << 32)

/* Incompatible feature bits. */
#define QCOW2_INCOMPAT_DIRTY       ((uint64_t) 1 << 0)
#define QCOW2_INCOMPAT_CORRUPT     ((uint64_t) 1 << 1)
#define QCOW2_INCOMPAT_DATA_FILE   ((uint64_t) 1 << 2)
#define QCOW2_INCOMPAT_COMPRESSION ((uint64_t) 1 << 3)
#define QCOW2_INCOMPAT_EXTL2       ((uint64_t) 1 << 4)
/* Compatible and autoclear bits. */
#define QCOW2_COMPAT_LAZY_REFCOUNTS ((uint64_t) 1 << 0)
#define QCOW2_AUTOCLEAR_BITMAPS     ((uint64_t) 1 << 0)
#define QCOW2_AUTOCLEAR_DATA_RAW    ((uint64_t) 1 << 1)

/* Header extension types. */
#define QCOW2_EXT_END          0x00000000u
#define QCOW2_EXT_BACKING_FMT  0xe2792acau
#define QCOW2_EXT_FEATURES     0x6803f857u
#define QCOW2_EXT_BITMAPS      0x23852875u
#define QCOW2_EXT_CRYPTO       0x0537be77u
#define QCOW2_EXT_DATA_FILE    0x44415441u

enum qcow2_compression { QCOW2_COMPRESS_ZLIB = 0, QCOW2_COMPRESS_ZSTD = 1 };

/* ---- header ---------------------------------------------------------------- */

/* The header and what its extensions say, host byte order. */
struct qcow2_header {
    uint32_t version;                             /* 2 or 3 */
    uint64_t backing_file_offset;                 /* 0: no backing file */
    uint32_t backing_file_size;
    uint32_t cluster_bits;
    uint64_t size;                                /* virtual disk bytes */
    uint32_t crypt_method;                        /* 0 */
    uint32_t l1_size;                             /* entries */
    uint64_t l1_table_offset;
    uint64_t refcount_table_offset;
    uint32_t refcount_table_clusters;
    uint32_t nb_snapshots;                        /* not landed */
    uint64_t snapshots_offset;
    uint64_t incompatible, compatible, autoclear;
    uint32_t refcount_order;                      /* v2: 4 */
    uint32_t header_length;                       /* v2: 72 */
    uint8_t  compression_type;                    /* enum qcow2_compression */
    /* From the extension area and the backing file name. */
    uint64_t ext_end;                             /* end of the extensions */
    bool     has_bitmaps;                         /* persistent bitmaps: ignored */
    char     backing_file[QCOW2_MAX_BACKING_NAME + 1]; /* untrusted, NUL-ended */
    char     backing_format[64];                  /* "" if none */
};

/* Decode and validate a header from the file's first bytes: buf holds
 * len bytes from offset 0, at least the header, its extensions and the
 * backing file name (the first cluster, or the whole file if shorter, is
 * always enough).  Checks: magic (-EMEDIUMTYPE if not a qcow2), version 2
 * or 3, cluster_bits 9..21, header_length, refcount_order <= 6, the
 * incompatible features (dirty and corrupt bits refused, as an external
 * data file, encryption and unknown bits: these are named from the
 * feature name table when the image has one), compression type, extended
 * L2 entries only with 16 KiB clusters or more, L1 and refcount tables
 * cluster-aligned, inside 2^56 and within qemu's size limits, the L1 large
 * enough for the disk, no two of the header cluster, L1 table, refcount
 * table and snapshot table overlapping, extensions inside the first
 * cluster, a backing file name of 1..1023 bytes inside it after the
 * extensions.  -EINVAL, -EMEDIUMTYPE or -EFBIG. */
int qcow2_header_decode(const void *buf, size_t len, struct qcow2_header *out,
                        struct nbdf_err *err);

/* Bytes of the file needed for qcow2_header_decode: the first cluster
 * once 24 bytes (magic .. cluster_bits) are known; 24 before that. */
size_t qcow2_header_need(const void *buf, size_t len);

/* Encode h's fixed fields (version 3, header_length as given, >= 104)
 * into buf, which must hold h->header_length bytes; the end-of-extensions
 * marker that follows is the caller's (8 zero bytes). */
void qcow2_header_encode(const struct qcow2_header *h, void *buf);

/* Derived sizes (for a validated header). */
static inline uint64_t qcow2_cluster_size(const struct qcow2_header *h)
{
    return 1ull << h->cluster_bits;
}
static inline bool qcow2_extended_l2(const struct qcow2_header *h)
{
    return h->incompatible & QCOW2_INCOMPAT_EXTL2;
}
/* L2 entries per table: cluster / 8, or / 16 with extended entries. */
static inline uint64_t qcow2_l2_entries(const struct qcow2_header *h)
{
    return qcow2_cluster_size(h) >> (qcow2_extended_l2(h) ? 4 : 3);
}
static inline uint32_t qcow2_refcount_bits(const struct qcow2_header *h)
{
    return 1u << h->refcount_order;
}

/* Report (not fail) what a user should know: internal snapshots not
 * landed, persistent bitmaps dropped, lazy refcounts, unknown compatible
 * or autoclear bits.  Calls warn once per finding; returns the count. */
typedef void (*qcow2_warn_fn)(void *opaque, const char *msg);
int qcow2_lint(const struct qcow2_header *h, qcow2_warn_fn warn, void *opaque);

/* ---- compressed clusters ---------------------------------------------------- */

/* One thread's decompression state (zlib raw inflate and a zstd context). */
struct qcow2_decompressor;
int  qcow2_decompressor_new(struct qcow2_decompressor **out);   /* -ENOMEM */
void qcow2_decompressor_free(struct qcow2_decompressor *d);

/* A compressed cluster as the decoder found it: cdata holds the bytes its
 * L2 entry covers (to the end of its last sector: the data may stop
 * earlier, and the tail may belong to the next compressed cluster). */
struct qcow2_compressed {
    uint64_t disk_off;                            /* the guest cluster */
    uint64_t file_off;                            /* of the compressed data */
    const void *cdata;
    size_t clen;
    size_t cluster_size;                          /* decompresses to exactly this */
    size_t place_len;                             /* bytes to place (clipped to
                                                   * the disk size) */
    enum qcow2_compression type;
};

/* Decompress c into out (c->cluster_size bytes): raw deflate (as qemu
 * writes it: no zlib header) or one zstd frame, which must produce a whole
 * cluster from the bytes given.  Returns c->place_len, or -EINVAL with a
 * message. */
int64_t qcow2_compressed_decode(struct qcow2_decompressor *d,
                                const struct qcow2_compressed *c, void *out,
                                struct nbdf_err *err);

/* ---- a whole file, read at random from caller-read pieces ---------------- */

/* Read a qcow2 file without doing I/O, as qemu reads one: through the L1
 * and L2 tables (the refcounts are not needed).  Typical loop:
 *
 *     qcow2_image_new(file_size, &img, &e);
 *     while ((r = qcow2_image_next(img, &off, &len)) > 0) {
 *         pread(fd, buf, len, off);
 *         if ((r = qcow2_image_supply(img, buf, &e)) < 0) break;
 *     }
 *
 * Requests, in order: the first 24 bytes, the header cluster (the whole
 * file if shorter), the part of the L1 table that covers the disk.  The
 * header passes qcow2_header_decode() (so an encrypted image or one with
 * an external data file is -EMEDIUMTYPE); the L1 table must lie inside
 * the file, and so must each L2 table it names, outside the header
 * cluster, the L1 table and the refcount table.  L2 tables are read when
 * a lookup needs one (qcow2_image_lookup()), so memory is the L1 table
 * (8 bytes per 2^(2 * cluster_bits - 3) bytes of disk) and the tables
 * the caller chooses to keep.  Once a call has
 * failed, the image is unusable.
 *
 * A backing file (header->backing_file, untrusted, and
 * header->backing_format, "" when the image does not say) is the
 * caller's to open: qemu resolves a relative name against the
 * directory of the image that names it. */
struct qcow2_image;

/* -EINVAL for a file shorter than a version 2 header, -ENOMEM. */
int qcow2_image_new(uint64_t file_size, struct qcow2_image **out,
                    struct nbdf_err *err);
/* 1 and (*off, *len): supply these bytes next; 0: parsing complete. */
int qcow2_image_next(const struct qcow2_image *img, uint64_t *off,
                     size_t *len);
/* buf holds exactly the *len bytes last requested. */
int qcow2_image_supply(struct qcow2_image *img, const void *buf,
                       struct nbdf_err *err);
void qcow2_image_free(struct qcow2_image *img);

/* Once the header has been supplied (else NULL). */
const struct qcow2_header *qcow2_image_header(const struct qcow2_image *img);

enum qcow2_source {
    QCOW2_SRC_ZERO,               /* reads as zero */
    QCOW2_SRC_BACKING,            /* unallocated: the backing file's bytes
                                   * at the same disk offset */
    QCOW2_SRC_FILE,               /* bytes at file_off of this file */
    QCOW2_SRC_COMPRESSED,         /* the compressed cluster at disk offset
                                   * 'cluster': its data is [file_off,
                                   * +clen) (see qcow2_image_compressed) */
    QCOW2_SRC_L2,                 /* need the L2 table [file_off, +len) */
};
struct qcow2_place {
    enum qcow2_source src;
    uint64_t file_off;
    uint64_t len;                 /* disk bytes from disk_off with this
                                   * source (L2: the table's bytes) */
    uint64_t cluster;             /* COMPRESSED: the cluster's disk offset */
    uint64_t clen;                /* COMPRESSED: bytes, clipped to the file */
};

/* Where does disk byte disk_off (< header->size) live?  l2: an L2 table
 * the caller holds, as read from file offset l2_off (or NULL); if the L1
 * entry of disk_off names a table and l2 is not that one, the answer is
 * QCOW2_SRC_L2 (which table to read) and the caller calls again with it.
 * len never crosses a cluster (for an unallocated L2 table: the table's
 * span) or the disk size; with extended L2 entries it covers the run of
 * subclusters alike.  The entry is checked (the rules of qcow2_l2_check()
 * that need no other table: reserved bits, alignment, the bitmaps, data
 * inside the file and outside the header cluster, the L1 table, the
 * refcount table and its own L2 table).  -EINVAL with the rule, or if
 * disk_off is past the disk or parsing is not complete. */
int qcow2_image_lookup(const struct qcow2_image *img, uint64_t disk_off,
                       const void *l2, uint64_t l2_off,
                       struct qcow2_place *out, struct nbdf_err *err);

/* The descriptor qcow2_compressed_decode() takes for a COMPRESSED place
 * whose bytes [p->file_off, +p->clen) the caller read into cdata. */
void qcow2_image_compressed(const struct qcow2_image *img,
                            const struct qcow2_place *p, const void *cdata,
                            struct qcow2_compressed *out);

/* ---- forward-only stream decoder ------------------------------------------ */

/* The decoder turns a qcow2 file arriving in file order (cp, dd, cat, a
 * pipe into the nbd.qcow2 view) into raw-disk writes.  Memory: the L1 and
 * refcount tables, two bits per host cluster (ownership: a cluster claimed
 * twice or by metadata and data is refused), 16 bytes per cluster mapped
 * ahead of the stream (qemu's preallocation=metadata maps every cluster
 * before the first one arrives), one cluster being assembled, compressed
 * clusters being collected, and what is spooled.
 *
 * Any order qemu writes: an L2 table, a refcount block or the L1 table may
 * arrive after clusters it places.  A cluster whose role is not known when
 * it passes (not metadata, not mapped by a table that has arrived, not
 * free by a refcount block that has arrived) and that is not all zero is
 * handed to the spool; once the refcount table, the L1 table and every L2
 * table it lists have arrived, the map is complete and spooled clusters
 * nobody claimed are dropped.  Spooled bytes are bounded by
 * opts.spool_max; a file that needs more fails with a message naming
 * opts.spool_option.
 *
 * The sink is the contract's (common/format.h): begin, data, zero,
 * compressed, map and the spool; on the thread that calls
 * feed/hole/finish; a negative return aborts decoding and is returned
 * from that call (sticky):
 *
 * begin(b): b->kind is the enum qcow2_kind (b->overlay: QCOW2_OVERLAY),
 *   b->size the virtual size, b->info the struct qcow2_header; exactly once, just before the first data, zero
 *   or compressed call (at finish for a disk that needs none), so after
 *   the header and the active L1 table have arrived and passed validation
 *   (a file whose L1 table comes last is decoded into the spool first,
 *   and every L2 table it names that has passed is checked before any is
 *   applied), and after every L2 table that arrives before the first data
 *   it maps has been checked whole.  No entry of an L2 table is applied
 *   (no zero, data or map call) before every entry of that table has
 *   passed its checks: a damaged table is refused with the disk as it was.
 *   The zero clusters of a standalone image are no call at all, and do
 *   not begin.
 *   overlay false (no backing file): the caller makes [0, size) read as
 *   zero; unallocated clusters and zeros are then NOT emitted.  overlay
 *   true (a backing file): the caller leaves the disk as it is (it holds
 *   the backing chain); unallocated clusters are not emitted, zero
 *   clusters and zero subclusters and the zeros of a hole of the file
 *   inside a data cluster are emitted as zero().
 * data(disk_off, buf, len): place these bytes; buf is valid during the
 *   call only (it may point into the caller's feed buffer).  Never outside
 *   [0, size); each disk byte at most once.
 * zero(disk_off, len): overlay only, these bytes read as zero.
 * compressed(c, c->cdata, c->clen): optional (c: a struct
 *   qcow2_compressed).  If set, each compressed cluster is handed over
 *   instead of being decompressed here and placed through data(), so that
 *   the caller can decompress on several threads with
 *   qcow2_compressed_decode() (clusters are independent; c->cdata is valid
 *   during the call only).  The caller then reports decompression errors.
 * map(disk_off, len, what, file_off): optional, for an inspector: what
 *   each L2 entry says, when its table is parsed (tables arrive in file
 *   order, so not in disk order), clipped to the disk: QCOW2_MAP_DATA
 *   (file_off: where the bytes lie; with extended L2 entries, one call
 *   per allocated subcluster), QCOW2_MAP_ZERO (the zero flag or zero
 *   subclusters; file_off 0), QCOW2_MAP_COMPRESSED (file_off: of the
 *   compressed data).  Disk ranges never reported are unallocated.
 *
 * Spool (optional; without spool_put and spool_get, or with spool_max 0,
 * a file that needs spooling fails): spool_put(key, buf, len) stores one
 * cluster (len = cluster size) under key, the cluster's file offset;
 * spool_get(key, buf, len) returns it; spool_drop(key), if set, forgets
 * it.  Each key is put once and dropped once; the
 * decoder counts the bytes held against spool_max before calling put.
 */
enum qcow2_kind { QCOW2_STANDALONE = 1, QCOW2_OVERLAY = 2 };
enum qcow2_map { QCOW2_MAP_DATA = 1, QCOW2_MAP_ZERO, QCOW2_MAP_COMPRESSED };

struct qcow2_stream_opts {
    uint64_t spool_max;                           /* bytes; 0: no spooling */
    const char *spool_option;                     /* named in the error,
                                                   * e.g. "--qcow2-spool" */
    uint64_t max_size;                            /* refuse larger disks
                                                   * (-ENOSPC); 0: no limit */
};

struct qcow2_stream;

/* sink and opaque are borrowed and must outlive the stream; opts is
 * copied (spool_option must stay valid).  -ENOMEM. */
int qcow2_stream_new(const struct nbdf_sink *sink, void *opaque,
                     const struct qcow2_stream_opts *opts,
                     struct qcow2_stream **out);

/* Bytes [file_off, file_off+len) of the qcow2 file, any size and
 * alignment.  file_off beyond the decode position: the skipped bytes are
 * zeros of the file (cp --sparse, dd conv=sparse).  file_off before it:
 * -EINVAL ("goes backwards"), unless the backwards part lies inside a
 * range recently consumed as a gap or hole (the last 32 are remembered)
 * and is all zero, which is a no-op.  The first 4 bytes not being the
 * qcow2 magic is -EMEDIUMTYPE at once.  Errors are sticky. */
int qcow2_stream_feed(struct qcow2_stream *s, uint64_t file_off,
                      const void *buf, size_t len);

/* A punched/zeroed/skipped range: zeros of the file.  Same rules. */
int qcow2_stream_hole(struct qcow2_stream *s, uint64_t file_off,
                      uint64_t len);

/* End of input: the header, the L1 table, every L2 table it lists, every
 * refcount block, every cluster the L2 tables map and every compressed
 * cluster have arrived (a cut file, or an entry pointing past the end of
 * the file, fails here, naming the first thing missing).  0 or -EINVAL (a
 * sticky error is returned again). */
int qcow2_stream_finish(struct qcow2_stream *s);

/* Message for the first error ("" if none). */
const char *qcow2_stream_error(const struct qcow2_stream *s);

/* Decode position: every byte of the file before it has been consumed. */
uint64_t qcow2_stream_position(const struct qcow2_stream *s);
/* What the first write at offset 0 began with (common/imagekind.h),
 * IMAGE_UNKNOWN before one: a refusal names what was written instead. */
enum image_kind qcow2_stream_first_kind(const struct qcow2_stream *s);

/* Once the header has been decoded (else NULL). */
const struct qcow2_header *qcow2_stream_header(const struct qcow2_stream *s);

struct qcow2_stream_stats {
    uint64_t data_clusters;                       /* placed from the file */
    uint64_t compressed_clusters;
    uint64_t zero_clusters;                       /* zero flag or subclusters */
    uint64_t spooled_clusters;                    /* put into the spool */
    uint64_t free_clusters;                       /* refcount 0: not kept */
    uint64_t spool_peak;                          /* bytes held at most */
    uint64_t l2_tables, refcount_blocks;
    bool     began;
};
void qcow2_stream_stats(const struct qcow2_stream *s,
                        struct qcow2_stream_stats *out);

void qcow2_stream_free(struct qcow2_stream *s);

/* ---- synthesizer: a qcow2 v3 of a raw disk -------------------------------- */

/* Layout, metadata first (qemu's qcow2-to-stdout layout): the header
 * cluster, the refcount table, the refcount blocks (16-bit refcounts, 1
 * for every cluster of the file), the L1 table, one L2 table per L1 entry
 * with an allocated cluster, in L1 order, then the allocated clusters in
 * increasing disk order.  Unallocated clusters are not stored (they read
 * as zero: no backing file).  Disk bytes past disk_size read as zero. */
struct qcow2_synth;

/* disk_size > 0; cluster_bits 16 for qemu's default, 9..21.  -EINVAL,
 * -EFBIG with a message past the limits. */
int qcow2_synth_new(uint64_t disk_size, uint32_t cluster_bits,
                    struct qcow2_synth **out, struct nbdf_err *err);

/* Mark every cluster touched by [disk_off, disk_off+len) allocated; calls
 * in increasing disk_off.  Only before seal; -EINVAL otherwise, -ENOMEM. */
int qcow2_synth_allocate(struct qcow2_synth *s, uint64_t disk_off,
                         uint64_t len);

/* Freeze the allocation and compute the layout; idempotent. */
int qcow2_synth_seal(struct qcow2_synth *s);

/* Size of the synthesized file (sealed). */
uint64_t qcow2_synth_file_size(const struct qcow2_synth *s);

/* The same size without a synthesizer: for 'clusters' allocated clusters
 * spread over 'tables' L2 tables.  0 if the arguments are out of range. */
uint64_t qcow2_synth_size(uint64_t disk_size, uint32_t cluster_bits,
                          uint64_t clusters, uint64_t tables);

/* Fill buf with the file's bytes [off, off+len) (clipped to the file
 * size; returns the count, 0 at or past the end), in any order of reads.
 * read_disk is called only for allocated clusters, only inside
 * [0, disk_size), and must fill the whole range or return -errno
 * (returned as is).  Not thread-safe (a small table cache). */
typedef int (*qcow2_read_disk_fn)(void *opaque, uint64_t disk_off, void *buf,
                                  size_t len);
int64_t qcow2_synth_read(struct qcow2_synth *s, uint64_t off, void *buf,
                         size_t len, qcow2_read_disk_fn read_disk,
                         void *opaque);

void qcow2_synth_free(struct qcow2_synth *s);

/* ---- the format contract's row (common/format.h; qcow2/table.c) ---------- */
extern const struct nbdf_format qcow2_format;

#endif /* NBDFERRY_QCOW2_H */
