/* vmdk/vmdk.h: everything other modules may know about the VMDK library.
 *
 * The library does no I/O.  Callers hand it bytes of a VMDK file and get
 * back decoded structures or raw-disk writes; the synthesizer asks the
 * caller for disk bytes through a callback.  See docs/design/format-vmdk.md for
 * the format and which producer shows which quirk.
 *
 * Scope: one hosted sparse extent with an embedded descriptor, i.e.
 * createType "streamOptimized" (OVA/OVF exports) or "monolithicSparse"
 * (VMware Workstation/Fusion).  Multi-file layouts (a text descriptor plus
 * extents, e.g. ESXi's -flat.vmdk) are not parsed: a flat extent is the raw
 * disk and is copied as is.
 *
 * Conventions: every function that can fail returns 0 (or a count) or a
 * negative errno.  Functions that validate input take an optional
 * 'struct nbdf_err *' (may be NULL) which receives a one-line message
 * naming the rule that was broken.  Sizes are bytes unless a name says
 * sectors.  Nothing here is thread-safe on a shared object; distinct
 * objects may be used from distinct threads.
 */
#ifndef NBDFERRY_VMDK_H
#define NBDFERRY_VMDK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/format.h"
#include "common/imagekind.h"

#define VMDK_SECTOR          512u
#define VMDK_MAGIC           0x564D444Bu          /* "KDMV" little-endian */
#define VMDK_GD_AT_END       UINT64_MAX           /* gdOffset: see the footer */
/* Header flags. */
#define VMDK_FLAG_NL_TEST    (1u << 0)            /* the 4 newline bytes are valid */
#define VMDK_FLAG_RGD        (1u << 1)            /* redundant grain tables */
#define VMDK_FLAG_ZERO_GTE   (1u << 2)            /* GTE 1 means "zero grain" */
#define VMDK_FLAG_COMPRESSED (1u << 16)           /* grains are deflated */
#define VMDK_FLAG_MARKERS    (1u << 17)           /* grains/metadata have markers */
#define VMDK_COMPRESS_NONE    0u
#define VMDK_COMPRESS_DEFLATE 1u
/* Limits.  qemu accepts grains up to 1 GiB; every producer uses 64 KiB.
 * The stream decoder holds one compressed grain and one inflated grain. */
#define VMDK_GRAIN_MIN_SECTORS 8u                 /* 4 KiB, the spec's minimum */
#define VMDK_GRAIN_MAX_SECTORS 2048u              /* 1 MiB */
#define VMDK_GTES_MAX          512u               /* qemu's limit too */
#define VMDK_MAX_GRAINS        (1ull << 28)       /* 16 TiB at 64 KiB grains */
#define VMDK_DESC_MAX          (1u << 20)         /* embedded descriptor bytes */
#define VMDK_META_MAX_SECTORS  (1u << 21)         /* one GT/GD marker's payload */

enum vmdk_kind {
    VMDK_STREAM_OPTIMIZED = 1,                    /* markers, deflated grains */
    VMDK_MONOLITHIC_SPARSE = 2,                   /* GD/GT up front, raw grains */
};

/* Marker types (the 4 bytes at offset 12 of a metadata marker sector). */
enum vmdk_marker {
    VMDK_MARKER_EOS = 0,
    VMDK_MARKER_GT = 1,
    VMDK_MARKER_GD = 2,
    VMDK_MARKER_FOOTER = 3,
};

/* ---- header and descriptor ----------------------------------------------- */

/* The sparse extent header (sector 0; the footer has the same layout),
 * host byte order.  Sector counts as stored. */
struct vmdk_header {
    uint32_t magic;
    uint32_t version;                             /* 1..3 */
    uint32_t flags;                               /* VMDK_FLAG_* */
    uint64_t capacity;                            /* sectors */
    uint64_t grain_size;                          /* sectors */
    uint64_t desc_offset;                         /* sectors, 0: none */
    uint64_t desc_size;                           /* sectors */
    uint32_t gtes_per_gt;
    uint64_t rgd_offset;                          /* sectors */
    uint64_t gd_offset;                           /* sectors or VMDK_GD_AT_END */
    uint64_t overhead;                            /* sectors before the grains */
    uint8_t  unclean_shutdown;
    uint8_t  nl[4];                               /* '\n', ' ', '\r', '\n' */
    uint16_t compress;                            /* VMDK_COMPRESS_* */
};

