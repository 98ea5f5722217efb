/* tools/vhd/nbdferry-vhd.c: VHD inspector over the vhd/ library.
 *
 *   nbdferry-vhd info FILE
 *   nbdferry-vhd check FILE
 *   nbdferry-vhd map FILE
 *   nbdferry-vhd cat FILE [-o OUT] [--parent P] [--stream]
 *   nbdferry-vhd export RAW -o OUT
 *
 * Exit status: 0 ok, 1 invalid VHD or mismatch, 2 usage or I/O error.
 * The library never does I/O; this file, tools/imgtool/ (the inspectors'
 * shared I/O and export) and imagefile/ (the chain reader
 * shared with nbdferry-verify) do all of it (pread, pwrite).
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/iszero.h"
#include "common/optlist.h"
#include "common/uuid.h"
#include "config.h"
#include "tools/imgtool/imgtool.h"
#include "imagefile/imagefile.h"
#include "vhd/vhd.h"

#define EXIT_INVALID IMGTOOL_EXIT_INVALID
#define EXIT_USAGE   IMGTOOL_EXIT_USAGE
#define CHUNK        (2u << 20)


/* The VHD inside a chain member the inspector opened (never raw: open_top
 * takes VHDs only, and only cat reads the parents). */
static const struct vhd_image *vimg(const struct imagefile *m)
{
    return vhd_format_image(m->img);
}

/* ---- I/O helpers ------------------------------------------------------------ */

static int pwrite_full(int fd, const void *buf, size_t len, uint64_t off)
{
    const uint8_t *p = buf;
    while (len) {
        ssize_t n = pwrite(fd, p, len, off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        p += n; off += n; len -= n;
    }
    return 0;
}

static int write_full(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        p += n; len -= n;
    }
    return 0;
}

/* Write buf at off, leaving 4 KiB pieces that are all zero as holes (the
 * output was truncated to its size first, so holes read as zero). */
static int pwrite_sparse(int fd, const uint8_t *buf, size_t len, uint64_t off)
{
    size_t i = 0;
    while (i < len) {
        size_t n = 4096 - (off + i) % 4096;
        if (n > len - i)
            n = len - i;
        size_t j = i + n;
        bool z = is_zero(buf + i, n);
        while (j < len) {               /* extend a run of the same kind */
            size_t m = len - j < 4096 ? len - j : 4096;
            if (is_zero(buf + j, m) != z)
                break;
            j += m;
        }
        if (!z) {
            int r = pwrite_full(fd, buf + i, j - i, off + i);
            if (r < 0)
                return r;
        }
        i = j;
    }
    return 0;
}

/* Decode the whole chain to out_fd (sparse if it is a regular file). */
static int decode_to(struct imagefile *top, int out_fd, bool sparse)
{
    struct nbdf_err err;                /* a VHD's reads break no rule */
    uint8_t *buf = malloc(CHUNK);
    if (!buf)
        return -ENOMEM;
    int r = 0;
    if (sparse && ftruncate(out_fd, top->size) < 0)
        r = -errno;
    for (uint64_t off = 0; r == 0 && off < top->size; off += CHUNK) {
        size_t n = top->size - off < CHUNK ? top->size - off : CHUNK;
        r = imagefile_read(top, off, buf, n, &err);
        if (r == 0)
            r = sparse ? pwrite_sparse(out_fd, buf, n, off)
                       : write_full(out_fd, buf, n);
    }
    free(buf);
    return r;
}

/* ---- stream decode (what the nbd.vhd view does) ------------------------------- */

struct out {
    int fd;
    uint64_t size;                      /* highest byte written */
    bool diff_ok;                       /* output holds the parent already */
};

static int out_begin(void *opaque, const struct nbdf_begin *b)
{
    enum vhd_kind kind = (enum vhd_kind) b->kind;
    uint64_t size = b->size;
    struct out *o = opaque;
    if (kind == VHD_DIFF) {
        if (!o->diff_ok)
            return -EINVAL;
        return 0;
    }
    if (ftruncate(o->fd, 0) < 0 || ftruncate(o->fd, size) < 0)
        return -errno;
    o->size = size;
    return 0;
}

static int out_data(void *opaque, uint64_t off, const void *buf, size_t len)
{
    struct out *o = opaque;
    if (off + len > o->size)
        o->size = off + len;
    return pwrite_full(o->fd, buf, len, off);
}

