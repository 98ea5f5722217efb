/* vhd/bat.c: BAT and extent checks shared by the image parser and the
 * stream decoder.  Everything is sorted once (O(n log n)); an O(n^2) scan
 * over a million entries would be a denial of service. */
#include <stdio.h>
#include <stdlib.h>

#include "vhd/vhd-internal.h"

static int extent_cmp(const void *a, const void *b)
{
    const struct vhd_extent *x = a, *y = b;
    if (x->off != y->off)
        return x->off < y->off ? -1 : 1;
    return x->block < y->block ? -1 : x->block > y->block;
}

static int bat_collect(const struct vhd_layout *l, const uint32_t *bat,
                       struct vhd_extent **out, uint32_t *n)
{
    uint32_t used = 0;
    for (uint32_t i = 0; i < l->nblocks; i++)
        used += bat[i] != VHD_BAT_UNUSED;
    struct vhd_extent *e = calloc(used ? used : 1, sizeof *e);
    if (!e)
        return -ENOMEM;
    uint32_t k = 0;
    for (uint32_t i = 0; i < l->nblocks; i++)
        if (bat[i] != VHD_BAT_UNUSED)
            e[k++] = (struct vhd_extent) {
                .off = (uint64_t) bat[i] * VHD_SECTOR,
                .len = (uint64_t) l->bitmap_bytes + l->block_size,
                .block = i,
            };
    qsort(e, used, sizeof *e, extent_cmp);
    *out = e;
    *n = used;
    return 0;
}

static int bat_check_sorted(const struct vhd_layout *l,
                            const struct vhd_extent *e, uint32_t n,
                            struct vhd_err *err)
{
    if (n && e[0].off < l->meta_end)
        return vhd_errf(err, -EINVAL,
                        "BAT entry %u (block at file offset %llu) clobbers "
                        "the metadata (footer copy, header, BAT) ending at %llu",
                        e[0].block, (unsigned long long) e[0].off,
                        (unsigned long long) l->meta_end);
    for (uint32_t k = 1; k < n; k++)
        if (e[k - 1].off + e[k - 1].len > e[k].off)
            return vhd_errf(err, -EINVAL,
                            "BAT entries %u and %u overlap (blocks at file "
                            "offsets %llu and %llu, each %llu bytes)",
                            e[k - 1].block, e[k].block,
                            (unsigned long long) e[k - 1].off,
                            (unsigned long long) e[k].off,
                            (unsigned long long) e[k].len);
    return 0;
}

int vhd_bat_sort_check(const struct vhd_layout *l, const uint32_t *bat,
                       struct vhd_extent **sorted, uint32_t *nused,
                       struct vhd_err *err)
{
    struct vhd_extent *e;
    uint32_t n;
    int r = bat_collect(l, bat, &e, &n);
    if (r < 0)
        return vhd_errf(err, r, "out of memory sorting the BAT");
    if ((r = bat_check_sorted(l, e, n, err)) < 0) {
        free(e);
        return r;
    }
    *sorted = e;
    *nused = n;
    return 0;
}

size_t vhd_locator_extents(const struct vhd_header *h, struct vhd_extent *out)
{
    static const char *names[8] = {
        "parent locator 0", "parent locator 1", "parent locator 2",
        "parent locator 3", "parent locator 4", "parent locator 5",
        "parent locator 6", "parent locator 7",
    };
    size_t n = 0;
    for (int i = 0; i < 8; i++)
        if (h->loc[i].code != VHD_PLAT_NONE)
            out[n++] = (struct vhd_extent) {
                .off = h->loc[i].data_offset, .len = h->loc[i].space_bytes,
                .block = UINT32_MAX, .what = names[i],
            };
    return n;
}

static const char *extent_name(const struct vhd_extent *e, char *buf,
                               size_t len)
{
    if (e->what)
        return e->what;
    snprintf(buf, len, "block %u", e->block);
    return buf;
}

int vhd_extents_check(const struct vhd_extent *meta, size_t nmeta,
                      const struct vhd_extent *blocks, uint32_t nblocks,
                      uint32_t bitmap_bytes, struct vhd_err *err)
{
    size_t n = nmeta + nblocks;
    struct vhd_extent *all = malloc((n ? n : 1) * sizeof *all);
    if (!all)
        return vhd_errf(err, -ENOMEM, "out of memory checking extents");
    memcpy(all, meta, nmeta * sizeof *all);
    memcpy(all + nmeta, blocks, (size_t) nblocks * sizeof *all);
    qsort(all, n, sizeof *all, extent_cmp);
    int r = 0;
    for (size_t k = 1; k < n && r == 0; k++)
        if (all[k - 1].off + all[k - 1].len > all[k].off && all[k].len &&
            all[k - 1].len) {
            char a[32], b[32];
            r = vhd_errf(err, -EINVAL, "%s [%llu, +%llu) overlaps %s at %llu",
                         extent_name(&all[k - 1], a, sizeof a),
                         (unsigned long long) all[k - 1].off,
                         (unsigned long long) all[k - 1].len,
                         extent_name(&all[k], b, sizeof b),
                         (unsigned long long) all[k].off);
        }
    free(all);
    return r;
}
