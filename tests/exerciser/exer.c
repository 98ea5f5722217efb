/* nbdferry-exer: model-based random I/O exerciser for MNT/nbd.
 *
 * Writer mode (the default) applies a random, seed-determined sequence of
 * pwrite, pread, ftruncate (down and up), fallocate PUNCH_HOLE|KEEP_SIZE
 * and ZERO_RANGE|KEEP_SIZE, copy_file_range within the file, fsync,
 * fdatasync, SEEK_DATA/SEEK_HOLE and close+reopen to one file, and checks
 * every read, every fstat size and every seek result against an in-memory
 * model of the whole export.  The first disagreement prints the seed, the
 * operation number, the operation, the first differing offset and the
 * last operations before it, and exits 1.  At the end it reads the whole
 * file back and can dump the model (the export's expected bytes) so the
 * caller can compare it with the server.
 *
 * Disturber mode (--disturb) loops open (read-only or read-write), read a
 * random range, maybe fsync, close on the same file, never checking the
 * content (the writer owns the model) but failing on any I/O error; run
 * one to three of them beside a writer.
 *
 * THREAD MODEL
 * Single-threaded.  Concurrency comes from running several processes on
 * the same file; they share nothing but the file.
 */

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <linux/falloc.h>

#define KiB (UINT64_C(1) << 10)
#define MiB (UINT64_C(1) << 20)

#define HISTORY 16                 /* operations shown on a failure */
#define DESC_LEN 128

/* ---- deterministic random numbers (splitmix64) ----------------------- */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

/* Uniform in [0, n); n > 0.  The modulo bias is irrelevant here. */
static uint64_t rng_below(uint64_t *s, uint64_t n)
{
    return rng_next(s) % n;
}

/* Uniform in [lo, hi]. */
static uint64_t rng_range(uint64_t *s, uint64_t lo, uint64_t hi)
{
    return lo + rng_below(s, hi - lo + 1);
}

static bool rng_chance(uint64_t *s, unsigned percent)
{
    return rng_below(s, 100) < percent;
}

static void rng_fill(uint64_t *s, unsigned char *p, size_t n)
{
    while (n > 0) {
        uint64_t v = rng_next(s);
        size_t k = n < 8 ? n : 8;
        memcpy(p, &v, k);
        p += k;
        n -= k;
    }
}

/* ---- state ------------------------------------------------------------ */

struct exer {
    /* options */
    const char *path;
    const char *init;              /* initial content of the export, or NULL */
    const char *dump;              /* write the final model here, or NULL */
    uint64_t seed;
    long nops;                     /* writer: operations; disturber: loops */
    long seconds;                  /* disturber: run time (0: until signal) */
    uint64_t area;                 /* operations stay within [0, area) */
    uint64_t maxop;                /* largest read, write, zero or copy */
    bool verbose;

    /* writer state */
    uint64_t rng;
    int fd;
    unsigned char *model;          /* expected bytes of the whole export */
    uint64_t export_size;          /* bytes in model */
    uint64_t size;                 /* expected file size */
    uint64_t hot;                  /* where the last cut or zeroing began */
    unsigned char *buf, *rbuf;     /* maxop bytes each */
    long opno;
    char history[HISTORY][DESC_LEN];
};

static volatile sig_atomic_t stop_requested;

static const char *cur_desc(struct exer *e)
{
    return e->history[e->opno % HISTORY];
}

static void set_desc(struct exer *e, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void set_desc(struct exer *e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->history[e->opno % HISTORY], DESC_LEN, fmt, ap);
    va_end(ap);
    if (e->verbose)
        fprintf(stderr, "exer: op %ld: %s\n", e->opno, cur_desc(e));
}

static void print_history(struct exer *e)
{
    long first = e->opno >= HISTORY - 1 ? e->opno - (HISTORY - 1) : 0;
    fprintf(stderr, "exer: last operations:\n");
    for (long i = first; i <= e->opno; i++)
        fprintf(stderr, "  op %ld: %s\n", i, e->history[i % HISTORY]);
    fprintf(stderr, "exer: reproduce with: nbdferry-exer -s %" PRIu64
            " -n %ld -a %" PRIu64 " -m %" PRIu64 " ...\n",
            e->seed, e->opno + 1, e->area, e->maxop);
}

