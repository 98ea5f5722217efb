/* common/imagekind.h: what the first bytes of a file say it is.
 *
 * One recognizer for the daemon's raw file (a container written where a
 * disk was expected is warned about), its format views (a stream that is
 * not their format is refused, naming what it is) and the format
 * libraries' messages.  Only signatures at fixed offsets of the first
 * sector, so it works on the first write of a copy:
 *   qcow2  "QFI\xfb" at 0              VMDK sparse  "KDMV" at 0
 *   VMDK descriptor "# Disk DescriptorFile" at 0
 *   VHDX   "vhdxfile" at 0             VHD   "conectix" at 0 (a dynamic
 *          or differencing VHD's footer copy; a fixed VHD has its footer
 *          only at the end)
 *   tar    "ustar" at 257 (POSIX and GNU; an OVA is one)
 *   gzip   1f 8b 08 at 0, flags' reserved bits clear
 *   xz     fd 37 7a 58 5a 00 at 0
 *   zstd   28 b5 2f fd at 0 (a zstd frame; one random disk in 2^32)
 * (gzip's two magic bytes alone would match one random disk in 65536.)
 * A buffer shorter than a signature's end does not match it. */
#pragma once
#include <stddef.h>
#include <string.h>

enum image_kind {
    IMAGE_UNKNOWN,            /* none of these: raw data, or unknown */
    IMAGE_QCOW2,
    IMAGE_VMDK,               /* a hosted sparse extent ("KDMV") */
    IMAGE_VMDK_DESCRIPTOR,    /* a text descriptor; the data is elsewhere */
    IMAGE_VHDX,
    IMAGE_VHD,
    IMAGE_TAR,
    IMAGE_GZIP,
    IMAGE_XZ,
    IMAGE_ZSTD,
};

static inline int image_sig_at(const void *buf, size_t len, size_t off,
                               const char *sig, size_t n)
{
    return len >= off + n && memcmp((const char *) buf + off, sig, n) == 0;
}

static inline enum image_kind image_kind(const void *buf, size_t len)
{
    static const struct {
        size_t off, n;
        const char *sig;
        enum image_kind kind;
    } sigs[] = {
        { 0, 4, "QFI\xfb", IMAGE_QCOW2 },
        { 0, 4, "KDMV", IMAGE_VMDK },
        { 0, 21, "# Disk DescriptorFile", IMAGE_VMDK_DESCRIPTOR },
        { 0, 8, "vhdxfile", IMAGE_VHDX },
        { 0, 8, "conectix", IMAGE_VHD },
        { 257, 5, "ustar", IMAGE_TAR },
        { 0, 3, "\x1f\x8b\x08", IMAGE_GZIP },   /* deflate: all there is */
        { 0, 6, "\xfd" "7zXZ\0", IMAGE_XZ },
        { 0, 4, "\x28\xb5\x2f\xfd", IMAGE_ZSTD },
    };
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        if (image_sig_at(buf, len, sigs[i].off, sigs[i].sig, sigs[i].n)) {
            if (sigs[i].kind == IMAGE_GZIP &&
                (len < 4 || (((const unsigned char *) buf)[3] & 0xe0)))
                continue;         /* reserved flag bits: not gzip */
            return sigs[i].kind;
        }
    return IMAGE_UNKNOWN;
}

/* "a qcow2 image", for messages; NULL for IMAGE_UNKNOWN. */
static inline const char *image_kind_name(enum image_kind k)
{
    static const char *const names[] = {
        [IMAGE_UNKNOWN] = NULL,
        [IMAGE_QCOW2] = "a qcow2 image",
        [IMAGE_VMDK] = "a VMDK image",
        [IMAGE_VMDK_DESCRIPTOR] = "a VMDK descriptor",
        [IMAGE_VHDX] = "a VHDX image",
        [IMAGE_VHD] = "a VHD image",
        [IMAGE_TAR] = "a tar archive (an OVA?)",
        [IMAGE_GZIP] = "a gzip stream",
        [IMAGE_XZ] = "an xz stream",
        [IMAGE_ZSTD] = "a zstd stream",
    };
    return (unsigned) k < sizeof names / sizeof names[0] ? names[k] : NULL;
}
