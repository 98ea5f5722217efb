/* fs/writers.h: no second writer beside a copy that replaces the disk.
 *
 * Two copies into one disk at once (two cp into the raw file, one into
 * the raw file and one into a view) interleave their bytes and both
 * succeed: the disk holds a mix.  So where a mistake is certain, an open
 * for writing fails with EBUSY, and the log and the status name the
 * other writer (its pid and command): a writer that replaces the disk
 * (O_TRUNC: cp, dd without conv=notrunc, a shell's >; or any writer of a
 * format view) while another writer has the disk open, or any writer
 * while such a one has it open.  Writers of the raw file that do not
 * truncate share it, as with nbdfuse: several dd conv=notrunc seek=...
 * on disjoint ranges, a tool writing from several processes.  Readers
 * are never refused.
 *
 * Allowed without a word:
 *   - the same process (thread group) opening a second writable handle:
 *     tools that reopen their output (qemu-img probes and reopens it) are
 *     one copy; a child that inherited the descriptor opens nothing;
 *   - a writer whose handle was closed (flush) with nothing written since
 *     and whose process is gone: only its release is still on the way
 *     (the kernel sends it asynchronously, so "cp a MNT/nbd; cp b MNT/nbd"
 *     can see the second open before the first release);
 *   - a writer whose handle was closed, nothing written since, whose
 *     process lives on (a script that wrote the file, closed it and runs
 *     cp next): its release is waited for, up to WRITERS_RELEASE_WAIT_MS;
 *     no release by then means another descriptor of it is still open
 *     (dd's dup2 of its output), and the open is refused;
 *   - anything, with -o multiwriter (parallel copies that truncate).
 *
 * THREAD MODEL: writers_identify() on the opening FUSE thread, before the
 * handle is shared; writers_admit_locked() under fs->lock, which also
 * guards the list it reads (fs/ops.c), so that two opens at once cannot
 * both be admitted; fs/ops.c waits on fs->h.released (broadcast whenever a
 * handle leaves the list) with fs->lock held around the checks. */
#pragma once
#include <stddef.h>
#include <sys/types.h>

#include "common/err.h"
#include "fs/fs.h"

/* Fill fh->tgid and fh->comm for the request's pid (a thread id). */
void writers_identify(struct fs_fh *fh, pid_t pid);

#define WRITERS_RELEASE_WAIT_MS 2000

/* 0 if the writer fh may join fs->h.open_files; -EBUSY and the reason in
 * why (common/err.h) if another process is writing; -EAGAIN (and the reason,
 * should the wait end) if the only others are closed handles of live
 * processes, whose release may be on its way.  Caller holds fs->lock. */
int writers_admit_locked(struct fs *fs, const struct fs_fh *fh,
                         struct nbdf_err *why);
