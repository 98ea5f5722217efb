/* fs/fs.h: the daemon's FUSE side.  The only place that includes
 * fuse_lowlevel.h. */
#pragma once
#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "transport/readahead.h"
#include "transport/nbdx.h"
#include "transport/pool.h"

/* Inodes.  Each disk has FS_INO_COUNT numbers: disk i's view in slot s
 * (enum fs_ino) is inode i * FS_INO_COUNT + s, so disk 0's are the
 * numbers a single-disk mount always had; the root and the status file
 * are the mount's (disk 0's slots). */
enum fs_ino {
    FS_INO_ROOT = 1,
    FS_INO_RAW = 2,           /* the export as a raw file ("nbd") */
    FS_INO_STATUS = 3,        /* ".nbdferry-status", JSON */
    FS_INO_VHD = 4,           /* FILENAME.vhd: the disk as a VHD */
    FS_INO_VMDK = 5,          /* FILENAME.vmdk: the disk as a VMDK */
    FS_INO_QCOW2 = 6,         /* FILENAME.qcow2: the disk as a qcow2 */
    FS_INO_VHDX = 7,          /* FILENAME.vhdx: the disk as a VHDX */
    FS_INO_COUNT              /* the view table (fs->views) has this many */
};

static inline unsigned fs_ino_slot(uint64_t ino)
{
    return (unsigned) (ino % FS_INO_COUNT);
}

static inline unsigned fs_ino_disk(uint64_t ino)
{
    return (unsigned) (ino / FS_INO_COUNT);
}

static inline uint64_t fs_ino_of(unsigned disk, unsigned slot)
{
    return (uint64_t) disk * FS_INO_COUNT + slot;
}

#define FS_STATUS_NAME ".nbdferry-status"

struct tcpinfo_sampler;
struct readahead;
struct ra_stream;
struct fs;

/* The times the raw file and every view of its disk show (fs/rawfile.c,
 * THE TIMES). */
struct fs_times {
    struct timespec mtime;    /* 0 (the epoch) until a change or a set */
    struct timespec atime;
    struct timespec ctime;
    bool set;                 /* mtime is one utimensat(2) set and no
                               * change of the disk came after it */
};

/* The mount's configuration: set before the mount, never changed after
 * (read without a lock by every thread). */
struct fs_config {
    bool allow_other;         /* -o allow_other: the directory is 0755 */
    bool vhd_fixed;           /* --vhd-fixed: FILENAME.vhd takes fixed VHDs */
    bool raw_images;          /* --raw-images: the raw file takes an image
                               * file's bytes (fs/foreign.h) */
    const char *mountpoint;   /* as given, for messages naming its files */
    const char *spool_dir;    /* --spool-dir (views/spool.h); NULL: $TMPDIR */
    uint64_t spool_max;       /* --spool-max: bytes a view may spool */
    unsigned qcow2_cluster_bits;  /* --qcow2-cluster-size: the clusters of
                                   * the qcow2 that reading nbd.qcow2 gives */
#define FS_QCOW2_CLUSTER_BITS_DEFAULT 16  /* 64 KiB, qemu's default */
    bool file_mode;           /* the disk is the mount's root (fs/modes.c) */
    bool block_device;        /* -o block_device: O_TRUNC, truncate ignored */
    bool multiwriter;         /* -o multiwriter: several writers at once
                               * (fs/writers.c) */
    bool fuse_io_uring;       /* --fuse-io-uring, and the build and the
                               * kernel allow it: libfuse serves the
                               * mount over io_uring (daemon/fuseuring.c) */
    uid_t uid;
    gid_t gid;
    struct timespec started;  /* the directory's times */
};

/* One disk: an export, its connections, pool and watchers, and the files
 * that show it (the raw file and its views).  Everything a view or the
 * raw-file module works on. */
struct fs_disk {
    struct fs *fs;            /* the mount (its lock, its handles) */
    const struct fs_config *cfg;  /* &fs->cfg */
    unsigned index;           /* in fs->disks[]: its inodes (fs_ino_of) */
    const char *filename;     /* the raw file's name; the views add a
                               * suffix */
    struct nbdx *x;
    struct tcpinfo_sampler *tcp;  /* TCP connections only, else NULL */
    /* Per view (fs/view.h), by slot: its name, its state (its own). */
    char *view_name[FS_INO_COUNT];
    void *view_state[FS_INO_COUNT];
    struct pool *pool;
    struct readahead *ra;     /* transport/readahead.c: shared by the handles */
    uint64_t export_size;
    bool readonly;
    bool foreign_warned;      /* fs/foreign.c: this copy's header warned
                               * about; __atomic builtins */

