/* vhd/vhd.h: everything other modules may know about the VHD library.
 *
 * The library does no I/O.  Callers hand it bytes of a VHD file and get back
 * decoded structures, file placements or raw-disk writes; the synthesizer
 * asks the caller for disk bytes through a callback.  See
 * docs/design/format-vhd.md for how the pieces fit and which producer shows which
 * quirk.
 *
 * Conventions: every function that can fail returns 0 (or a count) or a
 * negative errno.  Functions that validate input also take an optional
 * 'struct nbdf_err *' (may be NULL) which receives a one-line, human-readable
 * message naming the rule that was broken.  Offsets and sizes are bytes.
 * Nothing here is thread-safe on a shared object; distinct objects may be
 * used from distinct threads.
 */
#ifndef NBDFERRY_VHD_H
#define NBDFERRY_VHD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/format.h"
#include "common/imagekind.h"

#define VHD_SECTOR          512u
#define VHD_FOOTER_SIZE     512u
#define VHD_HEADER_SIZE     1024u
#define VHD_BLOCK_SIZE_DEFAULT (2u << 20)
/* qemu and xen-api refuse more: 0xFF000000 sectors = 2040 GiB. */
#define VHD_MAX_SIZE        (0xFF000000ull * VHD_SECTOR)
#define VHD_BLOCK_SIZE_MAX  (256u << 20)          /* buffers are sized from it */
#define VHD_MAX_BAT_ENTRIES (1u << 23)            /* memory cap: 32 MiB of BAT */
#define VHD_MAX_LOCATOR_LEN (64u << 10)
#define VHD_BAT_UNUSED      0xFFFFFFFFu
#define VHD_NO_BLOCK        UINT64_MAX            /* "not allocated" offset */

enum vhd_kind { VHD_FIXED = 2, VHD_DYNAMIC = 3, VHD_DIFF = 4 };

/* Locator platform codes (header offset 576, 8 entries). */
#define VHD_PLAT_NONE 0x00000000u
#define VHD_PLAT_WI2R 0x57693272u                 /* obsolete */
#define VHD_PLAT_WI2K 0x5769326Bu                 /* obsolete */
#define VHD_PLAT_W2RU 0x57327275u                 /* relative, UTF-16LE */
#define VHD_PLAT_W2KU 0x57326B75u                 /* absolute, UTF-16LE */
#define VHD_PLAT_MAC  0x4D616320u                 /* Mac alias blob */
#define VHD_PLAT_MACX 0x4D616358u                 /* UTF-8 file:// URL */

/* VHD timestamps count seconds from 2000-01-01T00:00:00Z, this Unix time. */
#define VHD_EPOCH_UNIX 946684800u

/* ---- decoded structures (host byte order) -------------------------------- */

struct vhd_footer {
    char     cookie[8];                           /* "conectix" */
    uint32_t features;
    uint32_t version;
    uint64_t data_offset;                         /* dyn/diff: header offset */
    uint32_t timestamp;                           /* seconds since 2000-01-01 */
    char     creator_app[4];                      /* raw bytes, e.g. "tap\0" */
    uint32_t creator_version;
    uint32_t creator_os;
    uint64_t original_size;
    uint64_t current_size;                        /* THE virtual size */
    uint16_t cylinders;
    uint8_t  heads;
    uint8_t  sectors;
    uint32_t disk_type;                           /* enum vhd_kind */
    uint32_t checksum;
    uint8_t  uuid[16];                            /* raw bytes, compare as is */
    uint8_t  saved_state;
    uint8_t  hidden;                              /* blktap byte 85 */
    bool     reserved_nonzero;                    /* bytes 86..511 */
    bool     legacy_checksum;                     /* passed only via tapdisk rule */
};

struct vhd_locator {
    uint32_t code;                                /* VHD_PLAT_* */
    uint32_t data_space;                          /* as stored */
    uint32_t data_length;                         /* bytes used */
    uint32_t reserved;
    uint64_t data_offset;                         /* absolute file offset */
    uint64_t space_bytes;                         /* data_space in bytes (libvhd rule) */
};

