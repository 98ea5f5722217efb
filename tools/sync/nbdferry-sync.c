/* tools/sync/nbdferry-sync.c: copy the blocks a change list names from a
 * source disk to the raw file of an nbdferry mount (a warm migration's
 * cutover), then report the mount's whole-disk digest.
 *
 * Phases, in this order, so that a mistake touches nothing:
 *   1. the destination's size and the source's (they must be equal);
 *   2. the change list, read and validated whole (list_build);
 *   3. the copy: each run of adjacent listed blocks read from the source
 *      and written with pwrite, in pieces of COPY_PIECE (copy_runs);
 *   4. fsync and close, every error checked: the mount's close returns
 *      only once the server has every write;
 *   5. the digest from the mount's status, and the report.
 * One thread.  Blocks the list does not name are neither read nor
 * written: the mount's manifest stands for them in the digest.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/iszero.h"
#include "common/json.h"
#include "common/optlist.h"
#include "config.h"
#include "tools/sync/sync.h"

#define EXIT_OK       0
#define EXIT_ERROR    1
#define EXIT_NO_PROOF 2

#define COPY_PIECE    ((size_t) 4 << 20)   /* bytes read, then written */
#define LIST_MAX      ((size_t) 1 << 30)   /* a change list file, at most */
#define DIGEST_WAIT_S 60
#define REQUEST_TIMEOUT_S 60

struct options {
    const char *changed;                /* --changed's value, or NULL */
    enum sync_list_kind kind;
    const char *what;                   /* the list's file or bitmap */
    bool proof;
    bool json;
    unsigned digest_wait_s;
    unsigned request_timeout_s;
    const char *source;
    const char *dest;
};

struct stats {
    uint64_t listed_blocks;
    uint64_t listed_bytes;              /* clipped to the disk's end */
    uint64_t runs;                      /* maximal runs of listed blocks */
    uint64_t written;
    uint64_t zero;                      /* of written: all-zero blocks */
};

static const char usage_text[] =
"Usage: nbdferry-sync [OPTIONS] SOURCE MNT/FILE\n"
"\n"
"Copy SOURCE to the raw file of an nbdferry mount, reading and writing only\n"
"the 64 KiB blocks a change list names (a warm migration's cutover), then\n"
"report the mount's whole-disk digest: the blocks not listed are taken\n"
"from the mount's manifest of what the destination holds.  Without\n"
"--changed every block is read and written (as cp does; the mount still\n"
"sends only what differs from its manifest).\n"
"\n"
"SOURCE containing \"://\" is an NBD URI (nbd://HOST[:PORT][/EXPORT],\n"
"nbd+unix:///[EXPORT]?socket=PATH, nbds://...); anything else is a raw\n"
"file or a block device.  SOURCE and MNT/FILE must have the same size.\n"
"\n"
"A change list is a hint from the platform: a block it does not name is\n"
"not read and stays as it was on the destination.  It is read and checked\n"
"whole before anything is written: a malformed list, one shorter than the\n"
"disk or one naming blocks past its end is refused and nothing is written.\n"
"Listed blocks that read as zero are written as zeroes (the mount sends\n"
"them as NBD write-zeroes); nothing is ever trimmed.\n"
"\n"
"Options:\n"
"  -c, --changed=LIST      copy only the blocks LIST names:\n"
"                            xapi:FILE  base64 bitmap of VDI.list_changed_\n"
"                                       blocks (one bit a 64 KiB block)\n"
"                            extents:FILE  lines OFFSET LENGTH (bytes,\n"
"                                       decimal or 0x; widened to 64 KiB)\n"
"                            dirty-bitmap:NAME  the NBD SOURCE's\n"
"                                       qemu:dirty-bitmap:NAME, read to the\n"
"                                       disk's end\n"
"                            FILE       xapi or extents, told from the text\n"
"                          FILE \"-\" is standard input\n"
"      --proof             exit 2 unless the mount shows the whole disk's\n"
"                          digest (state complete)\n"
"  -j, --json              print the report as JSON\n"
"      --digest-wait=S     wait up to S seconds without progress for the\n"
"                          mount's digest to settle (default 60; 0: do not\n"
"                          wait)\n"
"      --request-timeout=S fail when an NBD SOURCE answers nothing for S\n"
"                          seconds (default 60, 0: wait forever)\n"
"  -h, --help              print this help\n"
"  -V, --version           print the version\n"
"\n"
"Exit status: 0 copied (and with --proof, the digest complete), 1 error\n"
"(a refused list wrote nothing), 2 copied but --proof not met.\n";

