/* fs/status.c: the live status, as JSON, for MNT/.nbdferry-status. */
#include "fs/fs.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double elapsed_s(const struct timespec *since)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return (double) (now.tv_sec - since->tv_sec) +
           (double) (now.tv_nsec - since->tv_nsec) / 1e9;
}

static void put_failures(FILE *f, const struct pool_stats *s)
{
    static const char *kind[] = { "write", "zero", "flush", "read" };

    fputs("  \"failures\": [", f);
    for (unsigned i = 0; i < s->nfailures; i++)
        fprintf(f, "%s\n    {\"kind\": \"%s\", \"offset\": %" PRIu64
                   ", \"length\": %" PRIu64 ", \"errno\": %d}",
                i ? "," : "", kind[s->failures[i].kind], s->failures[i].off,
                s->failures[i].len, s->failures[i].err);
    fputs(s->nfailures ? "\n  ]\n" : "]\n", f);
}

char *fs_status_json(struct fs *fs, size_t *len)
{
    struct pool_stats s;
    struct nbdx_stats n;
    const struct nbdx_info *info = nbdx_info(fs->x);
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);

    if (!f)
        return NULL;
    pool_get_stats(fs->pool, &s);
    nbdx_get_stats(fs->x, &n);
    pthread_mutex_lock(&fs->lock);
    uint64_t apparent = fs->apparent_size;
    pthread_mutex_unlock(&fs->lock);

    fprintf(f, "{\n");
    fprintf(f, "  \"export_size\": %" PRIu64 ",\n", fs->export_size);
    fprintf(f, "  \"apparent_size\": %" PRIu64 ",\n", apparent);
    fprintf(f, "  \"uptime_s\": %.3f,\n", elapsed_s(&fs->started));
    fprintf(f, "  \"connections\": %u,\n", info->connections);
    fprintf(f, "  \"request_size\": %zu,\n", s.request_size);
    fprintf(f, "  \"bytes_written\": %" PRIu64 ",\n", s.bytes_written);
    fprintf(f, "  \"bytes_acknowledged\": %" PRIu64 ",\n", s.bytes_acked);
    fprintf(f, "  \"bytes_zeroed\": %" PRIu64 ",\n", s.bytes_zeroed);
    fprintf(f, "  \"bytes_zero_skipped\": %" PRIu64 ",\n",
            s.bytes_zero_skipped);
    fprintf(f, "  \"bytes_read\": %" PRIu64 ",\n", s.bytes_read);
    fprintf(f, "  \"pending_zero_bytes\": %" PRIu64 ",\n", s.pending_zero);
    fprintf(f, "  \"known_zero_bytes\": %" PRIu64 ",\n", s.known_zero);
    fprintf(f, "  \"in_flight\": %u,\n", s.in_flight);
    fprintf(f, "  \"in_flight_peak\": %u,\n", s.in_flight_peak);
    fprintf(f, "  \"pool_buffers_in_use\": %u,\n", s.bufs_in_use);
    fprintf(f, "  \"pool_buffers\": %u,\n", s.nbufs);
    fprintf(f, "  \"writer_wait_s\": %.6f,\n", (double) s.wait_ns / 1e9);
    fprintf(f, "  \"nothing_in_flight_s\": %.6f,\n", (double) s.idle_ns / 1e9);
    fprintf(f, "  \"nbd_requests\": {\"read\": %" PRIu64 ", \"write\": %" PRIu64
               ", \"zero\": %" PRIu64 ", \"flush\": %" PRIu64
               ", \"block_status\": %" PRIu64 "},\n",
            n.ops[NBDX_OP_READ], n.ops[NBDX_OP_WRITE], n.ops[NBDX_OP_ZERO],
            n.ops[NBDX_OP_FLUSH], n.ops[NBDX_OP_BLOCK_STATUS]);
    fprintf(f, "  \"errors\": %" PRIu64 ",\n", s.errors);
    put_failures(f, &s);
    fprintf(f, "}\n");
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}
