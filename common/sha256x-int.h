/* common/sha256x-int.h: between sha256x.c (the SHA-NI lanes and the
 * choice of path) and sha256x16.c (sixteen messages with AVX-512). */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>

#include "common/sha256x.h"

/* CPUID and XCR0 say AVX-512 F and BW can run here. */
bool sha256x16_cpu(void);

/* out[i] = SHA-256 of the len bytes at msg[i], for i < 16. */
void sha256x16_hash(const unsigned char *const *msg, size_t len,
                    unsigned char (*out)[SHA256X_DIGEST]);
