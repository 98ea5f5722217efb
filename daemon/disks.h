/* daemon/disks.h: the disks of a mount of several, from the command line.
 *
 *   nbdferry [OPTIONS] MOUNTPOINT --all-exports URI
 *   nbdferry [OPTIONS] MOUNTPOINT NAME=URI [NAME=URI ...]
 *
 * Each disk is its own file, MOUNTPOINT/NAME, with its views (NAME.vhd,
 * ...).  Every name is checked before anything is mounted: a file name
 * (not empty, no '/', not "." or "..", no control character, short
 * enough for its longest view), and no file of one disk may have the name
 * of a file of another, nor the status file's.  Returns 0 or -errno with
 * the one-line message in err (a 'struct nbdf_err', common/err.h; may be
 * NULL), as daemon/cli.h's helpers. */
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"

struct cli_disk {
    char *name;               /* the raw file's name; owned */
    char *uri;                /* the export's NBD URI; owned */
};

/* Is args (what follows MOUNTPOINT) the several-disk form?  "NAME=URI"
 * is told from a URI by an '=' before the URI's "://". */
bool disks_form(int argc, char **argv);
bool disks_is_named(const char *arg);

/* Does uri name an export (a path beyond "/")?  --all-exports takes the
 * server alone: it names each disk's export itself. */
bool disks_uri_has_export(const char *uri);

/* NAME=URI ... into *out (n of them, malloc'd). */
int disks_parse_named(int argc, char **argv, struct cli_disk **out,
                      unsigned *n, struct nbdf_err *err);

/* The URI of the export called name on the server of uri: uri with its
 * path replaced by "/" and the name, percent-encoded; malloc'd or NULL. */
char *disks_export_uri(const char *uri, const char *name);

/* The checks above, over every disk's files. */
int disks_check_names(const struct cli_disk *v, unsigned n,
                      struct nbdf_err *err);

void disks_free(struct cli_disk *v, unsigned n);
/* Sort by name (strcmp): the status, the verdict and the log list a
 * mount's disks in this order, whatever order the server listed them
 * or the command line gave them. */
void disks_sort(struct cli_disk *v, unsigned n);
