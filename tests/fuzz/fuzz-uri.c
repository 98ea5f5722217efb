/* tests/fuzz/fuzz-uri.c: libFuzzer target for nbdx_redact_uri(), which
 * runs on every URI the daemon logs (connect and reconnect failures).
 * Input: the URI (a NUL ends it early).  Checks, besides ASan/UBSan:
 * the output fits the buffer, and no query value of a secret key
 * (password*, tls-psk*, secret*) survives except as "***" (or a prefix
 * of it, when the buffer cut it short).  Buffers are heap allocations of
 * exactly the size passed, so a write past them is caught. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "transport/nbdx.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int secret_key(const char *k)
{
    return strncasecmp(k, "password", 8) == 0 ||
           strncasecmp(k, "tls-psk", 7) == 0 ||
           strncasecmp(k, "secret", 6) == 0;
}

/* Every secret query value in out must read "***" (or its prefix if the
 * output ends there). */
static void check_redacted(const char *uri, const char *out)
{
    const char *q = strchr(out, '?');
    for (; q && *q; q = strpbrk(q + 1, "&;")) {
        const char *key = q + 1, *eq = strchr(key, '=');
        const char *end = strpbrk(key, "&;");
        if (!eq || (end && eq > end) || !secret_key(key))
            continue;
        size_t vlen = end ? (size_t) (end - eq - 1) : strlen(eq + 1);
        if (vlen > 3 || strncmp(eq + 1, "***", vlen) != 0 ||
            (vlen < 3 && end)) {
            fprintf(stderr, "secret not redacted:\n  in:  %s\n  out: %s\n",
                    uri, out);
            abort();
        }
    }
}

static void one(const char *uri, size_t len)
{
    char *buf = malloc(len);
    if (!buf)
        return;
    const char *r = nbdx_redact_uri(uri, buf, len);
    if (r != buf || strnlen(buf, len) == len) {
        fprintf(stderr, "output not NUL-terminated in %zu bytes\n", len);
        abort();
    }
    check_redacted(uri, buf);
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *uri = malloc(size + 1);
    if (!uri)
        return 0;
    memcpy(uri, data, size);
    uri[size] = '\0';
    size_t n = strlen(uri);
    one(uri, 256);                        /* what the daemon uses */
    one(uri, n + 1);                      /* exactly the input's size */
    if (n > 8)
        one(uri, n - 4);                  /* cut short */
    free(uri);
    return 0;
}
