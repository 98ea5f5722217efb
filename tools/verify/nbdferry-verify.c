/* tools/verify/nbdferry-verify.c: compare the digest of a source disk with the
 * digest of its copy on an NBD export (or a file), locate differences.
 *
 * THREAD MODEL
 * Two threads, one per side: the main thread hashes SOURCE, one worker
 * thread hashes DESTINATION.  Each owns its verify_source (and so its NBD
 * handles) and its sink; they share only 'abort' (atomic: the first side to
 * fail sets it and the other gives up with -ECANCELED, without logging) and
 * read-only tables.  The report is built after pthread_join(), so it reads
 * both sinks without locks.  With one operand there is only the main thread.
 * With --blkhash each side's sink also runs its own hasher threads
 * (digest/verify-hasher.c) and joins them before sink_finish() returns.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/monotime.h"
#include "common/optlist.h"
#include "config.h"
#include "imagefile/imagefile.h"
#include "tools/verify/verify.h"

struct options {
    const char *algorithm;
    const EVP_MD *md;
    bool have_digest;                   /* --digest named a plain digest */
    bool blkhash;                       /* blkhash (the default), not a
                                         * plain digest */
    bool have_blkhash;                  /* --blkhash or --digest=blkhash */
    char bh_digest[BLKHASH_NAME_MAX];
    uint64_t bh_block;
    char bh_algorithm[BLKHASH_NAME_MAX + 48];   /* "blkhash-sha256/64K" */
    unsigned threads;                   /* blkhash hashers per side */
    uint64_t size;                      /* --size, if have_size */
    bool have_size;
    bool zero_tail;
    bool json;
    bool quiet;
    uint64_t block_size;
    size_t max_ranges;
    const char *parents[IMAGEFILE_CHAIN_MAX];  /* --parent, borrowed from argv */
    struct source_options src;
    struct source_options dst;          /* src without the --parent list */
};

struct side {
    struct verify_source *s;            /* owned */
    struct sink k;                      /* owned */
    int r;                              /* source_run + sink_finish */
};

static atomic_bool abort_flag;

static const char usage_text[] =
"Usage: nbdferry-verify [OPTIONS] SOURCE DESTINATION\n"
"       nbdferry-verify [OPTIONS] OPERAND\n"
"\n"
"Compare the digest of SOURCE with the digest of DESTINATION and, when they\n"
"differ, name the byte ranges that differ.  With one operand, print its\n"
"digest like sha256sum and blksum do.  An operand containing \"://\" is an NBD URI\n"
"(nbd://HOST[:PORT][/EXPORT], nbd+unix:///[EXPORT]?socket=PATH, nbds://...);\n"
"anything else is a file or a block device.  Holes (SEEK_HOLE, NBD block\n"
"status) are hashed as zeros without being read.  The operand \"-\" is\n"
"standard input: a file or block device there is read like any other, a\n"
"pipe is read once to its end (one operand only).\n"
"\n"
"A file that is a disk image, SOURCE or DESTINATION, is decoded to its\n"
"virtual disk: VHD (fixed, dynamic and differencing: the footer's current\n"
"size), VMDK (streamOptimized, as in an OVA, and monolithicSparse: the\n"
"header's capacity), VHDX (fixed and dynamic: the metadata's virtual\n"
"disk size; a log left by a writer that did not close it is replayed) and\n"
"qcow2 (versions 2 and 3: compressed clusters, extended L2 entries, and a\n"
"backing chain of qcow2 or raw files, found as qemu finds them), with\n"
"unallocated blocks as zeros without reading.  A differencing VHD's\n"
"parents are found through its locators, inside its own directory, or\n"
"given with --parent.  A malformed image is an error naming\n"
"the broken rule.  An image or archive it recognises but does not decode\n"
"(a differencing VHDX, a VMDK descriptor, tar/OVA) is refused with the\n"
"reason, never hashed as raw bytes unless --format=raw says so.  NBD\n"
"exports are always the disk itself.\n"
"\n"
"Without --size or --zero-tail the sizes must be equal: if they differ the\n"
"result is a mismatch and no data is read.\n"
"\n"
"Options:\n"
"  -d, --digest=ALG        blkhash[/DIGEST[/SIZE]] (the default: the value\n"
"                          an nbdferry mount shows by default), or the plain\n"
"                          md5, sha1, sha256 (as sha256sum) or sha512.\n"
"                          blkhash is computed as blksum and nbdcopy\n"
"                          --blkhash compute it: DIGEST (any OpenSSL digest,\n"
"                          default sha256) of each SIZE-byte block (default\n"
"                          64K, suffix k, M or G), then DIGEST of the block\n"
"                          digests and the length; holes and zero blocks are\n"
"                          not hashed, data blocks are hashed on all cores\n"
"      --blkhash[=DIGEST[/SIZE]]  the same as --digest=blkhash[/...]\n"
"  -t, --threads=N         blkhash hashing threads per side (default: the\n"
"                          number of online CPUs)\n"
"  -s, --size=N            compare only the first N bytes of each side\n"
"  -z, --zero-tail         accept a DESTINATION larger than SOURCE if every\n"
"                          byte past SOURCE's size reads as zero\n"
"  -b, --block-size=N      granularity of mismatch ranges (default 1M)\n"
"  -m, --max-ranges=N      list at most N mismatch ranges (default 10, 0: all)\n"
"  -j, --json              print a JSON report instead of text\n"
"  -q, --quiet             print nothing; only the exit status\n"
"  -f, --format=FMT        read file operands as FMT: auto (default: decode\n"
"                          VHD, VMDK, VHDX and qcow2, refuse other images),\n"
"                          raw (the file's bytes as they are), vhd, vmdk,\n"
"                          vhdx or qcow2\n"
"      --raw               the same as --format=raw\n"
"      --parent=FILE       parent of a differencing VHD SOURCE; repeat for\n"
"                          the parent's parent and so on (levels not given\n"
"                          are found through the locators)\n"
"      --no-extents        read holes too (no SEEK_HOLE, no block status)\n"
"  -r, --requests=N        NBD reads in flight per side (default 32)\n"
"  -R, --request-size=N    bytes per read request (default 2M)\n"
"  -C, --connections=N     NBD connections per export when the server\n"
"                          allows multi-conn (default 1)\n"
"      --request-timeout=S fail when an NBD server with requests outstanding\n"
"                          (or a handshake) moves no byte for S seconds\n"
"                          (default 60, 0: wait forever)\n"
"  -h, --help              print this help\n"
"  -V, --version           print the version\n"
"\n"
"Sizes take a K, M, G or T suffix (powers of 1024).\n"
"Exit status: 0 match, 1 mismatch, 2 error.\n";

