/* fs/cli.c: command-line parsing helpers (see fs/cli.h). */
#include "fs/cli.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int fail(int err, char *msg, size_t msglen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(int err, char *msg, size_t msglen, const char *fmt, ...)
{
    va_list ap;

    if (msglen) {
        va_start(ap, fmt);
        vsnprintf(msg, msglen, fmt, ap);
        va_end(ap);
    }
    return -err;
}

int cli_parse_size(const char *opt, const char *s, uint64_t *out,
                   char *msg, size_t msglen)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    uint64_t mul = 1;

    if (errno || end == s || !isdigit((unsigned char) s[0]))
        return fail(EINVAL, msg, msglen, "%s: '%s' is not a size", opt, s);
    switch (toupper((unsigned char) *end)) {
    case 'K': mul = 1ull << 10; end++; break;
    case 'M': mul = 1ull << 20; end++; break;
    case 'G': mul = 1ull << 30; end++; break;
    case 'T': mul = 1ull << 40; end++; break;
    }
    if (*end == 'i' || *end == 'B')
        end += (*end == 'i' && end[1] == 'B') ? 2 : 1;
    if (*end != '\0')
        return fail(EINVAL, msg, msglen, "%s: '%s' is not a size", opt, s);
    if (v > UINT64_MAX / mul)
        return fail(ERANGE, msg, msglen, "%s: '%s' is too large", opt, s);
    *out = v * mul;
    return 0;
}

int cli_parse_uint(const char *opt, const char *s, unsigned min,
                   unsigned max, unsigned *out, char *msg, size_t msglen)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);

    if (errno || end == s || *end || !isdigit((unsigned char) s[0]))
        return fail(EINVAL, msg, msglen, "%s: '%s' is not a number", opt, s);
    if (v < min || v > max)
        return fail(ERANGE, msg, msglen, "%s: %s is out of range (%u to %u)",
                    opt, s, min, max);
    *out = (unsigned) v;
    return 0;
}

int cli_set_mode(struct nbdx_config *nbd, bool *mode_set, enum nbdx_mode m,
                 char *msg, size_t msglen)
{
    if (*mode_set && nbd->mode != m)
        return fail(EINVAL, msg, msglen,
                    "only one of --command, --socket-activation, --unix, "
                    "--tcp and --fd may be given");
    nbd->mode = m;
    *mode_set = true;
    return 0;
}

/* 1 if arg is a mode flag (recorded), 0 if not, -errno on a conflict. */
static int mode_flag(struct nbdx_config *nbd, bool *mode_set, const char *arg,
                     char *msg, size_t msglen)
{
    static const struct { const char *name; enum nbdx_mode mode; } flags[] = {
        { "--command", NBDX_COMMAND },
        { "--socket-activation", NBDX_SOCKET_ACTIVATION },
        { "--unix", NBDX_UNIX },
        { "--tcp", NBDX_TCP },
        { "--fd", NBDX_FD },
    };
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (strcmp(arg, flags[i].name) == 0) {
            int r = cli_set_mode(nbd, mode_set, flags[i].mode, msg, msglen);
            return r < 0 ? r : 1;
        }
    return 0;
}

int cli_parse_server(struct nbdx_config *nbd, bool *mode_set, int argc,
                     char **argv, char *msg, size_t msglen)
{
    int r;

    if (!*mode_set && argc > 0) {
        r = mode_flag(nbd, mode_set, argv[0], msg, msglen);
        if (r < 0)
            return r;
        if (r > 0) {
            argc--;
            argv++;
        }
    }
    if (!*mode_set && argc > 0 && strcmp(argv[0], "[") == 0) {
        if (argc < 3 || strcmp(argv[argc - 1], "]") != 0)
            return fail(EINVAL, msg, msglen,
                        "'[ CMD ARGS ]' needs a command and a closing ']'");
        argv[argc - 1] = NULL;
        r = cli_set_mode(nbd, mode_set, NBDX_SOCKET_ACTIVATION, msg, msglen);
        if (r < 0)
            return r;
        nbd->argv = argv + 1;
        return 0;
    }
    if (!*mode_set) {
        r = cli_set_mode(nbd, mode_set, NBDX_URI, msg, msglen);
        if (r < 0)
            return r;
    }
    switch (nbd->mode) {
    case NBDX_URI:
        if (argc != 1)
            return fail(EINVAL, msg, msglen, "%s",
                        argc ? "too many arguments after the URI"
                             : "missing the server: URI, [ CMD ], --unix, "
                               "--tcp, --command or --fd");
        nbd->uri = argv[0];
        break;
    case NBDX_SOCKET_ACTIVATION:
    case NBDX_COMMAND:
        if (argc < 1)
            return fail(EINVAL, msg, msglen, "missing the server command");
        nbd->argv = argv;
        break;
    case NBDX_UNIX:
        if (argc != 1)
            return fail(EINVAL, msg, msglen, "--unix takes one socket path");
        nbd->path = argv[0];
        break;
    case NBDX_TCP:
        if (argc != 2)
            return fail(EINVAL, msg, msglen, "--tcp takes a host and a port");
        nbd->host = argv[0];
        nbd->port = argv[1];
        break;
    case NBDX_FD: {
        unsigned fd;
        if (argc != 1)
            return fail(EINVAL, msg, msglen,
                        "--fd takes one file descriptor number");
        r = cli_parse_uint("--fd", argv[0], 0, INT_MAX, &fd, msg, msglen);
        if (r < 0)
            return r;
        nbd->fd = (int) fd;
        if (fcntl(nbd->fd, F_GETFD) == -1)
            return fail(EBADF, msg, msglen,
                        "--fd %d: not an open file descriptor", nbd->fd);
        break;
    }
    }
    return 0;
}

int cli_parse_mountpoint(const char *arg, const char *reserved_name,
                         char **mountpoint, char **filename,
                         char *msg, size_t msglen)
{
    struct stat st;
    char *copy, *mp = NULL, *fn = NULL;
    int r = 0;

    *mountpoint = *filename = NULL;
    if (stat(arg, &st) == 0 && S_ISDIR(st.st_mode)) {
        mp = strdup(arg);
        fn = strdup("nbd");
        if (!mp || !fn) {
            r = fail(ENOMEM, msg, msglen, "%s", strerror(ENOMEM));
            goto out;
        }
        goto out;
    }
    copy = strdup(arg);
    char *slash = copy ? strrchr(copy, '/') : NULL;
    if (!slash || slash[1] == '\0') {
        int err = errno;
        free(copy);
        return fail(err == ENOENT ? ENOENT : ENOTDIR, msg, msglen,
                    "mountpoint %s: %s", arg,
                    err == ENOENT ? "no such directory" : "not a directory");
    }
    *slash = '\0';
    fn = strdup(slash + 1);
    mp = strdup(copy[0] ? copy : "/");
    free(copy);
    if (!mp || !fn) {
        r = fail(ENOMEM, msg, msglen, "%s", strerror(ENOMEM));
        goto out;
    }
    if (stat(mp, &st) == -1 || !S_ISDIR(st.st_mode)) {
        r = fail(ENOENT, msg, msglen, "mountpoint %s: no such directory", mp);
        goto out;
    }
    if (strcmp(fn, ".") == 0 || strcmp(fn, "..") == 0 ||
        (reserved_name && strcmp(fn, reserved_name) == 0) ||
        strlen(fn) > 200)
        r = fail(EINVAL, msg, msglen, "'%s' cannot be the file name", fn);
out:
    if (r < 0) {
        free(mp);
        free(fn);
        return r;
    }
    *mountpoint = mp;
    *filename = fn;
    return 0;
}
