/* util.c — the bottom of the floor plan: error messages and the clock. */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

int ds4_fail(char *err, size_t len, int code, const char *fmt, ...) {
    if (err && len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, len, fmt, ap);
        va_end(ap);
    }
    return code;
}

double ds4_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}
