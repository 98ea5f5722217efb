/* fs/progress.c: the copy pass's frontier, throughput samples, and the
 * --progress bar and "N/100" lines.  The definition is in progress.h.
 *
 * THREAD MODEL
 * The thread that changed the raw file calls progress_truncate/write/
 * zero/close (fs/rawfile.c: the receive loop's receiving thread for
 * writes, a worker for the rest); the status calls progress_get() from
 * whichever thread opens it; one progress
 * thread samples every PROGRESS_TICK_MS and draws.  pg->lock protects
 * the pass and the ring of samples; it is taken after (never around)
 * pool_get_stats() and d->fs->lock, and never held while writing to stderr
 * or the progress fd.
 *
 * 100% only after the last reply: progress_get() reads the frontier
 * first and the pool's counters after, in one consistent snapshot of the
 * pool, so a write counted in the frontier is counted as written too:
 * the mixed snapshot can only undercount.
 */
#include "fs/progress.h"
#include "fs/warm.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "common/monotime.h"
#include "common/signals.h"
#include "fs/fs.h"

#define NSAMPLES 64               /* 16 s of samples at 250 ms */
#define MAP_MAX (1u << 16)        /* data extents of a source we keep
                                   * (16 bytes each); more: no map */
#define BAR_WIDTH 24

struct sample {
    double t;                     /* CLOCK_MONOTONIC seconds */
    uint64_t acked, done;
};

struct progress {
    struct fs_disk *d;
    struct progress_config cfg;
    pthread_t thread;

    pthread_mutex_t lock;
    pthread_cond_t cond;          /* stopping */
    bool stopping;
    uint64_t frontier;            /* of this pass */
    uint64_t truncated;           /* last non-zero truncate size, or 0 */
    uint64_t closed;              /* size at close, 0 after a change */
    uint64_t source;              /* the writer's input file, or 0 */
    uint64_t vhd_len;             /* the VHD being landed, or 0 */
    bool failed;                  /* the copy tool was told of an error */
    /* The source's data extents (SEEK_DATA/SEEK_HOLE at the writer's
     * open), so holes do not count as progress: map[i] starts at
     * map[i].off, and below[i] data bytes lie before it.  NULL: unknown. */
    struct { uint64_t off, len; } *map;
    uint64_t *below;
    size_t nmap;
    uint64_t map_data;            /* data bytes of the source */
    uint64_t pass_skipped;              /* warm_skipped() at the pass's
                                         * start */
    uint64_t pass_written, pass_acked;  /* the pool's counters at the
                                         * pass's start */
    struct sample ring[NSAMPLES];
    unsigned nsamples, next;

    int last_line;                /* last percent written to cfg.fd */
    size_t bar_len;               /* last bar's width, to clear it */
};

const char *progress_total_name(enum progress_total t)
{
    static const char *names[] = {
        [PROGRESS_TOTAL_EXPECTED] = "expected-size",
        [PROGRESS_TOTAL_VHD] = "vhd",
        [PROGRESS_TOTAL_SOURCE] = "source",
        [PROGRESS_TOTAL_CLOSE] = "close",
        [PROGRESS_TOTAL_TRUNCATE] = "truncate",
        [PROGRESS_TOTAL_EXPORT] = "export-size",
    };
    return names[t];
}

/* ---- the source's data map ------------------------------------------- */

static void free_map_locked(struct progress *pg)
{
    free(pg->map);
    free(pg->below);
    pg->map = NULL;
    pg->below = NULL;
    pg->nmap = 0;
    pg->map_data = 0;
}

