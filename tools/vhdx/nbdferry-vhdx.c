/* tools/vhdx/nbdferry-vhdx.c: VHDX inspector over the vhdx/ library.
 *
 *   nbdferry-vhdx info FILE
 *   nbdferry-vhdx check FILE
 *   nbdferry-vhdx map FILE
 *   nbdferry-vhdx cat FILE [-o OUT]
 *   nbdferry-vhdx export RAW -o OUT
 *
 * FILE may be "-" (standard input): every verb reads the VHDX front to
 * back with the library's stream decoder, so a file that check accepts is
 * one a landing can decode, and cat decodes exactly as a landing would.
 * Bytes that arrive before the tables that place them are spooled to a
 * temporary file (in $TMPDIR), at most --spool-max bytes.
 * Exit status: 0 ok, 1 invalid VHDX, 2 usage or I/O error.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tools/imgtool/imgtool.h"
#include "vhdx/vhdx.h"

#define IMGTOOL_PROG "nbdferry-vhdx"      /* IMGTOOL_PROGRAM sets imgtool_prog */

struct decode {
    const char *path;
    struct imgtool_out out;
    FILE *spool;                        /* a temporary file, made on demand */
    struct vhdx_stream *s;
    bool refuse_parent;                 /* cat: a child needs its parent */
};

static int d_begin(void *o, const struct nbdf_begin *b)
{
    struct decode *d = o;
    const struct vhdx_info *info = b->info;
    if (d->refuse_parent && info->meta.has_parent) {
        imgtool_msg("%s: a differencing VHDX holds only what changed from "
                    "its parent: land it onto a disk that holds the parent "
                    "(cp it into the mount's nbd.vhdx after the parent)",
                    d->path);
        return -ENOTSUP;
    }
    return 0;
}

static int d_data(void *o, uint64_t off, const void *buf, size_t len)
{
    return imgtool_out_write(&((struct decode *) o)->out, off, buf, len);
}

static int d_put(void *o, uint64_t off, const void *buf, size_t len)
{
    struct decode *d = o;
    if (!d->spool && !(d->spool = tmpfile()))
        return -errno;
    ssize_t n = pwrite(fileno(d->spool), buf, len, (off_t) off);
    return n == (ssize_t) len ? 0 : n < 0 ? -errno : -EIO;
}

static int d_get(void *o, uint64_t off, void *buf, size_t len)
{
    struct decode *d = o;
    return imgtool_pread_full(fileno(d->spool), buf, len, off);
}

static const struct nbdf_sink sink = { .begin = d_begin, .data = d_data,
                                       .spool_put = d_put, .spool_get = d_get };

static int feed_cb(void *s, uint64_t off, const void *buf, size_t len)
{
    return vhdx_stream_feed(s, off, buf, len);
}

/* Decode the whole input.  0, or the exit status. */
static int run_decode(struct decode *d, struct vhdx_stream_stats *st)
{
    int fd = imgtool_open_in(d->path);
    if (fd < 0)
        return IMGTOOL_EXIT_USAGE;
    struct vhdx_stream_config cfg = { imgtool_spool_max, "--spool-max" };
    if (vhdx_stream_new(&sink, d, &cfg, &d->s) < 0) {
        if (fd != STDIN_FILENO)
            close(fd);
        return IMGTOOL_EXIT_USAGE;
    }
    int r = imgtool_feed(fd, d->path, feed_cb, d->s);
    if (fd != STDIN_FILENO)
        close(fd);
    if (r == 0)
        r = vhdx_stream_finish(d->s);
    if (r < 0) {
        const char *e = vhdx_stream_error(d->s);
        if (e[0] && !strstr(e, "the sink failed"))
            imgtool_msg("%s: %s", d->path, e);
        r = r == -EINVAL || r == -EMEDIUMTYPE || r == -ENOTSUP || r == -EFBIG
            ? (r == -ENOTSUP && d->refuse_parent && vhdx_stream_info(d->s) &&
               vhdx_stream_info(d->s)->meta.has_parent ? IMGTOOL_EXIT_USAGE
                                                       : IMGTOOL_EXIT_INVALID)
            : IMGTOOL_EXIT_USAGE;
    }
    if (st)
        vhdx_stream_stats(d->s, st);
    return r;
}

static void decode_free(struct decode *d)
{
    vhdx_stream_free(d->s);
    if (d->spool)
        fclose(d->spool);
}

static const char *kind(const struct vhdx_meta *m)
{
    return m->has_parent ? "differencing"
         : m->leave_blocks_allocated ? "fixed" : "dynamic";
}

static void print_guid(const char *label, const uint8_t *g)
{
    printf("%-22s %02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
           "%02x%02x%02x%02x%02x%02x\n", label, g[3], g[2], g[1], g[0],
           g[5], g[4], g[7], g[6], g[8], g[9], g[10], g[11], g[12], g[13],
           g[14], g[15]);
}

