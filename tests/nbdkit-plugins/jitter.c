/* nbdkit-jitter-plugin: a RAM disk whose writes, zeroes and trims each
 * sleep a random time before they apply.
 *
 *   nbdkit nbdkit-jitter-plugin.so size=64M maxdelay=20000 [init=FILE]
 *
 * size:     export size (nbdkit size syntax; default 64M)
 * maxdelay: the longest sleep in microseconds (default 20000); each
 *           request sleeps a uniformly random 0..maxdelay
 * init:     a file whose bytes are the initial contents (the rest reads
 *           as zero)
 *
 * Requests are served in parallel (THREAD_MODEL_PARALLEL), so requests in
 * flight together complete in random order.  A daemon that lets two
 * overlapping requests be in flight at once loses the newer bytes here
 * about half of the time, where nbdkit's fixed delay filter would usually
 * keep them in order.  This is what catches ordering and buffer-ownership
 * bugs in the integration tests (tests/lib/servers.py starts it).
 *
 * THREAD MODEL: nbdkit's worker threads call every callback concurrently;
 * the disk array is written without locks (overlapping requests race, as
 * on a real disk), the random seed is per thread.
 */

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL

static int64_t size = 64 << 20;
static long maxdelay = 20000;                     /* microseconds */
static char *disk;
static const char *init;                          /* initial contents */
static __thread unsigned seed;

static int j_config(const char *key, const char *value)
{
  if (strcmp(key, "size") == 0) {
    size = nbdkit_parse_size(value);
    return size < 0 ? -1 : 0;
  }
  if (strcmp(key, "maxdelay") == 0) {
    maxdelay = atol(value);
    return 0;
  }
  if (strcmp(key, "init") == 0) {
    init = value;
    return 0;
  }
  nbdkit_error("unknown parameter %s", key);
  return -1;
}

static int j_get_ready(void)
{
  disk = calloc(1, size);
  if (disk == NULL)
    return -1;
  if (init) {
    FILE *f = fopen(init, "rb");
    if (f == NULL) {
      nbdkit_error("%s: %m", init);
      return -1;
    }
    size_t n = fread(disk, 1, size, f);
    (void) n;
    fclose(f);
  }
  return 0;
}

static void *j_open(int readonly) { return NBDKIT_HANDLE_NOT_NEEDED; }
static int64_t j_get_size(void *h) { return size; }
static int j_yes(void *h) { return 1; }

static void jitter(void)
{
  if (seed == 0)
    seed = (unsigned) (uintptr_t) pthread_self() ^ (unsigned) time(NULL);
  long us = maxdelay > 0 ? rand_r(&seed) % (maxdelay + 1) : 0;
  struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };
  nanosleep(&ts, NULL);
}

static int j_pread(void *h, void *buf, uint32_t n, uint64_t off,
                   uint32_t flags)
{
  memcpy(buf, disk + off, n);
  return 0;
}

static int j_pwrite(void *h, const void *buf, uint32_t n, uint64_t off,
                    uint32_t flags)
{
  jitter();
  memcpy(disk + off, buf, n);
  return 0;
}

static int j_zero(void *h, uint32_t n, uint64_t off, uint32_t flags)
{
  jitter();
  memset(disk + off, 0, n);
  return 0;
}

static int j_flush(void *h, uint32_t flags) { return 0; }

static struct nbdkit_plugin plugin = {
  .name = "jitter",
  .config = j_config,
  .get_ready = j_get_ready,
  .open = j_open,
  .get_size = j_get_size,
  .can_write = j_yes,
  .can_flush = j_yes,
  .can_trim = j_yes,
  .can_zero = j_yes,
  .can_multi_conn = j_yes,
  .pread = j_pread,
  .pwrite = j_pwrite,
  .zero = j_zero,
  .trim = j_zero,
  .flush = j_flush,
};
NBDKIT_REGISTER_PLUGIN(plugin)
