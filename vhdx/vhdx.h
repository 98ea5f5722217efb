/* vhdx/vhdx.h: everything other modules may know about the VHDX library.
 *
 * The library does no I/O.  Callers hand it bytes of a VHDX file and get
 * back decoded structures or raw-disk writes.  See docs/design/format-vhdx.md for
 * the format in our words and what each producer writes.
 *
 * Scope: VHDX version 1 (Hyper-V 2012 and later, qemu-img), fixed,
 * dynamic and differencing; block sizes 1 to 256 MiB; 512- and 4096-byte
 * logical sectors.  A file with a log to replay (not closed cleanly) is
 * replayed by the stream decoder where the log lies before what it
 * updates, and refused with how to clean it otherwise.
 *
 * Conventions: every function that can fail returns 0 (or a count) or a
 * negative errno; validating functions take an optional 'struct nbdf_err *'
 * that receives a one-line message naming the rule that was broken.
 * Everything on disk is little-endian; GUIDs are stored in Microsoft's
 * mixed-endian layout and handled here as 16 opaque bytes.
 */
#ifndef NBDFERRY_VHDX_H
#define NBDFERRY_VHDX_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/format.h"
#include "common/imagekind.h"

#define VHDX_MiB               (1ull << 20)
#define VHDX_HEADER_SECTION    VHDX_MiB             /* file id .. region tables */
#define VHDX_FILE_ID_OFF       0u
#define VHDX_HEADER1_OFF       (64u << 10)
#define VHDX_HEADER2_OFF       (128u << 10)
#define VHDX_REGION1_OFF       (192u << 10)
#define VHDX_REGION2_OFF       (256u << 10)
#define VHDX_HEADER_BYTES      4096u                /* CRC covers 4 KiB */
#define VHDX_REGION_BYTES      (64u << 10)          /* CRC covers 64 KiB */
#define VHDX_REGION_MAX_ENTRIES 2047u
#define VHDX_META_MAX_ENTRIES  2047u
#define VHDX_META_ITEM_MAX     VHDX_MiB             /* one metadata item */
#define VHDX_BLOCK_MIN         VHDX_MiB
#define VHDX_BLOCK_MAX         (256ull << 20)
#define VHDX_DISK_MAX          (64ull << 40)        /* the spec's limit */
#define VHDX_BITMAP_BYTES      VHDX_MiB             /* one sector bitmap block */
#define VHDX_SECTORS_PER_CHUNK (1ull << 23)         /* bits of a bitmap block */

/* Payload block states (the low 3 bits of a BAT entry).  The spec numbers
 * UNMAPPED 3; qemu's header says 5: both are taken. */
enum vhdx_block_state {
    VHDX_PB_NOT_PRESENT = 0,
    VHDX_PB_UNDEFINED = 1,
    VHDX_PB_ZERO = 2,
    VHDX_PB_UNMAPPED = 3,
    VHDX_PB_UNMAPPED_QEMU = 5,
    VHDX_PB_FULLY_PRESENT = 6,
    VHDX_PB_PARTIALLY_PRESENT = 7,
};
/* Sector bitmap block states. */
#define VHDX_SB_NOT_PRESENT 0u
#define VHDX_SB_PRESENT     6u

/* CRC-32C (Castagnoli), as every VHDX checksum uses: crc starts at 0. */
uint32_t vhdx_crc32c(uint32_t crc, const void *buf, size_t len);

/* ---- the header section ---------------------------------------------- */

/* The first 8 bytes are "vhdxfile".  -EINVAL otherwise. */
int vhdx_file_id_check(const void *buf, size_t len, struct nbdf_err *err);

struct vhdx_header {
    uint64_t seq;
    uint8_t file_write_guid[16], data_write_guid[16], log_guid[16];
    uint16_t log_version, version;
    uint32_t log_length;
    uint64_t log_offset;
    bool log_pending;                             /* log_guid not all zero */
};

/* Decode one 4 KiB header: signature "head", CRC-32C over the 4 KiB with
 * the checksum field zero, version 1, log offset and length multiples of
 * 1 MiB (the log after the header section).  -EINVAL on a violation. */
int vhdx_header_decode(const void *buf4k, struct vhdx_header *out,
                       struct nbdf_err *err);

/* The current header of the two (h1 and h2 may be NULL when that copy did
 * not decode): the valid one with the larger sequence number.  Returns 1
 * or 2, or -EINVAL if neither is valid. */
