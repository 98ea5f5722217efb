/* daemon/pidfile.c: see daemon/pidfile.h. */
#include "daemon/pidfile.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct pidfile {
    int dirfd;                /* O_PATH: the directory resolved at start */
    char *name;               /* the last component of the path */
    bool written;             /* we wrote it: ours to remove at exit */
};

int pidfile_prepare(const char *path, struct pidfile **out)
{
    const char *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    struct pidfile *pf;

    *out = NULL;
    if (!name[0] || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return -EISDIR;
    pf = calloc(1, sizeof *pf);
    if (pf)
        pf->dirfd = -1;
    char *dir = !slash ? strdup(".") : slash == path ? strdup("/")
                : strndup(path, (size_t) (slash - path));
    if (!pf || !dir || !(pf->name = strdup(name))) {
        free(dir);
        pidfile_free(pf);
        return -ENOMEM;
    }
    pf->dirfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    int err = errno;
    free(dir);
    if (pf->dirfd == -1) {
        pidfile_free(pf);
        return -err;
    }
    *out = pf;
    return 0;
}

/* A fresh file beside the pidfile, exclusive: never an existing file or
 * a symlink someone planted. */
static int create_tmp(struct pidfile *pf, char *tmp, size_t len)
{
    for (unsigned i = 0; i < 100; i++) {
        if (snprintf(tmp, len, ".%s.%d.%u", pf->name, (int) getpid(), i) >=
            (int) len)
            return -ENAMETOOLONG;
        int fd = openat(pf->dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL |
                        O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd >= 0 || errno != EEXIST)
            return fd >= 0 ? fd : -errno;
    }
    return -EEXIST;
}

int pidfile_write(struct pidfile *pf)
{
    char tmp[NAME_MAX + 1], line[32];
    int fd = create_tmp(pf, tmp, sizeof tmp);

    if (fd < 0)
        return fd;
    int n = snprintf(line, sizeof line, "%d\n", (int) getpid());
    int r = write(fd, line, (size_t) n) == n ? 0 : -errno;
    if (close(fd) == -1 && r == 0)
        r = -errno;
    /* rename() replaces a symlink at the final name, never follows it. */
    if (r == 0 && renameat(pf->dirfd, tmp, pf->dirfd, pf->name) == -1)
        r = -errno;
    if (r < 0) {
        unlinkat(pf->dirfd, tmp, 0);
        return r;
    }
    pf->written = true;
    return 0;
}

/* Does the pidfile still hold our pid? */
static bool holds_our_pid(struct pidfile *pf)
{
    char buf[32];
    int fd = openat(pf->dirfd, pf->name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);

    if (fd == -1)
        return false;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return false;
    buf[n] = '\0';
    return strtol(buf, NULL, 10) == (long) getpid();
}

void pidfile_remove(struct pidfile *pf)
{
    if (pf && pf->written && holds_our_pid(pf))
        unlinkat(pf->dirfd, pf->name, 0);
    pidfile_free(pf);
}

void pidfile_free(struct pidfile *pf)
{
    if (!pf)
        return;
    if (pf->dirfd >= 0)
        close(pf->dirfd);
    free(pf->name);
    free(pf);
}
