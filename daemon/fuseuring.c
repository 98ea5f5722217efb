/* daemon/fuseuring.c: FUSE over io_uring (docs/design/README.md, "FUSE
 * over io_uring").
 *
 * libfuse 3.18 starts its rings (a thread, ring and queue per CPU) while
 * it serves INIT, whichever loop read it, and stops them
 * (fuse_uring_stop(), internal) only at the end of its own loops.  A
 * mount served by fs/fuseloop.c would leave them running into
 * fuse_session_destroy(), so an io_uring mount is served by libfuse's
 * loop.  Once the rings run, every request but INIT, FORGET and
 * INTERRUPT arrives in a ring buffer, not through /dev/fuse, so our
 * loop's landings could not apply anyway: a write is copied from the
 * ring's buffer into the pool (fs/ops.c: op_write_buf()), as from
 * libfuse's own buffer.
 */
#include "daemon/fuseuring.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>

#include "config.h"
#include "common/log.h"
#include "fs/fs.h"

#define URING_PARAM "/sys/module/fuse/parameters/enable_uring"

#if HAVE_FUSE_URING
static bool kernel_allows(void)
{
    char c = 'N';
    FILE *f = fopen(URING_PARAM, "re");

    if (f) {
        if (fscanf(f, " %c", &c) != 1)
            c = 'N';
        fclose(f);
    }
    return c == 'Y' || c == 'y' || c == '1';
}
#endif

bool fuseuring_wanted(bool asked)
{
    if (!asked)
        return false;
#if HAVE_FUSE_URING
    if (!kernel_allows()) {
        log_notice("--fuse-io-uring: the kernel's fuse module has io_uring "
                   "off (%s is not Y; as root: echo Y > %s): serving "
                   "through /dev/fuse", URING_PARAM, URING_PARAM);
        return false;
    }
    /* libfuse 3.18 has the API whatever it was built with, but without
     * liburing (Debian's libfuse3-4 3.18.3) its rings never start ("fuse:
     * failed to start io-uring: Unknown error -95"): our loop then serves
     * better than libfuse's.  Built with it, libfuse brought liburing in
     * with it. */
    if (dlsym(RTLD_DEFAULT, "io_uring_queue_init_params"))
        return true;
    log_notice("--fuse-io-uring: this libfuse was built without io_uring "
               "(it does not load liburing): serving through /dev/fuse");
#else
    log_notice("--fuse-io-uring: this build's libfuse has no io_uring "
               "(3.18 or later has): serving through /dev/fuse");
#endif
    return false;
}

int fuseuring_serve(struct fuse_session *se, unsigned max_workers,
                    bool single_thread)
{
    log_info("fuse: io_uring asked: libfuse's loop serves the mount");
    if (single_thread)
        return fuse_session_loop(se);
    struct fuse_loop_config *cfg = fuse_loop_cfg_create();
    if (!cfg)
        return -ENOMEM;
    fuse_loop_cfg_set_max_threads(cfg, max_workers);
    fuse_loop_cfg_set_clone_fd(cfg, 0);
    int r = fuse_session_loop_mt(se, cfg);
    fuse_loop_cfg_destroy(cfg);
    fuse_session_reset(se);
    return r;
}
