/* bench_http: drives a running entropyd's HTTP side and prints latencies.
 *
 *   bench_http --port P --socket PATH --run ID [--split-run ID2] [--static /index.html]
 *              [--requests 500] [--clients 100] [--seconds 3]
 *
 * 1. series: GET /api/runs/ID/series?metric=entropy&layer=0&head=1&points=1000
 *    over the whole run (and over random windows), one keep-alive
 *    connection, sequential requests: p50/p99 latency.
 *    On the run of 12 heads (--split-run ID2): one head at 200 points, and
 *    every head of the layer in one request (split=head) at 200 points.
 * 2. frame: GET /api/runs/ID/frame?metric=entropy&step=RANDOM: p50/p99.
 * 3. requests/s of GET /api/runs and of a static file, 4 client threads
 *    each on keep-alive connections, one after the other in this run.
 * 4. SSE: N clients on /api/stream; a trainer on the Unix socket sends 200
 *    steps/s; each client notes, per step event, the delay from the
 *    event's commit time ("ct", the daemon's clock after the commit) and
 *    from the moment the step line was written, to its arrival. */
#include <curl/curl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static int port, nreq = 500, nclients = 100;
static double seconds = 3;
static long run_id = 1, split_run = 0; /* split_run: a run of 1 layer x 12 heads (0: none) */
static const char *sock_path, *static_path = "/index.html";
static int daemon_pid; /* when given: the daemon's CPU time per request, which load does not inflate */

/* The daemon's user + system CPU seconds so far, or NAN. */
static double daemon_cpu(void) {
    if (!daemon_pid) return NAN;
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", daemon_pid);
    FILE *f = fopen(path, "r");
    if (!f) return NAN;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    unsigned long ut = 0, st = 0;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2) return NAN;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static double mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double wall(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double p) {
    if (!n) return NAN;
    qsort(v, n, sizeof *v, cmpd);
    size_t i = (size_t)ceil(p / 100.0 * (double)n);
    return v[i ? i - 1 : 0];
}

static size_t sink(char *p, size_t s, size_t n, void *ud) {
    (void)p;
    if (ud) *(size_t *)ud += s * n;
    return s * n;
}

/* GETs path on h; returns seconds taken, or -1 on a failure or non-200. */
static double timed_get(CURL *h, const char *path, size_t *bytes) {
    char url[512];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, bytes);
    double t0 = mono();
    CURLcode rc = curl_easy_perform(h);
    double t = mono() - t0;
    long st = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &st);
    if (rc != CURLE_OK || st != 200) {
        fprintf(stderr, "bench_http: GET %s: %s %ld\n", path, curl_easy_strerror(rc), st);
        return -1;
    }
    return t;
}

static int latency(const char *name, int kind, double target_ms) {
    CURL *h = curl_easy_init();
    double *v = calloc((size_t)nreq, sizeof *v);
    size_t bytes = 0;
    char path[256];
    unsigned seed = 42;
    int fails = 0;
    /* warm the connection and the page cache once */
    if (kind == 4 || kind == 5)
        snprintf(path, sizeof path, "/api/runs/%ld/series?metric=entropy&layer=0&split=head&points=200", split_run);
    else snprintf(path, sizeof path, "/api/runs/%ld/series?metric=entropy&layer=0&head=1&points=1000", run_id);
    timed_get(h, path, &bytes);
    bytes = 0;
    double cpu0 = daemon_cpu();
    for (int i = 0; i < nreq; i++) {
        if (kind == 0) {
            snprintf(path, sizeof path, "/api/runs/%ld/series?metric=entropy&layer=0&head=1&points=1000", run_id);
        } else if (kind == 1) {
            long a = rand_r(&seed) % 1000000, b = rand_r(&seed) % 1000000;
            if (a > b) {
                long t = a;
                a = b;
                b = t;
            }
            snprintf(path, sizeof path,
                     "/api/runs/%ld/series?metric=entropy&layer=1&head=0&points=1000&from=%ld&to=%ld", run_id, a, b);
        } else if (kind == 2) {
            snprintf(path, sizeof path, "/api/runs/%ld/series?metric=entropy&points=1000&agg=min", run_id);
        } else if (kind == 4) {
            snprintf(path, sizeof path, "/api/runs/%ld/series?metric=entropy&layer=0&head=%d&points=200", split_run,
                     i % 12);
        } else if (kind == 5) {
            snprintf(path, sizeof path, "/api/runs/%ld/series?metric=entropy&layer=0&split=head&points=200", split_run);
        } else {
            snprintf(path, sizeof path, "/api/runs/%ld/frame?metric=entropy&step=%d", run_id, rand_r(&seed) % 1000000);
        }
        v[i] = timed_get(h, path, &bytes) * 1e3;
        if (v[i] < 0) fails++;
    }
    double cpu = (daemon_cpu() - cpu0) / nreq * 1e3;
    double p50 = pct(v, (size_t)nreq, 50), p99 = pct(v, (size_t)nreq, 99);
    char verdict[64];
    if (fails) snprintf(verdict, sizeof verdict, "FAILED REQUESTS");
    else if (target_ms <= 0) snprintf(verdict, sizeof verdict, "(no target)");
    else snprintf(verdict, sizeof verdict, "target p99 <= %g ms: %s", target_ms, p99 <= target_ms ? "met" : "MISSED");
    printf("http: %-44s p50 %6.2f ms  p99 %6.2f ms  daemon CPU %5.2f ms/request  (%d requests, %.0f bytes each)  %s\n",
           name, p50, p99, cpu, nreq, (double)bytes / nreq, verdict);
    free(v);
    curl_easy_cleanup(h);
    return fails;
}

