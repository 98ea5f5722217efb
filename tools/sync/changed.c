/* tools/sync/changed.c: the change lists nbdferry-sync takes, parsed
 * strictly into one bit per 64 KiB block of the disk.
 *
 * A list is a hint from the platform: a block it misses is not copied and
 * stays stale.  What the parsers can refuse, they refuse: a list that is
 * malformed, shorter than the disk (a truncated or unfinished list must
 * not read as "nothing changed"), or that names blocks past the disk's
 * end, is an error before anything is written.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "tools/sync/sync.h"

int sync_list_init(struct sync_list *l, uint64_t size)
{
    l->size = size;
    l->nblocks = size / SYNC_BLOCK + (size % SYNC_BLOCK != 0);
    l->bits = calloc(l->nblocks / 8 + 1, 1);
    return l->bits ? 0 : -ENOMEM;
}

void sync_list_free(struct sync_list *l)
{
    free(l->bits);
    l->bits = NULL;
}

static void list_set(struct sync_list *l, uint64_t b)
{
    l->bits[b / 8] |= (uint8_t) (1u << (b % 8));
}

void sync_list_add(struct sync_list *l, uint64_t off, uint64_t len)
{
    if (len == 0)
        return;
    for (uint64_t b = off / SYNC_BLOCK; b <= (off + len - 1) / SYNC_BLOCK;
         b++)
        list_set(l, b);
}

void sync_list_all(struct sync_list *l)
{
    sync_list_add(l, 0, l->size);
}

uint64_t sync_list_count(const struct sync_list *l)
{
    uint64_t n = 0;

    for (uint64_t i = 0; i < l->nblocks / 8 + 1; i++)
        n += (uint64_t) __builtin_popcount(l->bits[i]);
    return n;
}

enum sync_list_kind sync_list_kind_of(const char *arg, const char **what)
{
    static const struct {
        const char *prefix;
        enum sync_list_kind kind;
    } kinds[] = {
        { "xapi:", SYNC_LIST_XAPI },
        { "extents:", SYNC_LIST_EXTENTS },
        { "dirty-bitmap:", SYNC_LIST_DIRTY_BITMAP },
    };

    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        size_t n = strlen(kinds[i].prefix);
        if (strncmp(arg, kinds[i].prefix, n) == 0) {
            *what = arg + n;
            return kinds[i].kind;
        }
    }
    *what = arg;
    return SYNC_LIST_AUTO;
}

const char *sync_list_kind_name(enum sync_list_kind k)
{
    switch (k) {
    case SYNC_LIST_XAPI: return "xapi";
    case SYNC_LIST_EXTENTS: return "extents";
    case SYNC_LIST_DIRTY_BITMAP: return "dirty-bitmap";
    case SYNC_LIST_AUTO: break;
    }
    return "auto";
}

/* ---- XAPI: VDI.list_changed_blocks ---- */

static int b64_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/* RFC 4648 base64, whitespace anywhere ignored (xe prints a newline; some
 * tools wrap lines); '=' only as the final padding, and the padding's
 * bits zero, as every encoder leaves them.  *out is malloc'ed. */
