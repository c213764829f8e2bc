/* bench_telemetry.c -- cost of one telemetry enqueue on the training thread.
 *
 * A 12x12 model's step: 8 per-head metrics (L x H), 4 per-layer metrics and
 * 5 scalars, 1205 floats. Measures begin + fill + commit (what the training
 * loop pays) with: no daemon (spool only), an unreachable daemon (spooling,
 * reconnect attempts), a fake daemon in this process that reads and acks,
 * and (third argument: its socket path) a real entropyd.
 * Steps are paced (a busy wait between them stands in for the training
 * compute) so the sender keeps up, as it does at real step rates. Also
 * measures the sender thread's own throughput (format + spool) on a burst.
 *
 * Not a daemon benchmark: entropyd's ingest has its own (bench/ingest.sh).
 */
#include "telemetry.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

enum { L = 12, H = 12, NHEAD = 8, NLAYER = 4, NSCALAR = 5 };
static const char *head_names[NHEAD] = {"entropy",       "entropy_norm", "max_logit", "sigma_qk",
                                        "entropy_bound", "eig_mean",     "eig_var",   "attn_sink"};
static const char *layer_names[NLAYER] = {"rank_ratio", "cos_sim", "sigma_w", "gamma"};
static const char *scalar_names[NSCALAR] = {"loss", "lr", "grad_norm", "tokens_per_s", "eval_loss"};
static float headv[NHEAD][L * H], layerv[NLAYER][L];

