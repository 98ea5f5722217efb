/* tests/fuzz/fuzz-vhd-locator.c: libFuzzer target for parent-locator path
 * handling: vhd_locator_path() and vhd_parent_name() (vhd/) and the VHD
 * readers' resolution of the resulting untrusted path inside the child's
 * directory (imagefile/chain.c, included here to reach its static
 * resolve_inside()).
 *
 * Input: 1 byte selecting the platform code, 1 byte the output buffer
 * size, 1 byte the child's directory, then the locator payload (also used
 * as a UTF-16BE parent name).  A scratch tree is made once under $TMPDIR:
 *
 *     ROOT/outside.vhd
 *     ROOT/chain/child.vhd   parent.vhd   sub/deep.vhd
 *     ROOT/chain/up -> ..    (a symlink out of the chain)
 *     ROOT/chain/sub/back -> ../parent.vhd
 *
 * Oracles: a decoded path is NUL-terminated at the returned length, fits
 * the buffer, and (W2ru/W2ku) has no backslash; errors are the documented
 * ones; a path that resolves lies inside the child's directory (never
 * ROOT/outside.vhd through "..", "up/" or an absolute path) and exists.
 * Run with -rss_limit_mb=256.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vhd/vhd.h"
#include "../../imagefile/chain.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char root[PATH_MAX], chain[PATH_MAX], sub[PATH_MAX];

static void touch(const char *dir, const char *name)
{
    char p[PATH_MAX * 2];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    if (!f)
        abort();
    fclose(f);
}

static void make_tree(void)
{
    const char *tmp = getenv("TMPDIR");
    char tmpl[PATH_MAX], p[PATH_MAX * 2];
    snprintf(tmpl, sizeof tmpl, "%s/fuzz-loc.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(tmpl) || !realpath(tmpl, root))
        abort();
    if (snprintf(chain, sizeof chain, "%s/chain", root) >= (int) sizeof chain ||
        snprintf(sub, sizeof sub, "%s/sub", chain) >= (int) sizeof sub)
        abort();
    if (mkdir(chain, 0700) || mkdir(sub, 0700))
        abort();
    touch(root, "outside.vhd");
    touch(chain, "child.vhd");
    touch(chain, "parent.vhd");
    touch(sub, "deep.vhd");
    snprintf(p, sizeof p, "%s/up", chain);
    if (symlink("..", p))
        abort();
    snprintf(p, sizeof p, "%s/back", sub);
    if (symlink("../parent.vhd", p))
        abort();
    /* The resolver works: the obvious cases. */
    snprintf(p, sizeof p, "%s/child.vhd", chain);
    char *ok = resolve_inside(p, "parent.vhd");
    if (!ok || resolve_inside(p, "../outside.vhd") ||
        resolve_inside(p, "up/outside.vhd") || resolve_inside(p, "/etc/passwd"))
        abort();
    free(ok);
}

static const uint32_t codes[] = {
    VHD_PLAT_MACX, VHD_PLAT_W2RU, VHD_PLAT_W2KU, VHD_PLAT_MAC,
    VHD_PLAT_WI2R, VHD_PLAT_WI2K, VHD_PLAT_NONE, 0x12345678u,
};

static void check_inside(const char *dir, const char *child,
                         const char *path)
{
    char *r = resolve_inside(child, path);
    if (!r)
        return;
    size_t n = strlen(dir);
    if (strncmp(r, dir, n) != 0 || r[n] != '/')
        abort();                        /* escaped the child's directory */
    if (access(r, F_OK) != 0)
        abort();                        /* resolved to something absent */
    free(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool ready;
    if (!ready) {
        make_tree();
        ready = true;
    }
    if (size < 3)
        return 0;
    uint32_t code = codes[data[0] % (sizeof codes / sizeof codes[0])];
    size_t outlen = 1 + data[1] * 17u;  /* 1 .. 4336 */
    const char *dir = data[2] & 1 ? sub : chain;
    char child[PATH_MAX * 2];
    snprintf(child, sizeof child, "%s/%s", dir,
             data[2] & 1 ? "deep.vhd" : "child.vhd");
    data += 3;
    size -= 3;

    struct vhd_locator l = {
        .code = code, .data_length = (uint32_t) size,
        .data_space = (uint32_t) ((size + 511) / 512),
        .space_bytes = (size + 511) / 512 * 512,
    };
    char *out = malloc(outlen);
    struct nbdf_err e = { "" };
    if (!out)
        abort();
    int r = vhd_locator_path(&l, data, size, out, outlen, &e);
    if (r >= 0) {
        if ((size_t) r >= outlen || strlen(out) != (size_t) r)
            abort();
        if ((code == VHD_PLAT_W2RU || code == VHD_PLAT_W2KU) &&
            strchr(out, '\\'))
            abort();
        check_inside(dir, child, out);
    } else if (r != -ENOENT && r != -ENOTSUP && r != -EINVAL &&
               r != -EILSEQ && r != -ENAMETOOLONG) {
        abort();
    }

    struct vhd_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.parent_name, data, size < 512 ? size : 512);
    r = vhd_parent_name(&h, out, outlen);
    if (r >= 0) {
        if ((size_t) r >= outlen || strlen(out) != (size_t) r)
            abort();
        check_inside(dir, child, out);
    }
    free(out);
    return 0;
}