    /* The raw file's size, times and size lock belong to fs/rawfile.c:
     * everything else reads them through rawfile_size(),
     * rawfile_stat() and rawfile_changes().
     *
     * Writes and punches (of the raw file and of the views) hold the size
     * lock shared from their size check until the size they extend is
     * set; truncates and a view replacing the disk hold it exclusive from
     * the new size until the cut-off bytes are pending zero.  So a write lands
     * wholly before or wholly after a truncate, never between its two
     * steps (which left the size grown and the bytes zeroed).  The
     * kernel serializes writes and truncates of one inode today
     * (i_rwsem); this keeps the rule where it does not (parallel direct
     * writes). */
    pthread_rwlock_t size_lock;
    /* Under fs->lock: */
    uint64_t apparent_size;   /* the raw file's size; every byte beyond it
                               * is pending or known zero on the disk */
    struct fs_times times;
    uint64_t changes;         /* counts the changes of the disk's size or
                               * bytes (never of its times alone) */
    uint64_t pass_fh;         /* the serial of the handle whose copy the
                               * progress counts (fs/rawfile.c) */
    /* The deferred truncate (fs/rawfile.c, THE DEFERRED TRUNCATE):
     * written under size_lock exclusive; trunc_owner, the serial of the
     * handle whose truncate the disk has not seen yet (0: none), is also
     * read with __atomic builtins to skip the lock when it is 0. */
    uint64_t trunc_owner;
    uint64_t trunc_old;       /* the size the disk still holds */
    struct fs_times trunc_times;  /* the times before the truncate */
    bool trunc_failed;        /* a request through the owner failed:
                               * its close drops the truncate; __atomic */
    /* Changes of the disk (its bytes, its size) begun and done: a view
     * reader's snapshot holds while begun stays (fs/rawfile.c, THE
     * CHANGE COUNT); __atomic builtins. */
    uint64_t changes_begun, changes_done;

    /* The receive loop's landing (fs/rawfile.c, rawfile_land_*()): used
     * by the loop's receiving thread only.  land_next: where the last
     * write to the raw file ended, whoever served it (the next
     * sequential write's offset); land_skip: the last write that arrived
     * was to another view, which never lands (not worth preparing);
     * land_jumped: the last write did not start where the one before it
     * ended; land_whole: so the next landing is a whole buffer, not a
     * tail (it or the write before it jumped);
     * land_streak: the last request was a write that landed, so the
     * next is likely one too and may wait for a buffer before it is
     * read, as it would after. */
    struct pool_landing land;
    bool land_streak;         /* the last request was a landed write */
    uint64_t land_next;       /* __atomic builtins */
    bool land_skip;           /* __atomic builtins */
    bool land_jumped;         /* __atomic builtins */
    bool land_whole;          /* __atomic builtins */
    /* A read the receiving thread served from arrived read-ahead chunks
     * (fs/rawview.c, raw_read_ready()): the spans it holds until the
     * reply is written.  The receiving thread's only. */
    struct ra_span ready_span[RA_SPANS];
    unsigned ready_n;

    /* Set before the mount, freed after it; each has its own lock. */
    struct digest *digest;    /* digest/digest.c; NULL with --no-digest */
    struct readback *readback;/* fs/readback.c; NULL unless asked for */
    struct progress *progress;/* fs/progress.c: pass, samples, bar */
    struct warm *warm;        /* fs/warm.c: the manifest; NULL when off.
                               * Set before the mount, cleared after the
                               * final flush; __atomic (the pool's
                               * on_durable reads it) */
};

/* Every handle between open and release, under fs->lock. */
struct fs_handles {
    struct fs_fh *open_files;
    pthread_cond_t released;  /* a handle left open_files (fs/writers.h);
                               * CLOCK_MONOTONIC (mono_cond_init) */
    uint64_t fh_serial;       /* the last handle's serial */
};

/* The mount: its configuration, its disks, its handles. */
struct fs_view;

