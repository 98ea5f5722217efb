/* tools/vmdk/nbdferry-vmdk.c: VMDK inspector over the vmdk/ library.
 *
 *   nbdferry-vmdk info FILE
 *   nbdferry-vmdk check FILE
 *   nbdferry-vmdk map FILE
 *   nbdferry-vmdk cat FILE [-o OUT]
 *   nbdferry-vmdk export RAW -o OUT
 *
 * FILE may be "-" (standard input): every verb reads the VMDK front to
 * back with the stream decoder the nbd.vmdk view uses, so a file that
 * check accepts is one the mount ingests, and cat decodes exactly as the
 * mount would.  Exit status: 0 ok, 1 invalid VMDK, 2 usage or I/O error.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/iszero.h"
#include "tools/imgtool/imgtool.h"
#include "vmdk/vmdk.h"

#define EXIT_INVALID IMGTOOL_EXIT_INVALID
#define EXIT_USAGE   IMGTOOL_EXIT_USAGE
#define CHUNK        IMGTOOL_CHUNK

#define IMGTOOL_PROG "nbdferry-vmdk"      /* IMGTOOL_PROGRAM sets imgtool_prog */

/* ---- a decode, front to back --------------------------------------------- */

struct decode {
    const char *path;
    int out_fd;                   /* -1: discard */
    bool seekable;
    uint64_t out_pos;             /* pipes: bytes written so far */
    uint64_t capacity, grain_bytes;
    bool map;                     /* collect grains with data */
    uint8_t *grains;              /* map: a bit per grain, from begin() */
    struct vmdk_stream *s;
    enum vmdk_kind kind;
};

static int d_begin(void *o, const struct nbdf_begin *b)
{
    struct decode *d = o;
    d->kind = (enum vmdk_kind) b->kind;
    d->capacity = b->size;
    if (d->map) {
        const struct vmdk_header *h = vmdk_stream_header(d->s);
        d->grain_bytes = vmdk_header_grain_bytes(h);
        d->grains = calloc(vmdk_header_grains(h) / 8 + 1, 1);
        if (!d->grains)
            return -ENOMEM;
    }
    return 0;
}

static int write_at(struct decode *d, uint64_t off, const uint8_t *buf,
                    size_t len)
{
    static const uint8_t zeros[65536];
    if (d->seekable) {
        while (len) {
            ssize_t n = pwrite(d->out_fd, buf, len, (off_t) off);
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0)
                return -errno;
            buf += n, off += (uint64_t) n, len -= (size_t) n;
        }
        return 0;
    }
    if (off < d->out_pos) {
        imgtool_msg("%s: grains out of disk order: cat to a pipe needs them in "
            "order (use -o FILE)", d->path);
        return -ESPIPE;
    }
    while (d->out_pos < off + len) {
        const uint8_t *p = d->out_pos < off ? zeros : buf + (d->out_pos - off);
        size_t n = d->out_pos < off
                   ? (size_t) (off - d->out_pos < sizeof zeros
                               ? off - d->out_pos : sizeof zeros)
                   : (size_t) (off + len - d->out_pos);
        ssize_t w = write(d->out_fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -errno;
        d->out_pos += (uint64_t) w;
    }
    return 0;
}

static int d_data(void *o, uint64_t off, const void *buf, size_t len)
{
    struct decode *d = o;
    if (d->grains && !is_zero(buf, len)) {
        uint64_t g = off / d->grain_bytes;
        d->grains[g / 8] |= (uint8_t) (1u << (g % 8));
    }
    if (d->out_fd < 0 || (d->seekable && is_zero(buf, len)))
        return 0;                 /* sparse output: holes stay holes */
    return write_at(d, off, buf, len);
}

static const struct nbdf_sink sink = { .begin = d_begin, .data = d_data };

/* Stream the whole input into s.  0, or the exit status. */
static int feed_cb(void *s, uint64_t off, const void *buf, size_t len)
{
    return vmdk_stream_feed(s, off, buf, len);
}