enum { OPT_RAW = 256, OPT_NO_EXTENTS, OPT_PARENT, OPT_LONG_OPTIONS,
       OPT_SHORT_OPTIONS, OPT_BLKHASH, OPT_REQUEST_TIMEOUT };

#define SHORT_OPTIONS ":d:f:s:zb:m:jqr:R:C:t:hV"

static const struct option long_options[] = {
    { "digest",       required_argument, NULL, 'd' },
    { "blkhash",      optional_argument, NULL, OPT_BLKHASH },
    { "threads",      required_argument, NULL, 't' },
    { "size",         required_argument, NULL, 's' },
    { "zero-tail",    no_argument,       NULL, 'z' },
    { "block-size",   required_argument, NULL, 'b' },
    { "max-ranges",   required_argument, NULL, 'm' },
    { "json",         no_argument,       NULL, 'j' },
    { "quiet",        no_argument,       NULL, 'q' },
    { "format",       required_argument, NULL, 'f' },
    { "raw",          no_argument,       NULL, OPT_RAW },
    { "parent",       required_argument, NULL, OPT_PARENT },
    { "no-extents",   no_argument,       NULL, OPT_NO_EXTENTS },
    { "requests",     required_argument, NULL, 'r' },
    { "request-size", required_argument, NULL, 'R' },
    { "connections",  required_argument, NULL, 'C' },
    { "request-timeout", required_argument, NULL, OPT_REQUEST_TIMEOUT },
    { "help",         no_argument,       NULL, 'h' },
    { "version",      no_argument,       NULL, 'V' },
    { "long-options", no_argument,       NULL, OPT_LONG_OPTIONS },
    { "short-options", no_argument,      NULL, OPT_SHORT_OPTIONS },
    { NULL, 0, NULL, 0 },
};

/* ---- option parsing: every failure is one line, then exit 2 ---- */

