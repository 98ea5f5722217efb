/* tests/fuzz/fuzz-vmdk-parse.c: libFuzzer target for the VMDK header and
 * descriptor parsers and the synthesizer.
 *
 * Input: a VMDK file (sector 0 a header, the rest a descriptor).  Oracles:
 *   - a header that decodes re-encodes to a header that decodes the same;
 *   - every refusal has a message;
 *   - the random-access parser asks only for bytes inside the file and
 *     places grains inside it;
 *   - the synthesizer, driven by the input (disk size up to 2 MiB, ranges
 *     from the input's bytes), produces a file the stream decoder accepts
 *     and that decodes to the disk (allocated ranges, zeros elsewhere).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vmdk/vmdk.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void warn(void *o, const char *msg)
{
    (void) o;
    if (!msg[0])
        abort();
}

static void parse(const uint8_t *data, size_t size)
{
    struct vmdk_header h, h2;
    struct vmdk_desc d;
    struct nbdf_err e = { "" };
    uint8_t sec[512];

    if (size < 512)
        return;
    int r = vmdk_header_decode(data, &h, &e);
    if (r < 0) {
        if (!e.msg[0])
            abort();
        return;
    }
    vmdk_header_encode(&h, sec);
    if (vmdk_header_decode(sec, &h2, &e) != 0 || memcmp(&h, &h2, sizeof h))
        abort();
    vmdk_lint(&h, warn, NULL);
    e.msg[0] = '\0';
    if (vmdk_desc_parse((const char *) data + 512, size - 512, &h, &d, &e) < 0
        && !e.msg[0])
        abort();
}

/* ---- random-access parser: requests and places stay inside the file ------ */

static void image(const uint8_t *data, size_t size)
{
    struct vmdk_image *img;
    struct nbdf_err e = { "" };
    uint64_t off;
    size_t n;
    int r;

    if (size < 512)
        return;
    if (vmdk_image_new(data, size, &img, &e) < 0) {
        if (!e.msg[0])
            abort();
        return;
    }
    while ((r = vmdk_image_next(img, &off, &n)) > 0) {
        if (off > size || n > size - off)
            abort();                    /* asked for bytes past the end */
        if ((r = vmdk_image_supply(img, data + off, &e)) < 0)
            break;
    }
    if (r < 0 && !e.msg[0])
        abort();
    if (r == 0) {
        const struct vmdk_header *h = vmdk_image_header(img);
        uint64_t cap = h->capacity * 512, step = cap / 64 + 1;
        for (uint64_t d = 0; d < cap; d += step) {
            struct vmdk_place p;
            if (vmdk_image_lookup(img, d, &p) < 0 || p.len == 0 ||
                p.len > cap - d)
                abort();
            if ((p.src == VMDK_SRC_FILE && (p.file_off > size ||
                                            p.len > size - p.file_off)) ||
                (p.src == VMDK_SRC_MARKER && p.file_off + 12 > size))
                abort();
        }
    }
    vmdk_image_free(img);
}

/* ---- synthesizer round trip ---------------------------------------------- */

#define SYNTH_MAX (2u << 20)
static uint8_t *disk, *out, *file;

static int rd(void *o, uint64_t off, void *buf, size_t len)
{
    uint64_t size = *(uint64_t *) o;
    if (off + len > size)
        abort();
    memcpy(buf, disk + off, len);
    return 0;
}

static int o_begin(void *o, const struct nbdf_begin *b)
{
    (void) o, (void) b;
    memset(out, 0, SYNTH_MAX + 512);
    return 0;
}

static int o_data(void *o, uint64_t off, const void *buf, size_t len)
{
    (void) o;
    if (off + len > SYNTH_MAX + 512)
        abort();
    memcpy(out + off, buf, len);
    return 0;
}

static void synth(const uint8_t *data, size_t size)
{
    if (size < 8)
        return;
    uint64_t dsize = 1 + ((uint64_t) data[0] << 16 | data[1] << 8 | data[2])
                             % SYNTH_MAX;
    struct vmdk_synth *s;
    struct nbdf_err e;
    if (vmdk_synth_new(dsize, 0x1234, "f.vmdk", &s, &e) < 0)
        abort();
    memset(disk, 0, SYNTH_MAX);
    uint64_t pos = 0;
    for (size_t i = 3; i + 2 < size && pos < dsize; i += 3) {
        pos += (uint64_t) data[i] * 4096 + data[i + 1];        /* a gap */
        uint64_t len = 1 + (uint64_t) data[i + 2] * 997;
        if (pos >= dsize)
            break;
        if (len > dsize - pos)
            len = dsize - pos;
        if (vmdk_synth_allocate(s, pos, len) < 0)
            abort();
        for (uint64_t j = 0; j < len; j++)
            disk[pos + j] = (uint8_t) (j * 31 + i) | 1;
        pos += len;
    }
    if (vmdk_synth_seal(s) < 0)
        abort();
    uint64_t fsize = vmdk_synth_file_size(s);
    if (fsize > 4 * SYNTH_MAX)
        abort();
    if (vmdk_synth_read(s, 0, file, fsize, rd, &dsize) != (int64_t) fsize)
        abort();
    vmdk_synth_free(s);

    static const struct nbdf_sink sk = { .begin = o_begin, .data = o_data };
    struct vmdk_stream *st;
    if (vmdk_stream_new(&sk, NULL, &st) < 0)
        abort();
    if (vmdk_stream_feed(st, 0, file, fsize) < 0 ||
        vmdk_stream_finish(st) < 0) {
        fprintf(stderr, "synthesized file refused: %s\n",
                vmdk_stream_error(st));
        abort();
    }
    if (vmdk_stream_capacity(st) != (dsize + 511) / 512 * 512 ||
        memcmp(out, disk, dsize) != 0)
        abort();
    vmdk_stream_free(st);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!disk) {
        disk = malloc(SYNTH_MAX);
        out = malloc(SYNTH_MAX + 512);
        file = malloc(4 * SYNTH_MAX);
    }
    parse(data, size);
    image(data, size);
    synth(data, size);
    return 0;
}
