/* bench_ingest: K simulated trainers stream a 12-layer x 12-head model with
 * 8 head metrics to a running entropyd as fast as they can, and report the
 * head-values per second that were committed and acked. Then, in the same
 * run, the narrow-row SQLite ceiling: inserts of (run, metric, layer, head,
 * step, value) rows in 10,000-row transactions (a plain rowid table with no
 * index: the most favourable narrow layout, so the ratio is conservative).
 *
 *   bench_ingest --socket PATH [--trainers 4] [--seconds 10] [--narrow-db PATH] [--narrow-seconds 4]
 *                [--pace-ms MS]
 *
 * (--narrow-seconds 0 skips the ceiling: for A/B runs of two daemons.)
 * --pace-ms: each trainer sends one step every MS ms, as a real training
 * loop does (a step every ~15 ms), instead of as fast as it can: then what
 * counts is the daemon's CPU per step (bench/ingest.sh), which the fixed
 * costs of a small transaction (commit, wake-ups, syscalls) dominate.
 *
 * Each trainer pre-formats its step lines once; per step it only patches the
 * seq and step numbers (space-padded: JSON allows blanks before a value), so
 * the client costs little beside the daemon on the same two cores. */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "proto.h"

#define L 12
#define H 12
#define NHEAD 8
#define NLAYER 2
#define NSCALAR 4
#define VARIANTS 16

static const char *sock_path;
static double seconds = 10;
static double pace_s = 0; /* --pace-ms / 1000 */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

struct trainer {
    int idx;
    pthread_t th;
    long long acked_seq;
    double t_end;
    int failed;
};

static size_t fmt_line(char *b, size_t cap, unsigned seed, size_t *seq_at, size_t *step_at) {
    size_t n = 0;
    n += (size_t)snprintf(b + n, cap - n, "{\"type\":\"step\",\"seq\":");
    *seq_at = n;
    n += (size_t)snprintf(b + n, cap - n, "%12d,\"step\":", 0);
    *step_at = n;
    n += (size_t)snprintf(b + n, cap - n, "%12d,\"time\":1764500000.5,\"scalars\":{", 0);
    static const char *scal[NSCALAR] = {"loss", "lr", "grad_norm", "tokens_per_s"};
    for (int s = 0; s < NSCALAR; s++)
        n += (size_t)snprintf(b + n, cap - n, "%s\"%s\":%.6g", s ? "," : "", scal[s], 1.0 + (seed % 97) * 0.01 + s);
    n += (size_t)snprintf(b + n, cap - n, "},\"layers\":{");
    static const char *lay[NLAYER] = {"rank_ratio", "cos_sim"};
    for (int m = 0; m < NLAYER; m++) {
        n += (size_t)snprintf(b + n, cap - n, "%s\"%s\":[", m ? "," : "", lay[m]);
        for (int l = 0; l < L; l++)
            n += (size_t)snprintf(b + n, cap - n, "%s%.6g", l ? "," : "", 0.5 + 0.01 * ((seed + l) % 50));
        n += (size_t)snprintf(b + n, cap - n, "]");
    }
    n += (size_t)snprintf(b + n, cap - n, "},\"heads\":{");
    static const char *hm[NHEAD] = {"entropy",       "entropy_norm", "max_logit", "sigma_qk",
                                    "entropy_bound", "eig_mean",     "eig_var",   "attn_rank"};
    unsigned r = seed * 2654435761u + 1;
    for (int m = 0; m < NHEAD; m++) {
        n += (size_t)snprintf(b + n, cap - n, "%s\"%s\":[", m ? "," : "", hm[m]);
        for (int l = 0; l < L; l++) {
            n += (size_t)snprintf(b + n, cap - n, "%s[", l ? "," : "");
            for (int h = 0; h < H; h++) {
                r = r * 1664525u + 1013904223u;
                n += (size_t)snprintf(b + n, cap - n, "%s%.6g", h ? "," : "", (r >> 8) / 16777216.0 * 4.0);
            }
            n += (size_t)snprintf(b + n, cap - n, "]");
        }
        n += (size_t)snprintf(b + n, cap - n, "]");
    }
    n += (size_t)snprintf(b + n, cap - n, "}}\n");
    return n;
}