struct vhd_header {
    char     cookie[8];                           /* "cxsparse" */
    uint64_t data_offset;                         /* unused, all-ones */
    uint64_t table_offset;                        /* BAT offset */
    uint32_t version;
    uint32_t max_entries;
    uint32_t block_size;
    uint32_t checksum;
    uint8_t  parent_uuid[16];
    uint32_t parent_timestamp;
    uint32_t reserved1;
    uint8_t  parent_name[512];                    /* raw UTF-16BE, NUL padded */
    struct vhd_locator loc[8];
    bool     reserved_nonzero;                    /* bytes 768..1023 */
};

/* ---- footer, header, checksum, geometry --------------------------------- */

/* Complement of the byte sum of buf[0..len), the 4 bytes at csum_off counted
 * as zero (VHD footer: len 512, off 64; header: 1024, 36). */
uint32_t vhd_checksum(const void *buf, size_t len, size_t csum_off);

/* Decode and validate one 512-byte footer: cookie ("v_poison" named as such),
 * checksum (tapdisk hidden-byte exception honoured), format version 1.x,
 * disk type 2/3/4, current_size > 0, 512-aligned and <= VHD_MAX_SIZE; for
 * dyn/diff a 512-aligned data offset >= 512 and no creator "tap" 0.1.
 * -EINVAL on any violation. */
int vhd_footer_decode(const void *sector, struct vhd_footer *out,
                      struct nbdf_err *err);

/* Encode f into 512 bytes, computing the checksum (f->checksum ignored). */
void vhd_footer_encode(const struct vhd_footer *f, void *sector);

/* Decode and validate a 1024-byte dynamic header on its own: cookie,
 * checksum, version 0x00010000, block size a power of two in
 * [512, VHD_BLOCK_SIZE_MAX], locator data space.  -EINVAL on violation. */
int vhd_header_decode(const void *buf, struct vhd_header *out,
                      struct nbdf_err *err);

/* Encode h into 1024 bytes, computing the checksum. */
void vhd_header_encode(const struct vhd_header *h, void *buf);

/* Cross-check a decoded header against its footer (nothing that needs the
 * file length): BAT entries >= ceil(size / block) and <= the size-limit cap,
 * BAT 512-aligned and clear of the footer copy and the header, parent
 * fields zero for a dynamic disk, locator entries well formed.  -EINVAL,
 * or -EFBIG when the BAT would exceed VHD_MAX_BAT_ENTRIES in memory. */
int vhd_header_check(const struct vhd_footer *f, const struct vhd_header *h,
                     struct nbdf_err *err);

/* Report (not fail) oddities: feature bits, reserved bytes, saved state,
 * CHS inconsistent with size, fixed data offset not all-ones, header data
 * offset not all-ones.  Calls warn once per finding; h may be NULL.
 * Returns the number of warnings. */
typedef void (*vhd_warn_fn)(void *opaque, const char *msg);
int vhd_lint(const struct vhd_footer *f, const struct vhd_header *h,
             vhd_warn_fn warn, void *opaque);

/* CHS geometry for a size, the spec's algorithm (as qemu and blktap). */
void vhd_geometry(uint64_t size, uint16_t *cyl, uint8_t *heads, uint8_t *spt);

/* The virtual size qemu 9 and older (Debian 12: 7.2) report (without
 * force_size_calc): cylinders*heads*spt*512 unless the creator is one qemu
 * trusts ("win ", "qem2", "d2v ", "CTXS", "tap\0") or the geometry is the
 * maximal 65535/16/255, in which case current_size. */
uint64_t vhd_qemu_size(const struct vhd_footer *f);

/* The same for qemu 10 and later, which turned the rule round: the
 * geometry only for the creators that size by it ("vpc ", "qemu"),
 * current_size for every other one (and for the maximal geometry). */
uint64_t vhd_qemu10_size(const struct vhd_footer *f);

/* Virtual sector j's bit in a sector bitmap (MSB first). */
static inline bool vhd_bitmap_test(const uint8_t *bm, uint32_t j)
{
    return bm[j >> 3] & (0x80u >> (j & 7));
}

/* ---- strings: parent name and locators ----------------------------------- */

/* UTF-16 (big or little endian) to NUL-terminated UTF-8.  Stops at a NUL
 * unit or at inlen bytes; rejects unpaired surrogates (-EILSEQ) and output
 * that does not fit (-ENAMETOOLONG).  Returns the UTF-8 length. */
int vhd_utf16_to_utf8(const uint8_t *in, size_t inlen, bool big_endian,
                      char *out, size_t outlen);

/* The header's parent unicode name as UTF-8 ("" if none). */
int vhd_parent_name(const struct vhd_header *h, char *out, size_t outlen);

