/* common/log.c: see log.h.
 *
 * THREAD MODEL
 * Any thread logs.  'lock' protects the rate-limit table and the ring of
 * recent errors; it is a leaf (nothing else is locked while holding it)
 * and is released before the line is written.
 */
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/monotime.h"

#define LIMIT_SLOTS 64            /* call sites tracked; beyond: shared slot */

int log_verbosity;
static bool use_syslog;
static const char *program = "nbdferry";
static const char *context;
static int log_fd = -1;           /* --log-file, or -1 */
static _Atomic size_t bar_width;  /* log_bar_drawn() */

#define BAR_MAX 256               /* the widest bar cleared */

struct site {
    const void *fmt;              /* the call site's identity */
    time_t window;                /* CLOCK_MONOTONIC start of its window */
    unsigned printed;             /* in this window */
    uint64_t held;                /* counted, not printed */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct site sites[LIMIT_SLOTS];
static struct log_entry recent[LOG_RECENT];
static unsigned nrecent, next_recent;
static uint64_t nerrors, nwarnings;

void log_set_program(const char *name) { program = name; }
void log_bar_drawn(size_t width) { atomic_store(&bar_width, width); }
void log_set_context(const char *c) { context = c; }

void log_set_syslog(bool on)
{
    if (on && !use_syslog)
        openlog(program, LOG_PID, LOG_DAEMON);
    use_syslog = on;
}

/* The --log-file line: UTC time, program, pid, the mount. */
static void emit_file(const char *tag, const char *msg)
{
    char line[1300], when[32];
    struct timespec ts;
    struct tm tm;

    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    int n = snprintf(line, sizeof line, "%s %s[%ld]: %s%s%s%s\n", when,
                     program, (long) getpid(), context ? context : "",
                     context ? ": " : "", tag, msg);
    if (n > (int) sizeof line)
        n = sizeof line;
    if (write(log_fd, line, (size_t) n) < 0) {
        /* nowhere left to report it */
    }
}

int log_set_file(const char *path)
{
    struct stat st;
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW |
                  O_NONBLOCK | O_CLOEXEC, 0600);

    if (fd == -1)
        return errno == ELOOP ? -EPERM : -errno;
    if (fstat(fd, &st) == -1 || !S_ISREG(st.st_mode) ||
        st.st_uid != geteuid() || st.st_nlink != 1) {
        close(fd);
        return -EPERM;
    }
    log_fd = fd;
    return 0;
}

static void emit(int prio, const char *tag, const char *msg)
{
    if (log_fd >= 0)
        emit_file(tag, msg);
    if (use_syslog) {
        if (context)
            syslog(prio, "%s: %s%s", context, tag, msg);
        else
            syslog(prio, "%s%s", tag, msg);
        return;
    }
    /* One write(2) per line so lines from threads never interleave; a
     * progress bar on the line is cleared first (log_bar_drawn()). */
    char line[1200 + BAR_MAX + 2];
    size_t bar = atomic_exchange(&bar_width, 0), k = 0;
    if (bar > BAR_MAX)
        bar = BAR_MAX;
    if (bar) {
        line[k++] = '\r';
        memset(line + k, ' ', bar);
        k += bar;
        line[k++] = '\r';
    }
    int n = snprintf(line + k, sizeof line - k, "%s: %s%s\n", program, tag,
                     msg);
    if (n > (int) (sizeof line - k))
        n = (int) (sizeof line - k);
    n += (int) k;
    if (write(STDERR_FILENO, line, (size_t) n) < 0) {
        /* nowhere left to report it */
    }
}

/* Remember an error or warning for the status (locked). */
static void remember_locked(bool error, const char *msg)
{
    time_t now = time(NULL);
    struct log_entry *last =
        &recent[(next_recent + LOG_RECENT - 1) % LOG_RECENT];

    if (error)
        nerrors++;
    else
        nwarnings++;
    if (nrecent && last->error == error && strcmp(last->msg, msg) == 0) {
        last->repeated++;
        last->last = now;
        return;
    }
    struct log_entry *e = &recent[next_recent];
    e->error = error;
    e->first = e->last = now;
    e->repeated = 1;
    size_t n = strnlen(msg, sizeof e->msg - 1);
    memcpy(e->msg, msg, n);       /* truncated: the status keeps 255 bytes */
    e->msg[n] = '\0';
    next_recent = (next_recent + 1) % LOG_RECENT;
    if (nrecent < LOG_RECENT)
        nrecent++;
}