/* Decode and validate one 512-byte sparse header on its own: magic,
 * version 1..3, newline bytes intact (when flagged), grain size a power of
 * two in [VMDK_GRAIN_MIN_SECTORS, VMDK_GRAIN_MAX_SECTORS], capacity > 0 and
 * at most VMDK_MAX_GRAINS grains, GTEs per GT in [1, VMDK_GTES_MAX],
 * compression algorithm consistent with the flags, markers only with
 * compression, an embedded descriptor inside the overhead and at most
 * VMDK_DESC_MAX, and for a non-stream header a grain directory inside the
 * overhead.  -EINVAL on a violation, -ENOTSUP for a valid but unsupported
 * variant (compressed grains without markers, no embedded descriptor),
 * -EFBIG past a limit. */
int vmdk_header_decode(const void *sector, struct vmdk_header *out,
                       struct nbdf_err *err);

/* Encode h into 512 bytes (the rest zero). */
void vmdk_header_encode(const struct vmdk_header *h, void *sector);

/* Derived sizes (for a validated header). */
uint64_t vmdk_header_grains(const struct vmdk_header *h);   /* ceil(cap/grain) */
uint64_t vmdk_header_gts(const struct vmdk_header *h);      /* GD entries */
static inline uint64_t vmdk_header_grain_bytes(const struct vmdk_header *h)
{
    return h->grain_size * VMDK_SECTOR;
}

/* The parts of an embedded descriptor the library checks. */
struct vmdk_desc {
    char     create_type[32];                     /* "streamOptimized", ... */
    uint32_t cid;
    uint32_t parent_cid;                          /* 0xffffffff: no parent */
    uint64_t extent_sectors;
    char     extent_access[16];                   /* RW, RDONLY, NOACCESS */
    char     extent_type[16];                     /* SPARSE */
    char     extent_file[128];                    /* as quoted (truncated) */
    uint32_t extents;
};

/* Parse descriptor text (len bytes; stops at the first NUL) and check it
 * against the header h: a createType of streamOptimized or monolithicSparse
 * that agrees with the header's marker flag, no parent (parentCID
 * ffffffff), exactly one SPARSE extent of h->capacity sectors.  Unknown
 * keys and DDB entries are ignored.  -EINVAL or -ENOTSUP (other
 * createTypes, a parent). */
int vmdk_desc_parse(const char *text, size_t len, const struct vmdk_header *h,
                    struct vmdk_desc *out, struct nbdf_err *err);

/* Report (not fail) oddities: unknown flag bits, unclean shutdown, a
 * non-stream file with compressed grains, descriptor size 0.  Calls warn
 * once per finding; returns the number of warnings. */
typedef void (*vmdk_warn_fn)(void *opaque, const char *msg);
int vmdk_lint(const struct vmdk_header *h, vmdk_warn_fn warn, void *opaque);

/* Inflate one zlib-wrapped deflate grain (what VMware, qemu and VMDKstream
 * write) into out (cap bytes).  Returns the inflated length, or -EINVAL if
 * the data is corrupt, the checksum wrong or it inflates past cap.  One
 * inflater per thread (libdeflate underneath: see docs/design/format-vmdk.md for
 * the measurement against zlib). */
struct vmdk_inflater;
int  vmdk_inflater_new(struct vmdk_inflater **out);         /* -ENOMEM */
void vmdk_inflater_free(struct vmdk_inflater *z);
int64_t vmdk_inflate(struct vmdk_inflater *z, const void *in, size_t len,
                     void *out, size_t cap);

/* A compressed grain of a streamOptimized file, as the decoder found it
 * (LBA checked: aligned, inside the capacity, not seen before). */
struct vmdk_grain {
    uint64_t disk_off;                            /* LBA * 512 */
    uint64_t file_off;                            /* of its marker */
    const void *cdata;                            /* the zlib stream */
    size_t clen;
    size_t grain_bytes;                           /* room to inflate into */
    size_t min_len;                               /* must inflate to >= this */
    uint64_t capacity;                            /* place nothing past it */
};