static void fail(struct exer *e, const char *fmt, ...)
    __attribute__((format(printf, 2, 3), noreturn));

static void fail(struct exer *e, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "exer: FAIL seed %" PRIu64 " op %ld (%s): ", e->seed,
            e->opno, cur_desc(e));
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    print_history(e);
    exit(1);
}

static void fail_errno(struct exer *e, const char *what, int err)
{
    fail(e, "%s: %s", what, strerror(err));
}

/* ---- checks ----------------------------------------------------------- */

/* got[0..n) must equal model[off..off+n). */
static void check_bytes(struct exer *e, const char *what,
                        const unsigned char *got, uint64_t off, size_t n)
{
    const unsigned char *want = e->model + off;
    if (memcmp(got, want, n) == 0)
        return;
    size_t i = 0;
    while (got[i] == want[i])
        i++;
    size_t j = n;
    while (got[j - 1] == want[j - 1])
        j--;
    bool zero = true;
    for (size_t k = i; k < j && zero; k++)
        zero = got[k] == 0;
    fail(e, "%s: first difference at offset %" PRIu64 " (read 0x%02x, "
         "expected 0x%02x); bytes %" PRIu64 "..%" PRIu64 " differ%s",
         what, off + i, got[i], want[i], off + i, off + j - 1,
         zero ? " (read as zero)" : "");
}

static void check_zero(struct exer *e, const char *what, uint64_t from,
                       uint64_t to)
{
    for (uint64_t o = from; o < to; o++)
        if (e->model[o] != 0)
            fail(e, "%s: offset %" PRIu64 " holds data (0x%02x) but "
                 "[%" PRIu64 ", %" PRIu64 ") was reported as a hole",
                 what, o, e->model[o], from, to);
}

static void check_size(struct exer *e)
{
    struct stat st;
    if (fstat(e->fd, &st) != 0)
        fail_errno(e, "fstat", errno);
    if ((uint64_t) st.st_size != e->size)
        fail(e, "fstat: size %jd, expected %" PRIu64, (intmax_t) st.st_size,
             e->size);
}

/* Read [off, off+n) into e->rbuf, looping over short reads; returns the
 * bytes read (less than n only at end of file). */
static size_t read_full(struct exer *e, uint64_t off, size_t n)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(e->fd, e->rbuf + done, n - done,
                          (off_t) (off + done));
        if (r < 0)
            fail_errno(e, "pread", errno);
        if (r == 0)
            break;
        done += (size_t) r;
    }
    return done;
}

static void check_read(struct exer *e, uint64_t off, size_t n)
{
    size_t want = off >= e->size ? 0
                  : (size_t) (e->size - off < n ? e->size - off : n);
    size_t got = read_full(e, off, n);
    if (got != want)
        fail(e, "pread returned %zu bytes, expected %zu (file size %" PRIu64
             ")", got, want, e->size);
    check_bytes(e, "pread", e->rbuf, off, got);
}

/* ---- operations ------------------------------------------------------- */

/* A length for one operation: mostly small or page-sized, sometimes up
 * to maxop; never 0. */
static uint64_t pick_len(struct exer *e)
{
    uint64_t max = e->maxop < e->area ? e->maxop : e->area;
    switch (rng_below(&e->rng, 4)) {
    case 0:
        return rng_range(&e->rng, 1, max < 4096 ? max : 4096);
    case 1:
        return (rng_range(&e->rng, 1, 16) * 4096 - 1) % max + 1;
    default:
        return rng_range(&e->rng, 1, max);
    }
}

/* An offset for n bytes within the area: half aligned, half not. */
static uint64_t pick_off(struct exer *e, uint64_t n)
{
    uint64_t off = rng_below(&e->rng, e->area - n + 1);
    if (rng_chance(&e->rng, 50))
        off &= ~(rng_chance(&e->rng, 50) ? UINT64_C(4095) : UINT64_C(511));
    return off;
}

static void model_write(struct exer *e, uint64_t off, const void *p,
                        uint64_t n)
{
    memcpy(e->model + off, p, n);
    if (off + n > e->size)
        e->size = off + n;
}

