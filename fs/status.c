/* fs/status.c: the live status, as JSON, for MNT/.nbdferry-status.
 *
 * Generated at open from one snapshot of each part (pool, connections,
 * progress, digest); reading the file returns that snapshot.  Byte
 * counters add up: bytes_acknowledged + bytes_failed +
 * bytes_unacknowledged == bytes_written, and acknowledged equals written
 * once a close() or fsync() has returned without error.
 * tools/status/nbdferry-status reads this; docs/nbdferry.1 documents each key.
 * The file itself is a view (fs/view.h), read-only, at the end.
 */
#include "fs/view.h"
#include "fs/warm.h"
#include "transport/tcpinfo.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/json.h"
#include "common/log.h"

#include "digest/digest.h"
#include "fs/progress.h"
#include "fs/rawfile.h"
#include "transport/readahead.h"
#include "fs/readback.h"

static double elapsed_s(const struct timespec *since)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return (double) (now.tv_sec - since->tv_sec) +
           (double) (now.tv_nsec - since->tv_nsec) / 1e9;
}

/* Failed NBD requests (the first ones), then the daemon's latest errors
 * and warnings, each with its message. */
static void put_nbd_failures(FILE *f, const struct pool_stats *s)
{
    for (unsigned i = 0; i < s->nfailures; i++) {
        const struct pool_failure *e = &s->failures[i];
        fprintf(f, "%s\n    {\"kind\": \"%s\", \"offset\": %" PRIu64
                   ", \"length\": %" PRIu64 ", \"errno\": %d, \"time\": %lld"
                   ", \"lost_at_reconnect\": %s, \"repaired\": %s",
                i ? "," : "", pool_kind_name(e->kind), e->off, e->len, e->err,
                (long long) e->time_s, e->lost ? "true" : "false",
                e->repaired ? "true" : "false");
        if (e->repaired)
            fprintf(f, ", \"repaired_time\": %lld", (long long) e->repaired_s);
        fputs(", \"message\": ", f);
        json_put_string(f, e->lost ? "acknowledged, then the connection was "
                                     "made again before an NBD flush "
                                     "covered it"
                                   : strerror(e->err));
        fputc('}', f);
    }
}

/* What the disk may not hold now: every close and fsync fails until
 * it is empty. */
static void put_damage(FILE *f, const struct pool_stats *s)
{
    fprintf(f, "  \"damage\": {\"unrepaired\": %s, \"bytes\": %" PRIu64
               ", \"ranges\": %" PRIu64 ", \"flush_failed\": %s"
               ", \"everything\": %s, \"repaired\": %" PRIu64
               ", \"first\": [",
            s->unrepaired ? "true" : "false", s->damaged_bytes,
            s->damaged_ranges, s->flush_failed ? "true" : "false",
            s->damage_everything ? "true" : "false", s->repairs);
    for (unsigned i = 0; i < s->ndamage; i++)
        fprintf(f, "%s{\"offset\": %" PRIu64 ", \"length\": %" PRIu64 "}",
                i ? ", " : "", s->damage[i].start,
                s->damage[i].end - s->damage[i].start);
    fputs("]},\n", f);
}

static void put_failures(FILE *f, const struct pool_stats *s,
                         const struct log_entry *e, unsigned n)
{
    fputs("  \"failures\": [", f);
    put_nbd_failures(f, s);
    for (unsigned i = 0; i < n; i++) {
        fprintf(f, "%s\n    {\"kind\": \"%s\", \"time\": %lld, "
                   "\"last_time\": %lld, \"repeated\": %" PRIu64
                   ", \"message\": ",
                i || s->nfailures ? "," : "", e[i].error ? "error" : "warning",
                (long long) e[i].first, (long long) e[i].last, e[i].repeated);
        json_put_string(f, e[i].msg);
        fputc('}', f);
    }
    fputs(s->nfailures || n ? "\n  ],\n" : "],\n", f);
}