static int usage_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Logs "MESSAGE (see --help)"; returns -EINVAL for the caller to pass up. */
static int usage_err(const char *fmt, ...)
{
    char msg[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    verify_err("%s (see --help)", msg);
    return -EINVAL;
}

/* "123", "4K", "2M", "1G", "1T" (also "KiB" etc.): powers of 1024. */
static int parse_size(const char *s, uint64_t *out)
{
    char *end;
    unsigned shift = 0;

    if (*s < '0' || *s > '9')
        return -EINVAL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno)
        return -EINVAL;
    switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    case 't': case 'T': shift = 40; end++; break;
    }
    if (shift && strcmp(end, "iB") == 0)
        end += 2;
    if (*end || (shift && v > (UINT64_MAX >> shift)))
        return -EINVAL;
    *out = (uint64_t) v << shift;
    return 0;
}

static int size_arg(const char *opt, uint64_t min, uint64_t max, uint64_t *out)
{
    if (parse_size(optarg, out) < 0 || *out < min || *out > max)
        return usage_err("%s: bad value '%s' (%" PRIu64 "..%" PRIu64 ")", opt,
                         optarg, min, max);
    return 0;
}

/* Same, for the narrower fields. */
#define SIZE_ARG(opt, min, max, field) ({                    \
        uint64_t v_;                                         \
        int r_ = size_arg(opt, min, max, &v_);               \
        if (r_ == 0)                                         \
            (field) = v_;                                    \
        r_; })

static int blkhash_opt(struct options *o, const char *spec);

/* Whole seconds, no suffix: a size suffix would be a surprise here. */
static int timeout_arg(struct options *o)
{
    char *end;

    errno = 0;
    unsigned long v = strtoul(optarg, &end, 10);
    if (*optarg < '0' || *optarg > '9' || *end || errno || v > 86400)
        return usage_err("--request-timeout: bad value '%s' (0..86400 "
                         "seconds)", optarg);
    o->src.request_timeout_s = (unsigned) v;
    return 0;
}

static int digest_arg(struct options *o)
{
    static const char *const names[] = { "md5", "sha1", "sha256", "sha512" };

    if (strcmp(optarg, "blkhash") == 0 || strncmp(optarg, "blkhash/", 8) == 0)
        return blkhash_opt(o, optarg[7] ? optarg + 8 : "");
    o->have_digest = true;
    o->blkhash = false;

    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(optarg, names[i]) == 0) {
            o->algorithm = names[i];
            o->md = EVP_get_digestbyname(names[i]);
            if (!o->md)
                return usage_err("--digest: '%s' is not available in this "
                                 "OpenSSL", optarg);
            return 0;
        }
    return usage_err("--digest: unknown algorithm '%s' (blkhash[/DIGEST"
                     "[/SIZE]], md5, sha1, sha256, sha512)", optarg);
}

/* "1048576" -> "1M", "65536" -> "64K", "1000" -> "1000". */
static void format_block(uint64_t v, char *buf, size_t n)
{
    if (v % (1u << 20) == 0)
        snprintf(buf, n, "%" PRIu64 "M", v >> 20);
    else if (v % 1024 == 0)
        snprintf(buf, n, "%" PRIu64 "K", v >> 10);
    else
        snprintf(buf, n, "%" PRIu64, v);
}

/* blkhash[/DIGEST[/SIZE]]: the digest must exist and not be an XOF. */
static int blkhash_arg(struct options *o, const char *spec)
{
    char size[32];
    struct nbdf_err why;
    struct blkhash *h;

    if (blkhash_parse_spec(spec, o->bh_digest, &o->bh_block, &why) < 0)
        return usage_err("--blkhash: '%s': %s", spec, why.msg);
    int r = blkhash_create(o->bh_digest, o->bh_block, &h);
    blkhash_free(h);
    if (r == -EINVAL)
        return usage_err("--blkhash: '%s' is not a fixed-size digest this "
                         "OpenSSL knows", o->bh_digest);
    if (r < 0)
        return usage_err("--blkhash: %s", strerror(-r));
    format_block(o->bh_block, size, sizeof size);
    snprintf(o->bh_algorithm, sizeof o->bh_algorithm, "blkhash-%s/%s",
             o->bh_digest, size);
    o->blkhash = true;
    return 0;
}

/* --blkhash[=DIGEST[/SIZE]], or --digest=blkhash[/...]. */
static int blkhash_opt(struct options *o, const char *spec)
{
    o->have_blkhash = true;
    return blkhash_arg(o, spec);
}

static int block_size_arg(struct options *o)
{
    int r = SIZE_ARG("--block-size", 4096, 1ull << 30, o->block_size);

    if (r == 0 && o->block_size % 4096)
        r = usage_err("--block-size: '%s' is not a multiple of 4096", optarg);
    return r;
}