/* Decode a locator's payload into a POSIX-style path: MacX "file://" URL
 * (prefix stripped, %XX decoded), W2ru/W2ku UTF-16LE with '\' turned into
 * '/'.  Returns the path length, -ENOENT if the payload is empty or all
 * zero (vhd-tool deltas), -ENOTSUP for codes without a path (Mac, Wi2*),
 * -EINVAL/-EILSEQ if malformed.  The path is untrusted. */
int vhd_locator_path(const struct vhd_locator *l, const void *payload,
                     size_t len, char *out, size_t outlen,
                     struct nbdf_err *err);

/* ---- a whole image, parsed from caller-read pieces ----------------------- */

/* Parse a VHD file without doing I/O: the caller reads what the image asks
 * for.  Typical loop:
 *
 *     vhd_image_new(last_512_bytes, file_size, &img, &e);
 *     while ((r = vhd_image_next(img, &off, &len)) > 0) {
 *         pread(fd, buf, len, off);
 *         if ((r = vhd_image_supply(img, buf, &e)) < 0) break;
 *     }
 *
 * Requests, in order: the footer copy at 0 (must be byte-identical to the
 * trailing footer), the dynamic header, the needed part of the BAT, the
 * sector after the BAT (a blktap batmap header is validated if present, then
 * its map), each locator payload.  After the last supply the image checks
 * every extent (footer copy, header, BAT, batmap, locators, blocks, trailing
 * footer) for overlap and for lying inside the file.  A fixed image needs
 * nothing.  Once a call has failed, the image is unusable. */
struct vhd_image;

/* footer: the file's last 512 bytes; file_size: its length (>= 512;
 * 512*n + 511 legacy files are not accepted).  *out owned by the caller. */
int vhd_image_new(const void *footer, uint64_t file_size,
                  struct vhd_image **out, struct nbdf_err *err);
/* 1 and (*off, *len): supply these bytes next; 0: parsing complete. */
int vhd_image_next(const struct vhd_image *img, uint64_t *off, size_t *len);
/* buf holds exactly the *len bytes last requested at *off. */
int vhd_image_supply(struct vhd_image *img, const void *buf,
                     struct nbdf_err *err);
void vhd_image_free(struct vhd_image *img);

enum vhd_kind vhd_image_kind(const struct vhd_image *img);
const struct vhd_footer *vhd_image_footer(const struct vhd_image *img);
const struct vhd_header *vhd_image_header(const struct vhd_image *img); /* NULL: fixed */
uint64_t vhd_image_size(const struct vhd_image *img);       /* current_size */
uint32_t vhd_image_block_size(const struct vhd_image *img); /* 0: fixed */
uint32_t vhd_image_bitmap_bytes(const struct vhd_image *img);
uint32_t vhd_image_blocks(const struct vhd_image *img);     /* ceil(size/block) */
uint32_t vhd_image_allocated(const struct vhd_image *img);  /* used BAT entries */
/* File offset of block i's bitmap, VHD_NO_BLOCK if unallocated. */
uint64_t vhd_image_block_offset(const struct vhd_image *img, uint32_t i);
/* Batmap found and valid (then *off is the map's file offset). */
bool vhd_image_has_batmap(const struct vhd_image *img, uint64_t *off);
/* Payload of locator i as read (NULL if none was read). */
const uint8_t *vhd_image_locator_payload(const struct vhd_image *img, int i,
                                         size_t *len);
/* Does this image's parent id equal parent's footer uuid?  0 or -EINVAL. */
int vhd_image_check_parent(const struct vhd_image *child,
                           const struct vhd_image *parent,
                           struct nbdf_err *err);

enum vhd_source {
    VHD_SRC_FILE,                 /* bytes at file_off in this file */
    VHD_SRC_ZERO,                 /* read as zero */
    VHD_SRC_PARENT,               /* differencing: read the parent */
    VHD_SRC_BITMAP,               /* need the block's bitmap: file_off, len */
};
struct vhd_place {
    enum vhd_source src;
    uint64_t file_off;
    uint64_t len;                 /* bytes from disk_off with this source */
};
/* Where does virtual byte disk_off (< size) live?  bitmap: the sector bitmap
 * of disk_off's block (vhd_image_bitmap_bytes bytes) or NULL; if NULL and
 * the block is allocated, returns VHD_SRC_BITMAP with the bitmap's offset
 * and length, and the caller calls again with it.  len never crosses a
 * block boundary or the virtual size.  -EINVAL if disk_off >= size or the
 * image is not completely parsed. */
