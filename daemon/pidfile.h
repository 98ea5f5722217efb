/* daemon/pidfile.h: the daemon's -P pidfile, written safely.
 *
 * The directory is resolved and opened at start, before the daemon
 * changes directory, so a relative path names the same file at exit.
 * The pid goes into a new file (O_EXCL|O_NOFOLLOW: a planted file or
 * symlink is never followed nor overwritten) renamed into place; at exit
 * the file is removed only if it still holds this daemon's pid (a newer
 * daemon may have written its own since). */
#pragma once

struct pidfile;

/* Open path's directory.  -errno (the directory cannot be opened). */
int  pidfile_prepare(const char *path, struct pidfile **out);

/* Write getpid() into the pidfile.  -errno; nothing is left behind on
 * error. */
int  pidfile_write(struct pidfile *pf);

/* Remove the pidfile if it holds our pid, then free pf (NULL: nothing). */
void pidfile_remove(struct pidfile *pf);

/* Free pf, leaving the file alone (NULL: nothing). */
void pidfile_free(struct pidfile *pf);
