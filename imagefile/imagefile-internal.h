/* imagefile/imagefile-internal.h: shared by the files of imagefile/ only. */
#pragma once

#include "imagefile/imagefile.h"

/* imagefile.c: "PATH: strerror" into err for an open that failed with r
 * and no rule, else the rule as it is. */
void imagefile_open_msg(struct nbdf_err *err, const char *path, int r,
                        const struct nbdf_err *e);