int vhdx_header_pick(const struct vhdx_header *h1, const struct vhdx_header *h2,
                     struct nbdf_err *err);

struct vhdx_region {
    uint64_t off;                                 /* bytes, 1 MiB aligned */
    uint64_t len;                                 /* bytes, 1 MiB multiple */
};
struct vhdx_regions {
    struct vhdx_region bat, meta;
};

/* Decode a 64 KiB region table: signature "regi", CRC-32C, at most 2047
 * entries, the BAT and the metadata region each exactly once, offsets and
 * lengths 1 MiB multiples past the header section, no two regions
 * overlapping; an unknown entry marked required is -ENOTSUP (the file
 * needs a feature we do not know), an unknown optional one is ignored. */
int vhdx_region_table_decode(const void *buf64k, struct vhdx_regions *out,
                             struct nbdf_err *err);

/* ---- the metadata region ---------------------------------------------- */

#define VHDX_PARENT_MAX_PAIRS 16
struct vhdx_meta {
    uint32_t block_size;                          /* bytes, power of 2 */
    bool leave_blocks_allocated;                  /* a fixed VHDX */
    bool has_parent;                              /* differencing */
    uint64_t disk_size;                           /* bytes */
    uint32_t logical_sector, physical_sector;     /* 512 or 4096 */
    uint8_t page83[16];
    bool have_page83;
    /* The parent locator (differencing): key=value pairs as UTF-8,
     * truncated to fit; shown by the inspector, never followed. */
    unsigned parent_pairs;
    struct { char key[64], value[256]; } parent[VHDX_PARENT_MAX_PAIRS];
};

/* Decode the metadata region's table and its items (buf holds len bytes
 * of the region): signature "metadata", at most 2047 entries, every item
 * inside the region at or past 64 KiB and at most 1 MiB long, items not
 * overlapping; the file parameters, virtual disk size and logical and
 * physical sector size present and valid (block size a power of 2 in [1,
 * 256] MiB, sectors 512 or 4096, disk size a positive multiple of the
 * logical sector and at most 64 TiB), and a parent locator when the file
 * has a parent.  An unknown item marked required is -ENOTSUP. */
int vhdx_metadata_decode(const void *buf, size_t len, struct vhdx_meta *out,
                         struct nbdf_err *err);

/* ---- the block allocation table --------------------------------------- */

/* Geometry derived from validated metadata. */
struct vhdx_geom {
    uint64_t chunk_ratio;          /* payload blocks per sector bitmap block */
    uint64_t payload_blocks;       /* ceil(disk_size / block_size) */
    uint64_t bitmap_blocks;        /* ceil(payload_blocks / chunk_ratio) */
    uint64_t bat_entries;          /* payload and bitmap entries, interleaved */
};
void vhdx_geom(const struct vhdx_meta *m, struct vhdx_geom *out);

/* BAT entry i (interleaved: chunk_ratio payload entries, then one bitmap
 * entry, and so on).  Is it a bitmap entry; which payload block / chunk. */
static inline bool vhdx_bat_is_bitmap(const struct vhdx_geom *g, uint64_t i)
{
    return (i + 1) % (g->chunk_ratio + 1) == 0;
}
static inline uint64_t vhdx_bat_index(const struct vhdx_geom *g,
                                      uint64_t block)     /* payload block */
{
    return block + block / g->chunk_ratio;
}
static inline uint64_t vhdx_bat_bitmap_index(const struct vhdx_geom *g,
                                             uint64_t chunk)
{
    return (chunk + 1) * (g->chunk_ratio + 1) - 1;
}
static inline unsigned vhdx_bat_state(uint64_t e) { return e & 7; }
static inline uint64_t vhdx_bat_offset(uint64_t e)          /* bytes */
{
    return (e >> 20) << 20;
}

/* ---- the log -------------------------------------------------------------
 * A file closed cleanly has no log GUID in its header.  One with a log
 * GUID may have log entries to replay: 4 KiB writes (and zeroed ranges)
 * to file offsets, of the BAT, the metadata or sector bitmaps, that the
 * writer logged but had perhaps not yet made in place.  See vhdx/log.c. */
#define VHDX_LOG_SECTOR 4096u
#define VHDX_LOG_MAX    (64ull << 20)        /* the log the decoder collects */

