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

#include "common/err.h"
#include "common/iszero.h"
#include "common/minmax.h"

#define FILEORDER_GAPS 32             /* recent gaps and holes remembered */

struct fileorder {
    struct { uint64_t off, len; } gaps[FILEORDER_GAPS];
    unsigned next;
};

/* The decoder's step: consume len bytes at its position (buf NULL:
 * zeros); its sticky error (negative) on failure. */
typedef int (*fileorder_consume_fn)(void *stream, const uint8_t *buf,
                                    uint64_t len);

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

/* Feed (buf) or hole (buf NULL) of len bytes at off to a decoder at pos
 * whose sticky error is *code with its message in err ('what': "a VMDK",
 * in the message).  The backwards part (a no-op if zeros over a gap), the
 * forward gap, then the bytes. */
static inline int fileorder_accept(struct fileorder *o, uint64_t pos,
                                   const char *what, uint64_t off,
                                   const uint8_t *buf, uint64_t len,
                                   fileorder_consume_fn consume, void *stream,
                                   int *code, struct nbdf_err *err)
{
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
        if (consume(stream, NULL, gap) < 0)
            return *code;
    }
    if (!buf)
        fileorder_remember(o, off, len);
    return consume(stream, buf, len);
}
