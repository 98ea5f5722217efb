/* tools/sync/status.c: the whole-disk digest of the file nbdferry-sync
 * wrote, read from its mount's status (MNT/.nbdferry-status, JSON, as
 * fs/status.c writes it: one disk's keys at the top, or a "disks" array
 * whose entries start with "name").
 *
 * Only the few keys needed are picked out of that known document; this is
 * not a general JSON reader.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tools/sync/sync.h"

#define STATUS_NAME ".nbdferry-status"
#define POLL_MS     200                 /* the longest wait between reads */

/* The whole file, NUL-terminated; NULL with errno. */
static char *slurp(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    size_t len = 0, cap = 64 << 10;
    char *buf = NULL;

    if (fd < 0)
        return NULL;
    for (;;) {
        char *nb = realloc(buf, cap + 1);
        if (!nb)
            break;
        buf = nb;
        ssize_t n = read(fd, buf + len, cap - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            break;
        if (n == 0) {
            close(fd);
            buf[len] = '\0';
            return buf;
        }
        len += (size_t) n;
        if (len == cap)
            cap *= 2;
    }
    int e = errno;
    close(fd);
    free(buf);
    errno = e;
    return NULL;
}

/* The value of "key": "..." in [p, end), unescaped into out (cut to
 * size); false if absent. */
static bool get_string(const char *p, const char *end, const char *key,
                       char *out, size_t size)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": \"", key);
    const char *s = strstr(p, pat);
    size_t n = 0;

    if (!s || s >= end)
        return false;
    for (s += strlen(pat); *s && *s != '"' && s < end; s++) {
        if (*s == '\\' && s[1])
            s++;                        /* \" \\ kept; \uXXXX as is */
        if (n + 1 < size)
            out[n++] = *s;
    }
    out[n] = '\0';
    return true;
}

static bool get_number(const char *p, const char *end, const char *key,
                       uint64_t *out)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *s = strstr(p, pat);

    if (!s || s >= end)
        return false;
    *out = strtoull(s + strlen(pat), NULL, 10);
    return true;
}

/* The object that follows "key": { in [p, end): [*ob, *oe). */
static bool get_object(const char *p, const char *end, const char *key,
                       const char **ob, const char **oe)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": {", key);
    const char *s = strstr(p, pat);
    bool in_string = false;
    int depth = 0;

    if (!s || s >= end)
        return false;
    *ob = s + strlen(pat) - 1;
    for (s = *ob; s < end && *s; s++) {
        if (in_string) {
            if (*s == '\\' && s[1])
                s++;
            else if (*s == '"')
                in_string = false;
        } else if (*s == '"') {
            in_string = true;
        } else if (*s == '{') {
            depth++;
        } else if (*s == '}' && --depth == 0) {
            *oe = s + 1;
            return true;
        }
    }
    return false;
}

/* The part of the document about the disk file 'base': all of it for a
 * mount of one disk, else its entry of "disks". */
static bool disk_section(const char *doc, const char *base, const char **b,
                         const char **e)
{
    *b = doc;
    *e = doc + strlen(doc);
    if (!strstr(doc, "\"disks\": ["))
        return true;
    char pat[512];
    snprintf(pat, sizeof pat, "\"name\": \"%s\"", base);
    const char *s = strstr(doc, pat);
    if (!s)
        return false;
    *b = s;
    const char *next = strstr(s + 1, "\"name\": \"");
    if (next)
        *e = next;
    return true;
}

static bool read_once(const char *path, const char *base,
                      struct sync_digest *d, uint64_t *covered)
{
    char *doc = slurp(path);
    const char *b, *e, *ob, *oe;

    if (!doc) {
        snprintf(d->why, sizeof d->why, "%.200s: %s (not on an nbdferry "
                 "mount?)", path, strerror(errno));
        return false;
    }
    if (!disk_section(doc, base, &b, &e)) {
        snprintf(d->why, sizeof d->why, "%.200s does not name the disk %.40s",
                 path, base);
        free(doc);
        return false;
    }
    if (!get_object(b, e, "digest", &ob, &oe)) {
        snprintf(d->why, sizeof d->why, "%.200s shows no digest", path);
        free(doc);
        return false;
    }
    d->found = true;
    get_string(ob, oe, "algorithm", d->algorithm, sizeof d->algorithm);
    get_string(ob, oe, "state", d->state, sizeof d->state);
    if (!get_string(ob, oe, "value", d->value, sizeof d->value))
        d->value[0] = '\0';
    if (!get_string(ob, oe, "reason", d->reason, sizeof d->reason))
        d->reason[0] = '\0';
    if (!get_number(ob, oe, "covered", covered))
        *covered = 0;
    const char *pb, *pe;
    d->have_skipped = get_object(b, e, "progress", &pb, &pe) &&
                      get_number(pb, pe, "skipped_bytes", &d->skipped);
    free(doc);
    return true;
}

void sync_digest_read(const char *dest, unsigned timeout_s,
                      struct sync_digest *d)
{
    char path[4096];
    const char *slash = strrchr(dest, '/');
    const char *base = slash ? slash + 1 : dest;
    int dirlen = slash ? (int) (slash - dest) : 1;
    const char *dir = slash ? dest : ".";
    uint64_t covered = 0, last = 0;
    unsigned still_ms = 0, wait_ms = 1;

    memset(d, 0, sizeof *d);
    if (slash == dest)
        dirlen = 0;                     /* "/FILE": the root */
    snprintf(path, sizeof path, "%.*s/%s", dirlen, dir, STATUS_NAME);
    /* The digest thread catches up after the close: wait while it moves.
     * It usually has within milliseconds (a cutover's few blocks, the
     * rest from the manifest): the first waits are short and double up
     * to POLL_MS, so that a cutover does not idle a whole poll period,
     * and a long catch-up still costs a read per POLL_MS. */
    while (read_once(path, base, d, &covered) &&
           strcmp(d->state, "computing") == 0) {
        if (covered != last) {
            last = covered;
            still_ms = 0;
        }
        if (still_ms >= timeout_s * 1000u)
            return;
        struct timespec ts = { wait_ms / 1000, (wait_ms % 1000) * 1000000L };
        nanosleep(&ts, NULL);
        still_ms += wait_ms;
        wait_ms = wait_ms * 2 < POLL_MS ? wait_ms * 2 : POLL_MS;
    }
}
