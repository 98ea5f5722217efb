/* daemon/verdict.c: the verdict file between the daemon and `nbdferry
 * --unmount` (daemon/verdict.h).
 *
 * THREAD MODEL: none.  The daemon writes at exit, after the session loop
 * and the final flush, on the main thread; the unmounter is a process of
 * its own. */
#include "daemon/verdict.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdbool.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "digest/digest.h"
#include "fs/fs.h"
#include "fs/rawfile.h"

#define VERDICT_MAX (64u << 10)

/* ---- the run directory -------------------------------------------------- */

static void dir_path(char *path, size_t n)
{
    const char *xdg = getenv("XDG_RUNTIME_DIR");

    if (geteuid() == 0)
        snprintf(path, n, "/run/nbdferry");
    else if (xdg && xdg[0] == '/')
        snprintf(path, n, "%s/nbdferry", xdg);
    else
        snprintf(path, n, "/tmp/nbdferry-%u", (unsigned) geteuid());
}

/* The run directory, opened; create: make it if missing.  -errno, with
 * why (a directory someone else owns or may write is never used). */
static int dir_open(bool create, char *path, size_t n, const char **why)
{
    struct stat st;

    dir_path(path, n);
    if (create && mkdir(path, 0700) == -1 && errno != EEXIST) {
        *why = "cannot create it";
        return -errno;
    }
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd == -1) {
        *why = "cannot open it";
        return -errno;
    }
    if (fstat(fd, &st) == -1 || st.st_uid != geteuid() ||
        (st.st_mode & 022)) {
        close(fd);
        *why = "it is not a directory of ours that only we may write";
        return -EPERM;
    }
    return fd;
}

/* A regular file of ours with one link, opened without following a link
 * (O_NONBLOCK: a planted FIFO does not hang us). */
static int open_file(int dfd, const char *name, int flags)
{
    struct stat st;
    int fd = openat(dfd, name, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
                    0600);

    if (fd == -1)
        return -errno;
    if (fstat(fd, &st) == -1 || !S_ISREG(st.st_mode) ||
        st.st_uid != geteuid() || st.st_nlink != 1) {
        close(fd);
        return -EPERM;
    }
    return fd;
}

/* ---- the daemon's side ------------------------------------------------- */

/* A failed copy's digest is of what was written, not of what the disk
 * holds: it is no result, and not printed like one. */
static void put_digest(FILE *f, struct fs_disk *d, int ds)
{
    struct digest_info di;

    if (!d->digest)
        return;
    if (ds != 0) {
        fprintf(f, "digest: none (the copy failed)\n");
        return;
    }
    digest_settle(d->digest, 10);
    digest_get(d->digest, rawfile_size(d), &di);
    if (di.state == DIGEST_COMPLETE)
        fprintf(f, "digest: %s %s of %" PRIu64 " bytes\n", di.algorithm,
                di.hex, di.covered);
    else
        fprintf(f, "digest: %s %s%s%s\n", di.algorithm,
                digest_state_name(di.state), di.reason[0] ? ": " : "",
                di.reason);
}

/* The disk's failed requests; with log, the recent log lines too (once,
 * after the last disk: they are the mount's and name their disk). */
static void put_failures(FILE *f, const struct pool_stats *st, bool log)
{
    struct log_entry recent[LOG_RECENT];
    uint64_t errors, warnings;
    unsigned n = log ? log_recent(recent, &errors, &warnings) : 0;

    for (unsigned i = 0; i < st->nfailures; i++)
        fprintf(f, "failed: %s of %" PRIu64 " bytes at offset %" PRIu64
                ": %s\n", pool_kind_name(st->failures[i].kind),
                st->failures[i].len, st->failures[i].off,
                strerror(st->failures[i].err));
    for (unsigned i = 0; i < n; i++)
        fprintf(f, "%s: %s%s\n", recent[i].error ? "error" : "warning",
                recent[i].msg, recent[i].repeated > 1 ? " (repeated)" : "");
}

/* Disk d's lines: its verdict, its failed requests, with recent the
 * mount's recent log lines, its digest. */
static void put_disk(FILE *f, struct fs_disk *d, int ds, bool recent)
{
    struct pool_stats st;

    pool_get_stats(d->pool, &st);
    fprintf(f, "%s: %s: %" PRIu64 " bytes written, %" PRIu64
            " acknowledged by the server, %" PRIu64 " request(s) "
            "failed; final flush %s\n", d->filename,
            ds == 0 ? "ok" : "FAILED", st.bytes_written, st.bytes_acked,
            st.errors, ds == 0 ? "done" : "or check failed");
    put_failures(f, &st, recent);
    put_digest(f, d, ds);
}

/* The text the unmounter prints, "exit N" first (with_exit). */
static char *verdict_text(struct fs *fs, int status, const int *disk_status,
                          bool with_exit, size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);

    if (!f)
        return NULL;
    if (with_exit)
        fprintf(f, "exit %d\n", status);
    for (unsigned i = 0; i < fs->ndisks; i++)
        put_disk(f, &fs->disks[i], disk_status ? disk_status[i] : status,
                 with_exit && i + 1 == fs->ndisks);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

