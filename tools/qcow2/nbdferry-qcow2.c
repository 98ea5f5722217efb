/* tools/qcow2/nbdferry-qcow2.c: qcow2 inspector over the qcow2/ library.
 *
 *   nbdferry-qcow2 info FILE
 *   nbdferry-qcow2 check FILE
 *   nbdferry-qcow2 map FILE
 *   nbdferry-qcow2 cat FILE [-o OUT]
 *   nbdferry-qcow2 export RAW -o OUT
 *
 * FILE may be "-" (standard input): every verb reads the qcow2 front to
 * back with the library's stream decoder, so a file that check accepts is
 * one a landing can decode, and cat decodes exactly as a landing would.
 * Clusters that arrive before the tables that place them are spooled to a
 * temporary file in $TMPDIR (keyed by their file offset), at most
 * --spool-max bytes.  Single-threaded: the decoder decompresses
 * compressed clusters itself.
 * Exit status: 0 ok, 1 invalid qcow2, 2 usage or I/O error.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/vector.h"
#include "qcow2/qcow2.h"
#include "tools/imgtool/imgtool.h"

#define IMGTOOL_PROG "nbdferry-qcow2"      /* IMGTOOL_PROGRAM sets imgtool_prog */

/* What map collects: one extent per run, in the order tables arrive. */
struct extent {
    uint64_t disk_off, len, file_off;
    enum qcow2_map what;
};
DEFINE_VECTOR_TYPE(extent_vector, struct extent, 1024);

struct decode {
    const char *path;
    struct imgtool_out out;
    int spool_fd;                       /* -1 until the first put */
    size_t spool_unit;                  /* bytes per key (a cluster) */
    struct qcow2_stream *s;
    bool refuse_backing;                /* cat: an overlay needs its base */
    bool refused;                       /* begin refused it (message given) */
    bool sink_failed;                   /* the output said why already */
    struct extent_vector ext;           /* map only */
    bool collect;
};

static int d_begin(void *o, const struct nbdf_begin *b)
{
    struct decode *d = o;
    enum qcow2_kind kind = (enum qcow2_kind) b->kind;
    if (d->refuse_backing && kind == QCOW2_OVERLAY) {
        imgtool_msg("%s: an image with a backing file (%s) holds only what "
                    "changed from it: land it onto a disk that holds the "
                    "backing chain (cp it into the mount's nbd.qcow2 after "
                    "its backing file), or flatten it first with qemu-img "
                    "convert", d->path,
                    qcow2_stream_header(d->s)->backing_file);
        d->refused = true;
        return -ENOTSUP;
    }
    return 0;
}

static int d_data(void *o, uint64_t off, const void *buf, size_t len)
{
    struct decode *d = o;
    int r = imgtool_out_write(&d->out, off, buf, len);
    d->sink_failed |= r < 0;
    return r;
}

/* Overlay only (cat refuses overlays): nothing to write. */
static int d_zero(void *o, uint64_t off, uint64_t len)
{
    (void) o, (void) off, (void) len;
    return 0;
}

static int d_map(void *o, uint64_t off, uint64_t len, int what,
                 uint64_t file_off)
{
    struct decode *d = o;
    if (!d->collect)
        return 0;
    struct extent *l = d->ext.len ? &d->ext.ptr[d->ext.len - 1] : NULL;
    if (l && (int) l->what == what && l->disk_off + l->len == off &&
        (what != QCOW2_MAP_DATA || l->file_off + l->len == file_off)) {
        l->len += len;                  /* the run goes on */
        return 0;
    }
    if (extent_vector_append(&d->ext, (struct extent) {
            off, len, file_off, (enum qcow2_map) what }) < 0)
        return -ENOMEM;
    return 0;
}


/* The spool: a file made on first use, deleted already (O_TMPFILE, else
 * mkstemp + unlink), in $TMPDIR.  Keys are file offsets of the qcow2, so
 * the spool file is as sparse as the part of the qcow2 it holds; a
 * dropped cluster's space is punched out. */
static int spool_open(struct decode *d)
{
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir)
        dir = "/tmp";
    d->spool_fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (d->spool_fd >= 0)
        return 0;
    char tmpl[4096];
    if (snprintf(tmpl, sizeof tmpl, "%s/nbdferry-qcow2-XXXXXX", dir) >=
        (int) sizeof tmpl)
        return -ENAMETOOLONG;
    d->spool_fd = mkostemp(tmpl, O_CLOEXEC);
    if (d->spool_fd < 0)
        return -errno;
    unlink(tmpl);
    return 0;
}

static int sp_put(void *o, uint64_t key, const void *buf, size_t len)
{
    struct decode *d = o;
    int r;
    if (d->spool_fd < 0 && (r = spool_open(d)) < 0) {
        imgtool_msg("spool in $TMPDIR: %s", strerror(-r));
        return r;
    }
    d->spool_unit = len;
    ssize_t n = pwrite(d->spool_fd, buf, len, (off_t) key);
    return n == (ssize_t) len ? 0 : n < 0 ? -errno : -ENOSPC;
}

