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

/* ---- scheme and query ------------------------------------------------ */

static size_t scheme_len(const char *uri)
{
    const char *e = strstr(uri, "://");
    return e ? (size_t) (e - uri) : 0;
}

bool nbdx_uri_is_tls(const char *uri)
{
    return scheme_len(uri) >= 4 && strncasecmp(uri, "nbds", 4) == 0;
}

bool nbdx_uri_is_tcp(const char *uri)
{
    size_t n = scheme_len(uri);
    return (n == 3 && strncasecmp(uri, "nbd", 3) == 0) ||
           (n == 4 && strncasecmp(uri, "nbds", 4) == 0);
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = tolower(c);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Copy a percent-encoded value (k bytes) into val, decoded.  False if it
 * does not fit. */
static bool decode(const char *s, size_t k, char *val, size_t len)
{
    size_t n = 0;

    for (size_t i = 0; i < k; i++) {
        int c = (unsigned char) s[i];
        if (c == '%' && i + 2 < k && hexval(s[i + 1]) >= 0 &&
            hexval(s[i + 2]) >= 0) {
            c = hexval(s[i + 1]) * 16 + hexval(s[i + 2]);
            i += 2;
        }
        if (n + 1 >= len)
            return false;
        val[n++] = (char) c;
    }
    val[n] = '\0';
    return true;
}

bool nbdx_uri_query(const char *uri, const char *key, char *val, size_t len)
{
    const char *q = strchr(uri, '?');
    size_t klen = strlen(key);

    if (!q || len == 0)
        return false;
    for (const char *p = q + 1; *p;) {
        size_t plen = strcspn(p, "&;#");
        if (plen > klen && strncmp(p, key, klen) == 0 && p[klen] == '=')
            return decode(p + klen + 1, plen - klen - 1, val, len);
        p += plen;
        if (*p == '#')
            break;
        if (*p)
            p++;
    }
    return false;
}

bool nbdx_uri_export(const char *uri, char *val, size_t len)
{
    const char *auth = strstr(uri, "://");

    if (len == 0)
        return false;
    val[0] = '\0';
    if (!auth)
        return true;
    auth += 3;
    const char *path = auth + strcspn(auth, "/?#");
    if (*path != '/')
        return true;
    path++;
    return decode(path, strcspn(path, "?#"), val, len);
}
