/* Unit test for common/imagekind.h: each signature at its offset, cut
 * one byte short (no match), and data that only resembles one. */
#undef NDEBUG
#include <assert.h>
#include <string.h>

#include "common/imagekind.h"

static unsigned char buf[512];

static enum image_kind with(size_t off, const void *sig, size_t n,
                            size_t len)
{
    memset(buf, 0xa5, sizeof buf);
    memcpy(buf + off, sig, n);
    return image_kind(buf, len);
}

int main(void)
{
    static const struct {
        size_t off, n;
        const char *sig;
        enum image_kind kind;
        size_t cut;                   /* a length one short of the match */
    } cases[] = {
        { 0, 4, "QFI\xfb", IMAGE_QCOW2, 3 },
        { 0, 4, "KDMV", IMAGE_VMDK, 3 },
        { 0, 21, "# Disk DescriptorFile", IMAGE_VMDK_DESCRIPTOR, 20 },
        { 0, 8, "vhdxfile", IMAGE_VHDX, 7 },
        { 0, 8, "conectix", IMAGE_VHD, 7 },
        { 257, 6, "ustar\0", IMAGE_TAR, 261 },   /* POSIX */
        { 257, 8, "ustar  \0", IMAGE_TAR, 261 }, /* GNU */
        { 0, 4, "\x1f\x8b\x08\x00", IMAGE_GZIP, 3 },
        { 0, 6, "\xfd\x37\x7a\x58\x5a\x00", IMAGE_XZ, 5 },
        { 0, 4, "\x28\xb5\x2f\xfd", IMAGE_ZSTD, 3 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert(with(cases[i].off, cases[i].sig, cases[i].n, sizeof buf) ==
               cases[i].kind);
        assert(image_kind_name(cases[i].kind) != NULL);
        /* Cut inside the signature: no match. */
        assert(with(cases[i].off, cases[i].sig, cases[i].n, cases[i].cut) ==
               IMAGE_UNKNOWN);
    }
    /* Near misses. */
    assert(with(0, "QFI\xfa", 4, sizeof buf) == IMAGE_UNKNOWN);
    assert(with(1, "KDMV", 4, sizeof buf) == IMAGE_UNKNOWN);
    assert(with(0, "conectiX", 8, sizeof buf) == IMAGE_UNKNOWN);
    assert(with(256, "ustar", 5, sizeof buf) == IMAGE_UNKNOWN);
    assert(with(0, "\x1f\x8b\x07\x00", 4, sizeof buf) == IMAGE_UNKNOWN);
    assert(with(0, "\x1f\x8b\x08\x20", 4, sizeof buf) == IMAGE_UNKNOWN);
    assert(with(0, "\xfd\x37\x7a\x58\x5a\x01", 6, sizeof buf) ==
           IMAGE_UNKNOWN);
    assert(with(0, "\x28\xb5\x2f\xfe", 4, sizeof buf) == IMAGE_UNKNOWN);
    memset(buf, 0, sizeof buf);
    assert(image_kind(buf, sizeof buf) == IMAGE_UNKNOWN);
    assert(image_kind(NULL, 0) == IMAGE_UNKNOWN);
    assert(image_kind_name(IMAGE_UNKNOWN) == NULL);
    return 0;
}
