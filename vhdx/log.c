/* vhdx/log.c: the VHDX log: find the active sequence of entries and turn
 * it into the file writes that replaying it makes.  No I/O: the caller
 * hands in the whole log region.  See docs/design/format-vhdx.md, "The log".
 *
 * The log is a ring of 4 KiB sectors.  An entry starts on a sector with a
 * 64-byte header ("loge", CRC-32C over the whole entry with the checksum
 * field zero, the entry's length, the tail, a sequence number, the
 * descriptor count, the log GUID, the flushed and last file offsets),
 * descriptors follow (32 bytes each, through as many sectors as they
 * need), then one data sector per data descriptor.  A data descriptor
 * ("desc") writes one 4 KiB sector: its first 8 bytes and last 4 are in
 * the descriptor, the 4084 between in the data sector ("data", with the
 * sequence number split around them); a zero descriptor ("zero") writes
 * zeros over a 4 KiB multiple.
 *
 * The active sequence: runs of valid entries, each directly after the
 * previous in the ring with the next sequence number; a run counts only
 * when the tail its last entry names is one of its entries (the writer
 * had not yet reused the space of an entry still needed); of those, the
 * one ending with the highest sequence number.  Replay writes its entries
 * from that tail to the end, in order.  Entries with another log GUID are
 * an older log's leftovers and never valid; a torn or damaged entry ends
 * its run.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/vector.h"
#include "vhdx/vhdx-internal.h"

#define SEC VHDX_LOG_SECTOR
#define ENTRY_HEAD 64u
#define DESC_BYTES 32u
/* Work allowed in the search (bytes of entries checked), in multiples of
 * the log's length: a damaged log full of headers with the log's GUID
 * claiming long entries must not cost hours.  Past it the log is refused
 * rather than taken as empty. */
#define CRC_BUDGET 64u

struct ring {
    const uint8_t *log;
    uint64_t nsec;
    uint64_t crc_left;                  /* bytes the search may still sum */
    bool exhausted;                     /* ... and it ran out */
};

struct entry {                          /* a valid entry, decoded */
    uint64_t at;                        /* its first sector */
    uint64_t nsec;                      /* sectors it spans */
    uint64_t seq;
    uint64_t tail;                      /* sector of the tail it names */
    uint32_t ndesc;
    uint64_t flushed, last;
};

static const uint8_t *sector(const struct ring *r, uint64_t i)
{
    return r->log + (i % r->nsec) * SEC;
}

static uint64_t desc_sectors(uint32_t ndesc)
{
    return (ENTRY_HEAD + (uint64_t) ndesc * DESC_BYTES + SEC - 1) / SEC;
}

/* Descriptor k of the entry at sector 'at' (descriptors never straddle a
 * sector: 64 + 32 k is a multiple of 32). */
static const uint8_t *descriptor(const struct ring *r, uint64_t at, uint32_t k)
{
    uint64_t byte = ENTRY_HEAD + (uint64_t) k * DESC_BYTES;
    return sector(r, at + byte / SEC) + byte % SEC;
}

static uint32_t entry_crc(struct ring *r, uint64_t at, uint64_t nsec)
{
    static const uint8_t zero4[4];
    const uint8_t *h = sector(r, at);
    uint32_t c = vhdx_crc32c(0, h, 4);
    c = vhdx_crc32c(c, zero4, 4);
    c = vhdx_crc32c(c, h + 8, SEC - 8);
    for (uint64_t i = 1; i < nsec; i++)
        c = vhdx_crc32c(c, sector(r, at + i), SEC);
    return c;
}

/* The descriptors and data sectors agree with the header (cheap checks,
 * before the CRC).  Counts the data descriptors into *ndata. */
static bool descriptors_ok(const struct ring *r, const struct entry *e,
                           uint64_t *ndata)
{
    uint64_t data = e->at + desc_sectors(e->ndesc);
    *ndata = 0;
    for (uint32_t k = 0; k < e->ndesc; k++) {
        const uint8_t *d = descriptor(r, e->at, k);
        if (vhdx_le64(d + 24) != e->seq || vhdx_le64(d + 16) % SEC)
            return false;
        if (memcmp(d, "zero", 4) == 0) {
            if (vhdx_le64(d + 8) % SEC)
                return false;
            continue;
        }
        if (memcmp(d, "desc", 4) != 0)
            return false;
        if (desc_sectors(e->ndesc) + ++*ndata > e->nsec)
            return false;
        const uint8_t *s = sector(r, data++);
        uint64_t seq = (uint64_t) vhdx_le32(s + 4) << 32 | vhdx_le32(s + SEC - 4);
        if (memcmp(s, "data", 4) != 0 || seq != e->seq)
            return false;
    }
    return true;
}

/* Is there a valid entry at sector 'at' (with sequence number 'want',
 * or any when want is 0)?  Fills *e. */