static int feed_all(struct vmdk_stream *s, int fd, const char *path)
{
    int r = imgtool_feed(fd, path, feed_cb, s);

    if (r > 0)
        return r;
    if (r == 0)
        r = vmdk_stream_finish(s);
    if (r < 0) {
        imgtool_msg("%s: %s", path, vmdk_stream_error(s)[0] ? vmdk_stream_error(s)
                                                    : strerror(-r));
        return r == -ESPIPE || r == -EIO || r == -ENOSPC ? EXIT_USAGE
                                                         : EXIT_INVALID;
    }
    return 0;
}

/* ---- info and check ---------------------------------------------------------- */

/* Warnings go to stdout for info and check, to stderr when stdout
 * carries map output or disk bytes. */
static FILE *warn_out;

static void warn_cb(void *opaque, const char *w)
{
    fprintf(warn_out ? warn_out : stderr, "warning: %s\n", w);
    ++*(int *) opaque;
}

static const char *kind_name(const struct vmdk_header *h)
{
    return h->flags & VMDK_FLAG_MARKERS ? "streamOptimized" : "monolithicSparse";
}

static void print_header(const struct vmdk_header *h, const struct vmdk_desc *d)
{
    printf("kind: %s\n", kind_name(h));
    printf("version: %" PRIu32 "\n", h->version);
    printf("flags: 0x%08" PRIx32 "\n", h->flags);
    printf("capacity: %" PRIu64 " bytes (%" PRIu64 " sectors)\n",
           h->capacity * VMDK_SECTOR, h->capacity);
    printf("grain size: %" PRIu64 " bytes\n", h->grain_size * VMDK_SECTOR);
    printf("grain tables: %" PRIu64 " of %" PRIu32 " entries\n",
           vmdk_header_gts(h), h->gtes_per_gt);
    printf("descriptor: sector %" PRIu64 ", %" PRIu64 " sectors\n",
           h->desc_offset, h->desc_size);
    if (h->gd_offset == VMDK_GD_AT_END)
        printf("grain directory: at end (footer)\n");
    else
        printf("grain directory: sector %" PRIu64 "\n", h->gd_offset);
    printf("redundant directory: sector %" PRIu64 "\n", h->rgd_offset);
    printf("overhead: %" PRIu64 " sectors\n", h->overhead);
    printf("compression: %s\n", h->compress ? "deflate" : "none");
    printf("unclean shutdown: %s\n", h->unclean_shutdown ? "yes" : "no");
    if (d) {
        printf("create type: %s\n", d->create_type);
        printf("cid: %08" PRIx32 "\n", d->cid);
        printf("parent cid: %08" PRIx32 "\n", d->parent_cid);
        printf("extent: %s %" PRIu64 " %s \"%s\"\n", d->extent_access,
               d->extent_sectors, d->extent_type, d->extent_file);
    }
}

/* Read the header and descriptor only (stops at the overhead). */
static int cmd_info(const char *path)
{
    warn_out = stdout;                /* the warnings are its report */
    int fd = imgtool_open_in(path);
    uint8_t sec[VMDK_SECTOR];
    struct vmdk_header h;
    struct vmdk_desc d;
    struct nbdf_err e = { "" };
    int warns = 0;

    if (fd < 0)
        return EXIT_USAGE;
    if (imgtool_read_full(fd, sec, sizeof sec) != (ssize_t) sizeof sec) {
        imgtool_msg("%s: shorter than a sparse header", path);
        return EXIT_INVALID;
    }
    if (vmdk_header_decode(sec, &h, &e) < 0) {
        imgtool_msg("%s: %s", path, e.msg);
        return EXIT_INVALID;
    }
    size_t dlen = (size_t) (h.desc_size * VMDK_SECTOR);
    char *text = malloc(dlen);
    uint64_t skip = (h.desc_offset - 1) * VMDK_SECTOR;
    bool ok = text != NULL;
    while (ok && skip) {                      /* forward only: stdin too */
        uint8_t junk[VMDK_SECTOR];
        ok = imgtool_read_full(fd, junk, sizeof junk) == (ssize_t) sizeof junk;
        skip -= VMDK_SECTOR;
    }
    ok = ok && imgtool_read_full(fd, text, dlen) == (ssize_t) dlen;
    if (!ok) {
        imgtool_msg("%s: descriptor: unexpected end of file", path);
        free(text);
        return EXIT_INVALID;
    }
    int r = vmdk_desc_parse(text, dlen, &h, &d, &e);
    free(text);
    print_header(&h, r == 0 ? &d : NULL);
    vmdk_lint(&h, warn_cb, &warns);
    if (r < 0) {
        imgtool_msg("%s: %s", path, e.msg);
        return EXIT_INVALID;
    }
    return 0;
}

