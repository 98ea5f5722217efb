/* fs/rawfile-int.h: the raw file's insides, shared by fs/rawfile.c (the
 * size, the deferred truncate, the raw file's own writes, handles),
 * fs/rawfile-times.c and fs/rawfile-views.c (the other views' changes).
 * Not for other files: they use fs/rawfile.h. */
#pragma once

#include "fs/rawfile.h"
#include "fs/view.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <string.h>
#include <stdbool.h>
#include <time.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "digest/digest.h"
#include "fs/foreign.h"
#include "fs/progress.h"
#include "fs/warm.h"
#include "transport/readahead.h"

/* THE CHANGE COUNT (fs/rawfile.c): a change of the disk holds size_lock
 * exclusive (CHANGE_WRLOCK_FOR_SCOPE) or, once any deferred truncate is
 * settled, shared (SETTLED_RDLOCK_FOR_SCOPE: err set when the truncate's
 * carrying out failed), counted begun and done around it. */
struct fs_disk *rf_change_wrlock(struct fs_disk *d);
struct fs_disk *rf_settled_rdlock(struct fs_disk *d, int *err);
void rf_change_unlock(struct fs_disk **d);

#define CHANGE_WRLOCK_FOR_SCOPE(d)                                           \
    __attribute__((cleanup(rf_change_unlock))) struct fs_disk                \
        *LOCK_FOR_SCOPE_CAT(change_for_scope_, __COUNTER__) =                \
            rf_change_wrlock(d)

#define SETTLED_RDLOCK_FOR_SCOPE(d, err)                                     \
    __attribute__((cleanup(rf_change_unlock))) struct fs_disk                \
        *LOCK_FOR_SCOPE_CAT(settled_for_scope_, __COUNTER__) =               \
            rf_settled_rdlock(d, err)

/* Carry out the deferred truncate, if any (THE DEFERRED TRUNCATE). */
int rf_carry_out(struct fs_disk *d);
/* The content changed: drop read-ahead, cover it with the size (grow).
 * Caller holds size_lock shared. */
void rf_changed(struct fs_disk *d, uint64_t off, uint64_t len, bool grow);
/* The disk changed up to end: grow the size to cover it, stamp the time. */
void rf_extend_to(struct fs_disk *d, uint64_t end);
/* The inline digest takes a committed write from its pool buffers. */
void rf_digest_holds(struct fs_disk *d, const struct pool_fill *f,
                     const struct digest_known *known);
