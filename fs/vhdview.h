/* fs/vhdview.h: FILENAME.vhd, the disk as a VHD (fs/vhdview.c). */
#pragma once
#include "fs/fs.h"

int  vhdview_init(struct fs *fs);
void vhdview_fini(struct fs *fs);

/* The size getattr reports: the VHD being written, else the synthesized. */
uint64_t vhdview_size(struct fs *fs);

/* Read opens freeze a synthesized VHD into fh->synth; write opens start an
 * ingest owned by fh (-EBUSY if another handle is writing one). */
int  vhdview_open(struct fs *fs, struct fs_fh *fh, int flags);
ssize_t vhdview_read(struct fs *fs, struct fs_fh *fh, char *buf, size_t size,
                     uint64_t off);
ssize_t vhdview_write(struct fs *fs, struct fs_fh *fh, const char *buf,
                      size_t size, uint64_t off);
int  vhdview_hole(struct fs *fs, struct fs_fh *fh, uint64_t off,
                  uint64_t len);
int  vhdview_truncate(struct fs *fs, uint64_t size);
int  vhdview_flush(struct fs *fs, struct fs_fh *fh);
void vhdview_release(struct fs *fs, struct fs_fh *fh);