/* Fill g for the grain at lba (aligned, < capacity) of a file with header
 * h, its marker at file_off, compressed bytes cdata/clen. */
void vmdk_grain_init(struct vmdk_grain *g, const struct vmdk_header *h,
                     uint64_t lba, uint64_t file_off, const void *cdata,
                     size_t clen);

/* Inflate g into out (g->grain_bytes bytes) and apply the grain rules:
 * valid zlib data with a correct checksum, no longer than a grain, and at
 * least g->min_len (a grain; only the disk's last may be shorter, by less
 * than a sector).  Returns the bytes to place at g->disk_off (clipped to
 * the capacity), or -EINVAL with a message in err. */
int64_t vmdk_grain_inflate(struct vmdk_inflater *z, const struct vmdk_grain *g,
                           void *out, struct nbdf_err *err);

/* ---- a whole file, parsed from caller-read pieces (random access) -------- */

/* Parse a VMDK file without doing I/O, as qemu reads one: through the
 * grain directory and tables.  Typical loop:
 *
 *     vmdk_image_new(first_512_bytes, file_size, &img, &e);
 *     while ((r = vmdk_image_next(img, &off, &len)) > 0) {
 *         pread(fd, buf, len, off);
 *         if ((r = vmdk_image_supply(img, buf, &e)) < 0) break;
 *     }
 *
 * Requests, in order: the descriptor; for a header whose directory is at
 * the end (GD_AT_END), the last 1536 bytes (footer marker, footer, EOS
 * marker, where qemu looks); the grain directory; each grain table in
 * directory order.  Then every grain table entry is checked: inside the
 * file, after the overhead, and for monolithicSparse no two grains
 * overlapping.  The stream decoder trusts a streamOptimized file's grain
 * markers instead; comparing the two finds files where they disagree
 * (nbdferry-vmdk check does).  Memory: 4 bytes per grain of the disk,
 * hence a limit (-EFBIG past it; the stream decoder has none so low). */
#define VMDK_IMAGE_MAX_GRAINS (1u << 25)          /* 2 TiB at 64 KiB grains */
struct vmdk_image;

int vmdk_image_new(const void *sector0, uint64_t file_size,
                   struct vmdk_image **out, struct nbdf_err *err);
/* 1 and (*off, *len): supply these bytes next; 0: parsing complete. */
int vmdk_image_next(const struct vmdk_image *img, uint64_t *off, size_t *len);
/* buf holds exactly the *len bytes last requested. */
int vmdk_image_supply(struct vmdk_image *img, const void *buf,
                      struct nbdf_err *err);
void vmdk_image_free(struct vmdk_image *img);
const struct vmdk_header *vmdk_image_header(const struct vmdk_image *img);

enum vmdk_source {
    VMDK_SRC_ZERO,                /* unallocated or zeroed grain */
    VMDK_SRC_FILE,                /* raw grain data at file_off */
    VMDK_SRC_MARKER,              /* compressed grain: its marker at file_off */
};
struct vmdk_place {
    enum vmdk_source src;
    uint64_t file_off;
    uint64_t len;                 /* bytes from disk_off (to the grain's end
                                   * or the capacity) */
};
/* Where does disk byte disk_off (< capacity) live?  -EINVAL if out of
 * range or parsing is not complete. */
int vmdk_image_lookup(const struct vmdk_image *img, uint64_t disk_off,
                      struct vmdk_place *out);

/* Decode a grain marker's first 12 bytes: *lba and *size (compressed
 * bytes, 0 for a metadata marker). */
void vmdk_marker_decode(const void *buf, uint64_t *lba, uint32_t *size);

/* ---- forward-only stream decoder ------------------------------------------ */

