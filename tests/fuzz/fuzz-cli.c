/* tests/fuzz/fuzz-cli.c: libFuzzer target for the daemon's command-line
 * helpers (daemon/cli.c): sizes, numbers, the server arguments, the
 * mountpoint (resolved and checked), -o lists, the fstab form (URI
 * MOUNTPOINT -o OPTS) and --vsock.  Input: NUL-separated arguments; the
 * first byte picks what is exercised.  Checks, besides
 * ASan/UBSan/LeakSanitizer: every error comes with a one-line message,
 * and successful parses are consistent (sizes are the number times the
 * suffix, modes match their arguments, the file name is a usable name,
 * the mountpoint is absolute and never a system directory, nbdferry's
 * own -o items never reach libfuse). */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "daemon/cli.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_ARGS 16

/* Then cleared, so that the next call's error is judged by its own
 * message, never by one left over. */
static void check_msg(int r, struct nbdf_err *err)
{
    size_t n = strnlen(err->msg, sizeof err->msg);
    if (r < 0 && (n == 0 || n == sizeof err->msg)) {
        fprintf(stderr, "error %d without a proper message\n", r);
        abort();
    }
    /* One line, unless the user's own argument carried the newline. */
    err->msg[0] = '\0';
}

static void sizes(char **argv, int argc)
{
    struct nbdf_err err = { "" };
    for (int i = 0; i < argc; i++) {
        uint64_t v = 0;
        int r = cli_parse_size("--x", argv[i], &v, &err);
        check_msg(r, &err);
        if (r == 0 && !isdigit((unsigned char) argv[i][0]))
            abort();
        if (r == 0) {
            unsigned long long base = strtoull(argv[i], NULL, 10);
            if (v < base || (base && v % base))
                abort();                  /* suffix times number */
        }
        unsigned u = 0, lo = (unsigned) i, hi = 1000u * (unsigned) i + 7;
        r = cli_parse_uint("--y", argv[i], lo, hi, &u, &err);
        check_msg(r, &err);
        if (r == 0 && (u < lo || u > hi))
            abort();
    }
}

static void server(char **argv, int argc)
{
    struct nbdf_err err = { "" };
    struct nbdx_config c;
    bool set = false;

    memset(&c, 0, sizeof c);
    int r = cli_parse_server(&c, &set, argc, argv, &err);
    check_msg(r, &err);
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

/* The mountpoint, resolved and checked; sel picks -o nonempty. */
static void mountpoint(const char *arg, bool nonempty)
{
    struct nbdf_err err = { "" };
    struct cli_mountpoint m;
    struct stat st;

    int r = cli_parse_mountpoint(arg, ".nbdferry-status", nonempty, &m,
                                 &err);
    check_msg(r, &err);
    if (r < 0) {
        if (m.mountpoint || m.filename || m.fd != -1)
            abort();
        return;
    }
    if (m.fd < 0 || !m.mountpoint || m.mountpoint[0] != '/' || !m.filename ||
        !m.filename[0] || strchr(m.filename, '/') ||
        strlen(m.filename) > 255 ||
        strcmp(m.filename, ".nbdferry-status") == 0 ||
        stat(m.mountpoint, &st) == -1 ||
        (m.file_mode ? !S_ISREG(st.st_mode) : !S_ISDIR(st.st_mode)))
        abort();
    /* Never a system directory, whatever the spelling. */
    if (!m.file_mode && (strcmp(m.mountpoint, "/") == 0 ||
                         strcmp(m.mountpoint, "/etc") == 0 ||
                         strcmp(m.mountpoint, "/tmp") == 0))
        abort();
    cli_mountpoint_free(&m);
}

/* -o lists, as from the command line or an fstab options field: what
 * nbdferry takes never reaches libfuse, the rest arrives unchanged. */
static void fuse_opts(char **argv, int argc)
{
    struct nbdf_err err = { "" };
    struct cli_fuse_opts fo;

    memset(&fo, 0, sizeof fo);
    for (int i = 0; i < argc; i++) {
        int r = cli_add_fuse_opts(&fo, argv[i], &err);
        check_msg(r, &err);
        if (r < 0)
            break;
    }
    for (const char *p = fo.pass; p && *p;) {
        size_t n = 0;
        while (p[n] && p[n] != ',')
            n += (p[n] == '\\' && p[n + 1]) ? 2 : 1;
        if (n == 0 ||
            (n == 8 && strncmp(p, "nonempty", 8) == 0) ||
            (n == 12 && strncmp(p, "kernel_cache", 12) == 0) ||
            (n == 12 && strncmp(p, "block_device", 12) == 0) ||
            strncmp(p, "uid=", 4) == 0 || strncmp(p, "gid=", 4) == 0)
            abort();                      /* ours, or an empty item */
        p += n + (p[n] == ',');
    }
    cli_fuse_opts_free(&fo);
}

/* The fstab form, as mount.fuse3 runs it: URI MOUNTPOINT -o OPTS ...;
 * options first, then the mountpoint with -o nonempty as they said. */
static void fstab(char **argv, int argc)
{
    struct nbdf_err err = { "" };
    struct cli_fuse_opts fo;

    if (argc < 2)
        return;
    memset(&fo, 0, sizeof fo);
    for (int i = 2; i + 1 < argc; i += 2)
        if (strcmp(argv[i], "-o") == 0 &&
            cli_add_fuse_opts(&fo, argv[i + 1], &err) < 0) {
            check_msg(-1, &err);
            cli_fuse_opts_free(&fo);
            return;
        }
    mountpoint(argv[1], fo.nonempty);
    char *uri[] = { argv[0], NULL };
    server(uri, 1);
    cli_fuse_opts_free(&fo);
}

static void vsock(char **argv, int argc)
{
    struct nbdf_err err = { "" };
    char *uri;
    int r = cli_vsock_uri(argc, argv, &uri, &err);

    check_msg(r, &err);
    if (r == 0 && strncmp(uri, "nbd+vsock://", 12) != 0)
        abort();
    free(r == 0 ? uri : NULL);
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

    switch (sel % 6) {
    case 0: sizes(argv, argc); break;
    case 1: server(argv, argc); break;
    case 2: if (argc) mountpoint(argv[0], sel & 0x80); break;
    case 3: fuse_opts(argv, argc); break;
    case 4: fstab(argv, argc); break;
    case 5: vsock(argv, argc); break;
    }
    free(copy);
    return 0;
}
