/* common/uuid.h: a random (version 4, RFC 9562) UUID, as 16 bytes in
 * network order. */
#pragma once
#include <stdint.h>
#include <sys/random.h>
#include <time.h>

static inline void uuid_v4(uint8_t u[16])
{
    if (getrandom(u, 16, GRND_NONBLOCK) != 16) {
        /* No kernel entropy yet (early boot): unique enough per host and
         * moment, which is all an image identity needs. */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t s = (uint64_t) ts.tv_sec * 1000000007u ^ (uint64_t) ts.tv_nsec;
        for (int i = 0; i < 16; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            u[i] = (uint8_t) (s >> 56);
        }
    }
    u[6] = (uint8_t) ((u[6] & 0x0f) | 0x40);     /* version 4 */
    u[8] = (uint8_t) ((u[8] & 0x3f) | 0x80);     /* variant 10 */
}
