/* transport/tls.c: the TLS policy: the server is verified, or we refuse
 * to connect (only --tls-insecure, logged, goes around it); key files
 * must be the owner's alone; a loaded key keeps core dumps off.
 *
 * THREAD MODEL
 * nbdx_tls_policy() runs once in nbdx_open() or nbdx_prepare(), before
 * any connection or thread exists; nbdx_tls_set() and
 * nbdx_configure_handle() on the thread making a handle;
 * nbdx_tls_release() in nbdx_close(), after the I/O threads are joined.
 */
#include "transport/nbdx-internal.h"

#include <errno.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"

/* Where distributions keep the system's CA bundle. */
static const char *const system_ca_bundles[] = {
    "/etc/ssl/certs/ca-certificates.crt",   /* Debian, Ubuntu, Alpine */
    "/etc/pki/tls/certs/ca-bundle.crt",     /* Fedora, RHEL */
    "/etc/ssl/ca-bundle.pem",               /* openSUSE */
    "/etc/ssl/cert.pem",
};

/* The TLS mode libnbd will use: nbds:// URIs require it whatever
 * nbd_set_tls() said (nbd_connect_uri sets it). */
static int effective_tls(const struct nbdx_config *cfg)
{
    if (cfg->mode == NBDX_URI && nbdx_uri_is_tls(cfg->uri))
        return LIBNBD_TLS_REQUIRE;
    return cfg->tls != NBDX_TLS_FROM_URI ? cfg->tls : LIBNBD_TLS_DISABLE;
}

static bool dir_has(const char *dir, const char *name)
{
    char p[PATH_MAX];
    return snprintf(p, sizeof p, "%s/%s", dir, name) < (int) sizeof p &&
           access(p, R_OK) == 0;
}

/* The certificate directory libnbd will use: the URI's, the option's, or
 * libnbd's own default (for root /etc/pki/libnbd, else ~/.pki/libnbd and
 * ~/.config/pki/libnbd), the first holding ca-cert.pem.  NULL if none. */
static const char *certificate_dir(const struct nbdx_config *cfg, char *buf,
                                   size_t len)
{
    const char *home = getenv("HOME");

    if (cfg->mode == NBDX_URI &&
        nbdx_uri_query(cfg->uri, "tls-certificates", buf, len))
        return buf;
    if (cfg->tls_certificates)
        return cfg->tls_certificates;
    if (geteuid() == 0) {
        snprintf(buf, len, "/etc/pki/libnbd");
        return dir_has(buf, "ca-cert.pem") ? buf : NULL;
    }
    if (!home)
        return NULL;
    snprintf(buf, len, "%s/.pki/libnbd", home);
    if (dir_has(buf, "ca-cert.pem"))
        return buf;
    snprintf(buf, len, "%s/.config/pki/libnbd", home);
    return dir_has(buf, "ca-cert.pem") ? buf : NULL;
}

/* libnbd 1.14 verifies the server's chain and host name only when it
 * found ca-cert.pem in a certificate directory; without one it loads the
 * system trust and checks nothing.  So give it one: a private directory
 * (mkdtemp, 0700) whose ca-cert.pem links to the system bundle. */
static int make_system_ca_dir(struct nbdx *x)
{
    const char *bundle = NULL, *tmp = getenv("TMPDIR");
    char link[PATH_MAX];

    for (size_t i = 0; i < sizeof system_ca_bundles /
                           sizeof system_ca_bundles[0] && !bundle; i++)
        if (access(system_ca_bundles[i], R_OK) == 0)
            bundle = system_ca_bundles[i];
    if (!bundle)
        return -ENOENT;
    if (!tmp || tmp[0] != '/')
        tmp = "/tmp";
    if (asprintf(&x->ca_dir, "%s/nbdferry-ca-XXXXXX", tmp) == -1) {
        x->ca_dir = NULL;
        return -ENOMEM;
    }
    if (!mkdtemp(x->ca_dir)) {
        int err = errno;
        log_err("TLS: mkdtemp %s: %m", x->ca_dir);
        free(x->ca_dir);
        x->ca_dir = NULL;
        return -err;
    }
    snprintf(link, sizeof link, "%s/ca-cert.pem", x->ca_dir);
    if (symlink(bundle, link) == -1) {
        int err = errno;
        log_err("TLS: symlink %s: %m", link);
        rmdir(x->ca_dir);
        free(x->ca_dir);
        x->ca_dir = NULL;
        return -err;
    }
    log_info("TLS: verifying the server against the system CA bundle %s",
             bundle);
    return 0;
}

