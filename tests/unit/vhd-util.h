/* tests/unit/vhd-util.h: helpers shared by the vhd unit tests. */
#ifndef NBDFERRY_VHD_TEST_UTIL_H
#define NBDFERRY_VHD_TEST_UTIL_H

#undef NDEBUG
#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/iszero.h"
#include "vhd/vhd.h"

#define CHECK(cond) do { if (!(cond)) { \
    fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
    abort(); } } while (0)

/* Decompress tests/fixtures/vhd/<name>.xz (xz -dc) into memory.  Aborts on
 * failure.  The fixture directory is $NBDFERRY_VHD_FIXTURES or the compile
 * definition VHD_FIXTURE_DIR.  *buf is owned by the caller (free()). */
void vt_load_fixture(const char *name, uint8_t **buf, size_t *len);

/* Lowercase hex sha256 of buf (OpenSSL EVP); out has 65 bytes. */
void vt_sha256(const void *buf, size_t len, char out[65]);

/* Expected sha256 of a decompressed fixture (README table), or NULL. */
const char *vt_expected_sha(const char *name);

/* A disk image the stream decoder writes into (the sink's opaque). */
struct vt_disk {
    uint8_t *buf;                 /* owned, cap bytes */
    uint64_t cap;
    bool began;
    enum vhd_kind kind;
    uint64_t vsize;
    uint64_t data_calls, zero_calls, data_bytes, zero_bytes;
    uint64_t high;                /* highest byte emitted + 1 */
    int fail_after;               /* >0: data() fails on that call (-EIO) */
};
extern const struct nbdf_sink vt_disk_sink;


/* Deterministic PRNG (xorshift64*). */
uint64_t vt_rand(uint64_t *state);

/* Parse a whole in-memory VHD with the image API; 0 or -errno, err set. */
int vt_image_parse(const uint8_t *file, size_t len, struct vhd_image **img,
                   struct nbdf_err *err);

/* Decode an in-memory VHD to raw through vhd_image_lookup (random access,
 * independent of the stream decoder).  For a differencing image, disk
 * must already hold the parent.  disk has vhd_image_size() bytes. */
void vt_image_decode(const struct vhd_image *img, const uint8_t *file,
                     uint8_t *disk);

#endif