static bool entry_at(struct ring *r, uint64_t at, const uint8_t guid[16],
                     uint64_t want, struct entry *e)
{
    const uint8_t *h = sector(r, at);
    if (memcmp(h, "loge", 4) != 0 || memcmp(h + 32, guid, 16) != 0)
        return false;
    uint32_t len = vhdx_le32(h + 8), tail = vhdx_le32(h + 12);
    *e = (struct entry){ .at = at % r->nsec, .nsec = len / SEC,
                         .seq = vhdx_le64(h + 16), .tail = tail / SEC,
                         .ndesc = vhdx_le32(h + 24),
                         .flushed = vhdx_le64(h + 48),
                         .last = vhdx_le64(h + 56) };
    if (len == 0 || len % SEC || e->nsec > r->nsec || tail % SEC ||
        e->tail >= r->nsec || e->seq == 0 || (want && e->seq != want) ||
        desc_sectors(e->ndesc) > e->nsec)
        return false;
    if (r->crc_left < len) {            /* see CRC_BUDGET */
        r->exhausted = true;
        return false;
    }
    r->crc_left -= len;
    uint64_t ndata;
    return descriptors_ok(r, e, &ndata) &&
           entry_crc(r, at, e->nsec) == vhdx_le32(h + 4);
}

DEFINE_VECTOR_TYPE(run, struct entry, 16);

static int run_push(struct run *run, const struct entry *e)
{
    return run_append(run, *e) < 0 ? -ENOMEM : 0;
}

/* The run of valid entries starting with 'first'; marks the sectors of
 * every entry after the first in 'covered' (a run starting there is a
 * suffix of this one, never better). */
static int run_from(struct ring *r, const uint8_t guid[16],
                    const struct entry *first, struct run *run, bool *covered)
{
    run->len = 0;
    int rc = run_push(run, first);
    uint64_t used = first->nsec;
    struct entry e = *first, next;
    while (rc == 0 && used < r->nsec && e.seq < UINT64_MAX &&
           entry_at(r, e.at + e.nsec, guid, e.seq + 1, &next) &&
           used + next.nsec <= r->nsec) {
        covered[next.at] = true;
        used += next.nsec;
        rc = run_push(run, &next);
        e = next;
    }
    return rc;
}

/* Index in run of the entry the last one names as tail, or -1. */
static long run_tail(const struct run *run)
{
    uint64_t tail = run->ptr[run->len - 1].tail;
    for (size_t i = 0; i < run->len; i++)
        if (run->ptr[i].at == tail)
            return (long) i;
    return -1;
}

/* ---- the plan --------------------------------------------------------- */

static int plan_push(struct vhdx_log_plan *p, size_t *cap, uint64_t off,
                     uint64_t len, const uint8_t *data)
{
    if (len == 0)
        return 0;
    void *v = p->patches;
    if (vector_grow(&v, cap, p->npatches, 1, sizeof *p->patches, 64) < 0)
        return -ENOMEM;
    p->patches = v;
    p->patches[p->npatches++] = (struct vhdx_log_patch){ off, len, data };
    if (p->lo > off)
        p->lo = off;
    if (p->hi < off + len)
        p->hi = off + len;
    return 0;
}