static int out_zero(void *opaque, uint64_t off, uint64_t len)
{
    struct out *o = opaque;
    static const uint8_t z[65536];
    if (off + len > o->size)
        o->size = off + len;
    if (fallocate(o->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, len) == 0)
        return 0;
    while (len) {
        size_t n = len < sizeof z ? len : sizeof z;
        int r = pwrite_full(o->fd, z, n, off);
        if (r < 0)
            return r;
        off += n; len -= n;
    }
    return 0;
}

static const struct nbdf_sink out_sink = { .begin = out_begin,
                                           .data = out_data,
                                           .zero = out_zero };

/* Feed the file as cp --sparse=auto would: data extents in 128 KiB
 * writes, holes skipped (the decoder sees forward jumps). */
static int feed_file(struct vhd_stream *s, int fd, uint64_t size)
{
    uint8_t *buf = malloc(128 << 10);
    if (!buf)
        return -ENOMEM;
    int r = 0;
    uint64_t pos = 0;
    while (r == 0 && pos < size) {
        off_t d = lseek(fd, pos, SEEK_DATA);
        if (d < 0) {
            r = errno == ENXIO ? 0 : -errno;
            break;
        }
        off_t h = lseek(fd, d, SEEK_HOLE);
        if (h < 0) {
            r = -errno;
            break;
        }
        for (pos = d; r == 0 && pos < (uint64_t) h; ) {
            size_t n = (uint64_t) h - pos < (128 << 10) ? h - pos : 128 << 10;
            r = imagefile_pread(fd, buf, n, pos);
            if (r == 0 && vhd_stream_feed(s, pos, buf, n) < 0)
                r = -EINVAL;
            pos += n;
        }
    }
    if (r == 0 && vhd_stream_position(s) < size &&
        vhd_stream_hole(s, vhd_stream_position(s), size - vhd_stream_position(s)) < 0)
        r = -EINVAL;                    /* the file ends in a hole */
    free(buf);
    return r;
}

static int stream_to(struct imagefile *top, int out_fd, const char *out_path)
{
    struct out o = { out_fd, 0, false };
    if (vhd_image_kind(vimg(top)) == VHD_DIFF) {
        int r = decode_to(top->backing, out_fd, true);
        if (r < 0) {
            imgtool_msg("%s: %s", out_path, strerror(-r));
            return EXIT_USAGE;
        }
        o.size = top->backing->size;
        o.diff_ok = true;
    }
    struct vhd_stream *s;
    if (vhd_stream_new(&out_sink, &o, &s) < 0)
        return EXIT_USAGE;
    int r = feed_file(s, top->fd, top->file_size);
    if (r == 0)
        r = vhd_stream_finish(s) < 0 ? -EINVAL : 0;
    int ret = 0;
    if (r == -EINVAL) {
        imgtool_msg("%s: stream decode: %s", top->path, vhd_stream_error(s));
        ret = EXIT_INVALID;
    } else if (r < 0) {
        imgtool_msg("%s: %s", top->path, strerror(-r));
        ret = EXIT_USAGE;
    } else if (ftruncate(out_fd, top->size) < 0) {
        imgtool_msg("%s: %s", out_path, strerror(errno));
        ret = EXIT_USAGE;
    }
    vhd_stream_free(s);
    return ret;
}

/* ---- commands ---------------------------------------------------------------------- */

static int open_top(const char *path, struct imagefile **m)
{
    struct nbdf_err err = { "" };
    int r = imagefile_open(path, &vhd_format, false, m, &err);
    if (r == 0)
        return 0;
    if (r == -EINVAL)
        imgtool_msg("%s: invalid: %s", path, err.msg);
    else
        imgtool_msg("%s: %s", path, strerror(-r));
    return r == -EINVAL ? EXIT_INVALID : EXIT_USAGE;
}

static const char *kind_name(enum vhd_kind k)
{
    return k == VHD_FIXED ? "fixed" : k == VHD_DYNAMIC ? "dynamic"
                                                       : "differencing";
}

static void print_uuid(const char *label, const uint8_t *u)
{
    printf("%-18s ", label);
    for (int i = 0; i < 16; i++)
        printf("%02x%s", u[i], i == 3 || i == 5 || i == 7 || i == 9 ? "-" : "");
    printf("\n");
}

static void print_time(const char *label, uint32_t t)
{
    time_t u = (time_t) t + VHD_EPOCH_UNIX;
    struct tm tm;
    char buf[64] = "";
    gmtime_r(&u, &tm);
    strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    printf("%-18s %s (%u)\n", label, buf, t);
}