static int b64_decode(const char *text, size_t len, uint8_t **out,
                      size_t *outlen, struct nbdf_err *err)
{
    uint8_t *buf = malloc(len / 4 * 3 + 3);
    size_t n = 0, digits = 0, pad = 0;
    uint32_t acc = 0;

    if (!buf)
        return nbdf_errf(err, -ENOMEM, "out of memory");
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (is_space(c))
            continue;
        if (c == '=') {
            pad++;
            continue;
        }
        int v = b64_value((unsigned char) c);
        if (v < 0 || pad) {
            free(buf);
            return nbdf_errf(err, -EINVAL, "bad base64: %s at byte %zu",
                             v < 0 ? "a character not in base64"
                                   : "data after the '=' padding", i);
        }
        acc = acc << 6 | (uint32_t) v;
        if (++digits % 4 == 0) {
            buf[n++] = (uint8_t) (acc >> 16);
            buf[n++] = (uint8_t) (acc >> 8);
            buf[n++] = (uint8_t) acc;
            acc = 0;
        }
    }
    size_t tail = digits % 4;
    if (tail == 1 || (tail == 0 && pad) || (tail && tail + pad != 4)) {
        free(buf);
        return nbdf_errf(err, -EINVAL, "bad base64: %zu digits and %zu "
                         "'=' do not make whole groups of 4", digits, pad);
    }
    if ((tail == 2 && (acc & 0xf)) || (tail == 3 && (acc & 0x3))) {
        free(buf);
        return nbdf_errf(err, -EINVAL, "bad base64: the padding's bits are "
                         "not zero (a damaged or cut list)");
    }
    if (tail == 2)
        buf[n++] = (uint8_t) (acc >> 4);
    if (tail == 3) {
        buf[n++] = (uint8_t) (acc >> 10);
        buf[n++] = (uint8_t) (acc >> 2);
    }
    *out = buf;
    *outlen = n;
    return 0;
}

/* Bit order.  VDI.list_changed_blocks's value is made by the storage
 * manager (xapi-project/sm, libs/sm/VDI.py, list_changed_blocks): it
 * loads each CBT log's bitmap from cbt-util into a bitarray, reverses
 * the bits of every byte (the log keeps block n at bit n % 8 counted from
 * the least significant end, as the kernel's bitops do), ORs the logs of
 * the chain and base64-encodes bitarray's bytes, whose default order is
 * big-endian.  So in the value XAPI returns, block n is byte n / 8's bit
 * 7 - n % 8: the first block is the most significant bit of the first
 * byte (mask 0x80 >> (n % 8)).  Each bit covers 64 KiB. */
static bool xapi_bit(const uint8_t *map, uint64_t b)
{
    return (map[b / 8] >> (7 - b % 8)) & 1;
}

int sync_parse_xapi(const char *text, size_t len, struct sync_list *l,
                    struct nbdf_err *err)
{
    uint8_t *map = NULL;
    size_t n = 0;
    int r = b64_decode(text, len, &map, &n, err);

    if (r < 0)
        return r;
    if ((uint64_t) n * 8 < l->nblocks) {
        free(map);
        return nbdf_errf(err, -EINVAL, "the bitmap has %zu bytes: %" PRIu64
                         " blocks of 64 KiB, but the disk has %" PRIu64
                         " (%" PRIu64 " bytes); a list shorter than the disk "
                         "(cut, or from a smaller VDI) is refused", n,
                         (uint64_t) n * 8, l->nblocks, l->size);
    }
    for (uint64_t b = l->nblocks; b < (uint64_t) n * 8; b++)
        if (xapi_bit(map, b)) {
            free(map);
            return nbdf_errf(err, -EINVAL, "the bitmap marks block %" PRIu64
                             " (offset %" PRIu64 "), past the end of the "
                             "disk (%" PRIu64 " blocks, %" PRIu64 " bytes)",
                             b, b * SYNC_BLOCK, l->nblocks, l->size);
        }
    for (uint64_t b = 0; b < l->nblocks; b++)
        if (xapi_bit(map, b))
            list_set(l, b);
    free(map);
    return 0;
}

/* ---- extents: "OFFSET LENGTH" lines ---- */

/* A decimal or 0x hexadecimal number, nothing else: no sign, no
 * suffix.  Advances *p past it. */
static int parse_number(const char **p, const char *end, uint64_t *out)
{
    const char *s = *p;
    unsigned base = 10;
    uint64_t v = 0;
    bool any = false;

    if (end - s > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        base = 16;
        s += 2;
    }
    for (; s < end && isxdigit((unsigned char) *s); s++) {
        unsigned d = isdigit((unsigned char) *s)
                         ? (unsigned) (*s - '0')
                         : (unsigned) (tolower((unsigned char) *s) - 'a' + 10);
        if (d >= base)
            return -EINVAL;
        if (v > (UINT64_MAX - d) / base)
            return -ERANGE;
        v = v * base + d;
        any = true;
    }
    if (!any)
        return -EINVAL;
    *p = s;
    *out = v;
    return 0;
}

