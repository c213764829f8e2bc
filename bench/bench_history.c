/* bench_history.c: the history-scaling benchmark's client (bench/history.sh).
 *
 * Against a running entropyd serving a short run and a long run of the same
 * shape (seeded by bench_history_seed), it measures the read paths on each
 * (p50 and p99 over --requests requests: /metrics, /api/runs, the run's
 * summary, frame, alerts, events, 1000-point series over the whole run and
 * over random windows) and prints them side by side with the ratio long /
 * short. Then, while a bystander trainer streams small steps one at a time,
 * a rollback of --rewind steps of the long run and a DELETE of it, with the
 * bystander's ack latency during each. A sampler thread records the WAL
 * file's peak size throughout.
 *
 *   bench_history --port P --socket PATH --db PATH --short ID --long ID
 *                 --long-name NAME --long-steps N [--requests 200] [--rewind 40000]
 *                 [--reads-only 1]   (the read paths only: the runs are left as they are)
 *
 * Figures on a shared machine: the load average is printed by the script. */
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>

static int port;
static const char *sock_path, *db_path;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* One HTTP request on a fresh connection; returns the status (or -1) and
 * the body's length in *bytes. */
static int http(const char *method, const char *path, long *bytes) {
    int fd = socket(AF_INET, SOCK_STREAM, 0), status = -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) goto out;
    char req[1024];
    int n = snprintf(req, sizeof req, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", method, path);
    if (write(fd, req, (size_t)n) != n) goto out;
    char buf[65536];
    long total = 0;
    ssize_t r;
    while ((r = read(fd, buf, sizeof buf)) > 0) {
        if (total == 0 && r > 12) status = atoi(buf + 9);
        total += r;
    }
    if (bytes) *bytes = total;
out:
    if (fd >= 0) close(fd);
    return status;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

struct lat {
    double p50, p99, max;
    int errors;
};

static struct lat summarize(double *v, int n) {
    struct lat l = {NAN, NAN, NAN, 0};
    if (n <= 0) return l;
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    l.p50 = v[n / 2];
    l.p99 = v[(int)((n - 1) * 0.99)];
    l.max = v[n - 1];
    return l;
}

/* ---- the WAL sampler -------------------------------------------------- */

static volatile int sampling = 1;
static long long wal_peak;

static void *wal_sampler(void *arg) {
    (void)arg;
    char p[4096];
    snprintf(p, sizeof p, "%s-wal", db_path);
    while (sampling) {
        struct stat sb;
        if (stat(p, &sb) == 0 && sb.st_size > wal_peak) wal_peak = sb.st_size;
        usleep(10 * 1000);
    }
    return NULL;
}

/* ---- a trainer over the Unix socket ------------------------------------ */

struct trainer {
    int fd;
    char buf[65536];
    size_t len;
};

static int tr_open(struct trainer *t, const char *run, int L, int H, long long *last_seq) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", sock_path);
    t->len = 0;
    t->fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (t->fd < 0 || connect(t->fd, (struct sockaddr *)&a, sizeof a) != 0) return -1;
    char line[512];
    int n = snprintf(line, sizeof line,
                     "{\"type\":\"hello\",\"protocol\":1,\"run\":\"%s\",\"layers\":%d,\"heads\":%d,\"seq_len\":256}\n",
                     run, L, H);
    if (write(t->fd, line, (size_t)n) != n) return -1;
    for (;;) { /* the welcome */
        ssize_t r = read(t->fd, t->buf + t->len, sizeof t->buf - 1 - t->len);
        if (r <= 0) return -1;
        t->len += (size_t)r;
        t->buf[t->len] = 0;
        char *nl = strchr(t->buf, '\n');
        if (!nl) continue;
        char *p = strstr(t->buf, "\"last_seq\":");
        if (!p || !strstr(t->buf, "welcome")) return -1;
        *last_seq = atoll(p + 11);
        t->len -= (size_t)(nl + 1 - t->buf);
        memmove(t->buf, nl + 1, t->len);
        return 0;
    }
}

