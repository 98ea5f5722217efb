/* fs/mountlock.c: one writable mount of an export per host
 * (fs/mountlock.h). */
#include "fs/mountlock.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "common/log.h"

struct mountlock {
    int fd;
};

/* A socket path as one name: resolved when it exists. */
static void canon_path(const char *path, size_t len, char *out, size_t n)
{
    char raw[PATH_MAX], real[PATH_MAX];

    snprintf(raw, sizeof raw, "%.*s", (int) len, path);
    snprintf(out, n, "%s", realpath(raw, real) ? real : raw);
}

/* "unix:SOCKET|EXPORT" or "SCHEME:HOST:PORT|EXPORT" from a URI; TLS and
 * other query parameters do not change which disk it is. */
static char *uri_key(const char *uri)
{
    const char *rest = strstr(uri, "://");
    if (!rest)
        return NULL;
    bool vsock = strncmp(uri, "nbd+vsock", 9) == 0;
    rest += 3;
    size_t alen = strcspn(rest, "/?#");
    const char *path = rest + alen;
    size_t elen = *path == '/' ? strcspn(path + 1, "?#") : 0;
    const char *export = *path == '/' ? path + 1 : "";
    const char *q = strchr(rest, '?');
    const char *sock = q ? strstr(q, "socket=") : NULL;
    char *key = NULL, where[PATH_MAX + 64];

    if (sock) {
        sock += 7;
        canon_path(sock, strcspn(sock, "&#"), where, sizeof where);
        if (asprintf(&key, "unix:%s|%.*s", where, (int) elen, export) < 0)
            return NULL;
        return key;
    }
    size_t i = 0;
    for (; i < alen && i < 255; i++)
        where[i] = (char) tolower((unsigned char) rest[i]);
    where[i] = '\0';
    const char *colon = strrchr(where, ':');
    bool port = colon && !strchr(colon, ']');
    if (asprintf(&key, "%s:%s%s|%.*s", vsock ? "vsock" : "tcp", where,
                 port || vsock ? "" : ":10809", (int) elen, export) < 0)
        return NULL;
    return key;
}

char *mountlock_key(const struct nbdx_config *cfg)
{
    char *key = NULL, where[PATH_MAX];

    switch (cfg->mode) {
    case NBDX_URI:
        return uri_key(cfg->uri);
    case NBDX_UNIX:
        canon_path(cfg->path, strlen(cfg->path), where, sizeof where);
        return asprintf(&key, "unix:%s|", where) < 0 ? NULL : key;
    case NBDX_TCP:
        return asprintf(&key, "tcp:%s:%s|", cfg->host, cfg->port) < 0
                   ? NULL : key;
    default:
        return NULL;              /* a server of our own, or an fd */
    }
}

/* The lock file's name: 32 hex digits of the key's SHA-256. */
static int key_name(const char *key, char *out, size_t n)
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned len = 0;

    if (EVP_Digest(key, strlen(key), md, &len, EVP_sha256(), NULL) != 1)
        return -EIO;
    size_t at = 0;
    for (unsigned i = 0; i < 16 && at + 3 < n; i++)
        at += (size_t) snprintf(out + at, n - at, "%02x", md[i]);
    snprintf(out + at, n - at, ".lock");
    return 0;
}

/* RUNDIR/nbdferry, created if missing; its fd, or -1 when there is no
 * run directory (-errno when it is unsafe). */
static int open_dir(char *path, size_t n)
{
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    uid_t uid = geteuid();
    struct stat st;

    if (uid == 0)
        snprintf(path, n, "/run/nbdferry");
    else if (xdg && xdg[0] == '/')
        snprintf(path, n, "%s/nbdferry", xdg);
    else
        snprintf(path, n, "/run/user/%u/nbdferry", (unsigned) uid);
    if (mkdir(path, 0700) == -1 && errno != EEXIST)
        return -1;                /* no run directory: nothing to lock */
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd == -1) {
        int err = errno;          /* ELOOP: a link planted there */
        log_err("%s: %s: cannot lock the export", path, strerror(err));
        return -err;
    }
    if (fstat(fd, &st) == -1 || st.st_uid != uid || (st.st_mode & 022)) {
        log_err("%s: not a directory of ours closed to others: cannot lock "
                "the export", path);
        close(fd);
        return -EPERM;
    }
    return fd;
}