static void remove_ca_dir(struct nbdx *x)
{
    char link[PATH_MAX];

    if (!x->ca_dir)
        return;
    snprintf(link, sizeof link, "%s/ca-cert.pem", x->ca_dir);
    unlink(link);
    rmdir(x->ca_dir);
    free(x->ca_dir);
    x->ca_dir = NULL;
}

static bool has_host_name(const struct nbdx_config *cfg)
{
    return cfg->mode == NBDX_TCP ||
           (cfg->mode == NBDX_URI && nbdx_uri_is_tcp(cfg->uri));
}

/* X.509: the server's chain and host name are verified, or we refuse to
 * connect.  The only way around it is --tls-insecure, logged. */
static int x509_policy(struct nbdx *x, int tls)
{
    struct nbdx_config *cfg = &x->cfg;
    char buf[PATH_MAX];

    if (cfg->tls_insecure) {
        log_warn("--tls-insecure: the server's X.509 certificate is NOT "
                 "verified; anyone on the network path can read and change "
                 "the disk");
        return 0;
    }
    if (!has_host_name(cfg)) {
        if (tls == LIBNBD_TLS_ALLOW) {
            /* Unverifiable TLS is no better than the plaintext that
             * --tls=allow accepts anyway. */
            log_info("TLS off: without a host name (Unix socket, --fd, "
                     "command) X.509 could not be verified");
            cfg->tls = LIBNBD_TLS_DISABLE;
            return 0;
        }
        log_err("X.509 TLS cannot be verified without the server's host "
                "name, which a Unix socket, --fd or a command does not "
                "give: connect with nbds://HOST:PORT/ or --tcp, use a "
                "pre-shared key (--tls-psk-file), or accept an unverified "
                "server with --tls-insecure");
        return -EINVAL;
    }
    const char *dir = certificate_dir(cfg, buf, sizeof buf);
    if (dir) {
        if (!dir_has(dir, "ca-cert.pem")) {
            log_err("TLS: %s/ca-cert.pem: %s: the CA certificate that "
                    "verifies the server must be there", dir,
                    strerror(errno));
            return -EINVAL;
        }
        log_info("TLS: verifying the server against %s/ca-cert.pem", dir);
        return 0;
    }
    int r = make_system_ca_dir(x);
    if (r == -ENOENT)
        log_err("TLS: no CA to verify the server's certificate with: give "
                "--tls-certificates DIR (holding DIR/ca-cert.pem) or "
                "tls-certificates=DIR in the URI, or install the system CA "
                "bundle (ca-certificates)");
    if (r < 0)
        return r;
    cfg->tls_certificates = x->ca_dir;
    return 0;
}

/* A key file another user owns: they can read the keys (and so act as
 * the server) or replace them whatever its mode.  -EPERM, logged. */
static int psk_owner(const char *file, const struct stat *st, bool from_uri)
{
    uid_t me = geteuid();

    if (st->st_uid == me || st->st_uid == 0)
        return 0;
    struct passwd *pw = getpwuid(me);
    char name[64];
    if (pw)
        snprintf(name, sizeof name, "%s", pw->pw_name);
    else
        snprintf(name, sizeof name, "%u", (unsigned) me);
    if (from_uri)
        log_err("the URI's tls-psk-file belongs to uid %u, not to this "
                "user or root (that user can read and replace the keys): "
                "run chown %s on it", (unsigned) st->st_uid, name);
    else
        log_err("TLS key file %s belongs to uid %u, not to this user or "
                "root (that user can read and replace the keys): run "
                "chown %s %s", file, (unsigned) st->st_uid, name, file);
    return -EPERM;
}

