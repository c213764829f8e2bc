/* fixture.h: helpers shared by the C test programs (tests/test_*.c), each
 * defined once here instead of in every file that needs it: sleeping and
 * polling, temporary directories, environment knobs, and starting the real
 * entropyd. Header-only (static inline), so the Makefile needs no change:
 * a test includes it as "fixture.h" (from tests/), anything else as
 * "../tests/fixture.h". The functions do not need cmocka; the WAIT_UNTIL
 * macro does where it is used (fail_msg). Monotonic time is the daemon's
 * clock, now_mono_ms() from common/now.h. */
#ifndef FIXTURE_H
#define FIXTURE_H

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "now.h"

/* Sleeps ms milliseconds. */
static inline void msleep(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Evaluates cond until it holds, for at most ms milliseconds, running the
 * statement idle between two tries (a sleep, or the work that lets cond come
 * true); fails the test, naming cond, if it never holds. */
#define WAIT_UNTIL(cond, ms, idle)                                                       \
    do {                                                                                 \
        double wait_until_ = now_mono_ms() + (ms);                                       \
        while (!(cond) && now_mono_ms() < wait_until_) { idle; }                         \
        if (!(cond)) fail_msg("timed out after %d ms waiting for %s", (int)(ms), #cond); \
    } while (0)

static inline int rmtree_entry_(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

/* Removes dir and everything below it (links are removed, not followed).
 * Returns 0, or nonzero when something could not be removed. */
static inline int rmtree(const char *dir) { return nftw(dir, rmtree_entry_, 16, FTW_DEPTH | FTW_PHYS); }

/* The environment variable name as a number; dflt when it is unset or empty. */
static inline long env_long(const char *name, long dflt) {
    const char *v = getenv(name);
    return v && *v ? strtol(v, NULL, 10) : dflt;
}

/* The entropyd binary under test: $ENTROPYD (scripts/run-tests.sh sets it),
 * else build/entropyd. The string is the environment's or a literal: not
 * to be freed. */
static inline const char *entropyd_path(void) {
    const char *p = getenv("ENTROPYD");
    return p && *p ? p : "build/entropyd";
}

/* Starts entropyd_path() with --data data --http off, its stdout and stderr
 * appended to the file log, and waits up to 10 s for it to create its
 * socket sock (removed first: a SIGKILLed daemon leaves it behind). Returns
 * the child's pid: the caller owns that process and stops and reaps it
 * (kill, waitpid). On failure returns -1 with the reason, and the beginning
 * of the log, in err (errcap bytes); a child that never made its socket has
 * been killed and reaped. */
static inline pid_t entropyd_start(const char *data, const char *sock, const char *log, char *err, size_t errcap) {
    unlink(sock);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(err, errcap, "fork: %s", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execl(entropyd_path(), "entropyd", "--data", data, "--http", "off", (char *)NULL);
        _exit(127);
    }
    struct stat st;
    double end = now_mono_ms() + 10000;
    while (stat(sock, &st) != 0 && now_mono_ms() < end) msleep(5);
    if (stat(sock, &st) == 0) return pid;
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    char buf[2048] = "";
    FILE *f = fopen(log, "r");
    if (f) {
        buf[fread(buf, 1, sizeof buf - 1, f)] = 0;
        fclose(f);
    }
    snprintf(err, errcap, "entropyd did not create %s; its log:\n%s", sock, buf);
    return -1;
}

#endif