/* Data bytes of the source in [0, x) (locked, map known). */
static uint64_t data_below_locked(const struct progress *pg, uint64_t x)
{
    size_t lo = 0, hi = pg->nmap;  /* first extent starting at or after x */

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (pg->map[mid].off < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return 0;
    uint64_t in = x - pg->map[lo - 1].off;  /* into the extent before x */
    if (in > pg->map[lo - 1].len)
        in = pg->map[lo - 1].len;
    return pg->below[lo - 1] + in;
}

/* Append [off, off + len) to the map being built; false when full. */
static bool map_add(struct progress *pg, uint64_t off, uint64_t len)
{
    if (pg->nmap == MAP_MAX)
        return false;
    if (pg->nmap % 1024 == 0) {
        size_t n = pg->nmap + 1024;
        void *m = realloc(pg->map, n * sizeof *pg->map);
        if (m)
            pg->map = m;
        void *b = m ? realloc(pg->below, n * sizeof *pg->below) : NULL;
        if (b)
            pg->below = b;
        if (!m || !b)
            return false;
    }
    pg->map[pg->nmap].off = off;
    pg->map[pg->nmap].len = len;
    pg->below[pg->nmap] = pg->map_data;
    pg->map_data += len;
    pg->nmap++;
    return true;
}

/* Scan the source (fd, size bytes) with SEEK_DATA/SEEK_HOLE into a map,
 * built aside and installed under the lock.  No map when the file
 * system cannot say or the source is too fragmented. */
static void scan_map(struct progress *pg, int fd, uint64_t size)
{
    struct progress m = { 0 };
    off_t pos = 0;
    bool ok = true;

    while (ok && (uint64_t) pos < size) {
        off_t d = lseek(fd, pos, SEEK_DATA);
        if (d == -1) {
            ok = errno == ENXIO;          /* no more data */
            break;
        }
        off_t h = lseek(fd, d, SEEK_HOLE);
        if (h == -1 || h <= d)
            h = (off_t) size;
        ok = map_add(&m, (uint64_t) d, (uint64_t) (h - d));
        pos = h;
    }
    if (ok && m.nmap == 0)
        ok = map_add(&m, size, 0);        /* all hole: an empty map */
    {
        LOCK_FOR_SCOPE(&pg->lock);
        free_map_locked(pg);
        if (ok) {
            pg->map = m.map;
            pg->below = m.below;
            pg->nmap = m.nmap;
            pg->map_data = m.map_data;
        }
    }
    if (!ok) {
        free(m.map);
        free(m.below);
        log_info("progress: the source's data map is unknown (too "
                 "fragmented, or no SEEK_DATA): holes count as progress");
    }
}

/* ---- events from ops.c ----------------------------------------------- */

static void new_pass_locked(struct progress *pg, const struct pool_stats *s)
{
    pg->frontier = 0;
    pg->source = 0;
    pg->vhd_len = 0;
    pg->failed = false;
    free_map_locked(pg);
    pg->pass_written = s->bytes_written;
    pg->pass_acked = s->bytes_acked;
    pg->pass_skipped = warm_skipped(pg->d);
    pg->closed = 0;
}

void progress_truncate(struct progress *pg, uint64_t size)
{
    struct pool_stats s;

    if (!pg)
        return;
    if (size == 0)
        pool_get_stats(pg->d->pool, &s);
    LOCK_FOR_SCOPE(&pg->lock);
    if (size == 0)                /* a new pass */
        new_pass_locked(pg, &s);
    pg->truncated = size;
    pg->closed = 0;
}

void progress_open(struct progress *pg)
{
    struct pool_stats s;

    if (!pg)
        return;
    pool_get_stats(pg->d->pool, &s);
    LOCK_FOR_SCOPE(&pg->lock);
    if (pg->failed || pg->closed)
        new_pass_locked(pg, &s);
}

static void advance(struct progress *pg, uint64_t end)
{
    if (!pg)
        return;
    LOCK_FOR_SCOPE(&pg->lock);
    if (end > pg->frontier)
        pg->frontier = end;
    pg->closed = 0;
}

void progress_write(struct progress *pg, uint64_t off, uint64_t len)
{
    advance(pg, off + len);
}

void progress_zero(struct progress *pg, uint64_t off, uint64_t len)
{
    advance(pg, off + len);
}

/* After the drain: the bytes up to the file's size are all passed. */
void progress_close(struct progress *pg, uint64_t apparent)
{
    if (!pg)
        return;
    LOCK_FOR_SCOPE(&pg->lock);
    if (apparent > pg->frontier)
        pg->frontier = apparent;
    pg->closed = apparent;
}

void progress_fail(struct progress *pg)
{
    if (!pg)
        return;
    LOCK_FOR_SCOPE(&pg->lock);
    pg->failed = true;
}

/* ---- the writer's source (as pv -d) ---------------------------------- */

/* Flags of fd in pid's fdinfo, or -1. */
static int fd_flags(pid_t pid, const char *fd)
{
    char path[300], line[128];           /* fd: a d_name, up to 255 */
    int flags = -1;

    snprintf(path, sizeof path, "/proc/%d/fdinfo/%s", (int) pid, fd);
    FILE *f = fopen(path, "re");
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "flags: %o", (unsigned *) &flags) == 1)
            break;
    fclose(f);
    return flags;
}

