/* transport/tcpinfo.h: stall diagnostics for TCP connections.
 *
 * A sampler thread reads TCP_INFO of every connection at an interval and
 * counts the signature the XCP-ng investigation found with `ss -tinp`:
 * less than one MSS of data waiting unsent while segments are
 * unacknowledged — Nagle holding a small write back until the peer's
 * delayed ACK arrives.
 */
#pragma once
#include <stdint.h>

struct tcpinfo_stats {
    uint64_t samples;         /* connection samples taken */
    uint64_t nagle_stalls;    /* 0 < notsent < MSS with unacked > 0 */
    uint64_t unsent_samples;  /* notsent > 0 at all */
    uint32_t rtt_us, rttvar_us;        /* last sample, any connection */
    uint32_t unacked, notsent_bytes;   /* last sample, summed */
    uint32_t mss;
    uint32_t interval_ms;
};

/* fd_of(opaque, i) returns connection i's socket now (it changes on
 * reconnect) or -1.  Samples n connections every interval_ms. */
struct tcpinfo_sampler;
int  tcpinfo_start(int (*fd_of)(void *opaque, unsigned i), void *opaque,
                   unsigned n, unsigned interval_ms,
                   struct tcpinfo_sampler **out);
void tcpinfo_get(struct tcpinfo_sampler *s, struct tcpinfo_stats *out);
void tcpinfo_stop(struct tcpinfo_sampler *s);
