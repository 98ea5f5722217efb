/* fs/writers.c: no second writer beside a copy that replaces the disk
 * (fs/writers.h). */
#include "fs/writers.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* The thread group of pid (a thread id, as FUSE requests carry), or 0. */
static pid_t proc_tgid(pid_t pid)
{
    char path[64], line[128];
    int tgid = 0;

    snprintf(path, sizeof path, "/proc/%d/status", (int) pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Tgid: %d", &tgid) == 1)
            break;
    fclose(f);
    return (pid_t) tgid;
}

static void proc_comm(pid_t pid, char *out, size_t n)
{
    char path[64];

    snprintf(out, n, "?");
    snprintf(path, sizeof path, "/proc/%d/comm", (int) pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return;
    if (fgets(out, (int) n, f))
        out[strcspn(out, "\n")] = '\0';
    else
        snprintf(out, n, "?");
    fclose(f);
}

void writers_identify(struct fs_fh *fh, pid_t pid)
{
    fh->tgid = pid > 0 ? proc_tgid(pid) : 0;
    proc_comm(fh->tgid, fh->comm, sizeof fh->comm);
}

/* Gone: no /proc entry, or a zombie (exited, not yet reaped). */
static bool process_gone(pid_t tgid)
{
    char path[64], line[256];

    snprintf(path, sizeof path, "/proc/%d/stat", (int) tgid);
    FILE *f = fopen(path, "re");
    if (!f)
        return errno == ENOENT;
    bool gone = false;
    if (fgets(line, sizeof line, f)) {
        const char *p = strrchr(line, ')');   /* comm may hold spaces */
        gone = p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
    }
    fclose(f);
    return gone;
}

static bool closed(const struct fs_fh *o)
{
    return __atomic_load_n(&o->idle, __ATOMIC_RELAXED);
}

/* o's copy is over: closed, nothing written since, its process gone. */
static bool finished(const struct fs_fh *o)
{
    return closed(o) && o->tgid > 0 && process_gone(o->tgid);
}

/* A writer that replaces the disk's content: one opened with O_TRUNC
 * (cp, dd without conv=notrunc, a shell's >), or any writer of a format
 * view (its image replaces the disk).  Beside it, another writer is a
 * mistake for certain; writers of the raw file that do not truncate may
 * be writing disjoint ranges (dd conv=notrunc seek=...). */
static bool replaces(const struct fs_fh *o)
{
    return o->trunc || o->ino != FS_INO_RAW;
}

static void say_busy(const struct fs_fh *fh, const struct fs_fh *o,
                     struct nbdf_err *why)
{
    nbdf_errf(why, -EBUSY, "%s: a second writer refused: pid %d (%s) opens %s "
             "for writing%s while pid %d (%s) has %s open for writing%s; "
             "beside O_TRUNC or a view, one writer at a time (-o multiwriter "
             "allows several)", fh->disk->view_name[fh->ino],
             (int) fh->tgid, fh->comm, fh->disk->view_name[fh->ino],
             fh->trunc ? " with O_TRUNC" : "", (int) o->tgid, o->comm,
             o->disk->view_name[o->ino], o->trunc ? " with O_TRUNC" : "");
}

int writers_admit_locked(struct fs *fs, const struct fs_fh *fh,
                         struct nbdf_err *why)
{
    int r = 0;

    if (fs->cfg.multiwriter)
        return 0;
    for (const struct fs_fh *o = fs->h.open_files; o; o = o->next) {
        if (o == fh || !o->writer || o->disk != fh->disk)
            continue;                 /* writers of this disk */
        if (!replaces(fh) && !replaces(o))
            continue;                 /* parallel writers in place */
        if (fh->tgid > 0 && o->tgid == fh->tgid)
            continue;                 /* one process: one copy */
        if (finished(o))
            continue;                 /* only its release is late */
        say_busy(fh, o, why);
        if (!closed(o))
            return -EBUSY;
        r = -EAGAIN;                  /* its release may be on its way */
    }
    return r;
}
