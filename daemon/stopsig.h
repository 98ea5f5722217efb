/* daemon/stopsig.h: the daemon's stop signals (SIGTERM, SIGINT, SIGHUP).
 *
 * The first ends the FUSE session, as libfuse's own handler does; the
 * unmount then drains every write and sends the pending zeroes.  That
 * drain can be long (a truncate of a large disk, nothing known zero, on
 * a server that zeroes slowly), so a second stop signal, during it or
 * during a close's drain, gives the zeroing up (pool_abandon_zeroing()):
 * the ranges left are logged and the daemon exits 1. */
#pragma once
#include "fs/fs.h"

/* After fuse_set_signal_handlers(): take the stop signals over from
 * libfuse; a second one abandons the zeroing of every pool in
 * pools[0..npools) (borrowed until stopsig_stop()).  -errno (libfuse's
 * handlers stay). */
int  stopsig_start(struct fuse_session *se, struct pool *const *pools,
                   unsigned npools);

/* stopsig_start() succeeded and stopsig_stop() has not run. */
bool stopsig_started(void);

/* Before fuse_session_destroy(): a signal no longer touches se. */
void stopsig_session_end(void);

/* After the last drain: stop signals are ignored from now on (a signal
 * must not kill the rest of the teardown either).  No-op if never
 * started. */
void stopsig_stop(void);
