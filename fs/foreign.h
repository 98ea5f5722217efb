/* fs/foreign.h: a file of one format written where another is expected.
 *
 * The raw file takes any bytes (a disk is whatever is written), but a
 * known image header (common/imagekind.h) written at offset 0 is almost
 * always a container copied by mistake where its disk was meant: it is
 * written as asked and warned about, once per copy, in the log and the
 * status, naming the view or the command to use.  The format views refuse
 * what is not their format (fs/vhdview.c, fs/vmdkview.c) and name, from
 * here, what to do instead.
 *
 * THREAD MODEL: any FUSE thread; the once-per-copy flag is atomic. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "common/imagekind.h"
#include "fs/fs.h"

/* What to do with a file of kind k that was written into the view ino:
 * "write it into MNT/nbd.vhd", "use qemu-img convert ...", in buf (n
 * bytes).  NULL: nothing to say (unknown, or ino's own format). */
const char *foreign_advice(const struct fs_disk *d, enum image_kind k,
                           enum fs_ino ino, char *buf, size_t n);

/* A write of the raw file landed [off, off + len) from buf: at offset 0
 * with a known header, warn (once until foreign_raw_pass()). */
void foreign_raw_write(struct fs_disk *d, uint64_t off, const void *buf,
                       size_t len);
/* A new writer of the raw file: its copy is warned about afresh. */
void foreign_raw_pass(struct fs_disk *d);