/* Waits for the ack of seq (or an error line: -1). */
static int tr_wait_ack(struct trainer *t, long long seq) {
    for (;;) {
        char *nl;
        while ((nl = memchr(t->buf, '\n', t->len))) {
            *nl = 0;
            int ok = 0;
            if (strstr(t->buf, "\"error\"")) ok = -1;
            char *p = strstr(t->buf, "\"ack\"") ? strstr(t->buf, "\"seq\":") : NULL;
            if (p && atoll(p + 6) >= seq) ok = 1;
            t->len -= (size_t)(nl + 1 - t->buf);
            memmove(t->buf, nl + 1, t->len);
            if (ok) return ok > 0 ? 0 : -1;
        }
        ssize_t r = read(t->fd, t->buf + t->len, sizeof t->buf - 1 - t->len);
        if (r <= 0) return -1;
        t->len += (size_t)r;
    }
}

/* A step line: the head metric entropy_norm (L x H), loss. */
static int tr_step(struct trainer *t, long long seq, long long step, int L, int H, double v) {
    static char line[1 << 16];
    int n = snprintf(line, sizeof line,
                     "{\"type\":\"step\",\"seq\":%lld,\"step\":%lld,\"scalars\":{\"loss\":%.4f},"
                     "\"heads\":{\"entropy_norm\":[",
                     seq, step, v);
    for (int l = 0; l < L; l++) {
        line[n++] = l ? ',' : '[';
        if (l) line[n++] = '[';
        for (int h = 0; h < H; h++)
            n += snprintf(line + n, sizeof line - (size_t)n, "%s%.4f", h ? "," : "", v + 0.01 * h);
        line[n++] = ']';
    }
    n += snprintf(line + n, sizeof line - (size_t)n, "]}}\n");
    return write(t->fd, line, (size_t)n) == n ? 0 : -1;
}

/* The bystander: streams steps of a small run one at a time, recording the
 * ack latency of each while `recording` is set. */
static volatile int by_stop, by_recording;
static double by_lat[1 << 20];
static int by_n;

static void *bystander(void *arg) {
    (void)arg;
    struct trainer t;
    long long seq;
    if (tr_open(&t, "bench-bystander", 2, 3, &seq)) {
        fprintf(stderr, "bench_history: bystander cannot connect\n");
        return NULL;
    }
    long long step = seq;
    while (!by_stop) {
        double t0 = now_ms();
        if (tr_step(&t, ++seq, step++, 2, 3, 0.5) || tr_wait_ack(&t, seq)) break;
        double ms = now_ms() - t0;
        if (by_recording && by_n < (int)(sizeof by_lat / sizeof by_lat[0])) by_lat[by_n++] = ms;
        usleep(2000);
    }
    close(t.fd);
    return NULL;
}

static struct lat bystander_window_end(void) {
    by_recording = 0;
    usleep(5000);
    struct lat l = summarize(by_lat, by_n);
    l.errors = by_n;
    by_n = 0;
    return l;
}

static long long db_count(const char *sql) {
    sqlite3 *db;
    sqlite3_stmt *s;
    long long v = -1;
    if (sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) return -1;
    sqlite3_busy_timeout(db, 2000);
    if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) == SQLITE_OK) {
        if (sqlite3_step(s) == SQLITE_ROW) v = sqlite3_column_int64(s, 0);
        sqlite3_finalize(s);
    }
    sqlite3_close(db);
    return v;
}

/* ---- the read paths ---------------------------------------------------- */

enum { E_METRICS, E_RUNS, E_RUN, E_FRAME, E_ALERTS, E_EVENTS, E_SERIES, E_SERIES_RANDOM, E_COUNT };
static const char *const e_name[E_COUNT] = {"/metrics",
                                            "/api/runs",
                                            "run summary",
                                            "frame",
                                            "alerts",
                                            "events",
                                            "series 1000 pts, whole run",
                                            "series 1000 pts, random window"};

