/* fs/listexports.h: nbdferry --list.  Prints the exports of the server at
 * uri (NAME<TAB>SIZE<TAB>DESCRIPTION per line); returns the exit status. */
#pragma once

int list_exports(const char *uri);

/* --all-exports URI: the names the server at uri lists (NBD_OPT_LIST), in
 * its order; *names (and each name) malloc'd, the caller's.  0, or -1
 * with one line logged (no connection, no list, an empty list). */
#include <stddef.h>
int list_export_names(const char *uri, char ***names, size_t *n);
