/* common/json.h: a JSON string literal on a stdio stream (the status
 * document's writers share it). */
#pragma once
#include <stdio.h>

static inline void json_put_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char) *s < 0x20)
            fprintf(f, "\\u%04x", (unsigned char) *s);
        else
            fputc(*s, f);
    }
    fputc('"', f);
}