static void path_for(int e, long long id, long long steps, char *p, size_t cap) {
    switch (e) {
    case E_METRICS: snprintf(p, cap, "/metrics"); break;
    case E_RUNS: snprintf(p, cap, "/api/runs"); break;
    case E_RUN: snprintf(p, cap, "/api/runs/%lld", id); break;
    case E_FRAME: snprintf(p, cap, "/api/runs/%lld/frame?metric=entropy_norm", id); break;
    case E_ALERTS: snprintf(p, cap, "/api/runs/%lld/alerts", id); break;
    case E_EVENTS: snprintf(p, cap, "/api/runs/%lld/events", id); break;
    case E_SERIES: snprintf(p, cap, "/api/runs/%lld/series?metric=entropy_norm&layer=0&head=0&points=1000", id); break;
    default: { /* a window of 1000 .. all steps, log-uniform, anywhere */
        double w = exp(log(1000.0) + (double)rand() / RAND_MAX * (log((double)steps) - log(1000.0)));
        long long width = (long long)w, from = (long long)((double)rand() / RAND_MAX * (double)(steps - width));
        snprintf(p, cap, "/api/runs/%lld/series?metric=entropy_norm&layer=3&head=5&points=1000&from=%lld&to=%lld", id,
                 from, from + width - 1);
    }
    }
}

/* Times n requests of read path e on each of the two runs, alternating
 * short, long, short, ... so that a change of load during the run (other
 * work on the same two cores) weighs on both sides alike and the ratio
 * measures the run's length, not the load's drift. Each side draws its
 * random windows from its own seeded sequence. */
static void measure_pair(int e, long long id_a, long long steps_a, long long id_b, long long steps_b, int n,
                         struct lat *a, struct lat *b) {
    double *va = calloc((size_t)n, sizeof *va), *vb = calloc((size_t)n, sizeof *vb);
    int errs[2] = {0, 0};
    unsigned seeds[2] = {7, 7};
    char p[512];
    for (int i = 0; i < 2 * n; i++) {
        int side = i & 1;
        srand(seeds[side]);
        path_for(e, side ? id_b : id_a, side ? steps_b : steps_a, p, sizeof p);
        seeds[side] = (unsigned)rand();
        double t0 = now_ms();
        int st = http("GET", p, NULL);
        (side ? vb : va)[i / 2] = now_ms() - t0;
        if (st != 200) errs[side]++;
    }
    *a = summarize(va, n);
    *b = summarize(vb, n);
    a->errors = errs[0];
    b->errors = errs[1];
    free(va);
    free(vb);
}