static int format_arg(struct options *o)
{
    static const char *const names[] = {
        [SOURCE_FORMAT_AUTO] = "auto", [SOURCE_FORMAT_RAW] = "raw",
        [SOURCE_FORMAT_VHD] = "vhd", [SOURCE_FORMAT_VMDK] = "vmdk",
        [SOURCE_FORMAT_VHDX] = "vhdx", [SOURCE_FORMAT_QCOW2] = "qcow2",
    };

    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(optarg, names[i]) == 0) {
            o->src.format = (enum source_format) i;
            return 0;
        }
    return usage_err("--format: unknown format '%s' (auto, raw, vhd, vmdk, "
                     "vhdx, qcow2)", optarg);
}

static int parent_arg(struct options *o)
{
    size_t n = o->src.vhd_nparents;

    if (n == IMAGEFILE_CHAIN_MAX)
        return usage_err("--parent: more than %d levels", IMAGEFILE_CHAIN_MAX);
    o->parents[n] = optarg;
    o->src.vhd_nparents = n + 1;
    return 0;
}

static int bad_option(int c, char **argv)
{
    if (c == ':')
        return usage_err("option '%s' needs a value", argv[optind - 1]);
    if (optopt)
        return usage_err("bad option '-%c'", optopt);
    return usage_err("bad option '%s'", argv[optind - 1]);
}

/* 0, -EINVAL (logged), or PARSE_DONE: --help or --version was printed. */
#define PARSE_DONE 1

static int parse_one(struct options *o, int c, char **argv)
{
    switch (c) {
    case 'd': return digest_arg(o);
    case OPT_BLKHASH: return blkhash_opt(o, optarg ? optarg : "");
    case 't': return SIZE_ARG("--threads", 1, 64, o->threads);
    case 's': o->have_size = true;
              return SIZE_ARG("--size", 0, INT64_MAX, o->size);
    case 'z': o->zero_tail = true; return 0;
    case 'b': return block_size_arg(o);
    case 'm': return SIZE_ARG("--max-ranges", 0, 1u << 30, o->max_ranges);
    case 'j': o->json = true; return 0;
    case 'q': o->quiet = true; return 0;
    case 'f': return format_arg(o);
    case OPT_RAW: o->src.format = SOURCE_FORMAT_RAW; return 0;
    case OPT_PARENT: return parent_arg(o);
    case OPT_NO_EXTENTS: o->src.use_extents = false; return 0;
    case 'r': return SIZE_ARG("--requests", 1, 1024, o->src.requests);
    case 'R': return SIZE_ARG("--request-size", 4096, 32u << 20,
                              o->src.request_size);
    case 'C': return SIZE_ARG("--connections", 1, 16, o->src.connections);
    case OPT_REQUEST_TIMEOUT: return timeout_arg(o);
    case 'h': fputs(usage_text, stdout); return PARSE_DONE;
    case 'V': printf("nbdferry-verify %s\n", PACKAGE_VERSION); return PARSE_DONE;
    case OPT_LONG_OPTIONS: optlist_long(long_options); return PARSE_DONE;
    case OPT_SHORT_OPTIONS: optlist_short(SHORT_OPTIONS); return PARSE_DONE;
    default: return bad_option(c, argv);
    }
}

static unsigned default_threads(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);

    return n < 1 ? 1 : n > 16 ? 16 : (unsigned) n;
}

/* Returns the number of operands (1 or 2), 0 after --help or --version,
 * or -EINVAL (logged). */