/* The lock file, never through a link, and only if it is ours. */
static int open_file(int dfd, const char *dir, const char *name)
{
    struct stat st;
    int fd = openat(dfd, name, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC,
                    0600);
    if (fd == -1) {
        int err = errno;
        log_err("%s/%s: %s: cannot lock the export", dir, name,
                strerror(err));
        return -err;
    }
    if (fstat(fd, &st) == -1 || !S_ISREG(st.st_mode) ||
        st.st_uid != geteuid() || st.st_nlink != 1) {
        log_err("%s/%s: not a plain file of ours: cannot lock the export",
                dir, name);
        close(fd);
        return -EPERM;
    }
    return fd;
}

/* Another writable mount has it: say which, from what it wrote. */
static void name_holder(int fd, const char *key, const char *mountpoint)
{
    char buf[PATH_MAX + 32] = "";
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    int pid = 0;
    char mp[PATH_MAX] = "?";

    if (n > 0) {
        buf[n] = '\0';
        char *nl = strchr(buf, '\n');
        pid = atoi(buf);
        if (nl && nl[1]) {
            snprintf(mp, sizeof mp, "%s", nl + 1);
            mp[strcspn(mp, "\n")] = '\0';
        }
    }
    log_err("%s: the export (%s) is already mounted for writing on this "
            "host, by pid %d on %s: two write-back caches over one disk lose "
            "each other's writes; unmount that one first, mount this one "
            "read-only (-r), or pass -o multiwriter", mountpoint, key, pid,
            mp);
}

/* Ours: say who holds it, for the next one. */
static void write_holder(int fd, const char *mountpoint)
{
    char buf[PATH_MAX + 32];
    int n = snprintf(buf, sizeof buf, "%d\n%s\n", (int) getpid(),
                     mountpoint);
    if (ftruncate(fd, 0) == -1 ||
        pwrite(fd, buf, (size_t) n, 0) != (ssize_t) n) {
        /* only the next refusal's message loses its details */
    }
}

int mountlock_take(const struct nbdx_config *cfg, const char *mountpoint,
                   struct mountlock **out)
{
    char dir[PATH_MAX], name[48];
    char *key = mountlock_key(cfg);
    int r = 0, fd = -1, dfd = -1;

    *out = NULL;
    if (!key || (r = key_name(key, name, sizeof name)) < 0)
        goto out;
    if ((dfd = open_dir(dir, sizeof dir)) < 0) {
        r = dfd == -1 ? 0 : dfd;
        if (dfd == -1)
            log_info("%s: no run directory: the export is not locked", dir);
        goto out;
    }
    if ((fd = r = open_file(dfd, dir, name)) < 0)
        goto out;
    if (flock(fd, LOCK_EX | LOCK_NB) == -1) {
        r = errno == EWOULDBLOCK ? -EBUSY : -errno;
        if (r == -EBUSY)
            name_holder(fd, key, mountpoint);
        else
            log_err("%s/%s: flock: %s", dir, name, strerror(-r));
        goto out;
    }
    write_holder(fd, mountpoint);
    if (!(*out = malloc(sizeof **out))) {
        r = -ENOMEM;
        goto out;
    }
    (*out)->fd = fd;
    fd = -1;
    log_info("export %s locked for this mount (%s/%s)", key, dir, name);
    r = 0;
out:
    if (fd >= 0)
        close(fd);
    if (dfd >= 0)
        close(dfd);
    free(key);
    return r;
}

void mountlock_release(struct mountlock *l)
{
    if (!l)
        return;
    close(l->fd);                 /* drops the lock; the file stays */
    free(l);
}
