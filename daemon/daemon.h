/* daemon/daemon.h: the daemon's start: the pidfile's directory, the fork
 * before any thread exists, the readiness pipe the waiting parent reads,
 * the pidfile once mounted, and leaving the terminal.
 *
 * Order (daemon/main.c): daemon_prepare() while parsing is fresh (a relative
 * -P path names the start directory), daemon_fork() before connecting
 * (unless -f), daemon_write_pidfile() once mounted, daemon_detach() when
 * the mount serves, daemon_fini() at exit.  One thread: main()'s. */
#pragma once
#include <stdbool.h>

struct pidfile;

struct daemon {
    const char *pidfile_path; /* -P PATH, or NULL */
    struct pidfile *pf;       /* its directory, opened before the fork */
    int ready_fd;             /* tells the waiting parent we are up; -1 */
};

/* Open the pidfile's directory (if path).  -errno. */
int daemon_prepare(struct daemon *d, const char *pidfile_path);

/* Fork.  The parent waits for one byte: 0 when the mount is ready,
 * anything else (or EOF) on failure, and exits with it; it never
 * returns.  The child carries on, in a new session.  Exits on a failed
 * fork (nothing is started yet). */
void daemon_fork(struct daemon *d);

/* Write the pidfile (if any).  -errno, logged. */
int daemon_write_pidfile(struct daemon *d);

/* The mount is up: release the parent, leave the terminal (stdio to
 * /dev/null, log to syslog, chdir /).  A no-op in the foreground. */
void daemon_detach(struct daemon *d);

/* Remove the pidfile if it still holds our pid. */
void daemon_fini(struct daemon *d);
