/* tools/verify/report.c: mismatch ranges and the text and JSON reports. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "tools/verify/verify.h"

/* Both sides' fingerprints of block i, as report_ranges() gets them. */
static bool block_differs(const void *ctx, size_t i)
{
    const struct sink *const *ab = ctx;

    return ab[0]->blocks[i] != ab[1]->blocks[i];
}

int report_ranges(const struct sink *a, const struct sink *b,
                  uint64_t compared, struct verify_range **out, size_t *n,
                  uint64_t *bytes)
{
    const struct sink *ab[2] = { a, b };

    return verify_name_ranges(a->nblocks < b->nblocks ? a->nblocks
                                                      : b->nblocks,
                              a->block_size, compared, block_differs, ab,
                              out, n, bytes);
}

static void hex(char *out, const unsigned char *d, unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", d[i]);
    out[2 * n] = '\0';
}

static double mib_per_s(const struct verify_report *r)
{
    return r->elapsed > 0 ? r->compared / 1048576.0 / r->elapsed : 0;
}

static const char *role(int i)
{
    return i == 0 ? "source" : "destination";
}

static void text_sides(FILE *f, const struct verify_report *r)
{
    char h[2 * EVP_MAX_MD_SIZE + 1];

    for (int i = 0; i < 2; i++) {
        const struct verify_side_report *s = &r->side[i];
        fprintf(f, "%-12s %s (%s, %" PRIu64 " bytes)\n", role(i),
                s->src->name, s->src->ops->kind, s->src->size);
    }
    for (int i = 0; i < 2; i++) {
        const struct sink *k = r->side[i].k;
        if (!k)
            continue;
        hex(h, k->digest, k->digest_size);
        fprintf(f, "%-12s %s %s\n", role(i), r->algorithm, h);
    }
}

static void text_stats(FILE *f, const struct verify_report *r)
{
    fprintf(f, "compared     %" PRIu64 " bytes in %.3f s (%.1f MiB/s)\n",
            r->compared, r->elapsed, mib_per_s(r));
    for (int i = 0; i < 2; i++) {
        const struct sink *k = r->side[i].k;
        fprintf(f, "%-12s read %" PRIu64 " bytes, %" PRIu64
                " bytes known zero (not read)\n", role(i), k->bytes_read,
                k->bytes_zero);
    }
}

static void text_mismatch(FILE *f, const struct verify_report *r)
{
    const struct sink *d = r->side[1].k;
    size_t shown = r->max_ranges && r->max_ranges < r->nranges
                   ? r->max_ranges : r->nranges;

    if (r->zero_tail && d->tail_nonzero >= 0)
        fprintf(f, "tail         not zero: destination byte %" PRId64
                " is not zero (past the source's %" PRIu64 " bytes)\n",
                d->tail_nonzero, r->compared);
    if (r->nranges)
        fprintf(f, "ranges       %zu range%s, %" PRIu64 " bytes differ (%"
                PRIu64 "-byte blocks)\n", r->nranges,
                r->nranges == 1 ? "" : "s", r->mismatch_bytes, r->block_size);
    else if (memcmp(r->side[0].k->digest, d->digest, d->digest_size) != 0)
        fprintf(f, "ranges       digests differ but no block fingerprint "
                "does: ranges unknown\n");
    for (size_t i = 0; i < shown; i++)
        fprintf(f, "differ       offset %" PRIu64 " length %" PRIu64 "\n",
                r->ranges[i].off, r->ranges[i].len);
    if (shown < r->nranges)
        fprintf(f, "differ       ... %zu more (--max-ranges 0 lists all)\n",
                r->nranges - shown);
}

void report_text(FILE *f, const struct verify_report *r)
{
    text_sides(f, r);
    if (r->size_problem) {
        fprintf(f, "result       MISMATCH: %s\n", r->size_problem);
        return;
    }
    text_stats(f, r);
    if (!r->match)
        text_mismatch(f, r);
    fprintf(f, "result       %s\n", r->match ? "MATCH" : "MISMATCH");
}