static void put_requests(FILE *f, const struct pool_stats *s,
                         const struct nbdx_stats *n)
{
    fprintf(f, "  \"nbd_requests\": {\"read\": %" PRIu64 ", \"write\": %" PRIu64
               ", \"zero\": %" PRIu64 ", \"flush\": %" PRIu64
               ", \"block_status\": %" PRIu64 "},\n",
            n->ops[NBDX_OP_READ], n->ops[NBDX_OP_WRITE], n->ops[NBDX_OP_ZERO],
            n->ops[NBDX_OP_FLUSH], n->ops[NBDX_OP_BLOCK_STATUS]);
    fprintf(f, "  \"requests_completed\": {\"write\": %" PRIu64
               ", \"zero\": %" PRIu64 ", \"flush\": %" PRIu64
               ", \"read\": %" PRIu64 "},\n",
            s->requests[POOL_WRITE], s->requests[POOL_ZERO],
            s->requests[POOL_FLUSH], s->requests[POOL_READ]);
}

static void put_server(FILE *f, const struct nbdx_info *info)
{
    fprintf(f, "  \"connections\": %u,\n", info->connections);
    fprintf(f, "  \"server\": {\"tcp\": %s, \"can_zero\": %s, "
               "\"can_fast_zero\": %s, \"can_multi_conn\": %s, "
               "\"can_extents\": %s, \"block_max\": %" PRIu32 ", "
               "\"extended_headers\": %s},\n",
            info->tcp ? "true" : "false", info->can_zero ? "true" : "false",
            info->can_fast_zero ? "true" : "false",
            info->can_multi_conn ? "true" : "false",
            info->can_extents ? "true" : "false", info->block_max,
            /* negotiated with the server, or not built in (libnbd < 1.18) */
            !nbdx_ext_headers_built() ? "\"not built\""
            : info->ext_headers       ? "true"
                                      : "false");
}

static void put_progress(FILE *f, struct fs_disk *d, const struct pool_stats *s,
                         double uptime)
{
    struct progress_info pi;

    progress_get(d->progress, &pi);
    fprintf(f, "  \"throughput\": {\"last_1s\": %.0f, \"last_5s\": %.0f, "
               "\"last_10s\": %.0f, \"average\": %.0f},\n",
            pi.rate_1s, pi.rate_5s, pi.rate_10s,
            uptime > 0 ? (double) s->bytes_acked / uptime : 0.0);
    /* percent, remaining and eta_s count data ("counts": "data": the
     * source's holes left out) when the source's map is known; written
     * and acknowledged are this copy's (the top-level bytes_* are the
     * mount's, every copy since it began). */
    fprintf(f, "  \"progress\": {\"done\": %" PRIu64 ", \"total\": %" PRIu64
               ", \"total_from\": \"%s\", \"percent\": %.1f, "
               "\"frontier\": %" PRIu64 ", \"settled\": %s, "
               "\"failed\": %s, "
               "\"counts\": \"%s\", \"data_done\": %" PRIu64
               ", \"data_total\": %" PRIu64 ", \"remaining\": %" PRIu64
               ", \"written\": %" PRIu64 ", \"acknowledged\": %" PRIu64
               ", \"skipped_bytes\": %" PRIu64 ", \"eta_s\": %.1f},\n",
            pi.done, pi.total, progress_total_name(pi.total_from),
            pi.percent, pi.frontier, pi.settled ? "true" : "false",
            pi.failed ? "true" : "false",
            pi.by_data ? "data" : "bytes", pi.data_done, pi.data_total,
            pi.remaining, pi.pass_written, pi.pass_acked, pi.pass_skipped,
            pi.eta_s);
}

/* The digest describes what was written through the file; while a failed
 * NBD write or flush is not repaired (its range written again and
 * acknowledged) the disk may differ, so no value is shown then. */
