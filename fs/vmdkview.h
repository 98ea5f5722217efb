/* fs/vmdkview.h: FILENAME.vmdk, the disk as a VMDK (fs/vmdkview.c). */
#pragma once
#include "fs/fs.h"

int  vmdkview_init(struct fs *fs);
void vmdkview_fini(struct fs *fs);

/* The size getattr reports: the VMDK being written, else the synthesized. */
uint64_t vmdkview_size(struct fs *fs);

/* Read opens freeze a synthesized VMDK into fh->vmdk_synth; write opens
 * start an ingest owned by fh (-EBUSY if another handle is writing one). */
int  vmdkview_open(struct fs *fs, struct fs_fh *fh, int flags);
ssize_t vmdkview_read(struct fs *fs, struct fs_fh *fh, char *buf, size_t size,
                      uint64_t off);
ssize_t vmdkview_write(struct fs *fs, struct fs_fh *fh, const char *buf,
                       size_t size, uint64_t off);
int  vmdkview_hole(struct fs *fs, struct fs_fh *fh, uint64_t off,
                   uint64_t len);
int  vmdkview_truncate(struct fs *fs, uint64_t size);
int  vmdkview_flush(struct fs *fs, struct fs_fh *fh);
void vmdkview_release(struct fs *fs, struct fs_fh *fh);