static int run_decode(const char *path, struct decode *d,
                      struct vmdk_stream_stats *st)
{
    struct vmdk_stream *s;
    int fd = imgtool_open_in(path);
    if (fd < 0)
        return EXIT_USAGE;
    if (vmdk_stream_new(&sink, d, &s) < 0)
        return EXIT_USAGE;
    d->s = s;
    int r = feed_all(s, fd, path);
    if (st)
        vmdk_stream_stats(s, st);
    const struct vmdk_header *h = vmdk_stream_header(s);
    if (r == 0 && h) {
        int warns = 0;
        vmdk_lint(h, warn_cb, &warns);
    }
    vmdk_stream_free(s);
    if (fd != STDIN_FILENO)
        close(fd);
    return r;
}

/* Parse the file the way qemu reads it (grain directory and tables) and,
 * for streamOptimized, check that every table entry points at a marker
 * for its own LBA and that tables and markers list the same number of
 * grains.  0, EXIT_INVALID or EXIT_USAGE. */
static int cross_check(const char *path, uint64_t markers)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct vmdk_image *img = NULL;
    struct nbdf_err e = { "" };
    struct stat st;
    uint8_t sec[VMDK_SECTOR], *buf = NULL;
    uint64_t off, grains = 0;
    size_t len;
    int r = EXIT_USAGE;

    if (fd < 0 || fstat(fd, &st) < 0 || imgtool_pread_full(fd, sec, sizeof sec, 0))
        goto out;
    if ((r = vmdk_image_new(sec, (uint64_t) st.st_size, &img, &e)) == -EFBIG) {
        printf("note: %s; tables not cross-checked\n", e.msg);
        r = 0;
        goto out;
    }
    while (r == 0 && (r = vmdk_image_next(img, &off, &len)) > 0) {
        uint8_t *b = realloc(buf, len ? len : 1);
        if (!b || imgtool_pread_full(fd, b, len, off) < 0) {
            free(b ? b : buf), buf = NULL;
            r = -EIO;
            break;
        }
        buf = b;
        r = vmdk_image_supply(img, buf, &e);
    }
    if (r < 0) {
        imgtool_msg("%s: read as qemu does (through the tables): %s", path,
            e.msg[0] ? e.msg : strerror(-r));
        r = EXIT_INVALID;
        goto out;
    }
    const struct vmdk_header *h = vmdk_image_header(img);
    if (h->flags & VMDK_FLAG_MARKERS) {
        uint64_t cap = h->capacity * VMDK_SECTOR;
        for (uint64_t d = 0; d < cap; ) {
            struct vmdk_place p;
            uint8_t m[16];
            uint64_t lba;
            uint32_t size;
            vmdk_image_lookup(img, d, &p);
            if (p.src == VMDK_SRC_MARKER) {
                grains++;
                if (imgtool_pread_full(fd, m, 12, p.file_off) < 0)
                    lba = UINT64_MAX, size = 0;
                else
                    vmdk_marker_decode(m, &lba, &size);
                if (lba != d / VMDK_SECTOR || size == 0) {
                    imgtool_msg("%s: the grain table entry for LBA %" PRIu64 " points "
                        "at byte %" PRIu64 ", which is not its grain marker: "
                        "qemu would read another disk", path,
                        d / VMDK_SECTOR, p.file_off);
                    r = EXIT_INVALID;
                    goto out;
                }
            }
            d += p.len;
        }
        if (grains != markers) {
            imgtool_msg("%s: the grain tables list %" PRIu64 " grains, the stream "
                "has %" PRIu64 " grain markers", path, grains, markers);
            r = EXIT_INVALID;
            goto out;
        }
    }
    printf("tables: agree with the %s\n", h->flags & VMDK_FLAG_MARKERS
           ? "grain markers" : "stream decode");
    r = 0;
