/* daemon/mountpoint.c: the mountpoint, resolved, pinned and checked before
 * anything forks, connects or mounts (see cli_parse_mountpoint() in
 * daemon/cli.h). */
#include "daemon/cli.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/vfs.h>

/* ---- mountpoint ------------------------------------------------------ */

/* THE PIN
 * The mountpoint is resolved once (realpath: the name in messages and in
 * the mount table), then opened with O_PATH|O_NOFOLLOW before any check.
 * Every check is made on that descriptor (fstat, fstatfs, openat(fd,
 * ".") for the listing, openat(fd, "..") for the parent), and main()
 * mounts through it (/proc/self/fd/N) after cli_mountpoint_recheck(): a
 * mountpoint swapped (for a symlink, another directory) between the
 * checks and the mount is refused, never mounted elsewhere. */

#define FUSE_SUPER_MAGIC 0x65735546
#define PIN_FLAGS (O_PATH | O_NOFOLLOW | O_CLOEXEC)

/* Never mounted over, even with -o nonempty: hiding one of these breaks
 * every program on the machine (fusermount3 -u itself locks a file under
 * /etc).  Compared by device and inode (/bin is /usr/bin on merged-/usr
 * systems). */
static const char *const system_dirs[] = {
    "/", "/bin", "/boot", "/dev", "/dev/shm", "/etc", "/home", "/lib",
    "/lib32", "/lib64", "/libx32", "/proc", "/root", "/run", "/sbin",
    "/sys", "/tmp", "/usr", "/usr/bin", "/usr/lib", "/usr/local",
    "/usr/sbin", "/usr/share", "/var", "/var/lib", "/var/log", "/var/tmp",
};

/* File mode: no file in or below these (their files are the system's:
 * /etc/passwd, /usr/bin/ls), but for the user_trees within them. */
static const char *const system_trees[] = {
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32",
    "/proc", "/run", "/sbin", "/sys", "/usr", "/var",
};
static const char *const user_trees[] = { "/dev/shm", "/run/user",
                                          "/var/tmp" };

#define NELEMS(v) (sizeof (v) / sizeof (v)[0])

static bool same_inode(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

static bool is_path(const struct stat *st, const char *path)
{
    struct stat p;

    return path && path[0] && stat(path, &p) == 0 && same_inode(st, &p);
}

static const char *in_list(const struct stat *st, const char *const *v,
                           size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (is_path(st, v[i]))
            return v[i];
    return NULL;
}

/* The user's home and temporary directories, wherever they are. */
static bool is_users_dir(const struct stat *st)
{
    struct passwd *pw = getpwuid(getuid());

    return is_path(st, getenv("HOME")) || is_path(st, getenv("TMPDIR")) ||
           (pw && is_path(st, pw->pw_dir));
}

static bool is_system_dir(const struct stat *st)
{
    return in_list(st, system_dirs, NELEMS(system_dirs)) || is_users_dir(st);
}

/* File mode: the system tree the directory dfd is in or below (NULL if
 * none); a user tree, $HOME or $TMPDIR on the way up ends the search.  A
 * directory on the way that cannot be examined counts as a system one. */
static const char *system_tree_of(int dfd)
{
    static const char unknown[] = "a directory that cannot be examined";
    const char *tree = unknown;
    struct stat st, up;
    int cur = fcntl(dfd, F_DUPFD_CLOEXEC, 0);

    while (cur >= 0 && fstat(cur, &st) == 0) {
        const char *t = in_list(&st, system_trees, NELEMS(system_trees));
        if (t || in_list(&st, user_trees, NELEMS(user_trees)) ||
            is_users_dir(&st)) {
            tree = t;
            break;
        }
        int next = openat(cur, "..", O_PATH | O_DIRECTORY | O_CLOEXEC);
        close(cur);
        cur = next;
        if (cur < 0 || fstat(cur, &up) == -1)
            break;
        if (same_inode(&st, &up)) {   /* "/": its parent is itself */
            tree = NULL;
            break;
        }
    }
    if (cur >= 0)
        close(cur);
    return tree;
}

/* Is fd the root of a FUSE mount (another nbdferry, or any FUSE
 * filesystem)?  A mount root lives on another device than its parent. */
static bool is_fuse_mount(int fd, int parent)
{
    struct statfs sf;
    struct stat st, up;

    if (fstatfs(fd, &sf) == -1 || sf.f_type != FUSE_SUPER_MAGIC)
        return false;
    return fstat(fd, &st) == -1 || fstat(parent, &up) == -1 ||
           st.st_dev != up.st_dev;
}

/* 1 if the directory fd holds an entry besides . and .., 0 if not,
 * -errno. */
static int dir_has_entries(int fd)
{
    int dfd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
    struct dirent *e;
    int r = 0;

    if (!d) {
        r = -errno;
        if (dfd >= 0)
            close(dfd);
        return r;
    }
    errno = 0;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
            r = 1;
            break;
        }
    if (!e && errno)
        r = -errno;
    closedir(d);
    return r;
}