static void put_digest(FILE *f, struct fs_disk *d, const struct pool_stats *s,
                       uint64_t apparent)
{
    struct digest_info di;
    char reason[160];

    digest_get(d->digest, apparent, &di);
    const char *state = digest_state_name(di.state);
    snprintf(reason, sizeof reason, "%s", di.reason);
    if (s->unrepaired && di.state != DIGEST_DISABLED) {
        state = "write-failed";
        snprintf(reason, sizeof reason, "an NBD request failed: the disk "
                 "may not hold what was written");
        di.hex[0] = '\0';
    }
    fprintf(f, "  \"digest\": {\"algorithm\": \"%s\", \"state\": \"%s\", "
               "\"covered\": %" PRIu64 ", \"size\": %" PRIu64
               ", \"queued_bytes\": %" PRIu64,
            di.algorithm, state, di.covered, apparent, di.queued);
    if (di.hex[0])
        fprintf(f, ", \"value\": \"%s\"", di.hex);
    if (reason[0]) {
        fputs(", \"reason\": ", f);
        json_put_string(f, reason);
    }
    if (di.state != DIGEST_DISABLED)
        fprintf(f, ", \"held_bytes\": %" PRIu64 ", \"hold_limit\": %" PRIu64
                   ", \"copied_bytes\": %" PRIu64 ", \"copy_waited_s\": %.6f"
                   ", \"reused_bytes\": %" PRIu64,
                di.held, di.hold_limit, di.copied,
                (double) di.copy_wait_ns / 1e9, di.reused);
    if (di.check[0]) {
        fputs(", \"check\": ", f);
        json_put_string(f, di.check);
    }
    fputs("}\n", f);
}

/* ---- does the server answer? ----------------------------------------- */

/* Requests outstanding with nothing heard from the server, on any
 * connection, for longer than this: late.  The status says so at once,
 * long before the request timeout gives up on them. */
#define LATE_S 1.0

static void put_time(FILE *f, const char *key, time_t t)
{
    char buf[64];
    struct tm tm;

    fprintf(f, ", \"%s\": ", key);
    if (!t || !localtime_r(&t, &tm) ||
        !strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S%z", &tm)) {
        fputs("null", f);
        return;
    }
    json_put_string(f, buf);
}

static const char *health_state(const struct nbdx_health *h)
{
    if (h->lost)
        return "lost";
    if (h->reconnecting)
        return "reconnecting";
    if (h->stalled)
        return "stalled";
    if (h->silent_s > LATE_S)
        return "late";
    return h->heals ? "healed" : "ok";
}

static void health_message(const struct nbdx_health *h, const char *state,
                           char *buf, size_t len)
{
    char lost_at[64] = "", healed_at[64] = "";
    struct tm tm;

    if (h->lost_at && localtime_r(&h->lost_at, &tm))
        strftime(lost_at, sizeof lost_at, "%Y-%m-%d %H:%M:%S", &tm);
    if (h->healed_at && localtime_r(&h->healed_at, &tm))
        strftime(healed_at, sizeof healed_at, "%Y-%m-%d %H:%M:%S", &tm);
    if (strcmp(state, "lost") == 0 && h->can_heal)
        snprintf(buf, len, "the server was given up on at %s (%s): every "
                 "request fails with EIO; the next open or write tries it "
                 "again", lost_at, h->why);
    else if (strcmp(state, "lost") == 0)
        snprintf(buf, len, "the server was given up on at %s (%s) and this "
                 "mount cannot reconnect (--command, --fd or socket "
                 "activation): unmount and mount again", lost_at, h->why);
    else if (strcmp(state, "reconnecting") == 0)
        snprintf(buf, len, "the connection to the server was lost: "
                 "reconnecting (%s); the copy fails in %.0f s unless it "
                 "succeeds", h->retry_why[0] ? h->retry_why : "no try yet",
                 h->fails_in_s);
    else if (strcmp(state, "ok") == 0)
        snprintf(buf, len, "the server answers");
    else if (strcmp(state, "healed") == 0)
        snprintf(buf, len, "healed at %s: the server answers again (it was "
                 "given up on at %s: %s)", healed_at, lost_at, h->why);
    else if (h->silent_s <= LATE_S)       /* stalled, the others answer */
        snprintf(buf, len, "a connection has had no reply for %.0f s "
                 "(--request-timeout) while the others get theirs: a slow "
                 "server; it fails in %.0f s unless it answers",
                 h->worst_s, h->fails_in_s);
    else if (h->fails_in_s >= 0)
        snprintf(buf, len, "no reply for %.0f s from the server (%u "
                 "request(s) waiting); the copy fails in %.0f s unless it "
                 "answers", h->silent_s, h->outstanding, h->fails_in_s);
    else
        snprintf(buf, len, "no reply for %.0f s from the server (%u "
                 "request(s) waiting; no --request-timeout: waiting for "
                 "ever)", h->silent_s, h->outstanding);
}

