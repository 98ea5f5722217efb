/* tests/unit/test-manifest.c: manifest/manifest.c: promotion by
 * generation, the stale-entry rule, cuts, the file (store, journal
 * replay, a torn end) and its refusals (truncated, corrupt, another
 * export, a planted link, a file open to others). */
#undef NDEBUG
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "manifest/manifest.h"
#include "tests/unit/test-util.h"

#define BS 65536u
#define NB 64u

static const struct manifest_id ID = { .key = "unix:1:2|disk", .size =
                                       (uint64_t) NB * BS, .block_size = BS };

static struct manifest *fresh(const struct manifest_id *id)
{
    struct manifest *m;
    CHECK(manifest_create(id ? id : &ID, &m) == 0);
    return m;
}

static void dg(unsigned char *d, int v)
{
    memset(d, v, MF_DIGEST);
}

static int dfd;

/* The stale-entry rule and promotion by generation. */
static void test_promotion(void)
{
    struct manifest *m = fresh(NULL);
    unsigned char a[MF_DIGEST], b[MF_DIGEST], got[MF_DIGEST];
    dg(a, 0xaa);
    dg(b, 0xbb);

    manifest_change(m, 3, MF_DATA, a, 10);
    CHECK(manifest_lookup(m, 3, got) == MF_NONE);   /* pending: unknown */
    manifest_durable(m, 9);                          /* older than 10 */
    CHECK(manifest_lookup(m, 3, got) == MF_NONE);
    manifest_durable(m, 10);
    CHECK(manifest_lookup(m, 3, got) == MF_DATA && memcmp(got, a, 32) == 0);

    /* A newer change hides the entry until the newer one is durable; a
     * durable(D) between the two changes does not promote the old one. */
    manifest_change(m, 3, MF_DATA, b, 20);
    CHECK(manifest_lookup(m, 3, got) == MF_NONE);
    manifest_change(m, 3, MF_DATA, a, 30);           /* back to a, later */
    manifest_durable(m, 25);
    CHECK(manifest_lookup(m, 3, got) == MF_NONE);    /* a is not durable */
    manifest_durable(m, 30);
    CHECK(manifest_lookup(m, 3, got) == MF_DATA && memcmp(got, a, 32) == 0);

    /* A partial write: unknown, and stays so once durable. */
    manifest_change(m, 3, MF_NONE, NULL, 40);
    manifest_durable(m, 50);
    CHECK(manifest_lookup(m, 3, got) == MF_NONE);

    /* The zero digest is MF_ZERO. */
    manifest_change(m, 4, MF_DATA, manifest_zero_digest(m), 51);
    manifest_change(m, 5, MF_ZERO, NULL, 51);
    manifest_durable(m, 60);
    CHECK(manifest_lookup(m, 4, got) == MF_ZERO);
    CHECK(manifest_lookup(m, 5, got) == MF_ZERO);
    struct manifest_stats st;
    manifest_get_stats(m, &st);
    CHECK(st.zero == 2 && st.data == 0 && st.pending == 0);

    /* Many pending blocks: the index grows. */
    for (unsigned i = 0; i < NB; i++)
        manifest_change(m, i, MF_DATA, a, 100 + i);
    manifest_durable(m, 100 + NB / 2);
    manifest_get_stats(m, &st);
    CHECK(st.data == NB / 2 + 1 && st.pending == NB / 2 - 1);
    for (unsigned i = 0; i < NB; i++)
        CHECK(manifest_lookup(m, i, got) == (i <= NB / 2 ? MF_DATA : MF_NONE));
    manifest_free(m);
}

/* Cuts: the entry stays while cut; a settle turns it into a pending
 * zero whose generation comes after the drain. */