static const char *user_name(uid_t uid, char *buf, size_t n)
{
    struct passwd *pw = getpwuid(uid);

    if (pw)
        snprintf(buf, n, "%s", pw->pw_name);
    else
        snprintf(buf, n, "uid %u", (unsigned) uid);
    return buf;
}

/* The mountpoint must be the daemon's user's; for root, also in a
 * directory no other user can change: root's, and not writable by
 * others unless sticky (as /tmp, where only an entry's owner may rename
 * it).  Otherwise another user could swap it (for a symlink to /etc)
 * between the checks and the mount. */
static int check_owner(const char *path, int fd, int parent,
                       struct nbdf_err *err)
{
    struct stat st, up;
    uid_t me = geteuid();
    char a[64], b[64];

    if (fstat(fd, &st) == -1 || fstat(parent, &up) == -1)
        return nbdf_errf(err, -errno, "mountpoint %s: %s", path,
                         strerror(errno));
    if (st.st_uid != me)
        return nbdf_errf(err, -EPERM, "refusing to mount on %s: it "
                         "belongs to %s, not to %s (its owner could replace it "
                         "while nbdferry starts); mount on a %s of your own",
                         path, user_name(st.st_uid, a, sizeof a),
                         user_name(me, b, sizeof b),
                         S_ISDIR(st.st_mode) ? "directory" : "file");
    if (me != 0)
        return 0;
    if (up.st_uid != 0)
        return nbdf_errf(err, -EPERM, "refusing to mount on %s: its "
                         "directory belongs to %s, who could replace it while "
                         "nbdferry starts; mount in a directory of root's",
                         path, user_name(up.st_uid, a, sizeof a));
    if ((up.st_mode & (S_IWGRP | S_IWOTH)) && !(up.st_mode & S_ISVTX))
        return nbdf_errf(err, -EPERM, "refusing to mount on %s: its "
                         "directory is writable by other users (mode %04o, not "
                         "sticky), who could replace it while nbdferry starts; "
                         "chmod go-w (or +t) its directory, or mount elsewhere",
                         path, (unsigned) (up.st_mode & 07777));
    return 0;
}

/* The directory a mount would hide: refused when it is a system
 * directory, a FUSE mount already, another user's or replaceable, or
 * (without -o nonempty) not empty.  missing: the FILENAME that was taken
 * from the argument because it does not exist (NULL for DIR). */
static int check_dir(const char *resolved, int fd, bool nonempty,
                     const char *missing, struct nbdf_err *err)
{
    struct stat st;
    int parent = openat(fd, "..", O_PATH | O_DIRECTORY | O_CLOEXEC);
    int r = 0;

    if (parent < 0 || fstat(fd, &st) == -1)
        r = nbdf_errf(err, -errno, "mountpoint %s: %s", resolved,
                      strerror(errno));
    else if (is_system_dir(&st))
        r = nbdf_errf(err, -EPERM,
                      "refusing to mount on %s: a system directory (its "
                      "files would be hidden from every program); mount on "
                      "an empty directory of your own", resolved);
    else if (is_fuse_mount(fd, parent))
        r = nbdf_errf(err, -EBUSY,
                      "%s is already a FUSE mount: unmount it first "
                      "(fusermount3 -u %s) or choose another directory",
                      resolved, resolved);
    else
        r = check_owner(resolved, fd, parent, err);
    if (parent >= 0)
        close(parent);
    if (r < 0 || nonempty)
        return r;
    r = dir_has_entries(fd);
    if (r < 0)
        return nbdf_errf(err, r, "mountpoint %s: %s (add -o nonempty "
                         "to mount without looking)", resolved, strerror(-r));
    if (r > 0 && missing)
        return nbdf_errf(err, -ENOTEMPTY,
                         "%s/%s does not exist, so '%s' was taken as the "
                         "FILENAME to show in %s, but %s is not empty: check "
                         "the spelling, or mount on an empty directory, or "
                         "name an existing file for file mode, or add -o "
                         "nonempty",
                         resolved, missing, missing, resolved, resolved);
    if (r > 0)
        return nbdf_errf(err, -ENOTEMPTY,
                         "%s is not empty: mount on an empty directory, or "
                         "name an existing file for file mode, or add -o "
                         "nonempty",
                         resolved);
    return 0;
}

