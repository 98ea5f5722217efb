/* digest/workers.h: the one pool of hasher threads of a process.
 *
 * Everything that hashes bytes on more than one thread runs on it: the
 * inline digest's fork-join over a write's blocks (digest/hashers.h) and
 * the verification engine's queue of copies and reads (digest/verify-hasher.c,
 * for nbdferry-verify and the mount's read-back).  A user takes the pool
 * (workers_get), posts tasks it owns (a struct workers_task embedded in
 * its own job), and before it lets a task go takes back any not yet
 * started (workers_cancel) and waits for the running ones by its own
 * means.  A task never waits for another task, so no user can starve
 * another of threads for longer than the tasks ahead of it run.
 *
 * THREAD MODEL
 * One process-wide pool, started by the first workers_get() and stopped
 * (threads joined) by the last workers_put(); a later get that wants
 * more threads starts them (at most WORKERS_MAX).  w->lock protects the
 * FIFO of tasks, the counts and the stop flag; workers wait on w->work.
 * A task runs with no lock of the pool's held.
 */
#pragma once
#include <stdbool.h>

#define WORKERS_MAX 16u

struct workers_task {
    struct workers_task *next;    /* the pool's, while queued */
    void (*run)(struct workers_task *t);
    bool queued;                  /* the pool's */
};

struct workers;

/* The pool, with at least want threads (0: none needed, the caller's
 * thread does the work: fine).  Fewer if threads cannot be made.
 * NULL only when out of memory. */
struct workers *workers_get(unsigned want);
void workers_put(struct workers *w);          /* NULL is fine */
/* Threads running. */
unsigned workers_count(struct workers *w);
/* Queue t (not queued already) to run once on a worker. */
void workers_post(struct workers *w, struct workers_task *t);
/* Take t back if no worker has taken it yet: true if so (it will not
 * run); false if it has run or is running. */
bool workers_cancel(struct workers *w, struct workers_task *t);
