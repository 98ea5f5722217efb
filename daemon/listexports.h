/* daemon/listexports.h: nbdferry --list.  Prints the exports of the server at
 * uri (NAME<TAB>SIZE<TAB>DESCRIPTION per line); returns the exit status. */
#pragma once

#include "transport/nbdx.h"

/* cfg: the command line's connection settings with its URI (mode
 * NBDX_URI); timeout_s: the whole listing's deadline, 0 none. */
int list_exports(const struct nbdx_config *cfg, unsigned timeout_s);

/* --all-exports URI: the names the server at uri lists (NBD_OPT_LIST), in
 * its order; *names (and each name) malloc'd, the caller's.  0, or -1
 * with one line logged (no connection, no list, an empty list). */
#include <stddef.h>
int list_export_names(const struct nbdx_config *cfg, unsigned timeout_s,
                      char ***names, size_t *n);