static void op_write(struct exer *e)
{
    uint64_t n = pick_len(e), off = pick_off(e, n);
    unsigned kind = (unsigned) rng_below(&e->rng, 10);
    if (kind == 0)                       /* all zero: zero-detection paths */
        memset(e->buf, 0, n);
    else
        rng_fill(&e->rng, e->buf, n);
    if (kind == 1 && n > 2)              /* zero run inside data */
        memset(e->buf + n / 4, 0, n / 2);
    set_desc(e, "pwrite %" PRIu64 "@%" PRIu64 "%s", n, off,
             kind == 0 ? " (zeros)" : "");
    ssize_t r = pwrite(e->fd, e->buf, n, (off_t) off);
    if (r < 0)
        fail_errno(e, "pwrite", errno);
    if ((uint64_t) r != n)
        fail(e, "pwrite wrote %zd of %" PRIu64 " bytes", r, n);
    model_write(e, off, e->buf, n);
}

static void op_read(struct exer *e)
{
    uint64_t n = pick_len(e);
    uint64_t off = rng_below(&e->rng, e->area + 1);
    unsigned where = (unsigned) rng_below(&e->rng, 100);
    if (where < 10 && e->size > 0)           /* straddle end of file */
        off = e->size - (e->size < n / 2 ? e->size : n / 2);
    else if (where < 40) {   /* straddle the last truncation or zeroing */
        uint64_t back = rng_below(&e->rng, n / 2 + 1);
        off = e->hot - (e->hot < back ? e->hot : back);
    }
    set_desc(e, "pread %" PRIu64 "@%" PRIu64 " (size %" PRIu64 ")", n, off,
             e->size);
    check_read(e, off, n);
}

static void op_truncate(struct exer *e)
{
    uint64_t s;
    if (e->size > 0 && (e->size > e->area || rng_chance(&e->rng, 50)))
        s = rng_below(&e->rng, (e->size < e->area ? e->size : e->area) + 1);
    else
        s = rng_range(&e->rng, e->size, e->area);
    if (rng_chance(&e->rng, 30))
        s &= ~UINT64_C(4095);
    set_desc(e, "ftruncate %" PRIu64 " (from %" PRIu64 ")", s, e->size);
    if (ftruncate(e->fd, (off_t) s) != 0)
        fail_errno(e, "ftruncate", errno);
    if (s < e->size) {                   /* cut bytes read as zero later */
        memset(e->model + s, 0, e->size - s);
        e->hot = s;
    }
    e->size = s;
}

static void op_fallocate(struct exer *e, int mode, const char *name)
{
    uint64_t n = pick_len(e), off = pick_off(e, n);
    set_desc(e, "fallocate %s|KEEP_SIZE %" PRIu64 "@%" PRIu64, name, n, off);
    if (fallocate(e->fd, mode | FALLOC_FL_KEEP_SIZE, (off_t) off,
                  (off_t) n) != 0)
        fail_errno(e, "fallocate", errno);
    memset(e->model + off, 0, n);        /* beyond the size: zero already */
    e->hot = off;
}

/* copy_file_range within the file, source and destination not
 * overlapping (the kernel refuses that).  Each call copies up to the end
 * of file as it is then: a call that extends the file lets the next one
 * copy further, so the model follows call by call. */
static void op_copy(struct exer *e)
{
    uint64_t n = pick_len(e);
    if (n > e->area / 3)                 /* room for a disjoint target */
        n = e->area / 3 ? e->area / 3 : 1;
    uint64_t src = pick_off(e, n), dst;
    do
        dst = pick_off(e, n);
    while (dst < src + n && src < dst + n);
    set_desc(e, "copy_file_range %" PRIu64 "@%" PRIu64 " -> %" PRIu64
             " (size %" PRIu64 ")", n, src, dst, e->size);
    for (uint64_t done = 0; done < n;) {
        uint64_t in = src + done, out = dst + done;
        uint64_t max = in >= e->size ? 0
                       : e->size - in < n - done ? e->size - in : n - done;
        loff_t lin = (loff_t) in, lout = (loff_t) out;
        ssize_t r = copy_file_range(e->fd, &lin, e->fd, &lout, n - done, 0);
        if (r < 0)
            fail_errno(e, "copy_file_range", errno);
        if ((uint64_t) r > max || (r == 0 && max > 0))
            fail(e, "copy_file_range at %" PRIu64 " copied %zd bytes, "
                 "expected %s%" PRIu64 " (size %" PRIu64 ")", in, r,
                 r ? "at most " : "", max, e->size);
        if (r == 0)
            break;
        model_write(e, out, e->model + in, (uint64_t) r);
        done += (uint64_t) r;
    }
}

