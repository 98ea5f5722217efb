/* daemon/cliargs.c: command-line value parsers (see daemon/cli.h). */
#include "daemon/cli.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse_opt.h>
#include <getopt.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

int cli_parse_size(const char *opt, const char *s, uint64_t *out,
                   struct nbdf_err *err)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    uint64_t mul = 1;

    if (errno || end == s || !isdigit((unsigned char) s[0]))
        return nbdf_errf(err, -EINVAL, "%s: '%s' is not a size", opt, s);
    switch (toupper((unsigned char) *end)) {
    case 'K': mul = 1ull << 10; end++; break;
    case 'M': mul = 1ull << 20; end++; break;
    case 'G': mul = 1ull << 30; end++; break;
    case 'T': mul = 1ull << 40; end++; break;
    }
    if (*end == 'i' || *end == 'B')
        end += (*end == 'i' && end[1] == 'B') ? 2 : 1;
    if (*end != '\0')
        return nbdf_errf(err, -EINVAL, "%s: '%s' is not a size", opt, s);
    if (v > UINT64_MAX / mul)
        return nbdf_errf(err, -ERANGE, "%s: '%s' is too large", opt, s);
    *out = v * mul;
    return 0;
}

int cli_parse_uint(const char *opt, const char *s, unsigned min,
                   unsigned max, unsigned *out, struct nbdf_err *err)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);

    if (errno || end == s || *end || !isdigit((unsigned char) s[0]))
        return nbdf_errf(err, -EINVAL, "%s: '%s' is not a number", opt, s);
    if (v < min || v > max)
        return nbdf_errf(err, -ERANGE, "%s: %s is out of range (%u to %u)",
                         opt, s, min, max);
    *out = (unsigned) v;
    return 0;
}

int cli_set_mode(struct nbdx_config *nbd, bool *mode_set, enum nbdx_mode m,
                 struct nbdf_err *err)
{
    if (*mode_set && nbd->mode != m)
        return nbdf_errf(err, -EINVAL,
                         "only one of --command, --socket-activation, "
                         "--unix, --tcp and --fd may be given");
    nbd->mode = m;
    *mode_set = true;
    return 0;
}

/* 1 if arg is a mode flag (recorded), 0 if not, -errno on a conflict. */
static int mode_flag(struct nbdx_config *nbd, bool *mode_set, const char *arg,
                     struct nbdf_err *err)
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
            int r = cli_set_mode(nbd, mode_set, flags[i].mode, err);
            return r < 0 ? r : 1;
        }
    return 0;
}

int cli_parse_server(struct nbdx_config *nbd, bool *mode_set, int argc,
                     char **argv, struct nbdf_err *err)
{
    int r;

    if (!*mode_set && argc > 0) {
        r = mode_flag(nbd, mode_set, argv[0], err);
        if (r < 0)
            return r;
        if (r > 0) {
            argc--;
            argv++;
        }
    }
    if (!*mode_set && argc > 0 && strcmp(argv[0], "[") == 0) {
        if (argc < 3 || strcmp(argv[argc - 1], "]") != 0)
            return nbdf_errf(err, -EINVAL, "'[ CMD ARGS ]' needs a command "
                             "and a closing ']'");
        argv[argc - 1] = NULL;
        r = cli_set_mode(nbd, mode_set, NBDX_SOCKET_ACTIVATION, err);
        if (r < 0)
            return r;
        nbd->argv = argv + 1;
        return 0;
    }
    if (!*mode_set) {
        r = cli_set_mode(nbd, mode_set, NBDX_URI, err);
        if (r < 0)
            return r;
    }
    switch (nbd->mode) {
    case NBDX_URI:
        if (argc != 1)
            return nbdf_errf(err, -EINVAL, "%s",
                             argc ? "too many arguments after the URI"
                                  : "missing the server: URI, [ CMD ], "
                                    "--unix, --tcp, --command or --fd");
        nbd->uri = argv[0];
        break;
    case NBDX_SOCKET_ACTIVATION:
    case NBDX_COMMAND:
        if (argc < 1)
            return nbdf_errf(err, -EINVAL, "missing the server command");
        nbd->argv = argv;
        break;
    case NBDX_UNIX:
        if (argc != 1)
            return nbdf_errf(err, -EINVAL, "--unix takes one socket path");
        nbd->path = argv[0];
        break;
    case NBDX_TCP:
        if (argc != 2)
            return nbdf_errf(err, -EINVAL, "--tcp takes a host and a port");
        nbd->host = argv[0];
        nbd->port = argv[1];
        break;
    case NBDX_FD: {
        unsigned fd;
        if (argc != 1)
            return nbdf_errf(err, -EINVAL,
                             "--fd takes one file descriptor number");
        r = cli_parse_uint("--fd", argv[0], 0, INT_MAX, &fd, err);
        if (r < 0)
            return r;
        nbd->fd = (int) fd;
        if (fcntl(nbd->fd, F_GETFD) == -1)
            return nbdf_errf(err, -EBADF,
                             "--fd %d: not an open file descriptor", nbd->fd);
        break;
    }
    }
    return 0;
}