/* Is target a file on our own mount (the destination itself)? */
static bool on_mount(const char *mountpoint, const char *target)
{
    size_t n = mountpoint ? strlen(mountpoint) : 0;
    return n && strncmp(target, mountpoint, n) == 0 &&
           (target[n] == '/' || target[n] == '\0');
}

/* Size of one of pid's fds if it is a read-only regular file elsewhere
 * (its path in target, PATH_MAX bytes). */
static uint64_t source_size(struct progress *pg, pid_t pid, const char *fd,
                            char *target)
{
    char link[300];                      /* fd: a d_name, up to 255 */
    struct stat st;

    snprintf(link, sizeof link, "/proc/%d/fd/%s", (int) pid, fd);
    ssize_t n = readlink(link, target, PATH_MAX - 1);
    if (n <= 0 || target[0] != '/')
        return 0;                 /* pipe:[..], socket:[..], anon_inode */
    target[n] = '\0';
    if (on_mount(pg->cfg.mountpoint, target))
        return 0;                 /* never stat our own files from here */
    int flags = fd_flags(pid, fd);
    if (flags < 0 || (flags & O_ACCMODE) != O_RDONLY)
        return 0;
    if (stat(link, &st) == -1 || !S_ISREG(st.st_mode))
        return 0;
    return (uint64_t) st.st_size;
}

uint64_t progress_source(struct progress *pg, pid_t pid, char *path,
                         size_t n, long *fdnum)
{
    char dir[64], target[PATH_MAX];
    uint64_t best = 0;

    *fdnum = -1;
    if (n)
        path[0] = '\0';
    if (!pg || pid <= 0)
        return 0;
    snprintf(dir, sizeof dir, "/proc/%d/fd", (int) pid);
    DIR *d = opendir(dir);
    if (!d)
        return 0;                 /* gone, or another user's process */
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.')
            continue;
        uint64_t size = source_size(pg, pid, e->d_name, target);
        if (size > best) {
            best = size;
            *fdnum = strtol(e->d_name, NULL, 10);
            if (n)
                snprintf(path, n, "%s", target);
        }
    }
    closedir(d);
    return best;
}

void progress_writer(struct progress *pg, pid_t pid)
{
    long fdnum;
    uint64_t best = progress_source(pg, pid, NULL, 0, &fdnum);
    progress_set_source(pg, pid, best, fdnum);
}

void progress_set_source(struct progress *pg, pid_t pid, uint64_t best,
                         long fdnum)
{
    char best_link[64];

    if (!pg || !best)
        return;
    log_info("progress: the writer (pid %d) reads a file of %" PRIu64
             " bytes: the total", (int) pid, best);
    {
        LOCK_FOR_SCOPE(&pg->lock);
        pg->source = best;
    }
    if (fdnum < 0)
        return;
    /* Reopened through /proc (permission checked against the file): the
     * writer's own offset is not touched. */
    snprintf(best_link, sizeof best_link, "/proc/%d/fd/%ld", (int) pid,
             fdnum);
    int fd = open(best_link, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd >= 0) {
        scan_map(pg, fd, best);
        close(fd);
    }
}

void progress_vhd_length(struct progress *pg, uint64_t len)
{
    if (!pg)
        return;
    LOCK_FOR_SCOPE(&pg->lock);
    pg->vhd_len = len;
}

/* ---- the numbers ----------------------------------------------------- */

/* Rate of a sample field over the last secs (locked). */
static double rate_locked(const struct progress *pg, double secs, bool done)
{
    if (pg->nsamples < 2)
        return 0;
    const struct sample *last = &pg->ring[(pg->next + NSAMPLES - 1) % NSAMPLES];
    const struct sample *first = last;
    for (unsigned i = 2; i <= pg->nsamples; i++) {
        const struct sample *s = &pg->ring[(pg->next + NSAMPLES - i) % NSAMPLES];
        if (last->t - s->t > secs + 1e-3)
            break;
        first = s;
    }
    double dt = last->t - first->t;
    if (dt <= 0)
        return 0;
    uint64_t a = done ? first->done : first->acked;
    uint64_t b = done ? last->done : last->acked;
    return b >= a ? (double) (b - a) / dt : 0;
}