/* ---- requests/s ------------------------------------------------------- */

struct rps_arg {
    const char *path;
    double until;
    long n, fails;
};

static void *rps_thread(void *p) {
    struct rps_arg *a = p;
    CURL *h = curl_easy_init();
    while (mono() < a->until) {
        if (timed_get(h, a->path, NULL) < 0) a->fails++;
        else a->n++;
    }
    curl_easy_cleanup(h);
    return NULL;
}

static double rps(const char *path, long *fails) {
    enum { T = 4 };
    pthread_t th[T];
    struct rps_arg a[T];
    double t0 = mono();
    for (int i = 0; i < T; i++) {
        a[i] = (struct rps_arg){.path = path, .until = t0 + seconds};
        pthread_create(&th[i], NULL, rps_thread, &a[i]);
    }
    long n = 0;
    *fails = 0;
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        n += a[i].n;
        *fails += a[i].fails;
    }
    return n / (mono() - t0);
}

/* ---- SSE ------------------------------------------------------------- */

#define MAXSTEPS 100000
static double sent_at[MAXSTEPS]; /* wall time each step line was written */
static long feed_run;            /* the feeder's run id, once welcomed */

struct client {
    char line[8192];
    size_t len;
    double *ct_delay, *send_delay;
    size_t n, cap;
};

static void on_event_line(struct client *c, const char *l) {
    if (strncmp(l, "data: {\"run\":", 13) != 0) return;
    long r = atol(l + 13);
    if (r != feed_run) return;
    const char *sp = strstr(l, "\"step\":"), *ct = strstr(l, "\"ct\":");
    if (!sp || !ct) return;
    double now = wall();
    long step = atol(sp + 7);
    if (c->n == c->cap) {
        c->cap = c->cap ? c->cap * 2 : 1024;
        c->ct_delay = realloc(c->ct_delay, c->cap * sizeof(double));
        c->send_delay = realloc(c->send_delay, c->cap * sizeof(double));
    }
    c->ct_delay[c->n] = (now - strtod(ct + 5, NULL)) * 1e3;
    c->send_delay[c->n] = step >= 0 && step < MAXSTEPS && sent_at[step] > 0 ? (now - sent_at[step]) * 1e3 : NAN;
    c->n++;
}

static size_t on_sse(char *p, size_t s, size_t n, void *ud) {
    struct client *c = ud;
    for (size_t i = 0; i < s * n; i++) {
        if (p[i] == '\n') {
            c->line[c->len] = 0;
            on_event_line(c, c->line);
            c->len = 0;
        } else if (c->len < sizeof c->line - 1) {
            c->line[c->len++] = p[i];
        }
    }
    return s * n;
}

static volatile int feed_done;
static int feed_steps;

static void *feeder(void *p) {
    (void)p;
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", sock_path);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
        perror("bench_http: connect");
        feed_done = 1;
        return NULL;
    }
    char buf[65536], line[1024];
    char run[64];
    snprintf(run, sizeof run, "sse-%ld", (long)wall());
    int n =
        snprintf(line, sizeof line,
                 "{\"type\":\"hello\",\"protocol\":1,\"run\":\"%s\",\"layers\":2,\"heads\":2,\"seq_len\":8}\n", run);
    if (write(fd, line, (size_t)n) != n) goto out;
    ssize_t r = read(fd, buf, sizeof buf - 1);
    if (r <= 0) goto out;
    buf[r] = 0;
    char *id = strstr(buf, "\"run_id\":");
    if (!id) goto out;
    feed_run = atol(id + 9);
    usleep(200000); /* the clients have all connected by now */
    double t0 = mono();
    int total = (int)(seconds * 200);
    if (total > MAXSTEPS) total = MAXSTEPS;
    for (int s = 0; s < total; s++) {
        double due = t0 + s / 200.0;
        while (mono() < due) usleep(200);
        n = snprintf(
            line, sizeof line,
            "{\"type\":\"step\",\"seq\":%d,\"step\":%d,\"scalars\":{\"loss\":%g},\"heads\":{\"entropy\":[[1.5,2],[0.25,1]]}}\n",
            s + 1, s, 1.0 / (s + 1));
        sent_at[s] = wall();
        if (write(fd, line, (size_t)n) != n) break;
        feed_steps = s + 1;
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        while (poll(&pf, 1, 0) > 0 && read(fd, buf, sizeof buf) > 0) {} /* acks */
    }
    usleep(500000);
