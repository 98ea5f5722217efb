/* tests/fuzz/fuzz-manifest.c: libFuzzer target for the manifest file's
 * parser (manifest/manifest.c, manifest_parse()).  Input: a manifest
 * file for a fixed identity (the key, 64 blocks of 64 KiB).  Checks,
 * besides ASan/UBSan/LeakSanitizer: a refusal comes with a reason and
 * leaves the manifest empty; an accepted file's counts stay within the
 * export, and every block answers a lookup. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "manifest/manifest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const struct manifest_id id = { .key = "unix:1:2|disk",
                                           .size = 64ull << 16,
                                           .block_size = 65536 };
    struct manifest *m;
    struct manifest_stats st;
    struct nbdf_err why = { "" };
    unsigned char d[MF_DIGEST];

    if (manifest_create(&id, &m) < 0)
        abort();
    int r = manifest_parse(m, data, size, &why);
    manifest_get_stats(m, &st);
    if (r < 0 && (why.msg[0] == '\0' || st.data || st.zero))
        abort();
    if (st.data + st.zero > st.blocks || st.blocks != 64)
        abort();
    for (uint64_t b = 0; b < st.blocks; b++)
        manifest_lookup(m, b, d);
    manifest_free(m);
    return 0;
}