static struct site *site_locked(const void *fmt)
{
    size_t h = ((uintptr_t) fmt >> 3) % LIMIT_SLOTS;
    for (size_t i = 0; i < LIMIT_SLOTS; i++) {
        struct site *s = &sites[(h + i) % LIMIT_SLOTS];
        if (s->fmt == fmt || s->fmt == NULL) {
            s->fmt = fmt;
            return s;
        }
    }
    return &sites[h];             /* full: share a slot (still limited) */
}

/* May this site print now?  *held receives the count of lines it held
 * back in its previous window, to be reported first. */
static bool admit_locked(const void *fmt, uint64_t *held)
{
    struct site *s = site_locked(fmt);
    time_t now = (time_t) (mono_now_ns() / NS_PER_S);

    *held = 0;
    if (now - s->window >= LOG_WINDOW_S) {
        *held = s->held;
        s->held = 0;
        s->window = now;
        s->printed = 0;
    }
    if (s->printed >= LOG_BURST) {
        s->held++;
        return false;
    }
    s->printed++;
    return true;
}

static void vlog(int prio, const char *tag, const void *site,
                 const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));
/* The calling thread's subject (log_set_thread_subject()), or NULL. */
static __thread const char *thread_subject;

void log_set_thread_subject(const char *subject)
{
    thread_subject = subject;
}

static void vlog(int prio, const char *tag, const void *site,
                 const char *fmt, va_list ap)
{
    char msg[1024];
    uint64_t held = 0;
    bool print = true;
    int n = thread_subject ? snprintf(msg, sizeof msg, "%s: ",
                                      thread_subject) : 0;

    vsnprintf(msg + n, sizeof msg - (size_t) n, fmt, ap);
    if (prio != LOG_DEBUG) {
        LOCK_FOR_SCOPE(&lock);
        if (prio <= LOG_WARNING)
            remember_locked(prio <= LOG_ERR, msg);
        print = admit_locked(site ? site : fmt, &held);
    }
    if (held) {
        char note[96];
        snprintf(note, sizeof note, "%" PRIu64 " more like the next line "
                 "were not shown (rate limit)", held);
        emit(prio, tag, note);
    }
    if (print)
        emit(prio, tag, msg);
}

void log_flush(void)
{
    uint64_t held = 0;
    {
        LOCK_FOR_SCOPE(&lock);
        for (size_t i = 0; i < LIMIT_SLOTS; i++) {
            held += sites[i].held;
            sites[i].held = 0;
        }
    }
    if (held) {
        char note[96];
        snprintf(note, sizeof note, "%" PRIu64 " repeated line(s) were not "
                 "shown (rate limit)", held);
        emit(LOG_NOTICE, "notice: ", note);
    }
}

unsigned log_recent(struct log_entry *out, uint64_t *errors,
                    uint64_t *warnings)
{
    LOCK_FOR_SCOPE(&lock);
    unsigned n = nrecent;
    for (unsigned i = 0; i < n; i++)
        out[i] = recent[(next_recent + LOG_RECENT - n + i) % LOG_RECENT];
    *errors = nerrors;
    *warnings = nwarnings;
    return n;
}

#define DEFINE_LOG(name, prio, tag, level)                                    \
    void name(const char *fmt, ...)                                           \
    {                                                                         \
        if (log_verbosity < (level))                                          \
            return;                                                           \
        va_list ap;                                                           \
        va_start(ap, fmt);                                                    \
        vlog(prio, tag, NULL, fmt, ap);                                       \
        va_end(ap);                                                           \
    }

DEFINE_LOG(log_err, LOG_ERR, "error: ", 0)
DEFINE_LOG(log_warn, LOG_WARNING, "warning: ", 0)
DEFINE_LOG(log_notice, LOG_NOTICE, "notice: ", 0)
DEFINE_LOG(log_info, LOG_INFO, "", 1)
DEFINE_LOG(log_debug, LOG_DEBUG, "debug: ", 2)
DEFINE_LOG(log_trace, LOG_DEBUG, "", 1)

#define DEFINE_LOG_SITE(name, prio, tag, level)                               \
    void name(const void *site, const char *fmt, ...)                         \
    {                                                                         \
        if (log_verbosity < (level))                                          \
            return;                                                           \
        va_list ap;                                                           \
        va_start(ap, fmt);                                                    \
        vlog(prio, tag, site, fmt, ap);                                       \
        va_end(ap);                                                           \
    }

DEFINE_LOG_SITE(log_err_site, LOG_ERR, "error: ", 0)
DEFINE_LOG_SITE(log_notice_site, LOG_NOTICE, "notice: ", 0)
DEFINE_LOG_SITE(log_info_site, LOG_INFO, "", 1)
