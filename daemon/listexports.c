/* daemon/listexports.c: nbdferry --list TARGET: the server's exports, one per
 * line, for scripts (like nbdinfo --list).
 *
 * Connects in libnbd's option mode (no export is opened), asks for the
 * list (NBD_OPT_LIST), then for each export its size (NBD_OPT_INFO), and
 * leaves with NBD_OPT_ABORT.  Every handle is configured as the mount's
 * (nbdx_configure_handle: the TLS options, the URI's tls-certificates),
 * and the whole listing has one deadline (--list-timeout, 60 s by
 * default): a slow server's remaining sizes are shown as '?' with a
 * warning, a list not had by then is an error.  Output: NAME<TAB>SIZE<TAB>DESCRIPTION, the
 * default export shown as "" (an empty name); exit 0, or 1 with one line
 * on stderr.  A server that lists nothing is an error: there is nothing
 * to mount by name. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libnbd.h>

#include "common/log.h"
#include "common/monotime.h"
#include "common/vector.h"
#include "daemon/listexports.h"

struct export {
    char *name, *desc;
};
DEFINE_VECTOR_TYPE(export_vector, struct export, 16);

struct list {
    struct export_vector v;
    bool oom;
};

static int add_export(void *opaque, const char *name, const char *desc)
{
    struct list *l = opaque;
    char *n = strdup(name), *d = strdup(desc ? desc : "");

    if (!n || !d || export_vector_append(&l->v, (struct export){ n, d }) < 0) {
        free(n);
        free(d);
        l->oom = true;
    }
    return 0;
}

/* A name or description printed on one line: tabs and newlines shown as
 * spaces, so that a line is always one export. */
static void put_field(const char *s)
{
    for (; *s; s++)
        putchar(*s == '\t' || *s == '\n' || *s == '\r' ? ' ' : *s);
}

/* One listing: its handle, its deadline and what it is called in
 * messages ("--list" or "--all-exports"). */
struct lister {
    struct nbd_handle *h;
    struct nbdx *tls;         /* the TLS policy's state (nbdx_prepare) */
    const char *what, *uri;
    uint64_t deadline_ns;     /* 0: none */
    unsigned timeout_s;
};

/* Drive h until it can take the next option (or is dead): 0, -1 (the
 * libnbd error set) or -ETIMEDOUT past the deadline. */
static int wait_negotiating(struct lister *ls)
{
    while (nbd_aio_is_negotiating(ls->h) != 1) {
        if (nbd_aio_is_dead(ls->h) == 1 || nbd_aio_is_closed(ls->h) == 1)
            return -1;
        int ms = -1;
        if (ls->deadline_ns) {
            uint64_t now = mono_now_ns();
            if (now >= ls->deadline_ns)
                return -ETIMEDOUT;
            ms = (int) ((ls->deadline_ns - now) / NS_PER_MS) + 1;
        }
        if (nbd_poll(ls->h, ms) == -1)
            return -1;
    }
    return 0;
}

/* A completion callback: the option's error, for the caller. */
static int option_done(void *opaque, int *error)
{
    *(int *) opaque = *error;
    return 1;
}

/* Connect in option mode, configured as every connection (TLS options,
 * the URI's local files).  0, or -1 logged. */
static int connect_listing(struct lister *ls, const struct nbdx_config *cfg)
{
    if (nbdx_prepare(cfg, &ls->tls) < 0)          /* logged */
        return -1;
    if (!(ls->h = nbd_create()) ||
        nbdx_configure_handle(ls->h, nbdx_config(ls->tls)) == -1 ||
        nbd_set_opt_mode(ls->h, true) == -1 ||
        nbd_set_full_info(ls->h, true) == -1 ||
        nbd_aio_connect_uri(ls->h, ls->uri) == -1) {
        log_err("%s %s: %s", ls->what, ls->uri, nbd_get_error());
        return -1;
    }
    int r = wait_negotiating(ls);
    if (r == -ETIMEDOUT)
        log_err("%s %s: no answer within %u s (--list-timeout)", ls->what,
                ls->uri, ls->timeout_s);
    else if (r < 0)
        log_err("%s %s: %s", ls->what, ls->uri, nbd_get_error());
    return r < 0 ? -1 : 0;
}

/* Connect and collect the server's list into *l.  0, or -1 logged. */
static int get_list(struct lister *ls, const struct nbdx_config *cfg,
                    struct list *l)
{
    int err = 0, r;

