/* now.h: the two clocks of both programs (daemon, trainer, client library),
 * defined once. Wall time (Unix seconds) is
 * what gets stored and shown; monotonic milliseconds measure durations and
 * deadlines, immune to the wall clock being stepped. */
#ifndef NOW_H
#define NOW_H

#include <time.h>

static inline double now_wall(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static inline double now_mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

#endif
