/*
 * Build options appended without snprintf (build_options.h).
 */
#include "build_options.h"

#include <string.h>

/* The decimal digits of v, with its sign, into text (at least 21 bytes); their count. */
static size_t decimal(long long v, char *text) {
    char reversed[21];
    size_t n = 0, k = 0;
    unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
    do {
        reversed[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0) text[k++] = '-';
    while (n) text[k++] = reversed[--n];
    return k;
}

void clattn__define_str(char *out, size_t capacity, size_t *used, const char *macro,
                        const char *value) {
    const size_t m = strlen(macro), v = strlen(value), need = 3 + m + 1 + v;
    if (*used >= capacity || capacity - *used <= need) {
        *used = capacity;
        return;
    }
    char *at = out + *used;
    memcpy(at, " -D", 3);
    memcpy(at + 3, macro, m);
    at[3 + m] = '=';
    memcpy(at + 4 + m, value, v);
    at[need] = '\0';
    *used += need;
}

void clattn__define_int(char *out, size_t capacity, size_t *used, const char *macro,
                        long long value) {
    char text[24];
    text[decimal(value, text)] = '\0';
    clattn__define_str(out, capacity, used, macro, text);
}