enum { OPT_PROOF = 256, OPT_DIGEST_WAIT, OPT_REQUEST_TIMEOUT,
       OPT_LONG_OPTIONS, OPT_SHORT_OPTIONS };

#define SHORT_OPTIONS ":c:jhV"

static const struct option long_options[] = {
    { "changed",       required_argument, NULL, 'c' },
    { "proof",         no_argument,       NULL, OPT_PROOF },
    { "json",          no_argument,       NULL, 'j' },
    { "digest-wait",   required_argument, NULL, OPT_DIGEST_WAIT },
    { "request-timeout", required_argument, NULL, OPT_REQUEST_TIMEOUT },
    { "help",          no_argument,       NULL, 'h' },
    { "version",       no_argument,       NULL, 'V' },
    { "long-options",  no_argument,       NULL, OPT_LONG_OPTIONS },
    { "short-options", no_argument,       NULL, OPT_SHORT_OPTIONS },
    { NULL, 0, NULL, 0 },
};


/* ---- options ---- */

#define PARSE_DONE 1

static int usage_err(const char *what, const char *arg)
{
    sync_err("%s%s (see --help)", what, arg ? arg : "");
    return -EINVAL;
}

/* Seconds, 0 to 86400. */
static int seconds_arg(const char *opt, unsigned *out)
{
    char *end;

    errno = 0;
    unsigned long v = strtoul(optarg, &end, 10);
    if (errno || *end || optarg[0] < '0' || optarg[0] > '9' || v > 86400) {
        sync_err("%s takes seconds (0 to 86400): %s (see --help)", opt,
                 optarg);
        return -EINVAL;
    }
    *out = (unsigned) v;
    return 0;
}

static int parse_one(struct options *o, int c, char **argv)
{
    switch (c) {
    case 'c':
        o->changed = optarg;
        o->kind = sync_list_kind_of(optarg, &o->what);
        if (!*o->what)
            return usage_err("--changed needs a file or a bitmap name: ",
                             optarg);
        return 0;
    case OPT_PROOF: o->proof = true; return 0;
    case 'j': o->json = true; return 0;
    case OPT_DIGEST_WAIT:
        return seconds_arg("--digest-wait", &o->digest_wait_s);
    case OPT_REQUEST_TIMEOUT:
        return seconds_arg("--request-timeout", &o->request_timeout_s);
    case 'h': fputs(usage_text, stdout); return PARSE_DONE;
    case 'V': printf("nbdferry-sync %s\n", PACKAGE_VERSION); return PARSE_DONE;
    case OPT_LONG_OPTIONS: optlist_long(long_options); return PARSE_DONE;
    case OPT_SHORT_OPTIONS: optlist_short(SHORT_OPTIONS); return PARSE_DONE;
    case ':': return usage_err("an option needs a value: ", argv[optind - 1]);
    default: return usage_err("bad option: ", argv[optind - 1]);
    }
}

/* 1: go on; 0: --help or --version was printed; -EINVAL (logged). */
static int parse_options(struct options *o, int argc, char **argv)
{
    int c, r;

    *o = (struct options) { .digest_wait_s = DIGEST_WAIT_S,
                            .request_timeout_s = REQUEST_TIMEOUT_S };
    opterr = 0;
    while ((c = getopt_long(argc, argv, SHORT_OPTIONS, long_options,
                            NULL)) != -1)
        if ((r = parse_one(o, c, argv)) != 0)
            return r == PARSE_DONE ? 0 : r;
    if (argc - optind != 2)
        return usage_err("needs SOURCE and MNT/FILE", NULL);
    o->source = argv[optind];
    o->dest = argv[optind + 1];
    return 1;
}

