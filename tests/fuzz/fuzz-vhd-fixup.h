/* tests/fuzz/fuzz-vhd-fixup.h: make mutated inputs get past checksums.
 *
 * Random mutations almost never keep a footer or header checksum valid, so
 * without help the fuzzer stays in the first validation step.  This
 * recomputes the checksums the way a (buggy or hostile) writer would,
 * so the deeper rules (BAT, bitmaps, overlaps, locators) get exercised.
 */
#ifndef NBDFERRY_FUZZ_VHD_FIXUP_H
#define NBDFERRY_FUZZ_VHD_FIXUP_H

#include <stdint.h>
#include <string.h>

static inline uint32_t fixup_sum(const uint8_t *b, size_t n, size_t at)
{
    uint32_t s = 0;
    for (size_t i = 0; i < n; i++)
        if (i < at || i >= at + 4)
            s += b[i];
    return ~s;
}

static inline void fixup_put32(uint8_t *p, uint32_t v)
{
    p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
}

/* Fix the checksum of a footer at f[0..512) if it has the cookie. */
static inline void fixup_footer(uint8_t *f)
{
    if (memcmp(f, "conectix", 8) == 0)
        fixup_put32(f + 64, fixup_sum(f, 512, 64));
}

/* Dynamic: fix the copy at 0, its header, and make the trailing footer
 * identical.  Fixed: fix the trailing footer. */
static inline void fixup_vhd(uint8_t *d, size_t len)
{
    if (len < 1024)
        return;
    if (memcmp(d, "conectix", 8) != 0) {
        fixup_footer(d + len - 512);
        return;
    }
    fixup_footer(d);
    memcpy(d + len - 512, d, 512);
    uint64_t hoff = 0;
    for (int i = 16; i < 24; i++)
        hoff = hoff << 8 | d[i];
    if (hoff <= len && len - hoff >= 1024 &&
        memcmp(d + hoff, "cxsparse", 8) == 0)
        fixup_put32(d + hoff + 36, fixup_sum(d + hoff, 1024, 36));
}

#endif