static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char) *s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static void json_side(FILE *f, const struct verify_report *r, int i)
{
    const struct verify_side_report *s = &r->side[i];
    char h[2 * EVP_MAX_MD_SIZE + 1];

    fprintf(f, "  \"%s\": {\"name\": ", role(i));
    json_string(f, s->src->name);
    fprintf(f, ", \"kind\": \"%s\", \"size\": %" PRIu64, s->src->ops->kind,
            s->src->size);
    if (s->k) {
        hex(h, s->k->digest, s->k->digest_size);
        fprintf(f, ", \"digest\": \"%s\", \"bytes_read\": %" PRIu64
                ", \"bytes_zero\": %" PRIu64, h, s->k->bytes_read,
                s->k->bytes_zero);
    } else {
        fprintf(f, ", \"digest\": null");
    }
    fprintf(f, "},\n");
}

static void json_ranges(FILE *f, const struct verify_report *r)
{
    size_t shown = r->max_ranges && r->max_ranges < r->nranges
                   ? r->max_ranges : r->nranges;

    fprintf(f, "  \"mismatch_ranges\": [");
    for (size_t i = 0; i < shown; i++)
        fprintf(f, "%s{\"offset\": %" PRIu64 ", \"length\": %" PRIu64 "}",
                i ? ", " : "", r->ranges[i].off, r->ranges[i].len);
    fprintf(f, "],\n  \"mismatch_ranges_total\": %zu,\n"
            "  \"mismatch_bytes\": %" PRIu64 ",\n", r->nranges,
            r->mismatch_bytes);
}

void report_json(FILE *f, const struct verify_report *r)
{
    const struct sink *d = r->side[1].k;

    fprintf(f, "{\n  \"result\": \"%s\",\n  \"algorithm\": \"%s\",\n",
            r->match ? "match" : "mismatch", r->algorithm);
    json_side(f, r, 0);
    json_side(f, r, 1);
    fprintf(f, "  \"size_problem\": ");
    if (r->size_problem)
        json_string(f, r->size_problem);
    else
        fprintf(f, "null");
    fprintf(f, ",\n  \"compared_bytes\": %" PRIu64 ",\n  \"block_size\": %"
            PRIu64 ",\n  \"elapsed_s\": %.6f,\n  \"mib_per_s\": %.1f,\n",
            r->compared, r->block_size, r->elapsed, mib_per_s(r));
    if (!r->zero_tail || !d)
        fprintf(f, "  \"tail_nonzero_offset\": null,\n");
    else if (d->tail_nonzero >= 0)
        fprintf(f, "  \"tail_nonzero_offset\": %" PRId64 ",\n", d->tail_nonzero);
    else
        fprintf(f, "  \"tail_nonzero_offset\": null,\n");
    json_ranges(f, r);
    fprintf(f, "  \"zero_tail\": %s\n}\n", r->zero_tail ? "true" : "false");
}

void report_single(FILE *f, const struct verify_report *r, bool json)
{
    const struct sink *k = r->side[0].k;
    char h[2 * EVP_MAX_MD_SIZE + 1];

    hex(h, k->digest, k->digest_size);
    if (!json) {
        fprintf(f, "%s  %s\n", h, r->side[0].src->name);
        return;
    }
    fprintf(f, "{\n  \"algorithm\": \"%s\",\n", r->algorithm);
    fprintf(f, "  \"name\": ");
    json_string(f, r->side[0].src->name);
    fprintf(f, ",\n  \"kind\": \"%s\",\n  \"size\": %" PRIu64 ",\n"
            "  \"digest\": \"%s\",\n  \"bytes_read\": %" PRIu64 ",\n"
            "  \"bytes_zero\": %" PRIu64 ",\n  \"elapsed_s\": %.6f,\n"
            "  \"mib_per_s\": %.1f\n}\n", r->side[0].src->ops->kind,
            r->side[0].src->size, h, k->bytes_read, k->bytes_zero,
            r->elapsed, mib_per_s(r));
}