static void put_health(FILE *f, struct fs_disk *d)
{
    struct nbdx_health h;
    char msg[512];

    nbdx_get_health(d->x, &h);
    const char *state = health_state(&h);
    health_message(&h, state, msg, sizeof msg);
    fprintf(f, "  \"server_answers\": {\"state\": \"%s\", "
               "\"no_reply_s\": %.1f, \"outstanding\": %u, ",
            state, h.silent_s > LATE_S ? h.silent_s : 0.0, h.outstanding);
    if (h.fails_in_s >= 0 && !h.lost &&
        (h.silent_s > LATE_S || h.stalled))
        fprintf(f, "\"fails_in_s\": %.1f, ", h.fails_in_s);
    else
        fputs("\"fails_in_s\": null, ", f);
    fprintf(f, "\"can_heal\": %s, \"losses\": %u, \"heals\": %u",
            h.can_heal ? "true" : "false", h.losses, h.heals);
    if (h.reconnecting && h.retry_why[0]) {
        fputs(", \"reconnect_error\": ", f);
        json_put_string(f, h.retry_why);
    }
    put_time(f, "lost_at", h.lost_at);
    put_time(f, "healed_at", h.healed_at);
    fputs(", \"message\": ", f);
    json_put_string(f, msg);
    fputs("},\n", f);
}

/* Stall diagnostics of TCP connections (transport/tcpinfo.h): samples
 * where less than one MSS waits unsent behind unacknowledged segments are
 * the Nagle/delayed-ACK signature. */
static void put_tcp(FILE *f, struct fs_disk *d)
{
    struct tcpinfo_stats t;

    if (!d->tcp) {
        fputs("  \"tcp\": null,\n", f);
        return;
    }
    tcpinfo_get(d->tcp, &t);
    fprintf(f, "  \"tcp\": {\"sample_interval_ms\": %u, \"samples\": %" PRIu64
               ", \"nagle_stall_samples\": %" PRIu64
               ", \"unsent_samples\": %" PRIu64 ", \"rtt_us\": %u"
               ", \"rttvar_us\": %u, \"unacked_segments\": %u"
               ", \"notsent_bytes\": %u, \"mss\": %u},\n",
            t.interval_ms, t.samples, t.nagle_stalls, t.unsent_samples,
            t.rtt_us, t.rttvar_us, t.unacked, t.notsent_bytes, t.mss);
}

/* One disk's keys: the whole document of a one-disk mount, a section of
 * "disks" in a mount of several. */
