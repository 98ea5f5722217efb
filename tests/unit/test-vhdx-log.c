/* tests/unit/test-vhdx-log.c: a VHDX log shaped as Hyper-V leaves it,
 * with several data sectors per entry, replayed right.
 *
 * Hyper-V logs every metadata change of one operation in one entry: the
 * BAT sectors it changed, the metadata sector (a resize), the zeroing of
 * a newly allocated block, each a descriptor; one 'data' sector follows
 * per 'desc' descriptor, in descriptor order.  The log built here follows
 * the specification (VHDX 2.5, "Log"): an entry header ("loge", CRC-32C of
 * the whole entry, its length, the tail, sequence number, descriptor
 * count, the log GUID, flushed and last file offsets), descriptors 'desc'
 * (the sector's first 8 and last 4 bytes in the descriptor) and 'zero',
 * data sectors 'data' carrying the middle 4084 bytes with the sequence
 * number split around them; two entries in sequence, the second with 66
 * descriptors, or 130 (they spill into a second descriptor sector).
 *
 * The plan must give each data descriptor its own sector (a decoder that
 * replays one entry's first data sector for all of them puts the BAT over
 * the metadata and the payload: the mutant vhdx-log-one-data-sector);
 * the stream decoder must turn the file into the disk it describes after
 * replay, in several cuttings; and qemu-img, replaying the same log,
 * must agree (the log is built right).  A missing qemu-img fails. */
#undef NDEBUG
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vhdx/vhdx.h"
#include "test-util.h"
#include "vhdx-build.h"

#define SEC 4096u

/* ---- a disk in memory as the stream's sink ------------------------------- */

struct disk {
    uint8_t *bytes;
    uint64_t size;
    struct { uint64_t off, len; uint8_t *data; } spool[64];
    size_t nspool;
};

static int d_begin(void *o, const struct nbdf_begin *b)
{
    const struct vhdx_info *info = b->info;
    CHECK(b->size == info->meta.disk_size &&
          b->overlay == info->meta.has_parent);
    struct disk *d = o;
    CHECK(info->meta.disk_size == d->size);
    memset(d->bytes, 0, d->size);
    return 0;
}

static int d_data(void *o, uint64_t off, const void *buf, size_t len)
{
    struct disk *d = o;
    CHECK(off + len <= d->size);
    memcpy(d->bytes + off, buf, len);
    return 0;
}

static int d_zero(void *o, uint64_t off, uint64_t len)
{
    struct disk *d = o;
    CHECK(off + len <= d->size);
    memset(d->bytes + off, 0, len);
    return 0;
}

static int d_put(void *o, uint64_t off, const void *buf, size_t len)
{
    struct disk *d = o;
    CHECK(d->nspool < 64);
    uint8_t *c = malloc(len);
    CHECK(c);
    memcpy(c, buf, len);
    d->spool[d->nspool].off = off;
    d->spool[d->nspool].len = len;
    d->spool[d->nspool++].data = c;
    return 0;
}

static int d_get(void *o, uint64_t off, void *buf, size_t len)
{
    struct disk *d = o;
    for (size_t i = d->nspool; i-- > 0;)
        if (d->spool[i].off <= off && off + len <= d->spool[i].off + d->spool[i].len) {
            memcpy(buf, d->spool[i].data + (off - d->spool[i].off), len);
            return 0;
        }
    CHECK(!"spool_get of bytes never put");
    return -EIO;
}

static const struct nbdf_sink sink = { .begin = d_begin, .data = d_data,
                                       .zero = d_zero, .spool_put = d_put,
                                       .spool_get = d_get };

