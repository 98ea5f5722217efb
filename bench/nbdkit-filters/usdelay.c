/* nbdkit-usdelay-filter: delay write, zero and trim requests (wdelay) and
 * read requests (rdelay) by a sub-millisecond-capable interval.
 *
 * nbdkit 1.32's delay filter takes whole milliseconds ("wdelay=NNms";
 * "wdelay=0.2" parses as 0 ms), so it cannot model a 0.2 ms round trip.
 * This filter has the same meaning as the delay filter's wdelay (write,
 * zero and trim) and rdelay (read), with microsecond resolution:
 *
 *   nbdkit --filter=/path/to/nbdkit-usdelay-filter.so memory 1G wdelay=200us
 *   nbdkit --filter=/path/to/nbdkit-usdelay-filter.so memory 1G rdelay=200us
 *
 * Accepted units: "us", "ms", "s" (default: seconds, as the delay filter).
 * The sleep is clock_nanosleep(CLOCK_MONOTONIC) on the request's worker
 * thread, so requests in flight together are delayed in parallel, exactly
 * like the delay filter.  Timer slack (50 us by default for normal threads)
 * makes the real delay a little longer; bench/bench reports the delay asked.
 */

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nbdkit-filter.h>

static int64_t wdelay_ns, rdelay_ns;    /* set once during config */

static int
parse_delay (const char *value, int64_t *ns_out)
{
  char *end;
  double v;

  errno = 0;
  v = strtod (value, &end);
  if (errno || end == value || v < 0) {
    nbdkit_error ("usdelay: cannot parse delay '%s'", value);
    return -1;
  }
  if (strcmp (end, "us") == 0)
    v *= 1e3;
  else if (strcmp (end, "ms") == 0)
    v *= 1e6;
  else if (strcmp (end, "s") == 0 || *end == '\0')
    v *= 1e9;
  else {
    nbdkit_error ("usdelay: unknown unit in '%s' (use us, ms or s)", value);
    return -1;
  }
  *ns_out = (int64_t) (v + 0.5);
  return 0;
}

static int
usdelay_config (nbdkit_next_config *next, nbdkit_backend *nxdata,
                const char *key, const char *value)
{
  if (strcmp (key, "wdelay") == 0)
    return parse_delay (value, &wdelay_ns);
  if (strcmp (key, "rdelay") == 0)
    return parse_delay (value, &rdelay_ns);
  return next (nxdata, key, value);
}

#define usdelay_config_help \
  "wdelay=<N>[us|ms|s]  Delay write, zero and trim requests (default 0).\n" \
  "rdelay=<N>[us|ms|s]  Delay read requests (default 0)."

/* Returns -1 with *err set if the server is shutting down mid-sleep. */
static int
delay_ns (int64_t ns, int *err)
{
  struct timespec ts;
  int r;

  if (ns == 0)
    return 0;
  ts.tv_sec = ns / 1000000000;
  ts.tv_nsec = ns % 1000000000;
  while ((r = clock_nanosleep (CLOCK_MONOTONIC, 0, &ts, &ts)) == EINTR)
    ;
  if (r != 0) {
    *err = r;
    return -1;
  }
  return 0;
}

static int
usdelay_pread (nbdkit_next *next, void *handle, void *buf, uint32_t count,
               uint64_t offset, uint32_t flags, int *err)
{
  if (delay_ns (rdelay_ns, err) == -1)
    return -1;
  return next->pread (next, buf, count, offset, flags, err);
}

static int
usdelay_pwrite (nbdkit_next *next, void *handle, const void *buf,
                uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  if (delay_ns (wdelay_ns, err) == -1)
    return -1;
  return next->pwrite (next, buf, count, offset, flags, err);
}

static int
usdelay_zero (nbdkit_next *next, void *handle, uint32_t count,
              uint64_t offset, uint32_t flags, int *err)
{
  if (delay_ns (wdelay_ns, err) == -1)
    return -1;
  return next->zero (next, count, offset, flags, err);
}

static int
usdelay_trim (nbdkit_next *next, void *handle, uint32_t count,
              uint64_t offset, uint32_t flags, int *err)
{
  if (delay_ns (wdelay_ns, err) == -1)
    return -1;
  return next->trim (next, count, offset, flags, err);
}

static struct nbdkit_filter filter = {
  .name              = "usdelay",
  .longname          = "nbdkit microsecond delay filter (nbdferry bench)",
  .config            = usdelay_config,
  .config_help       = usdelay_config_help,
  .pread             = usdelay_pread,
  .pwrite            = usdelay_pwrite,
  .zero              = usdelay_zero,
  .trim              = usdelay_trim,
};

NBDKIT_REGISTER_FILTER (filter)