static void print_fourcc(const char *label, const char *c, uint32_t ver)
{
    printf("%-18s \"", label);
    for (int i = 0; i < 4; i++)
        if (c[i] >= 0x20 && c[i] < 0x7f)
            putchar(c[i]);
        else
            printf("\\x%02x", (uint8_t) c[i]);
    printf("\" version 0x%08x\n", ver);
}

static void info_footer(const struct vhd_footer *f)
{
    printf("%-18s %.8s\n", "cookie:", f->cookie);
    printf("%-18s 0x%08x\n", "features:", f->features);
    printf("%-18s 0x%08x\n", "format version:", f->version);
    printf("%-18s 0x%016" PRIx64 "\n", "data offset:", f->data_offset);
    print_time("timestamp:", f->timestamp);
    print_fourcc("creator:", f->creator_app, f->creator_version);
    char os[5] = { f->creator_os >> 24, f->creator_os >> 16, f->creator_os >> 8,
                   f->creator_os, 0 };
    printf("%-18s 0x%08x%s%s%s\n", "creator host OS:", f->creator_os,
           f->creator_os ? " \"" : "", f->creator_os ? os : "",
           f->creator_os ? "\"" : "");
    printf("%-18s %" PRIu64 "\n", "original size:", f->original_size);
    printf("%-18s %" PRIu64 "\n", "current size:", f->current_size);
    uint64_t chs = (uint64_t) f->cylinders * f->heads * f->sectors * 512;
    printf("%-18s %u/%u/%u (C/H/S, %" PRIu64 " bytes)\n", "geometry:",
           f->cylinders, f->heads, f->sectors, chs);
    uint64_t q = vhd_qemu_size(f), q10 = vhd_qemu10_size(f);
    const char *differs = "; differs: qemu needs force_size_calc=current_size";
    printf("%-18s %" PRIu64 " (qemu 9 and older%s)\n", "qemu size:", q,
           q == f->current_size ? "" : differs);
    printf("%-18s %" PRIu64 " (qemu 10 and later%s)\n", "qemu 10 size:", q10,
           q10 == f->current_size ? "" : differs);
    printf("%-18s %u (%s)\n", "disk type:", f->disk_type,
           kind_name(f->disk_type));
    printf("%-18s 0x%08x%s\n", "checksum:", f->checksum,
           f->legacy_checksum ? " (legacy tapdisk rule)" : " (ok)");
    print_uuid("unique id:", f->uuid);
    printf("%-18s %u\n", "saved state:", f->saved_state);
    printf("%-18s %u\n", "hidden:", f->hidden);
}

static const char *plat_name(uint32_t c)
{
    switch (c) {
    case VHD_PLAT_WI2R: return "Wi2r";
    case VHD_PLAT_WI2K: return "Wi2k";
    case VHD_PLAT_W2RU: return "W2ru";
    case VHD_PLAT_W2KU: return "W2ku";
    case VHD_PLAT_MAC: return "Mac ";
    case VHD_PLAT_MACX: return "MacX";
    }
    return "?";
}

static void info_header(const struct imagefile *m)
{
    const struct vhd_header *h = vhd_image_header(vimg(m));
    uint64_t batmap;
    printf("%-18s 0x%016" PRIx64 "\n", "table offset:", h->table_offset);
    printf("%-18s %u (%u needed)\n", "max table entries:", h->max_entries,
           vhd_image_blocks(vimg(m)));
    printf("%-18s %u\n", "block size:", h->block_size);
    printf("%-18s %u of %u\n", "allocated blocks:", vhd_image_allocated(vimg(m)),
           vhd_image_blocks(vimg(m)));
    if (vhd_image_has_batmap(vimg(m), &batmap))
        printf("%-18s map at %" PRIu64 "\n", "batmap:", batmap);
    else
        printf("%-18s none\n", "batmap:");
    if (vhd_image_kind(vimg(m)) != VHD_DIFF)
        return;
    char name[2048];
    print_uuid("parent id:", h->parent_uuid);
    print_time("parent timestamp:", h->parent_timestamp);
    if (vhd_parent_name(h, name, sizeof name) < 0)
        snprintf(name, sizeof name, "(undecodable)");
    printf("%-18s %s\n", "parent name:", name);
    for (int i = 0; i < 8; i++) {
        const struct vhd_locator *l = &h->loc[i];
        size_t len;
        const uint8_t *p = vhd_image_locator_payload(vimg(m), i, &len);
        if (l->code == VHD_PLAT_NONE)
            continue;
        struct nbdf_err e = { "" };
        int r = p ? vhd_locator_path(l, p, len, name, sizeof name, &e) : -ENOENT;
        printf("parent locator %d:  %s space %u length %u offset %" PRIu64
               " -> %s%s%s\n", i, plat_name(l->code), l->data_space,
               l->data_length, l->data_offset, r > 0 ? "\"" : "",
               r > 0 ? name : r == -ENOENT ? "(empty)" : e.msg,
               r > 0 ? "\"" : "");
    }
}