/* ---- phase 2: the list ---- */

/* The whole of path ("-": standard input), at most LIST_MAX bytes. */
static int read_list_file(const char *path, char **text, size_t *len)
{
    int fd = strcmp(path, "-") == 0 ? 0 : open(path, O_RDONLY | O_CLOEXEC);
    size_t cap = 1 << 16, n = 0;
    char *buf = NULL;
    int r = 0;

    if (fd < 0)
        r = -errno;
    while (r == 0) {
        if (n == cap && (cap *= 2) > LIST_MAX) {
            r = -EFBIG;
            break;
        }
        char *nb = realloc(buf, cap);
        if (!nb) {
            r = -ENOMEM;
            break;
        }
        buf = nb;
        ssize_t got = read(fd, buf + n, cap - n);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            r = -errno;
        else if (got == 0)
            break;
        else
            n += (size_t) got;
    }
    if (fd > 0)
        close(fd);
    if (r < 0) {
        sync_err("%s: %s", path, strerror(-r));
        free(buf);
        return r;
    }
    *text = buf;
    *len = n;
    return 0;
}

static int list_build(const struct options *o, struct sync_source *s,
                      struct sync_list *l, enum sync_list_kind *kind)
{
    struct nbdf_err err = { "" };
    char *text;
    size_t len;
    int r;

    *kind = o->kind;
    if (!o->changed) {
        sync_list_all(l);
        return 0;
    }
    if (o->kind == SYNC_LIST_DIRTY_BITMAP)
        return sync_source_dirty(s, l);
    if ((r = read_list_file(o->what, &text, &len)) < 0)
        return r;
    r = sync_list_parse(o->kind, text, len, l, kind, &err);
    free(text);
    if (r < 0)
        sync_err("%s: %s list refused, nothing written: %s", o->what,
                 sync_list_kind_name(*kind), err.msg);
    return r;
}

/* ---- phase 3: the copy ---- */

