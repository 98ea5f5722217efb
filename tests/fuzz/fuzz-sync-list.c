/* tests/fuzz/fuzz-sync-list.c: libFuzzer target for nbdferry-sync's
 * change-list parsers (tools/sync/changed.c, sync_list_parse()).  Input:
 * the first byte picks the parser (bits 0-1: auto, xapi, extents, auto)
 * and the disk's size (bits 2-6: 1 to 32 blocks of 64 KiB; bit 7: one
 * byte less), the rest is the list.  Checks, besides ASan/UBSan/LeakSanitizer: a refusal comes with
 * a reason; an accepted list marks no block past the disk's end. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "tools/sync/sync.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const enum sync_list_kind kinds[] = {
        SYNC_LIST_AUTO, SYNC_LIST_XAPI, SYNC_LIST_EXTENTS, SYNC_LIST_AUTO,
    };
    struct sync_list l;
    struct nbdf_err err = { "" };

    if (size < 1)
        return 0;
    uint64_t disk = (uint64_t) ((data[0] >> 2 & 31) + 1) * SYNC_BLOCK -
                    (data[0] & 0x80 ? 1 : 0);
    if (sync_list_init(&l, disk) < 0)
        abort();
    int r = sync_list_parse(kinds[data[0] & 3],
                            (const char *) data + 1, size - 1, &l, NULL,
                            &err);
    if (r < 0 && (r != -EINVAL || err.msg[0] == '\0'))
        abort();
    for (uint64_t b = l.nblocks; r == 0 && b < (l.nblocks / 8 + 1) * 8; b++)
        if (sync_list_has(&l, b))
            abort();
    sync_list_free(&l);
    return 0;
}