static void total_locked(const struct progress *pg, uint64_t export_size,
                         struct progress_info *out)
{
    if (pg->cfg.expected_size) {
        out->total = pg->cfg.expected_size;
        out->total_from = PROGRESS_TOTAL_EXPECTED;
    } else if (pg->vhd_len) {
        out->total = pg->vhd_len;
        out->total_from = PROGRESS_TOTAL_VHD;
    } else if (pg->source && pg->source >= pg->frontier) {
        /* A writer past the file it seemed to read from is not copying
         * that file (a guess from its open files): fall through. */
        out->total = pg->source;
        out->total_from = PROGRESS_TOTAL_SOURCE;
    } else if (pg->closed) {
        out->total = pg->closed;
        out->total_from = PROGRESS_TOTAL_CLOSE;
    } else if (pg->truncated) {
        out->total = pg->truncated;
        out->total_from = PROGRESS_TOTAL_TRUNCATE;
    } else {
        out->total = export_size;
        out->total_from = PROGRESS_TOTAL_EXPORT;
    }
}

/* The data still to come: with the source's map, holes not counted
 * (locked). */
static void data_locked(const struct progress *pg, uint64_t reach,
                        struct progress_info *out)
{
    out->by_data = pg->map && out->total_from == PROGRESS_TOTAL_SOURCE;
    if (!out->by_data) {
        out->data_done = out->done;
        out->data_total = out->total;
        return;
    }
    uint64_t d = data_below_locked(pg, reach);
    out->data_total = pg->map_data;
    out->data_done = d > out->unacknowledged ? d - out->unacknowledged : 0;
}

void progress_get(struct progress *pg, struct progress_info *out)
{
    struct pool_stats s;

    memset(out, 0, sizeof *out);
    out->eta_s = -1;
    if (!pg)
        return;
    bool failed;
    {
        LOCK_FOR_SCOPE(&pg->lock);
        out->frontier = pg->frontier;         /* first: see THREAD MODEL */
        total_locked(pg, pg->d->export_size, out);
        failed = pg->failed;
    }
    pool_get_stats(pg->d->pool, &s);

    out->unacknowledged = pool_stats_waiting(&s);
    uint64_t reach = out->frontier < out->total ? out->frontier : out->total;
    out->done = reach > out->unacknowledged ? reach - out->unacknowledged : 0;
    out->failed = failed;
    /* A failed copy is never settled nor 100%, whatever the pool says. */
    out->settled = !failed && out->unacknowledged == 0 &&
                   s.in_flight == 0 && s.pending_zero == 0 &&
                   s.bufs_in_use == s.bufs_retained;  /* retained:
                                    * acknowledged, kept for a resend */
    {
        LOCK_FOR_SCOPE(&pg->lock);
        data_locked(pg, reach, out);
        out->pass_written = s.bytes_written - pg->pass_written;
        out->pass_acked = s.bytes_acked - pg->pass_acked;
        out->pass_skipped = warm_skipped(pg->d) - pg->pass_skipped;
    }
    out->remaining = out->data_total - out->data_done;
    out->percent = out->data_total ? 100.0 * (double) out->data_done /
                                         (double) out->data_total : 100.0;
    if (!(out->settled && out->done == out->total) && out->percent > 99.9)
        out->percent = 99.9;

    {
        LOCK_FOR_SCOPE(&pg->lock);
        out->rate_1s = rate_locked(pg, 1, false);
        out->rate_5s = rate_locked(pg, 5, false);
        out->rate_10s = rate_locked(pg, 10, false);
        out->done_rate = rate_locked(pg, 5, true);
    }
    out->eta_s = out->done_rate > 0
                     ? (double) out->remaining / out->done_rate
                     : (out->remaining == 0 ? 0 : -1);
}

static void sample(struct progress *pg, const struct progress_info *pi)
{
    struct pool_stats s;

    pool_get_stats(pg->d->pool, &s);
    LOCK_FOR_SCOPE(&pg->lock);
    pg->ring[pg->next] = (struct sample) {
        .t = mono_now_s(), .acked = s.bytes_acked, .done = pi->data_done,
    };
    pg->next = (pg->next + 1) % NSAMPLES;
    if (pg->nsamples < NSAMPLES)
        pg->nsamples++;
}

/* ---- drawing --------------------------------------------------------- */

static void human(char *buf, size_t n, double v)
{
    static const char *unit[] = { "B", "KiB", "MiB", "GiB", "TiB" };
    unsigned u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    snprintf(buf, n, u ? "%.1f %s" : "%.0f %s", v, unit[u]);
}

