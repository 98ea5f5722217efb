/* tests/fuzz/fuzz-cli.c: libFuzzer target for the daemon's command-line
 * helpers (fs/cli.c): sizes, numbers, the server arguments and the
 * mountpoint.  Input: NUL-separated arguments; the first byte picks what
 * is exercised.  Checks, besides ASan/UBSan/LeakSanitizer: every error
 * comes with a one-line message, and successful parses are consistent
 * (sizes are the number times the suffix, modes match their arguments,
 * the file name is a usable name). */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fs/cli.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_ARGS 16

static void check_msg(int r, const char *msg)
{
    if (r >= 0)
        return;
    size_t n = strnlen(msg, CLI_MSG_MAX);
    if (n == 0 || n == CLI_MSG_MAX) {
        fprintf(stderr, "error %d without a proper message\n", r);
        abort();
    }
    /* One line, unless the user's own argument carried the newline. */
}

static void sizes(char **argv, int argc)
{
    char msg[CLI_MSG_MAX];
    for (int i = 0; i < argc; i++) {
        uint64_t v = 0;
        int r = cli_parse_size("--x", argv[i], &v, msg, sizeof msg);
        check_msg(r, msg);
        if (r == 0 && !isdigit((unsigned char) argv[i][0]))
            abort();
        if (r == 0) {
            unsigned long long base = strtoull(argv[i], NULL, 10);
            if (v < base || (base && v % base))
                abort();                  /* suffix times number */
        }
        unsigned u = 0, lo = (unsigned) i, hi = 1000u * (unsigned) i + 7;
        r = cli_parse_uint("--y", argv[i], lo, hi, &u, msg, sizeof msg);
        check_msg(r, msg);
        if (r == 0 && (u < lo || u > hi))
            abort();
    }
}

static void server(char **argv, int argc)
{
    char msg[CLI_MSG_MAX];
    struct nbdx_config c;
    bool set = false;

    memset(&c, 0, sizeof c);
    int r = cli_parse_server(&c, &set, argc, argv, msg, sizeof msg);
    check_msg(r, msg);
    if (r < 0)
        return;
    if (!set)
        abort();
    switch (c.mode) {
    case NBDX_URI: if (!c.uri) abort(); break;
    case NBDX_SOCKET_ACTIVATION:
    case NBDX_COMMAND: if (!c.argv || !c.argv[0]) abort(); break;
    case NBDX_UNIX: if (!c.path) abort(); break;
    case NBDX_TCP: if (!c.host || !c.port) abort(); break;
    case NBDX_FD: if (c.fd < 0) abort(); break;
    }
}

static void mountpoint(const char *arg)
{
    char msg[CLI_MSG_MAX];
    char *mp, *fn;
    struct stat st;

    int r = cli_parse_mountpoint(arg, ".nbdferry-status", &mp, &fn, msg,
                                 sizeof msg);
    check_msg(r, msg);
    if (r < 0) {
        if (mp || fn)
            abort();
        return;
    }
    if (!mp || !fn || !fn[0] || strchr(fn, '/') || strlen(fn) > 200 ||
        strcmp(fn, ".nbdferry-status") == 0 ||
        stat(mp, &st) == -1 || !S_ISDIR(st.st_mode))
        abort();
    free(mp);
    free(fn);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 4096)
        return 0;
    unsigned sel = data[0];
    char *copy = malloc(size);
    char *argv[MAX_ARGS + 1];
    int argc = 0;

    if (!copy)
        return 0;
    memcpy(copy, data + 1, size - 1);
    copy[size - 1] = '\0';
    for (char *p = copy; argc < MAX_ARGS && p < copy + size - 1;
         p += strlen(p) + 1)
        argv[argc++] = p;
    argv[argc] = NULL;

    switch (sel % 3) {
    case 0: sizes(argv, argc); break;
    case 1: server(argv, argc); break;
    case 2: if (argc) mountpoint(argv[0]); break;
    }
    free(copy);
    return 0;
}
