/* fs/mountlock.h: one writable mount of an export per host.
 *
 * Two writable mounts of one export (the same server socket or host and
 * port, the same export name) are two write-back caches over one disk:
 * each one's reads miss the other's pending writes and their lazy
 * zeroing and truncates undo each other's data, silently.  So a writable
 * mount takes an exclusive lock keyed on the export, and a second
 * writable mount of it is refused, naming the first (its pid and
 * mountpoint).  Read-only mounts take no lock and are never refused: they
 * cannot change the disk (they may read bytes a writable mount still
 * holds in its pool).  -o multiwriter takes no lock either.  Servers the
 * daemon starts itself ([ CMD ], --socket-activation) and --fd have no
 * key another mount could share: nothing is locked.
 *
 * The lock is flock(2) on RUNDIR/nbdferry/HASH.lock, HASH the first 128
 * bits of the SHA-256 of the key; RUNDIR is /run for root, else
 * $XDG_RUNTIME_DIR (or /run/user/UID).  The directory is created 0700 and
 * must be ours and not writable by others; the file is opened with
 * O_NOFOLLOW and must be a regular file of ours with one link, so a
 * planted link is refused, never followed.  The kernel drops the lock
 * when the daemon exits, however it exits.
 *
 * THREAD MODEL: main thread, before the mount and after it. */
#pragma once
#include <stdbool.h>

#include "transport/nbdx.h"

struct mountlock;

/* The lock for cfg's export, held until mountlock_release(); *out is NULL
 * when nothing is locked (no key, no run directory: logged with -v).
 * -EBUSY, logged with the other mount's pid and mountpoint, when another
 * writable mount holds it; -errno when the lock file is unsafe. */
int mountlock_take(const struct nbdx_config *cfg, const char *mountpoint,
                   struct mountlock **out);
void mountlock_release(struct mountlock *l);

/* The key of cfg's export (malloc'd), or NULL when it has none.  For
 * tests and -v. */
char *mountlock_key(const struct nbdx_config *cfg);
