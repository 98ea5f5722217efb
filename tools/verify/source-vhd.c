/* tools/verify/source-vhd.c: VHD images as SOURCE.
 *
 * Detection is here; decoding belongs to the vhd/ library.  Until it is
 * wired in, src_vhd_open() refuses with -ENOTSUP and a message that points
 * at --raw (hash the container bytes as they are).
 *
 * TODO(vhd): wire the vhd/ library in.  The reader is a simple source:
 *   - size:   the footer's current size (virtual disk size);
 *   - extent: a fixed VHD is one data extent; for dynamic and differencing
 *             VHDs, a BAT entry 0xFFFFFFFF is a known-zero block (for
 *             differencing: a parent's block, so the chain must be opened);
 *             an allocated block is data, or zero for sectors its bitmap
 *             leaves clear (dynamic) -- merge runs so extents stay large;
 *   - read:   pread the sectors of allocated blocks from the file.
 * Link it with target_link_libraries(nbdferry-verify PRIVATE vhd) in
 * tools/verify.cmake.  source.c already routes VHD files here.
 */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "tools/verify/verify.h"

#define VHD_COOKIE "conectix"
#define VHD_SECTOR 512

static int cookie_at(int fd, uint64_t off)
{
    char buf[sizeof VHD_COOKIE - 1];
    ssize_t n = pread(fd, buf, sizeof buf, (off_t) off);

    if (n == -1)
        return -errno;
    return n == (ssize_t) sizeof buf && memcmp(buf, VHD_COOKIE, sizeof buf) == 0;
}

/* Dynamic and differencing VHDs start with a copy of the footer; every VHD
 * ends with one (fixed VHDs have nothing else). */
int src_vhd_probe(int fd, uint64_t size)
{
    if (size < VHD_SECTOR)
        return 0;
    int r = cookie_at(fd, 0);
    if (r != 0)
        return r;
    return cookie_at(fd, size - VHD_SECTOR);
}

int src_vhd_open(const char *path, int fd, const struct source_options *opt,
                 struct verify_source **out)
{
    close(fd);
    *out = NULL;
    verify_err("%s: VHD image; decoding VHD is not built in yet "
               "(--raw hashes the file as it is)", path);
    return -ENOTSUP;
}