struct vhdx_log_patch {
    uint64_t file_off, len;             /* bytes of the file, 4 KiB multiples */
    const uint8_t *data;                /* len (4096) bytes, or NULL: zeros */
};
struct vhdx_log_plan {
    struct vhdx_log_patch *patches;     /* in replay order: later ones win */
    size_t npatches;
    uint8_t *sectors;                   /* owns the data patches' bytes */
    uint64_t entries;                   /* entries replayed */
    uint64_t head_seq;                  /* the last one's sequence number */
    uint64_t flushed_file_offset;       /* the file is at least this long */
    uint64_t last_file_offset;          /* ... and reads as this long */
    uint64_t lo, hi;                    /* the span the patches cover */
};

/* Find the active sequence in the log (len bytes, whole 4 KiB sectors:
 * the log region) for the header's log GUID and turn it into patches.
 * 0 with npatches and entries 0 when no valid sequence is there (nothing
 * to replay); -EINVAL on a bad length, a write past 2^64 or a log too
 * damaged to search (docs/design/format-vhdx.md); -ENOMEM.
 * Free with vhdx_log_plan_free() (also after a failure: harmless). */
int vhdx_log_plan(const void *log, size_t len, const uint8_t log_guid[16],
                  struct vhdx_log_plan *out, struct nbdf_err *err);
void vhdx_log_plan_free(struct vhdx_log_plan *p);
/* Does any patch touch the file's bytes [off, off+len)? */
bool vhdx_log_overlaps(const struct vhdx_log_plan *p, uint64_t off,
                       uint64_t len);
/* The first byte at or past off that a patch touches (only data patches
 * when data_only: zeros written over zeros change nothing), UINT64_MAX
 * when none does. */
uint64_t vhdx_log_next(const struct vhdx_log_plan *p, uint64_t off,
                       bool data_only);
/* Replay onto buf, the file's bytes [off, off+len): the patches that
 * touch them, in order. */
void vhdx_log_apply(const struct vhdx_log_plan *p, uint64_t off, uint8_t *buf,
                    size_t len);

/* ---- random access: a fixed or dynamic VHDX, read in any order -------------
 * The library does no I/O.  Pull-style (the format contract's loop):
 *
 *     vhdx_image_new(file_size, &img);
 *     while ((r = vhdx_image_next(img, &off, &len)) > 0) {
 *         pread(fd, buf, len, off);
 *         if ((r = vhdx_image_supply(img, buf, &e)) < 0) break;
 *     }
 *
 * or through a reader of the file's bytes [off, off+len) (0, or -errno;
 * -EINVAL past the file's end) with vhdx_image_open().  Either reads and
 * checks the header section, the current header, the region table, the
 * metadata and the BAT; a header with a log GUID has its log planned
 * (vhdx/log.c) and replayed over every later read of the file
 * (vhdx_image_patch()), which then reaches as far as the log says it did
 * (vhdx_image_reach(); zeros past the file's end); a log that writes into
 * the header section or into itself is -ENOTSUP, a file shorter than the
 * log says it was -EINVAL.  A request past the file's end (its reach) is
 * -EINVAL from vhdx_image_next().  A differencing VHDX is -EMEDIUMTYPE (its
 * parent is not followed).  Read-only once open: lookups and reads run on
 * any thread if the reader does. */
typedef int (*vhdx_read_file_fn)(void *opaque, void *buf, size_t len,
                                 uint64_t off);
struct vhdx_image;
int vhdx_image_new(uint64_t file_size, struct vhdx_image **out); /* -ENOMEM */
/* 1 and (*off, *len): supply these bytes next; 0: open. */
int vhdx_image_next(const struct vhdx_image *img, uint64_t *off, size_t *len);
/* buf holds exactly the *len bytes last requested. */
int vhdx_image_supply(struct vhdx_image *img, const void *buf,
                      struct nbdf_err *err);
int vhdx_image_open(vhdx_read_file_fn rd, void *opaque, uint64_t file_size,
                    struct vhdx_image **out, struct nbdf_err *err);
const struct vhdx_meta *vhdx_image_meta(const struct vhdx_image *img);
/* Payload block blk's file offset, 0 when it reads as zero (not present,
 * zero, undefined, unmapped). */
uint64_t vhdx_image_block(const struct vhdx_image *img, uint64_t blk);
/* The file's bytes end here for the image: its size, or further where its
 * log says the file reached. */
uint64_t vhdx_image_reach(const struct vhdx_image *img);
/* Replay the log onto buf, the file's bytes [off, off+len) (zeros past
 * the file's end); nothing without a log. */