static int cmd_info(const char *path)
{
    struct decode d = { .path = path, .out = { .fd = -1 } };
    struct vhdx_stream_stats st;
    int r = run_decode(&d, &st);
    const struct vhdx_info *i = d.s ? vhdx_stream_info(d.s) : NULL;
    if (i) {
        const struct vhdx_meta *m = &i->meta;
        printf("%-22s %s\n", "type", kind(m));
        printf("%-22s %" PRIu64 "\n", "virtual size", m->disk_size);
        printf("%-22s %u\n", "block size", m->block_size);
        printf("%-22s %u / %u\n", "sector size", m->logical_sector,
               m->physical_sector);
        printf("%-22s %" PRIu64 "\n", "header sequence", i->header.seq);
        print_guid("data write guid", i->header.data_write_guid);
        if (m->have_page83)
            print_guid("page 83 id", m->page83);
        printf("%-22s %u bytes at %" PRIu64 "\n", "log",
               i->header.log_length, i->header.log_offset);
        if (i->header.log_pending)      /* not closed cleanly */
            printf("%-22s %" PRIu64 " entries, %" PRIu64 " writes\n",
                   "log replayed", i->log_entries, i->log_writes);
        printf("%-22s %" PRIu64 " bytes at %" PRIu64 "\n", "metadata region",
               i->regions.meta.len, i->regions.meta.off);
        printf("%-22s %" PRIu64 " bytes at %" PRIu64 " (%" PRIu64 " entries)\n",
               "BAT", i->regions.bat.len, i->regions.bat.off,
               i->geom.bat_entries);
        printf("%-22s %" PRIu64 " of %" PRIu64 " present, %" PRIu64
               " zero\n", "blocks", i->present_blocks, i->geom.payload_blocks,
               i->zero_blocks);
        for (unsigned k = 0; k < m->parent_pairs; k++)
            printf("%-22s %s = %s\n", k ? "" : "parent locator",
                   m->parent[k].key, m->parent[k].value);
        printf("%-22s %" PRIu64 " bytes (peak %" PRIu64 ")\n", "spooled",
               st.spooled_bytes, st.spool_peak);
    }
    decode_free(&d);
    return r;
}

static int cmd_check(const char *path)
{
    struct decode d = { .path = path, .out = { .fd = -1 } };
    struct vhdx_stream_stats st;
    int r = run_decode(&d, &st);
    const struct vhdx_info *i = d.s ? vhdx_stream_info(d.s) : NULL;
    if (r == 0 && i)
        printf("ok: %s VHDX, virtual size %" PRIu64 ", %" PRIu64 " of %"
               PRIu64 " blocks present, %" PRIu64 " data bytes\n",
               kind(&i->meta), i->meta.disk_size, i->present_blocks,
               i->geom.payload_blocks, st.data_bytes);
    decode_free(&d);
    return r;
}

static const char *state_name(unsigned st)
{
    switch (st) {
    case VHDX_PB_NOT_PRESENT: return "not-present";
    case VHDX_PB_UNDEFINED: return "undefined";
    case VHDX_PB_ZERO: return "zero";
    case VHDX_PB_UNMAPPED: case VHDX_PB_UNMAPPED_QEMU: return "unmapped";
    case VHDX_PB_FULLY_PRESENT: return "present";
    case VHDX_PB_PARTIALLY_PRESENT: return "partial";
    }
    return "?";
}

/* One line per run of blocks in the same state (present runs also
 * contiguous in the file): disk offset, length, state, file offset. */
static int cmd_map(const char *path)
{
    struct decode d = { .path = path, .out = { .fd = -1 } };
    int r = run_decode(&d, NULL);
    const struct vhdx_info *i = d.s ? vhdx_stream_info(d.s) : NULL;
    if (r == 0 && i) {
        uint64_t bs = i->meta.block_size, n = i->geom.payload_blocks;
        uint64_t start = 0, foff0 = 0;
        unsigned st0 = 0;
        for (uint64_t b = 0; b <= n; b++) {
            unsigned st = 0;
            uint64_t foff = 0;
            bool present = false;
            if (b < n) {
                vhdx_stream_block(d.s, b, &st, &foff);
                present = st == VHDX_PB_FULLY_PRESENT ||
                          st == VHDX_PB_PARTIALLY_PRESENT;
            }
            bool same = b > start && b < n && st == st0 &&
                        (!present || foff == foff0 + (b - start) * bs);
            if (b > 0 && !same) {
                uint64_t len = (b * bs < i->meta.disk_size ? b * bs
                                : i->meta.disk_size) - start * bs;
                bool p0 = st0 == VHDX_PB_FULLY_PRESENT ||
                          st0 == VHDX_PB_PARTIALLY_PRESENT;
                printf("%" PRIu64 " %" PRIu64 " %s", start * bs, len,
                       state_name(st0));
                if (p0)
                    printf(" %" PRIu64, foff0);
                printf("\n");
            }
            if (!same) {
                start = b;
                st0 = st;
                foff0 = foff;
            }
        }
    }
    decode_free(&d);
    return r;
}

static int cmd_cat(const char *path, const char *out)
{
    struct decode d = { .path = path, .refuse_parent = true };
    if (imgtool_out_open(&d.out, out) < 0)
        return IMGTOOL_EXIT_USAGE;
    int r = run_decode(&d, NULL);
    const struct vhdx_info *i = d.s ? vhdx_stream_info(d.s) : NULL;
    r = imgtool_out_end(&d.out, r, i ? &i->meta.disk_size : NULL);
    decode_free(&d);
    return r;
}

/* RAW as a dynamic VHDX with a new random (version 4) data-write GUID. */
static int export_new(const char *raw, const struct stat *st, const char *out,
                      void **s)
{
    struct nbdf_err e = { "" };
    uint8_t guid[16];

    (void) out;
    if (getrandom(guid, sizeof guid, 0) != sizeof guid)
        memset(guid, 0x5a, sizeof guid);
    guid[7] = (uint8_t) ((guid[7] & 0x0f) | 0x40);      /* version 4 */
    guid[8] = (uint8_t) ((guid[8] & 0x3f) | 0x80);
    if (vhdx_synth_new((uint64_t) st->st_size, guid,
                       (struct vhdx_synth **) s, &e) < 0) {
        imgtool_msg("%s: %s", raw, e.msg);
        return IMGTOOL_EXIT_USAGE;
    }
    return 0;
}

IMGTOOL_PROGRAM(vhdx, "VHDX", true, export_new);
