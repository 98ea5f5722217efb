/* imagefile/imagefile.h: an image file of any format and its backing
 * chain, read with pread.
 *
 * The format libraries (vhd/, vmdk/, qcow2/, vhdx/) do no I/O; this is
 * the one layer that does, over their tables' random-access members
 * (common/format.h): it reads what an image's pull loop asks for, places
 * each disk byte with image_lookup() (reading the metadata a lookup
 * needs), inflates compressed units with the table's unpack hooks, and
 * follows backing chains (a VHD's parent through its locators, a qcow2's
 * backing file by name) with their checks: loops, a depth limit, the
 * parent's identity.  Shared by the inspector (nbdferry-vhd cat) and
 * nbdferry-verify (an image SOURCE).
 *
 * Errors: 0 or a negative errno.  Not thread-safe: one thread per chain
 * (each member keeps the metadata and the decoded unit it last read).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/err.h"
#include "common/format.h"

#define IMAGEFILE_CHAIN_MAX 32          /* backing levels followed */

struct imagefile {
    char *path;                         /* owned: as opened */
    int fd;                             /* owned */
    dev_t dev;
    ino_t ino;
    uint64_t file_size;
    const struct nbdf_format *fmt;      /* NULL: a raw file */
    void *img;                          /* owned: fmt's image object */
    uint64_t size;                      /* the disk (raw: the file's size) */
    struct imagefile *backing;          /* owned; NULL until the chain opens */
    /* The reader's own: */
    uint8_t *meta;                      /* owned: bytes for image_supply */
    size_t meta_cap;
    void *uctx;                         /* owned: fmt->unpack's context */
    void *desc;                         /* owned: its unit descriptor */
    uint8_t *cbuf;                      /* owned: a unit's compressed bytes */
    size_t ccap;
    uint8_t *unit;                      /* owned: the last decoded unit */
    size_t unit_cap;
    uint64_t unit_off;                  /* its disk offset; UINT64_MAX: none */
};

/* Open the image at path as format fmt (NULL: raw) and run its pull loop.
 * raw_ok: a file that is not a valid fmt image (-EINVAL) is taken as
 * raw instead.  On failure err->msg is the rule the image breaks without
 * the path, or "" (an I/O or memory error, a directory: -EISDIR). */
int imagefile_open(const char *path, const struct nbdf_format *fmt,
                   bool raw_ok, struct imagefile **out, struct nbdf_err *err);
/* Same on an open descriptor, which it takes over, even on error. */
int imagefile_open_fd(const char *path, int fd, const struct nbdf_format *fmt,
                      bool raw_ok, struct imagefile **out,
                      struct nbdf_err *err);
/* Frees f and its backing chain.  NULL is fine. */
void imagefile_free(struct imagefile *f);

/* Open the backing chain below top, as its format's rule says
 * (common/format.h, enum nbdf_backing_rule), down to an image without
 * one.  A VHD's parents: parents[i] (i < nparents, borrowed) for level i
 * (0: top's parent), deeper levels through their locators and then the
 * unicode name, each resolved inside the child's directory; each parent's
 * identity checked (-EINVAL), a parent not found -ENOENT.  A qcow2's
 * backing file: its name relative to the naming image's directory, of
 * the format its header says (qcow2 or raw; probed when unsaid), not a
 * protocol (-EMEDIUMTYPE).  At most IMAGEFILE_CHAIN_MAX levels, and a
 * file met twice (device and inode) is a loop.  err->msg is a whole line
 * naming the files involved. */
int imagefile_open_chain(struct imagefile *top, const char *const *parents,
                         size_t nparents, struct nbdf_err *err);
/* Backing levels in the chain below top (0: none). */
unsigned imagefile_chain_depth(const struct imagefile *top);

/* pread exactly len bytes; -EIO if the file ends first. */
int imagefile_pread(int fd, void *buf, size_t len, uint64_t off);

/* Read bytes [off, off + len) of the chain's disk (off + len <= f->size).
 * Bytes of a backing image smaller than its child read as zero.  On
 * failure err->msg is "PATH: rule" when an image breaks a rule, else "". */
int imagefile_read(struct imagefile *f, uint64_t off, void *buf, size_t len,
                   struct nbdf_err *err);

/* Describe [off, off + max) (max >= 1, off + max <= f->size): *len >= 1
 * bytes from off are all known zero (*zero) or all to be read.  Only
 * metadata is read.  err as imagefile_read(). */
int imagefile_extent(struct imagefile *f, uint64_t off, uint64_t max,
                     uint64_t *len, bool *zero, struct nbdf_err *err);
