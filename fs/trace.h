/* fs/trace.h: one line per FUSE request under -v, as libnbd's nbdfuse
 * does, so that a user's log shows the copy tool's exact pattern:
 *
 *   static void op_write(fuse_req_t req, fuse_ino_t ino, const char *buf,
 *                        size_t size, off_t off, struct fuse_file_info *fi)
 *   {
 *       TRACE(req, "write ino=%" PRIu64 " off=%jd len=%zu", (uint64_t) ino,
 *             (intmax_t) off, size);
 *
 * prints "pid 4242: write ino=2 off=1048576 len=1048576" (the pid is the
 * process that made the request).  Cheap when not verbose: one load and
 * a predicted branch; the arguments are not evaluated.  The lines are
 * never rate-limited (log_trace()). */
#pragma once
#include <inttypes.h>
#include <stdint.h>

#include "common/log.h"
#include "fs/fs.h"

/* The requesting process, or 0 without a request (req NULL). */
static inline int trace_pid(fuse_req_t req)
{
    const struct fuse_ctx *ctx = req ? fuse_req_ctx(req) : NULL;
    return ctx ? (int) ctx->pid : 0;
}

#define TRACE(req, fmt, ...)                                                 \
    do {                                                                     \
        if (__builtin_expect(log_verbosity >= 1, 0))                         \
            log_trace("pid %d: " fmt, trace_pid(req), ##__VA_ARGS__);        \
    } while (0)
