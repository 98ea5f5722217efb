/* tests/fuzz/replay.c: runs a libFuzzer target's entry point over files,
 * without libFuzzer.  Every fuzz target (tests/fuzz/fuzz-*.c) is also
 * linked with this driver in the ordinary build (replay-fuzz-*), so that
 * a target that no longer builds, or an input of the committed corpus or
 * of tests/fuzz/crashes/ that trips it, fails the ordinary test suite
 * (and the ASan stage), not only the fuzz stage.
 *
 *   replay-fuzz-X PATH...    each PATH a file, or a directory whose files
 *                            are run in name order
 *
 * Exit status 0 when at least one input ran and none aborted; a target's
 * oracle calls abort(), which ends the run with the signal. */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    struct stat st;
    if (!f || fstat(fileno(f), &st) < 0) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        if (f)
            fclose(f);
        return -1;
    }
    /* Exactly the input's size: ASan then sees a read past its end. */
    size_t len = (size_t) st.st_size;
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf || fread(buf, 1, len, f) != len) {
        fprintf(stderr, "replay: %s: %s\n", path,
                buf ? "short read" : "out of memory");
        free(buf);
        fclose(f);
        return -1;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, len);
    free(buf);
    return 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *) a, *(char *const *) b);
}

static int run_dir(const char *dir, unsigned *count)
{
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "replay: %s: %s\n", dir, strerror(errno));
        return -1;
    }
    char **names = NULL;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char **nn = realloc(names, (n + 1) * sizeof *names);
        if (!nn || !(nn[n] = malloc(strlen(dir) + strlen(e->d_name) + 2))) {
            fprintf(stderr, "replay: out of memory\n");
            closedir(d);
            return -1;
        }
        names = nn;
        sprintf(names[n++], "%s/%s", dir, e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, by_name);
    int r = 0;
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        if (r == 0 && stat(names[i], &st) == 0 && S_ISREG(st.st_mode)) {
            if (run_file(names[i]) < 0)
                r = -1;
            else
                (*count)++;
        }
        free(names[i]);
    }
    free(names);
    return r;
}

int main(int argc, char **argv)
{
    unsigned count = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) < 0) {
            fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
            return 1;
        }
        if (S_ISDIR(st.st_mode)) {
            if (run_dir(argv[i], &count) < 0)
                return 1;
        } else if (run_file(argv[i]) < 0) {
            return 1;
        } else {
            count++;
        }
    }
    if (count == 0) {
        fprintf(stderr, "replay: no inputs\n");
        return 1;
    }
    printf("replay: %u inputs, none tripped the target\n", count);
    return 0;
}