static void test_cuts(void)
{
    struct manifest *m = fresh(NULL);
    unsigned char a[MF_DIGEST], got[MF_DIGEST];
    dg(a, 1);
    for (unsigned i = 0; i < 8; i++)
        manifest_change(m, i, MF_DATA, a, 1);
    manifest_durable(m, 1);
    manifest_cut(m, 0, 8);
    CHECK(manifest_is_cut(m, 2));
    CHECK(manifest_lookup(m, 2, got) == MF_DATA);    /* the caller decides */
    manifest_uncut(m, 0, 2);                         /* same bytes written */
    manifest_change(m, 2, MF_DATA, a, 5);            /* rewritten */
    CHECK(!manifest_is_cut(m, 2));
    CHECK(manifest_settle_cuts(m) == 5);             /* 3..7 */
    CHECK(manifest_lookup(m, 4, got) == MF_NONE);
    manifest_durable(m, 1000);                       /* gen not set yet */
    CHECK(manifest_lookup(m, 4, got) == MF_NONE);
    manifest_settle_gen(m, 1001);
    manifest_durable(m, 1001);
    CHECK(manifest_lookup(m, 4, got) == MF_ZERO);
    CHECK(manifest_lookup(m, 0, got) == MF_DATA);
    CHECK(manifest_lookup(m, 2, got) == MF_DATA);
    manifest_free(m);
}

/* A large export (17 TiB: 285 million blocks): a zeroing and a cut of
 * the whole of it record what the manifest holds (data entries, pending
 * changes) and learn zeros only up to MF_LEARN_PENDING pending changes;
 * a block known zero is left alone.  Memory in proportion to what is
 * recorded: one pending change per block would take 18 GiB. */
static void test_large_ranges(void)
{
    const struct manifest_id big = { .key = "unix:1:3|big",
                                     .size = 17ull << 40, .block_size = BS };
    uint64_t nb = big.size / BS, last = nb - 1;
    struct manifest *m = fresh(&big);
    struct manifest_stats st;
    unsigned char a[MF_DIGEST], got[MF_DIGEST];
    dg(a, 3);
    manifest_change(m, 5, MF_DATA, a, 1);
    manifest_change(m, last, MF_DATA, a, 1);
    manifest_durable(m, 1);
    manifest_change(m, nb / 2, MF_DATA, a, 2);       /* pending */
    manifest_change_zero(m, 0, nb, 3);
    manifest_get_stats(m, &st);
    /* Learned up to the bound (the pending block counted in it), then
     * the blocks with an entry past it: the last one. */
    CHECK(st.pending == MF_LEARN_PENDING + 1);
    manifest_durable(m, 3);
    CHECK(manifest_lookup(m, 5, got) == MF_ZERO);
    CHECK(manifest_lookup(m, last, got) == MF_ZERO);
    CHECK(manifest_lookup(m, nb / 2, got) == MF_ZERO);
    CHECK(manifest_lookup(m, MF_LEARN_PENDING + 100, got) == MF_NONE);
    /* Zero over zero: nothing pending. */
    manifest_change_zero(m, 0, 10, 4);
    manifest_get_stats(m, &st);
    CHECK(st.pending == 0);
    /* A cut of the whole export flags only the blocks with an entry. */
    manifest_change(m, last - 1, MF_DATA, a, 5);
    manifest_durable(m, 5);
    manifest_cut(m, 0, nb);
    CHECK(manifest_is_cut(m, last - 1) && !manifest_is_cut(m, nb - 3));
    CHECK(manifest_settle_cuts(m) == 1);             /* the data block */
    manifest_settle_gen(m, 6);
    manifest_durable(m, 6);
    CHECK(manifest_lookup(m, last - 1, got) == MF_ZERO);
    manifest_free(m);
}

/* Blocks written in part: listed once their change is sent, resolved by
 * a read-back unless changed again meanwhile. */
static void test_resolve(void)
{
    struct manifest *m = fresh(NULL);
    unsigned char a[MF_DIGEST], got[MF_DIGEST];
    uint64_t b[8], seq[8];
    dg(a, 9);
    manifest_change(m, 5, MF_NONE, NULL, 10);
    manifest_change(m, 6, MF_NONE, NULL, 20);
    manifest_change(m, 7, MF_DATA, a, 10);
    CHECK(manifest_unknown_changes(m, 15, b, seq, 8) == 1 && b[0] == 5);
    CHECK(manifest_resolve(m, 5, seq[0], MF_DATA, a, 15));
    CHECK(!manifest_resolve(m, 5, seq[0], MF_DATA, a, 15)); /* not unknown */
    CHECK(manifest_unknown_changes(m, 25, b, seq, 8) == 1 && b[0] == 6);
    manifest_change(m, 6, MF_NONE, NULL, 30);            /* changed again */
    CHECK(!manifest_resolve(m, 6, seq[0], MF_DATA, a, 25));
    manifest_durable(m, 30);
    CHECK(manifest_lookup(m, 5, got) == MF_DATA && memcmp(got, a, 32) == 0);
    CHECK(manifest_lookup(m, 6, got) == MF_NONE);
    manifest_free(m);
}

