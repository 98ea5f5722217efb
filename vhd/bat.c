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
                            struct nbdf_err *err)
{
    if (n && e[0].off < l->meta_end)
        return nbdf_errf(err, -EINVAL,
                         "BAT entry %u (block at file offset %llu) clobbers "
                         "the metadata (footer copy, header, BAT) ending at %llu",
                         e[0].block, (unsigned long long) e[0].off,
                         (unsigned long long) l->meta_end);
    for (uint32_t k = 1; k < n; k++)
        if (e[k - 1].off + e[k - 1].len > e[k].off)
            return nbdf_errf(err, -EINVAL,
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
                       struct nbdf_err *err)
{
    struct vhd_extent *e;
    uint32_t n;
    int r = bat_collect(l, bat, &e, &n);
    if (r < 0)
        return nbdf_errf(err, r, "out of memory sorting the BAT");
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
                      uint32_t bitmap_bytes, struct nbdf_err *err)
{
    size_t n = nmeta + nblocks;
    struct vhd_extent *all = malloc((n ? n : 1) * sizeof *all);
    if (!all)
        return nbdf_errf(err, -ENOMEM, "out of memory checking extents");
    memcpy(all, meta, nmeta * sizeof *all);
    if (nblocks)
        memcpy(all + nmeta, blocks, (size_t) nblocks * sizeof *all);
    qsort(all, n, sizeof *all, extent_cmp);
    int r = 0;
    for (size_t k = 1; k < n && r == 0; k++)
        if (all[k - 1].off + all[k - 1].len > all[k].off && all[k].len &&
            all[k - 1].len) {
            char a[32], b[32];
            r = nbdf_errf(err, -EINVAL, "%s [%llu, +%llu) overlaps %s at %llu",
                          extent_name(&all[k - 1], a, sizeof a),
                          (unsigned long long) all[k - 1].off,
                          (unsigned long long) all[k - 1].len,
                          extent_name(&all[k], b, sizeof b),
                          (unsigned long long) all[k].off);
        }
    free(all);
    return r;
}

/* ---- the compact form: 4 bytes per used entry ---------------------------- */

static int by_bat_offset(const void *a, const void *b, void *bat)
{
    uint32_t x = ((const uint32_t *) bat)[*(const uint32_t *) a];
    uint32_t y = ((const uint32_t *) bat)[*(const uint32_t *) b];
    if (x != y)
        return x < y ? -1 : 1;
    return *(const uint32_t *) a < *(const uint32_t *) b ? -1 : 1;
}

static uint64_t order_off(const uint32_t *bat, const uint32_t *order,
                          uint32_t k)
{
    return (uint64_t) bat[order[k]] * VHD_SECTOR;
}

/* The first used block (in file order) that ends after off. */
static uint32_t first_ending_after(const uint32_t *bat, const uint32_t *order,
                                   uint32_t n, uint64_t blen, uint64_t off)
{
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (order_off(bat, order, mid) + blen <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int order_check_meta(const struct vhd_layout *l, const uint32_t *bat,
                            const uint32_t *order, uint32_t n,
                            const struct vhd_extent *meta, size_t nmeta,
                            struct nbdf_err *err)
{
    uint64_t blen = (uint64_t) l->bitmap_bytes + l->block_size;
    int r = vhd_extents_check(meta, nmeta, NULL, 0, l->bitmap_bytes, err);
    for (size_t i = 0; i < nmeta && r == 0; i++) {
        uint32_t k = first_ending_after(bat, order, n, blen, meta[i].off);
        if (k < n && meta[i].len &&
            order_off(bat, order, k) < meta[i].off + meta[i].len)
            r = nbdf_errf(err, -EINVAL, "block %u [%llu, +%llu) overlaps %s "
                          "at %llu", order[k],
                          (unsigned long long) order_off(bat, order, k),
                          (unsigned long long) blen, meta[i].what,
                          (unsigned long long) meta[i].off);
    }
    return r;
}

static int order_check_blocks(const struct vhd_layout *l, const uint32_t *bat,
                              const uint32_t *order, uint32_t n,
                              struct nbdf_err *err)
{
    uint64_t blen = (uint64_t) l->bitmap_bytes + l->block_size;
    if (n && order_off(bat, order, 0) < l->meta_end)
        return nbdf_errf(err, -EINVAL,
                         "BAT entry %u (block at file offset %llu) clobbers "
                         "the metadata (footer copy, header, BAT) ending at %llu",
                         order[0],
                         (unsigned long long) order_off(bat, order, 0),
                         (unsigned long long) l->meta_end);
    for (uint32_t k = 1; k < n; k++)
        if (order_off(bat, order, k - 1) + blen > order_off(bat, order, k))
            return nbdf_errf(err, -EINVAL,
                             "BAT entries %u and %u overlap (blocks at file "
                             "offsets %llu and %llu, each %llu bytes)",
                             order[k - 1], order[k],
                             (unsigned long long) order_off(bat, order, k - 1),
                             (unsigned long long) order_off(bat, order, k),
                             (unsigned long long) blen);
    return 0;
}

int vhd_bat_order(const struct vhd_layout *l, const uint32_t *bat,
                  const struct vhd_extent *meta, size_t nmeta,
                  uint32_t **order, uint32_t *nused, struct nbdf_err *err)
{
    uint32_t n = 0, k = 0;
    for (uint32_t i = 0; i < l->nblocks; i++)
        n += bat[i] != VHD_BAT_UNUSED;
    uint32_t *o = malloc(((size_t) n + 1) * sizeof *o);
    if (!o)
        return nbdf_errf(err, -ENOMEM, "out of memory for %u blocks", n);
    for (uint32_t i = 0; i < l->nblocks; i++)
        if (bat[i] != VHD_BAT_UNUSED)
            o[k++] = i;
    qsort_r(o, n, sizeof *o, by_bat_offset, (void *) bat);
    int r = order_check_blocks(l, bat, o, n, err);
    if (r == 0)
        r = order_check_meta(l, bat, o, n, meta, nmeta, err);
    if (r < 0) {
        free(o);
        return r;
    }
    *order = o;
    *nused = n;
    return 0;
}
