/* tests/unit/fake-nbdx.h: a scripted transport under the pool.
 *
 * fake-nbdx.c defines nbdx_info(), nbdx_submit() and nbdx_run(), the
 * part of transport/nbdx.h that transport/pool.c calls, and is linked
 * instead of transport/nbdx.c.  Submitted ops wait in a list until the
 * test completes them, one by one in the order it chooses, or an
 * auto-completer thread does (in submission order or at random).  The
 * "server" is a byte array that completions apply to: a write copies
 * its buffer in, a zero clears, a read copies out.
 *
 * It checks, at every submission and completion, the two promises the
 * pool makes to a transport: no write or zero is submitted while an
 * overlapping write or zero is in flight, and a write's buffer does not
 * change between submission and reply.  A breach aborts the test.
 *
 * For tests that let replies flow and only look at the outcome: the
 * auto-completer can wait before each reply (a slow server widens race
 * windows), FAKE_MANUAL holds replies back, and fake_quiesce() waits
 * until every reply that may come has come and returns what the server
 * was sent.
 *
 * It also provides pool_test_before_wait(), the hook transport/pool.c
 * calls (built with POOL_TEST_HOOKS) just before a thread sleeps on the
 * pool's condition: tests wait for a named sleeper, then act while it
 * sleeps.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "transport/nbdx.h"

struct nbdx *fake_open(uint64_t size, bool can_zero, unsigned depth_hint);
void fake_close(struct nbdx *x);
unsigned char *fake_disk(struct nbdx *x);      /* the server's bytes */

/* Wait until an op of this kind (-1: any) is in flight and not yet
 * completed; returns the oldest such. */
struct nbdx_op *fake_wait_op(struct nbdx *x, int kind);
unsigned fake_in_flight(struct nbdx *x);
/* Complete op (apply it to the disk unless err), then call its done(). */
void fake_complete(struct nbdx *x, struct nbdx_op *op, int err);
/* Complete everything in flight, oldest first, until nothing is left. */
void fake_complete_all(struct nbdx *x);

/* As if a connection was made again (nbdx_reconnects() counts it). */
void fake_reconnect(struct nbdx *x);

/* Who completes ops: the test alone (FAKE_MANUAL: replies are held
 * back), or also an auto-completer thread, oldest first or at random.
 * Switching to FAKE_MANUAL lets a reply already being sent finish. */
enum fake_auto { FAKE_MANUAL, FAKE_FIFO, FAKE_RANDOM };
void fake_set_auto(struct nbdx *x, enum fake_auto mode, uint32_t seed);
/* The auto-completer sleeps this long before each reply (0: none). */
void fake_set_delay(struct nbdx *x, unsigned us);

/* What completed without error, as applied to the disk. */
struct fake_counts {
    uint64_t writes, write_bytes, zeroes, zero_bytes;
};
/* Wait until the auto-completer has answered every op it may answer
 * (in FAKE_MANUAL: until it is not in the middle of one), done() calls
 * included, then copy the counts to out (may be NULL). */
void fake_quiesce(struct nbdx *x, struct fake_counts *out);

/* Block until a thread is about to sleep at the named wait point of
 * pool.c ("zero-slot", "buffer", "read", "drain") count times in all
 * since the last fake_reset_sleepers(). */
void fake_wait_sleeper(const char *what, unsigned count);
void fake_reset_sleepers(void);

/* Allocation failure injection (link with -Wl,--wrap= for malloc,
 * calloc and posix_memalign): while set, those calls from pool.c and
 * extmap.c fail. */
extern volatile bool fake_fail_alloc;   /* set only while no other thread allocates */
