/* common/format.h: the one contract every image format library fills (vhd/,
 * vmdk/, qcow2/, vhdx/): a sink its stream decoder writes the decoded disk
 * into, and a table (const struct nbdf_format) of its decoder, its
 * random-access reader and its synthesizer that the views
 * (views/imageview.c), the file reader (imagefile/) and the tools use
 * without knowing which format they hold.  QEMU's BlockDriver, in our words.
 *
 * Adding a format: its library, its table (X/table.c), one view file
 * (views/Xview.c: only what that format says beyond the contract), its
 * tests (tests/lib/formats.py lists it; tests/test_layout.py then asks for
 * its unit and fuzz tests).
 *
 * Conventions are the libraries' (common/err.h): 0 or a negative errno;
 * no I/O; nothing thread-safe on one object. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/imagekind.h"

/* ---- the sink: where a stream decoder puts what it decoded -------------- */

/* What begin() says about the image, once it is known to be valid. */
struct nbdf_begin {
    int kind;                     /* the library's enum (vhd_kind, ...) */
    const char *kind_name;        /* "dynamic", "streamOptimized": the log's */
    uint64_t size;                /* the virtual disk, bytes (a fixed VHD: 0,
                                   * known only at its end) */
    bool overlay;                 /* applied over what the disk holds (a
                                   * differencing VHD/VHDX, a qcow2 with a
                                   * backing file); else the disk becomes
                                   * size bytes of zeros, then the data */
    uint64_t file_len;            /* the image file's length if the header
                                   * says it, else 0 */
    uint32_t unit;                /* size is whole units of this (512, a
                                   * VHDX's logical sector), 0: exact; a disk
                                   * up to unit - 1 bytes shorter takes the
                                   * image if the bytes past it are zero */
    const void *info;             /* the library's own: struct qcow2_header,
                                   * struct vhdx_info; NULL for the others */
};

/* Callbacks run on the thread that calls the decoder's feed, hole or
 * finish; a negative return aborts decoding and is returned from that call
 * (sticky).  Members a format does not use stay NULL; a member a format
 * can use but finds NULL is documented in its header (no spool: a stream
 * that needs one fails saying so; no compressed: the library decodes
 * compressed units itself and calls data). */
struct nbdf_sink {
    /* Exactly once, before any data or zero: the image was validated as
     * far as the format can before the disk changes. */
    int (*begin)(void *opaque, const struct nbdf_begin *b);
    /* Place len bytes at disk_off; buf is valid during the call only. */
    int (*data)(void *opaque, uint64_t disk_off, const void *buf, size_t len);
    /* These bytes of the disk read as zero (an overlay's zero clusters,
     * a hole of a VHD's present sectors). */
    int (*zero)(void *opaque, uint64_t disk_off, uint64_t len);
    /* A compressed unit (struct vmdk_grain, struct qcow2_compressed) for the
     * caller to decode, with the table's unpack hooks, on any thread and
     * place with data(); cdata (clen bytes) is valid during the call only. */
    int (*compressed)(void *opaque, const void *unit, const void *cdata,
                      size_t clen);
    /* Keep file bytes that arrived before what places them, keyed by their
     * file offset; give them back (exactly what was put, possibly in
     * pieces); forget them (drop may be NULL). */
    int (*spool_put)(void *opaque, uint64_t file_off, const void *buf,
                     size_t len);
    int (*spool_get)(void *opaque, uint64_t file_off, void *buf, size_t len);
    void (*spool_drop)(void *opaque, uint64_t file_off);
    /* Optional, for inspectors: what the image maps at [disk_off, +len)
     * (the library's enum, e.g. enum qcow2_map) and where in the file. */
    int (*map)(void *opaque, uint64_t disk_off, uint64_t len, int what,
               uint64_t file_off);
};

/* ---- the table ------------------------------------------------------------ */

/* How a stream is made: limits its owner sets. */
struct nbdf_stream_opts {
    uint64_t max_size;            /* VHD: a disk larger is refused at its
                                   * header (0: the format's limit) */
    bool accept_fixed;            /* VHD: take a fixed VHD (its footer
                                   * comes last: validated at the end) */
    uint64_t spool_max;           /* bytes the spool may hold at once */
    const char *spool_option;     /* named when the spool is full */
};

