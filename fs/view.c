/* fs/view.c: the mount's files, by inode, and their names (fs/view.h).
 *
 * THREAD MODEL: fs_views_init() and fs_views_fini() run on the main
 * thread, before the mount and after it. */
#include "fs/view.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const struct fs_view *const fs_views[FS_INO_COUNT] = {
    [FS_INO_RAW] = &fs_raw_view,
    [FS_INO_STATUS] = &fs_status_view,
    [FS_INO_VHD] = &fs_vhd_view,
    [FS_INO_VMDK] = &fs_vmdk_view,
    [FS_INO_QCOW2] = &fs_qcow2_view,
    [FS_INO_VHDX] = &fs_vhdx_view,
};

static int name_view(struct fs *fs, const struct fs_view *v, char **out)
{
    if (v->fixed_name)
        *out = strdup(v->fixed_name);
    else if (asprintf(out, "%s%s", fs->filename, v->suffix) == -1)
        *out = NULL;
    return *out ? 0 : -ENOMEM;
}

int fs_views_init(struct fs *fs)
{
    for (unsigned i = 0; i < FS_INO_COUNT; i++) {
        const struct fs_view *v = fs_views[i];
        int r = !v ? 0 : name_view(fs, v, &fs->view_name[i]);
        if (r == 0 && v && v->init)
            r = v->init(fs);
        if (r < 0) {
            fs_views_fini(fs);
            return r;
        }
    }
    return 0;
}

void fs_views_fini(struct fs *fs)
{
    for (unsigned i = FS_INO_COUNT; i-- > 0;) {
        const struct fs_view *v = fs_views[i];
        if (v && v->fini)
            v->fini(fs);          /* a no-op without its state */
        free(fs->view_name[i]);
        fs->view_name[i] = NULL;
    }
}
