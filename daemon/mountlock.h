/* daemon/mountlock.h: one writable mount of an export per host.
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
 * The key is where the connection actually leads, not how it was spelled:
 * the peer address of the connected socket (getpeername): a Unix socket
 * by the canonical path (realpath) of the file the connection reached (so
 * --unix SOCKET, ?socket=SOCKET, a link or a relative path are one key,
 * and so is the socket a restarted server binds at the same path; the
 * device and inode only when the path given does not lead to the
 * connected socket: an inode number is handed to the next file once the
 * socket is removed, so it cannot name a socket for the life of a mount;
 * a hard link or a bind mount of the socket is another key), TCP by the
 * numeric address and
 * port (every loopback address is one: nbd://localhost:P, 127.0.0.1:P,
 * [::1]:P and --tcp LOCALHOST P are one export), vsock by CID and port;
 * then the export name, percent-decoded as it is sent.  So the lock is
 * taken after the connection is made (the handshake writes nothing).
 *
 * The lock is flock(2) on /run/lock/nbdferry-HASH.lock, HASH the first
 * 128 bits of the SHA-256 of the key.  /run/lock is the system's lock
 * directory, the same for root and every user: it must be root's, and
 * either closed to others or world-writable with the sticky bit (root
 * creates it 01777 when missing).  The file is created with O_EXCL
 * (never another's file put there meanwhile), opened with O_NOFOLLOW
 * and must be a regular file with one link, so a planted link is
 * refused, never followed; mode 0644: other users open it read-only to
 * lock it, only its owner writes the holder's pid and mountpoint, and
 * the sticky bit keeps others from removing or replacing it.  A user who
 * holds the lock of an export blocks every other writable mount of it
 * (the refusal names the holder's pid): the same as mounting it.  The
 * file is removed when the mount ends, under the lock; a locker checks
 * after flock() that the name still leads to the file it locked, and
 * opens again if not.  Without /run/lock the mount goes on unlocked with
 * a warning.  The kernel drops the lock when the daemon exits, however
 * it exits (a file left by a killed daemon is taken over by the next).
 *
 * THREAD MODEL: main thread, before the mount and after it. */
#pragma once
#include <stdbool.h>

#include "transport/nbdx.h"

struct mountlock;

/* The lock for cfg's export, held until mountlock_release(); *out is NULL
 * when nothing is locked (no key; no /run/lock: warned).
 * -EBUSY, logged with the other mount's pid and mountpoint, when another
 * writable mount holds it; -errno when the lock file is unsafe. */
int mountlock_take(struct nbdx *x, const struct nbdx_config *cfg,
                   const char *mountpoint, struct mountlock **out);
void mountlock_release(struct mountlock *l);

/* The key of x's export where the connection leads (x connected with
 * cfg; malloc'd): a Unix socket by its inode; or NULL when it has none. */
char *mountlock_key(struct nbdx *x, const struct nbdx_config *cfg);

/* The key the lock and a record kept across server restarts (the
 * manifest) use: the
 * same as mountlock_key(), except for a Unix socket spelled with a path
 * (--unix PATH, ?socket=PATH) that leads where the connection does: its
 * canonical path (realpath) and the export, since a restarted server
 * binds a new socket (a new inode) at the same path.  A path that does
 * not lead to the connected socket keeps the inode key. */
char *mountlock_record_key(struct nbdx *x, const struct nbdx_config *cfg);