/* stat() said ENOTCONN: a FUSE mount whose daemon is gone.  Name the
 * dead mount itself, the highest path that still answers ENOTCONN. */
static int dead_mount(const char *arg, struct nbdf_err *err)
{
    char path[PATH_MAX], up[PATH_MAX];
    struct stat st;

    char cwd[PATH_MAX] = "";

    if (arg[0] != '/' && !getcwd(cwd, sizeof cwd))
        cwd[0] = '\0';
    if (snprintf(path, sizeof path, "%s%s%s", cwd, cwd[0] ? "/" : "", arg) >=
        (int) sizeof path)
        return nbdf_errf(err, -ENAMETOOLONG, "mountpoint %s: %s", arg,
                         strerror(ENAMETOOLONG));
    for (;;) {
        snprintf(up, sizeof up, "%s", path);
        char *d = dirname(up);
        if (strcmp(d, path) == 0 || stat(d, &st) == 0 || errno != ENOTCONN)
            break;
        memmove(path, d, strlen(d) + 1);
    }
    return nbdf_errf(err, -ENOTCONN,
                     "%s is a dead nbdferry mount: run fusermount3 -u %s",
                     path, path);
}

static int resolve(const char *path, char **out, struct nbdf_err *err)
{
    *out = realpath(path, NULL);
    if (!*out)
        return errno == ENOTCONN ? dead_mount(path, err)
                                 : nbdf_errf(err, -errno, "mountpoint %s: %s",
                                             path, strerror(errno));
    return 0;
}

/* Open what was resolved, not following a symlink put there since. */
static int pin(const char *resolved, int dirfd, const char *name, int flags,
               int *out, struct nbdf_err *err)
{
    *out = openat(dirfd, name, PIN_FLAGS | flags);
    if (*out >= 0)
        return 0;
    int e = errno;
    if (e == ELOOP || e == ENOTDIR)
        return nbdf_errf(err, -EAGAIN, "mountpoint %s: changed while being "
                         "checked (now a symlink or not a directory); "
                         "nothing was mounted", resolved);
    return nbdf_errf(err, -e, "mountpoint %s: %s", resolved, strerror(e));
}

/* Data in the file: a non-zero byte in what SEEK_DATA finds (all of it
 * where SEEK_DATA is not supported).  A file made by truncate -s holds
 * none (nbdfuse's own tests mount over one).  Past HOLDS_SCAN bytes of
 * zeros read, it counts as holding data: the check must stay quick. */
#define HOLDS_SCAN (64ull << 20)

static bool zero_run(int fd, off_t from, off_t to, uint64_t *scanned)
{
    static char buf[1 << 16];

    while (from < to) {
        size_t want = (size_t) (to - from) < sizeof buf
                          ? (size_t) (to - from) : sizeof buf;
        ssize_t n = pread(fd, buf, want, from);
        if (n <= 0)
            return n == 0;            /* shrank meanwhile: no more */
        for (ssize_t i = 0; i < n; i++)
            if (buf[i])
                return false;
        from += n;
        *scanned += (uint64_t) n;
        if (*scanned > HOLDS_SCAN)
            return false;
    }
    return true;
}