/* Decode file[0, len) fed in pieces of 'cut' bytes; the disk must be want. */
static void decode_as(const uint8_t *f, size_t len, uint64_t cut,
                      const uint8_t *want, uint64_t size)
{
    struct disk d = { .bytes = malloc(size), .size = size };
    CHECK(d.bytes);
    memset(d.bytes, 0xEE, size);
    struct vhdx_stream *s;
    struct vhdx_stream_config cfg = { 256 * MiB, "--spool-max" };
    CHECK(vhdx_stream_new(&sink, &d, &cfg, &s) == 0);
    int r = 0;
    for (uint64_t off = 0; off < len && r == 0; off += cut)
        r = vhdx_stream_feed(s, off, f + off, len - off < cut ? len - off : cut);
    if (r == 0)
        r = vhdx_stream_finish(s);
    if (r != 0 || memcmp(d.bytes, want, size) != 0) {
        fprintf(stderr, "cut %" PRIu64 ": r=%d (%s), disk %s\n", cut, r,
                vhdx_stream_error(s), r ? "-" : "differs");
        abort();
    }
    vhdx_stream_free(s);
    for (size_t i = 0; i < d.nspool; i++)
        free(d.spool[i].data);
    free(d.bytes);
}

/* ---- the file ----------------------------------------------------------- */

static void fill(uint8_t *p, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = rnd(&seed);
        memcpy(p + i, &v, n - i < 8 ? n - i : 8);
    }
}

/* The file described above, entry 8 with nzero zero descriptors; by_qemu:
 * qemu-img replays it too and must agree. */
