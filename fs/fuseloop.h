/* fs/fuseloop.h: the FUSE receive loop (instead of fuse_session_loop_mt). */
#pragma once
#include "fs/fs.h"

/* Writes received straight into their pool buffer (see LANDINGS in
 * fs/fuseloop.c).  Called on the receiving thread only. */
struct fuseloop_landing {
    /* Before each read of /dev/fuse: where the payload of the request
     * should go if it is a write (*room bytes there), or NULL. */
    void *(*begin)(void *opaque, size_t *room);
    /* The request was a write whose whole payload (size bytes) is at the
     * place begin() gave.  Serve it: bytes written or -errno, the reply;
     * -EAGAIN: not from there (the loop hands libfuse a copy). */
    ssize_t (*write)(void *opaque, uint64_t nodeid, uint64_t fh,
                     uint64_t off, uint32_t size, uint32_t pid);
    /* A write that must wait for the server before its reply (the end of
     * a copy: fs/ops.c): served by a worker, never landed.  NULL: none. */
    bool (*waits)(void *opaque, uint64_t nodeid, uint64_t fh, uint64_t off,
                  uint32_t size);
    /* After each request, whatever it was: the place is given back. */
    void (*end)(void *opaque);
    /* A READ whose bytes are ready without waiting (the read-ahead holds
     * them): 1 and iov[0..*niov) (at most FUSELOOP_READ_IOV) to reply
     * with, kept until read_done(); 0: the usual way, to a worker.  NULL:
     * every read goes to a worker. */
    int (*read)(void *opaque, uint64_t nodeid, uint64_t fh, uint64_t off,
                uint32_t size, uint32_t pid, struct iovec *iov,
                unsigned *niov);
    void (*read_done)(void *opaque);
    /* An LSEEK (SEEK_DATA or SEEK_HOLE) answered without waiting (the raw
     * file's map of holes is in memory): 1 and *res, the offset or
     * -errno to reply with; 0: the usual way, to a worker.  NULL: every
     * lseek goes to a worker. */
    int (*seek)(void *opaque, uint64_t nodeid, uint64_t fh, uint64_t off,
                uint32_t whence, uint32_t pid, int64_t *res);
    void *opaque;
};
#define FUSELOOP_READ_IOV 2

/* fs/ops.c: the landing that puts raw-file writes into the pool. */
void fs_landing(struct fs *fs, struct fuseloop_landing *out);

/* Serve se until it exits (unmount or signal), then fuse_session_reset()
 * it.  The calling thread reads every request and serves writes itself;
 * other requests go to worker threads (at most max_workers), so a read
 * or an fsync waiting for the server holds up nothing else.  Returns 0,
 * or -errno if the loop could not start or /dev/fuse failed. */
int fuseloop_run(struct fuse_session *se, unsigned max_workers,
                 const struct fuseloop_landing *landing);
