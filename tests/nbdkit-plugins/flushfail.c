/* nbdkit-flushfail-plugin: a file-backed disk whose flush can fail.
 *
 *   nbdkit nbdkit-flushfail-plugin.so file=DISK flag=PATH flush-error-rate=N
 *
 * nbdkit 1.32's error filter cannot fail NBD flush.  This plugin does:
 * while the file named by flag= exists, each flush fails with EIO with
 * probability flush-error-rate (0..100 percent, default 100).  Writes go
 * to the backing file with pwrite, so a flush failure loses nothing here:
 * it only tests that the failure is reported.
 *
 *   ... fail-once=1
 *
 *   ... no-flush=1
 *
 * A server that does not offer NBD flush at all (writes are as durable
 * as it makes them): a client can never have a write covered by a flush.
 *
 * A passing server error instead: while the flag exists, the first write
 * and the first zero at each offset fail with EIO and every later one
 * there succeeds, and every other flush fails (the first fails): the
 * daemon's retries of EIO must hide all of it.
 *
 * THREAD MODEL: nbdkit's worker threads call every callback concurrently;
 * pread/pwrite on the one descriptor need no lock, the random seed is per
 * thread.
 */

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL

static const char *file, *flag;
static int rate = 100, fd = -1, fail_once, no_flush;
static __thread unsigned seed;

/* fail-once: the offsets that failed already (a small open hash set). */
#define SEEN_SLOTS 65536
static uint64_t seen[SEEN_SLOTS];     /* offset + 1; 0: empty */
static unsigned flushes;
static pthread_mutex_t seen_lock = PTHREAD_MUTEX_INITIALIZER;

/* True the first time off is asked about (while the flag exists). */
static int first_time(uint64_t off, int zero)
{
  uint64_t key = (off << 1 | (uint64_t) zero) + 1;
  unsigned i = (unsigned) ((key * 0x9e3779b97f4a7c15ull) >> 48) % SEEN_SLOTS;
  int first = 0;

  if (!flag || access(flag, F_OK) != 0)
    return 0;
  pthread_mutex_lock(&seen_lock);
  for (unsigned n = 0; n < SEEN_SLOTS; n++, i = (i + 1) % SEEN_SLOTS) {
    if (seen[i] == key)
      break;
    if (seen[i] == 0) {
      seen[i] = key;
      first = 1;
      break;
    }
  }
  pthread_mutex_unlock(&seen_lock);
  return first;
}

static int injected(const char *what)
{
  nbdkit_error("injected %s failure", what);
  errno = EIO;
  return -1;
}

static int f_config(const char *key, const char *value)
{
  if (strcmp(key, "file") == 0)
    file = value;
  else if (strcmp(key, "flag") == 0)
    flag = value;
  else if (strcmp(key, "flush-error-rate") == 0)
    rate = atoi(value);
  else if (strcmp(key, "fail-once") == 0)
    fail_once = atoi(value);
  else if (strcmp(key, "no-flush") == 0)
    no_flush = atoi(value);
  else {
    nbdkit_error("unknown parameter %s", key);
    return -1;
  }
  return 0;
}

static int f_get_ready(void)
{
  fd = open(file, O_RDWR);
  if (fd == -1) {
    nbdkit_error("%s: %m", file);
    return -1;
  }
  return 0;
}

static void *f_open(int ro) { return NBDKIT_HANDLE_NOT_NEEDED; }
static int f_yes(void *h) { return 1; }
static int f_can_flush(void *h) { return !no_flush; }

static int64_t f_get_size(void *h)
{
  struct stat st;

  if (fstat(fd, &st) == -1) {
    nbdkit_error("fstat: %m");
    return -1;
  }
  return st.st_size;
}

static int f_pread(void *h, void *b, uint32_t n, uint64_t o, uint32_t fl)
{
  return pread(fd, b, n, o) == (ssize_t) n ? 0 : -1;
}

static int f_pwrite(void *h, const void *b, uint32_t n, uint64_t o,
                    uint32_t fl)
{
  if (fail_once && first_time(o, 0))
    return injected("write");
  return pwrite(fd, b, n, o) == (ssize_t) n ? 0 : -1;
}

static int f_zero(void *h, uint32_t n, uint64_t o, uint32_t fl)
{
  static const char z[65536];

  if (fail_once && first_time(o, 1))
    return injected("zero");
  while (n) {
    uint32_t k = n < sizeof z ? n : sizeof z;
    if (pwrite(fd, z, k, o) != (ssize_t) k)
      return -1;
    n -= k;
    o += k;
  }
  return 0;
}

static int f_flush(void *h, uint32_t fl)
{
  if (fail_once) {
    pthread_mutex_lock(&seen_lock);
    int odd = flag && access(flag, F_OK) == 0 && flushes++ % 2 == 0;
    pthread_mutex_unlock(&seen_lock);
    if (odd)
      return injected("flush");
    return fdatasync(fd);
  }
  if (seed == 0)
    seed = (unsigned) getpid() ^ (unsigned) (uintptr_t) &seed;
  if (flag && access(flag, F_OK) == 0 && (int) (rand_r(&seed) % 100) < rate) {
    nbdkit_error("injected flush failure");
    errno = EIO;
    return -1;
  }
  return fdatasync(fd);
}

static struct nbdkit_plugin plugin = {
  .name = "flushfail",
  .config = f_config,
  .get_ready = f_get_ready,
  .open = f_open,
  .get_size = f_get_size,
  .can_write = f_yes,
  .can_flush = f_can_flush,
  .can_zero = f_yes,
  .can_multi_conn = f_yes,
  .pread = f_pread,
  .pwrite = f_pwrite,
  .zero = f_zero,
  .flush = f_flush,
};
NBDKIT_REGISTER_PLUGIN(plugin)