static bool holds_data(int pinned, const struct stat *st)
{
    char path[64];

    if (st->st_size == 0)
        return false;
    snprintf(path, sizeof path, "/proc/self/fd/%d", pinned);
    int fd = open(path, O_RDONLY | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
    struct stat now;
    if (fd == -1)
        return true;                  /* cannot tell: holds data */
    if (fstat(fd, &now) == -1 || !same_inode(st, &now)) {
        close(fd);
        return true;
    }
    uint64_t scanned = 0;
    bool data = false;
    for (off_t off = 0; !data && off < now.st_size;) {
        off_t start = lseek(fd, off, SEEK_DATA);
        if (start == -1 && errno == ENXIO)
            break;                    /* holes to the end */
        off_t end = start == -1 ? now.st_size : lseek(fd, start, SEEK_HOLE);
        if (start == -1 || end == -1) {
            start = off;              /* no SEEK_DATA: read it all */
            end = now.st_size;
        }
        data = !zero_run(fd, start, end, &scanned);
        off = end;
    }
    close(fd);
    return data;
}

/* File mode's file: not the system's, not a FUSE mount, not another
 * user's or replaceable, and (without -o nonempty) holding no data: a
 * file with bytes in it is most likely the source image named by
 * mistake; one made by truncate -s (nbdfuse's usage) holds none. */
static int check_file(const char *resolved, int fd, int dfd, bool nonempty,
                      struct nbdf_err *err)
{
    struct stat st, dir;
    const char *tree = system_tree_of(dfd);

    if (fstat(fd, &st) == -1 || fstat(dfd, &dir) == -1)
        return nbdf_errf(err, -errno, "mountpoint %s: %s", resolved,
                         strerror(errno));
    if (!S_ISREG(st.st_mode))
        return nbdf_errf(err, -EAGAIN, "mountpoint %s: changed while "
                         "being checked (no longer a regular file); nothing "
                         "was mounted", resolved);
    struct stat up;
    bool top = fstatat(dfd, "..", &up, 0) == 0 && same_inode(&dir, &up);
    if (tree || top)
        return nbdf_errf(err, -EPERM, "refusing to mount over %s: a "
                         "system file (in %s; programs would see the disk "
                         "instead); name an empty file of your own for file "
                         "mode, or an empty directory", resolved,
                         tree ? tree : "/");
    if (is_fuse_mount(fd, dfd))
        return nbdf_errf(err, -EBUSY,
                         "%s is already a FUSE mount: unmount it first "
                         "(fusermount3 -u %s)", resolved, resolved);
    int r = check_owner(resolved, fd, dfd, err);
    if (r < 0 || nonempty || !holds_data(fd, &st))
        return r;
    return nbdf_errf(err, -ENOTEMPTY, "refusing to mount over %s: it "
                     "holds %lld bytes, which file mode would hide until the "
                     "unmount (is it the source image? the mountpoint comes "
                     "first: nbdferry MOUNTPOINT URI); name an empty file or a "
                     "directory, or add -o nonempty", resolved,
                     (long long) st.st_size);
}

/* FILE: file mode, the disk appears over that regular file. */
static int file_mode(const char *arg, bool nonempty,
                     struct cli_mountpoint *out, struct nbdf_err *err)
{
    int r = resolve(arg, &out->mountpoint, err);

    if (r < 0)
        return r;
    char *base = strrchr(out->mountpoint, '/');
    out->filename = strdup(base + 1);
    char *dir = strndup(out->mountpoint, base == out->mountpoint ? 1
                        : (size_t) (base - out->mountpoint));
    int dfd = -1;
    if (!out->filename || !dir)
        r = nbdf_errf(err, -ENOMEM, "%s", strerror(ENOMEM));
    else
        r = pin(dir, AT_FDCWD, dir, O_DIRECTORY, &dfd, err);
    if (r == 0)
        r = pin(out->mountpoint, dfd, out->filename, 0, &out->fd, err);
    if (r == 0)
        r = check_file(out->mountpoint, out->fd, dfd, nonempty, err);
    if (dfd >= 0)
        close(dfd);
    free(dir);
    out->file_mode = true;
    return r;
}

/* DIR: the disk appears as DIR/nbd. */
static int dir_mode(const char *arg, bool nonempty, const char *missing,
                    struct cli_mountpoint *out, struct nbdf_err *err)
{
    int r = resolve(arg, &out->mountpoint, err);

    if (r < 0)
        return r;
    out->filename = strdup("nbd");
    if (!out->filename)
        return nbdf_errf(err, -ENOMEM, "%s", strerror(ENOMEM));
    r = pin(out->mountpoint, AT_FDCWD, out->mountpoint, O_DIRECTORY,
            &out->fd, err);
    return r < 0 ? r : check_dir(out->mountpoint, out->fd, nonempty, missing,
                                 err);
}

/* DIR/FILENAME with FILENAME missing: the disk appears as DIR/FILENAME. */
static int name_mode(const char *arg, const char *reserved_name,
                     bool nonempty, struct cli_mountpoint *out,
                     struct nbdf_err *err)
{
    struct stat st;
    const char *slash = strrchr(arg, '/');

    if (!slash || slash[1] == '\0')
        return nbdf_errf(err, -ENOENT, "mountpoint %s: no such directory",
                         arg);
    const char *fn = slash + 1;
    if (strcmp(fn, ".") == 0 || strcmp(fn, "..") == 0 ||
        (reserved_name && strcmp(fn, reserved_name) == 0) ||
        strlen(fn) > 200)
        return nbdf_errf(err, -EINVAL, "'%s' cannot be the file name", fn);
    char *dir = slash == arg ? strdup("/")
                : strndup(arg, (size_t) (slash - arg));
    if (!dir)
        return nbdf_errf(err, -ENOMEM, "%s", strerror(ENOMEM));
    int r = 0;
    if (stat(dir, &st) == -1)
        r = errno == ENOTCONN ? dead_mount(dir, err)
            : nbdf_errf(err, -errno, "mountpoint %s: %s", dir,
                        errno == ENOENT ? "no such directory"
                                        : strerror(errno));
    else if (!S_ISDIR(st.st_mode))
        r = nbdf_errf(err, -ENOTDIR, "mountpoint %s: not a directory", dir);
    else
        r = dir_mode(dir, nonempty, fn, out, err);
    free(dir);
    if (r == 0) {                 /* dir_mode() set the default name */
        free(out->filename);
        out->filename = strdup(fn);
        if (!out->filename)
            r = nbdf_errf(err, -ENOMEM, "%s", strerror(ENOMEM));
    }
    return r;
}

int cli_parse_mountpoint(const char *arg, const char *reserved_name,
                         bool nonempty, struct cli_mountpoint *out,
                         struct nbdf_err *err)
{
    struct stat st;
    int r;

    memset(out, 0, sizeof *out);
    out->fd = -1;
    if (!arg[0])
        r = nbdf_errf(err, -EINVAL, "the mountpoint is an empty string");
    else if (stat(arg, &st) == 0)
        r = S_ISDIR(st.st_mode) ? dir_mode(arg, nonempty, NULL, out, err)
            : S_ISREG(st.st_mode) ? file_mode(arg, nonempty, out, err)
            : nbdf_errf(err, -ENOTDIR, "mountpoint %s: not a directory "
                        "or a regular file", arg);
    else if (errno == ENOTCONN)
        r = dead_mount(arg, err);
    else if (errno == ENOENT)
        r = name_mode(arg, reserved_name, nonempty, out, err);
    else
        r = nbdf_errf(err, -errno, "mountpoint %s: %s", arg,
                      errno == ENOTDIR ? "not a directory" : strerror(errno));
    if (r < 0)
        cli_mountpoint_free(out);
    return r;
}

int cli_mountpoint_recheck(const struct cli_mountpoint *m,
                           struct nbdf_err *err)
{
    struct stat pinned, now;

    if (fstat(m->fd, &pinned) == -1)
        return nbdf_errf(err, -errno, "mountpoint %s: %s", m->mountpoint,
                         strerror(errno));
    if (lstat(m->mountpoint, &now) == 0 && same_inode(&pinned, &now))
        return 0;
    return nbdf_errf(err, -EAGAIN, "mountpoint %s changed after it was "
                     "checked (%s); nothing was mounted: make sure no one else "
                     "can write to its directory, and try again", m->mountpoint,
                     errno == ENOENT ? "it is gone" : "replaced");
}

int cli_mountpoint_landed(const struct cli_mountpoint *m,
                          struct nbdf_err *err)
{
    char link[64], now[PATH_MAX];

    snprintf(link, sizeof link, "/proc/self/fd/%d", m->fd);
    ssize_t n = readlink(link, now, sizeof now - 1);
    if (n < 0)
        return nbdf_errf(err, -errno, "mountpoint %s: %s", m->mountpoint,
                         strerror(errno));
    now[n] = '\0';
    if (strcmp(now, m->mountpoint) == 0)
        return 0;
    return nbdf_errf(err, -EAGAIN, "mountpoint %s moved during the mount "
                     "(now %s): unmounted; make sure no one else can write to "
                     "its directory, and try again", m->mountpoint, now);
}

void cli_mountpoint_free(struct cli_mountpoint *m)
{
    if (m->fd >= 0)
        close(m->fd);
    m->fd = -1;
    free(m->mountpoint);
    free(m->filename);
    m->mountpoint = m->filename = NULL;
    m->file_mode = false;
}