int vhd_image_lookup(const struct vhd_image *img, uint64_t disk_off,
                     const void *bitmap, struct vhd_place *out);

/* ---- forward-only stream decoder ---------------------------------------- */

/* The decoder turns a VHD file arriving in file order (cp, dd, cat into the
 * nbd.vhd view) into raw-disk writes, with bounded memory (the BAT, a
 * file-offset-sorted copy of it and one block bitmap; never block data).
 *
 * The sink is the contract's (common/format.h): begin, data and zero; all
 * on the thread that calls feed/hole/finish; any negative return aborts
 * decoding and is returned from that call (sticky):
 *
 * begin(b): exactly once, before any data/zero; b->kind is the enum
 *   vhd_kind, b->size the virtual size, b->overlay set for DIFF and
 *   b->file_len the file's length when the BAT says it.
 *   DYNAMIC / DIFF: once the footer copy, the dynamic header and the BAT
 *   have arrived and passed validation (so a malformed file is refused
 *   before anything touches the disk); virtual_size = current_size.
 *   FIXED: as soon as the first 512 bytes are seen NOT to be a footer copy
 *   ("probably fixed"); virtual_size is 0 (unknown until finish).
 *   FIXED/DYNAMIC replace the disk: the caller makes [0, size) read as zero.
 *   DIFF: the caller leaves the disk as is (it holds the parent).
 * data(disk_off, buf, len): place these bytes; buf is only valid during
 *   the call (it may point into the caller's feed buffer).
 * zero(disk_off, len): these present sectors read as zero (a hole of the
 *   VHD file inside a set-bit data area, or inside fixed data).
 *
 * Emission: each byte is emitted as soon as it can be placed, in pieces of
 * any size and alignment; never outside [0, virtual_size) (for FIXED: never
 * past the bytes that precede the final 512, which are held back because
 * they may be the footer).  DYNAMIC: unallocated blocks and clear-bit
 * sectors are NOT emitted (the disk was zeroed at begin).  DIFF: only
 * set-bit sectors are emitted; clear bits keep the parent's data.  Bytes of
 * the file that are not block data (batmap, locators, padding, bytes past
 * the virtual size in the last block) are consumed and dropped.  Blocks may
 * be stored in any order of file offset, but all of them after the BAT.
 *
 * FIXED caveat: its footer comes last, so data is emitted before the file
 * can be validated; finish() then fails if the footer is wrong.
 */
struct vhd_stream;

/* sink and opaque are borrowed and must outlive the stream.  -ENOMEM. */
int vhd_stream_new(const struct nbdf_sink *sink, void *opaque,
                   struct vhd_stream **out);

/* Refuse at the first sector what cannot land, before any allocation or
 * callback: a dynamic or differencing VHD whose disk is larger than
 * max_size (-ENOSPC), fixed data running past it (-ENOSPC), and, when
 * accept_fixed is false, anything whose first sector is not a dynamic or
 * differencing footer copy (-EMEDIUMTYPE: garbage, a raw disk, another
 * image format, or a fixed VHD, whose footer comes only at the end).
 * Defaults: VHD_MAX_SIZE, fixed accepted.  Call before the first feed. */
void vhd_stream_limit(struct vhd_stream *s, uint64_t max_size,
                      bool accept_fixed);

/* What the stream's first sector is (common/imagekind.h), once all of it
 * has arrived; IMAGE_UNKNOWN before.  For naming, in a refusal, the view
 * to use instead. */
enum image_kind vhd_stream_first_kind(const struct vhd_stream *s);

/* Bytes [file_off, file_off+len) of the VHD file.  file_off beyond the
 * decode position: the skipped bytes are zeros of the VHD file (cp --sparse,
 * dd conv=sparse).  file_off before it: -EINVAL ("goes backwards"), unless
 * the backwards part lies inside a range recently consumed as a gap or hole
 * (the last 32 are remembered) and is all zero, which is a no-op.  Pieces
 * may have any size and alignment.  Errors are sticky: -EINVAL for
 * malformed input, -EFBIG for sizes over the limits, or the sink's error. */
int vhd_stream_feed(struct vhd_stream *s, uint64_t file_off, const void *buf,
                    size_t len);

