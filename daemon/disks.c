/* daemon/disks.c: the disks of a mount of several (see daemon/disks.h). */
#include "daemon/disks.h"
#include "daemon/viewtable.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fs/view.h"

#define DISK_NAME_MAX 255     /* NAME_MAX: each view's name must fit */

bool disks_is_named(const char *arg)
{
    const char *eq = strchr(arg, '=');
    const char *scheme = strstr(arg, "://");

    /* A URI's own '=' (?socket=) comes after its "://". */
    return eq && scheme && eq < scheme && strstr(eq + 1, "://") == scheme;
}

bool disks_form(int argc, char **argv)
{
    return argc > 0 && (strcmp(argv[0], "--all-exports") == 0 ||
                        disks_is_named(argv[0]));
}

bool disks_uri_has_export(const char *uri)
{
    const char *auth = strstr(uri, "://");
    if (!auth)
        return false;
    auth += 3;
    const char *path = auth + strcspn(auth, "/?#");
    return *path == '/' && path[1] && !strchr("?#", path[1]);
}

void disks_free(struct cli_disk *v, unsigned n)
{
    for (unsigned i = 0; v && i < n; i++) {
        free(v[i].name);
        free(v[i].uri);
    }
    free(v);
}

int disks_parse_named(int argc, char **argv, struct cli_disk **out,
                      unsigned *n, struct nbdf_err *err)
{
    struct cli_disk *v = calloc((size_t) argc, sizeof *v);

    *out = NULL;
    *n = 0;
    if (!v)
        return nbdf_errf(err, -ENOMEM, "%s", strerror(ENOMEM));
    for (int i = 0; i < argc; i++) {
        const char *eq = strchr(argv[i], '=');
        if (!disks_is_named(argv[i])) {
            disks_free(v, (unsigned) i);
            return nbdf_errf(err, -EINVAL, "'%s' is not NAME=URI: "
                             "several disks are each NAME=URI", argv[i]);
        }
        v[i].name = strndup(argv[i], (size_t) (eq - argv[i]));
        v[i].uri = strdup(eq + 1);
        if (!v[i].name || !v[i].uri) {
            disks_free(v, (unsigned) i + 1);
            return nbdf_errf(err, -ENOMEM, "%s", strerror(ENOMEM));
        }
    }
    *out = v;
    *n = (unsigned) argc;
    return 0;
}

char *disks_export_uri(const char *uri, const char *name)
{
    const char *auth = strstr(uri, "://");
    if (!auth)
        return NULL;
    auth += 3;
    size_t head = (size_t) (auth - uri) + strcspn(auth, "/?#");
    const char *query = strchr(uri + head, '?');
    char *enc = malloc(strlen(name) * 3 + 1), *p = enc;
    if (!enc)
        return NULL;
    for (const unsigned char *s = (const unsigned char *) name; *s; s++) {
        if ((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
            (*s >= '0' && *s <= '9') || strchr("-._~", *s))
            *p++ = (char) *s;
        else
            p += sprintf(p, "%%%02X", *s);
    }
    *p = '\0';
    char *out;
    if (asprintf(&out, "%.*s/%s%s", (int) head, uri, enc,
                 query ? query : "") == -1)
        out = NULL;
    free(enc);
    return out;
}

/* One disk's name as a file name. */
static int check_name(const char *name, struct nbdf_err *err)
{
    size_t longest = 0;

    for (unsigned i = 0; i < FS_INO_COUNT; i++)
        if (nbdferry_views[i] && nbdferry_views[i]->suffix &&
            strlen(nbdferry_views[i]->suffix) > longest)
            longest = strlen(nbdferry_views[i]->suffix);
    if (!name[0])
        return nbdf_errf(err, -EINVAL, "a disk's name is empty: "
                         "NAME=URI needs a NAME");
    if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return nbdf_errf(err, -EINVAL, "disk name '%s' cannot be a "
                         "file name", name);
    for (const unsigned char *s = (const unsigned char *) name; *s; s++) {
        if (*s == '/')
            return nbdf_errf(err, -EINVAL, "disk name '%s' has a '/': "
                             "a disk is a file in the mount, not in a "
                             "directory of it", name);
        if (*s < 0x20 || *s == 0x7f)
            return nbdf_errf(err, -EINVAL, "disk name '%s' has a "
                             "control character (0x%02x)", name, *s);
    }
    if (strlen(name) + longest > DISK_NAME_MAX)
        return nbdf_errf(err, -ENAMETOOLONG, "disk name '%.40s...' is "
                         "too long: %zu bytes, at most %zu (its views add a "
                         "suffix)", name, strlen(name),
                         (size_t) DISK_NAME_MAX - longest);
    return 0;
}

/* The name of disk i's file in slot (its raw file, a view); malloc'd. */
static char *file_name(const struct cli_disk *d, unsigned slot)
{
    const struct fs_view *v = nbdferry_views[slot];
    char *s;

    if (!v || v->fixed_name)
        return NULL;
    return asprintf(&s, "%s%s", d->name, v->suffix) == -1 ? NULL : s;
}

/* Does any file of disk a have the name of a file of disk b (or, a == b
 * not asked, the status file's)? */
static int check_clash(const struct cli_disk *v, unsigned a, unsigned b,
                       struct nbdf_err *err)
{
    int r = 0;

    for (unsigned i = 0; i < FS_INO_COUNT && r == 0; i++) {
        char *x = file_name(&v[a], i);
        for (unsigned j = 0; x && j < FS_INO_COUNT && r == 0; j++) {
            char *y = a == b ? NULL : file_name(&v[b], j);
            if (a == b && j == 0 && strcmp(x, FS_STATUS_NAME) == 0)
                r = nbdf_errf(err, -EINVAL, "disk name '%s': its "
                              "file %s is the status file's name", v[a].name,
                              x);
            else if (y && strcmp(x, y) == 0)
                r = nbdf_errf(err, -EEXIST, "disks '%s' and '%s' "
                              "clash: both would show a file %s", v[a].name,
                              v[b].name, x);
            free(y);
        }
        free(x);
    }
    return r;
}

int disks_check_names(const struct cli_disk *v, unsigned n,
                      struct nbdf_err *err)
{
    int r = 0;

    for (unsigned a = 0; a < n && r == 0; a++)
        r = check_name(v[a].name, err);
    for (unsigned a = 0; a < n && r == 0; a++)
        for (unsigned b = a; b < n && r == 0; b++)
            r = check_clash(v, a, b, err);
    return r;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const struct cli_disk *) a)->name,
                  ((const struct cli_disk *) b)->name);
}

void disks_sort(struct cli_disk *v, unsigned n)
{
    if (n > 1)
        qsort(v, n, sizeof *v, by_name);
}
