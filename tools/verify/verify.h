/* tools/verify/verify.h: internal interfaces of nbdferry-verify.
 *
 * Data flow, per side (SOURCE or DESTINATION):
 *
 *   verify_source --(in-order segments: data or known-zero)--> sink
 *
 * A source delivers the byte range [0, sink->end) to its sink strictly in
 * offset order, as a sequence of sink_data() (bytes it read) and sink_zero()
 * (ranges it knows read as zero, never transferred) calls.  The sink feeds
 * the whole-stream EVP digest, the per-block fingerprints used to locate
 * mismatches, and (past sink->digest_len) the "tail reads as zero" check.
 *
 * Nothing here is shared between the two sides except the abort flag and
 * the read-only fingerprint tables and zero buffer.
 */
#pragma once

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include <openssl/evp.h>

#include "digest/blkhash.h"
#include "digest/verify-sink.h"

#define VERIFY_EXIT_MATCH    0
#define VERIFY_EXIT_MISMATCH 1
#define VERIFY_EXIT_ERROR    2

/* --request-timeout's default: a server that stops answering fails the
 * run instead of hanging it. */
#define VERIFY_REQUEST_TIMEOUT_S 60

/* source.c: the interface every kind of operand implements. */
enum source_format {
    SOURCE_FORMAT_AUTO,                  /* decode VHD, VMDK, VHDX, qcow2,
                                            refuse other images (the
                                            default) */
    SOURCE_FORMAT_RAW,                   /* every file as its bytes (--raw) */
    SOURCE_FORMAT_VHD,
    SOURCE_FORMAT_VMDK,
    SOURCE_FORMAT_VHDX,
    SOURCE_FORMAT_QCOW2,
};

struct source_options {
    enum source_format format;           /* of file operands (not NBD) */
    size_t request_size;                 /* bytes per read request */
    unsigned requests;                   /* NBD reads in flight per side */
    unsigned connections;                /* NBD connections, if multi-conn */
    bool use_extents;                    /* SEEK_DATA/HOLE, block status */
    unsigned request_timeout_s;          /* NBD: no reply progress for this
                                          * long fails the side; 0: wait
                                          * forever */
    const char *const *vhd_parents;      /* --parent: level i's parent */
    size_t vhd_nparents;                 /* only for a VHD SOURCE */
};

struct verify_source;

struct verify_source_ops {
    const char *kind;                    /* "file", "nbd", "vhd", "vmdk",
                                          * "vhdx", "qcow2" */
    /* Pipelined sources (NBD) deliver [0, k->end) to the sink themselves.
     * Simple sources (file, VHD) leave run NULL and implement extent() and
     * read(); source_run() drives them. */
    int (*run)(struct verify_source *s, struct sink *k);
    /* Describe [off, off + *len) with off < end: *zero means the range
     * reads as zero and need not be read.  *len >= 1, off + *len <= end. */
    int (*extent)(struct verify_source *s, uint64_t off, uint64_t end,
                  uint64_t *len, bool *zero);
    /* Read exactly len bytes at off (off + len <= size). */
    int (*read)(struct verify_source *s, void *buf, size_t len, uint64_t off);
    bool read_any_thread;                /* read() is safe on any thread */
    void (*close)(struct verify_source *s);   /* frees s */
};

struct verify_source {
    const struct verify_source_ops *ops;
    const char *name;                    /* borrowed: the operand as given */
    uint64_t size;
    const struct source_options *opt;    /* borrowed, outlives s */
};

/* What a file holds, from its first bytes (and a VHD's footer at its
 * end).  The images and archives a user may mistake for a disk are
 * named, so that they are never hashed as raw bytes unasked. */
enum probed {
    PROBED_RAW, PROBED_VHD, PROBED_VMDK, PROBED_VMDK_DESCRIPTOR,
    PROBED_QCOW2, PROBED_VHDX, PROBED_TAR,
};
/* PROBED_* from the first n bytes (a VHD only by its footer copy), and
 * its name ("VMDK descriptor (its extents are other files)", ...). */