static void patch(char *at, long long v) {
    char tmp[32];
    snprintf(tmp, sizeof tmp, "%12lld", v);
    memcpy(at, tmp, 12);
}

static void *trainer_main(void *arg) {
    struct trainer *t = arg;
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock_path);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        perror("connect");
        t->failed = 1;
        return NULL;
    }
    char hello[256];
    int hl = snprintf(
        hello, sizeof hello,
        "{\"type\":\"hello\",\"protocol\":1,\"run\":\"bench-%d-%ld\",\"layers\":%d,\"heads\":%d,\"seq_len\":128,"
        "\"ack_delay_ms\":%d}\n",
        t->idx, (long)time(NULL), L, H, PROTO_ACK_DELAY_MS); /* as the client library says */
    if (write(fd, hello, (size_t)hl) != hl) {
        t->failed = 1;
        return NULL;
    }
    char rbuf[65536];
    size_t rlen = 0;
    /* wait for welcome */
    while (!memchr(rbuf, '\n', rlen)) {
        ssize_t n = read(fd, rbuf + rlen, sizeof rbuf - rlen);
        if (n <= 0) {
            t->failed = 1;
            return NULL;
        }
        rlen += (size_t)n;
    }
    rlen = 0;
    static __thread char lines[VARIANTS][32768];
    size_t len[VARIANTS], seq_at[VARIANTS], step_at[VARIANTS];
    for (int v = 0; v < VARIANTS; v++)
        len[v] = fmt_line(lines[v], sizeof lines[v], (unsigned)(t->idx * 1000 + v), &seq_at[v], &step_at[v]);
    long long seq = 0;
    double t0 = now();
    char out[1 << 18];
    size_t olen = 0, ooff = 0;
    int sending = 1;
    double due = t0;
    struct pollfd pfd = {.fd = fd};
    for (;;) {
        if (sending && now() - t0 >= seconds) sending = 0;
        if (sending && olen == ooff && now() >= due) {
            /* fill the buffer with as many whole lines as fit (paced: one) */
            olen = ooff = 0;
            due += pace_s;
            while (olen + 32768 <= sizeof out && (pace_s == 0 || olen == 0)) {
                int v = (int)(seq % VARIANTS);
                seq++;
                patch(lines[v] + seq_at[v], seq);
                patch(lines[v] + step_at[v], seq - 1);
                memcpy(out + olen, lines[v], len[v]);
                olen += len[v];
            }
        }
        pfd.events = POLLIN | (olen > ooff ? POLLOUT : 0);
        int wait_ms = sending ? 100 : 200;
        if (sending && pace_s > 0 && olen == ooff) {
            double left = due - now();
            wait_ms = left <= 0 ? 0 : (int)(left * 1000) + 1;
        }
        if (poll(&pfd, 1, wait_ms) < 0 && errno != EINTR) break;
        if (pfd.revents & POLLOUT) {
            ssize_t n = write(fd, out + ooff, olen - ooff);
            if (n > 0) ooff += (size_t)n;
        }
        if (pfd.revents & (POLLIN | POLLHUP)) {
            ssize_t n = read(fd, rbuf + rlen, sizeof rbuf - 1 - rlen);
            if (n <= 0) break;
            rlen += (size_t)n;
            rbuf[rlen] = 0;
            char *p = rbuf, *nl;
            while ((nl = strchr(p, '\n'))) {
                *nl = 0;
                char *a = strstr(p, "\"ack\",\"seq\":");
                if (a) t->acked_seq = atoll(a + 12);
                else if (strstr(p, "error")) fprintf(stderr, "trainer %d: %s\n", t->idx, p);
                p = nl + 1;
            }
            rlen = strlen(p);
            memmove(rbuf, p, rlen);
        }
        if (!sending && olen == ooff) {
            /* all written: the last line this trainer sent fully */
            long long last = seq;
            if (t->acked_seq >= last || now() - t0 > seconds + 30) break;
        }
    }
    t->t_end = now() - t0;
    /* the acked count is what we measure; unsent partial buffer never counted */
    close(fd);
    return NULL;
}

