/* common/vector.h: growable arrays.
 *
 *     DEFINE_VECTOR_TYPE(entry_vector, struct entry, 64);
 *     struct entry_vector v = { 0 };
 *     if (entry_vector_append(&v, e) < 0)
 *         return -ENOMEM;
 *     ... v.ptr[0 .. v.len) ...
 *     entry_vector_reset(&v);
 *
 * The capacity doubles, starting from 'first' items at the first
 * allocation (each structure keeps the bound it had before this helper).
 * A failure (the count or its size in bytes past SIZE_MAX, or realloc)
 * returns -1 with errno ENOMEM and leaves the vector as it was: callers
 * turn that into their own error.  The vector's fields are plain: code
 * may read ptr[0 .. len), shrink len, or set len up to cap (then it
 * fills the items itself). */
#pragma once
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* Make room in *ptr (an array of *cap items of 'size' bytes, the first
 * 'len' of them used, len <= *cap) for n more, doubling *cap from
 * 'first' (when 0) until they fit; just enough when doubling would
 * overflow.  0; or -1 with errno ENOMEM, *ptr and *cap untouched.  For
 * arrays whose item size is known only at run time; typed code uses
 * DEFINE_VECTOR_TYPE. */
static inline int vector_grow(void **ptr, size_t *cap, size_t len, size_t n,
                              size_t size, size_t first)
{
    if (n <= *cap - len)
        return 0;
    if (n > SIZE_MAX - len)
        goto nomem;
    size_t want = len + n;
    size_t c = *cap ? *cap : first ? first : 1;
    while (c < want)
        c = c > SIZE_MAX / 2 ? want : 2 * c;
    if (size && c > SIZE_MAX / size)
        goto nomem;
    size_t bytes = c * size;
    void *p = realloc(*ptr, bytes ? bytes : 1);
    if (!p)
        goto nomem;
    *ptr = p;
    *cap = c;
    return 0;
nomem:
    errno = ENOMEM;
    return -1;
}

/* struct name { type *ptr; size_t len, cap; } and its functions:
 *   name_reserve(v, n)  room for n more items past len (len unchanged)
 *   name_append(v, x)   x after the last item
 *   name_reset(v)       frees the items; the vector is empty, as { 0 }
 * reserve and append return 0, or -1 (errno ENOMEM, v unchanged). */
#define DEFINE_VECTOR_TYPE(name, type, first)                                \
    struct name {                                                            \
        type *ptr;                                                           \
        size_t len, cap;                                                     \
    };                                                                       \
                                                                             \
    __attribute__((unused))                                                  \
    static inline int name##_reserve(struct name *v, size_t n)               \
    {                                                                        \
        void *p = v->ptr;                                                    \
        if (vector_grow(&p, &v->cap, v->len, n, sizeof *v->ptr,              \
                        (first)) < 0)                                        \
            return -1;                                                       \
        v->ptr = p;                                                          \
        return 0;                                                            \
    }                                                                        \
                                                                             \
    __attribute__((unused))                                                  \
    static inline int name##_append(struct name *v, type x)                  \
    {                                                                        \
        if (name##_reserve(v, 1) < 0)                                        \
            return -1;                                                       \
        v->ptr[v->len++] = x;                                                \
        return 0;                                                            \
    }                                                                        \
                                                                             \
    __attribute__((unused))                                                  \
    static inline void name##_reset(struct name *v)                          \
    {                                                                        \
        free(v->ptr);                                                        \
        v->ptr = NULL;                                                       \
        v->len = v->cap = 0;                                                 \
    }                                                                        \
    struct name##_swallow_semicolon_
