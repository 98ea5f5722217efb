/* manifest/manifest-table.c: the block table's primitives (a block's
 * durable kind and digest), shared by the table's changes (manifest.c)
 * and the file's parse (manifest-file.c), below both. */
#include "manifest/manifest-int.h"

#include <stdlib.h>
#include <string.h>

/* ---- the block table ------------------------------------------------ */

unsigned char *mf_digest_slot(struct manifest *m, uint64_t b, bool make)
{
    unsigned char **c = &m->chunk[b / CHUNK_BLOCKS];
    if (!*c && make)
        *c = malloc((size_t) CHUNK_BLOCKS * MF_DIGEST);
    return *c ? *c + (b % CHUNK_BLOCKS) * MF_DIGEST : NULL;
}

enum mf_kind mf_kind_of(const struct manifest *m, uint64_t b)
{
    return (enum mf_kind) (m->st[b] & ST_KIND);
}

/* Set the durable entry of b.  A digest of zero bytes is MF_ZERO; a
 * digest without memory for it is forgotten (MF_NONE: never wrong). */
void mf_set_durable(struct manifest *m, uint64_t b, enum mf_kind k,
                    const unsigned char *d)
{
    if (k == MF_DATA && memcmp(d, m->zero_digest, MF_DIGEST) == 0)
        k = MF_ZERO;
    unsigned char *slot = k == MF_DATA ? mf_digest_slot(m, b, true) : NULL;
    if (k == MF_DATA && !slot)
        k = MF_NONE;
    enum mf_kind old = mf_kind_of(m, b);
    m->ndata -= old == MF_DATA;
    m->nzero -= old == MF_ZERO;
    m->ndata += k == MF_DATA;
    m->nzero += k == MF_ZERO;
    m->st[b] = (uint8_t) ((m->st[b] & ~ST_KIND) | k);
    if (slot)
        memcpy(slot, d, MF_DIGEST);
}

void mf_clear_locked(struct manifest *m)
{
    memset(m->st, 0, m->nblocks ? m->nblocks : 1);
    m->ndata = m->nzero = m->ncut = 0;
    m->pend.len = 0;
    if (m->hidx)
        memset(m->hidx, 0, m->hcap * sizeof *m->hidx);
    m->has_mtime = false;
}

/* The first block at or after b (below end) whose state byte is not 0:
 * 8 at a time over the unknown ones.  end if none. */
uint64_t mf_next_known(const struct manifest *m, uint64_t b, uint64_t end)
{
    while (b < end && (b & 7))
        if (m->st[b])
            return b;
        else
            b++;
    for (; b + 8 <= end; b += 8) {
        uint64_t w;
        memcpy(&w, m->st + b, 8);
        if (w)
            break;
    }
    while (b < end && !m->st[b])
        b++;
    return b;
}
