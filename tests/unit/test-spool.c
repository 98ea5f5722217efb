/* tests/unit/test-spool.c: views/spool against a model of the image file.
 *
 * Ranges put are read back (whole, in sub-ranges, across entries) from
 * memory and from the file; drops free room that later puts reuse; the
 * bound fails with -EFBIG; the file is never visible in its directory and
 * a directory that cannot take it fails at the first spill. */
#undef NDEBUG
#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "views/spool.h"

#define IMG (4u << 20)

static unsigned char img[IMG], out[IMG];

static unsigned entries_in(const char *dir)
{
    DIR *d = opendir(dir);
    unsigned n = 0;
    struct dirent *e;

    assert(d);
    while ((e = readdir(d)))
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

static struct spool *make(const char *dir, uint64_t mem, uint64_t max)
{
    struct spool_config c = { .dir = dir, .mem_max = mem, .max = max,
                              .name = "disk.test" };
    struct spool *sp;

    assert(spool_new(&c, &sp) == 0);
    return sp;
}

/* Puts of 64 KiB pieces, half in memory, half in the file; reads of odd
 * sub-ranges across pieces and across the memory/file edge. */
static void test_ranges(const char *dir)
{
    struct spool *sp = make(dir, 1u << 20, 8u << 20);
    struct spool_stats st;

    for (uint64_t off = 0; off < (2u << 20); off += 65536)
        assert(spool_put(sp, off, img + off, 65536) == 0);
    spool_stats(sp, &st);
    assert(st.held == 2u << 20 && st.in_file == 1u << 20);
    assert(entries_in(dir) == 0);             /* unnamed */
    assert(spool_get(sp, 0, out, 2u << 20) == 0);
    assert(memcmp(out, img, 2u << 20) == 0);
    assert(spool_get(sp, 12345, out, 1u << 20) == 0);
    assert(memcmp(out, img + 12345, 1u << 20) == 0);
    assert(spool_get(sp, (1u << 20) - 7, out, 14) == 0);
    assert(memcmp(out, img + (1u << 20) - 7, 14) == 0);
    /* Not held: past the end, or in a gap. */
    assert(spool_get(sp, (2u << 20) - 1, out, 2) == -ENOENT);
    spool_drop(sp, 65536);
    assert(spool_get(sp, 65536, out, 1) == -ENOENT);
    assert(spool_get(sp, 0, out, 65536) == 0);
    /* Overlaps are the caller's bug. */
    assert(spool_put(sp, 100, img, 10) == -EINVAL);
    assert(spool_put(sp, 65536 + 100, img + 65536 + 100, 10) == 0);
    assert(spool_put(sp, 65536, img, 200) == -EINVAL);
    spool_free(sp);
}

/* Keyed put/get/drop as qcow2 uses it: room in the file is reused, so
 * the file grows with what is held at once, not with what passed. */
static void test_reuse(const char *dir)
{
    struct spool *sp = make(dir, 0, 256u << 10);
    struct spool_stats st;

    for (uint64_t k = 0; k < 64; k++) {
        uint64_t key = k * 65536;
        assert(spool_cb_put(sp, key, img + key, 65536) == 0);
        if (k >= 2) {
            uint64_t old = key - 2 * 65536;
            assert(spool_cb_get(sp, old, out, 65536) == 0);
            assert(memcmp(out, img + old, 65536) == 0);
            spool_cb_drop(sp, old);
        }
    }
    spool_stats(sp, &st);
    assert(st.held == 2 * 65536 && st.peak == 3 * 65536);
    assert(st.file_size <= 3 * 65536);
    spool_free(sp);
}

/* Past the bound: -EFBIG (and the log names --spool-max). */
static void test_bound(const char *dir)
{
    struct spool *sp = make(dir, 65536, 3 * 65536);

    for (uint64_t k = 0; k < 3; k++)
        assert(spool_put(sp, k * 65536, img, 65536) == 0);
    assert(spool_put(sp, 3 * 65536, img, 1) == -EFBIG);
    spool_drop(sp, 0);
    assert(spool_put(sp, 3 * 65536, img, 65536) == 0);
    spool_free(sp);
}

static void test_bad_dir(void)
{
    struct spool *sp = make("/nonexistent/spool", 10, 1u << 20);

    assert(spool_put(sp, 0, img, 5) == 0);     /* in memory */
    assert(spool_put(sp, 5, img, 100) == -ENOENT);
    assert(spool_get(sp, 0, out, 5) == 0 && memcmp(out, img, 5) == 0);
    spool_free(sp);
}

int main(void)
{
    char dir[] = "/tmp/spool-test-XXXXXX";

    srand(7);
    for (size_t i = 0; i < IMG; i++)
        img[i] = (unsigned char) rand();
    assert(mkdtemp(dir));
    test_ranges(dir);
    test_reuse(dir);
    test_bound(dir);
    test_bad_dir();
    assert(entries_in(dir) == 0);
    rmdir(dir);
    printf("spool: ok\n");
    return 0;
}