static void op_sync(struct exer *e, bool data_only)
{
    set_desc(e, data_only ? "fdatasync" : "fsync");
    if ((data_only ? fdatasync(e->fd) : fsync(e->fd)) != 0)
        fail_errno(e, data_only ? "fdatasync" : "fsync", errno);
}

/* lseek(SEEK_DATA/SEEK_HOLE) may call data a hole's bytes, never the
 * reverse: whatever it skips must be zero in the model. */
static uint64_t seek_data(struct exer *e, uint64_t off)
{
    off_t r = lseek(e->fd, (off_t) off, SEEK_DATA);
    if (r < 0 && errno == ENXIO) {
        check_zero(e, "SEEK_DATA gave ENXIO", off, e->size);
        return e->size;
    }
    if (r < 0)
        fail_errno(e, "lseek SEEK_DATA", errno);
    if ((uint64_t) r < off || (uint64_t) r >= e->size)
        fail(e, "SEEK_DATA from %" PRIu64 " returned %jd (size %" PRIu64
             ")", off, (intmax_t) r, e->size);
    check_zero(e, "SEEK_DATA", off, (uint64_t) r);
    return (uint64_t) r;
}

static void op_seek(struct exer *e)
{
    uint64_t off = e->size ? rng_below(&e->rng, e->size) : 0;
    set_desc(e, "SEEK_DATA/SEEK_HOLE from %" PRIu64 " (size %" PRIu64 ")",
             off, e->size);
    if (e->size == 0)
        return;
    uint64_t d = seek_data(e, off);
    if (d >= e->size)
        return;
    off_t h = lseek(e->fd, (off_t) d, SEEK_HOLE);
    if (h < 0)
        fail_errno(e, "lseek SEEK_HOLE", errno);
    if ((uint64_t) h <= d || (uint64_t) h > e->size)
        fail(e, "SEEK_HOLE from data at %" PRIu64 " returned %jd (size %"
             PRIu64 ")", d, (intmax_t) h, e->size);
    if ((uint64_t) h < e->size)
        seek_data(e, (uint64_t) h);
}

static void op_reopen(struct exer *e)
{
    set_desc(e, "close and reopen O_RDWR");
    if (close(e->fd) != 0)
        fail_errno(e, "close", errno);
    e->fd = open(e->path, O_RDWR);
    if (e->fd < 0)
        fail_errno(e, "open", errno);
}

/* Weights in percent; they add up to 100. */
static void one_op(struct exer *e)
{
    unsigned x = (unsigned) rng_below(&e->rng, 100);
    if (x < 32)
        op_write(e);
    else if (x < 58)
        op_read(e);
    else if (x < 67)
        op_truncate(e);
    else if (x < 74)
        op_fallocate(e, FALLOC_FL_PUNCH_HOLE, "PUNCH_HOLE");
    else if (x < 81)
        op_fallocate(e, FALLOC_FL_ZERO_RANGE, "ZERO_RANGE");
    else if (x < 88)
        op_copy(e);
    else if (x < 91)
        op_sync(e, false);
    else if (x < 93)
        op_sync(e, true);
    else if (x < 98)
        op_seek(e);
    else
        op_reopen(e);
    check_size(e);
}

/* ---- writer ------------------------------------------------------------ */