static const char *skip_blanks(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\r'))
        p++;
    return p;
}

/* One line (without its '\n'): blank, a '#' comment, or OFFSET LENGTH. */
static int extents_line(const char *p, const char *end, unsigned lineno,
                        struct sync_list *l, struct nbdf_err *err)
{
    uint64_t field[2];

    p = skip_blanks(p, end);
    if (p == end || *p == '#')
        return 0;
    for (int i = 0; i < 2; i++) {
        const char *start = p;
        int r = parse_number(&p, end, &field[i]);
        if (r < 0 || (p < end && *p != ' ' && *p != '\t' && *p != '\r'))
            return nbdf_errf(err, -EINVAL, "line %u: the %s is %s (want "
                             "a decimal or 0x number of bytes)", lineno,
                             i == 0 ? "OFFSET" : "LENGTH",
                             r == -ERANGE ? "too large" :
                             *start == '-' ? "negative" : "not a number");
        p = skip_blanks(p, end);
        if (i == 0 && p == end)
            return nbdf_errf(err, -EINVAL, "line %u: OFFSET without a "
                             "LENGTH", lineno);
    }
    if (p != end)
        return nbdf_errf(err, -EINVAL, "line %u: more than OFFSET LENGTH",
                         lineno);
    if (field[1] == 0)
        return nbdf_errf(err, -EINVAL, "line %u: LENGTH 0", lineno);
    if (field[0] > l->size || field[1] > l->size - field[0])
        return nbdf_errf(err, -EINVAL, "line %u: %" PRIu64 " bytes at %"
                         PRIu64 " reach past the end of the disk (%" PRIu64
                         " bytes)", lineno, field[1], field[0], l->size);
    sync_list_add(l, field[0], field[1]);
    return 0;
}

int sync_parse_extents(const char *text, size_t len, struct sync_list *l,
                       struct nbdf_err *err)
{
    const char *p = text, *end = text + len;
    unsigned lineno = 0;

    if (memchr(text, '\0', len))
        return nbdf_errf(err, -EINVAL, "a NUL byte: not a text list");
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t) (end - p));
        const char *eol = nl ? nl : end;
        int r = extents_line(p, eol, ++lineno, l, err);
        if (r < 0)
            return r;
        p = nl ? nl + 1 : end;
    }
    return 0;
}

/* ---- which parser ---- */

/* Extents have two fields on a line; base64 has no blank inside a line.
 * Anything else is refused rather than guessed. */
static enum sync_list_kind detect(const char *text, size_t len)
{
    bool data = false;

    for (size_t i = 0; i < len; i++) {
        if (text[i] == '#')
            return SYNC_LIST_EXTENTS;
        if (!is_space(text[i]))
            data = true;
        else if ((text[i] == ' ' || text[i] == '\t') && data &&
                 i + 1 < len && !is_space(text[i + 1]))
            return SYNC_LIST_EXTENTS;
        if (text[i] == '\n')
            data = false;
    }
    return SYNC_LIST_XAPI;
}

int sync_list_parse(enum sync_list_kind kind, const char *text, size_t len,
                    struct sync_list *l, enum sync_list_kind *kind_out,
                    struct nbdf_err *err)
{
    if (kind == SYNC_LIST_AUTO) {
        size_t i = 0;
        while (i < len && is_space(text[i]))
            i++;
        if (i == len)
            return nbdf_errf(err, -EINVAL, "the list is empty: say "
                             "extents:FILE if nothing changed");
        kind = detect(text, len);
    }
    if (kind_out)
        *kind_out = kind;
    switch (kind) {
    case SYNC_LIST_XAPI:
        return sync_parse_xapi(text, len, l, err);
    case SYNC_LIST_EXTENTS:
        return sync_parse_extents(text, len, l, err);
    default:
        return nbdf_errf(err, -EINVAL, "not a list read from a file");
    }
}
