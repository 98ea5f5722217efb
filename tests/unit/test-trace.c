/* Unit test for fs/trace.h and log_trace(): nothing, and no argument
 * evaluated, without -v; with -v every line, none held back by the rate
 * limit that log_info() has. */
#undef NDEBUG
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fs/trace.h"

static int evaluated;
static int arg(int v) { evaluated++; return v; }

/* Run f with stderr going to a file; return what it wrote. */
static char *capture(void (*f)(void))
{
    char path[] = "/tmp/trace-test-XXXXXX";
    int fd = mkstemp(path), saved = dup(STDERR_FILENO);
    static char buf[65536];

    assert(fd >= 0 && saved >= 0);
    unlink(path);
    assert(dup2(fd, STDERR_FILENO) == STDERR_FILENO);
    f();
    assert(dup2(saved, STDERR_FILENO) == STDERR_FILENO);
    close(saved);
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    assert(n >= 0);
    buf[n] = '\0';
    close(fd);
    return buf;
}

static void twenty_writes(void)
{
    for (int i = 0; i < 20; i++)
        TRACE(NULL, "write ino=%d off=%d len=%zu", arg(2), i * 4096,
              (size_t) 4096);
}

static int count(const char *s, const char *w)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, w)) != NULL; p += strlen(w))
        n++;
    return n;
}

int main(void)
{
    log_set_program("test-trace");

    log_verbosity = 0;
    char *out = capture(twenty_writes);
    assert(out[0] == '\0' && evaluated == 0);

    log_verbosity = 1;
    out = capture(twenty_writes);
    assert(evaluated == 20);
    assert(count(out, "\n") == 20);
    assert(count(out, "pid 0: write ino=2 off=") == 20);
    assert(strstr(out, "off=77824 len=4096\n"));     /* the 20th */
    assert(!strstr(out, "rate limit"));
    printf("trace: ok\n");
    return 0;
}
