/* tests/fuzz/fuzz-qcow2-parse.c: libFuzzer target for the qcow2 header
 * parser.  Input: the first bytes of a file (any length).  Oracles: no
 * crash or sanitizer report; a failure names its rule (non-empty
 * message); an accepted header obeys what the decoder relies on (cluster
 * bits in range, tables aligned and inside 2^56, the L1 covering the
 * disk, a NUL-terminated backing name); lint never crashes. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qcow2/qcow2.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void warn(void *opaque, const char *msg)
{
    (void) opaque;
    if (!msg[0])
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct qcow2_header h;
    struct nbdf_err e = { "" };

    (void) qcow2_header_need(data, size);
    int r = qcow2_header_decode(data, size, &h, &e);
    if (r < 0) {
        if (!e.msg[0] || (r != -EINVAL && r != -EMEDIUMTYPE && r != -EFBIG))
            abort();
        return 0;
    }
    uint64_t c = qcow2_cluster_size(&h);
    if (h.cluster_bits < 9 || h.cluster_bits > 21 || h.crypt_method ||
        h.l1_table_offset % c || h.refcount_table_offset % c ||
        h.l1_table_offset >= QCOW2_MAX_HOST_OFFSET ||
        (uint64_t) h.l1_size * c * qcow2_l2_entries(&h) < h.size ||
        strlen(h.backing_file) > QCOW2_MAX_BACKING_NAME ||
        h.ext_end > c)
        abort();
    qcow2_lint(&h, warn, NULL);
    return 0;
}
