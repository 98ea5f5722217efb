/* tests/nbdkit-plugins/shortext.c:
 * A 64 MiB RAM disk of zeros whose block status answers one extent of at
 * most 1 MiB per request, whatever length was asked for: even MiBs "hole,
 * zero", odd MiBs data (the bytes are zero either way; only the claim
 * matters here).  Real servers answer short too (qemu-nbd caps the extents
 * in one reply).  The scan must ask again for the rest of each window.
 */
#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>
#include <stdint.h>
#include <string.h>

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL
#define SIZE (64 << 20)
#define MIB (1 << 20)

static char disk[SIZE];

static void *s_open(int readonly) { return NBDKIT_HANDLE_NOT_NEEDED; }
static int64_t s_get_size(void *h) { return SIZE; }
static int s_yes(void *h) { return 1; }

static int s_pread(void *h, void *buf, uint32_t n, uint64_t off,
                   uint32_t flags)
{
  memcpy(buf, disk + off, n);
  return 0;
}

static int s_pwrite(void *h, const void *buf, uint32_t n, uint64_t off,
                    uint32_t flags)
{
  memcpy(disk + off, buf, n);
  return 0;
}

static int s_extents(void *h, uint32_t n, uint64_t off, uint32_t flags,
                     struct nbdkit_extents *e)
{
  uint64_t end = (off / MIB + 1) * MIB;
  uint32_t type = (off / MIB) % 2 ? 0 : NBDKIT_EXTENT_HOLE | NBDKIT_EXTENT_ZERO;
  return nbdkit_add_extent(e, off, end - off, type);
}

static int s_flush(void *h, uint32_t flags) { return 0; }

static struct nbdkit_plugin plugin = {
  .name = "shortextents",
  .open = s_open,
  .get_size = s_get_size,
  .can_write = s_yes,
  .can_flush = s_yes,
  .can_multi_conn = s_yes,
  .can_extents = s_yes,
  .pread = s_pread,
  .pwrite = s_pwrite,
  .extents = s_extents,
  .flush = s_flush,
};
NBDKIT_REGISTER_PLUGIN(plugin)