static uint64_t ns_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* What the training loop does once per logged step. */
static int enqueue_step(telemetry *t, int64_t step) {
    telemetry_step *s = telemetry_step_begin(t, step, telemetry_now());
    if (!s) return -1;
    for (int i = 0; i < NSCALAR; i++) telemetry_step_scalar(s, scalar_names[i], 2.0 + 1e-3 * (double)step);
    for (int i = 0; i < NLAYER; i++) telemetry_step_layer(s, layer_names[i], layerv[i]);
    for (int i = 0; i < NHEAD; i++) telemetry_step_heads(s, head_names[i], headv[i]);
    return telemetry_step_commit(t, s);
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* ---------------------------------------------------------------- fake daemon */

typedef struct fake {
    char path[108];
    int lfd;
    atomic_int stop;
    pthread_t th;
} fake;

static void *fake_main(void *arg) {
    fake *f = arg;
    char *buf = malloc(1 << 20);
    while (!atomic_load(&f->stop)) {
        struct pollfd p = {f->lfd, POLLIN, 0};
        if (poll(&p, 1, 20) <= 0) continue;
        int fd = accept(f->lfd, NULL, NULL);
        if (fd < 0) continue;
        long long lines = 0, acked = 0;
        int welcomed = 0;
        while (!atomic_load(&f->stop)) {
            struct pollfd q = {fd, POLLIN, 0};
            if (poll(&q, 1, 20) <= 0) continue;
            ssize_t r = recv(fd, buf, 1 << 20, 0);
            if (r <= 0) break;
            for (ssize_t i = 0; i < r; i++) lines += buf[i] == '\n';
            char out[128];
            int n = 0;
            if (!welcomed && lines >= 1) { /* the first line is the hello */
                n = snprintf(out, sizeof out, "{\"type\":\"welcome\",\"run_id\":1,\"last_seq\":0}\n");
                welcomed = 1;
            }
            if (welcomed && lines - 1 > acked) {
                acked = lines - 1;
                n += snprintf(out + n, sizeof out - (size_t)n, "{\"type\":\"ack\",\"seq\":%lld}\n", acked);
            }
            if (n && send(fd, out, (size_t)n, MSG_NOSIGNAL) < 0) break;
        }
        close(fd);
    }
    free(buf);
    return NULL;
}

static fake *fake_start(const char *path) {
    fake *f = calloc(1, sizeof *f);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(f->path, sizeof f->path, "%s", path);
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    unlink(path);
    f->lfd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (f->lfd < 0 || bind(f->lfd, (struct sockaddr *)&sa, sizeof sa) || listen(f->lfd, 4)) {
        perror("fake daemon");
        exit(1);
    }
    pthread_create(&f->th, NULL, fake_main, f);
    return f;
}

static void fake_stop(fake *f) {
    atomic_store(&f->stop, 1);
    pthread_join(f->th, NULL);
    close(f->lfd);
    unlink(f->path);
    free(f);
}

/* ---------------------------------------------------------------- runs */

static telemetry *make(const char *address, const char *spool) {
    telemetry_config c;
    telemetry_config_init(&c);
    c.address = address;
    c.run = "bench";
    c.layers = L;
    c.heads = H;
    c.seq_len = 256;
    c.spool_dir = spool;
    c.queue_slots = 256;
    c.meta_json = "{\"bench\":\"telemetry\"}";
    char err[256];
    telemetry *t = telemetry_create(&c, err, sizeof err);
    if (!t) {
        fprintf(stderr, "telemetry_create: %s\n", err);
        exit(1);
    }
    return t;
}

/* The same copying without the client, to tell the client's cost from the
 * machine's noise (preemption shows up in max and p99 of both). */
static float sink[NHEAD * L * H + NLAYER * L + NSCALAR];
static void copy_only(int64_t step) {
    float *p = sink;
    for (int i = 0; i < NSCALAR; i++) *p++ = 2.0f + 1e-3f * (float)step;
    for (int i = 0; i < NLAYER; i++) {
        memcpy(p, layerv[i], sizeof layerv[i]);
        p += L;
    }
    for (int i = 0; i < NHEAD; i++) {
        memcpy(p, headv[i], sizeof headv[i]);
        p += L * H;
    }
    __asm__ volatile("" ::"r"(sink) : "memory");
}

/* n paced steps; prints the enqueue cost distribution. With label
 * "baseline", times copy_only instead. */
static void run_paced(const char *label, const char *address, const char *spool, int n, int gap_us) {
    int baseline = !strncmp(label, "baseline", 8);
    telemetry *t = make(address, spool);
    if (address) telemetry_flush(t, 500); /* let it connect (or fail to) first */
    uint64_t *ns = malloc((size_t)n * sizeof *ns);
    int drops = 0;
    /* This thread's page faults and context switches over the loop: a
     * voluntary switch would mean the producer blocked somewhere. */
    struct rusage ru0, ru1;
    for (int i = 0; i < n; i++) ns[i] = 1; /* fault the timing array in first */
    getrusage(RUSAGE_THREAD, &ru0);
    for (int i = 0; i < n; i++) {
        uint64_t a = ns_now();
        if (baseline) copy_only(i);
        else drops += enqueue_step(t, i) != 0;
        uint64_t b = ns_now();
        ns[i] = b - a;
        while (ns_now() - b < (uint64_t)gap_us * 1000u) {} /* the "training step" */
    }
    getrusage(RUSAGE_THREAD, &ru1);
    uint64_t sum = 0;
    for (int i = 0; i < n; i++) sum += ns[i];
    qsort(ns, (size_t)n, sizeof *ns, cmp_u64);
    double mean = (double)sum / n;
    int settled = telemetry_flush(t, 5000) == TELEMETRY_OK;
    telemetry_stats st;
    telemetry_get_stats(t, &st);
    printf("  %-35s p50 %5llu ns  mean %6.0f  p99 %6llu  max %8llu ns  = %.4f%% (p50) of a 50 ms step;"
           " producer: %ld faults, %ld voluntary / %ld involuntary switches;"
           " dropped %d, spooled %llu, sent %llu, acked %llu%s\n",
           label, (unsigned long long)ns[n / 2], mean, (unsigned long long)ns[n * 99 / 100],
           (unsigned long long)ns[n - 1], (double)ns[n / 2] / 50e6 * 100,
           ru1.ru_minflt - ru0.ru_minflt + ru1.ru_majflt - ru0.ru_majflt, ru1.ru_nvcsw - ru0.ru_nvcsw,
           ru1.ru_nivcsw - ru0.ru_nivcsw, drops, (unsigned long long)st.spooled, (unsigned long long)st.sent,
           (unsigned long long)st.acked, address && !settled ? " (not all acknowledged)" : "");
    telemetry_destroy(t, NULL, 0);
    free(ns);
}

/* The sender's own cost: a burst of n steps into a large ring, timed until
 * all are formatted and spooled. */
static void run_burst(const char *spool, int n) {
    telemetry_config c;
    telemetry_config_init(&c);
    c.run = "bench-burst";
    c.layers = L;
    c.heads = H;
    c.seq_len = 256;
    c.spool_dir = spool;
    c.queue_slots = (size_t)n;
    char err[256];
    telemetry *t = telemetry_create(&c, err, sizeof err);
    if (!t) {
        fprintf(stderr, "telemetry_create: %s\n", err);
        exit(1);
    }
    uint64_t a = ns_now();
    for (int i = 0; i < n; i++) enqueue_step(t, i);
    uint64_t b = ns_now();
    telemetry_flush(t, 60000);
    uint64_t e = ns_now();
    telemetry_stats st;
    telemetry_get_stats(t, &st);
    double per = (double)(e - a) / n;
    printf("  sender (format + spool write):     %.1f us/step (%.0f steps/s), %.0f bytes/line,"
           " %.0f ns/float; burst enqueue %.0f ns/step\n",
           per / 1000, 1e9 / per, (double)st.spool_bytes / (double)st.spooled,
           per / (NHEAD * L * H + NLAYER * L + NSCALAR), (double)(b - a) / n);
    telemetry_destroy(t, NULL, 0);
}

/* The float formatter alone, against snprintf("%.9g"). */
static void run_format(void) {
    enum { N = 2000000 };
    char b[32];
    size_t total = 0;
    uint32_t x = 2463534242u;
    float *v = malloc(4096 * sizeof *v);
    for (int i = 0; i < 4096; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        v[i] = (float)(x % 1000000u) * 1e-4f; /* metric-like magnitudes */
    }
    uint64_t a = ns_now();
    for (int i = 0; i < N; i++) total += (size_t)telemetry_format_float(b, v[i & 4095]);
    uint64_t m = ns_now();
    for (int i = 0; i < N; i++) total += (size_t)snprintf(b, sizeof b, "%.9g", (double)v[i & 4095]);
    uint64_t e = ns_now();
    printf("  float formatting:                  telemetry_format_float %.1f ns, snprintf %%.9g %.1f ns"
           " (%zu chars)\n",
           (double)(m - a) / N, (double)(e - m) / N, total);
    free(v);
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 20000;
    int gap = argc > 2 ? atoi(argv[2]) : 100;
    for (int m = 0; m < NHEAD; m++)
        for (int k = 0; k < L * H; k++) headv[m][k] = 0.1f + (float)k * 0.0137f + (float)m * 0.71f;
    for (int m = 0; m < NLAYER; m++)
        for (int l = 0; l < L; l++) layerv[m][l] = 0.9f - (float)l * 0.031f + (float)m;
    char dir[32] = "/tmp/bench-telemetry-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    char spool[64], sock[64], addr[80], gone[80];
    snprintf(spool, sizeof spool, "%s/spool", dir);
    snprintf(sock, sizeof sock, "%s/d.sock", dir);
    snprintf(addr, sizeof addr, "unix:%s", sock);
    snprintf(gone, sizeof gone, "unix:%s/absent.sock", dir);

    printf("telemetry enqueue, %dx%d model: %d head + %d layer metrics + %d scalars = %d floats/step;"
           " %d steps, %d us of busy work between steps\n",
           L, H, NHEAD, NLAYER, NSCALAR, NHEAD * L * H + NLAYER * L + NSCALAR, n, gap);
    run_paced("baseline (same copies, no client):", NULL, spool, n, gap);
    run_paced("no daemon (spool only):", NULL, spool, n, gap);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", spool);
    if (system(cmd)) {}
    run_paced("daemon unreachable (spooling):", gone, spool, n, gap);
    if (system(cmd)) {}
    fake *f = fake_start(sock);
    run_paced("fake daemon attached (acks):", addr, spool, n, gap);
    fake_stop(f);
    if (system(cmd)) {}
    if (argc > 3) { /* a real entropyd, started by bench/telemetry.sh */
        char real[160];
        snprintf(real, sizeof real, "unix:%s", argv[3]);
        run_paced("entropyd attached (real daemon):", real, spool, n, gap);
        if (system(cmd)) {}
    }
    run_burst(spool, n < 5000 ? n : 5000);
    run_format();
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {}
    return 0;
}
