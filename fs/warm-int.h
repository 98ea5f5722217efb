/* fs/warm-int.h: warm migration's insides, shared by fs/warm.c (open,
 * close, the skip, the other changes) and fs/warm-state.c (the state
 * directory, the trust check at mount, the status, --forget).  Not for
 * other files: they use fs/warm.h. */
#pragma once

#include "fs/warm.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <pwd.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/iszero.h"
#include "common/json.h"
#include "common/log.h"
#include "common/monotime.h"
#include "digest/sha256x.h"
#include "manifest/manifest.h"


#define BS 65536u                 /* the blkhash digest's blocks */
#define GEN_UNSET UINT64_MAX      /* manifest.c: a change not yet sent */
#define SAMPLE_MIN 64u
#define SAMPLE_MAX 1024u
#define ZERO_READS 256u           /* zero blocks showing data, read */
#define CHECKPOINT_BYTES (1ull << 30)
#define CHECKPOINT_NS (10ull * 1000000000u)
#define MAX_BLOCKS (FS_MAX_WRITE / BS + 2)
#define RESOLVE_MAX 1024u         /* blocks written in part, read back
                                   * at a drain (64 MiB) */

/* A disk's name at the start of a log line, in a mount of several (as
 * daemon/main.c). */
#define DISK_FMT "%s%s"
#define DISK_ARG(d) ((d)->fs->ndisks > 1 ? (d)->filename : ""), \
                    ((d)->fs->ndisks > 1 ? ": " : "")

struct warm {
    struct manifest *m;
    char path[PATH_MAX];          /* the manifest file */
    int dirfd;
    char name[64];
    char trust[16];               /* "new", "trusted", "distrusted",
                                   * "refused", "not kept" */
    char why[MF_WHY_MAX];
    uint64_t skipped;             /* __atomic */
    uint64_t lost_seen;           /* pool_stats.flushed_lost as last seen
                                   * (lost_lock) */
    pthread_mutex_t lost_lock;
    uint64_t since_checkpoint;    /* __atomic */
    uint64_t checkpoint_ns;       /* __atomic */
    uint64_t checkpoint_bytes;
    uint64_t checkpoints;         /* __atomic */
    bool dead;                    /* an image view changed the disk: the
                                   * manifest forgot everything and
                                   * follows nothing more; __atomic */
    /* THE LATER DIGEST (fs/warm-later.c) */
    struct workers *workers;
    pthread_mutex_t jobs_lock;
    pthread_cond_t jobs_cond;
    unsigned jobs;                /* posted and not done (jobs_lock) */
    unsigned later_delay_us;      /* NBDFERRY_DEBUG_LATER_DELAY_US */
};

/* The disk's manifest, if it is still followed. */
static inline struct warm *warm_live(struct fs_disk *d)
{
    struct warm *w = __atomic_load_n(&d->warm, __ATOMIC_ACQUIRE);
    return w && !__atomic_load_n(&w->dead, __ATOMIC_ACQUIRE) ? w : NULL;
}

/* THE LATER DIGEST: its workers and job count, taken at open; fini
 * waits for every job and promotes what came after the last flush. */
void warm_later_init(struct warm *w);
void warm_later_fini(struct warm *w);
/* warm_record()'s work: the blocks recorded, their digests posted. */
struct digest_later *warm_later_record(struct fs_disk *d, struct warm *w,
                                       uint64_t off, uint64_t len,
                                       const struct pool_fill *f);

/* SHA-256 of n whole blocks (mem[i], BS bytes each) into out[i]. */
void warm_hash_blocks(const unsigned char *const *mem, size_t n,
                      unsigned char (*out)[MF_DIGEST]);
/* The state directory dir, opened (created for root), checked: ours,
 * closed to others, no link; its fd, or -1 with why. */
int warm_open_state_dir(const char *dir, struct nbdf_err *why);
/* THE TRUST CHECK at mount: w->trust and w->why say the outcome. */
void warm_check_trust(struct fs_disk *d, struct warm *w);