static int parse_options(struct options *o, int argc, char **argv)
{
    int c, r;

    *o = (struct options) {
        .algorithm = "sha256", .md = EVP_sha256(), .block_size = 1u << 20,
        .max_ranges = 10, .threads = default_threads(),
        .src = { .request_size = 2u << 20, .requests = 32, .connections = 1,
                 .use_extents = true,
                 .request_timeout_s = VERIFY_REQUEST_TIMEOUT_S },
    };
    opterr = 0;                         /* our own one-line messages */
    while ((c = getopt_long(argc, argv, SHORT_OPTIONS, long_options,
                            NULL)) != -1)
        if ((r = parse_one(o, c, argv)) != 0)
            return r == PARSE_DONE ? 0 : r;
    if (o->have_size && o->zero_tail)
        return usage_err("--size and --zero-tail cannot be combined");
    if (o->src.vhd_nparents && o->src.format != SOURCE_FORMAT_AUTO &&
        o->src.format != SOURCE_FORMAT_VHD)
        return usage_err("--parent needs a VHD SOURCE; --format=%s says it "
                         "is not one", o->src.format == SOURCE_FORMAT_RAW
                         ? "raw" : "vmdk");
    if (o->have_blkhash && o->have_digest)
        return usage_err("--digest and --blkhash cannot be combined "
                         "(--blkhash=DIGEST picks the digest)");
    if (!o->have_digest && !o->blkhash && (r = blkhash_arg(o, "")) < 0)
        return r;                       /* the default: blkhash-sha256/64K */
    if (o->blkhash)
        o->algorithm = o->bh_algorithm;
    o->src.vhd_parents = o->parents;
    o->dst = o->src;
    o->dst.vhd_nparents = 0;
    if (argc - optind < 1)
        return usage_err("missing operand");
    if (argc - optind > 2)
        return usage_err("too many operands");
    return argc - optind;
}

/* ---- hashing ---- */

static void *side_main(void *arg)
{
    struct side *sd = arg;

    sd->r = source_run(sd->s, &sd->k);
    if (sd->r == 0)
        sd->r = sink_finish(&sd->k);
    if (sd->r < 0)
        atomic_store(&abort_flag, true);
    return NULL;
}

/* Hash both sides at once: DESTINATION on a new thread, SOURCE here. */
static int run_sides(struct side sd[2])
{
    pthread_t t;
    int err = pthread_create(&t, NULL, side_main, &sd[1]);

    if (err) {
        verify_err("pthread_create: %s", strerror(err));
        return -err;
    }
    side_main(&sd[0]);
    pthread_join(t, NULL);
    return sd[0].r < 0 ? sd[0].r : sd[1].r;
}

/* The rule for sizes (also in --help and the man page).  Sets the bytes
 * each side delivers, or returns why the sizes don't fit. */
static const char *plan_sizes(const struct options *o, uint64_t ssz,
                              uint64_t dsz, uint64_t *compared,
                              uint64_t *dst_end, char *why, size_t n)
{
    if (o->have_size) {
        *compared = *dst_end = o->size;
        if (ssz >= o->size && dsz >= o->size)
            return NULL;
        snprintf(why, n, "%s has %" PRIu64 " bytes, fewer than --size %" PRIu64,
                 ssz < o->size ? "source" : "destination",
                 ssz < o->size ? ssz : dsz, o->size);
        return why;
    }
    *compared = ssz;
    *dst_end = o->zero_tail ? dsz : ssz;
    if (o->zero_tail && dsz < ssz)
        snprintf(why, n, "destination is smaller than source (%" PRIu64
                 " < %" PRIu64 " bytes)", dsz, ssz);
    else if (!o->zero_tail && dsz != ssz)
        snprintf(why, n, "sizes differ: source %" PRIu64 " bytes, destination %"
                 PRIu64 " bytes (--size N compares a prefix; --zero-tail "
                 "accepts a larger destination whose tail reads as zero)",
                 ssz, dsz);
    else
        return NULL;
    return why;
}

/* sink_init, then blkhash mode if asked for.  fp_block 0: no fingerprints. */
static int side_init(const struct options *o, struct sink *k,
                     uint64_t digest_len, uint64_t end, uint64_t fp_block)
{
    if (sink_init(k, o->md, digest_len, end, fp_block, &abort_flag) < 0)
        return -1;
    if (o->blkhash && sink_blkhash(k, o->bh_digest, o->bh_block,
                                   o->threads) < 0)
        return -1;
    return 0;
}

/* ---- verdict ---- */

static int judge(struct verify_report *rep, const struct sink *a,
                 const struct sink *b, struct verify_range **ranges)
{
    bool same = a->digest_size == b->digest_size &&
                memcmp(a->digest, b->digest, a->digest_size) == 0;
    int r = report_ranges(a, b, rep->compared, ranges, &rep->nranges,
                          &rep->mismatch_bytes);

    if (r < 0)
        return r;
    rep->ranges = *ranges;
    if (same && rep->nranges) {
        /* Cannot happen unless the fingerprint code is broken. */
        verify_err("internal error: digests match but %zu block fingerprint "
                   "range(s) differ, first at %" PRIu64, rep->nranges,
                   rep->ranges[0].off);
        return -EIO;
    }
    rep->match = same && b->tail_nonzero < 0;
    return 0;
}