void vhdx_image_patch(const struct vhdx_image *img, uint64_t off, void *buf,
                      size_t len);
/* The virtual disk's bytes [off, off+len) (vhdx_image_open only): the
 * reader's error as is; -EINVAL past the disk. */
int vhdx_image_read(const struct vhdx_image *img, void *buf, size_t len,
                    uint64_t off);
void vhdx_image_free(struct vhdx_image *img);

/* ---- forward-only stream decoder ----------------------------------------
 * Turns a VHDX file arriving in file order (cp, dd, cat, a pipe) into
 * raw-disk writes.  The header section comes first (it is at offset 0);
 * the metadata region, the BAT and the blocks may come in any order the
 * specification allows.  Bytes that arrive before the decoder can place
 * them (blocks before the BAT or the metadata, a partially present block
 * before its sector bitmap) are handed to the caller's spool, bounded by
 * spool_max; past the bound decoding fails with a message naming
 * spool_option.  Memory: the BAT (8 bytes a block), the metadata region
 * and a sorted map of present blocks (32 bytes each), at most
 * VHDX_BAT_MAX_BYTES of BAT.
 *
 * The sink is the contract's (common/format.h): begin, data, zero and the
 * spool; callbacks run on the thread calling feed/hole/finish; a negative
 * return aborts decoding and is returned from that call (sticky).
 *
 * begin(b): b->kind is the enum vhdx_kind, b->size the virtual size,
 *   b->overlay set for a differencing file, b->unit the logical sector,
 *   b->info the struct vhdx_info; exactly once, before any data() or zero(), once the
 *   headers, region table, metadata and BAT have all arrived and been
 *   checked (BAT entries inside the file's reach, no block overlapping
 *   metadata or another block).  A malformed file is refused before
 *   anything reaches the disk.  For a file without a parent the caller
 *   makes [0, disk_size) read as zero and only present data is emitted;
 *   for a differencing file the disk keeps its content and zero() names
 *   what must become zero.
 * data(disk_off, buf, len): place these bytes; buf is valid during the
 *   call only.  Never outside [0, disk_size); each byte at most once.
 * zero(disk_off, len): differencing files only: blocks in state ZERO,
 *   UNDEFINED or UNMAPPED read as zero, not as the parent.
 * spool_put(file_off, buf, len) / spool_get(file_off, buf, len): keep
 *   file bytes for later / give them back (exactly what was put, possibly
 *   in pieces).  Either NULL: nothing can be spooled, and a file that
 *   needs it fails with a message saying so.  spool_drop is not used.
 */
#define VHDX_BAT_MAX_BYTES (128ull << 20)

struct vhdx_info {
    struct vhdx_header header;
    struct vhdx_regions regions;
    struct vhdx_meta meta;
    struct vhdx_geom geom;
    uint64_t present_blocks;          /* fully or partially present */
    uint64_t zero_blocks;             /* ZERO, UNDEFINED, UNMAPPED */
    uint64_t log_entries;             /* log entries replayed */
    uint64_t log_writes;              /* ... their descriptors */
};

/* What begin() says in nbdf_begin.kind. */
enum vhdx_kind { VHDX_DYNAMIC = 1, VHDX_FIXED = 2, VHDX_DIFF = 3 };

struct vhdx_stream_config {
    uint64_t spool_max;               /* bytes the spool may hold at once */
    const char *spool_option;         /* named in the error, e.g. "--spool-max" */
};

struct vhdx_stream;
int vhdx_stream_new(const struct nbdf_sink *sink, void *opaque,
                    const struct vhdx_stream_config *cfg,
                    struct vhdx_stream **out);

/* The next len bytes of the file, at file_off: in file order (file_off
 * at or past every byte already fed; a gap between is file zeros), or
 * zeros again over a recent gap or hole (a copy tool that skipped zeros
 * and punches them after the bytes that follow: no-op).  buf NULL means
 * len zero bytes.  0 or a sticky -errno: -EMEDIUMTYPE the first 8 bytes
 * are not "vhdxfile" (not a VHDX at all), -EINVAL malformed, -ENOTSUP
 * unsupported (a log to replay that updates bytes before its own end,
 * which a one-pass stream has passed; an unknown required region or
 * item), -EFBIG past a limit or the spool bound, or the sink's. */
int vhdx_stream_feed(struct vhdx_stream *s, uint64_t file_off,
                     const void *buf, size_t len);

