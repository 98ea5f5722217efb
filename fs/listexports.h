/* fs/listexports.h: nbdferry --list.  Prints the exports of the server at
 * uri (NAME<TAB>SIZE<TAB>DESCRIPTION per line); returns the exit status. */
#pragma once

int list_exports(const char *uri);
