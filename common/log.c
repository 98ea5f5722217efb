#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <syslog.h>
#include <unistd.h>

int log_verbosity;
static bool use_syslog;
static const char *program = "nbdferry";

void log_set_program(const char *name) { program = name; }

void log_set_syslog(bool on)
{
    if (on && !use_syslog)
        openlog(program, LOG_PID, LOG_DAEMON);
    use_syslog = on;
}

static void vlog(int prio, const char *tag, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));
static void vlog(int prio, const char *tag, const char *fmt, va_list ap)
{
    char msg[1024];

    vsnprintf(msg, sizeof msg, fmt, ap);
    if (use_syslog) {
        syslog(prio, "%s%s", tag, msg);
        return;
    }
    /* One write(2) per line so lines from threads never interleave. */
    char line[1200];
    int n = snprintf(line, sizeof line, "%s: %s%s\n", program, tag, msg);
    if (n > (int) sizeof line)
        n = sizeof line;
    if (write(STDERR_FILENO, line, (size_t) n) < 0) {
        /* nowhere left to report it */
    }
}

#define DEFINE_LOG(name, prio, tag, level)                                    \
    void name(const char *fmt, ...)                                           \
    {                                                                         \
        if (log_verbosity < (level))                                          \
            return;                                                           \
        va_list ap;                                                           \
        va_start(ap, fmt);                                                    \
        vlog(prio, tag, fmt, ap);                                             \
        va_end(ap);                                                           \
    }

DEFINE_LOG(log_err, LOG_ERR, "error: ", 0)
DEFINE_LOG(log_warn, LOG_WARNING, "warning: ", 0)
DEFINE_LOG(log_notice, LOG_NOTICE, "notice: ", 0)
DEFINE_LOG(log_info, LOG_INFO, "", 1)
DEFINE_LOG(log_debug, LOG_DEBUG, "debug: ", 2)