/* The decoder turns a VMDK file arriving in file order (cp, dd, cat, a
 * pipe, tar -xO into the nbd.vmdk view) into raw-disk writes with bounded
 * memory: one compressed and one inflated grain, a bit per grain for
 * streamOptimized (two, plus the grain directory, when the header's
 * directory lies in the overhead), and for monolithicSparse the grain
 * directory and 8 bytes per allocated grain.
 *
 * The sink is the contract's (common/format.h): begin, data and
 * compressed; on the thread that calls feed/hole/finish; a negative return
 * aborts decoding and is returned from that call (sticky):
 *
 * begin(b): exactly once, before any data().  b->kind is the enum
 *   vmdk_kind; b->size the capacity, the disk's size in bytes (header
 *   capacity * 512), so b->unit is 512.  streamOptimized: at
 *   the first marker, once the header and descriptor have been validated
 *   and the overhead has passed.  monolithicSparse: once
 *   the header, descriptor, grain directory and every grain table have
 *   arrived and the grain map has been checked (in range, no overlaps).
 *   Either way a malformed file is refused before anything reaches the
 *   disk.  The caller makes [0, capacity) read as zero: bytes the VMDK
 *   does not carry (unallocated grains, zero grains, zeros of the file
 *   inside a grain) are NOT emitted.
 * data(disk_off, buf, len): place these bytes; buf is valid during the call
 *   only.  Never outside [0, capacity); each disk byte at most once.
 * compressed(g, g->cdata, g->clen): optional (g: a struct vmdk_grain).
 *   If set, each streamOptimized grain is handed over
 *   compressed instead of inflated and placed through data(), so that the
 *   caller can inflate grains on several threads with vmdk_grain_inflate()
 *   (grains are independent).  g->cdata is valid during the call only.  The
 *   decoder then cannot see a grain's inflate errors: the caller must
 *   report them (at close, for the view).
 *
 * streamOptimized: grains may come in any LBA order; GT/GD markers are
 *   skipped (the markers' LBAs are the map); the footer is checked against
 *   the header; after an end-of-stream marker only zeros may follow.  When
 *   the header's grain directory lies in the overhead (qemu-img), it and
 *   its tables are read as they pass, every grain marker must be listed
 *   there, and the stream may end at any marker boundary once every
 *   listed grain has arrived (qemu-img writes no end-of-stream marker and
 *   no footer).  Otherwise the stream ends with an end-of-stream marker.
 *   Only the disk's last grain may inflate to less than a grain, and by
 *   less than a sector short of the capacity.
 * monolithicSparse: grains may be stored in any file order, all after the
 *   overhead; each grain's file offset is mapped back to its LBA through
 *   the grain tables, which must lie (with the directory) in the overhead.
 */
struct vmdk_stream;

/* sink and opaque are borrowed and must outlive the stream.  -ENOMEM. */
int vmdk_stream_new(const struct nbdf_sink *sink, void *opaque,
                    struct vmdk_stream **out);

/* Bytes [file_off, file_off+len) of the VMDK file, any size and alignment.
 * file_off beyond the decode position: the skipped bytes are zeros of the
 * file (cp --sparse, dd conv=sparse).  file_off before it: -EINVAL ("goes
 * backwards"), unless the backwards part lies inside a range recently
 * consumed as a gap or hole (the last 32 are remembered) and is all zero,
 * which is a no-op.  Errors are sticky: -EINVAL for malformed input,
 * -ENOTSUP for unsupported variants, -EFBIG past a limit, or the sink's. */
int vmdk_stream_feed(struct vmdk_stream *s, uint64_t file_off,
                     const void *buf, size_t len);

/* A punched/zeroed/skipped range: zeros of the file.  Same ordering rules. */
int vmdk_stream_hole(struct vmdk_stream *s, uint64_t file_off, uint64_t len);

/* End of input.  streamOptimized: the end-of-stream marker was seen (and,
 * when the header defers the directory to the end, a footer before it),
 * or, when the header's grain tables were read, the input ends at a marker
 * boundary and every grain they list has arrived.
 * monolithicSparse: the metadata and every allocated grain arrived.
 * 0 or -EINVAL (a sticky error is returned again). */
int vmdk_stream_finish(struct vmdk_stream *s);

/* Message for the first error ("" if none). */
const char *vmdk_stream_error(const struct vmdk_stream *s);

/* What the stream's first sector is (common/imagekind.h), once all of it
 * has arrived; IMAGE_UNKNOWN before.  A refusal (-EMEDIUMTYPE: the first
 * sector has no sparse magic) names the view to use with it. */
enum image_kind vmdk_stream_first_kind(const struct vmdk_stream *s);

/* Decode position: every byte of the file before it has been consumed. */
uint64_t vmdk_stream_position(const struct vmdk_stream *s);

