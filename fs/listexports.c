/* fs/listexports.c: nbdferry --list TARGET: the server's exports, one per
 * line, for scripts (like nbdinfo --list).
 *
 * Connects in libnbd's option mode (no export is opened), asks for the
 * list (NBD_OPT_LIST), then for each export its size (NBD_OPT_INFO), and
 * leaves with NBD_OPT_ABORT.  Output: NAME<TAB>SIZE<TAB>DESCRIPTION, the
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
#include "fs/listexports.h"

struct export {
    char *name, *desc;
};

struct list {
    struct export *v;
    size_t n;
    bool oom;
};

static int add_export(void *opaque, const char *name, const char *desc)
{
    struct list *l = opaque;
    struct export *v = realloc(l->v, (l->n + 1) * sizeof *v);
    if (!v || !(name = strdup(name)) || !(desc = strdup(desc ? desc : ""))) {
        l->oom = true;
        if (v)
            l->v = v;
        return 0;
    }
    l->v = v;
    l->v[l->n++] = (struct export){ (char *) name, (char *) desc };
    return 0;
}

/* A name or description printed on one line: tabs and newlines shown as
 * spaces, so that a line is always one export. */
static void put_field(const char *s)
{
    for (; *s; s++)
        putchar(*s == '\t' || *s == '\n' || *s == '\r' ? ' ' : *s);
}

static int connect_listing(struct nbd_handle *h, const char *uri)
{
    if (nbd_set_opt_mode(h, true) == -1 || nbd_set_full_info(h, true) == -1)
        return -1;
    return nbd_connect_uri(h, uri);
}

/* Connect to uri in option mode and collect its list into *l.  0, or -1
 * with the one line logged ("--list URI: ..." where what is "--list"). */
static int get_list(struct nbd_handle *h, const char *what, const char *uri,
                    struct list *l)
{
    if (connect_listing(h, uri) == -1) {
        log_err("%s %s: %s", what, uri, nbd_get_error());
        return -1;
    }
    if (nbd_opt_list(h, (nbd_list_callback){ .callback = add_export,
                                             .user_data = l }) == -1) {
        log_err("%s %s: the server does not list its exports: %s", what,
                uri, nbd_get_error());
        return -1;
    }
    if (l->oom) {
        log_err("%s: out of memory", what);
        return -1;
    }
    if (l->n == 0) {
        log_err("%s %s: the server lists no exports", what, uri);
        return -1;
    }
    return 0;
}

static void free_list(struct list *l)
{
    for (size_t i = 0; i < l->n; i++) {
        free(l->v[i].name);
        free(l->v[i].desc);
    }
    free(l->v);
}

int list_exports(const char *uri)
{
    struct nbd_handle *h = nbd_create();
    struct list l = { NULL, 0, false };
    int status = 1;

    if (!h) {
        log_err("--list: %s", nbd_get_error());
        return 1;
    }
    if (get_list(h, "--list", uri, &l) < 0)
        goto out;
    for (size_t i = 0; i < l.n; i++) {
        int64_t size = -1;
        if (nbd_set_export_name(h, l.v[i].name) != -1 &&
            nbd_opt_info(h) != -1)
            size = nbd_get_size(h);
        put_field(l.v[i].name);
        if (size >= 0)
            printf("\t%" PRId64 "\t", size);
        else
            printf("\t?\t");
        put_field(l.v[i].desc);
        putchar('\n');
    }
    status = fflush(stdout) == 0 ? 0 : 1;
    nbd_opt_abort(h);
out:
    free_list(&l);
    nbd_close(h);
    return status;
}

int list_export_names(const char *uri, char ***names, size_t *n)
{
    struct nbd_handle *h = nbd_create();
    struct list l = { NULL, 0, false };
    int r = -1;

    *names = NULL;
    *n = 0;
    if (!h) {
        log_err("--all-exports: %s", nbd_get_error());
        return -1;
    }
    if (get_list(h, "--all-exports", uri, &l) < 0)
        goto out;                               /* logged */
    if (!(*names = calloc(l.n, sizeof **names))) {
        log_err("--all-exports: out of memory");
        goto out;
    }
    for (size_t i = 0; i < l.n; i++) {
        (*names)[i] = l.v[i].name;              /* moved */
        l.v[i].name = NULL;
    }
    *n = l.n;
    r = 0;
    nbd_opt_abort(h);
out:
    free_list(&l);
    nbd_close(h);
    return r;
}
