/* fs/view.c: the mount's files' names and their views' set-up, from the
 * view table the daemon handed the mount (fs/view.h).
 *
 * THREAD MODEL: fs_views_init() and fs_views_fini() run on the main
 * thread, before the mount and after it. */
#include "fs/view.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int name_view(struct fs_disk *d, const struct fs_view *v, char **out)
{
    if (v->fixed_name)
        *out = strdup(v->fixed_name);
    else if (asprintf(out, "%s%s", d->filename, v->suffix) == -1)
        *out = NULL;
    return *out ? 0 : -ENOMEM;
}

int fs_views_init(struct fs_disk *d)
{
    for (unsigned i = 0; i < FS_INO_COUNT; i++) {
        const struct fs_view *v = fs_view_of(d->fs, fs_ino_of(d->index, i));
        int r = !v ? 0 : name_view(d, v, &d->view_name[i]);
        if (r == 0 && v && v->init)
            r = v->init(d);
        if (r < 0) {
            fs_views_fini(d);
            return r;
        }
    }
    return 0;
}

void fs_views_fini(struct fs_disk *d)
{
    for (unsigned i = FS_INO_COUNT; i-- > 0;) {
        const struct fs_view *v = fs_view_of(d->fs, fs_ino_of(d->index, i));
        if (v && v->fini)
            v->fini(d);          /* a no-op without its state */
        free(d->view_name[i]);
        d->view_name[i] = NULL;
    }
}