static double narrow_ceiling(const char *path, double secs) {
    unlink(path);
    sqlite3 *db;
    sqlite3_open(path, &db);
    sqlite3_exec(db,
                 "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
                 "CREATE TABLE v(run INTEGER, metric INTEGER, layer INTEGER, head INTEGER, step INTEGER, value REAL);",
                 NULL, NULL, NULL);
    sqlite3_stmt *s;
    sqlite3_prepare_v2(db, "INSERT INTO v VALUES (?,?,?,?,?,?)", -1, &s, NULL);
    long long rows = 0;
    double t0 = now();
    long long step = 0;
    while (now() - t0 < secs) {
        sqlite3_exec(db, "BEGIN", NULL, NULL, NULL);
        for (int i = 0; i < 10000; i++) {
            int cell = (int)(rows % (NHEAD * L * H));
            if (cell == 0) step++;
            sqlite3_bind_int(s, 1, 1);
            sqlite3_bind_int(s, 2, cell / (L * H));
            sqlite3_bind_int(s, 3, (cell / H) % L);
            sqlite3_bind_int(s, 4, cell % H);
            sqlite3_bind_int64(s, 5, step);
            sqlite3_bind_double(s, 6, 0.001 * (double)(rows % 1000));
            sqlite3_step(s);
            sqlite3_reset(s);
            rows++;
        }
        sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
    }
    double dt = now() - t0;
    sqlite3_finalize(s);
    sqlite3_exec(db, "PRAGMA wal_checkpoint(TRUNCATE)", NULL, NULL, NULL);
    sqlite3_stmt *q;
    sqlite3_prepare_v2(db, "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()", -1, &q, NULL);
    double bytes = sqlite3_step(q) == SQLITE_ROW ? (double)sqlite3_column_int64(q, 0) : 0;
    sqlite3_finalize(q);
    sqlite3_close(db);
    unlink(path);
    printf("narrow rows: %lld rows in %.1f s = %.0f values/s, %.1f bytes/value\n", rows, dt, rows / dt, bytes / rows);
    return rows / dt;
}

int main(int argc, char **argv) {
    int k = 4;
    const char *narrow = "/tmp/entropyd-narrow-bench.db";
    double narrow_secs = 4.0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--socket") && i + 1 < argc) sock_path = argv[++i];
        else if (!strcmp(argv[i], "--trainers") && i + 1 < argc) k = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--narrow-db") && i + 1 < argc) narrow = argv[++i];
        else if (!strcmp(argv[i], "--narrow-seconds") && i + 1 < argc) narrow_secs = atof(argv[++i]);
        else if (!strcmp(argv[i], "--pace-ms") && i + 1 < argc) pace_s = atof(argv[++i]) / 1000;
        else {
            fprintf(stderr, "usage: bench_ingest --socket PATH [--trainers K] [--seconds S] [--narrow-db PATH] "
                            "[--narrow-seconds S] [--pace-ms MS]\n");
            return 2;
        }
    }
    if (!sock_path || k < 1 || k > 1000) {
        fprintf(stderr, "bench_ingest: --socket is required; --trainers 1..1000\n");
        return 2;
    }
    struct trainer *ts = calloc((size_t)k, sizeof *ts);
    double t0 = now();
    for (int i = 0; i < k; i++) {
        ts[i].idx = i;
        pthread_create(&ts[i].th, NULL, trainer_main, &ts[i]);
    }
    long long steps = 0;
    int failed = 0;
    for (int i = 0; i < k; i++) {
        pthread_join(ts[i].th, NULL);
        steps += ts[i].acked_seq;
        failed |= ts[i].failed;
    }
    double dt = now() - t0;
    if (failed) {
        fprintf(stderr, "bench_ingest: a trainer failed\n");
        return 1;
    }
    double values = (double)steps * NHEAD * L * H;
    double rate = values / dt;
    printf("ingest: %d trainers, %dx%d heads, %d head metrics: %lld steps acked in %.2f s\n", k, L, H, NHEAD, steps,
           dt);
    printf("ingest: %.0f head-values/s committed and acked (%.0f steps/s)\n", rate, steps / dt);
    printf("ingest: total head values %.0f\n", values);
    printf("ingest: %.2fM head-values/s beside the target of 5.00M (%.0f%%)\n", rate / 1e6, rate / 5e6 * 100);
    if (narrow_secs > 0) {
        double ceil = narrow_ceiling(narrow, narrow_secs);
        printf("ingest: ratio to narrow-row ceiling: %.1fx (target >= 8x)\n", rate / ceil);
    }
    free(ts);
    return 0;
}
