/* manifest/manifest-int.h: the manifest library's insides, shared by
 * its two files: manifest.c (the block table, pending changes,
 * queries) and manifest-file.c (the file: encoding, journal, parse,
 * store).  Not for users of the library (manifest/manifest.h). */
#pragma once

#include "common/vector.h"
#include "manifest/manifest.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#define MAGIC "NBDFMANI"
#define VERSION 1
#define HDR_LEN 1088
#define HDR_KEY 56
#define HDR_SUM 1080
#define REC_LEN 64
#define REC_SUM 56
#define FLAG_MTIME 1u

enum rec_type { REC_DATA = 1, REC_ZERO = 2, REC_FORGET = 3, REC_MTIME = 4 };

/* Per block: the durable kind in the low bits, and flags. */
#define ST_KIND 3u
#define ST_PENDING 4u
#define ST_CUT 8u

#define CHUNK_BLOCKS 1024u        /* digests per chunk (32 KiB) */
#define GEN_UNSET UINT64_MAX      /* a settled cut, before its drain */
#define JBUF_RECS 256             /* records buffered before a write */
#define COMPACT_MIN 65536u        /* records appended before compaction */

struct pend {
    uint64_t b, gen;
    uint64_t seq;                 /* the change's number (m->changes) */
    uint8_t kind;
    bool later;                   /* MF_NONE whose digest is being made
                                   * (manifest_change_later()): kept
                                   * pending past any flush until
                                   * resolved */
    unsigned char d[MF_DIGEST];
};
DEFINE_VECTOR_TYPE(pend_vector, struct pend, 1024);

struct manifest {
    pthread_mutex_t lock;
    char key[MF_KEY_MAX];
    uint64_t size, nblocks;
    uint32_t bs;
    uint8_t *st;
    unsigned char **chunk;        /* nblocks / CHUNK_BLOCKS, rounded up */
    uint64_t ndata, nzero, ncut;
    uint64_t changes;             /* manifest_change() calls: seq */
    uint64_t durable;             /* the last manifest_durable() gen */
    struct pend_vector pend;      /* pending changes, unordered */
    uint32_t *hidx;               /* open addressing: pend index + 1 */
    size_t hcap;                  /* power of two, > 2 * pend.len */
    unsigned char zero_digest[MF_DIGEST];
    struct timespec mtime;
    bool has_mtime;
    /* The file. */
    int jfd, dirfd;               /* -1: no journal */
    char name[64];
    uint64_t session, records, stores;
    unsigned char jbuf[JBUF_RECS * REC_LEN];
    size_t jlen;
    bool unsynced;                /* records written, not fdatasync'd */
    bool storing;                 /* mf_store_locked() writes m->jfd */
    uint64_t synced_ns;           /* the last fdatasync, CLOCK_MONOTONIC */
    int io_error;
};


/* Shared between the two files (manifest.c, manifest-file.c). */
enum mf_kind mf_kind_of(const struct manifest *m, uint64_t b);
/* The first block at or after b, below end, whose state byte is not 0
 * (8 unknown blocks at a time); end if none. */
uint64_t mf_next_known(const struct manifest *m, uint64_t b, uint64_t end);
void mf_set_durable(struct manifest *m, uint64_t b, enum mf_kind k,
                    const unsigned char *d);
unsigned char *mf_digest_slot(struct manifest *m, uint64_t b, bool make);
void mf_clear_locked(struct manifest *m);
void mf_jrec(struct manifest *m, enum rec_type t, uint64_t b, uint64_t n,
            const unsigned char *d);
int mf_jflush(struct manifest *m);
int mf_sync_locked(struct manifest *m);
void mf_promoted_locked(struct manifest *m);
int mf_store_locked(struct manifest *m, int dirfd, const char *name);
void mf_close_journal(struct manifest *m);
uint64_t mf_now_ns(void);