/* The writes of one entry, in descriptor order. */
static int plan_entry(const struct ring *r, const struct entry *e,
                      struct vhdx_log_plan *p, size_t *cap, uint8_t **next)
{
    uint64_t data = e->at + desc_sectors(e->ndesc);
    for (uint32_t k = 0; k < e->ndesc; k++) {
        const uint8_t *d = descriptor(r, e->at, k);
        uint64_t off = vhdx_le64(d + 16);
        int rc;
        if (memcmp(d, "zero", 4) == 0) {
            uint64_t len = vhdx_le64(d + 8);
            if (off + len < off)
                return -EINVAL;
            rc = plan_push(p, cap, off, len, NULL);
        } else {
            uint8_t *s = *next;
            *next += SEC;
            memcpy(s, d + 8, 8);                          /* leading bytes */
            memcpy(s + 8, sector(r, data++) + 8, SEC - 12);
            memcpy(s + SEC - 4, d + 4, 4);                /* trailing bytes */
            if (off + SEC < off)
                return -EINVAL;
            rc = plan_push(p, cap, off, SEC, s);
        }
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int plan_run(const struct ring *r, const struct run *run, size_t from,
                    struct vhdx_log_plan *p, struct nbdf_err *err)
{
    uint64_t ndata = 0;
    for (size_t i = from; i < run->len; i++)
        ndata += run->ptr[i].nsec;      /* at least the data sectors */
    if (!(p->sectors = malloc((ndata + 1) * SEC)))
        return nbdf_errf(err, -ENOMEM, "log: out of memory for its sectors");
    uint8_t *next = p->sectors;
    size_t cap = 0;
    for (size_t i = from; i < run->len; i++) {
        int rc = plan_entry(r, &run->ptr[i], p, &cap, &next);
        if (rc == -EINVAL)
            return nbdf_errf(err, rc, "log entry %" PRIu64 " writes past "
                             "the end of the address space", run->ptr[i].seq);
        if (rc < 0)
            return nbdf_errf(err, rc, "log: out of memory for its writes");
    }
    const struct entry *head = &run->ptr[run->len - 1];
    p->entries = run->len - from;
    p->head_seq = head->seq;
    p->flushed_file_offset = head->flushed;
    p->last_file_offset = head->last;
    return 0;
}

int vhdx_log_plan(const void *log, size_t len, const uint8_t guid[16],
                  struct vhdx_log_plan *p, struct nbdf_err *err)
{
    memset(p, 0, sizeof *p);
    p->lo = UINT64_MAX;
    if (len == 0 || len % SEC)
        return nbdf_errf(err, -EINVAL, "log: %zu bytes, not whole 4 KiB "
                         "sectors", len);
    struct ring r = { .log = log, .nsec = len / SEC,
                      .crc_left = (uint64_t) len * CRC_BUDGET };
    bool *covered = calloc(r.nsec, 1);
    struct run run = { 0 }, best = { 0 };
    long best_from = -1;
    int rc = covered ? 0 : -ENOMEM;
    for (uint64_t i = 0; i < r.nsec && rc == 0; i++) {
        struct entry e;
        if (covered[i] || !entry_at(&r, i, guid, 0, &e))
            continue;
        if ((rc = run_from(&r, guid, &e, &run, covered)) < 0)
            break;
        long from = run_tail(&run);
        if (from < 0 ||
            (best.len &&
             run.ptr[run.len - 1].seq <= best.ptr[best.len - 1].seq))
            continue;
        struct run t = best;            /* keep run's buffer for reuse */
        best = run;
        run = t;
        best_from = from;
    }
    free(covered);
    run_reset(&run);
    if (rc < 0) {
        run_reset(&best);
        return nbdf_errf(err, rc, "log: out of memory searching it");
    }
    if (r.exhausted) {
        /* Not knowing the active sequence, replaying nothing could be
         * wrong: refuse. */
        run_reset(&best);
        return nbdf_errf(err, -EINVAL, "log: too many entry headers with "
                         "the log's GUID that do not check to search it");
    }
    if (best_from >= 0)
        rc = plan_run(&r, &best, (size_t) best_from, p, err);
    run_reset(&best);
    if (rc < 0)
        vhdx_log_plan_free(p);
    return rc;
}

void vhdx_log_plan_free(struct vhdx_log_plan *p)
{
    free(p->patches);
    free(p->sectors);
    memset(p, 0, sizeof *p);
}

static bool patch_overlaps(const struct vhdx_log_patch *pt, uint64_t off,
                           uint64_t len)
{
    return pt->file_off < off + len && off < pt->file_off + pt->len;
}

bool vhdx_log_overlaps(const struct vhdx_log_plan *p, uint64_t off,
                       uint64_t len)
{
    if (!p->npatches || len == 0 || off >= p->hi || off + len <= p->lo)
        return false;
    for (size_t i = 0; i < p->npatches; i++)
        if (patch_overlaps(&p->patches[i], off, len))
            return true;
    return false;
}

uint64_t vhdx_log_next(const struct vhdx_log_plan *p, uint64_t off,
                       bool data_only)
{
    uint64_t next = UINT64_MAX;
    if (off >= p->hi)
        return next;
    for (size_t i = 0; i < p->npatches; i++) {
        const struct vhdx_log_patch *pt = &p->patches[i];
        if ((data_only && !pt->data) || pt->file_off + pt->len <= off)
            continue;
        uint64_t at = pt->file_off > off ? pt->file_off : off;
        if (at < next)
            next = at;
    }
    return next;
}

void vhdx_log_apply(const struct vhdx_log_plan *p, uint64_t off, uint8_t *buf,
                    size_t len)
{
    if (!vhdx_log_overlaps(p, off, len))
        return;
    /* In replay order: a later write over the same bytes wins. */
    for (size_t i = 0; i < p->npatches; i++) {
        const struct vhdx_log_patch *pt = &p->patches[i];
        if (!patch_overlaps(pt, off, len))
            continue;
        uint64_t a = pt->file_off > off ? pt->file_off : off;
        uint64_t b = pt->file_off + pt->len < off + len ? pt->file_off + pt->len
                                                        : off + len;
        if (pt->data)
            memcpy(buf + (a - off), pt->data + (a - pt->file_off), b - a);
        else
            memset(buf + (a - off), 0, b - a);
    }
}
