/* bench_alert: cost of evaluating the default alert rules per committed
 * step of a 12 x 12 model with the 8 head metrics a sigmatrain run sends
 * (entropy, entropy_norm, entropy_bound, sigma_qk, max_logit, ...), plus
 * scalars. Prints microseconds per step; bench/alerts.sh compares it with
 * the ingest time per step measured in the same run. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alert.h"

#define L 12
#define H 12

static const char *heads[] = {"entropy",   "entropy_norm", "entropy_bound", "sigma_qk",
                              "max_logit", "eig_mean",     "eig_var",       "attn_rank"};

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 20000;
    char err[512];
    struct alert_rules *rules = alert_rules_load(NULL, err, sizeof err);
    if (!rules) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    struct alert_engine *e = alert_engine_create(rules);
    struct writer_item hello = {.kind = WRITER_HELLO, .run_id = 1, .time = 1};
    snprintf(hello.msg.run, sizeof hello.msg.run, "bench");
    hello.msg.layers = L;
    hello.msg.heads = H;
    alert_feed(e, &hello, hello.time);
    struct writer_item it = {.kind = WRITER_STEP, .run_id = 1};
    struct proto_msg *m = &it.msg;
    m->nmetrics = 8 + 2;
    m->metrics = calloc(m->nmetrics, sizeof *m->metrics);
    m->values = calloc(8 * L * H + 2, sizeof(float));
    for (int k = 0; k < 8; k++) {
        snprintf(m->metrics[k].name, sizeof m->metrics[k].name, "%s", heads[k]);
        m->metrics[k].kind = PROTO_HEAD;
        m->metrics[k].rows = L;
        m->metrics[k].cols = H;
        m->metrics[k].offset = (uint32_t)(k * L * H);
    }
    snprintf(m->metrics[8].name, sizeof m->metrics[8].name, "loss");
    m->metrics[8].kind = PROTO_SCALAR;
    m->metrics[8].rows = m->metrics[8].cols = 1;
    m->metrics[8].offset = 8 * L * H;
    snprintf(m->metrics[9].name, sizeof m->metrics[9].name, "lr");
    m->metrics[9].kind = PROTO_SCALAR;
    m->metrics[9].rows = m->metrics[9].cols = 1;
    m->metrics[9].offset = 8 * L * H + 1;
    m->nvalues = 8 * L * H + 2;
    unsigned r = 12345;
    struct timespec t0, t1, c0, c1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
    long transitions = 0;
    for (int s = 0; s < steps; s++) {
        /* a healthy run: each value near its own level, 2% noise */
        for (uint32_t i = 0; i < m->nvalues; i++) {
            r = r * 1664525u + 1013904223u;
            float level = 0.5f + 0.01f * (float)(i % 50);
            m->values[i] = level * (0.99f + 0.02f * (float)(r >> 8) / 16777216.0f);
        }
        m->step = s;
        it.time = 1000 + s * 0.1;
        int n = alert_feed(e, &it, it.time);
        if (n > 0) transitions += n;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
    double us = ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e3 / steps;
    double cpu = ((c1.tv_sec - c0.tv_sec) * 1e9 + (c1.tv_nsec - c0.tv_nsec)) / 1e3 / steps;
    /* the engine's own timer covers alert_feed only, not the data generation */
    struct alert_stats st;
    alert_get_stats(e, &st);
    printf("alerts: %d rules, %dx%d heads, 8 head metrics: %.2f us per step in the engine (%.2f us wall, %.2f us cpu "
           "per loop; %ld transitions)\n",
           rules->n, L, H, st.eval_ms * 1e3 / steps, us, cpu, transitions);
    free(m->metrics);
    free(m->values);
    alert_engine_destroy(e);
    alert_rules_free(rules);
    return 0;
}
