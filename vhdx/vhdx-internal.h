/* vhdx/vhdx-internal.h: shared by the files of vhdx/ only. */
#ifndef NBDFERRY_VHDX_INTERNAL_H
#define NBDFERRY_VHDX_INTERNAL_H
#include <pthread.h>

#include "vhdx/vhdx.h"

/* format.c */
uint16_t vhdx_le16(const void *p);
uint32_t vhdx_le32(const void *p);
uint64_t vhdx_le64(const void *p);
extern const uint8_t vhdx_guid_bat[16], vhdx_guid_metadata[16],
    vhdx_guid_file_params[16], vhdx_guid_disk_size[16], vhdx_guid_page83[16],
    vhdx_guid_logical_sector[16], vhdx_guid_physical_sector[16],
    vhdx_guid_parent_locator[16];

#endif /* NBDFERRY_VHDX_INTERNAL_H */