static int sp_get(void *o, uint64_t key, void *buf, size_t len)
{
    struct decode *d = o;
    return imgtool_pread_full(d->spool_fd, buf, len, key);
}

static void sp_drop(void *o, uint64_t key)
{
    struct decode *d = o;
    /* Best effort: a file system without hole punching keeps the bytes. */
    (void) fallocate(d->spool_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                     (off_t) key, (off_t) d->spool_unit);
}

static const struct nbdf_sink sink = {
    .begin = d_begin, .data = d_data, .zero = d_zero, .map = d_map,
    .spool_put = sp_put, .spool_get = sp_get, .spool_drop = sp_drop,
};

/* Map a library error to the exit status. */
static int exit_status(const struct decode *d, int r)
{
    if (d->refused || d->sink_failed)
        return IMGTOOL_EXIT_USAGE;
    return r == -EINVAL || r == -EMEDIUMTYPE || r == -EFBIG || r == -ENOSPC
           ? IMGTOOL_EXIT_INVALID : IMGTOOL_EXIT_USAGE;
}

static int feed_cb(void *s, uint64_t off, const void *buf, size_t len)
{
    return qcow2_stream_feed(s, off, buf, len);
}

/* Decode the whole input.  0, or the exit status. */
static int run_decode(struct decode *d, struct qcow2_stream_stats *st)
{
    d->spool_fd = -1;
    int fd = imgtool_open_in(d->path);
    if (fd < 0)
        return IMGTOOL_EXIT_USAGE;
    struct qcow2_stream_opts opts = { .spool_max = imgtool_spool_max,
                                      .spool_option = "--spool-max" };
    int r = qcow2_stream_new(&sink, d, &opts, &d->s);
    if (r < 0)
        imgtool_msg("out of memory");
    else
        r = imgtool_feed(fd, d->path, feed_cb, d->s);
    if (fd != STDIN_FILENO)
        close(fd);
    if (r < 0 && !d->s)
        return IMGTOOL_EXIT_USAGE;
    if (r > 0)
        return r;
    if (r == 0)
        r = qcow2_stream_finish(d->s);
    if (st)
        qcow2_stream_stats(d->s, st);
    if (r < 0) {
        const char *e = qcow2_stream_error(d->s);
        if (!d->refused && !d->sink_failed)
            imgtool_msg("%s: %s", d->path, e[0] ? e : strerror(-r));
        return exit_status(d, r);
    }
    return 0;
}

static void decode_free(struct decode *d)
{
    qcow2_stream_free(d->s);
    if (d->spool_fd >= 0)
        close(d->spool_fd);
    extent_vector_reset(&d->ext);
}

static const char *compression_name(const struct qcow2_header *h)
{
    return h->compression_type == QCOW2_COMPRESS_ZSTD ? "zstd" : "zlib";
}

static void print_note(void *opaque, const char *msg)
{
    if (opaque)
        printf("%-22s %s\n", "note", msg);
    else
        imgtool_msg("note: %s", msg);
}

static int cmd_info(const char *path)
{
    struct decode d = { .path = path, .out = { .fd = -1 } };
    struct qcow2_stream_stats st;
    int r = run_decode(&d, &st);
    const struct qcow2_header *h = d.s ? qcow2_stream_header(d.s) : NULL;
    if (h) {
        printf("%-22s %u\n", "version", h->version);
        printf("%-22s %" PRIu64 "\n", "virtual size", h->size);
        printf("%-22s %" PRIu64 "\n", "cluster size", qcow2_cluster_size(h));
        printf("%-22s %s\n", "compression type", compression_name(h));
        printf("%-22s %u bits\n", "refcount width", qcow2_refcount_bits(h));
        if (qcow2_extended_l2(h))
            printf("%-22s yes (32 subclusters of %" PRIu64 " bytes)\n",
                   "extended L2", qcow2_cluster_size(h) / 32);
        else
            printf("%-22s no\n", "extended L2");
        if (h->backing_file_offset)
            printf("%-22s %s%s%s%s\n", "backing file", h->backing_file,
                   h->backing_format[0] ? " (format " : "", h->backing_format,
                   h->backing_format[0] ? ")" : "");
        else
            printf("%-22s none\n", "backing file");
        printf("%-22s %u%s\n", "internal snapshots", h->nb_snapshots,
               h->nb_snapshots ? " (not landed: only the active disk)" : "");
        printf("%-22s %u entries at %" PRIu64 "\n", "L1 table", h->l1_size,
               h->l1_table_offset);
        printf("%-22s %u clusters at %" PRIu64 "\n", "refcount table",
               h->refcount_table_clusters, h->refcount_table_offset);
        printf("%-22s %" PRIu64 " data, %" PRIu64 " compressed, %" PRIu64
               " zero\n", "clusters", st.data_clusters, st.compressed_clusters,
               st.zero_clusters);
        printf("%-22s %" PRIu64 " L2, %" PRIu64 " refcount blocks\n",
               "tables", st.l2_tables, st.refcount_blocks);
        printf("%-22s %" PRIu64 " clusters (peak %" PRIu64 " bytes)\n",
               "spooled", st.spooled_clusters, st.spool_peak);
        qcow2_lint(h, print_note, &d);
    }
    decode_free(&d);
    return r;
}