/* How a synthesizer is made: an image's identity (the same disk should get
 * the same one) and its layout. */
struct nbdf_synth_opts {
    const uint8_t *uuid;          /* 16 bytes: VHD's uuid, VHDX's GUIDs */
    uint32_t timestamp;           /* VHD: seconds since 2000 */
    uint32_t cid;                 /* VMDK: content id */
    const char *name;             /* VMDK: the extent's file name */
    unsigned cluster_bits;        /* qcow2 */
};

/* Compressed units (the sink's compressed()) decoded on worker threads:
 * a unit is a struct of desc_size bytes with its landing offset (uint64_t)
 * at disk_off_at and its compressed bytes (const void *) at cdata_at. */
struct nbdf_unpack {
    const char *what;             /* "inflater": in messages */
    size_t desc_size, disk_off_at, cdata_at;
    size_t out_max;               /* the largest unit, decoded */
    int  (*new_ctx)(void **out);  /* one per thread */
    void (*free_ctx)(void *ctx);
    int64_t (*decode)(void *ctx, const void *desc, void *out,
                      struct nbdf_err *err);
};

/* ---- random access: where each disk byte lives ---------------------------- */

/* What image_lookup() says about the disk bytes from the offset asked. */
enum nbdf_place_kind {
    NBDF_PLACE_FILE,              /* len bytes at file_off of this file */
    NBDF_PLACE_ZERO,              /* read as zero */
    NBDF_PLACE_BACKING,           /* the backing image's bytes at the same
                                   * disk offset (zero past its end, or
                                   * when the image has no backing file) */
    NBDF_PLACE_COMPRESSED,        /* a compressed unit: its bytes are
                                   * [file_off, +clen), it decodes (with
                                   * the table's unpack) to the unit
                                   * starting at disk offset unit_off */
    NBDF_PLACE_NEED,              /* metadata first: image_next() names it,
                                   * image_supply() takes it, then look up
                                   * again */
};

struct nbdf_place {
    enum nbdf_place_kind kind;
    uint64_t len;                 /* disk bytes from the offset asked with
                                   * this placement (NEED: 0); never past a
                                   * unit or the disk's end */
    uint64_t file_off;            /* FILE, COMPRESSED */
    uint64_t clen;                /* COMPRESSED */
    uint64_t unit_off;            /* COMPRESSED */
};

/* How a format names its backing file, which the reader follows. */
enum nbdf_backing_rule {
    NBDF_BACKING_NONE,            /* never has one */
    NBDF_BACKING_LOCATED,         /* VHD: candidate names (locators, then
                                   * the parent's name), each resolved
                                   * inside the child's directory; the
                                   * parent's identity checked */
    NBDF_BACKING_NAMED,           /* qcow2: one name, relative to the
                                   * child's directory (absolute as it is),
                                   * of the format the header says (this
                                   * format or raw; probed when unsaid) */
};

typedef int (*nbdf_read_disk_fn)(void *opaque, uint64_t disk_off, void *buf,
                                 size_t len);

struct nbdf_format {
    const char *name;             /* "VHD": in messages */
    const char *extension;        /* ".vhd" */
    enum image_kind kind;         /* what common/imagekind.h calls it */
    /* Does this buffer (the file's first bytes) begin like this format? */
    bool (*probe)(const void *buf, size_t len);

    /* The forward-only stream decoder: a file arriving in file order. */
    int  (*stream_new)(const struct nbdf_sink *sink, void *opaque,
                       const struct nbdf_stream_opts *opts, void **out);
    /* file_off at or past every byte fed, or zeros over a recent gap or
     * hole; a gap is file zeros. */
    int  (*stream_feed)(void *s, uint64_t file_off, const void *buf,
                        size_t len);
    /* A punched, zeroed or skipped range: zeros of the file. */
    int  (*stream_hole)(void *s, uint64_t file_off, uint64_t len);
    /* End of input: a cut file fails here. */
    int  (*stream_finish)(void *s);
    void (*stream_free)(void *s);
    const char *(*stream_error)(const void *s);   /* "" when none */
    uint64_t (*stream_position)(const void *s);   /* bytes decoded */
    /* The first sector's kind, IMAGE_UNKNOWN before it arrived: for a
     * refusal to name what was written instead. */
    enum image_kind (*stream_first_kind)(const void *s);
    /* Optional: ", 12 grains" for "VMDK received, N bytes". */
    void (*stream_summary)(const void *s, char *buf, size_t n);
    /* Optional: compressed units the caller decodes (sink.compressed,
     * NBDF_PLACE_COMPRESSED). */
    const struct nbdf_unpack *unpack;