static void put_disk(FILE *f, struct fs_disk *d, double uptime)
{
    struct pool_stats s;
    struct nbdx_stats n;
    const struct nbdx_info *info = nbdx_info(d->x);

    pool_get_stats(d->pool, &s);
    nbdx_get_stats(d->x, &n);
    uint64_t apparent = rawfile_size(d);

    fprintf(f, "  \"export_size\": %" PRIu64 ",\n", d->export_size);
    fprintf(f, "  \"apparent_size\": %" PRIu64 ",\n", apparent);
    fprintf(f, "  \"uptime_s\": %.3f,\n", uptime);
    put_server(f, info);
    fprintf(f, "  \"request_size\": %zu,\n", s.request_size);
    fprintf(f, "  \"bytes_written\": %" PRIu64 ",\n", s.bytes_written);
    fprintf(f, "  \"bytes_acknowledged\": %" PRIu64 ",\n", s.bytes_acked);
    fprintf(f, "  \"bytes_unacknowledged\": %" PRIu64 ",\n",
            pool_stats_waiting(&s));
    fprintf(f, "  \"bytes_failed\": %" PRIu64 ",\n", s.bytes_failed);
    fprintf(f, "  \"bytes_landed\": %" PRIu64 ",\n", s.bytes_landed);
    fprintf(f, "  \"bytes_zeroed\": %" PRIu64 ",\n", s.bytes_zeroed);
    fprintf(f, "  \"bytes_zero_skipped\": %" PRIu64 ",\n",
            s.bytes_zero_skipped);
    fprintf(f, "  \"bytes_read\": %" PRIu64 ",\n", s.bytes_read);
    fprintf(f, "  \"pending_zero_bytes\": %" PRIu64 ",\n", s.pending_zero);
    fprintf(f, "  \"known_zero_bytes\": %" PRIu64 ",\n", s.known_zero);
    fprintf(f, "  \"pending_zero_ranges\": %" PRIu64 ",\n",
            s.pending_zero_ranges);
    fprintf(f, "  \"known_zero_ranges\": %" PRIu64 ",\n", s.known_zero_ranges);
    fprintf(f, "  \"block_status_scan\": \"%s\",\n", s.scan);
    fprintf(f, "  \"zeroing\": {\"active\": %s, \"abandoned\": %s, "
               "\"bytes_done\": %" PRIu64 ", \"bytes_total\": %" PRIu64 "},\n",
            s.zeroing_active ? "true" : "false",
            s.zeroing_abandoned ? "true" : "false", s.zeroing_done,
            s.zeroing_total);
    fprintf(f, "  \"in_flight\": %u,\n", s.in_flight);
    fprintf(f, "  \"in_flight_peak\": %u,\n", s.in_flight_peak);
    struct ra_stats ra;
    ra_get_stats(d->ra, &ra);
    fprintf(f, "  \"readahead\": {\"budget\": %zu, \"in_use\": %zu, "
            "\"hit_bytes\": %" PRIu64 ", \"miss_bytes\": %" PRIu64 ", "
            "\"chunks\": %" PRIu64 ", \"dropped\": %" PRIu64 ", "
            "\"waits\": %" PRIu64 "},\n",
            ra.budget, ra.in_use, ra.hits, ra.misses, ra.chunks, ra.dropped,
            ra.waits);
    fprintf(f, "  \"pool_buffers_in_use\": %u,\n", s.bufs_in_use);
    fprintf(f, "  \"pool_buffers\": %u,\n", s.nbufs);
    fprintf(f, "  \"pool_hold_buffers\": %u,\n", s.hold_bufs);
    fprintf(f, "  \"pool_buffers_retained\": %u,\n", s.bufs_retained);
    fprintf(f, "  \"bytes_resent\": %" PRIu64 ",\n", s.bytes_resent);
    fprintf(f, "  \"pool_flushes\": %" PRIu64 ",\n", s.flushes_auto);
    fprintf(f, "  \"writer_wait_s\": %.6f,\n", (double) s.wait_ns / 1e9);
    fprintf(f, "  \"nothing_in_flight_s\": %.6f,\n", (double) s.idle_ns / 1e9);
    put_tcp(f, d);
    put_health(f, d);
    put_requests(f, &s, &n);
    struct log_entry recent[LOG_RECENT];
    uint64_t log_errors, log_warnings;
    unsigned nrecent = log_recent(recent, &log_errors, &log_warnings);
    fprintf(f, "  \"errors\": %" PRIu64 ",\n", s.errors + log_errors);
    fprintf(f, "  \"warnings\": %" PRIu64 ",\n", log_warnings);
    put_failures(f, &s, recent, nrecent);
    put_damage(f, &s);
    put_progress(f, d, &s, uptime);
    readback_put_status(f, d);
    warm_put_status(f, d);
    put_digest(f, d, &s, apparent);
}

