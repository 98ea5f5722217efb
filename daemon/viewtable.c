/* daemon/viewtable.c: the view table (daemon/viewtable.h). */
#include "daemon/viewtable.h"

const struct fs_view *const nbdferry_views[FS_INO_COUNT] = {
    [FS_INO_RAW] = &fs_raw_view,
    [FS_INO_STATUS] = &fs_status_view,
    [FS_INO_VHD] = &fs_vhd_view,
    [FS_INO_VMDK] = &fs_vmdk_view,
    [FS_INO_QCOW2] = &fs_qcow2_view,
    [FS_INO_VHDX] = &fs_vhdx_view,
};
