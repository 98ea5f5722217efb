/* tests/unit/test-vmdk-synth.c: the synthesizer (a streamOptimized VMDK
 * of a raw disk): its limits, the allocation's rules, the file's size and
 * bytes read in any pieces, read back as the disk by our stream decoder
 * (every cutting), our random-access parser, qemu-img (convert, check) and
 * vmdkinfo.  A missing tool is a failure, not a skip. */
#undef NDEBUG
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/iszero.h"
#include "vmdk/vmdk.h"
#include "test-util.h"
#include "vmdk-util.h"

/* ---- synthesizer ------------------------------------------------------------ */

static const uint8_t *synth_disk;
static int read_disk(void *o, uint64_t off, void *buf, size_t len)
{
    uint64_t size = *(uint64_t *) o;
    CHECK(off + len <= size);
    memcpy(buf, synth_disk + off, len);
    return 0;
}

static void test_synth(const uint8_t *raw)
{
    uint64_t size = RAW_SIZE;
    struct vmdk_synth *sy;
    struct nbdf_err e;
    CHECK(vmdk_synth_new(0, 1, "x", &sy, &e) == -EINVAL);
    CHECK(vmdk_synth_new(1ull << 50, 1, "x", &sy, &e) == -EFBIG);
    CHECK(vmdk_synth_new(size, 0x12345678, "nbd.vmdk", &sy, &e) == 0);
    /* Allocate where the raw disk has data, as the view does from the
     * zero maps (whole grains here, with one partial range). */
    for (uint64_t g = 0; g * 65536 < size; g++) {
        uint64_t end = (g + 1) * 65536 < size ? (g + 1) * 65536 : size;
        if (!is_zero(raw + g * 65536, end - g * 65536))
            CHECK(vmdk_synth_allocate(sy, g * 65536 + 100, 10) == 0);
    }
    CHECK(vmdk_synth_allocate(sy, size - 1, 1) == 0);   /* same grain: no-op */
    CHECK(vmdk_synth_allocate(sy, 0, 1) == -EINVAL);    /* must increase */
    CHECK(vmdk_synth_allocate(sy, size, 1) == -EINVAL);
    CHECK(vmdk_synth_seal(sy) == 0);
    CHECK(vmdk_synth_allocate(sy, 0, 1) == -EINVAL);
    uint64_t fsize = vmdk_synth_file_size(sy);
    uint64_t ng = vmdk_synth_grains_allocated(sy);
    CHECK(fsize == (128 + ng * 129 + 5 + 2 + 3) * 512ull);
    uint8_t *file = malloc(fsize);
    synth_disk = raw;
    uint64_t x = 9;
    for (uint64_t off = 0; off < fsize; ) {
        size_t n = 1 + rnd(&x) % 200000;
        int64_t r = vmdk_synth_read(sy, off, file + off, n, read_disk, &size);
        CHECK(r > 0 && (uint64_t) r == (n < fsize - off ? n : fsize - off));
        off += (uint64_t) r;
    }
    CHECK(vmdk_synth_read(sy, fsize, file, 10, read_disk, &size) == 0);
    /* Random re-reads agree with the sequential read. */
    uint8_t piece[3000];
    for (int i = 0; i < 200; i++) {
        uint64_t off = rnd(&x) % fsize;
        int64_t r = vmdk_synth_read(sy, off, piece, sizeof piece, read_disk,
                                    &size);
        CHECK(r > 0 && memcmp(piece, file + off, (size_t) r) == 0);
    }
    vmdk_synth_free(sy);
    /* Our decoder, qemu-img and vmdkinfo read it back as the disk. */
    decode_ok("synthesized", file, fsize, raw, RAW_SIZE, VMDK_STREAM_OPTIMIZED);
    image_ok("synthesized", file, fsize, raw, RAW_SIZE);
    save("synth.vmdk", file, fsize);
    sh("cd %s && qemu-img convert -q -f vmdk -O raw synth.vmdk synth.raw && "
       "truncate -s %u synth.raw && cmp synth.raw src.raw && "
       "qemu-img check -q -f vmdk synth.vmdk && "
       "vmdkinfo synth.vmdk | grep -q 'Stream optimized'", dir, RAW_SIZE);
    free(file);
    printf("  synthesized: %" PRIu64 " bytes, %" PRIu64 " grains; qemu-img "
           "and vmdkinfo agree\n", fsize, ng);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    snprintf(dir, sizeof dir, "/tmp/vmdk-test-XXXXXX");
    CHECK(mkdtemp(dir));
    uint8_t *raw = make_raw();
    test_synth(raw);
    sh("rm -rf %s", dir);
    free(raw);
    printf("test-vmdk-synth: ok\n");
    return 0;
}