static int print_report(const struct options *o, struct verify_report *rep)
{
    if (!o->quiet) {
        if (o->json)
            report_json(stdout, rep);
        else
            report_text(stdout, rep);
    }
    if (fflush(stdout) == EOF) {
        verify_err("stdout: %s", strerror(errno));
        return VERIFY_EXIT_ERROR;
    }
    return rep->match ? VERIFY_EXIT_MATCH : VERIFY_EXIT_MISMATCH;
}

static int verify_two(const struct options *o, struct side sd[2], double t0)
{
    struct verify_report rep = {
        .algorithm = o->algorithm, .zero_tail = o->zero_tail,
        .block_size = o->block_size, .max_ranges = o->max_ranges,
        .side = { { .src = sd[0].s }, { .src = sd[1].s } },
    };
    struct verify_range *ranges = NULL;
    uint64_t dst_end;
    char why[256];
    int r;

    for (int i = 0; i < 2; i++)
        if (sd[i].s->size == VERIFY_SIZE_UNKNOWN) {
            verify_err("%s: a pipe has no size; comparing needs a file, a "
                       "block device or an NBD URI", sd[i].s->name);
            return VERIFY_EXIT_ERROR;
        }
    rep.size_problem = plan_sizes(o, sd[0].s->size, sd[1].s->size,
                                  &rep.compared, &dst_end, why, sizeof why);
    if (rep.size_problem)
        return print_report(o, &rep);
    if (side_init(o, &sd[0].k, rep.compared, rep.compared, o->block_size) < 0 ||
        side_init(o, &sd[1].k, rep.compared, dst_end, o->block_size) < 0)
        return VERIFY_EXIT_ERROR;
    if (run_sides(sd) < 0)
        return VERIFY_EXIT_ERROR;
    rep.elapsed = mono_now_s() - t0;
    rep.side[0].k = &sd[0].k;
    rep.side[1].k = &sd[1].k;
    if ((r = judge(&rep, &sd[0].k, &sd[1].k, &ranges)) == 0)
        r = print_report(o, &rep);
    else
        r = VERIFY_EXIT_ERROR;
    free(ranges);
    return r;
}

static int digest_one(const struct options *o, struct side *sd, double t0)
{
    struct verify_report rep = {
        .algorithm = o->algorithm, .side = { { .src = sd->s } },
    };
    bool stream = sd->s->size == VERIFY_SIZE_UNKNOWN;
    uint64_t len = o->have_size ? o->size : sd->s->size;

    if (!stream && len > sd->s->size) {
        verify_err("%s has %" PRIu64 " bytes, fewer than --size %" PRIu64,
                   sd->s->name, sd->s->size, len);
        return VERIFY_EXIT_ERROR;
    }
    if (side_init(o, &sd->k, len, len, 0) < 0)
        return VERIFY_EXIT_ERROR;
    sd->k.open_ended = stream && !o->have_size;
    side_main(sd);
    if (sd->r < 0)
        return VERIFY_EXIT_ERROR;
    rep.compared = sd->k.digest_len;
    rep.elapsed = mono_now_s() - t0;
    rep.side[0].k = &sd->k;
    if (!o->quiet)
        report_single(stdout, &rep, o->json);
    return fflush(stdout) == EOF ? VERIFY_EXIT_ERROR : VERIFY_EXIT_MATCH;
}

int main(int argc, char **argv)
{
    struct options o;
    int nops = parse_options(&o, argc, argv);
    struct side sd[2] = { { 0 } };
    double t0 = mono_now_s();
    int r = VERIFY_EXIT_ERROR;

    if (nops <= 0)
        return nops == 0 ? (fflush(stdout) == EOF ? VERIFY_EXIT_ERROR : 0)
                         : VERIFY_EXIT_ERROR;
    if (nops == 1) {
        if (source_open(argv[optind], &o.src, true, &sd[0].s) == 0)
            r = digest_one(&o, &sd[0], t0);
    } else if (source_open(argv[optind], &o.src, true, &sd[0].s) == 0 &&
               source_open(argv[optind + 1], &o.dst, false, &sd[1].s) == 0) {
        r = verify_two(&o, sd, t0);
    }
    for (int i = 0; i < 2; i++) {
        source_close(sd[i].s);
        sink_free(&sd[i].k);            /* fine on a zeroed sink */
    }
    return r;
}
