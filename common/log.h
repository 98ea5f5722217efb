/* common/log.h: one log for the daemon and the tools.
 *
 * Messages go to stderr while it is the user's terminal (foreground, or
 * before daemonizing) and to syslog afterwards.  log_err(), log_warn() and log_notice()
 * always print; log_info() only with -v; log_debug() only with -vv.
 * Thread-safe: each message is written with one call.
 */
#pragma once
#include <stdbool.h>

extern int log_verbosity;                /* 0 quiet, 1 -v, 2 -vv */

void log_set_syslog(bool on);            /* switch to syslog after daemonizing */
void log_set_program(const char *name);

void log_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_notice(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