static int write_all(int fd, const char *dest, const void *buf, size_t len,
                     uint64_t off)
{
    for (size_t done = 0; done < len;) {
        ssize_t n = pwrite(fd, (const char *) buf + done, len - done,
                           (off_t) (off + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int e = n < 0 ? errno : EIO;
            sync_err("%s: write %zu@%" PRIu64 ": %s", dest, len - done,
                     off + done, strerror(e));
            return -e;
        }
        done += (size_t) n;
    }
    return 0;
}

/* [off, off + len): read, count its zero blocks, write. */
static int copy_piece(struct sync_source *s, int fd, const char *dest,
                      char *buf, uint64_t off, size_t len, struct stats *st)
{
    int r = sync_source_read(s, buf, len, off);

    if (r < 0)
        return r;
    for (size_t i = 0; i < len; i += SYNC_BLOCK) {
        size_t n = len - i < SYNC_BLOCK ? len - i : SYNC_BLOCK;
        if (is_zero(buf + i, n))
            st->zero += n;
    }
    if ((r = write_all(fd, dest, buf, len, off)) < 0)
        return r;
    st->written += len;
    return 0;
}

static int copy_runs(struct sync_source *s, const struct sync_list *l,
                     int fd, const char *dest, struct stats *st)
{
    char *buf = malloc(COPY_PIECE);
    int r = 0;

    if (!buf)
        return -ENOMEM;
    for (uint64_t b = 0; b < l->nblocks && r == 0;) {
        if (!sync_list_has(l, b)) {
            b++;
            continue;
        }
        uint64_t e = b;
        while (e < l->nblocks && sync_list_has(l, e))
            e++;
        st->runs++;
        uint64_t end = e * SYNC_BLOCK < l->size ? e * SYNC_BLOCK : l->size;
        for (uint64_t off = b * SYNC_BLOCK; off < end && r == 0;) {
            size_t n = end - off < COPY_PIECE ? (size_t) (end - off)
                                              : COPY_PIECE;
            r = copy_piece(s, fd, dest, buf, off, n, st);
            off += n;
        }
        b = e;
    }
    free(buf);
    return r;
}

/* Phases 3 and 4; on error the destination may hold part of the copy. */
static int copy_to(const struct options *o, struct sync_source *s,
                   const struct sync_list *l, struct stats *st)
{
    int fd = open(o->dest, O_WRONLY | O_CLOEXEC);   /* never O_TRUNC */
    int r;

    if (fd < 0) {
        r = -errno;
        sync_err("%s: %s", o->dest, strerror(-r));
        return r;
    }
    r = copy_runs(s, l, fd, o->dest, st);
    if (r == 0 && fsync(fd) < 0) {
        r = -errno;
        sync_err("%s: fsync: %s", o->dest, strerror(-r));
    }
    if (close(fd) < 0 && r == 0) {
        r = -errno;
        sync_err("%s: close: %s", o->dest, strerror(-r));
    }
    return r;
}

/* ---- phase 5: the report ---- */

static const char *plural(uint64_t n)
{
    return n == 1 ? "" : "s";
}

static double percent(uint64_t part, uint64_t whole)
{
    return whole ? 100.0 * (double) part / (double) whole : 0.0;
}

static void report_text(const struct options *o, const struct sync_source *s,
                        enum sync_list_kind kind, const struct stats *st,
                        const struct sync_digest *d)
{
    printf("nbdferry-sync: %s -> %s, %" PRIu64 " bytes\n", o->source,
           o->dest, s->size);
    if (o->changed)
        printf("  changed     %s %s: %" PRIu64 " block%s of 64 KiB listed "
               "(%.2f%% of the disk)\n", sync_list_kind_name(kind), o->what,
               st->listed_blocks, plural(st->listed_blocks),
               percent(st->listed_bytes, s->size));
    else
        printf("  changed     no list: every block\n");
    printf("  read        %" PRIu64 " bytes (%.2f%% of the source)\n",
           s->bytes_read, percent(s->bytes_read, s->size));
    printf("  written     %" PRIu64 " bytes in %" PRIu64 " run%s, %" PRIu64
           " of them zero\n", st->written, st->runs, plural(st->runs),
           st->zero);
    printf("  not copied  %" PRIu64 " bytes (not listed)\n",
           s->size - st->listed_bytes);
    if (d->have_skipped)
        printf("  mount       %" PRIu64 " bytes not sent (the server "
               "already held them)\n", d->skipped);
    if (!d->found)
        printf("  digest      unknown: %s\n", d->why);
    else if (d->value[0])
        printf("  digest      %s %s: %s\n", d->algorithm, d->state,
               d->value);
    else
        printf("  digest      %s %s%s%s%s\n", d->algorithm, d->state,
               d->reason[0] ? " (" : "", d->reason,
               d->reason[0] ? ")" : "");
}

static void json_field(const char *key, const char *value, bool last)
{
    printf("  \"%s\": ", key);
    if (value)
        json_put_string(stdout, value);
    else
        fputs("null", stdout);
    fputs(last ? "\n" : ",\n", stdout);
}

static void report_json(const struct options *o, const struct sync_source *s,
                        enum sync_list_kind kind, const struct stats *st,
                        const struct sync_digest *d)
{
    printf("{\n");
    json_field("source", o->source, false);
    json_field("destination", o->dest, false);
    printf("  \"size\": %" PRIu64 ",\n", s->size);
    printf("  \"block_size\": %" PRIu64 ",\n", SYNC_BLOCK);
    json_field("list", o->changed ? sync_list_kind_name(kind) : NULL, false);
    json_field("list_from", o->changed ? o->what : NULL, false);
    printf("  \"listed_blocks\": %" PRIu64 ",\n", st->listed_blocks);
    printf("  \"listed_bytes\": %" PRIu64 ",\n", st->listed_bytes);
    printf("  \"read_bytes\": %" PRIu64 ",\n", s->bytes_read);
    printf("  \"written_bytes\": %" PRIu64 ",\n", st->written);
    printf("  \"zero_bytes\": %" PRIu64 ",\n", st->zero);
    printf("  \"runs\": %" PRIu64 ",\n", st->runs);
    printf("  \"not_copied_bytes\": %" PRIu64 ",\n",
           s->size - st->listed_bytes);
    if (d->have_skipped)
        printf("  \"mount_skipped_bytes\": %" PRIu64 ",\n", d->skipped);
    printf("  \"digest\": {");
    if (d->found) {
        printf("\"algorithm\": ");
        json_put_string(stdout, d->algorithm);
        printf(", \"state\": ");
        json_put_string(stdout, d->state);
        if (d->value[0]) {
            printf(", \"value\": ");
            json_put_string(stdout, d->value);
        }
        if (d->reason[0]) {
            printf(", \"reason\": ");
            json_put_string(stdout, d->reason);
        }
    } else {
        printf("\"state\": \"unknown\", \"reason\": ");
        json_put_string(stdout, d->why);
    }
    printf("},\n");
    printf("  \"proof\": %s\n", o->proof ? "true" : "false");
    printf("}\n");
}

/* ---- main ---- */

/* Phase 1: the sizes agree. */
static int check_sizes(const struct options *o, const struct sync_source *s)
{
    struct stat st;

    if (stat(o->dest, &st) < 0) {
        int e = errno;
        sync_err("%s: %s", o->dest, strerror(e));
        return -e;
    }
    if (!S_ISREG(st.st_mode)) {
        sync_err("%s: not a regular file (the raw file of an nbdferry "
                 "mount: MNT/nbd)", o->dest);
        return -EINVAL;
    }
    if ((uint64_t) st.st_size != s->size) {
        sync_err("%s is %jd bytes, %s is %" PRIu64 ": the sizes must be "
                 "equal, nothing written", o->dest, (intmax_t) st.st_size,
                 o->source, s->size);
        return -EINVAL;
    }
    return 0;
}

static int run(const struct options *o)
{
    struct sync_source s;
    struct sync_list l = { 0 };
    struct stats st = { 0 };
    struct sync_digest d;
    enum sync_list_kind kind = o->kind;
    const char *bitmap = o->changed && o->kind == SYNC_LIST_DIRTY_BITMAP
                             ? o->what : NULL;
    int r = sync_source_open(o->source, bitmap, o->request_timeout_s, &s);

    if (r == 0)
        r = check_sizes(o, &s);
    if (r == 0 && (r = sync_list_init(&l, s.size)) < 0)
        sync_err("out of memory for a list of %" PRIu64 " blocks",
                 s.size / SYNC_BLOCK);
    if (r == 0)
        r = list_build(o, &s, &l, &kind);
    if (r == 0) {
        st.listed_blocks = sync_list_count(&l);
        st.listed_bytes = st.listed_blocks * SYNC_BLOCK;
        if (l.nblocks && sync_list_has(&l, l.nblocks - 1))
            st.listed_bytes -= l.nblocks * SYNC_BLOCK - s.size;
        if ((r = copy_to(o, &s, &l, &st)) < 0)
            sync_err("the copy failed: %s may hold part of it (run the "
                     "same command again)", o->dest);
    }
    if (r == 0) {
        if (o->digest_wait_s || o->proof)
            sync_digest_read(o->dest, o->digest_wait_s, &d);
        else
            d = (struct sync_digest) { .why = "not read (--digest-wait=0)" };
        if (o->json)
            report_json(o, &s, kind, &st, &d);
        else
            report_text(o, &s, kind, &st, &d);
        if (o->proof && (!d.found || strcmp(d.state, "complete") != 0 ||
                         !d.value[0])) {
            sync_err("--proof: the mount shows no whole-disk digest (%s)",
                     d.found ? d.state : d.why);
            r = 1;
        }
    }
    sync_list_free(&l);
    sync_source_close(&s);
    return r < 0 ? EXIT_ERROR : r == 1 ? EXIT_NO_PROOF : EXIT_OK;
}

int main(int argc, char **argv)
{
    struct options o;
    int r = parse_options(&o, argc, argv);

    if (r <= 0)
        return r < 0 ? EXIT_ERROR : EXIT_OK;
    return run(&o);
}
