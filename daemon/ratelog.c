/* ratelog.c: see ratelog.h. */
#include "ratelog.h"

#include <stdarg.h>
#include <stdio.h>

#include "now.h"

void ratelog(struct ratelog *r, const char *fmt, ...) {
    double now = now_mono_ms();
    if (r->last_ms > 0 && now - r->last_ms < 1000) {
        r->held++;
        return;
    }
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (r->held)
        fprintf(stderr, "entropyd: %s (and %llu more like it in the last %.0f s)\n", line, (unsigned long long)r->held,
                (now - r->last_ms) / 1e3);
    else fprintf(stderr, "entropyd: %s\n", line);
    r->last_ms = now;
    r->held = 0;
}