int source_probe_head(const void *head, size_t n);
const char *source_probed_name(int probed);
/* Opens an operand: an NBD URI if it contains "://", else a path.  A file
 * is read as opt->format says; SOURCE_FORMAT_AUTO decodes a VHD, a VMDK, a
 * VHDX or a qcow2 and refuses (-EMEDIUMTYPE) an image or archive it
 * recognises but does not decode (a VMDK descriptor, tar/OVA), naming it.  The
 * operand that is_source names may take opt->vhd_parents (a VHD only).
 * Logs the reason on failure. */
int  source_open(const char *operand, const struct source_options *opt,
                 bool is_source, struct verify_source **out);
int  source_run(struct verify_source *s, struct sink *k);
/* What the first n bytes of a pipe say it is (an image or archive), or
 * NULL for raw bytes: a pipe cannot be decoded (no random access). */
const char *source_probe_stream(const void *head, size_t n);
void source_close(struct verify_source *s);   /* NULL is fine */

/* source-stream.c: a pipe (the operand "-" when stdin is not a file or
 * a block device).  Its size is unknown (VERIFY_SIZE_UNKNOWN) until it has
 * run; then it is the number of bytes read.  Everything is data. */
#define VERIFY_SIZE_UNKNOWN UINT64_MAX
int src_stream_open(const char *name, int fd, const struct source_options *opt,
                    struct verify_source **out);  /* takes fd, even on error */

/* source-file.c: regular file or block device; holes via SEEK_DATA/HOLE. */
int src_file_open(const char *path, int fd, const struct source_options *opt,
                  struct verify_source **out);   /* takes fd, even on error */

/* source-image.c: VHD (fixed, dynamic, differencing), VMDK
 * (streamOptimized, monolithicSparse), VHDX (fixed, dynamic) and qcow2
 * (versions 2 and 3, compressed clusters, backing chains of qcow2 or raw
 * files) over imagefile/, decoded to the virtual disk; what the image maps
 * as zero is known zero without reading. */
/* 1 if fd looks like a VHD ("conectix" cookie in the first sector or the
 * last one), 0 if not, -errno if it cannot be read. */
int src_vhd_probe(int fd, uint64_t size);
/* f: SOURCE_FORMAT_VHD, _VMDK, _VHDX or _QCOW2.  The chain of a VHD takes
 * opt->vhd_parents. */
int src_image_open(const char *path, int fd, enum source_format f,
                   const struct source_options *opt,
                   struct verify_source **out);  /* takes fd, even on error */

/* source-nbd.c: libnbd, pipelined reads, base:allocation block status. */
int src_nbd_open(const char *uri, const struct source_options *opt,
                 struct verify_source **out);

/* report.c */

struct verify_side_report {
    const struct verify_source *src;     /* borrowed */
    const struct sink *k;                /* borrowed; NULL: not read */
};

struct verify_report {
    const char *algorithm;
    struct verify_side_report side[2];   /* SOURCE, DESTINATION */
    const char *size_problem;            /* sizes don't fit: why, or NULL */
    bool zero_tail;                      /* --zero-tail was asked for */
    uint64_t compared;                   /* bytes that entered the digests */
    uint64_t block_size;
    double elapsed;                      /* seconds */
    bool match;
    const struct verify_range *ranges;   /* all mismatching ranges, merged */
    size_t nranges;
    uint64_t mismatch_bytes;
    size_t max_ranges;                   /* list at most this many; 0: all */
};

/* Merged ranges of blocks whose fingerprints differ, as byte ranges clipped
 * to 'compared'.  *out is malloc'ed (may be NULL when *n is 0). */
int  report_ranges(const struct sink *a, const struct sink *b,
                   uint64_t compared, struct verify_range **out, size_t *n,
                   uint64_t *bytes);
void report_text(FILE *f, const struct verify_report *r);
void report_json(FILE *f, const struct verify_report *r);
/* One operand: "DIGEST  NAME" like sha256sum, or JSON. */
void report_single(FILE *f, const struct verify_report *r, bool json);
