/* common/fileorder.h: the input rule of the forward-only stream decoders
 * (vmdk/, qcow2/): a file arrives in file order.  Writes past the
 * position leave a gap, decoded as zeros; a write back over bytes already
 * decoded is accepted only as zeros over a remembered gap or hole (a copy
 * tool that skips zeros by seeking, then writes them after all, or punches
 * a hole behind itself), and skipped.  No I/O; one per stream. */
#pragma once
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "common/err.h"
#include "common/iszero.h"
#include "common/minmax.h"

#define FILEORDER_GAPS 32             /* recent gaps and holes remembered */

struct fileorder {
    struct { uint64_t off, len; } gaps[FILEORDER_GAPS];
    unsigned next;
};

/* The decoder's step: take up to len bytes at its position (buf NULL:
 * zeros): how many it took (at least 1), or a negative errno. */
typedef int64_t (*fileorder_step_fn)(void *stream, const uint8_t *buf,
                                     uint64_t len);

/* The decoder's input: its position, its step, and its sticky error
 * (*code, with its message in err). */
struct fileorder_decoder {
    uint64_t *pos;
    fileorder_step_fn step;
    void *stream;
    int *code;
    struct nbdf_err *err;
};

static inline void fileorder_remember(struct fileorder *o, uint64_t off,
                                      uint64_t len)
{
    unsigned last = (o->next + FILEORDER_GAPS - 1) % FILEORDER_GAPS;
    if (o->gaps[last].len && o->gaps[last].off + o->gaps[last].len == off) {
        o->gaps[last].len += len;
        return;
    }
    o->gaps[o->next].off = off;
    o->gaps[o->next].len = len;
    o->next = (o->next + 1) % FILEORDER_GAPS;
}

static inline bool fileorder_inside(const struct fileorder *o, uint64_t off,
                                    uint64_t len)
{
    for (unsigned i = 0; i < FILEORDER_GAPS; i++)
        if (o->gaps[i].len && off >= o->gaps[i].off &&
            off + len <= o->gaps[i].off + o->gaps[i].len)
            return true;
    return false;
}

/* Step through len bytes at the position (buf NULL: zeros). */
static inline int fileorder_consume(const struct fileorder_decoder *d,
                                    const uint8_t *buf, uint64_t len)
{
    while (len > 0) {
        int64_t n = d->step(d->stream, buf, len);
        if (n < 0)
            return nbdf_latchf(d->code, d->err, (int) n, "%s",
                               strerror((int) -n));
        *d->pos += (uint64_t) n;
        len -= (uint64_t) n;
        if (buf)
            buf += n;
    }
    return 0;
}

/* Feed (buf) or hole (buf NULL) of len bytes at off to decoder d ('what':
 * "a VMDK", in the message).  The backwards part (a no-op if zeros over a
 * gap), the forward gap, then the bytes. */
static inline int fileorder_accept(struct fileorder *o,
                                   const struct fileorder_decoder *d,
                                   const char *what, uint64_t off,
                                   const uint8_t *buf, uint64_t len)
{
    int *code = d->code;
    struct nbdf_err *err = d->err;
    uint64_t pos = *d->pos;

    if (*code)
        return *code;
    if (off + len < off)
        return nbdf_latchf(code, err, -EINVAL, "write at %" PRIu64
                           " wraps around", off);
    if (off < pos) {
        uint64_t back = MIN(len, pos - off);
        if ((buf && !is_zero(buf, back)) || !fileorder_inside(o, off, back))
            return nbdf_latchf(code, err, -EINVAL, "write at byte %" PRIu64
                               " goes backwards (the file has been read up "
                               "to byte %" PRIu64 "): %s must be written in "
                               "file order", off, pos, what);
        off += back;
        len -= back;
        if (buf)
            buf += back;
        if (len == 0)
            return 0;
    }
    if (off > pos) {
        uint64_t gap = off - pos;
        fileorder_remember(o, pos, gap);
        if (fileorder_consume(d, NULL, gap) < 0)
            return *code;
    }
    if (!buf)
        fileorder_remember(o, off, len);
    return fileorder_consume(d, buf, len);
}
