/* tests/fuzz/fuzz-blkhash.c: libFuzzer target for the --blkhash option
 * parser (digest/blkhash.c: blkhash_parse_spec) and the hash behind it.
 * Input: the option value up to the first newline (or all of it), then
 * data.  Checks, besides ASan/UBSan/LeakSanitizer: every error comes with
 * a message; a successful parse gives a plain digest name and a block size
 * in range that the value spells; and when the digest exists, blkhash of
 * the data, fed block by block from the last block to the first with the
 * middle third zeroed, equals an in-order reference computed here. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "digest/blkhash.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_parse(const char *spec, int r, const char *name,
                        uint64_t bs, const char *why)
{
    if (r < 0) {
        if (r != -EINVAL || why[0] == '\0')
            abort();
        return;
    }
    size_t n = strlen(name);
    if (n == 0 || n >= BLKHASH_NAME_MAX || strspn(name,
            "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != n)
        abort();
    if (bs < 1 || bs > BLKHASH_MAX_BLOCK)
        abort();
    const char *slash = strchr(spec, '/');
    if (spec[0] && strncmp(spec, name, n) != 0)
        abort();                          /* the name is the value's */
    if (slash && strtoull(slash + 1, NULL, 10) > bs)
        abort();                          /* a suffix only multiplies */
    if (!slash && bs != BLKHASH_DEFAULT_BLOCK)
        abort();
}

static void reference(const char *name, uint64_t bs, const uint8_t *p,
                      size_t len, unsigned char *out)
{
    EVP_MD *md = EVP_MD_fetch(NULL, name, NULL);
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    unsigned char d[EVP_MAX_MD_SIZE], le[8];

    if (!md || !c || EVP_DigestInit_ex(c, md, NULL) != 1)
        abort();
    for (size_t off = 0; off < len; off += bs) {
        size_t n = len - off < bs ? len - off : bs;
        if (EVP_Digest(p + off, n, d, NULL, md, NULL) != 1 ||
            EVP_DigestUpdate(c, d, (size_t) EVP_MD_get_size(md)) != 1)
            abort();
    }
    for (int i = 0; i < 8; i++)
        le[i] = (unsigned char) ((uint64_t) len >> (8 * i));
    if (EVP_DigestUpdate(c, le, 8) != 1 || EVP_DigestFinal_ex(c, out, NULL) != 1)
        abort();
    EVP_MD_CTX_free(c);
    EVP_MD_free(md);
}

/* Blocks last to first; blocks in the middle third zeroed afterwards (and
 * zeroed in the reference's copy too). */
static void check_hash(const char *name, uint64_t bs, const uint8_t *p,
                       size_t len)
{
    struct blkhash *h;
    unsigned char want[EVP_MAX_MD_SIZE], got[EVP_MAX_MD_SIZE];
    unsigned n;
    uint64_t nb = (len + bs - 1) / bs, z0 = nb / 3, z1 = 2 * nb / 3;

    if (blkhash_create(name, bs, &h) < 0)
        return;                           /* unknown or XOF digest */
    for (uint64_t b = nb; b-- > 0;) {
        size_t piece = len - b * bs < bs ? len - b * bs : bs;
        if (blkhash_update(h, b * bs, p + b * bs, piece) != 0)
            abort();
    }
    uint8_t *copy = malloc(len ? len : 1);
    memcpy(copy, p, len);
    if (z1 > z0) {
        uint64_t zlen = z1 * bs > len ? len - z0 * bs : (z1 - z0) * bs;
        if (blkhash_zero(h, z0 * bs, zlen) != 0)
            abort();
        memset(copy + z0 * bs, 0, zlen);
    }
    if (blkhash_finish(h, len, got, &n) != 0)
        abort();
    reference(name, bs, copy, len, want);
    if (memcmp(got, want, n) != 0)
        abort();
    free(copy);
    blkhash_free(h);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nl = memchr(data, '\n', size);
    size_t slen = nl ? (size_t) (nl - data) : size;
    char *spec = malloc(slen + 1);
    char name[BLKHASH_NAME_MAX];
    struct nbdf_err why = { "" };
    uint64_t bs = 0;

    memcpy(spec, data, slen);
    spec[slen] = '\0';                    /* a NUL inside ends it early */
    int r = blkhash_parse_spec(spec, name, &bs, &why);
    check_parse(spec, r, name, bs, why.msg);
    /* Hash only what is cheap: small blocks, a few KiB of data. */
    if (r == 0 && nl && bs <= 4096 && size - slen - 1 <= 16384)
        check_hash(name, bs, nl + 1, size - slen - 1);
    free(spec);
    return 0;
}
