/* daemon/fuseuring.h: FUSE over io_uring (--fuse-io-uring), where
 * libfuse (>= 3.18, built with liburing) and the kernel can have it. */
#pragma once
#include <stdbool.h>

struct fuse_session;

/* asked: the user asked for io_uring.  True if the mount is to ask
 * libfuse for it (the build has the API, the kernel's fuse module has
 * enable_uring on, libfuse was built with liburing); asked but false:
 * says why once (the mount is served through /dev/fuse). */
bool fuseuring_wanted(bool asked);

/* Serve se with libfuse's loop (fuse_session_loop_mt() with at most
 * max_workers threads for /dev/fuse, or fuse_session_loop() if
 * single_thread), which starts libfuse's rings at INIT and stops them at
 * its end; then fuse_session_reset() it.  Returns the loop's result. */
int fuseuring_serve(struct fuse_session *se, unsigned max_workers,
                    bool single_thread);
