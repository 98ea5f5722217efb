/* tools/verify/probe.c: what a file holds, from its first bytes
 * (verify.h, source_probe_head()): below the sources that ask. */
#include <string.h>

#include "tools/verify/verify.h"

static const char *const probed_names[] = {
    [PROBED_RAW] = "raw", [PROBED_VHD] = "VHD", [PROBED_VMDK] = "VMDK",
    [PROBED_VMDK_DESCRIPTOR] = "VMDK descriptor (its extents are other "
                               "files)",
    [PROBED_QCOW2] = "qcow2 image", [PROBED_VHDX] = "VHDX image",
    [PROBED_TAR] = "tar archive (an OVA?)",
};

static bool bytes_at(const unsigned char *head, size_t n, size_t off,
                     const char *magic, size_t len)
{
    return off + len <= n && memcmp(head + off, magic, len) == 0;
}

/* PROBED_* from the first n bytes (a VHD only by its footer copy). */
int source_probe_head(const void *head_, size_t n)
{
    const unsigned char *head = head_;
    if (bytes_at(head, n, 0, "conectix", 8))
        return PROBED_VHD;
    if (bytes_at(head, n, 0, "KDMV", 4))
        return PROBED_VMDK;
    if (bytes_at(head, n, 0, "# Disk DescriptorFile", 21))
        return PROBED_VMDK_DESCRIPTOR;
    if (bytes_at(head, n, 0, "QFI\xfb", 4))
        return PROBED_QCOW2;
    if (bytes_at(head, n, 0, "vhdxfile", 8))
        return PROBED_VHDX;
    if (bytes_at(head, n, 257, "ustar", 5))
        return PROBED_TAR;
    return PROBED_RAW;
}

const char *source_probed_name(int p)
{
    return probed_names[p];
}

const char *source_probe_stream(const void *head, size_t n)
{
    int p = source_probe_head(head, n);
    return p == PROBED_RAW ? NULL : probed_names[p];
}
