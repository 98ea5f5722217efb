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

int list_exports(const char *uri)
{
    struct nbd_handle *h = nbd_create();
    struct list l = { NULL, 0, false };
    int status = 1;

    if (!h) {
        log_err("--list: %s", nbd_get_error());
        return 1;
    }
    if (connect_listing(h, uri) == -1) {
        log_err("--list %s: %s", uri, nbd_get_error());
        goto out;
    }
    if (nbd_opt_list(h, (nbd_list_callback){ .callback = add_export,
                                             .user_data = &l }) == -1) {
        log_err("--list %s: the server does not list its exports: %s", uri,
                nbd_get_error());
        goto out;
    }
    if (l.oom) {
        log_err("--list: out of memory");
        goto out;
    }
    if (l.n == 0) {
        log_err("--list %s: the server lists no exports", uri);
        goto out;
    }
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
    for (size_t i = 0; i < l.n; i++) {
        free(l.v[i].name);
        free(l.v[i].desc);
    }
    free(l.v);
    nbd_close(h);
    return status;
}