/* A key file must be the owner's alone, as ssh insists for its keys, and
 * owned by the daemon's user or root.  from_uri: the path came from the
 * URI, whose tls-psk-file value every message redacts, so this one does
 * not name it either.  A file that cannot be stat'ed is left to libnbd's
 * connect to report. */
static int psk_policy(const char *file, bool from_uri)
{
    struct stat st;

    if (stat(file, &st) == -1)
        return 0;
    if (psk_owner(file, &st, from_uri) < 0)
        return -EPERM;
    if (st.st_mode & (S_IRWXG | S_IRWXO)) {
        if (from_uri)
            log_err("the URI's tls-psk-file is open to group or others "
                    "(mode %04o): run chmod 600 on it",
                    (unsigned) (st.st_mode & 07777));
        else
            log_err("TLS key file %s is open to group or others (mode "
                    "%04o): run chmod 600 %s", file,
                    (unsigned) (st.st_mode & 07777), file);
        return -EPERM;
    }
    return 0;
}

/* While a key is loaded (a PSK, or an X.509 client key), a core dump
 * would carry it: the process is made non-dumpable (which also keeps
 * other users' ptrace and /proc/PID/mem out) until nbdx_close(). */
static void hold_keys(struct nbdx *x)
{
    x->dumpable = prctl(PR_GET_DUMPABLE);
    if (prctl(PR_SET_DUMPABLE, 0) == -1)
        log_warn("prctl(PR_SET_DUMPABLE): %m");
    else
        log_info("TLS key loaded: core dumps are off until it is released");
}

int nbdx_tls_policy(struct nbdx *x)
{
    const struct nbdx_config *cfg = &x->cfg;
    int tls = effective_tls(cfg);
    char psk[PATH_MAX], buf[PATH_MAX];
    const char *psk_file = cfg->tls_psk_file;

    if (tls == LIBNBD_TLS_DISABLE)
        return 0;
    bool from_uri = cfg->mode == NBDX_URI &&
                    nbdx_uri_query(cfg->uri, "tls-psk-file", psk, sizeof psk);
    if (from_uri)
        psk_file = psk;
    int r = psk_file ? psk_policy(psk_file, from_uri) : x509_policy(x, tls);
    if (r < 0)
        return r;
    const char *dir = psk_file ? NULL : certificate_dir(cfg, buf, sizeof buf);
    if (psk_file || (dir && dir_has(dir, "client-key.pem")))
        hold_keys(x);
    return 0;
}

int nbdx_tls_set(struct nbd_handle *h, const struct nbdx_config *cfg)
{
    if (cfg->tls != NBDX_TLS_FROM_URI && nbd_set_tls(h, cfg->tls) == -1)
        return -1;
    if (cfg->tls_psk_file && nbd_set_tls_psk_file(h, cfg->tls_psk_file) == -1)
        return -1;
    if (cfg->tls_username && nbd_set_tls_username(h, cfg->tls_username) == -1)
        return -1;
    if (cfg->tls_certificates &&
        nbd_set_tls_certificates(h, cfg->tls_certificates) == -1)
        return -1;
    if (nbd_set_tls_verify_peer(h, !cfg->tls_insecure) == -1)
        return -1;
    return 0;
}

int nbdx_configure_handle(struct nbd_handle *h,
                          const struct nbdx_config *cfg)
{
    /* The user typed this URI: its tls-psk-file and tls-certificates
     * may name local files.  Never a URI a server sent. */
    if (cfg->mode == NBDX_URI && nbd_set_uri_allow_local_file(h, true) == -1)
        return -1;
    return nbdx_tls_set(h, cfg);
}

void nbdx_tls_release(struct nbdx *x)
{
    remove_ca_dir(x);
    if (x->dumpable >= 0)                 /* every key is released now */
        prctl(PR_SET_DUMPABLE, x->dumpable);
}
