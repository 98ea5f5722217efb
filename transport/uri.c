/* transport/uri.c: NBD URI helpers that need no connection. */
#include "transport/nbdx.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* Bounded output: copies what fits, always NUL-terminated. */
struct out {
    char *buf;
    size_t len, n;
};

static void put(struct out *o, const char *s, size_t k)
{
    size_t room = o->len - 1 - o->n;
    if (k > room)
        k = room;
    memcpy(o->buf + o->n, s, k);
    o->n += k;
    o->buf[o->n] = '\0';
}

static bool secret_key(const char *key)
{
    return strncasecmp(key, "password", 8) == 0 ||
           strncasecmp(key, "tls-psk", 7) == 0 ||
           strncasecmp(key, "secret", 6) == 0;
}

/* The URI without secrets: a password in the authority and the values
 * of query parameters that could hold one are replaced by "***".  Built
 * piece by piece from the source, so a secret is never copied, even when
 * the output is cut short to fit len. */
const char *nbdx_redact_uri(const char *uri, char *buf, size_t len)
{
    struct out o = { buf, len, 0 };
    const char *p = uri;

    if (len == 0)
        return buf;
    buf[0] = '\0';
    /* A scheme is letters, digits, '+', '-', '.' from the start. */
    const char *scheme_end = uri;
    while (isalnum((unsigned char) *scheme_end) || *scheme_end == '+' ||
           *scheme_end == '-' || *scheme_end == '.')
        scheme_end++;
    if (scheme_end > uri && strncmp(scheme_end, "://", 3) == 0) {
        const char *auth = scheme_end + 3;
        size_t alen = strcspn(auth, "/?#");
        const char *at = memrchr(auth, '@', alen);
        const char *colon = at ? memchr(auth, ':', (size_t) (at - auth)) : NULL;
        if (colon) {
            put(&o, uri, (size_t) (colon + 1 - uri));
            put(&o, "***", 3);
            p = at;
        }
    }
    const char *q = strchr(p, '?');
    if (!q) {
        put(&o, p, strlen(p));
        return buf;
    }
    put(&o, p, (size_t) (q + 1 - p));
    for (p = q + 1; *p;) {
        size_t plen = strcspn(p, "&;");
        const char *eq = memchr(p, '=', plen);
        if (eq && secret_key(p)) {
            put(&o, p, (size_t) (eq + 1 - p));
            put(&o, "***", 3);
        } else
            put(&o, p, plen);
        p += plen;
        if (*p)
            put(&o, p++, 1);
    }
    return buf;
}
