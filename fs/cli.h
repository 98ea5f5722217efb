/* fs/cli.h: the daemon's command-line parsing helpers, without side
 * effects beyond stat()/fcntl() checks: each returns 0 or -errno and, on
 * error, writes the one-line message main() prints into msg (msglen
 * bytes, always NUL-terminated).  Kept apart from main() so that they can
 * be fuzzed (tests/fuzz/fuzz-cli.c). */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "transport/nbdx.h"

#define CLI_MSG_MAX 512

/* "SIZE" with an optional K/M/G/T suffix (powers of 1024), optionally
 * followed by "i", "B" or "iB".  -EINVAL: not a size; -ERANGE: too large. */
int cli_parse_size(const char *opt, const char *s, uint64_t *out,
                   char *msg, size_t msglen);

/* A decimal number in [min, max].  -EINVAL: not a number; -ERANGE: out of
 * range. */
int cli_parse_uint(const char *opt, const char *s, unsigned min,
                   unsigned max, unsigned *out, char *msg, size_t msglen);

/* Record the connection mode; -EINVAL if a different one was set. */
int cli_set_mode(struct nbdx_config *nbd, bool *mode_set, enum nbdx_mode m,
                 char *msg, size_t msglen);

/* The arguments after MOUNTPOINT: URI, [ CMD ARGS ], --command CMD ...,
 * --unix SOCKET, --tcp HOST PORT or --fd N.  Pointers into argv are kept
 * in nbd (borrowed); "[ CMD ARGS ]" replaces the closing "]" by NULL. */
int cli_parse_server(struct nbdx_config *nbd, bool *mode_set, int argc,
                     char **argv, char *msg, size_t msglen);

/* MOUNTPOINT or MOUNTPOINT/FILENAME (when MOUNTPOINT/FILENAME is not
 * itself a directory).  On success *mountpoint and *filename are the
 * caller's to free; on error both are NULL. */
int cli_parse_mountpoint(const char *arg, const char *reserved_name,
                         char **mountpoint, char **filename,
                         char *msg, size_t msglen);