static int load_model(struct exer *e)
{
    struct stat st;
    if (fstat(e->fd, &st) != 0)
        return -errno;
    e->size = (uint64_t) st.st_size;
    const char *src = e->init ? e->init : e->path;
    int fd = open(src, O_RDONLY);
    if (fd < 0)
        return -errno;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return -errno;
    }
    e->export_size = (uint64_t) st.st_size;
    e->model = malloc(e->export_size ? e->export_size : 1);
    uint64_t got = 0;
    while (e->model && got < e->export_size) {
        ssize_t r = pread(fd, e->model + got, e->export_size - got,
                          (off_t) got);
        if (r <= 0)
            break;
        got += (uint64_t) r;
    }
    close(fd);
    if (!e->model)
        return -ENOMEM;
    if (got != e->export_size)
        return -EIO;
    /* Bytes past the size read as zero once the file grows again (a
     * truncation zeroed them); the server must hold zeros there at the
     * end, whatever the initial content said. */
    if (e->size < e->export_size)
        memset(e->model + e->size, 0, e->export_size - e->size);
    return 0;
}

/* The whole file read back in maxop pieces, then the size. */
static void verify_all(struct exer *e)
{
    set_desc(e, "final read of [0, %" PRIu64 ")", e->size);
    for (uint64_t off = 0; off < e->size; off += e->maxop)
        check_read(e, off, e->maxop);
    check_read(e, e->size, 1);
    check_size(e);
}

static int dump_model(struct exer *e)
{
    FILE *f = fopen(e->dump, "wb");
    if (!f)
        return -errno;
    size_t n = fwrite(e->model, 1, e->export_size, f);
    int r = fclose(f);
    return n == e->export_size && r == 0 ? 0 : -EIO;
}

static int run_writer(struct exer *e)
{
    e->rng = e->seed;
    e->fd = open(e->path, O_RDWR);
    if (e->fd < 0) {
        fprintf(stderr, "exer: %s: %s\n", e->path, strerror(errno));
        return 2;
    }
    int r = load_model(e);
    if (r < 0) {
        fprintf(stderr, "exer: initial content of %s: %s\n",
                e->init ? e->init : e->path, strerror(-r));
        return 2;
    }
    if (e->size > e->export_size || e->area > e->export_size) {
        fprintf(stderr, "exer: file size %" PRIu64 " or area %" PRIu64
                " exceeds the export (%" PRIu64 " bytes)\n",
                e->size, e->area, e->export_size);
        return 2;
    }
    e->buf = malloc(e->maxop);
    e->rbuf = malloc(e->maxop);
    if (!e->buf || !e->rbuf)
        return 2;
    for (e->opno = 0; e->opno < e->nops; e->opno++)
        one_op(e);
    verify_all(e);
    set_desc(e, "final close");
    if (close(e->fd) != 0)
        fail_errno(e, "close", errno);
    if (e->dump && (r = dump_model(e)) < 0) {
        fprintf(stderr, "exer: %s: %s\n", e->dump, strerror(-r));
        return 2;
    }
    printf("exer: seed %" PRIu64 ": %ld operations passed, final size %"
           PRIu64 "\n", e->seed, e->nops, e->size);
    free(e->model);
    free(e->buf);
    free(e->rbuf);
    return 0;
}

/* ---- disturber --------------------------------------------------------- */

static void on_stop(int sig)
{
    stop_requested = 1;
}

static void disturb_fail(struct exer *e, long i, const char *what, int err)
{
    fprintf(stderr, "exer: FAIL disturber seed %" PRIu64 " loop %ld: %s: "
            "%s\n", e->seed, i, what, strerror(err));
    exit(1);
}

/* One loop: open, maybe read a random range, maybe fsync, close. */
static void disturb_once(struct exer *e, long i)
{
    bool rw = rng_chance(&e->rng, 40);
    int fd = open(e->path, rw ? O_RDWR : O_RDONLY);
    if (fd < 0)
        disturb_fail(e, i, "open", errno);
    if (rng_chance(&e->rng, 75)) {
        uint64_t n = pick_len(e);
        uint64_t off = rng_below(&e->rng, e->area);
        ssize_t r = pread(fd, e->rbuf, n, (off_t) off);
        if (r < 0)
            disturb_fail(e, i, "pread", errno);
        if ((uint64_t) r > n)
            disturb_fail(e, i, "pread returned more than asked", EIO);
    }
    if (rng_chance(&e->rng, 20) && fsync(fd) != 0)
        disturb_fail(e, i, "fsync", errno);
    if (close(fd) != 0)
        disturb_fail(e, i, "close", errno);
}