static int cmd_check(const char *path)
{
    struct decode d = { .path = path, .out = { .fd = -1 } };
    struct qcow2_stream_stats st;
    int r = run_decode(&d, &st);
    const struct qcow2_header *h = d.s ? qcow2_stream_header(d.s) : NULL;
    if (r == 0 && h) {
        qcow2_lint(h, print_note, NULL);
        printf("ok: qcow2 version %u%s, virtual size %" PRIu64 ", cluster "
               "size %" PRIu64 ", %" PRIu64 " data, %" PRIu64 " compressed, %"
               PRIu64 " zero clusters\n", h->version,
               h->backing_file_offset ? " with a backing file" : "", h->size,
               qcow2_cluster_size(h), st.data_clusters,
               st.compressed_clusters, st.zero_clusters);
    }
    decode_free(&d);
    return r;
}

static int extent_cmp(const void *a, const void *b)
{
    const struct extent *x = a, *y = b;
    return x->disk_off < y->disk_off ? -1 : x->disk_off > y->disk_off;
}

static const char *map_name(enum qcow2_map w)
{
    switch (w) {
    case QCOW2_MAP_DATA: return "allocated";
    case QCOW2_MAP_ZERO: return "zero";
    case QCOW2_MAP_COMPRESSED: return "compressed";
    }
    return "?";
}

static void print_run(uint64_t off, uint64_t len, const char *what,
                      const struct extent *e)
{
    printf("%" PRIu64 " %" PRIu64 " %s", off, len, what);
    if (e && e->what == QCOW2_MAP_DATA)
        printf(" %" PRIu64, e->file_off);
    printf("\n");
}

/* One line per run in disk order: disk offset, length, what (allocated
 * runs also contiguous in the file, with their file offset); the gaps are
 * unallocated (zero, or the backing file's bytes for an overlay). */
static int cmd_map(const char *path)
{
    struct decode d = { .path = path, .out = { .fd = -1 }, .collect = true };
    int r = run_decode(&d, NULL);
    const struct qcow2_header *h = d.s ? qcow2_stream_header(d.s) : NULL;
    if (r == 0 && h) {
        qsort(d.ext.ptr, d.ext.len, sizeof *d.ext.ptr, extent_cmp);
        uint64_t pos = 0;
        for (size_t i = 0; i < d.ext.len; i++) {
            struct extent e = d.ext.ptr[i];
            while (i + 1 < d.ext.len && d.ext.ptr[i + 1].what == e.what &&
                   d.ext.ptr[i + 1].disk_off == e.disk_off + e.len &&
                   (e.what != QCOW2_MAP_DATA ||
                    d.ext.ptr[i + 1].file_off == e.file_off + e.len))
                e.len += d.ext.ptr[++i].len;     /* tables out of order */
            if (e.disk_off > pos)
                print_run(pos, e.disk_off - pos, "unallocated", NULL);
            print_run(e.disk_off, e.len, map_name(e.what), &e);
            pos = e.disk_off + e.len;
        }
        if (pos < h->size)
            print_run(pos, h->size - pos, "unallocated", NULL);
    }
    decode_free(&d);
    return r;
}

static int cmd_cat(const char *path, const char *out)
{
    struct decode d = { .path = path, .refuse_backing = true };
    if (imgtool_out_open(&d.out, out) < 0)
        return IMGTOOL_EXIT_USAGE;
    int r = run_decode(&d, NULL);
    const struct qcow2_header *h = d.s ? qcow2_stream_header(d.s) : NULL;
    r = imgtool_out_end(&d.out, r, h ? &h->size : NULL);
    decode_free(&d);
    return r;
}

/* RAW as a qcow2 v3 with --cluster-size clusters (64 KiB unless set), in one pass, metadata first;
 * the raw file's holes (SEEK_DATA) are not stored. */
static int export_new(const char *raw, const struct stat *st, const char *out,
                      void **s)
{
    struct nbdf_err e = { "" };

    (void) out;
    if (!S_ISREG(st->st_mode) || st->st_size == 0) {
        imgtool_msg("%s: not a non-empty regular file (export reads a raw "
                    "disk image)", raw);
        return IMGTOOL_EXIT_USAGE;
    }
    if (qcow2_synth_new((uint64_t) st->st_size,
                        imgtool_cluster_size ? (unsigned) __builtin_ctzll(imgtool_cluster_size) : 16, (struct qcow2_synth **) s,
                        &e) < 0) {
        imgtool_msg("%s: %s", raw, e.msg);
        return IMGTOOL_EXIT_USAGE;
    }
    return 0;
}

IMGTOOL_PROGRAM_OPTS(qcow2, "qcow2", true, true, export_new);