/* ---- -o options ------------------------------------------------------ */

/* Append libfuse's kept options (already escaped) to fo->pass. */
static int pass_on(struct cli_fuse_opts *fo, const char *opts)
{
    size_t have = fo->pass ? strlen(fo->pass) : 0, n = strlen(opts);
    char *s = realloc(fo->pass, have + n + 2);

    if (!s)
        return -ENOMEM;
    if (have)
        s[have++] = ',';
    memcpy(s + have, opts, n + 1);
    fo->pass = s;
    return 0;
}

/* The -o items nbdferry takes; fuse_opt_parse() hands each match to
 * own_opt() with its key, and every other item with FUSE_OPT_KEY_OPT. */
enum {
    KEY_NONEMPTY, KEY_KERNEL_CACHE, KEY_BLOCK_DEVICE, KEY_VHD_FIXED,
    KEY_MULTIWRITER, KEY_RAW_IMAGES, KEY_UID, KEY_GID, KEY_DIGEST, KEY_QCOW2_CLUSTER_SIZE,
};
static const struct fuse_opt own_opts[] = {
    FUSE_OPT_KEY("nonempty", KEY_NONEMPTY),
    FUSE_OPT_KEY("kernel_cache", KEY_KERNEL_CACHE),
    FUSE_OPT_KEY("block_device", KEY_BLOCK_DEVICE),
    FUSE_OPT_KEY("vhd_fixed", KEY_VHD_FIXED),
    FUSE_OPT_KEY("multiwriter", KEY_MULTIWRITER),
    FUSE_OPT_KEY("raw_images", KEY_RAW_IMAGES),
    FUSE_OPT_KEY("uid=", KEY_UID),
    FUSE_OPT_KEY("gid=", KEY_GID),
    FUSE_OPT_KEY("digest=", KEY_DIGEST),
    FUSE_OPT_KEY("qcow2_cluster_size=", KEY_QCOW2_CLUSTER_SIZE),
    FUSE_OPT_END
};

#define OPT_ITEM_MAX 1024         /* longer -o items are refused */

struct own_ctx {
    struct cli_fuse_opts *fo;
    struct nbdf_err *err;
    int code;                     /* set when own_opt() says -1 */
};

static int owner_opt(struct own_ctx *c, const char *item, unsigned *id,
                     bool *set)
{
    int r = cli_parse_uint(item[0] == 'u' ? "-o uid" : "-o gid",
                           strchr(item, '=') + 1, 0, UINT32_MAX - 1, id,
                           c->err);
    if (r < 0) {
        c->code = r;
        return -1;
    }
    *set = true;
    return 0;
}

/* fuse_opt_proc_t: 0 takes the item, 1 keeps it for libfuse, -1 fails. */
static int own_opt(void *data, const char *item, int key,
                   struct fuse_args *outargs)
{
    struct own_ctx *c = data;
    struct cli_fuse_opts *fo = c->fo;

    if (strlen(item) >= OPT_ITEM_MAX) {
        c->code = nbdf_errf(c->err, -EINVAL, "-o: option too long");
        return -1;
    }
    switch (key) {
    case KEY_NONEMPTY: fo->nonempty = true; return 0;
    case KEY_KERNEL_CACHE: fo->kernel_cache = true; return 0;
    case KEY_BLOCK_DEVICE: fo->block_device = true; return 0;
    case KEY_VHD_FIXED: fo->vhd_fixed = true; return 0;
    case KEY_MULTIWRITER: fo->multiwriter = true; return 0;
    case KEY_RAW_IMAGES: fo->raw_images = true; return 0;
    case KEY_UID: return owner_opt(c, item, &fo->uid, &fo->set_uid);
    case KEY_GID: return owner_opt(c, item, &fo->gid, &fo->set_gid);
    case KEY_DIGEST:              /* checked with the other digest options */
        free(fo->digest);
        if (!(fo->digest = strdup(item + strlen("digest=")))) {
            c->code = nbdf_errf(c->err, -ENOMEM, "%s", strerror(ENOMEM));
            return -1;
        }
        return 0;
    case KEY_QCOW2_CLUSTER_SIZE:  /* checked with --qcow2-cluster-size */
        free(fo->qcow2_cluster_size);
        fo->qcow2_cluster_size = strdup(strchr(item, '=') + 1);
        if (!fo->qcow2_cluster_size) {
            c->code = nbdf_errf(c->err, -ENOMEM, "%s", strerror(ENOMEM));
            return -1;
        }
        return 0;
    case FUSE_OPT_KEY_OPT: return item[0] != '\0';   /* ",," is nothing */
    default: return 1;            /* a non-option: cannot come from -o */
    }
}

