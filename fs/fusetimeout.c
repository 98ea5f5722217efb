/* fs/fusetimeout.c: fitting the daemon's timeouts below the kernel's
 * FUSE request timeout (see fusetimeout.h).
 *
 * THREAD MODEL
 * Runs once on the main thread, before the connections open.
 */
#include "fs/fusetimeout.h"

#include <stdio.h>

#include "common/log.h"

static unsigned read_knob(const char *path)
{
    FILE *f = fopen(path, "re");
    unsigned v = 0;

    if (!f)
        return 0;                         /* older kernel: no timeout */
    if (fscanf(f, "%u", &v) != 1)
        v = 0;
    fclose(f);
    return v;
}

unsigned fusetimeout_kernel_s(void)
{
    unsigned def = read_knob("/proc/sys/fs/fuse/default_request_timeout");
    unsigned max = read_knob("/proc/sys/fs/fuse/max_request_timeout");

    if (!def)
        return max;
    return max && max < def ? max : def;
}

void fusetimeout_fit(struct nbdx_config *cfg)
{
    unsigned k = fusetimeout_kernel_s();

    if (!k)
        return;
    /* What a request may wait: a whole stall (request + retry timeout)
     * and the margin; 0 (wait forever) cannot fit at all. */
    unsigned budget = k > FUSETIMEOUT_MARGIN_S + 2 ? k - FUSETIMEOUT_MARGIN_S
                                                   : 2;
    unsigned req = cfg->request_timeout_s, retry = cfg->retry_timeout_s;

    if (req && req + retry <= budget)
        return;
    if (!req || req > budget / 2)
        req = budget / 2;
    if (req + retry > budget)
        retry = budget - req;
    log_warn("the kernel aborts a FUSE mount whose request waits %u s "
             "(/proc/sys/fs/fuse request timeout): --request-timeout %u s "
             "and --retry-timeout %u s shortened to %u s and %u s, so a "
             "request on a silent server fails with EIO instead",
             k, cfg->request_timeout_s, cfg->retry_timeout_s, req, retry);
    cfg->request_timeout_s = req;
    cfg->retry_timeout_s = retry;
}
