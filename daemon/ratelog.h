/* ratelog.h: a log line that repeats at most once a second.
 *
 * A full disk or a process out of file descriptors makes the same error
 * happen hundreds of times a second (accept, every commit and checkpoint);
 * one line each was 141 MB of log in 12 s. A struct ratelog per call site
 * prints the first line at once and then at most one a second, each
 * saying how many like it were held back since the last one printed.
 * Not locked: each struct ratelog belongs to one thread. */
#ifndef RATELOG_H
#define RATELOG_H

#include <stdint.h>

struct ratelog {
    double last_ms; /* monotonic ms of the last line printed; 0: none yet */
    uint64_t held;  /* lines held back since */
};

/* Prints "entropyd: " and the formatted line (no newline in fmt) on stderr,
 * or counts it when a line of this site was printed less than a second
 * ago. */
void ratelog(struct ratelog *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