int cli_add_fuse_opts(struct cli_fuse_opts *fo, const char *arg,
                      struct nbdf_err *err)
{
    char *argv[] = { "nbdferry", "-o", (char *) arg, NULL };
    struct fuse_args args = FUSE_ARGS_INIT(3, argv);
    struct own_ctx c = { .fo = fo, .err = err };
    int r = 0;

    /* Splits at commas (a backslash escapes one), calls own_opt() for each
     * item and leaves the kept ones, escaped again, as "-o" "LIST". */
    if (fuse_opt_parse(&args, &c, own_opts, own_opt) == -1)
        r = c.code ? c.code : nbdf_errf(err, -ENOMEM, "%s", strerror(ENOMEM));
    else if (args.argc == 3 && pass_on(fo, args.argv[2]) < 0)
        r = nbdf_errf(err, -ENOMEM, "%s", strerror(ENOMEM));
    fuse_opt_free_args(&args);
    return r;
}

void cli_fuse_opts_free(struct cli_fuse_opts *fo)
{
    free(fo->pass);
    free(fo->digest);
    free(fo->qcow2_cluster_size);
    fo->pass = fo->digest = fo->qcow2_cluster_size = NULL;
}

/* ---- suggestions ----------------------------------------------------- */

/* Optimal string alignment distance, capped: only small ones matter. */
static unsigned edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    unsigned d[3][65];

    if (la > 64 || lb > 64)
        return UINT_MAX;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = (unsigned) j;
    for (size_t i = 1; i <= la; i++) {
        unsigned *cur = d[i % 3], *prev = d[(i - 1) % 3], *pp = d[(i + 1) % 3];
        cur[0] = (unsigned) i;
        for (size_t j = 1; j <= lb; j++) {
            unsigned cost = a[i - 1] != b[j - 1];
            unsigned v = prev[j] + 1;
            if (cur[j - 1] + 1 < v) v = cur[j - 1] + 1;
            if (prev[j - 1] + cost < v) v = prev[j - 1] + cost;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]
                && pp[j - 2] + 1 < v)
                v = pp[j - 2] + 1;
            cur[j] = v;
        }
    }
    return d[la % 3][lb];
}

const char *cli_suggest_option(const char *arg, const struct option *opts)
{
    const char *best = NULL;
    unsigned best_d = UINT_MAX;
    char word[65];

    if (strncmp(arg, "--", 2) != 0)
        return NULL;
    size_t n = strcspn(arg + 2, "=");
    if (n == 0 || n >= sizeof word)
        return NULL;
    memcpy(word, arg + 2, n);
    word[n] = '\0';
    for (const struct option *o = opts; o->name; o++) {
        unsigned d = edit_distance(word, o->name);
        if (d < best_d) {
            best_d = d;
            best = o->name;
        }
    }
    /* Close enough to be a typo, not a different word. */
    return best && best_d <= (n < 6 ? 1u : 2u) ? best : NULL;
}

int cli_vsock_uri(int argc, char **argv, char **uri, struct nbdf_err *err)
{
    unsigned cid = 0, port = 0;
    int r;

    *uri = NULL;
    if (argc != 3)
        return nbdf_errf(err, -EINVAL, "--vsock takes a CID and a port");
    r = cli_parse_uint("--vsock CID", argv[1], 0, UINT32_MAX, &cid, err);
    if (r == 0)
        r = cli_parse_uint("--vsock PORT", argv[2], 0, UINT32_MAX, &port,
                           err);
    if (r < 0)
        return r;
    if (asprintf(uri, "nbd+vsock://%u:%u/", cid, port) == -1) {
        *uri = NULL;
        return nbdf_errf(err, -ENOMEM, "%s", strerror(ENOMEM));
    }
    return 0;
}
