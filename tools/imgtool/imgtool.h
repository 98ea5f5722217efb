/* tools/imgtool/imgtool.h: what the image inspectors (nbdferry-vhdx, and
 * the VHD and VMDK ones as they move here) share: reading a whole input
 * (a file or standard input), writing decoded disk bytes to a file
 * (sparse, any order) or a pipe (in order, holes as zeros), and reading a
 * raw file for an export.  Functions return 0 or -errno; messages go to
 * stderr prefixed with the program's name (imgtool_prog). */
#ifndef NBDFERRY_IMGTOOL_H
#define NBDFERRY_IMGTOOL_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#define IMGTOOL_EXIT_INVALID 1          /* the image is not valid */
#define IMGTOOL_EXIT_USAGE   2          /* usage or I/O error */
#define IMGTOOL_CHUNK        (1u << 20)

/* The program's name in messages: each inspector's main() sets it
 * first (IMGTOOL_PROGRAM does, from IMGTOOL_PROG). */
extern const char *imgtool_prog;

void imgtool_msg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* "-" is standard input.  -1 (and a message) on failure. */
int imgtool_open_in(const char *path);

/* read() until len bytes or end of input: the count, or -errno. */
ssize_t imgtool_read_full(int fd, void *buf, size_t len);

/* Read fd (the input named path) to its end in IMGTOOL_CHUNK pieces and
 * feed(s, off, buf, n) each to a stream decoder: 0, the first negative
 * feed() result, or IMGTOOL_EXIT_USAGE after a message (out of memory,
 * or the input cannot be read). */
int imgtool_feed(int fd, const char *path,
                 int (*feed)(void *s, uint64_t off, const void *buf,
                             size_t len),
                 void *s);

/* pread() exactly len bytes: 0, -errno, or -EIO at end of file. */
int imgtool_pread_full(int fd, void *buf, size_t len, uint64_t off);

/* Decoded disk bytes out.  A seekable output takes writes anywhere and
 * skips all-zero ones (holes stay holes); a pipe takes them in disk order
 * only (-ESPIPE otherwise, with a message), with the gaps as zeros. */
struct imgtool_out {
    int fd;                             /* -1: discard */
    const char *name;
    bool seekable;
    uint64_t pos;                       /* pipe: bytes written */
};
int  imgtool_out_open(struct imgtool_out *o, const char *path);   /* NULL: stdout */
int  imgtool_out_write(struct imgtool_out *o, uint64_t off, const void *buf,
                       size_t len);
/* Make the output size bytes long (the disk's size) and close it. */
int  imgtool_out_finish(struct imgtool_out *o, uint64_t size);
/* The end of a cat: r 0 and the disk's size known (size non-NULL):
 * finish; else just close.  r, or IMGTOOL_EXIT_USAGE if finishing
 * failed. */
int  imgtool_out_end(struct imgtool_out *o, int r, const uint64_t *size);

/* The data ranges of a raw file (SEEK_DATA/SEEK_HOLE), for an export's
 * allocation: calls add(opaque, off, len) for each. */
int imgtool_data_ranges(int fd, uint64_t size,
                        int (*add)(void *opaque, uint64_t off, uint64_t len),
                        void *opaque);
/* A read_disk callback over a raw file's descriptor (opaque: int *). */
int imgtool_raw_read(void *opaque, uint64_t off, void *buf, size_t len);

/* "512M", "1G": a byte count with an optional K, M, G or T suffix. */
int imgtool_parse_size(const char *s, uint64_t *out);

/* The export verb: a raw file as an image of the format, through its
 * library's synthesizer (its data ranges allocated, its holes not
 * stored). */
