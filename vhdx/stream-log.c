/* vhdx/stream-log.c: the LOG phase.  A header with a log GUID names a
 * log that was not replayed (the file was not closed cleanly): the log is
 * collected as it passes (it must lie before the metadata and the BAT it
 * may update), its active sequence planned by vhdx/log.c, and from the
 * log's end on every byte fed is patched with the log's writes before
 * vhdx/stream-bat.c sees it.  Without a log, bytes pass straight on. */
#include "vhdx/stream-internal.h"

#define LOG_CLEAN "open it once in Hyper-V, or run qemu-img check -r all " \
    "on it (or qemu-img convert it), then copy it again"

/* A header with a log GUID: collect the log, which must come before what
 * it may update (the metadata, the BAT): a one-pass stream cannot go back. */
int vhdx_log_prepare(struct vhdx_stream *s)
{
    const struct vhdx_regions *rg = &s->info.regions;
    if (!s->info.header.log_pending)
        return 0;
    uint64_t end = s->log_off + s->log_len;
    if (end > rg->meta.off || end > rg->bat.off)
        return fail(s, -ENOTSUP, "a log to replay (not closed cleanly) at %"
                    PRIu64 ", after the metadata or BAT it may update: "
                    LOG_CLEAN, s->log_off);
    if (s->log_len > VHDX_LOG_MAX)
        return fail(s, -EFBIG, "a log to replay (the file was not closed "
                    "cleanly) of %" PRIu64 " bytes, more than %llu: "
                    LOG_CLEAN, s->log_len, VHDX_LOG_MAX);
    if (!(s->log = calloc(1, s->log_len)))
        return fail(s, -ENOMEM, "out of memory for the log");
    return 0;
}

/* The log is in: plan its replay; every write must land at or past the
 * log's end (bytes not yet passed). */
static int log_ready(struct vhdx_stream *s)
{
    struct vhdx_log_plan *p = &s->plan;
    int r = vhdx_log_plan(s->log, s->log_len, s->info.header.log_guid, p,
                          &s->e);
    free(s->log);
    s->log = NULL;
    s->log_done = true;
    if (r < 0)
        return s->err = r;
    uint64_t end = s->log_off + s->log_len;
    if (p->npatches && p->lo < end)
        return fail(s, -ENOTSUP, "a log to replay (the file was not closed "
                    "cleanly) writes at %" PRIu64 ", before the log's end at %"
                    PRIu64 ", which a one-pass copy has passed: " LOG_CLEAN,
                    p->lo, end);
    s->info.log_entries = p->entries;
    s->info.log_writes = p->npatches;
    return 0;
}

/* Bytes past the log's end, with the log's writes made on them: a piece
 * a write touches is copied and patched, the rest passes as it is.  Over
 * file zeros (buf NULL) only data writes matter. */
static int feed_patched(struct vhdx_stream *s, const uint8_t *buf,
                        uint64_t len)
{
    uint8_t *tmp = NULL;
    int r = 0;
    while (len && r == 0) {
        uint64_t off = s->pos, n;
        uint64_t next = vhdx_log_next(&s->plan, off, buf == NULL);
        if (next > off) {
            n = next - off < len ? next - off : len;
            r = vhdx_feed_body(s, buf, n);
        } else {
            n = len < REPLAY_BUF ? len : REPLAY_BUF;
            if (!tmp && !(tmp = malloc(REPLAY_BUF))) {
                r = fail(s, -ENOMEM, "out of memory replaying the log");
                break;
            }
            if (buf)
                memcpy(tmp, buf, n);
            else
                memset(tmp, 0, n);
            vhdx_log_apply(&s->plan, off, tmp, n);
            r = vhdx_feed_body(s, tmp, n);
        }
        len -= n;
        if (buf)
            buf += n;
    }
    free(tmp);
    return r;
}

/* Bytes past the header section: collect the log while it passes, then
 * replay it onto what follows. */
int vhdx_feed_log(struct vhdx_stream *s, const uint8_t *buf, uint64_t len)
{
    if (!s->info.header.log_pending)
        return vhdx_feed_body(s, buf, len);
    if (!s->log_done) {
        uint64_t end = s->log_off + s->log_len;
        uint64_t n = end - s->pos < len ? end - s->pos : len;
        if (s->pos < s->log_off && s->log_off - s->pos < n)
            n = s->log_off - s->pos;            /* up to the log */
        vhdx_region_copy(s->pos, buf, n, s->log_off, s->log_len, s->log);
        int r = vhdx_feed_body(s, buf, n);
        if (r < 0 || (s->pos == end && (r = log_ready(s)) < 0))
            return r;
        len -= n;
        if (buf)
            buf += n;
        if (!len || !s->log_done)
            return len ? vhdx_feed_log(s, buf, len) : 0;
    }
    return feed_patched(s, buf, len);
}