/* A mount of several disks: each disk's section, then the totals. */
static void put_disks(FILE *f, struct fs *fs, double uptime)
{
    uint64_t size = 0, apparent = 0, written = 0, acked = 0, errors = 0,
             waiting = 0;

    fprintf(f, "  \"disks\": [\n");
    for (unsigned i = 0; i < fs->ndisks; i++) {
        struct fs_disk *d = &fs->disks[i];
        struct pool_stats s;

        fprintf(f, "  {\n  \"name\": ");
        json_put_string(f, d->filename);
        fprintf(f, ",\n");
        put_disk(f, d, uptime);
        fprintf(f, "  }%s\n", i + 1 < fs->ndisks ? "," : "");
        pool_get_stats(d->pool, &s);
        size += d->export_size;
        apparent += rawfile_size(d);
        written += s.bytes_written;
        acked += s.bytes_acked;
        waiting += pool_stats_waiting(&s);
        errors += s.errors;
    }
    fprintf(f, "  ],\n");
    struct log_entry recent[LOG_RECENT];
    uint64_t log_errors, log_warnings;
    log_recent(recent, &log_errors, &log_warnings);
    fprintf(f, "  \"total\": {\"disks\": %u, \"export_size\": %" PRIu64
               ", \"apparent_size\": %" PRIu64 ", \"bytes_written\": %"
               PRIu64 ", \"bytes_acknowledged\": %" PRIu64
               ", \"bytes_unacknowledged\": %" PRIu64 ", \"errors\": %"
               PRIu64 ", \"warnings\": %" PRIu64 "}\n",
            fs->ndisks, size, apparent, written, acked,
            waiting, errors + log_errors,
            log_warnings);
}

char *fs_status_json(struct fs *fs, size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);

    if (!f)
        return NULL;
    double uptime = elapsed_s(&fs->cfg.started);
    fprintf(f, "{\n");
    fprintf(f, "  \"pid\": %ld,\n", (long) getpid());  /* --unmount */
    fprintf(f, "  \"fuse_transport\": \"%s\",\n",
            __atomic_load_n(&fs->uring_seen, __ATOMIC_RELAXED)
                ? "io_uring" : "/dev/fuse");
    if (fs->ndisks == 1) {
        put_disk(f, &fs->disks[0], uptime);
    } else {
        fprintf(f, "  \"uptime_s\": %.3f,\n", uptime);
        put_disks(f, fs, uptime);
    }
    fprintf(f, "}\n");
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* ---- the view ------------------------------------------------------------ */

struct snapshot {
    size_t len;
    char *text;
};

static void status_attr(struct fs_disk *d, struct stat *st)
{
    st->st_mode = S_IFREG | 0400;
    st->st_nlink = 1;
    st->st_size = 0;              /* generated at open; read until EOF */
}

static int status_open(struct fs_disk *d, struct fs_fh *fh, int flags, pid_t pid)
{
    struct snapshot *s = calloc(1, sizeof *s);

    if (!s || !(s->text = fs_status_json(d->fs, &s->len))) {
        free(s);
        return -ENOMEM;
    }
    fh->view_data = s;
    return 0;
}

static void status_read(fuse_req_t req, struct fs_disk *d, struct fs_fh *fh,
                        size_t size, off_t off)
{
    const struct snapshot *s = fh->view_data;

    if (off < 0 || (size_t) off >= s->len) {
        fuse_reply_buf(req, NULL, 0);
        return;
    }
    /* Reply from a copy: the kernel completes the read inside writev(), so
     * the reader may close and the release free the snapshot before
     * fuse_reply_buf() returns (ASan checks the iovec after the call). */
    size_t n = s->len - (size_t) off;
    if (n > size)
        n = size;
    char *copy = malloc(n);
    if (!copy) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    memcpy(copy, s->text + off, n);
    fuse_reply_buf(req, copy, n);
    free(copy);
}

static void status_release(struct fs_disk *d, struct fs_fh *fh)
{
    struct snapshot *s = fh->view_data;

    if (s)
        free(s->text);
    free(s);
    fh->view_data = NULL;
}

const struct fs_view fs_status_view = {
    .fixed_name = FS_STATUS_NAME,
    .attr = status_attr,
    .open = status_open,
    .read = status_read,
    .release = status_release,
};