int main(int argc, char **argv) {
    long long short_id = 0, long_id = 0, long_steps = 0, rewind = 40000;
    const char *long_name = NULL;
    int requests = 200, reads_only = 0, layers = 12, heads = 12;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--port")) port = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--socket")) sock_path = argv[i + 1];
        else if (!strcmp(argv[i], "--db")) db_path = argv[i + 1];
        else if (!strcmp(argv[i], "--short")) short_id = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--long")) long_id = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--long-name")) long_name = argv[i + 1];
        else if (!strcmp(argv[i], "--long-steps")) long_steps = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--requests")) requests = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rewind")) rewind = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--reads-only")) reads_only = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--layers")) layers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--heads")) heads = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "bench_history: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (!port || !sock_path || !db_path || !short_id || !long_id || !long_name || long_steps < 2000) {
        fprintf(stderr,
                "usage: bench_history --port P --socket PATH --db PATH --short ID --long ID --long-name NAME "
                "--long-steps N [--requests N] [--rewind N] [--layers L --heads H (the long run's shape, 12 x 12)]\n");
        return 2;
    }
    pthread_t sampler, by;
    pthread_create(&sampler, NULL, wal_sampler, NULL);
    char q[128];
    snprintf(q, sizeof q, "SELECT last_step + 1 FROM runs WHERE id = %lld", short_id);
    long long short_steps = db_count(q);
    printf("history: %-32s %9s %9s %9s %9s %7s %7s\n", "read path (ms)", "short p50", "p99", "long p50", "p99", "p50 x",
           "p99 x");
    int bad = 0;
    for (int e = 0; e < E_COUNT; e++) {
        struct lat a, b;
        measure_pair(e, short_id, short_steps, long_id, long_steps, requests, &a, &b);
        double r50 = b.p50 / a.p50, r99 = b.p99 / a.p99;
        const char *flag = "";
        if (e >= E_SERIES) {
            if (b.p99 > 10 || a.p99 > 10) flag = "  p99 > 10 ms";
        } else if (r50 > 1.5) {
            flag = "  ratio > 1.5";
        }
        if (*flag) bad++;
        printf("history: %-32s %9.2f %9.2f %9.2f %9.2f %7.2f %7.2f%s%s\n", e_name[e], a.p50, a.p99, b.p50, b.p99, r50,
               r99, flag, a.errors || b.errors ? "  (errors)" : "");
    }
    if (reads_only) {
        printf("history: %d read path(s) over the bar (ratio > 1.5, or series p99 > 10 ms)\n", bad);
        return 0;
    }

    /* rollback of `rewind` steps of the long run while the bystander streams */
    pthread_create(&by, NULL, bystander, NULL);
    usleep(300 * 1000);
    struct trainer t;
    long long seq;
    by_recording = 1;
    if (tr_open(&t, long_name, layers, heads, &seq) == 0) {
        long long to = long_steps - rewind;
        double t0 = now_ms();
        if (tr_step(&t, seq + 1, to, layers, heads, 0.25) == 0 && tr_wait_ack(&t, seq + 1) == 0) {
            double ms = now_ms() - t0;
            struct lat l = bystander_window_end();
            printf("history: rollback of %lld steps of the long run: its ack after %.0f ms; other trainer's acks "
                   "meanwhile: %d, p50 %.1f ms, p99 %.1f ms, max %.1f ms%s\n",
                   rewind, ms, l.errors, l.p50, l.p99, l.max, l.p99 > 100 ? "  (p99 > 100 ms)" : "");
        } else {
            printf("history: rollback failed\n");
        }
        /* end the run so that it may be deleted */
        char line[96];
        int n = snprintf(line, sizeof line, "{\"type\":\"end\",\"seq\":%lld,\"status\":\"finished\"}\n", seq + 2);
        if (write(t.fd, line, (size_t)n) == n) tr_wait_ack(&t, seq + 2);
        close(t.fd);
    }
    usleep(300 * 1000);
    /* DELETE of the long run */
    by_n = 0;
    by_recording = 1;
    char p[64];
    snprintf(p, sizeof p, "/api/runs/%lld", long_id);
    double t0 = now_ms();
    int st = http("DELETE", p, NULL);
    double answered = now_ms() - t0;
    while (db_count("SELECT count(*) FROM purge") > 0) usleep(20 * 1000);
    double purged = now_ms() - t0;
    struct lat l = bystander_window_end();
    printf("history: DELETE of the long run (%lld steps left): HTTP %d in %.0f ms, purged in %.1f s; other trainer's "
           "acks meanwhile: %d, p50 %.1f ms, p99 %.1f ms, max %.1f ms%s\n",
           long_steps - rewind + 1, st, answered, purged / 1e3, l.errors, l.p50, l.p99, l.max,
           l.p99 > 100 ? "  (p99 > 100 ms)" : "");
    by_stop = 1;
    pthread_join(by, NULL);
    sampling = 0;
    pthread_join(sampler, NULL);
    printf("history: WAL peak during all of the above: %.1f MiB%s\n", wal_peak / 1048576.0,
           wal_peak > (64LL << 20) ? "  (> 64 MiB)" : "");
    printf("history: %d read path(s) over the bar (ratio > 1.5, or series p99 > 10 ms)\n", bad);
    return 0;
}