struct imgtool_synth_ops {
    /* Make the synthesizer for the raw file (st: its fstat; out: the
     * output's path): 0, or an exit status after a message. */
    int  (*new_synth)(const char *raw, const struct stat *st, const char *out,
                      void **s);
    int  (*allocate)(void *s, uint64_t off, uint64_t len);
    int  (*seal)(void *s);
    int64_t (*read)(void *s, uint64_t off, void *buf, size_t len, int *fd);
    uint64_t (*file_size)(const void *s);
    void (*free)(void *s);
};
/* The hooks but new_synth of a library P with P_synth_allocate, _seal,
 * _read, _file_size and _free; IMGTOOL_SYNTH_HOOKS(P) names them. */
#define IMGTOOL_SYNTH_GLUE(P)                                                \
    static int P##_x_allocate(void *s, uint64_t o, uint64_t n)               \
    {                                                                        \
        return P##_synth_allocate(s, o, n);                                  \
    }                                                                        \
    static int P##_x_seal(void *s) { return P##_synth_seal(s); }             \
    static int64_t P##_x_read(void *s, uint64_t o, void *b, size_t n, int *fd)\
    {                                                                        \
        return P##_synth_read(s, o, b, n, imgtool_raw_read, fd);             \
    }                                                                        \
    static uint64_t P##_x_size(const void *s) { return P##_synth_file_size(s); }\
    static void P##_x_free(void *s) { P##_synth_free(s); }
#define IMGTOOL_SYNTH_HOOKS(P)                                               \
    .allocate = P##_x_allocate, .seal = P##_x_seal, .read = P##_x_read,      \
    .file_size = P##_x_size, .free = P##_x_free
/* RAW ("-": standard input) to OUT: 0 or an exit status (messages
 * printed). */
int imgtool_export(const char *raw, const char *out,
                   const struct imgtool_synth_ops *ops);

/* An inspector's command line: PROG info|check|map FILE, cat FILE [-o
 * OUT], export RAW -o OUT, --help, --version and the completion lists;
 * with spool, --spool-max SIZE into imgtool_spool_max (default 1 GiB).
 * Each verb returns 0 or the exit status. */
struct imgtool_verbs {
    const char *what;             /* "VMDK": "1 invalid VMDK" in --help */
    bool spool;
    bool cluster_size;            /* --cluster-size SIZE for export */
    int (*info)(const char *file);
    int (*check)(const char *file);
    int (*map)(const char *file);
    int (*cat)(const char *file, const char *out);
    const struct imgtool_synth_ops *export;
};
extern uint64_t imgtool_spool_max;
/* With cluster_size: the export's cluster size given, a power of two from
 * 512 to 2M, or 0 (the format's default). */
extern uint64_t imgtool_cluster_size;
int imgtool_main(int argc, char **argv, const struct imgtool_verbs *v);

/* An inspector's main() over library P: the verbs cmd_info, cmd_check,
 * cmd_map and cmd_cat of the including file, export through P's
 * synthesizer made by new_synth_ (see struct imgtool_synth_ops). */
#define IMGTOOL_PROGRAM(P, what_, spool_, new_synth_)                        \
    IMGTOOL_PROGRAM_OPTS(P, what_, spool_, false, new_synth_)
/* The same, with cluster_ saying whether export takes --cluster-size. */
#define IMGTOOL_PROGRAM_OPTS(P, what_, spool_, cluster_, new_synth_)         \
    IMGTOOL_SYNTH_GLUE(P)                                                    \
    static const struct imgtool_synth_ops P##_export_ops = {                 \
        .new_synth = new_synth_, IMGTOOL_SYNTH_HOOKS(P),                     \
    };                                                                       \
    static const struct imgtool_verbs P##_verbs = {                          \
        .what = what_, .spool = spool_, .cluster_size = cluster_,           \
        .info = cmd_info,                                                    \
        .check = cmd_check, .map = cmd_map, .cat = cmd_cat,                  \
        .export = &P##_export_ops,                                           \
    };                                                                       \
    int main(int argc, char **argv)                                          \
    {                                                                        \
        imgtool_prog = IMGTOOL_PROG;                                         \
        return imgtool_main(argc, argv, &P##_verbs);                         \
    }

#endif /* NBDFERRY_IMGTOOL_H */
