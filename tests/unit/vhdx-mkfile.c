/* tests/unit/vhdx-mkfile.c: write a VHDX built by vhdx-build.h, for the
 * integration tests (tests/test_vhdx_view.py): the files qemu-img cannot
 * write (differencing with sector bitmaps, the metadata and BAT after the
 * blocks, a log to replay).
 *
 *   vhdx-mkfile OUT.vhdx WANT.raw BASE.raw|- SIZE BLOCK LSEC FLAGS SEED
 *
 * FLAGS: letters d (differencing over BASE.raw), r (regions last),
 * l (a log to replay: without it the BAT's first sector is wrong),
 * b (that log also writes into the header section, behind itself),
 * c (that log says the file was 1 MiB longer: it was cut),
 * m (mixed block states: full, partial, zero, not present, unmapped in
 * turn).  The payload is random from SEED; WANT.raw
 * receives the disk the file describes (over BASE.raw when differencing).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vhdx-build.h"

static uint8_t *load(const char *path, size_t size)
{
    uint8_t *b = calloc(1, size);
    FILE *f = fopen(path, "rb");

    if (!b || !f || fread(b, 1, size, f) != size) {
        fprintf(stderr, "vhdx-mkfile: cannot read %zu bytes of %s\n", size,
                path);
        exit(2);
    }
    fclose(f);
    return b;
}

static void save(const char *path, const uint8_t *b, size_t n)
{
    FILE *f = fopen(path, "wb");

    if (!f || fwrite(b, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "vhdx-mkfile: cannot write %s\n", path);
        exit(2);
    }
}

int main(int argc, char **argv)
{
    if (argc != 9) {
        fprintf(stderr, "usage: vhdx-mkfile OUT WANT BASE|- SIZE BLOCK LSEC "
                "FLAGS SEED\n");
        return 2;
    }
    struct spec sp = { .disk_size = strtoull(argv[4], NULL, 0),
                       .block_size = (uint32_t) strtoul(argv[5], NULL, 0),
                       .lsec = (uint32_t) strtoul(argv[6], NULL, 0),
                       .diff = strchr(argv[7], 'd') != NULL,
                       .regions_last = strchr(argv[7], 'r') != NULL,
                       .log_pending = strchr(argv[7], 'l') != NULL,
                       .log_flags = (strchr(argv[7], 'b') ? LOG_BEHIND : 0) |
                                    (strchr(argv[7], 'c') ? LOG_CUT : 0) };
    size_t size = (size_t) sp.disk_size, len;
    uint8_t *content = malloc(size), *want = malloc(size);
    uint8_t *base = sp.diff ? load(argv[3], size) : NULL;
    static const uint8_t cycle[] = { VHDX_PB_FULLY_PRESENT,
                                     VHDX_PB_PARTIALLY_PRESENT, VHDX_PB_ZERO,
                                     VHDX_PB_NOT_PRESENT, VHDX_PB_UNMAPPED };
    uint64_t nblk = (sp.disk_size + sp.block_size - 1) / sp.block_size;
    uint8_t *states = malloc(nblk ? nblk : 1);

    srand((unsigned) strtoul(argv[8], NULL, 0));
    for (size_t i = 0; i < size; i++)
        content[i] = (uint8_t) rand();
    for (uint64_t b = 0; b < nblk; b++) {
        /* Partially present blocks exist only in differencing files. */
        uint8_t st = cycle[b % 5];
        states[b] = !sp.diff && st == VHDX_PB_PARTIALLY_PRESENT
                    ? VHDX_PB_FULLY_PRESENT : st;
    }
    if (strchr(argv[7], 'm'))
        sp.states = states;
    uint8_t *f = build(&sp, content, base, want, &len);
    save(argv[1], f, len);
    save(argv[2], want, size);
    return 0;
}
