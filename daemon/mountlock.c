/* daemon/mountlock.c: one writable mount of an export per host
 * (daemon/mountlock.h). */
#include "daemon/mountlock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <linux/vm_sockets.h>

#include <openssl/evp.h>

#include "common/log.h"

#define LOCK_DIR "/run/lock"
#define LOCK_PREFIX "nbdferry-"
#define LOCK_TRIES 16             /* a file unlinked under us: open again */

struct mountlock {
    int dfd, fd;
    char name[64];
};

/* A loopback address: every one of them is this host, and a server on
 * localhost usually listens on both 127.0.0.1 and ::1 (nbdkit does), so
 * which one "localhost" reached must not make a second key. */
static bool loopback(const struct sockaddr_storage *ss)
{
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *in = (const void *) ss;
        return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    }
    const struct sockaddr_in6 *in6 = (const void *) ss;
    const uint8_t *a = in6->sin6_addr.s6_addr;
    return IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr) ||
           (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) && a[12] == 127);
}

/* "tcp:ADDR:PORT", the address numeric (an IPv4-mapped IPv6 address as
 * IPv4), every loopback address one name. */
static int tcp_where(const struct sockaddr_storage *ss, char *out, size_t n)
{
    char a[INET6_ADDRSTRLEN] = "";
    unsigned port;

    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *in = (const void *) ss;
        inet_ntop(AF_INET, &in->sin_addr, a, sizeof a);
        port = ntohs(in->sin_port);
    } else {
        const struct sockaddr_in6 *in6 = (const void *) ss;
        if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr))
            inet_ntop(AF_INET, &in6->sin6_addr.s6_addr[12], a, sizeof a);
        else
            inet_ntop(AF_INET6, &in6->sin6_addr, a, sizeof a);
        port = ntohs(in6->sin6_port);
    }
    snprintf(out, n, "tcp:%s:%u", loopback(ss) ? "loopback" : a, port);
    return 0;
}

/* "unix:DEV:INO": the socket file itself, however its path is spelled
 * (links, "..", relative); an abstract or vanished one by its name. */
static int unix_where(const struct sockaddr_un *un, socklen_t len, char *out,
                      size_t n)
{
    size_t plen = len > offsetof(struct sockaddr_un, sun_path)
                      ? len - offsetof(struct sockaddr_un, sun_path) : 0;
    char path[sizeof un->sun_path + 1];
    struct stat st;

    if (plen > sizeof un->sun_path)
        plen = sizeof un->sun_path;
    memcpy(path, un->sun_path, plen);
    path[plen] = '\0';
    if (plen && path[0] && stat(path, &st) == 0)
        snprintf(out, n, "unix:%llu:%llu", (unsigned long long) st.st_dev,
                 (unsigned long long) st.st_ino);
    else
        snprintf(out, n, "unix:@%s", plen ? path + 1 : "");
    return 0;
}

/* Where the connected socket fd leads, or -errno. */
static int peer_where(int fd, char *out, size_t n)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;

    if (fd < 0 || getpeername(fd, (struct sockaddr *) &ss, &sl) == -1)
        return fd < 0 ? -ENOTCONN : -errno;
    switch (ss.ss_family) {
    case AF_INET:
    case AF_INET6:
        return tcp_where(&ss, out, n);
    case AF_UNIX:
        return unix_where((const struct sockaddr_un *) &ss, sl, out, n);
    case AF_VSOCK: {
        const struct sockaddr_vm *vm = (const void *) &ss;
        snprintf(out, n, "vsock:%u:%u", vm->svm_cid, vm->svm_port);
        return 0;
    }
    }
    return -EAFNOSUPPORT;
}

char *mountlock_key(struct nbdx *x, const struct nbdx_config *cfg)
{
    char where[PATH_MAX], export[4096 + 1] = "", *key;

    switch (cfg->mode) {
    case NBDX_URI:
        if (!nbdx_uri_export(cfg->uri, export, sizeof export))
            return NULL;
        break;
    case NBDX_UNIX:
    case NBDX_TCP:
        break;                    /* the default export */
    default:
        return NULL;              /* a server of our own, or an fd */
    }
    if (peer_where(nbdx_conn_fd(x, 0), where, sizeof where) < 0)
        return NULL;
    return asprintf(&key, "%s|%s", where, export) < 0 ? NULL : key;
}

