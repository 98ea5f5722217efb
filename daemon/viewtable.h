/* daemon/viewtable.h: the files a disk of the mount shows, by slot: the
 * table the daemon hands the mount (struct fs's views; fs/view.h).  A new
 * view is one file defining its struct fs_view (views/, fs/), its slot
 * in enum fs_ino (fs/fs.h) and one line here. */
#pragma once

#include "fs/view.h"

extern const struct fs_view *const nbdferry_views[FS_INO_COUNT];
