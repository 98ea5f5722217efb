/* fs/fusetimeout.h: the kernel's FUSE request timeout (Linux 6.15 and
 * later: /proc/sys/fs/fuse/default_request_timeout and
 * max_request_timeout).  A FUSE request the daemon has not answered in
 * that time gets the whole mount aborted by the kernel.  The waits the
 * daemon makes a request do (a WRITE on a full pool, a FLUSH or close
 * waiting for replies, a reconnect) end at --request-timeout +
 * --retry-timeout at most, so those are fitted below it: the daemon
 * answers EIO itself instead. */
#pragma once
#include "transport/nbdx.h"

/* Seconds after which the kernel aborts a mount made now over a request
 * left unanswered (0: never).  libfuse 3.14 asks for no timeout of its
 * own, so the kernel's default applies, capped by its maximum. */
unsigned fusetimeout_kernel_s(void);

/* Shorten cfg's request and retry timeouts (logged, with why) so that
 * their sum stays FUSETIMEOUT_MARGIN_S below the kernel's timeout. */
#define FUSETIMEOUT_MARGIN_S 5
void fusetimeout_fit(struct nbdx_config *cfg);
