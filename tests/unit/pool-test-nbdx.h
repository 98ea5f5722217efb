/* tests/unit/pool-test-nbdx.h: the scripted transport's controls. */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "transport/nbdx.h"

struct pool_test_counts {
    uint64_t writes, write_bytes, zeros, zero_bytes;
};

/* A transport over a zeroed disk of size bytes; replies flow at once. */
struct nbdx *pool_test_nbdx(uint64_t size);
void pool_test_nbdx_free(struct nbdx *x);
const unsigned char *pool_test_disk(struct nbdx *x);
/* closed: requests are queued, not applied or answered, until opened. */
void pool_test_gate(struct nbdx *x, bool closed);
/* Sleep this long before each reply (widens race windows). */
void pool_test_delay(struct nbdx *x, unsigned us);
/* Wait until every request that may be answered has been; counts. */
void pool_test_quiesce(struct nbdx *x, struct pool_test_counts *out);