out:
    if (r == EXIT_USAGE)
        imgtool_msg("%s: %s", path, strerror(errno));
    vmdk_image_free(img);
    free(buf);
    if (fd >= 0)
        close(fd);
    return r;
}

static int cmd_check(const char *path)
{
    warn_out = stdout;                /* the warnings are its report */
    struct decode d = { .path = path, .out_fd = -1 };
    struct vmdk_stream_stats st;
    int r = run_decode(path, &d, &st);
    if (r)
        return r;
    printf("ok: %s, capacity %" PRIu64 " bytes, %" PRIu64 " grains",
           d.kind == VMDK_STREAM_OPTIMIZED ? "streamOptimized"
                                           : "monolithicSparse",
           d.capacity, st.grains);
    if (d.kind == VMDK_STREAM_OPTIMIZED)
        printf(" (%" PRIu64 " compressed bytes), %" PRIu64 " GT and %" PRIu64
               " GD markers, %s footer", st.compressed_bytes, st.gt_markers,
               st.gd_markers, st.footer ? "a" : "no");
    else
        printf(", %" PRIu64 " zero grains", st.zero_grains);
    printf("\n");
    struct stat sb;
    if (strcmp(path, "-") != 0 && stat(path, &sb) == 0 && S_ISREG(sb.st_mode))
        return cross_check(path, st.grains);
    return 0;
}

/* Grains holding non-zero data, in disk order: one index per line. */
static int cmd_map(const char *path)
{
    struct decode d = { .path = path, .out_fd = -1, .map = true };
    int r = run_decode(path, &d, NULL);
    if (r == 0 && d.grains) {
        uint64_t n = (d.capacity + d.grain_bytes - 1) / d.grain_bytes;
        for (uint64_t g = 0; g < n; g++)
            if (d.grains[g / 8] & (1u << (g % 8)))
                printf("%" PRIu64 "\n", g * d.grain_bytes);
    }
    free(d.grains);
    return r;
}

static int cmd_cat(const char *path, const char *out)
{
    struct decode d = { .path = path };
    if (out) {
        d.out_fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (d.out_fd < 0) {
            imgtool_msg("%s: %s", out, strerror(errno));
            return EXIT_USAGE;
        }
    } else
        d.out_fd = STDOUT_FILENO;
    d.seekable = lseek(d.out_fd, 0, SEEK_CUR) >= 0;
    int r = run_decode(path, &d, NULL);
    if (r == 0 && d.seekable && ftruncate(d.out_fd, (off_t) d.capacity) < 0) {
        imgtool_msg("%s: %s", out ? out : "stdout", strerror(errno));
        r = EXIT_USAGE;
    }
    if (r == 0 && !d.seekable && d.out_pos < d.capacity &&
        write_at(&d, d.capacity, NULL, 0) < 0)
        r = EXIT_USAGE;
    if (out && close(d.out_fd) < 0 && r == 0) {
        imgtool_msg("%s: %s", out, strerror(errno));
        r = EXIT_USAGE;
    }
    return r;
}

/* ---- export: a raw file as a streamOptimized VMDK --------------------------- */

static int export_new(const char *raw, const struct stat *st, const char *out,
                      void **s)
{
    const char *base = strrchr(out, '/') ? strrchr(out, '/') + 1 : out;
    struct nbdf_err e = { "" };
    uint32_t cid;

    if (getrandom(&cid, sizeof cid, 0) != sizeof cid || cid == 0xffffffffu)
        cid = 1;
    if (vmdk_synth_new((uint64_t) st->st_size, cid, base,
                       (struct vmdk_synth **) s, &e) < 0) {
        imgtool_msg("%s: %s", raw, e.msg);
        return EXIT_USAGE;
    }
    return 0;
}

IMGTOOL_PROGRAM(vmdk, "VMDK", false, export_new);