struct fs {
    struct fs_config cfg;
    /* The files of each disk by slot (fs/view.h), the daemon's table
     * (daemon/viewtable.c): the mount reaches up for no global. */
    const struct fs_view *const *views;
    pthread_mutex_t lock;     /* protects the handles and each disk's
                               * fields marked so */
    struct fs_handles h;
    struct fs_disk *disks;    /* ndisks of them, from index 0 */
    unsigned ndisks;
    /* The receive loop's (fs/landing.c, fs_landing()): the disk to
     * prepare the next buffer in, the disk whose pool holds the prepared
     * one, the disk a ready read was served from.  The receiving
     * thread's only. */
    struct fs_disk *land_disk;
    struct fs_disk *land_cur;
    struct fs_disk *ready_disk;
    /* A request arrived through FUSE's io_uring (fs/ops.c: op_open()):
     * the status says which transport serves the mount.  __atomic
     * builtins. */
    bool uring_seen;
};

/* The disk an inode belongs to, or NULL. */
static inline struct fs_disk *fs_disk_of(struct fs *fs, uint64_t ino)
{
    unsigned i = fs_ino_disk(ino);
    return i < fs->ndisks ? &fs->disks[i] : NULL;
}

/* One open file. */
struct fs_fh {
    enum fs_ino ino;          /* the view's slot (not the inode number) */
    struct fs_disk *disk;     /* the disk it shows */
    bool writer;              /* opened for writing */
    bool trunc;               /* opened for writing with O_TRUNC: a
                               * copy replacing the file (fs/writers.c) */
    bool wrote;               /* changed the file (write, truncate, zero):
                               * only then does its close drain the pool.
                               * Set and read with __atomic builtins. */
    bool wrote_data;          /* wrote bytes (write, fallocate), not only
                               * truncated: its close carries out its
                               * deferred truncate even with a manifest
                               * (fs/rawfile.c); __atomic builtins */
    uint64_t err_seq;         /* last pool error this handle was told of */
    uint64_t serial;          /* unique per mount, from 1 */
    /* Who opened it (fs/writers.c): the thread group of the request's
     * pid and its command, from /proc at open; 0 and "?" when the
     * daemon cannot see them (another PID namespace). */
    pid_t tgid;
    char comm[16];
    bool trunc_kept;          /* its close kept its truncate deferred
                               * (fs/rawfile.c, warm_keeps_truncate()):
                               * its release carries it out */
    bool idle;                /* a writer closed (flush) since it last
                               * changed the file; __atomic builtins */
    uint64_t copy_end;        /* where this writer's copy ends, if known:
                               * its raw source's size (or a qcow2
                               * source's disk size), or the size it set
                               * the file to; 0: unknown.  A write or
                               * zeroing reaching it is answered only once
                               * everything before it is acknowledged
                               * (fs/ops.c, ends_copy()); __atomic */
    int refused;              /* positive errno every change through this
                               * handle fails with (a source larger than
                               * the export: ENOSPC, set at open; an image
                               * file written into the raw file:
                               * EMEDIUMTYPE, fs/foreign.h), else 0;
                               * __atomic builtins */
    uint64_t snapshot;        /* a format view's reader: the disk's
                               * change count its reads must still see
                               * (views/imageview.c, THE SNAPSHOT) */
    bool snapshot_lost;       /* ... and it moved: every read fails;
                               * __atomic builtins */
    void *view_data;          /* the view's, from its open to its release
                               * (the status text, a frozen VHD, ...) */
    struct ra_stream *ra;     /* FS_INO_RAW, FS_INO_VHD: read-ahead */
    struct fs_fh *prev, *next;/* fs->h.open_files, under fs->lock */
};

extern const struct fuse_lowlevel_ops fs_ops;

/* Requests carry at most this much payload (fs/ops.c asks the kernel). */
#define FS_MAX_WRITE (1u << 20)

/* fs/modes.c: fs_ops with file mode and block-device semantics layered
 * on (each a no-op unless its flag in struct fs is set). */
void fs_mode_ops(struct fuse_lowlevel_ops *out);

/* Free the handles still open when the session ends (the kernel sends no
 * release for them after SIGTERM or a lazy unmount). */
void fs_close_all(struct fs *fs);

/* fs/status.c: the status document, JSON, malloc'd. */
char *fs_status_json(struct fs *fs, size_t *len);
