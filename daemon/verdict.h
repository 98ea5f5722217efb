/* daemon/verdict.h: the verdict of a mount, for `nbdferry --unmount MNT`.
 *
 * A daemon's last words (the final drain and flush after the unmount,
 * failed ranges, the inline digest) happen after fusermount3 -u has
 * returned, and a daemon without syslog has nowhere to say them.  So the
 * unmounter asks for them: before it unmounts it creates an empty file
 * verdict.PID (the daemon's pid, from the status file) in its run
 * directory (verdict_dir()), and the daemon, at exit, writes its verdict
 * into that file if it exists: "exit N" and then the lines to print.  The
 * unmounter waits for the daemon to exit, prints them and exits N.
 *
 * The run directory is /run/nbdferry for root, else
 * $XDG_RUNTIME_DIR/nbdferry, else /tmp/nbdferry-UID: created 0700 and
 * used only if it is a directory owned by the user and writable by no
 * one else; files in it are opened with O_NOFOLLOW, never followed
 * through a planted link. */
#pragma once
#include <stddef.h>

struct fs;

/* The daemon, after its final flush: status is its exit status,
 * disk_status[i] disk i's (NULL: each the mount's).  One line per disk,
 * naming it.  Does nothing unless an unmounter asked (logs why at -v). */
void verdict_write(struct fs *fs, int status, const int *disk_status);

/* The same lines, each "verdict: LINE", to every log the user has (stderr
 * with -f, syslog for a daemon, --log-file in every case), whoever
 * unmounted (nbdferry --unmount, fusermount3 -u, -u -z); the recent log
 * lines are not repeated.  At exit, before the log is flushed. */
void verdict_log(struct fs *fs, int status, const int *disk_status);

/* nbdferry --unmount MOUNTPOINT: unmount, wait for the daemon, print its
 * verdict.  The daemon's pid comes from pidfile if not NULL (-P; a
 * file-mode mount has no status file), else from the status file.
 * Returns the exit status (the daemon's; 1 when it gave none). */
int verdict_unmount(const char *mountpoint, const char *pidfile);