out:
    close(fd);
    feed_done = 1;
    return NULL;
}

static int sse_bench(void) {
    CURLM *m = curl_multi_init();
    struct client *cl = calloc((size_t)nclients, sizeof *cl);
    CURL **hs = calloc((size_t)nclients, sizeof *hs);
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/api/stream", port);
    for (int i = 0; i < nclients; i++) {
        hs[i] = curl_easy_init();
        curl_easy_setopt(hs[i], CURLOPT_URL, url);
        curl_easy_setopt(hs[i], CURLOPT_WRITEFUNCTION, on_sse);
        curl_easy_setopt(hs[i], CURLOPT_WRITEDATA, &cl[i]);
        curl_multi_add_handle(m, hs[i]);
    }
    pthread_t th;
    double cpu0 = daemon_cpu();
    pthread_create(&th, NULL, feeder, NULL);
    int running = 1;
    while (!feed_done && running) {
        curl_multi_perform(m, &running);
        curl_multi_poll(m, NULL, 0, 50, NULL);
    }
    pthread_join(th, NULL);
    double cpu = daemon_cpu() - cpu0;
    size_t total = 0, got_all = 0;
    for (int i = 0; i < nclients; i++) {
        total += cl[i].n;
        got_all += cl[i].n == (size_t)feed_steps;
    }
    double *ct = malloc((total + 1) * sizeof *ct), *sd = malloc((total + 1) * sizeof *sd);
    size_t k = 0, ks = 0;
    for (int i = 0; i < nclients; i++)
        for (size_t j = 0; j < cl[i].n; j++) {
            ct[k++] = cl[i].ct_delay[j];
            if (!isnan(cl[i].send_delay[j])) sd[ks++] = cl[i].send_delay[j];
        }
    double p50 = pct(ct, k, 50), p99 = pct(ct, k, 99), mx = k ? ct[k - 1] : NAN;
    printf(
        "http: SSE commit -> event received, %d clients:  p50 %6.2f ms  p99 %6.2f ms  max %6.2f ms  target p99 <= 50 ms: %s\n",
        nclients, p50, p99, mx, k && p99 <= 50 ? "met" : "MISSED");
    printf("http: SSE step line written -> event received:  p50 %6.2f ms  p99 %6.2f ms  (%d steps at 200/s, "
           "%zu events received, %zu of %d clients got every step; daemon CPU %.0f%% of one core)\n",
           pct(sd, ks, 50), pct(sd, ks, 99), feed_steps, total, got_all, nclients,
           100 * cpu / (feed_steps / 200.0 + 0.7));
    for (int i = 0; i < nclients; i++) {
        curl_multi_remove_handle(m, hs[i]);
        curl_easy_cleanup(hs[i]);
        free(cl[i].ct_delay);
        free(cl[i].send_delay);
    }
    curl_multi_cleanup(m);
    free(cl);
    free(hs);
    free(ct);
    free(sd);
    return got_all == (size_t)nclients ? 0 : 1;
}

int main(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--port") == 0) port = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--socket") == 0) sock_path = argv[i + 1];
        else if (strcmp(argv[i], "--run") == 0) run_id = atol(argv[i + 1]);
        else if (strcmp(argv[i], "--split-run") == 0) split_run = atol(argv[i + 1]);
        else if (strcmp(argv[i], "--static") == 0) static_path = argv[i + 1];
        else if (strcmp(argv[i], "--requests") == 0) nreq = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--clients") == 0) nclients = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--seconds") == 0) seconds = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--pid") == 0) daemon_pid = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "bench_http: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (!port || !sock_path) {
        fprintf(stderr,
                "usage: bench_http --port P --socket PATH [--run ID] [--split-run ID] [--static PATH] [--requests N] "
                "[--clients N] [--seconds S]\n");
        return 2;
    }
    curl_global_init(CURL_GLOBAL_ALL);
    int fails = 0;
    /* the targets: a 1000-point series over a 1M-step head, a frame;
     * the other lines are figures without one (target 0) */
    fails += latency("series 1000 points, whole run (1M steps)", 0, 10);
    fails += latency("series 1000 points, random windows", 1, 0);
    fails += latency("series 1000 points, all heads agg=min", 2, 0);
    if (split_run) {
        fails += latency("series 200 points, one head of 12", 4, 0);
        fails += latency("series 200 points, 12 heads split=head", 5, 0);
    }
    fails += latency("frame at a random step", 3, 2);
    long f1, f2;
    char runs[64];
    snprintf(runs, sizeof runs, "/api/runs");
    double r1 = rps(runs, &f1);
    double r2 = rps(static_path, &f2);
    printf("http: requests/s, 4 keep-alive clients, %.0f s each:  /api/runs %.0f/s   static %s %.0f/s%s\n", seconds, r1,
           static_path, r2, f1 || f2 ? "  (SOME REQUESTS FAILED)" : "");
    fails += sse_bench();
    curl_global_cleanup();
    return fails ? 1 : 0;
}