    if (connect_listing(ls, cfg) < 0)
        return -1;
    if (nbd_aio_opt_list(ls->h, (nbd_list_callback){ .callback = add_export,
                                                     .user_data = l },
                         (nbd_completion_callback){ .callback = option_done,
                                                    .user_data = &err })
        == -1 || (r = wait_negotiating(ls)) == -1 || err) {
        log_err("%s %s: the server does not list its exports: %s",
                ls->what, ls->uri, err ? strerror(err) : nbd_get_error());
        return -1;
    }
    if (r == -ETIMEDOUT) {
        log_err("%s %s: no list within %u s (--list-timeout)", ls->what,
                ls->uri, ls->timeout_s);
        return -1;
    }
    if (l->oom) {
        log_err("%s: out of memory", ls->what);
        return -1;
    }
    if (l->v.len == 0) {
        log_err("%s %s: the server lists no exports", ls->what, ls->uri);
        return -1;
    }
    return 0;
}

static void free_list(struct list *l)
{
    for (size_t i = 0; i < l->v.len; i++) {
        free(l->v.ptr[i].name);
        free(l->v.ptr[i].desc);
    }
    export_vector_reset(&l->v);
}

static void lister_init(struct lister *ls, const char *what,
                        const struct nbdx_config *cfg, unsigned timeout_s)
{
    *ls = (struct lister){ .what = what, .uri = cfg->uri,
                           .timeout_s = timeout_s };
    if (timeout_s)
        ls->deadline_ns = mono_now_ns() + (uint64_t) timeout_s * NS_PER_S;
}

static void lister_close(struct lister *ls, bool ok)
{
    if (ls->h && ok)
        nbd_opt_abort(ls->h);
    nbd_close(ls->h);
    nbdx_close(ls->tls);
}

/* Export i's size, or -1 (unknown, or the deadline passed: *late). */
static int64_t export_size(struct lister *ls, const char *name, bool *late)
{
    int err = 0;

    if (*late || nbd_set_export_name(ls->h, name) == -1 ||
        nbd_aio_opt_info(ls->h, (nbd_completion_callback){
                                    .callback = option_done,
                                    .user_data = &err }) == -1)
        return -1;
    int r = wait_negotiating(ls);
    if (r == -ETIMEDOUT)
        *late = true;
    return r == 0 && !err ? nbd_get_size(ls->h) : -1;
}

int list_exports(const struct nbdx_config *cfg, unsigned timeout_s)
{
    struct lister ls;
    struct list l = { .oom = false };
    int status = 1;
    bool late = false;
    size_t unasked = 0;

    lister_init(&ls, "--list", cfg, timeout_s);
    if (get_list(&ls, cfg, &l) < 0)
        goto out;
    for (size_t i = 0; i < l.v.len; i++) {
        int64_t size = export_size(&ls, l.v.ptr[i].name, &late);
        unasked += late;
        put_field(l.v.ptr[i].name);
        if (size >= 0)
            printf("\t%" PRId64 "\t", size);
        else
            printf("\t?\t");
        put_field(l.v.ptr[i].desc);
        putchar('\n');
    }
    status = fflush(stdout) == 0 ? 0 : 1;
    if (late)
        log_warn("--list %s: %u s passed (--list-timeout): the sizes of "
                 "the last %zu of %zu exports are shown as '?'", cfg->uri,
                 timeout_s, unasked, l.v.len);
out:
    lister_close(&ls, status == 0 && !late);
    free_list(&l);
    return status;
}

int list_export_names(const struct nbdx_config *cfg, unsigned timeout_s,
                      char ***names, size_t *n)
{
    struct lister ls;
    struct list l = { .oom = false };
    int r = -1;

    *names = NULL;
    *n = 0;
    lister_init(&ls, "--all-exports", cfg, timeout_s);
    if (get_list(&ls, cfg, &l) < 0)
        goto out;                               /* logged */
    if (!(*names = calloc(l.v.len, sizeof **names))) {
        log_err("--all-exports: out of memory");
        goto out;
    }
    for (size_t i = 0; i < l.v.len; i++) {
        (*names)[i] = l.v.ptr[i].name;              /* moved */
        l.v.ptr[i].name = NULL;
    }
    *n = l.v.len;
    r = 0;
out:
    lister_close(&ls, r == 0);
    free_list(&l);
    return r;
}