char *mountlock_record_key(struct nbdx *x, const struct nbdx_config *cfg)
{
    char *key = mountlock_key(x, cfg);
    char sock[PATH_MAX] = "", real[PATH_MAX], export[4096 + 1] = "";
    unsigned long long dev, ino;
    struct stat st;

    if (!key || strncmp(key, "unix:", 5) != 0 ||
        sscanf(key, "unix:%llu:%llu|", &dev, &ino) != 2)
        return key;               /* not a Unix socket with a path */
    if (cfg->mode == NBDX_UNIX && cfg->path)
        snprintf(sock, sizeof sock, "%s", cfg->path);
    else if (cfg->mode == NBDX_URI &&
             (!nbdx_uri_query(cfg->uri, "socket", sock, sizeof sock) ||
              !nbdx_uri_export(cfg->uri, export, sizeof export)))
        return key;
    if (!sock[0] || !realpath(sock, real) || stat(real, &st) != 0 ||
        (unsigned long long) st.st_dev != dev ||
        (unsigned long long) st.st_ino != ino)
        return key;
    char *rec;
    if (asprintf(&rec, "unix-path:%s|%s", real, export) < 0)
        return key;
    free(key);
    return rec;
}

/* The lock file's name: nbdferry- and 32 hex digits of the key's
 * SHA-256. */
static int key_name(const char *key, char *out, size_t n)
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned len = 0;

    if (EVP_Digest(key, strlen(key), md, &len, EVP_sha256(), NULL) != 1)
        return -EIO;
    size_t at = (size_t) snprintf(out, n, LOCK_PREFIX);
    for (unsigned i = 0; i < 16 && at + 3 < n; i++)
        at += (size_t) snprintf(out + at, n - at, "%02x", md[i]);
    snprintf(out + at, n - at, ".lock");
    return 0;
}

/* LOCK_DIR, the one place every user's mounts meet: root's, closed to
 * others or world-writable with the sticky bit (nobody removes or
 * replaces another's file).  Root creates it when missing, as the
 * system would (01777).  Its fd, or -errno, logged. */
static int open_dir(void)
{
    struct stat st;

    if (geteuid() == 0 && mkdir(LOCK_DIR, 01777) == 0)
        chmod(LOCK_DIR, 01777);   /* whatever the umask took */
    int fd = open(LOCK_DIR, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd == -1) {
        int err = errno;
        log_warn(LOCK_DIR ": %s: the export is NOT locked: a second "
                 "writable mount of it on this host would not be refused",
                 strerror(err));
        return -err;
    }
    if (fstat(fd, &st) == -1 || st.st_uid != 0 ||
        ((st.st_mode & 0022) && !(st.st_mode & S_ISVTX))) {
        log_err(LOCK_DIR ": not root's, or writable by others without the "
                "sticky bit: cannot lock the export");
        close(fd);
        return -EPERM;
    }
    return fd;
}

/* The lock file, never through a link: opened if it is there (read-only
 * when it is another user's: flock needs no more), else created with
 * O_EXCL (never someone else's file, even if it appeared meanwhile).
 * 0644: others may open it to lock, only its owner may change it, and
 * in a sticky directory only its owner (or root) may remove it.  -EAGAIN:
 * it vanished or appeared meanwhile, try again. */
static int open_file(int dfd, const char *name)
{
    int fl = O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK;
    int fd = openat(dfd, name, O_RDWR | fl);
    struct stat st;

    if (fd == -1 && errno == EACCES)
        fd = openat(dfd, name, O_RDONLY | fl);
    if (fd == -1 && errno == ENOENT) {
        fd = openat(dfd, name, O_RDWR | O_CREAT | O_EXCL | fl, 0644);
        if (fd == -1 && errno == EEXIST)
            return -EAGAIN;
        if (fd >= 0)
            fchmod(fd, 0644);     /* whatever the umask took */
    }
    if (fd == -1) {
        int err = errno == ENOENT ? EAGAIN : errno;
        if (err != EAGAIN)
            log_err(LOCK_DIR "/%s: %s: cannot lock the export", name,
                    strerror(err));
        return -err;
    }
    if (fstat(fd, &st) == -1 || !S_ISREG(st.st_mode) || st.st_nlink != 1) {
        log_err(LOCK_DIR "/%s: not a plain file with one link: cannot lock "
                "the export", name);
        close(fd);
        return -EPERM;
    }
    return fd;
}