/* A punched, zeroed or skipped range of the file: zeros.  Same rules. */
int vhdx_stream_hole(struct vhdx_stream *s, uint64_t file_off, uint64_t len);

/* End of input: every region and every present block must have arrived
 * (a file cut short is -EINVAL), and every spooled byte been placed.  The
 * file's last bytes may be a hole never fed (a writer that only seeks):
 * up to the furthest byte fed or punched, they count as zeros. */
int vhdx_stream_finish(struct vhdx_stream *s);

const char *vhdx_stream_error(const struct vhdx_stream *s);
uint64_t vhdx_stream_position(const struct vhdx_stream *s);
/* What the file's first sector is (common/imagekind.h), as far as it has
 * arrived: a refusal names what was written instead. */
enum image_kind vhdx_stream_first_kind(const struct vhdx_stream *s);
/* After begin(), else NULL. */
const struct vhdx_info *vhdx_stream_info(const struct vhdx_stream *s);
/* After begin(): payload block blk's BAT state and file offset (bytes).
 * -EINVAL before begin() or past the last block. */
int vhdx_stream_block(const struct vhdx_stream *s, uint64_t blk,
                      unsigned *state, uint64_t *file_off);

struct vhdx_stream_stats {
    uint64_t data_bytes;              /* emitted through data() */
    uint64_t zero_bytes;              /* emitted through zero() */
    uint64_t spooled_bytes;           /* put into the spool, in all */
    uint64_t spool_peak;              /* most held at once */
};
void vhdx_stream_stats(const struct vhdx_stream *s,
                       struct vhdx_stream_stats *out);
void vhdx_stream_free(struct vhdx_stream *s);

/* ---- synthesizer: a dynamic VHDX of a raw disk ---------------------------
 * Layout, metadata first: the header section (file identifier, two headers,
 * two region tables), an empty 1 MiB log at 1 MiB, the metadata region at
 * 2 MiB, the BAT at 3 MiB, then one payload block per allocated block in
 * disk order.  Blocks are VHDX_SYNTH_BLOCK (2 MiB), larger for disks past
 * 4 TiB so that the BAT stays at most 16 MiB; a block not allocated is
 * NOT_PRESENT (reads as zero).  512-byte logical, 4096-byte physical
 * sectors.  The BAT is computed as it is read (a bit per block in memory),
 * so the file size is known once the allocation is sealed. */
#define VHDX_SYNTH_BLOCK (2ull << 20)
struct vhdx_synth;

/* disk_size: bytes (at most 64 TiB; not a multiple of 512, the virtual
 * size is rounded up to one and the bytes past the disk read as zero, as
 * qemu-img convert -O vhdx does); guid: 16 bytes used for the write GUIDs
 * and page 83 data (a disk's identity: the same disk should get the same
 * one).  -EINVAL with a message otherwise. */
int vhdx_synth_new(uint64_t disk_size, const uint8_t guid[16],
                   struct vhdx_synth **out, struct nbdf_err *err);
/* Mark every block touched by [disk_off, disk_off+len) allocated (inside
 * the rounded-up size).  Only before seal; -EINVAL otherwise. */
int vhdx_synth_allocate(struct vhdx_synth *s, uint64_t disk_off, uint64_t len);
int vhdx_synth_seal(struct vhdx_synth *s);          /* idempotent */
uint64_t vhdx_synth_file_size(const struct vhdx_synth *s);   /* sealed */
uint32_t vhdx_synth_block_size(const struct vhdx_synth *s);
uint64_t vhdx_synth_blocks_allocated(const struct vhdx_synth *s);

/* Fill buf with the file's bytes [off, off+len) (clipped to the file size;
 * returns the count, 0 at or past the end).  read_disk is called only for
 * allocated blocks, only inside [0, disk_size), and must fill the range or
 * return -errno (returned as is).  Sealed only. */
typedef int (*vhdx_read_disk_fn)(void *opaque, uint64_t disk_off, void *buf,
                                 size_t len);
int64_t vhdx_synth_read(const struct vhdx_synth *s, uint64_t off, void *buf,
                        size_t len, vhdx_read_disk_fn read_disk, void *opaque);
void vhdx_synth_free(struct vhdx_synth *s);

/* ---- the format contract's row (common/format.h; vhdx/table.c) ---------- */
extern const struct nbdf_format vhdx_format;

#endif /* NBDFERRY_VHDX_H */
