/* fs/progress.h: how far the copy has got, counted in acknowledged bytes.
 *
 * The progress tracks the copy pass through the raw file (its frontier:
 * the furthest byte written, punched or passed), samples the pool every
 * PROGRESS_TICK_MS for the throughput shown in the status, and, when
 * asked, draws a bar on stderr or writes "N/100" lines to a file
 * descriptor, like nbdcopy --progress.
 *
 * Definition (docs/nbdferry.1, PROGRESS):
 *   done  = min(frontier, total) - (bytes written - bytes acknowledged)
 *   total = --expected-size, else (a VHD landing) the VHD file's length
 *           as its metadata describes it, else the size of the regular
 *           file the writing process reads from (seen in /proc/PID/fd at
 *           its open, as pv -d does), else the size the last close()
 *           left, else the size set by a truncate to a non-zero size,
 *           else the export size (then the ETA is an upper bound)
 * For a VHD landing the frontier counts bytes of the VHD file consumed.
 * Holes the copy tool skipped count as done once the frontier passes
 * them.  100% needs done == total and the pool settled: every written
 * byte acknowledged, nothing in flight, no zeroing pending, and no error
 * reported to the copy tool in this pass.
 * When the total is the writer's source, its data map (SEEK_DATA and
 * SEEK_HOLE, read at the writer's open) makes the percent and the ETA
 * count data only: data_done = data of the source below min(frontier,
 * total) - unacknowledged, of data_total, so a thin disk whose data come
 * late shows them still to come.
 */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#define PROGRESS_TICK_MS 250

struct fs_disk;
struct progress;

struct progress_config {
    bool bar;                 /* --progress: draw on stderr */
    int fd;                   /* --progress=FD: "N/100" lines, or -1 */
    uint64_t expected_size;   /* --expected-size, or 0 */
    const char *mountpoint;   /* borrowed: the writer's files under it are
                               * ours, not its source */
};

enum progress_total {
    PROGRESS_TOTAL_EXPECTED,  /* --expected-size */
    PROGRESS_TOTAL_VHD,       /* the VHD file's length, from its metadata */
    PROGRESS_TOTAL_SOURCE,    /* the writer's input file */
    PROGRESS_TOTAL_CLOSE,     /* the file's size at the pass's close() */
    PROGRESS_TOTAL_TRUNCATE,  /* a truncate to a non-zero size */
    PROGRESS_TOTAL_EXPORT,    /* nothing better known */
};

struct progress_info {
    uint64_t frontier, done, total;
    enum progress_total total_from;
    uint64_t unacknowledged;  /* written, not yet acknowledged */
    bool settled;             /* see above; never after a failure */
    bool failed;              /* the copy tool saw an error this pass */
    double percent;           /* 0..100; below 100 unless settled */
    double rate_1s, rate_5s, rate_10s;  /* acknowledged bytes per second */
    double done_rate;         /* done bytes per second, last 5 s */
    double eta_s;             /* < 0: unknown; remaining / done_rate */
    /* The data still to come: when the total is the writer's source and
     * its data map is known (by_data), the source's holes count neither
     * in data_done nor in data_total; else they equal done and total.
     * percent, done_rate and eta_s count these. */
    bool by_data;
    uint64_t data_done, data_total, remaining;
    /* This pass's (since its truncate to 0 or a view's open) bytes
     * written and acknowledged; the pool's counters are the mount's. */
    uint64_t pass_written, pass_acked;
    /* This pass's bytes the manifest found on the server already: not
     * sent, not in pass_written (fs/warm.h). */
    uint64_t pass_skipped;
};

/* Starts the sampling thread; d->pool must exist. */
int  progress_create(struct fs_disk *d, const struct progress_config *cfg,
                     struct progress **out);
/* Draws the final state (after the final flush) and stops the thread. */
void progress_destroy(struct progress *pg);

/* Events of the file being written, from fs/rawfile.c after the pool
 * accepted them.  All accept pg == NULL. */
void progress_truncate(struct progress *pg, uint64_t size);
/* A writer opened the raw file without truncating it (qemu-img convert
 * -n, dd conv=notrunc): after a pass that was closed or failed, this is
 * a new copy, and the status describes it, not the one before. */
void progress_open(struct progress *pg);
void progress_write(struct progress *pg, uint64_t off, uint64_t len);
void progress_zero(struct progress *pg, uint64_t off, uint64_t len);
void progress_close(struct progress *pg, uint64_t apparent);

/* A writer opened the file: look in /proc/pid/fd for the regular file it
 * reads from (opened read-only, not on this mount; the largest if more
 * than one) and take its size as the total of this pass.  Nothing found
 * (another user's process, a pipe, rsync's separate receiver): no change.
 * Call after the open's truncate. */
void progress_writer(struct progress *pg, pid_t pid);
/* The same in two steps: the largest such file's size (0: none), its
 * path in path (n bytes, may be 0) and its descriptor number in *fdnum
 * (-1: none), then taking it as the total (and its data map). */
uint64_t progress_source(struct progress *pg, pid_t pid, char *path,
                         size_t n, long *fdnum);
void progress_set_source(struct progress *pg, pid_t pid, uint64_t size,
                         long fdnum);
/* The copy tool was told of an error (a failed write, truncate or close
 * of this pass's writer): never settled nor 100% until a new pass. */
void progress_fail(struct progress *pg);
/* A VHD landing: its file's length is known from its metadata. */
void progress_vhd_length(struct progress *pg, uint64_t len);

void progress_get(struct progress *pg, struct progress_info *out);
const char *progress_total_name(enum progress_total t);
