/* common/optlist.h: --long-options and --short-options, printed from the
 * very tables getopt_long() parses, one option a line.  The bash
 * completion script (tools/bash-completion) asks each program for them,
 * so completion cannot drift from what the program accepts. */
#pragma once
#include <ctype.h>
#include <getopt.h>
#include <stdio.h>

static inline void optlist_long(const struct option *opts)
{
    for (const struct option *o = opts; o->name; o++)
        printf("--%s\n", o->name);
}

/* optstring as given to getopt: "+:C:o:..." prints -C, -o, ... */
static inline void optlist_short(const char *optstring)
{
    for (const char *p = optstring; *p; p++)
        if (isalnum((unsigned char) *p))
            printf("-%c\n", *p);
}
