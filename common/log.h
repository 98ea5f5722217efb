/* common/log.h: the daemon's log (the tools print their own messages).
 *
 * Messages go to stderr while it is the user's terminal (foreground, or
 * before daemonizing) and to syslog afterwards (and to a --log-file in
 * both cases), prefixed with the
 * mountpoint (log_set_context) so that the journal says which mount
 * spoke.  log_err(), log_warn() and log_notice() always print; log_info()
 * only with -v; log_debug() only with -vv; log_trace(), one line per
 * file-system request (fs/trace.h), with -v.  Thread-safe: each message is
 * written with one call.
 *
 * Flooding: each call site (format string) prints at most LOG_BURST lines
 * per LOG_WINDOW_S seconds; the rest are counted and summed up in one line
 * when the site next prints, or at log_flush().  Debug and trace lines
 * are never limited (-v asks for every request).
 *
 * Errors and warnings are also kept, the last LOG_RECENT of them with a
 * repeat count, for the status file (log_recent()).
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define LOG_BURST 5
#define LOG_WINDOW_S 10
#define LOG_RECENT 8

extern int log_verbosity;                /* 0 quiet, 1 -v, 2 -vv */

void log_set_syslog(bool on);            /* switch to syslog after daemonizing */
void log_set_program(const char *name);
/* Prefix of syslog lines, e.g. the mountpoint; borrowed, must outlive
 * the log (NULL: none). */
void log_set_context(const char *context);
/* Start every line the calling thread logs with "SUBJECT: " (a disk's
 * name in a mount of several); borrowed, must outlive the thread's
 * logging (NULL: none). */
void log_set_thread_subject(const char *subject);
/* Also append every line to path (--log-file), whatever goes to stderr
 * or syslog, with the UTC time and the pid.  Created 0600 if missing;
 * -EPERM unless it is a regular file of ours with one link (O_NOFOLLOW:
 * a planted symlink or hard link is never written through). */
int  log_set_file(const char *path);
/* Print the counts of lines still held back by the rate limit. */
void log_flush(void);
/* A progress bar of width columns is now on stderr's current line, redrawn
 * in place ("\r..."); 0: none (the line was ended).  A message written
 * to stderr first clears it ("\r", spaces, "\r"), so it never lands on
 * the end of the bar; the bar's next redraw comes back below it. */
void log_bar_drawn(size_t width);

void log_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* log_err(), log_notice(), log_info() limited as the call site site (any address that is one
 * thing's: code shared by several objects keeps their floods apart). */
void log_err_site(const void *site, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void log_notice_site(const void *site, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void log_info_site(const void *site, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_notice(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_trace(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

struct log_entry {
    bool error;                          /* else a warning */
    time_t first, last;                  /* CLOCK_REALTIME seconds */
    uint64_t repeated;                   /* identical messages, >= 1 */
    char msg[256];
};

/* Errors and warnings logged so far (also those the rate limit held
 * back), and up to LOG_RECENT of the latest, oldest first, in out;
 * returns how many. */
unsigned log_recent(struct log_entry *out, uint64_t *errors,
                    uint64_t *warnings);