    /* The random-access reader, pull-style and I/O-free: image_new for a
     * file of file_size bytes; while image_next() returns 1, read the
     * file's bytes [*off, +*len) and hand them to image_supply(); at 0
     * the image is open (its header, tables, log checked).  Then
     * image_lookup() places each disk byte (disk_off < image_size()); a
     * NEED answer (a VHD block's bitmap, a qcow2 L2 table, a VMDK grain
     * marker) is served the same way and the lookup asked again.  The
     * object keeps what its lookups last needed: one thread at a time.
     * -EINVAL with err->msg: the image breaks a rule. */
    int  (*image_new)(uint64_t file_size, void **out, struct nbdf_err *err);
    int  (*image_next)(const void *img, uint64_t *off, size_t *len);
    int  (*image_supply)(void *img, const void *buf, struct nbdf_err *err);
    int  (*image_lookup)(void *img, uint64_t disk_off, struct nbdf_place *out,
                         struct nbdf_err *err);
    void (*image_free)(void *img);
    uint64_t (*image_size)(const void *img);      /* the virtual disk */
    uint64_t (*image_unit)(const void *img);      /* block, grain, cluster */
    /* COMPRESSED: the descriptor unpack->decode takes for the place's
     * bytes, read into cdata (p->clen bytes); desc has unpack->desc_size
     * bytes.  Optional: formats without compressed units. */
    int  (*image_unpack_desc)(const void *img, const struct nbdf_place *p,
                              const void *cdata, void *desc,
                              struct nbdf_err *err);
    enum nbdf_backing_rule image_backing_rule;
    /* Does this image read through to a backing file (a differencing
     * VHD, a qcow2 naming one)?  Optional: NULL is never. */
    bool (*image_has_backing)(const void *img);
    /* Its candidate names, i = 0, 1, ...: > 0 the name's length in buf
     * (NUL-terminated), 0 no more.  Untrusted: the reader confines them
     * as image_backing_rule says. */
    int  (*image_backing)(const void *img, unsigned i, char *buf, size_t n);
    /* Optional hooks, where a format needs them:
     * the backing file's format as the header says it ("" unsaid; qcow2),
     * whether a file not of this format may be the backing file (raw;
     * VHD: a parent without an id, blktap's raw parents),
     * the backing image's identity (VHD: the parent's id), 0 or -EINVAL
     * with the rule,
     * the file's bytes [file_off, +len) as the image reads them (VHDX:
     * its log replayed over them); then the image may reach past the
     * file's end (zeros there, before the patch). */
    const char *(*image_backing_format)(const void *img);
    bool (*image_backing_raw_ok)(const void *img);
    int  (*image_check_backing)(const void *img, const void *backing,
                                struct nbdf_err *err);
    void (*image_patch)(const void *img, uint64_t file_off, void *buf,
                        size_t len);

    /* The synthesizer: an image of a disk, its allocation frozen by
     * synth_allocate (each data extent, in order) and synth_seal. */
    int  (*synth_new)(uint64_t disk_size, const struct nbdf_synth_opts *o,
                      void **out, struct nbdf_err *err);
    int  (*synth_allocate)(void *sy, uint64_t disk_off, uint64_t len);
    int  (*synth_seal)(void *sy);
    uint64_t (*synth_file_size)(const void *sy);
    /* The file's bytes [off, off+len): the count, 0 past the end; the
     * disk through read_disk. */
    int64_t (*synth_read)(void *sy, uint64_t off, void *buf, size_t len,
                          nbdf_read_disk_fn read_disk, void *opaque);
    void (*synth_free)(void *sy);
    /* Reads of one synthesizer must not run at once (it caches). */
    bool synth_serial;
};