/* Once begin() has been called (else 0 / NULL). */
enum vmdk_kind vmdk_stream_kind(const struct vmdk_stream *s);
uint64_t vmdk_stream_capacity(const struct vmdk_stream *s);
const struct vmdk_header *vmdk_stream_header(const struct vmdk_stream *s);
const struct vmdk_desc *vmdk_stream_desc(const struct vmdk_stream *s);

/* Counters: grains placed, compressed bytes read, metadata markers. */
struct vmdk_stream_stats {
    uint64_t grains;
    uint64_t zero_grains;                         /* monolithicSparse GTE 1 */
    uint64_t compressed_bytes;
    uint64_t gt_markers, gd_markers;
    bool footer, eos;
};
void vmdk_stream_stats(const struct vmdk_stream *s,
                       struct vmdk_stream_stats *out);

void vmdk_stream_free(struct vmdk_stream *s);

/* ---- synthesizer: a streamOptimized VMDK of a raw disk -------------------- */

/* Layout: header at 0 (gdOffset = GD_AT_END, as VMware writes it),
 * descriptor at sector 1, grains from sector 128 (64 KiB), one per
 * allocated 64 KiB grain in increasing LBA order, each a grain marker and a
 * zlib stream of STORED (uncompressed) deflate blocks: its size is fixed
 * (65552 bytes, 129 sectors with marker and padding), so the file size is
 * known at open without reading or compressing anything.  Then a GT marker
 * and table for each table with an allocated grain, the GD marker and
 * directory, the footer marker and footer, the end-of-stream marker.  Bytes
 * of the disk past disk_size read as zero. */
#define VMDK_SYNTH_GRAIN_SECTORS 128u
struct vmdk_synth;

/* disk_size: bytes of the disk (capacity = disk_size rounded up to 512);
 * cid: content id for the descriptor; name: the extent's file name in the
 * descriptor (copied, truncated to 64 bytes).  -EFBIG with a message past
 * VMDK_MAX_GRAINS; -EINVAL if 0. */
int vmdk_synth_new(uint64_t disk_size, uint32_t cid, const char *name,
                   struct vmdk_synth **out, struct nbdf_err *err);

/* Mark every grain touched by [disk_off, disk_off+len) allocated; calls
 * must come in increasing disk_off.  Only before seal; -EINVAL otherwise,
 * -ENOMEM. */
int vmdk_synth_allocate(struct vmdk_synth *s, uint64_t disk_off, uint64_t len);

/* Freeze the allocation and compute the layout; idempotent. */
int vmdk_synth_seal(struct vmdk_synth *s);

/* Size of the synthesized file (sealed). */
uint64_t vmdk_synth_file_size(const struct vmdk_synth *s);

/* The same size without a synthesizer (no memory per grain): for a disk of
 * disk_size bytes with 'grains' allocated 64 KiB grains spread over
 * 'tables' grain tables (512 grains, 32 MiB of disk each).  0 if
 * disk_size is 0 or past the limit. */
uint64_t vmdk_synth_size(uint64_t disk_size, uint64_t grains, uint64_t tables);
#define VMDK_SYNTH_TABLE_BYTES (512ull * VMDK_SYNTH_GRAIN_SECTORS * VMDK_SECTOR)
uint64_t vmdk_synth_grains_allocated(const struct vmdk_synth *s);

/* Fill buf with the file's bytes [off, off+len) (clipped to the file size;
 * returns the count, 0 at or past the end).  read_disk is called only for
 * allocated grains, only inside [0, disk_size), and must fill the whole
 * range or return -errno (returned as is).  The last grain read is cached,
 * so sequential reads read each grain once.  Not thread-safe. */
typedef int (*vmdk_read_disk_fn)(void *opaque, uint64_t disk_off, void *buf,
                                 size_t len);
int64_t vmdk_synth_read(struct vmdk_synth *s, uint64_t off, void *buf,
                        size_t len, vmdk_read_disk_fn read_disk, void *opaque);

void vmdk_synth_free(struct vmdk_synth *s);

/* ---- the format contract's row (common/format.h; vmdk/table.c) ---------- */
extern const struct nbdf_format vmdk_format;

#endif /* NBDFERRY_VMDK_H */
