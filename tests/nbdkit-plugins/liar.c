/* tests/nbdkit-plugins/liar.c: a RAM disk that lies (read-back tests).
 *   dropzero=1  a write-zeroes of 1 MiB or more zeroes only its first half
 *               (the loss nbd-server 3.24 shows past 64 MiB), and succeeds;
 *   flip=OFF    a write covering byte OFF lands with that byte inverted,
 *               and succeeds;
 *   failread=PATH  reads fail with EIO while PATH exists;
 *   failwrite=PATH  writes fail with EIO while PATH exists;
 *   zerolie=1   a write-zeroes changes nothing (but for the partial
 *               sectors at its ends) and succeeds, and block status
 *               then reports its whole sectors as zero (hole|zero): the
 *               lie that only reading the bytes back can see.
 * Without zerolie, no block status: everything is data, as on
 * nbd-server. */
#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL

static int64_t size, flip = -1;
static int dropzero, zerolie;
static char *disk;
static unsigned char *lied;             /* zerolie: per sector, 1 = said zero */

#define SECTOR 512
static const char *failread, *failwrite;

static int l_config(const char *key, const char *value)
{
  if (strcmp(key, "size") == 0)
    return (size = nbdkit_parse_size(value)) < 0 ? -1 : 0;
  if (strcmp(key, "flip") == 0)
    return (flip = nbdkit_parse_size(value)) < 0 ? -1 : 0;
  if (strcmp(key, "dropzero") == 0) {
    dropzero = atoi(value);
    return 0;
  }
  if (strcmp(key, "zerolie") == 0) {
    zerolie = atoi(value);
    return 0;
  }
  if (strcmp(key, "failwrite") == 0) {
    failwrite = strdup(value);
    return 0;
  }
  if (strcmp(key, "failread") == 0) {
    failread = strdup(value);
    return 0;
  }
  nbdkit_error("unknown parameter %s", key);
  return -1;
}

static int l_get_ready(void)
{
  disk = calloc(1, size);
  if (zerolie)
    lied = calloc(1, size / SECTOR + 1);
  return disk && (!zerolie || lied) ? 0 : -1;
}

static void *l_open(int readonly) { return NBDKIT_HANDLE_NOT_NEEDED; }
static int64_t l_get_size(void *h) { return size; }
static int l_yes(void *h) { return 1; }
static int l_can_extents(void *h) { return zerolie; }

/* Sectors [off, off + n) cover: no longer said zero. */
static void told_truth(uint64_t off, uint64_t n)
{
  if (lied && n)
    memset(lied + off / SECTOR, 0, (off + n - 1) / SECTOR - off / SECTOR + 1);
}

static int l_pread(void *h, void *buf, uint32_t n, uint64_t off,
                   uint32_t flags)
{
  if (failread && access(failread, F_OK) == 0) {
    nbdkit_set_error(EIO);
    return -1;
  }
  memcpy(buf, disk + off, n);
  return 0;
}

static int l_pwrite(void *h, const void *buf, uint32_t n, uint64_t off,
                    uint32_t flags)
{
  if (failwrite && access(failwrite, F_OK) == 0) {
    nbdkit_set_error(EIO);
    return -1;
  }
  memcpy(disk + off, buf, n);
  told_truth(off, n);
  if (flip >= 0 && (uint64_t) flip >= off && (uint64_t) flip < off + n)
    disk[flip] = ~disk[flip];
  return 0;
}

/* zerolie: zero the partial sectors at the ends for real (they hold
 * data either side), lie about the whole ones. */
static int lie_zero(uint32_t n, uint64_t off)
{
  uint64_t end = off + n;
  uint64_t a = (off + SECTOR - 1) / SECTOR * SECTOR, b = end / SECTOR * SECTOR;

  if (a >= b) {
    memset(disk + off, 0, n);
    return 0;
  }
  memset(disk + off, 0, a - off);
  memset(disk + b, 0, end - b);
  memset(lied + a / SECTOR, 1, (b - a) / SECTOR);
  return 0;
}

static int l_zero(void *h, uint32_t n, uint64_t off, uint32_t flags)
{
  if (zerolie)
    return lie_zero(n, off);
  memset(disk + off, 0, dropzero && n >= (1u << 20) ? n / 2 : n);
  return 0;                             /* success, whatever happened */
}

static int l_flush(void *h, uint32_t flags) { return 0; }

static int l_extents(void *h, uint32_t n, uint64_t off, uint32_t flags,
                     struct nbdkit_extents *ext)
{
  uint64_t end = off + n, pos = off;

  while (pos < end) {
    uint64_t s = pos / SECTOR;
    unsigned char said = lied[s];
    uint64_t next = (s + 1) * SECTOR;
    while (next < end && lied[next / SECTOR] == said)
      next += SECTOR;
    if (next > end)
      next = end;
    if (nbdkit_add_extent(ext, pos, next - pos,
                          said ? NBDKIT_EXTENT_HOLE | NBDKIT_EXTENT_ZERO : 0)
        == -1)
      return -1;
    pos = next;
  }
  return 0;
}

static struct nbdkit_plugin plugin = {
  .name = "liar",
  .config = l_config,
  .get_ready = l_get_ready,
  .open = l_open,
  .get_size = l_get_size,
  .can_write = l_yes,
  .can_flush = l_yes,
  .can_zero = l_yes,
  .can_multi_conn = l_yes,
  .can_extents = l_can_extents,
  .pread = l_pread,
  .pwrite = l_pwrite,
  .zero = l_zero,
  .flush = l_flush,
  .extents = l_extents,
};
NBDKIT_REGISTER_PLUGIN(plugin)