/* THE LATER DIGEST (fs/warm-later.c): a whole block whose digest is
 * made after the write was answered.  Until it comes the block is
 * unknown, whatever flush covers it; the digest is durable with the
 * first durable call once a flush covered the write; a change of the
 * block meanwhile wins; a digest that never comes leaves it unknown. */
static void test_change_later(void)
{
    struct manifest *m = fresh(NULL);
    unsigned char a[MF_DIGEST], c[MF_DIGEST], got[MF_DIGEST];
    uint64_t b[8], seq[8];
    dg(a, 3);
    dg(c, 4);
    uint64_t s5 = manifest_change_later(m, 5, 10);
    CHECK(s5 != 0);
    CHECK(manifest_lookup(m, 5, got) == MF_NONE);
    manifest_durable(m, 20);                     /* covers the write */
    CHECK(manifest_lookup(m, 5, got) == MF_NONE);   /* digest not in */
    CHECK(manifest_unknown_changes(m, 20, b, seq, 8) == 0);  /* no read */
    CHECK(manifest_resolve(m, 5, s5, MF_DATA, a, 10));
    CHECK(!manifest_resolve(m, 5, s5, MF_DATA, c, 10));     /* once */
    manifest_durable(m, 0);                      /* no new flush needed */
    CHECK(manifest_lookup(m, 5, got) == MF_DATA && memcmp(got, a, 32) == 0);
    /* Before the flush: durable only once a flush covers gen. */
    uint64_t s7 = manifest_change_later(m, 7, 30);
    CHECK(manifest_resolve(m, 7, s7, MF_DATA, a, 30));
    manifest_durable(m, 29);
    CHECK(manifest_lookup(m, 7, got) == MF_NONE);
    manifest_durable(m, 30);
    CHECK(manifest_lookup(m, 7, got) == MF_DATA && memcmp(got, a, 32) == 0);
    /* Changed again before the digest came: the newer change wins. */
    uint64_t s6 = manifest_change_later(m, 6, 40);
    manifest_change(m, 6, MF_DATA, c, 41);
    CHECK(!manifest_resolve(m, 6, s6, MF_DATA, a, 40));
    manifest_durable(m, 41);
    CHECK(manifest_lookup(m, 6, got) == MF_DATA && memcmp(got, c, 32) == 0);
    /* ... and a later digest over a durable entry forgets it first. */
    uint64_t s6b = manifest_change_later(m, 6, 50);
    CHECK(manifest_lookup(m, 6, got) == MF_NONE);
    manifest_durable(m, 60);
    CHECK(manifest_lookup(m, 6, got) == MF_NONE);
    /* A digest that could not be made: an ordinary unknown change. */
    CHECK(manifest_resolve(m, 6, s6b, MF_NONE, NULL, 50));
    CHECK(manifest_unknown_changes(m, 60, b, seq, 8) == 1 && b[0] == 6);
    /* Forgotten meanwhile: nothing to resolve. */
    uint64_t s8 = manifest_change_later(m, 8, 70);
    manifest_forget_all(m);
    CHECK(!manifest_resolve(m, 8, s8, MF_DATA, a, 70));
    manifest_durable(m, 80);
    CHECK(manifest_lookup(m, 8, got) == MF_NONE);
    CHECK(manifest_change_later(m, 1u << 30, 1) == 0);      /* past the end */
    manifest_free(m);
}

/* The mount's order: the flush that drained the parts tells them
 * durable first, the read-back comes after it.  The part stays to be
 * resolved; the resolved bytes are durable with the next flush that
 * covers the read's generation, not before. */