static int run_disturber(struct exer *e)
{
    struct sigaction sa = { .sa_handler = on_stop, .sa_flags = SA_RESTART };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    e->rng = e->seed;
    e->rbuf = malloc(e->maxop);
    if (!e->rbuf)
        return 2;
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long i;
    for (i = 0; !stop_requested && (e->nops == 0 || i < e->nops); i++) {
        disturb_once(e, i);
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (e->seconds > 0 && now.tv_sec - t0.tv_sec >= e->seconds)
            break;
    }
    printf("exer: disturber seed %" PRIu64 ": %ld loops\n", e->seed, i);
    free(e->rbuf);
    return 0;
}

/* ---- main -------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
"usage: nbdferry-exer [options] FILE\n"
"       nbdferry-exer --disturb [options] FILE\n"
"\n"
"Writer (default): random I/O on FILE checked against a model.\n"
"  -s, --seed N        seed (default 1); the same seed, options and\n"
"                      initial content give the same operations\n"
"  -n, --ops N         operations (default 10000)\n"
"  -a, --area SIZE     operations stay within [0, SIZE) (default 8M)\n"
"  -m, --max-op SIZE   largest read/write/zero/copy (default 256K)\n"
"  -i, --init FILE     the export's current bytes (default: read FILE\n"
"                      itself, trusting the mount)\n"
"  -d, --dump FILE     write the final expected export bytes to FILE\n"
"  -v, --verbose       print every operation\n"
"Disturber: loop open, read, maybe fsync, close; content unchecked.\n"
"  -D, --disturb       disturber mode\n"
"  -n, --ops N         loops (default 0: until SIGTERM/SIGINT)\n"
"  -t, --time SECONDS  stop after this long (default 0: no limit)\n"
"Exit status: 0 pass, 1 a check or an I/O operation failed, 2 usage or\n"
"setup error.\n");
}

static int parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s)
        return -EINVAL;
    switch (*end) {
    case 'k': case 'K': v <<= 10; end++; break;
    case 'm': case 'M': v <<= 20; end++; break;
    case 'g': case 'G': v <<= 30; end++; break;
    }
    if (*end)
        return -EINVAL;
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        { "seed", required_argument, NULL, 's' },
        { "ops", required_argument, NULL, 'n' },
        { "area", required_argument, NULL, 'a' },
        { "max-op", required_argument, NULL, 'm' },
        { "init", required_argument, NULL, 'i' },
        { "dump", required_argument, NULL, 'd' },
        { "time", required_argument, NULL, 't' },
        { "disturb", no_argument, NULL, 'D' },
        { "verbose", no_argument, NULL, 'v' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };
    struct exer e = { .seed = 1, .nops = -1, .area = 8 * MiB,
                      .maxop = 256 * KiB };
    bool disturb = false;
    uint64_t v;
    int c;

    while ((c = getopt_long(argc, argv, "s:n:a:m:i:d:t:Dvh", longopts,
                            NULL)) != -1) {
        switch (c) {
        case 's':
            if (parse_size(optarg, &e.seed) < 0)
                goto bad;
            break;
        case 'n':
            if (parse_size(optarg, &v) < 0 || v > 1000000000)
                goto bad;
            e.nops = (long) v;
            break;
        case 'a':
            if (parse_size(optarg, &e.area) < 0 || e.area == 0)
                goto bad;
            break;
        case 'm':
            if (parse_size(optarg, &e.maxop) < 0 || e.maxop == 0 ||
                e.maxop > 64 * MiB)
                goto bad;
            break;
        case 'i': e.init = optarg; break;
        case 'd': e.dump = optarg; break;
        case 't':
            if (parse_size(optarg, &v) < 0 || v > 1000000)
                goto bad;
            e.seconds = (long) v;
            break;
        case 'D': disturb = true; break;
        case 'v': e.verbose = true; break;
        case 'h': usage(stdout); return 0;
        default: goto bad;
        }
    }
    if (optind != argc - 1)
        goto bad;
    e.path = argv[optind];
    if (e.nops < 0)
        e.nops = disturb ? 0 : 10000;
    setvbuf(stdout, NULL, _IOLBF, 0);
    return disturb ? run_disturber(&e) : run_writer(&e);
bad:
    usage(stderr);
    return 2;
}
