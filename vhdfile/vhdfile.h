/* vhdfile/vhdfile.h: a VHD file and its differencing chain, read with pread.
 *
 * The vhd/ library does no I/O; this is the small layer that does, shared by
 * the inspector (nbdferry-vhd cat) and nbdferry-verify (a VHD SOURCE).  It
 * parses a file with vhd_image_next()/vhd_image_supply(), finds parents
 * through the locators (inside the child's directory only) or explicit
 * paths, and answers reads and "is this range known zero?" for the virtual
 * disk by walking the chain with vhd_image_lookup().
 *
 * Errors: 0 or a negative errno.  -EINVAL means the VHD or the chain is
 * invalid (err->msg names the rule); -ENOENT from vhdfile_open_chain() means
 * a parent could not be found; anything else is I/O or memory.  Not
 * thread-safe: one thread per chain (reads cache a block bitmap).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/err.h"
#include "vhd/vhd.h"

#define VHDFILE_CHAIN_MAX 32            /* differencing levels followed */

struct vhdfile {
    char *path;                         /* owned */
    int fd;                             /* owned */
    dev_t dev;
    ino_t ino;
    uint64_t file_size;
    struct vhd_image *img;              /* owned; NULL: raw parent */
    uint64_t size;                      /* virtual size (raw: file size) */
    struct vhdfile *parent;             /* owned; NULL until the chain opens */
    uint32_t bm_block;                  /* block whose bitmap bm holds */
    uint8_t *bm;                        /* owned, bitmap_bytes long */
};

/* Open and parse the VHD at path.  raw_ok: a file that is not a valid VHD
 * is taken as a raw image (blktap allows raw parents).  For -EINVAL,
 * err->msg is the broken rule without the path; for other errors it is
 * "PATH: reason". */
int vhdfile_open(const char *path, bool raw_ok, struct vhdfile **out,
                 struct nbdf_err *err);
/* Same on an open descriptor, which it takes over, even on error. */
int vhdfile_open_fd(const char *path, int fd, bool raw_ok,
                    struct vhdfile **out, struct nbdf_err *err);
/* Frees m and its parents.  NULL is fine. */
void vhdfile_free(struct vhdfile *m);

/* Open the parents of a differencing top, down to a non-differencing
 * image.  parents[i] (i < nparents, borrowed) is used as the parent of
 * level i (0: top's parent) instead of the locators; deeper levels use
 * their locators and then the unicode name, each resolved inside the
 * child's directory.  Each parent's footer id must equal the child's
 * parent id.  err->msg is a whole line naming the files involved. */
int vhdfile_open_chain(struct vhdfile *top, const char *const *parents,
                       size_t nparents, struct nbdf_err *err);
/* Differencing levels in the chain below top (0: not differencing). */
unsigned vhdfile_chain_depth(const struct vhdfile *top);

/* pread exactly len bytes; -EIO if the file ends first. */
int vhdfile_pread(int fd, void *buf, size_t len, uint64_t off);

/* Read virtual bytes [off, off + len) of the chain's disk (off + len <=
 * m->size).  Bytes of a parent smaller than its child read as zero. */
int vhdfile_read(struct vhdfile *m, uint64_t off, void *buf, size_t len);

/* Describe [off, off + max) (max >= 1, off + max <= m->size): *len >= 1
 * bytes from off are all known zero (*zero) or all to be read.  Unallocated
 * blocks and clear bitmap bits of dynamic disks, and those of differencing
 * disks whose parent reads zero there, are zero; nothing but bitmaps is
 * read. */
int vhdfile_extent(struct vhdfile *m, uint64_t off, uint64_t max,
                   uint64_t *len, bool *zero);
