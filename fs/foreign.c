/* fs/foreign.c: naming the view or command for a file of the wrong format
 * (fs/foreign.h). */
#include "fs/foreign.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"

/* The advice with the mount's files under mnt ("MNT", or the real
 * mountpoint). */
static const char *advice_in(const struct fs_disk *d, const char *mnt,
                             enum image_kind k, enum fs_ino ino, char *buf,
                             size_t n)
{
    const char *raw = d->view_name[FS_INO_RAW];
    const char *vhd = d->view_name[FS_INO_VHD];
    const char *vmdk = d->view_name[FS_INO_VMDK];
    const char *qcow2 = d->view_name[FS_INO_QCOW2];
    const char *vhdx = d->view_name[FS_INO_VHDX];

    if ((k == IMAGE_VHD && ino == FS_INO_VHD) ||
        (k == IMAGE_VMDK && ino == FS_INO_VMDK) ||
        (k == IMAGE_QCOW2 && ino == FS_INO_QCOW2) ||
        (k == IMAGE_VHDX && ino == FS_INO_VHDX))
        return NULL;
    switch (k) {
    case IMAGE_QCOW2:
        snprintf(buf, n, "write it into %s/%s", mnt, qcow2);
        break;
    case IMAGE_VHDX:
        snprintf(buf, n, "write it into %s/%s", mnt, vhdx);
        break;
    case IMAGE_VMDK:
        snprintf(buf, n, "write it into %s/%s (streamOptimized or "
                 "monolithicSparse), or qemu-img convert -n -O raw "
                 "FILE.vmdk %s/%s", mnt, vmdk, mnt, raw);
        break;
    case IMAGE_VMDK_DESCRIPTOR:
        snprintf(buf, n, "its data is in the extent files it names: use "
                 "qemu-img convert -n -O raw FILE.vmdk %s/%s", mnt, raw);
        break;
    case IMAGE_VHD:
        snprintf(buf, n, "write it into %s/%s", mnt, vhd);
        break;
    case IMAGE_TAR:
        snprintf(buf, n, "tar -xOf FILE.ova DISK.vmdk > %s/%s", mnt, vmdk);
        break;
    case IMAGE_GZIP:
        snprintf(buf, n, "decompress it on the way: gunzip -c FILE.gz > "
                 "%s/%s (or into the view of the image it holds)", mnt, raw);
        break;
    case IMAGE_XZ:
        snprintf(buf, n, "decompress it on the way: xz -dc FILE.xz > "
                 "%s/%s (or into the view of the image it holds)", mnt, raw);
        break;
    case IMAGE_ZSTD:
        snprintf(buf, n, "decompress it on the way: zstd -dc FILE.zst > "
                 "%s/%s (or into the view of the image it holds)", mnt, raw);
        break;
    default:
        return NULL;
    }
    return buf;
}

/* The directory the mount's files are in; a file-mode mount's mountpoint
 * is the raw file itself, and has no views: "MNT" there. */
static const char *mount_dir(const struct fs_disk *d)
{
    return d->cfg->mountpoint && !d->cfg->file_mode ? d->cfg->mountpoint
                                                    : "MNT";
}

const char *foreign_advice(const struct fs_disk *d, enum image_kind k,
                           enum fs_ino ino, char *buf, size_t n)
{
    return advice_in(d, mount_dir(d), k, ino, buf, n);
}

const char *foreign_place(const struct fs_disk *d, const char *msg,
                          char *out, size_t n)
{
    const char *mnt = mount_dir(d), *raw = d->view_name[FS_INO_RAW];
    size_t k = 0;

    if (n == 0)
        return out;
    while (*msg && k + 1 < n) {
        if (strncmp(msg, "MNT/", 4) != 0) {
            out[k++] = *msg++;
            continue;
        }
        msg += 4;
        bool file = strncmp(msg, "nbd", 3) == 0 &&
                    !isalnum((unsigned char) msg[3]) && msg[3] != '.' &&
                    msg[3] != '_' && msg[3] != '-';
        int w = snprintf(out + k, n - k, "%s/%s", mnt, file ? raw : "");
        k = w < 0 ? k : k + (size_t) w < n ? k + (size_t) w : n - 1;
        if (file)
            msg += 3;
    }
    out[k] = '\0';
    return out;
}

int foreign_raw_check(struct fs_disk *d, struct fs_fh *fh, uint64_t off,
                      const void *buf, size_t len)
{
    enum image_kind k = off == 0 ? image_kind(buf, len) : IMAGE_UNKNOWN;
    const char *mnt = mount_dir(d);
    char advice[PATH_MAX + 200];

    if (k == IMAGE_UNKNOWN || d->cfg->raw_images || !fh)
        return 0;
    /* Every later change through this handle fails too: a tool that goes
     * on past an error (dd conv=noerror) must not write the rest of the
     * image file over the disk. */
    __atomic_store_n(&fh->refused, EMEDIUMTYPE, __ATOMIC_RELAXED);
    advice_in(d, mnt, k, FS_INO_RAW, advice, sizeof advice);
    log_err("%s/%s: it is %s: %s, or mount with --raw-images to store "
            "image files as raw bytes (EMEDIUMTYPE: pid %d (%s): this write "
            "at offset 0 and every later one of its copy refused)", mnt,
            d->view_name[FS_INO_RAW], image_kind_name(k), advice,
            (int) fh->tgid, fh->comm);
    return -EMEDIUMTYPE;
}

void foreign_raw_write(struct fs_disk *d, uint64_t off, const void *buf,
                       size_t len)
{
    if (off != 0)
        return;
    enum image_kind k = image_kind(buf, len);
    char advice[PATH_MAX + 200];
    if (k == IMAGE_UNKNOWN ||
        __atomic_exchange_n(&d->foreign_warned, true, __ATOMIC_RELAXED))
        return;
    foreign_advice(d, k, FS_INO_RAW, advice, sizeof advice);
    log_warn("%s: written as asked, but it is %s: the disk now holds the "
             "image file, not the disk inside it; %s",
             d->view_name[FS_INO_RAW], image_kind_name(k), advice);
}

void foreign_raw_pass(struct fs_disk *d)
{
    __atomic_store_n(&d->foreign_warned, false, __ATOMIC_RELAXED);
}
