/* Unit test for common/vector.h: append and reserve, the capacity
 * doubling from 'first', growth across many items, reserves whose count
 * or size in bytes would overflow size_t (refused, the vector as it
 * was), reset, and vector_grow() for a size known at run time. */
#undef NDEBUG
#include <assert.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/vector.h"

struct pair {
    uint64_t a, b;
};

DEFINE_VECTOR_TYPE(int_vector, int, 4);
DEFINE_VECTOR_TYPE(pair_vector, struct pair, 16);

static void test_append_reserve(void)
{
    struct int_vector v = { 0 };

    assert(int_vector_reserve(&v, 0) == 0);       /* nothing to make */
    assert(v.ptr == NULL && v.len == 0 && v.cap == 0);
    assert(int_vector_append(&v, 7) == 0);
    assert(v.len == 1 && v.cap == 4 && v.ptr[0] == 7);
    for (int i = 1; i < 4; i++)
        assert(int_vector_append(&v, 7 + i) == 0);
    assert(v.len == 4 && v.cap == 4);
    assert(int_vector_append(&v, 11) == 0);       /* doubles */
    assert(v.len == 5 && v.cap == 8);
    for (int i = 0; i < 5; i++)
        assert(v.ptr[i] == 7 + i);

    /* reserve: room past len, len unchanged; doubling until it fits. */
    assert(int_vector_reserve(&v, 3) == 0);
    assert(v.cap == 8 && v.len == 5);
    assert(int_vector_reserve(&v, 20) == 0);
    assert(v.cap == 32 && v.len == 5);
    int *p = v.ptr;
    for (int i = 0; i < 27; i++)                  /* fits: no realloc */
        assert(int_vector_append(&v, i) == 0);
    assert(v.ptr == p && v.len == 32 && v.cap == 32);

    int_vector_reset(&v);
    assert(v.ptr == NULL && v.len == 0 && v.cap == 0);
    int_vector_reset(&v);                         /* twice: harmless */

    /* A reserve before the first item starts from 'first' too. */
    assert(int_vector_reserve(&v, 5) == 0 && v.cap == 8 && v.len == 0);
    int_vector_reset(&v);
}

static void test_many(void)
{
    struct pair_vector v = { 0 };
    size_t reallocs = 0, cap = 0;

    for (uint64_t i = 0; i < 1000000; i++) {
        assert(pair_vector_append(&v, (struct pair) { i, ~i }) == 0);
        if (v.cap != cap) {
            assert(v.cap == (cap ? 2 * cap : 16));
            cap = v.cap;
            reallocs++;
        }
    }
    assert(v.len == 1000000 && v.cap == 16u << 16 && reallocs == 17);
    for (uint64_t i = 0; i < v.len; i++)
        assert(v.ptr[i].a == i && v.ptr[i].b == ~i);
    pair_vector_reset(&v);
}

static void test_overflow(void)
{
    struct pair_vector v = { 0 };

    for (int i = 0; i < 3; i++)
        assert(pair_vector_append(&v, (struct pair) { i, i }) == 0);
    struct pair_vector was = v;

    /* len + n past SIZE_MAX. */
    errno = 0;
    assert(pair_vector_reserve(&v, SIZE_MAX) == -1 && errno == ENOMEM);
    assert(memcmp(&v, &was, sizeof v) == 0);
    errno = 0;
    assert(pair_vector_reserve(&v, SIZE_MAX - 2) == -1 && errno == ENOMEM);
    assert(memcmp(&v, &was, sizeof v) == 0);
    /* The count fits, its bytes (cap * 16) do not. */
    errno = 0;
    assert(pair_vector_reserve(&v, SIZE_MAX / 16) == -1 && errno == ENOMEM);
    assert(memcmp(&v, &was, sizeof v) == 0);
    errno = 0;
    assert(pair_vector_reserve(&v, SIZE_MAX / 2) == -1 && errno == ENOMEM);
    assert(memcmp(&v, &was, sizeof v) == 0);
    for (int i = 0; i < 3; i++)
        assert(v.ptr[i].a == (uint64_t) i);

    /* Still usable. */
    assert(pair_vector_append(&v, (struct pair) { 3, 3 }) == 0);
    assert(v.len == 4 && v.ptr[3].b == 3);
    pair_vector_reset(&v);

    /* Overflow on an empty vector: nothing allocated. */
    assert(pair_vector_reserve(&v, SIZE_MAX / 8) == -1);
    assert(v.ptr == NULL && v.len == 0 && v.cap == 0);
}

static void test_grow(void)
{
    void *p = NULL;
    size_t cap = 0;

    /* Items of 24 bytes, 10 of them, from 256. */
    assert(vector_grow(&p, &cap, 0, 10, 24, 256) == 0);
    assert(p && cap == 256);
    memset(p, 0xab, 256 * 24);
    assert(vector_grow(&p, &cap, 256, 1, 24, 256) == 0 && cap == 512);
    assert(((unsigned char *) p)[255 * 24] == 0xab);
    void *q = p;
    size_t c = cap;
    assert(vector_grow(&p, &cap, 257, SIZE_MAX / 24, 24, 256) == -1);
    assert(p == q && cap == c);
    free(p);
}

int main(void)
{
    test_append_reserve();
    test_many();
    test_overflow();
    test_grow();
    printf("vector: ok\n");
    return 0;
}
