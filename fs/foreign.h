/* fs/foreign.h: a file of one format written where another is expected.
 *
 * The raw file is the disk's bytes, but a known image header
 * (common/imagekind.h) written at offset 0 is almost always a container
 * copied by mistake where its disk was meant (`cp disk.qcow2 MNT/nbd`).
 * Such a write is refused with EMEDIUMTYPE before anything of it is
 * queued, and so is every later change through the same handle: the copy
 * tool fails, the disk keeps what it held, and the log and the status
 * name the view or the command to use.  With --raw-images (cfg.raw_images:
 * an image file stored on an export on purpose, a nested image) it is
 * written as asked and warned about, once per copy.  Only what the first
 * sector shows is seen: a fixed VHD (raw data, its footer at the end) and
 * an image whose header is not written first are written as they come.
 * The format views refuse what is not their format (views/vhdview.c,
 * views/vmdkview.c) and name, from here, what to do instead.
 *
 * THREAD MODEL: any FUSE thread; the once-per-copy flag and a handle's
 * refusal are atomic. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "common/imagekind.h"
#include "fs/fs.h"

/* What to do with a file of kind k that was written into the view ino:
 * "write it into /mnt/disk/nbd.vhd", "use qemu-img convert ...", in buf
 * (n bytes), with the mount's own directory.  NULL: nothing to say
 * (unknown, or ino's own format). */
const char *foreign_advice(const struct fs_disk *d, enum image_kind k,
                           enum fs_ino ino, char *buf, size_t n);

/* msg with the format libraries' placeholders spelled for this mount:
 * "MNT/nbd" (the raw file) as MOUNTPOINT/FILENAME, any other "MNT/" as
 * MOUNTPOINT/ (a file-mode mount, which has no directory, keeps MNT).
 * Into out (n bytes); returns out. */
const char *foreign_place(const struct fs_disk *d, const char *msg,
                          char *out, size_t n);

/* A write of len bytes of buf at off through fh into the raw file, before
 * anything of it is queued: -EMEDIUMTYPE (logged, and fh refuses every
 * later change) if it is an image file's first sector and the mount does
 * not take image files as raw bytes; else 0. */
int foreign_raw_check(struct fs_disk *d, struct fs_fh *fh, uint64_t off,
                      const void *buf, size_t len);
/* A write of the raw file landed [off, off + len) from buf: at offset 0
 * with a known header (--raw-images), warn (once until
 * foreign_raw_pass()). */
void foreign_raw_write(struct fs_disk *d, uint64_t off, const void *buf,
                       size_t len);
/* A new writer of the raw file: its copy is warned about afresh. */
void foreign_raw_pass(struct fs_disk *d);