static void test_resolve_after_durable(void)
{
    struct manifest *m = fresh(NULL);
    unsigned char a[MF_DIGEST], got[MF_DIGEST];
    uint64_t b[8], seq[8];
    dg(a, 11);
    manifest_change(m, 5, MF_NONE, NULL, 10);
    manifest_durable(m, 10);
    CHECK(manifest_lookup(m, 5, got) == MF_NONE);
    CHECK(manifest_unknown_changes(m, 10, b, seq, 8) == 1 && b[0] == 5);
    CHECK(manifest_resolve(m, 5, seq[0], MF_DATA, a, 12));
    manifest_durable(m, 11);                     /* older than the read */
    CHECK(manifest_lookup(m, 5, got) == MF_NONE);
    manifest_durable(m, 12);
    CHECK(manifest_lookup(m, 5, got) == MF_DATA && memcmp(got, a, 32) == 0);
    manifest_free(m);
    /* Bounded: past MF_UNRESOLVED_KEPT, parts are simply unknown. */
    const uint64_t nb = MF_UNRESOLVED_KEPT + 10;
    const struct manifest_id big = { .key = "unix:1:2|big",
                                     .size = nb * BS, .block_size = BS };
    m = fresh(&big);
    for (uint64_t i = 0; i < nb; i++)
        manifest_change(m, i, MF_NONE, NULL, 20);
    manifest_durable(m, 20);
    uint64_t *bb = malloc(nb * sizeof *bb), *ss = malloc(nb * sizeof *ss);
    CHECK(bb && ss);
    CHECK(manifest_unknown_changes(m, 20, bb, ss, nb) == MF_UNRESOLVED_KEPT);
    struct manifest_stats st;
    manifest_get_stats(m, &st);
    CHECK(st.pending == 0);
    free(bb);
    free(ss);
    manifest_free(m);
}

static size_t file_len(const char *name)
{
    struct stat st;
    CHECK(fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0);
    return (size_t) st.st_size;
}

static int load_into(const struct manifest_id *id, const char *name,
                     struct manifest **out, struct nbdf_err *why)
{
    *out = fresh(id);
    return manifest_load(*out, dfd, name, why);
}

/* Store, journal, replay; what a crash leaves. */
static void test_file(void)
{
    struct manifest *m = fresh(NULL), *n;
    unsigned char a[MF_DIGEST], got[MF_DIGEST];
    struct nbdf_err why;
    struct manifest_stats st;
    dg(a, 7);

    CHECK(load_into(NULL, "m", &n, &why) == -ENOENT);
    manifest_free(n);
    CHECK(manifest_store(m, dfd, "m") == 0);
    struct stat s;
    CHECK(fstatat(dfd, "m", &s, 0) == 0 && (s.st_mode & 0777) == 0600);
    for (unsigned i = 0; i < 10; i++)
        manifest_change(m, i, i < 5 ? MF_DATA : MF_ZERO, a, 1);
    manifest_durable(m, 1);                  /* appended: the journal */
    manifest_change(m, 2, MF_DATA, a, 2);    /* a FORGET, synced */
    CHECK(manifest_sync(m) == 0);
    struct timespec t = { .tv_sec = 1234, .tv_nsec = 5678 }, t2;
    manifest_set_mtime(m, &t);
    CHECK(manifest_sync(m) == 0);

    /* A crash now (nothing more written): the replay has it all. */
    CHECK(load_into(NULL, "m", &n, &why) == 0);
    manifest_get_stats(n, &st);
    CHECK(st.data == 4 && st.zero == 5);
    CHECK(manifest_lookup(n, 2, got) == MF_NONE);
    CHECK(manifest_lookup(n, 3, got) == MF_DATA && memcmp(got, a, 32) == 0);
    CHECK(manifest_get_mtime(n, &t2) && t2.tv_sec == 1234 &&
          t2.tv_nsec == 5678);
    manifest_free(n);

    /* A torn end: a partial record, or zero bytes, are ignored. */
    size_t len = file_len("m");
    sh("cp %s/m %s/torn && truncate -s %zu %s/torn", dir, dir, len - 10, dir);
    CHECK(load_into(NULL, "torn", &n, &why) == 0);
    manifest_get_stats(n, &st);
    CHECK(st.data + st.zero >= 8);           /* the mtime record lost */
    CHECK(!manifest_get_mtime(n, &t2) || t2.tv_sec == 1234);
    manifest_free(n);
    sh("cp %s/m %s/zeros && truncate -s %zu %s/zeros", dir, dir, len + 640,
       dir);
    CHECK(load_into(NULL, "zeros", &n, &why) == 0);
    manifest_free(n);

    /* Refused: a truncated header, a flipped byte in the header or in a
     * record followed by others, another export, another size. */
    sh("head -c 100 %s/m > %s/short", dir, dir);
    CHECK(load_into(NULL, "short", &n, &why) == -EINVAL);
    CHECK(strstr(why.msg, "truncated"));
    manifest_free(n);
    sh("cp %s/m %s/hdr && printf 'X' | dd of=%s/hdr bs=1 seek=60 "
       "conv=notrunc status=none", dir, dir, dir);
    CHECK(load_into(NULL, "hdr", &n, &why) == -EINVAL);
    manifest_free(n);
    sh("cp %s/m %s/rec && printf 'X' | dd of=%s/rec bs=1 seek=1100 "
       "conv=notrunc status=none", dir, dir, dir);
    CHECK(load_into(NULL, "rec", &n, &why) == -EINVAL);
    CHECK(strstr(why.msg, "corrupt record"));
    manifest_get_stats(n, &st);
    CHECK(st.data == 0 && st.zero == 0);     /* left empty */
    manifest_free(n);
    struct manifest_id other = ID;
    other.key = "unix:1:2|other";
    CHECK(load_into(&other, "m", &n, &why) == -EINVAL);
    CHECK(strstr(why.msg, "another export"));
    manifest_free(n);
    other = ID;
    other.size += BS;
    CHECK(load_into(&other, "m", &n, &why) == -EINVAL);
    manifest_free(n);

    /* A planted link, a file open to others. */
    sh("ln -s m %s/link", dir);
    CHECK(load_into(NULL, "link", &n, &why) == -EINVAL);
    CHECK(strstr(why.msg, "link"));
    manifest_free(n);
    sh("cp %s/m %s/open && chmod 0666 %s/open", dir, dir, dir);
    CHECK(load_into(NULL, "open", &n, &why) == -EINVAL);
    manifest_free(n);

    /* A store over a planted link replaces the link, never its target. */
    sh("echo precious > %s/target && ln -s target %s/planted", dir, dir);
    CHECK(manifest_store(m, dfd, "planted") == 0);
    sh("grep -q precious %s/target", dir);
    CHECK(load_into(NULL, "planted", &n, &why) == 0);
    manifest_get_stats(n, &st);
    CHECK(st.data == 4 && st.zero == 5);
    manifest_free(n);
    manifest_free(m);
}