static void write_all(int fd, const char *s, size_t len)
{
    while (len > 0) {
        ssize_t r = write(fd, s, len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return;               /* nobody reading: drop the line */
        s += r;
        len -= (size_t) r;
    }
}

/* "N/100\n" whenever the whole percent changes (nbdcopy --progress=FD). */
static void draw_line(struct progress *pg, const struct progress_info *pi)
{
    int pct = (int) floor(pi->percent);
    if (pct >= 100 && !(pi->settled && pi->done == pi->total))
        pct = 99;
    if (pct == pg->last_line)
        return;
    pg->last_line = pct;
    char line[16];
    int n = snprintf(line, sizeof line, "%d/100\n", pct);
    write_all(pg->cfg.fd, line, (size_t) n);
}

static void draw_bar(struct progress *pg, const struct progress_info *pi,
                     bool final)
{
    char done[32], total[32], rate[32], eta[32] = "ETA --:--", bar[BAR_WIDTH + 1];
    int fill = (int) (pi->percent / 100 * BAR_WIDTH);

    for (int i = 0; i < BAR_WIDTH; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[BAR_WIDTH] = '\0';
    human(done, sizeof done, (double) pi->data_done);
    human(total, sizeof total, (double) pi->data_total);
    human(rate, sizeof rate, pi->rate_5s);
    if (pi->eta_s >= 0 && pi->eta_s < 360000)
        snprintf(eta, sizeof eta, "ETA %d:%02d:%02d", (int) pi->eta_s / 3600,
                 (int) pi->eta_s / 60 % 60, (int) pi->eta_s % 60);
    char line[200];
    int n = snprintf(line, sizeof line, "\r[%5.1f%%] [%s] %s / %s%s  %s/s  %s",
                     pi->percent, bar, done, total,
                     pi->total_from == PROGRESS_TOTAL_EXPORT
                         ? " (whole export, ETA at most)"
                         : pi->by_data ? " of data" : "",
                     rate, eta);
    size_t len = (size_t) n < sizeof line ? (size_t) n : sizeof line - 1;
    size_t width = len;
    while (len < pg->bar_len && len + 1 < sizeof line)
        line[len++] = ' ';        /* clear what the last bar left */
    pg->bar_len = width;
    if (final && len + 1 < sizeof line)
        line[len++] = '\n';
    write_all(STDERR_FILENO, line, len);
    log_bar_drawn(final ? 0 : width);
}

static void tick(struct progress *pg, bool final)
{
    struct progress_info pi;

    progress_get(pg, &pi);
    sample(pg, &pi);
    if (pg->cfg.fd >= 0)
        draw_line(pg, &pi);
    if (pg->cfg.bar)
        draw_bar(pg, &pi, final);
}

static void *progress_thread(void *arg)
{
    block_stop_signals();
    struct progress *pg = arg;
    struct timespec next;

    clock_gettime(CLOCK_MONOTONIC, &next);
    LOCK_FOR_SCOPE(&pg->lock);
    while (!pg->stopping) {
        pthread_mutex_unlock(&pg->lock);
        tick(pg, false);
        next = timespec_add_ns(next, PROGRESS_TICK_MS * NS_PER_MS);
        pthread_mutex_lock(&pg->lock);
        while (!pg->stopping &&
               pthread_cond_timedwait(&pg->cond, &pg->lock, &next) != ETIMEDOUT)
            ;
    }
    return NULL;
}

/* ---- life ------------------------------------------------------------ */

int progress_create(struct fs_disk *d, const struct progress_config *cfg,
                    struct progress **out)
{
    struct progress *pg = calloc(1, sizeof *pg);

    if (!pg)
        return -ENOMEM;
    pg->d = d;
    pg->cfg = *cfg;
    pg->last_line = -1;
    pthread_mutex_init(&pg->lock, NULL);
    mono_cond_init(&pg->cond);
    int r = pthread_create(&pg->thread, NULL, progress_thread, pg);
    if (r) {
        pthread_mutex_destroy(&pg->lock);
        pthread_cond_destroy(&pg->cond);
        free(pg);
        return -r;
    }
    *out = pg;
    return 0;
}

void progress_destroy(struct progress *pg)
{
    if (!pg)
        return;
    {
        LOCK_FOR_SCOPE(&pg->lock);
        pg->stopping = true;
        pthread_cond_signal(&pg->cond);
    }
    pthread_join(pg->thread, NULL);
    tick(pg, true);
    free_map_locked(pg);          /* the thread is gone */
    pthread_mutex_destroy(&pg->lock);
    pthread_cond_destroy(&pg->cond);
    free(pg);
}