/* A punched/zeroed/skipped range: zeros of the VHD file.  Same ordering
 * rules as feed; re-punching a range that was itself a gap is a no-op.  A
 * truncate that extends the file is a hole from the old end to the size. */
int vhd_stream_hole(struct vhd_stream *s, uint64_t file_off, uint64_t len);

/* End of input.  Checks: the first sector was seen; DYNAMIC/DIFF: header
 * and BAT complete, every allocated block received, a trailing footer after
 * the last block byte-identical to the copy at 0; FIXED: the last 512 bytes
 * are a valid footer (disk type 2) whose current_size equals the bytes
 * before it, after which the held-back tail is NOT emitted (it is the
 * footer).  0 or -EINVAL (sticky error returned again). */
int vhd_stream_finish(struct vhd_stream *s);

/* Message for the first error ("" if none).  Valid until the next call. */
const char *vhd_stream_error(const struct vhd_stream *s);

/* Decode position: every byte of the file before it has been consumed. */
uint64_t vhd_stream_position(const struct vhd_stream *s);

/* Kind and virtual size once begin() has been called (else 0 / 0; fixed
 * size known after finish). */
enum vhd_kind vhd_stream_kind(const struct vhd_stream *s);
uint64_t vhd_stream_virtual_size(const struct vhd_stream *s);

/* The VHD file's length as its metadata describes it (dynamic and
 * differencing, once the BAT has arrived: the end of the last block or
 * metadata plus the footer); 0 while unknown (always for fixed). */
uint64_t vhd_stream_expected_length(const struct vhd_stream *s);

void vhd_stream_free(struct vhd_stream *s);

/* ---- synthesizer: a dynamic VHD view of a raw disk ----------------------- */

/* Layout (vhd-tool-like): footer copy at 0, header at 512, BAT at 1536,
 * then for each allocated 2 MiB block in increasing virtual order an
 * all-ones bitmap sector and the block's data, then the footer.  Creator
 * "win " (the Hyper-V convention: current_size is the size) version
 * 0x00010000, OS 0, geometry from vhd_geometry(): qemu 7.2 derives the
 * size from CHS for creators it does not know ("vpc ", "qemu" and any
 * other) and would read a disk that is not CHS-exact short; for "win "
 * it reads current_size (see docs/design/format-vhd.md).  disk bytes past
 * disk_size read as zero. */
struct vhd_synth;

/* disk_size: bytes of the disk (current_size = disk_size rounded up to 512);
 * uuid: 16 bytes, stable per disk so re-reads agree; timestamp: VHD epoch.
 * -EFBIG with a message when current_size > VHD_MAX_SIZE; -EINVAL if 0. */
int vhd_synth_new(uint64_t disk_size, const uint8_t uuid[16],
                  uint32_t timestamp, struct vhd_synth **out,
                  struct nbdf_err *err);

/* Mark every 2 MiB block touched by [disk_off, disk_off+len) allocated.
 * Only before vhd_synth_seal(); -EINVAL if out of range or sealed. */
int vhd_synth_allocate(struct vhd_synth *s, uint64_t disk_off, uint64_t len);

/* Freeze the allocation map and compute the layout; idempotent. */
int vhd_synth_seal(struct vhd_synth *s);

/* Size of the synthesized file (sealed). */
uint64_t vhd_synth_file_size(const struct vhd_synth *s);

/* Fill buf with the synthesized file's bytes [off, off+len) (clipped to the
 * file size; returns the count, 0 at or past the end).  read_disk is called
 * only for allocated blocks, only inside [0, disk_size), and must fill the
 * whole range or return -errno (returned as is). */
typedef int (*vhd_read_disk_fn)(void *opaque, uint64_t disk_off, void *buf,
                                size_t len);
int64_t vhd_synth_read(const struct vhd_synth *s, uint64_t off, void *buf,
                       size_t len, vhd_read_disk_fn read_disk, void *opaque);

void vhd_synth_free(struct vhd_synth *s);

/* ---- the format contract's row (common/format.h; vhd/table.c) ---------- */
extern const struct nbdf_format vhd_format;
/* The vhd_image inside an object of vhd_format's random-access reader
 * (its image_new), for the inspector's VHD-only views; NULL before the
 * footer was supplied. */
const struct vhd_image *vhd_format_image(const void *ra);

#endif /* NBDFERRY_VHD_H */
