/* vhdx/stream-spool.c: the spool, bytes that arrive before what places
 * them (the BAT and the metadata, or a chunk's sector bitmap).  The bytes
 * go to the sink's spool_put and come back through spool_get when
 * vhdx/stream-place.c replays them; file zeros are only remembered.  The
 * bytes held, bitmaps included, are bounded by the configuration. */
#include "vhdx/stream-internal.h"

int vhdx_spool_hold(struct vhdx_stream *s, uint64_t n)
{
    if (s->spool_held + n > s->cfg.spool_max)
        return fail(s, -EFBIG,
                    "this file needs more than %" PRIu64 " bytes spooled "
                    "(blocks that arrive before the table that places "
                    "them); raise %s", s->cfg.spool_max,
                    s->cfg.spool_option ? s->cfg.spool_option :
                                          "the spool bound");
    s->spool_held += n;
    if (s->spool_held > s->stats.spool_peak)
        s->stats.spool_peak = s->spool_held;
    return 0;
}

int vhdx_spool(struct vhdx_stream *s, uint64_t off, const uint8_t *buf,
               uint64_t len, uint64_t chunk)
{
    /* Zeros of the file (padding between regions, zero sectors) are only
     * remembered: nothing is stored for them. */
    bool zero = buf == NULL ||
                (buf[0] == 0 && memcmp(buf, buf + 1, len - 1) == 0);
    if (zero)
        buf = NULL;
    if (!zero && (!s->sink->spool_put || !s->sink->spool_get))
        return fail(s, -ENOTSUP,
                    "block data at %" PRIu64 " arrives before the table "
                    "that places it, and this reader cannot spool", off);
    if (spooled_vector_reserve(&s->sp, 1) < 0)
        return fail(s, -ENOMEM, "out of memory for the spool index");
    if (!zero) {
        int r = vhdx_spool_hold(s, len);
        if (r < 0)
            return r;
        r = s->sink->spool_put(s->opaque, off, buf, len);
        if (r < 0)
            return sink_fail(s, r, "spool");
        s->stats.spooled_bytes += len;
    }
    s->sp.ptr[s->sp.len++] = (struct spooled){ .file_off = off, .len = len,
                                               .chunk = chunk, .zero = zero };
    return 0;
}