static void hyperv_case(unsigned nzero, bool by_qemu)
{
    /* An 8 MiB dynamic disk, every block present, as Hyper-V left it
     * mid-operation: it had resized the disk from 4 MiB, allocated blocks
     * 2 and 5, zeroed the start of block 3 and written payload sectors,
     * logging it all, and crashed before the BAT and metadata reached
     * their places. */
    const uint64_t size = 8 * MiB, bs = MiB;
    struct spec sp = { .disk_size = size, .block_size = (uint32_t) bs, .lsec = 512 };
    uint8_t *content = malloc(size), *want = malloc(size);
    CHECK(content && want);
    fill(content, size, 11);
    size_t flen;
    uint8_t *f = build(&sp, content, NULL, want, &flen);
    CHECK(memcmp(want, content, size) == 0);
    const uint64_t bat_off = 4 * MiB, size_sec = 3 * MiB + 65536 + 4096;
    struct vhdx_meta m = { .block_size = (uint32_t) bs, .disk_size = size,
                           .logical_sector = 512 };
    struct vhdx_geom g;
    vhdx_geom(&m, &g);

    uint8_t bat0[SEC], meta[SEC], s1[SEC], s2[SEC], s3[SEC];
    memcpy(bat0, f + bat_off, SEC);             /* the BAT as it should be */
    memcpy(meta, f + size_sec, SEC);            /* 8 MiB */
    fill(s1, SEC, 21);
    fill(s2, SEC, 22);
    fill(s3, SEC, 23);
    uint64_t blk_file[8];
    for (uint64_t b = 0; b < 8; b++) {
        uint64_t e = 0;
        for (int k = 7; k >= 0; k--)
            e = e << 8 | bat0[8 * vhdx_bat_index(&g, b) + (unsigned) k];
        CHECK((e & 7) == VHDX_PB_FULLY_PRESENT);
        blk_file[b] = e >> 20 << 20;
    }
    /* In place, the old state: blocks 2 and 5 not present, 4 MiB. */
    memset(f + bat_off + 8 * vhdx_bat_index(&g, 2), 0, 8);
    memset(f + bat_off + 8 * vhdx_bat_index(&g, 5), 0, 8);
    put64(f + size_sec, 4 * MiB);
    for (int h = 0; h < 2; h++) {               /* the log is active */
        uint8_t *hd = f + (h ? 128 : 64) * 1024;
        memcpy(hd + 48, G_LOG, 16);
        fix_crc(hd, 4096);
    }

    /* Entry 7: BAT sector, a zeroed run, the metadata sector, a payload
     * sector (three data sectors).  Entry 8 (tail: entry 7, so both
     * replay): two payload sectors, then 128 zero descriptors, every
     * other 4 KiB of block 7. */
    struct ldesc a[4] = {
        { bat_off, bat0, 0 },
        { blk_file[3], NULL, 65536 },
        { size_sec, meta, 0 },
        { blk_file[5] + 8192, s1, 0 },
    };
    CHECK(nzero <= 128);
    struct ldesc b[130] = {
        { blk_file[6] + 3 * SEC, s2, 0 },
        { blk_file[2] + 7 * SEC, s3, 0 },
    };
    for (unsigned i = 0; i < nzero; i++)
        b[2 + i] = (struct ldesc){ blk_file[7] + 2 * SEC * i, NULL, SEC };
    uint32_t na = log_entry(f, 0, G_LOG, 7, 0, a, 4, flen, flen);
    CHECK(na == 4 * SEC);                       /* 1 descriptor + 3 data */
    uint32_t nb = log_entry(f, na, G_LOG, 8, 0, b, 2 + nzero, flen, flen);
    CHECK(nb == (nzero > 124 ? 4 : 3) * SEC);   /* descriptor + 2 data */

    memset(want + 3 * bs, 0, 65536);
    memcpy(want + 5 * bs + 8192, s1, SEC);
    memcpy(want + 6 * bs + 3 * SEC, s2, SEC);
    memcpy(want + 2 * bs + 7 * SEC, s3, SEC);
    for (unsigned i = 0; i < nzero; i++)
        memset(want + 7 * bs + 2 * SEC * i, 0, SEC);

    /* The plan: every write in order, each data descriptor its own sector. */
    struct vhdx_log_plan p;
    struct nbdf_err e;
    CHECK(vhdx_log_plan(f + LOG_OFF, MiB, G_LOG, &p, &e) == 0);
    CHECK(p.entries == 2 && p.head_seq == 8 && p.npatches == 4 + 2 + nzero);
    const struct ldesc *all[134];
    for (unsigned i = 0; i < 4; i++)
        all[i] = &a[i];
    for (unsigned i = 0; i < 2 + nzero; i++)
        all[4 + i] = &b[i];
    for (unsigned i = 0; i < 6 + nzero; i++) {
        const struct vhdx_log_patch *pt = &p.patches[i];
        CHECK(pt->file_off == all[i]->file_off);
        if (all[i]->sector) {
            CHECK(pt->len == SEC && pt->data);
            if (memcmp(pt->data, all[i]->sector, SEC) != 0) {
                fprintf(stderr, "patch %u (file offset %" PRIu64 "): the "
                        "wrong data sector\n", i, pt->file_off);
                abort();
            }
        } else {
            CHECK(pt->data == NULL && pt->len == all[i]->zero_len);
        }
    }
    vhdx_log_plan_free(&p);
    printf("ok plan (%u zero descriptors): 2 entries, %u writes, each data "
           "descriptor its own sector\n", nzero, 6 + nzero);

    static const uint64_t cuts[] = { 1ull << 30, SEC, 65536 + 512, MiB };
    for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++)
        decode_as(f, flen, cuts[c], want, size);
    printf("ok stream (%u zero descriptors): the replayed disk in every "
           "cutting\n", nzero);

    if (!by_qemu) {
        free(f); free(want); free(content);
        return;
    }
    save("hv.vhdx", f, flen);
    sh("qemu-img check -q -r all %s/hv.vhdx >/dev/null", dir);
    sh("qemu-img convert -q -f vhdx -O raw %s/hv.vhdx %s/hv.raw", dir, dir);
    size_t rlen;
    uint8_t *back = load("hv.raw", &rlen);
    CHECK(rlen == size && memcmp(back, want, size) == 0);
    printf("ok qemu-img replays the same log to the same disk\n");
    free(back); free(f); free(want); free(content);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    snprintf(dir, sizeof dir, "/tmp/vhdx-log-test.XXXXXX");
    CHECK(mkdtemp(dir));
    if (system("qemu-img --version >/dev/null") != 0) {
        fprintf(stderr, "qemu-img is needed (qemu-utils)\n");
        return 1;
    }
    hyperv_case(64, true);
    /* 130 descriptors spill into a second descriptor sector.  qemu-img
     * cannot check this one: its log reader reads every descriptor sector
     * into the same buffer, so it refuses entries of more than 126
     * descriptors that Hyper-V may write. */
    hyperv_case(128, false);
    sh("rm -rf %s", dir);
    return 0;
}
