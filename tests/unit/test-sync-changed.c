/* tests/unit/test-sync-changed.c: nbdferry-sync's change-list parsers
 * (tools/sync/changed.c): XAPI's bit order (the first block is the most
 * significant bit of the first byte), the refusals (bad base64, a bitmap
 * shorter than the disk, set bits past its end, extents past the end,
 * negative or empty ones) and the widening of extents to 64 KiB blocks. */
#undef NDEBUG
#include <errno.h>
#include <string.h>

#include "tests/unit/test-util.h"
#include "tools/sync/sync.h"

#define MiB ((uint64_t) 1 << 20)

/* Parse text as kind for a disk of size bytes; the listed blocks as a
 * string of '0'/'1', or NULL if refused (err says why). */
static const char *parse(enum sync_list_kind kind, const char *text,
                         uint64_t size)
{
    static char out[256];
    struct sync_list l;
    struct nbdf_err err = { "" };

    CHECK(sync_list_init(&l, size) == 0);
    int r = sync_list_parse(kind, text, strlen(text), &l, NULL, &err);
    if (r < 0) {
        CHECK(r == -EINVAL && err.msg[0]);
        fprintf(stderr, "refused as expected: %s\n", err.msg);
        sync_list_free(&l);
        return NULL;
    }
    CHECK(l.nblocks < sizeof out);
    for (uint64_t b = 0; b < l.nblocks; b++)
        out[b] = sync_list_has(&l, b) ? '1' : '0';
    out[l.nblocks] = '\0';
    sync_list_free(&l);
    return out;
}

static void test_xapi(void)
{
    /* 0x80 0x01: blocks 0 and 15 of a 1 MiB disk. */
    CHECK(strcmp(parse(SYNC_LIST_XAPI, "gAE=", MiB),
                 "1000000000000001") == 0);
    /* 0x40 0x00: block 1 only. */
    CHECK(strcmp(parse(SYNC_LIST_XAPI, "QAA=\n", MiB),
                 "0100000000000000") == 0);
    /* whitespace anywhere, as a wrapped or printed value */
    CHECK(strcmp(parse(SYNC_LIST_XAPI, " gA\r\nE=\n", MiB),
                 "1000000000000001") == 0);
    /* longer than the disk with zero bits past its end: fine */
    CHECK(strcmp(parse(SYNC_LIST_XAPI, "gAEAAA==", MiB),
                 "1000000000000001") == 0);
    /* a set bit past the end: refused */
    CHECK(!parse(SYNC_LIST_XAPI, "gAEAAQ==", MiB));
    /* shorter than the disk (17 blocks need 3 bytes): refused */
    CHECK(!parse(SYNC_LIST_XAPI, "gAE=", MiB + 1));
    CHECK(strcmp(parse(SYNC_LIST_XAPI, "gAGA", MiB + 1),
                 "10000000000000011") == 0);
    CHECK(!parse(SYNC_LIST_XAPI, "", MiB));
    /* bad base64: a foreign character, missing padding, data after '=',
     * non-zero padding bits */
    CHECK(!parse(SYNC_LIST_XAPI, "g@E=", MiB));
    CHECK(!parse(SYNC_LIST_XAPI, "gAE", MiB));
    CHECK(!parse(SYNC_LIST_XAPI, "gA=E", MiB));
    CHECK(!parse(SYNC_LIST_XAPI, "gAF=", MiB));
    CHECK(!parse(SYNC_LIST_XAPI, "g===", MiB));
}

static void test_extents(void)
{
    CHECK(strcmp(parse(SYNC_LIST_EXTENTS, "0 1\n0x20000 65536\n", MiB),
                 "1010000000000000") == 0);
    /* any alignment: widened to every block touched */
    CHECK(strcmp(parse(SYNC_LIST_EXTENTS, "65535 2", MiB),
                 "1100000000000000") == 0);
    CHECK(strcmp(parse(SYNC_LIST_EXTENTS, "# a comment\n\n  \t\n", MiB),
                 "0000000000000000") == 0);
    CHECK(strcmp(parse(SYNC_LIST_EXTENTS, "983040 65536\r\n", MiB),
                 "0000000000000001") == 0);
    /* the last partial block of a disk not a multiple of 64 KiB */
    CHECK(strcmp(parse(SYNC_LIST_EXTENTS, "1048576 1", MiB + 1),
                 "00000000000000001") == 0);
    CHECK(!parse(SYNC_LIST_EXTENTS, "1048576 1", MiB));       /* past end */
    CHECK(!parse(SYNC_LIST_EXTENTS, "983040 65537", MiB));
    CHECK(!parse(SYNC_LIST_EXTENTS, "0 18446744073709551615", MiB));
    CHECK(!parse(SYNC_LIST_EXTENTS, "0 99999999999999999999", MiB));
    CHECK(!parse(SYNC_LIST_EXTENTS, "-1 5", MiB));
    CHECK(!parse(SYNC_LIST_EXTENTS, "5 -1", MiB));
    CHECK(!parse(SYNC_LIST_EXTENTS, "0 0", MiB));
    CHECK(!parse(SYNC_LIST_EXTENTS, "0 1 2", MiB));
    CHECK(!parse(SYNC_LIST_EXTENTS, "0", MiB));
    CHECK(!parse(SYNC_LIST_EXTENTS, "0x 1", MiB));
    CHECK(!parse(SYNC_LIST_EXTENTS, "12k 1", MiB));
    CHECK(!parse(SYNC_LIST_EXTENTS, "0,1", MiB));
}

static void test_auto(void)
{
    enum sync_list_kind k;
    struct sync_list l;
    struct nbdf_err err = { "" };

    CHECK(strcmp(parse(SYNC_LIST_AUTO, "gAE=\n", MiB),
                 "1000000000000001") == 0);
    CHECK(strcmp(parse(SYNC_LIST_AUTO, "0 65536\n", MiB),
                 "1000000000000000") == 0);
    CHECK(!parse(SYNC_LIST_AUTO, " \n", MiB));
    CHECK(sync_list_init(&l, MiB) == 0);
    CHECK(sync_list_parse(SYNC_LIST_AUTO, "# x\n0 1\n", 8, &l, &k,
                          &err) == 0);
    CHECK(k == SYNC_LIST_EXTENTS);
    sync_list_free(&l);

    const char *what;
    CHECK(sync_list_kind_of("xapi:f", &what) == SYNC_LIST_XAPI &&
          strcmp(what, "f") == 0);
    CHECK(sync_list_kind_of("dirty-bitmap:b0", &what) ==
          SYNC_LIST_DIRTY_BITMAP && strcmp(what, "b0") == 0);
    CHECK(sync_list_kind_of("a:b", &what) == SYNC_LIST_AUTO &&
          strcmp(what, "a:b") == 0);
}

int main(void)
{
    test_xapi();
    test_extents();
    test_auto();
    return 0;
}