/* Compaction keeps the state; samples and runs. */
static void test_compact_and_queries(void)
{
    struct manifest_id big = ID;
    big.size = (uint64_t) 200000 * BS;
    struct manifest *m = fresh(&big), *n;
    unsigned char a[MF_DIGEST], got[MF_DIGEST];
    struct nbdf_err why;
    struct manifest_stats st;
    CHECK(manifest_store(m, dfd, "big") == 0);
    for (unsigned round = 0; round < 3; round++)
        for (unsigned i = 0; i < 40000; i++) {
            dg(a, (int) (round + 1));
            manifest_change(m, i, MF_DATA, a, round * 100000 + i + 1);
            if (i % 1000 == 999)
                manifest_durable(m, round * 100000 + i + 1);
        }
    manifest_get_stats(m, &st);
    CHECK(st.stores >= 2);                   /* compacted at least once */
    CHECK(load_into(&big, "big", &n, &why) == 0);
    manifest_get_stats(n, &st);
    CHECK(st.data == 40000);
    CHECK(manifest_lookup(n, 39999, got) == MF_DATA && got[0] == 3);
    uint64_t s[64], b0, b1;
    CHECK(manifest_sample_data(n, 42, s, 64) == 64);
    for (unsigned i = 0; i < 64; i++)
        CHECK(s[i] < 40000);
    CHECK(manifest_next_run(n, MF_DATA, 0, &b0, &b1) && b0 == 0 &&
          b1 == 40000);
    CHECK(!manifest_next_run(n, MF_ZERO, 0, &b0, &b1));
    manifest_free(n);
    manifest_free(m);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/test-manifest.XXXXXX");
    CHECK(mkdtemp(dir));
    dfd = open(dir, O_RDONLY | O_DIRECTORY);
    CHECK(dfd >= 0);
    test_promotion();
    test_cuts();
    test_large_ranges();
    test_resolve();
    test_resolve_after_durable();
    test_change_later();
    test_file();
    test_compact_and_queries();
    sh("rm -rf %s", dir);
    printf("manifest: ok\n");
    return 0;
}
