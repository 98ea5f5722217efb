/* transport/uri.c: NBD URI helpers that need no connection. */
#include "transport/nbdx.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

/* The URI without secrets: a password in the authority and the values
 * of query parameters that could hold one are replaced by "***". */
const char *nbdx_redact_uri(const char *uri, char *buf, size_t len)
{
    const char *scheme_end = strstr(uri, "://");
    const char *auth = scheme_end ? scheme_end + 3 : uri;
    const char *at = strchr(auth, '@');
    const char *slash = strchr(auth, '/');
    const char *colon = strchr(auth, ':');
    size_t n = 0;

    if (at && (!slash || at < slash) && colon && colon < at)
        n = (size_t) snprintf(buf, len, "%.*s:***%s",
                              (int) (colon - uri), uri, at);
    else
        n = (size_t) snprintf(buf, len, "%s", uri);
    if (n >= len)
        return buf;
    /* Query values of keys that name secrets. */
    for (char *q = strchr(buf, '?'); q && *q; q = strpbrk(q + 1, "&;")) {
        char *key = q + 1, *eq = strchr(key, '='), *end = strpbrk(key, "&;");
        if (!eq || (end && eq > end))
            continue;
        if (strncasecmp(key, "password", 8) == 0 ||
            strncasecmp(key, "tls-psk", 7) == 0 ||
            strncasecmp(key, "secret", 6) == 0) {
            size_t tail = end ? strlen(end) : 0;
            memmove(eq + 4, end ? end : eq + 1 + strlen(eq + 1), tail + 1);
            memcpy(eq + 1, "***", 3);
        }
    }
    return buf;
}