/* After flock: is the name still this file?  A holder that ended
 * unlinked it (under its lock) after we opened it; then our lock is on
 * a file nobody else will find. */
static bool still_named(int dfd, const char *name, int fd)
{
    struct stat a, b;

    return fstat(fd, &a) == 0 &&
           fstatat(dfd, name, &b, AT_SYMLINK_NOFOLLOW) == 0 &&
           a.st_dev == b.st_dev && a.st_ino == b.st_ino;
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

/* Ours: say who holds it, for the next one (not in another user's file,
 * which we opened read-only). */
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

/* One try: 0 locked (*fdp), -EAGAIN try again, -errno. */
static int lock_once(int dfd, const char *name, const char *key,
                     const char *mountpoint, int *fdp)
{
    int fd = open_file(dfd, name);

    if (fd < 0)
        return fd;
    if (flock(fd, LOCK_EX | LOCK_NB) == -1) {
        int r = errno == EWOULDBLOCK ? -EBUSY : -errno;
        if (r == -EBUSY)
            name_holder(fd, key, mountpoint);
        else
            log_err(LOCK_DIR "/%s: flock: %s", name, strerror(-r));
        close(fd);
        return r;
    }
    if (!still_named(dfd, name, fd)) {
        close(fd);
        return -EAGAIN;
    }
    *fdp = fd;
    return 0;
}

int mountlock_take(struct nbdx *x, const struct nbdx_config *cfg,
                   const char *mountpoint, struct mountlock **out)
{
    char name[64];
    /* A Unix socket by its canonical path, not its inode: a restarted
     * server binds a new inode at the same path (and the mount reconnects
     * there), and an inode number outlives nothing: once a socket file is
     * removed, the file system gives its number to the next file, so a
     * mount whose server went away would hold the lock of whatever socket
     * is made next. */
    char *key = mountlock_record_key(x, cfg);
    int r = 0, fd = -1, dfd = -1;

    *out = NULL;
    if (!key) {
        if (cfg->mode == NBDX_URI || cfg->mode == NBDX_UNIX ||
            cfg->mode == NBDX_TCP)
            log_warn("the export's address is unknown: it is NOT locked "
                     "against a second writable mount");
        goto out;
    }
    if ((r = key_name(key, name, sizeof name)) < 0)
        goto out;
    if ((dfd = open_dir()) < 0) {
        r = dfd == -EPERM ? dfd : 0;  /* no directory: warned, unlocked */
        goto out;
    }
    r = -EAGAIN;
    for (int i = 0; i < LOCK_TRIES && r == -EAGAIN; i++)
        r = lock_once(dfd, name, key, mountpoint, &fd);
    if (r == -EAGAIN)
        log_err(LOCK_DIR "/%s: keeps changing: cannot lock the export",
                name);
    if (r < 0)
        goto out;
    struct stat st;
    if (fstat(fd, &st) == 0 && st.st_uid == geteuid())
        write_holder(fd, mountpoint);
    if (!(*out = malloc(sizeof **out))) {
        r = -ENOMEM;
        goto out;
    }
    **out = (struct mountlock){ .dfd = dfd, .fd = fd };
    snprintf((*out)->name, sizeof (*out)->name, "%s", name);
    fd = dfd = -1;
    log_info("export %s locked for this mount (" LOCK_DIR "/%s)", key, name);
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
    /* Under the lock, so that nobody holds it meanwhile; a locker that
     * opened the file before it goes sees it unnamed and opens again.
     * Another user's file cannot be removed from the sticky directory
     * (EPERM): it stays for the next lock. */
    if (still_named(l->dfd, l->name, l->fd))
        unlinkat(l->dfd, l->name, 0);
    close(l->fd);                 /* drops the lock */
    close(l->dfd);
    free(l);
}