static int cmd_info(const char *path)
{
    struct imagefile *m;
    int r = open_top(path, &m);
    if (r)
        return r;
    printf("%-18s %s\n", "file:", path);
    printf("%-18s %" PRIu64 "\n", "file size:", m->file_size);
    printf("%-18s %s\n", "kind:", kind_name(vhd_image_kind(vimg(m))));
    printf("%-18s %" PRIu64 "\n", "virtual size:", m->size);
    info_footer(vhd_image_footer(vimg(m)));
    if (vhd_image_header(vimg(m)))
        info_header(m);
    imagefile_free(m);
    return 0;
}

static void warn_cb(void *opaque, const char *w)
{
    imgtool_msg("%s: warning: %s", (const char *) opaque, w);
}

static int cmd_check(const char *path)
{
    struct imagefile *m;
    int r = open_top(path, &m);
    if (r)
        return r;
    vhd_lint(vhd_image_footer(vimg(m)), vhd_image_header(vimg(m)), warn_cb,
             (void *) path);
    printf("%s: ok (%s, %" PRIu64 " bytes", path,
           kind_name(vhd_image_kind(vimg(m))), m->size);
    if (vhd_image_kind(vimg(m)) != VHD_FIXED)
        printf(", %u of %u blocks allocated", vhd_image_allocated(vimg(m)),
               vhd_image_blocks(vimg(m)));
    printf(")\n");
    imagefile_free(m);
    return 0;
}

static int map_block(struct imagefile *m, uint8_t *bm, uint32_t i)
{
    uint64_t off = vhd_image_block_offset(vimg(m), i);
    uint32_t bs = vhd_image_block_size(vimg(m)), spb = bs / 512, set = 0;
    if (off == VHD_NO_BLOCK)
        return 0;
    int r = imagefile_pread(m->fd, bm, vhd_image_bitmap_bytes(vimg(m)), off);
    if (r < 0)
        return r;
    for (uint32_t j = 0; j < spb; j++)
        set += vhd_bitmap_test(bm, j);
    printf("%8u %16" PRIu64 " %16" PRIu64 " %6u/%u\n", i, (uint64_t) i * bs,
           off, set, spb);
    return 0;
}

static int cmd_map(const char *path)
{
    struct imagefile *m;
    int r = open_top(path, &m);
    if (r)
        return r;
    if (vhd_image_kind(vimg(m)) == VHD_FIXED) {
        printf("fixed: virtual [0, %" PRIu64 ") at file offset 0\n", m->size);
        imagefile_free(m);
        return 0;
    }
    uint8_t *bm = malloc(vhd_image_bitmap_bytes(vimg(m)));
    if (!bm)
        r = -ENOMEM;
    else
        printf("%8s %16s %16s %s\n", "block", "virtual", "file", "sectors");
    for (uint32_t i = 0; r == 0 && i < vhd_image_blocks(vimg(m)); i++)
        r = map_block(m, bm, i);
    free(bm);
    if (r < 0)
        imgtool_msg("%s: %s", path, strerror(-r));
    imagefile_free(m);
    return r < 0 ? EXIT_USAGE : 0;
}

