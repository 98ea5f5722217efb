/* fs/fuseloop.h: the FUSE receive loop (instead of fuse_session_loop_mt). */
#pragma once
#include "fs/fs.h"

/* Serve se until it exits (unmount or signal), then fuse_session_reset()
 * it.  The calling thread reads every request and serves writes itself;
 * other requests go to worker threads (at most max_workers), so a read
 * or an fsync waiting for the server holds up nothing else.  Returns 0,
 * or -errno if the loop could not start or /dev/fuse failed. */
int fuseloop_run(struct fuse_session *se, unsigned max_workers);
