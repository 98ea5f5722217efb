/* Unit test for common/fileorder.h: bytes in order pass through, a
 * forward write decodes the gap as zeros first, zeros back over a gap are
 * skipped, data back over decoded bytes or a wrapping write latch one
 * error and its message. */
#undef NDEBUG
#include <assert.h>
#include <stdio.h>
#include <string.h>

#include "common/fileorder.h"

struct dec {
    uint64_t pos, zeros, data;
    int err;
    struct nbdf_err e;
};

/* Takes at most 7 bytes a step: the consume loop must go round. */
static int64_t step(void *opaque, const uint8_t *buf, uint64_t len)
{
    struct dec *d = opaque;
    uint64_t n = len < 7 ? len : 7;
    if (buf)
        d->data += n;
    else
        d->zeros += n;
    return (int64_t) n;
}

static int feed(struct fileorder *o, struct dec *d, uint64_t off,
                const uint8_t *buf, uint64_t len)
{
    struct fileorder_decoder dd = { &d->pos, step, d, &d->err, &d->e };
    return fileorder_accept(o, &dd, "a test image", off, buf, len);
}

int main(void)
{
    struct fileorder o = { 0 };
    struct dec d = { 0 };
    uint8_t data[64], zero[64] = { 0 };

    memset(data, 0xab, sizeof data);
    assert(feed(&o, &d, 0, data, 64) == 0);
    assert(d.pos == 64 && d.data == 64);
    assert(feed(&o, &d, 128, data, 64) == 0);         /* a gap of 64 */
    assert(d.zeros == 64 && d.data == 128 && d.pos == 192);
    assert(feed(&o, &d, 64, zero, 64) == 0);          /* zeros over it */
    assert(d.pos == 192 && d.zeros == 64);
    assert(feed(&o, &d, 192, NULL, 32) == 0);         /* a hole */
    assert(d.zeros == 96);
    assert(feed(&o, &d, 192, zero, 32) == 0);         /* zeros over it */
    assert(d.err == 0);
    assert(feed(&o, &d, 0, zero, 16) == -EINVAL);     /* not a gap */
    assert(strstr(d.e.msg, "a test image must be written in file order"));
    assert(feed(&o, &d, 224, data, 8) == -EINVAL);    /* sticky */

    struct fileorder o2 = { 0 };
    struct dec d2 = { 0 };
    assert(feed(&o2, &d2, UINT64_MAX - 4, data, 8) == -EINVAL);
    assert(strstr(d2.e.msg, "wraps around"));
    printf("fileorder: ok\n");
    return 0;
}