static int cmd_cat(const char *path, const char *out, const char *parent,
                   bool stream)
{
    struct imagefile *m;
    int r = open_top(path, &m);
    if (r)
        return r;
    if (stream && !out) {
        imgtool_msg("cat --stream needs -o OUT (blocks arrive out of order)");
        imagefile_free(m);
        return EXIT_USAGE;
    }
    struct nbdf_err err = { "" };
    if ((r = imagefile_open_chain(m, &parent, parent ? 1 : 0, &err)) < 0) {
        imgtool_msg("%s", err.msg);
        imagefile_free(m);
        return r == -EINVAL ? EXIT_INVALID : EXIT_USAGE;
    }
    int fd = out ? open(out, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)
                 : STDOUT_FILENO;
    if (fd < 0) {
        imgtool_msg("%s: %s", out, strerror(errno));
        imagefile_free(m);
        return EXIT_USAGE;
    }
    struct stat st;
    bool sparse = out && fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    if (stream) {
        r = stream_to(m, fd, out);
    } else {
        r = decode_to(m, fd, sparse);
        if (r < 0)
            imgtool_msg("%s: %s", out ? out : "stdout", strerror(-r));
        r = r < 0 ? EXIT_USAGE : 0;
    }
    if (out && close(fd) < 0 && r == 0) {
        imgtool_msg("%s: %s", out, strerror(errno));
        r = EXIT_USAGE;
    }
    imagefile_free(m);
    return r;
}

/* ---- export: synthesize a dynamic VHD of a raw file ------------------------------ */

static int export_new(const char *raw, const struct stat *st, const char *out,
                      void **s)
{
    struct nbdf_err err = { "" };
    uint8_t uuid[16];

    (void) out;
    uuid_v4(uuid);
    if (vhd_synth_new(st->st_size, uuid, time(NULL) - VHD_EPOCH_UNIX,
                      (struct vhd_synth **) s, &err) < 0) {
        imgtool_msg("%s: %s", raw, err.msg);
        return EXIT_INVALID;
    }
    return 0;
}

IMGTOOL_SYNTH_GLUE(vhd)
static const struct imgtool_synth_ops export_ops = {
    .new_synth = export_new, IMGTOOL_SYNTH_HOOKS(vhd),
};

static int cmd_export(const char *raw, const char *out)
{
    if (!out) {
        imgtool_msg("export needs -o OUT");
        return EXIT_USAGE;
    }
    return imgtool_export(raw, out, &export_ops);
}

/* ---- main --------------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
        "usage: %s info FILE\n"
        "       %s check FILE\n"
        "       %s map FILE\n"
        "       %s cat FILE [-o OUT] [--parent PARENT] [--stream]\n"
        "       %s export RAW -o OUT\n"
        "Exit status: 0 ok, 1 invalid VHD or mismatch, 2 usage or I/O error.\n",
        imgtool_prog, imgtool_prog, imgtool_prog, imgtool_prog, imgtool_prog);
}

int main(int argc, char **argv)
{
    imgtool_prog = "nbdferry-vhd";
    static const struct option opts[] = {
        { "output", required_argument, NULL, 'o' },
        { "parent", required_argument, NULL, 'p' },
        { "stream", no_argument, NULL, 's' },
        { "help", no_argument, NULL, 'h' },
        { "version", no_argument, NULL, 'V' },
        { "long-options", no_argument, NULL, 256 },
        { "short-options", no_argument, NULL, 257 },
        { NULL, 0, NULL, 0 },
    };
    static const char short_opts[] = "o:p:hV";
    const char *out = NULL, *parent = NULL;
    bool stream = false;
    int c;
    /* GNU getopt permutes: options may come before or after COMMAND FILE. */
    while ((c = getopt_long(argc, argv, short_opts, opts, NULL)) != -1) {
        switch (c) {
        case 'o': out = optarg; break;
        case 'p': parent = optarg; break;
        case 's': stream = true; break;
        case 'h': usage(stdout); return 0;
        case 'V': printf("%s %s\n", imgtool_prog, PACKAGE_VERSION); return 0;
        case 256: optlist_long(opts); return 0;         /* completion */
        case 257: optlist_short(short_opts); return 0;
        default: usage(stderr); return EXIT_USAGE;
        }
    }
    if (argc - optind != 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    const char *cmd = argv[optind], *file = argv[optind + 1];
    bool extra = out || parent || stream;
    if (strcmp(cmd, "cat") == 0)
        return cmd_cat(file, out, parent, stream);
    if (strcmp(cmd, "export") == 0 && !parent && !stream)
        return cmd_export(file, out);
    if (extra) {
        usage(stderr);
        return EXIT_USAGE;
    }
    if (strcmp(cmd, "info") == 0)
        return cmd_info(file);
    if (strcmp(cmd, "check") == 0)
        return cmd_check(file);
    if (strcmp(cmd, "map") == 0)
        return cmd_map(file);
    usage(stderr);
    return EXIT_USAGE;
}