void verdict_log(struct fs *fs, int status, const int *disk_status)
{
    size_t len;
    char *text = verdict_text(fs, status, disk_status, false, &len);
    unsigned n = 0;

    if (!text) {
        log_err("the verdict: out of memory (the exit status is %d)", status);
        return;
    }
    /* Each line a call site of its own: the log's rate limit must not
     * hold back a verdict line (common/log.h); up to 16 failures. */
    char disk[64] = "";
    for (char *line = text, *nl; *line; line = nl + 1, n++) {
        nl = strchr(line, '\n');
        *nl = '\0';
        /* A failed request's line names its disk, as the log's do. */
        bool failure = strncmp(line, "failed: ", 8) == 0;
        const char *colon = strchr(line, ':');
        if (!failure && colon && (size_t) (colon - line) < sizeof disk)
            snprintf(disk, sizeof disk, "%.*s: ", (int) (colon - line), line);
        log_notice_site(text + n, "verdict: %s%s", failure ? disk : "", line);
    }
    free(text);
}

void verdict_write(struct fs *fs, int status, const int *disk_status)
{
    char dir[PATH_MAX], name[32];
    const char *why = "";
    size_t len;
    int dfd = dir_open(false, dir, sizeof dir, &why);

    if (dfd < 0)
        return;                       /* nobody made it: nobody asked */
    snprintf(name, sizeof name, "verdict.%ld", (long) getpid());
    int fd = open_file(dfd, name, O_WRONLY);
    close(dfd);
    if (fd < 0) {
        if (fd != -ENOENT)
            log_notice("verdict %s/%s: %s", dir, name, strerror(-fd));
        return;
    }
    char *text = verdict_text(fs, status, disk_status, true, &len);
    if (!text || ftruncate(fd, 0) == -1 ||
        write(fd, text, len) != (ssize_t) len)
        log_notice("verdict %s/%s: %s", dir, name,
                   text ? strerror(errno) : "out of memory");
    free(text);
    close(fd);
}

/* ---- the unmounter ------------------------------------------------------ */

/* The daemon's pid, from its pidfile if given, else from the mount's
 * status file.  -errno (logged). */
static int daemon_pid(const char *mp, const char *pidfile, pid_t *pid)
{
    char path[PATH_MAX], buf[512];
    if (pidfile)
        snprintf(path, sizeof path, "%s", pidfile);
    else
        snprintf(path, sizeof path, "%s/%s", mp, FS_STATUS_NAME);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof buf - 1);
    int err = errno;

    if (fd >= 0)
        close(fd);
    if (n < 0) {
        fprintf(stderr, "nbdferry: %s: %s (is %s an nbdferry mount?%s)\n",
                path, strerror(err), mp, pidfile ? ""
                : " A file-mode mount has no status: give its -P PIDFILE");
        return -err;
    }
    buf[n] = '\0';
    const char *p = pidfile ? buf : strstr(buf, "\"pid\": ");
    long v = p ? strtol(p + (pidfile ? 0 : 7), NULL, 10) : 0;
    if (v <= 0) {
        fprintf(stderr, "nbdferry: %s names no daemon pid (an older "
                "nbdferry?): unmount with fusermount3 -u\n", path);
        return -EINVAL;
    }
    *pid = (pid_t) v;
    return 0;
}

/* Gone, or a zombie (a foreground daemon whose parent has not reaped it
 * yet has exited all the same). */
static bool exited(pid_t pid)
{
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%ld/stat", (long) pid);
    FILE *f = fopen(path, "re");

    if (!f)
        return kill(pid, 0) == -1 && errno == ESRCH;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return p && (p[2] == 'Z' || p[2] == 'X');
}

static int run_fusermount(const char *mp)
{
    pid_t c = fork();
    int ws;

    if (c == -1)
        return -errno;
    if (c == 0) {
        execlp("fusermount3", "fusermount3", "-u", mp, (char *) NULL);
        fprintf(stderr, "nbdferry: fusermount3: %s\n", strerror(errno));
        _exit(127);
    }
    if (waitpid(c, &ws, 0) == -1)
        return -errno;
    return WIFEXITED(ws) && WEXITSTATUS(ws) == 0 ? 0 : -EBUSY;
}

static void wait_exit(pid_t pid)
{
    struct timespec t = { 0, 20 * 1000 * 1000 };
    bool said = false;

    for (unsigned i = 0; !exited(pid); i++) {
        if (i == 50 && !said) {       /* a second: the flush takes time */
            fprintf(stderr, "nbdferry: waiting for the daemon (pid %ld) to "
                    "drain its writes and flush the server\n", (long) pid);
            said = true;
        }
        nanosleep(&t, NULL);
    }
}

/* fd of pid (a /proc/PID/fd entry): opened for writing? */
static bool fd_writes(const char *pid, const char *fd)
{
    char path[600], line[128];
    unsigned flags = 0;
    bool found = false;

    snprintf(path, sizeof path, "/proc/%s/fdinfo/%s", pid, fd);
    FILE *f = fopen(path, "re");
    if (!f)
        return false;
    while (!found && fgets(line, sizeof line, f))
        found = sscanf(line, "flags: %o", &flags) == 1;
    fclose(f);
    return found && (flags & O_ACCMODE) != O_RDONLY;
}

/* One line per process with a file of the mount open (the writers
 * first), as fuser(1) would find them: whom to wait for.  Up to 8. */
static void name_users(const char *mp)
{
    char real[PATH_MAX], dir[300], link[600], target[PATH_MAX];
    unsigned said = 0;

    struct stat mst, fst;
    if (!realpath(mp, real))
        snprintf(real, sizeof real, "%s", mp);
    size_t rl = strlen(real);
    /* The mount's filesystem: an fd on the directory under it (the
     * daemon's own pin of its mountpoint) is nobody's use of the mount. */
    bool have_dev = stat(real, &mst) == 0;
    for (int pass = 0; pass < 2; pass++) {        /* writers, then readers */
        DIR *proc = opendir("/proc");
        for (struct dirent *p; proc && (p = readdir(proc)) && said < 8;) {
            if (p->d_name[0] < '0' || p->d_name[0] > '9' ||
                atol(p->d_name) == (long) getpid())
                continue;
            snprintf(dir, sizeof dir, "/proc/%s/fd", p->d_name);
            DIR *fds = opendir(dir);
            for (struct dirent *e; fds && (e = readdir(fds));) {
                snprintf(link, sizeof link, "%s/%s", dir, e->d_name);
                ssize_t n = readlink(link, target, sizeof target - 1);
                if (n <= 0)
                    continue;
                target[n] = '\0';
                if (strncmp(target, real, rl) != 0 ||
                    (target[rl] != '/' && target[rl] != '\0'))
                    continue;
                if (have_dev && (stat(link, &fst) != 0 ||
                                 fst.st_dev != mst.st_dev))
                    continue;
                bool w = fd_writes(p->d_name, e->d_name);
                if (w != (pass == 0))
                    continue;
                char comm[64] = "?", cpath[300];
                snprintf(cpath, sizeof cpath, "/proc/%s/comm", p->d_name);
                FILE *c = fopen(cpath, "re");
                if (c) {
                    if (fgets(comm, sizeof comm, c))
                        comm[strcspn(comm, "\n")] = '\0';
                    fclose(c);
                }
                fprintf(stderr, "nbdferry: %s: pid %s (%s) has %s open for "
                        "%s\n", mp, p->d_name, comm, target,
                        w ? "writing: a copy still running?" : "reading");
                said++;
                break;                            /* one line a process */
            }
            if (fds)
                closedir(fds);
        }
        if (proc)
            closedir(proc);
    }
}

/* Print the verdict after "exit N"; returns N, or -1. */
static int print_verdict(int fd)
{
    char *buf = malloc(VERDICT_MAX + 1);
    ssize_t n = buf ? pread(fd, buf, VERDICT_MAX, 0) : -1;
    int status = -1;

    if (n > 0) {
        buf[n] = '\0';
        char *nl = strchr(buf, '\n');
        if (strncmp(buf, "exit ", 5) == 0 && nl) {
            status = atoi(buf + 5);
            fputs(nl + 1, stdout);
        }
    }
    free(buf);
    return status;
}

int verdict_unmount(const char *mp, const char *pidfile)
{
    char dir[PATH_MAX], name[32];
    const char *why = "";
    pid_t pid = 0;

    if (daemon_pid(mp, pidfile, &pid) < 0)
        return EXIT_FAILURE;
    int dfd = dir_open(true, dir, sizeof dir, &why);
    if (dfd < 0) {
        fprintf(stderr, "nbdferry: %s: %s (%s)\n", dir, why, strerror(-dfd));
        return EXIT_FAILURE;
    }
    snprintf(name, sizeof name, "verdict.%ld", (long) pid);
    unlinkat(dfd, name, 0);           /* a dead daemon's of the same pid */
    int fd = open_file(dfd, name, O_RDWR | O_CREAT | O_EXCL);
    if (fd < 0) {
        fprintf(stderr, "nbdferry: %s/%s: %s\n", dir, name, strerror(-fd));
        close(dfd);
        return EXIT_FAILURE;
    }
    int status = EXIT_FAILURE;
    if (run_fusermount(mp) < 0) {
        fprintf(stderr, "nbdferry: %s is still mounted (fusermount3 -u "
                "failed: in use?)\n", mp);
        name_users(mp);
    } else {
        wait_exit(pid);
        status = print_verdict(fd);
        if (status < 0) {
            fprintf(stderr, "nbdferry: the daemon (pid %ld) exited without "
                    "a verdict (killed?): check the system log or its "
                    "--log-file; the disk may not hold what was written\n",
                    (long) pid);
            status = EXIT_FAILURE;
        }
    }
    close(fd);
    unlinkat(dfd, name, 0);
    close(dfd);
    return status;
}
