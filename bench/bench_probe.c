/* bench_probe.c -- cost of probe_compute against a training step, in one
 * process (L=4, T=128, B=16, σReparam by default; heads and width chosen on
 * the command line, so the d x d work of the certified norms can be measured
 * at d = 12 and d = 32).
 *
 * Interleaves training steps (forward + backward + AdamW) with
 * probe_compute calls, so the weights move between calls as in training
 * (the probe's warm starts see real drift), and reports the median of each.
 * CPU time of the calling thread is reported beside wall time: on a shared
 * machine wall time includes waiting for a core (run with threads=1 for a
 * CPU figure that covers the whole probe).
 *
 * A/B: when an older probe is linked in under the names probe_base_create,
 * probe_base_compute and probe_base_destroy (bench/probe.sh does it from a
 * git revision), both probes run on the same forward of every step, in
 * alternating order, and their figures are printed side by side.
 *
 * Usage: bench_probe [reps=30] [threads=2] [reparam: sigma|none] [heads=4]
 *                    [dim=128] [examples=4]. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model.h"
#include "optim.h"
#include "probe.h"

/* The older probe of an A/B run; absent (NULL) in the plain build. */
probe *probe_base_create(const model *m, const probe_config *cfg) __attribute__((weak));
const probe_metrics *probe_base_compute(probe *p, model *m) __attribute__((weak));
void probe_base_destroy(probe *p) __attribute__((weak));

static double now(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* One probe call's wall and thread-CPU seconds into wall[r], cpu[r]. */
static void timed(const probe_metrics *(*fn)(probe *, model *), probe *p, model *m, double *wall, double *cpu) {
    double t0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_THREAD_CPUTIME_ID);
    fn(p, m);
    *wall = now(CLOCK_MONOTONIC) - t0;
    *cpu = now(CLOCK_THREAD_CPUTIME_ID) - c0;
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 30, threads = argc > 2 ? atoi(argv[2]) : 2;
    int reparam = argc > 3 && !strcmp(argv[3], "none") ? MODEL_REPARAM_NONE : MODEL_REPARAM_SIGMA;
    int heads = argc > 4 ? atoi(argv[4]) : 4, dim = argc > 5 ? atoi(argv[5]) : 128;
    int examples = argc > 6 ? atoi(argv[6]) : 4;
    if (reps < 3) reps = 3;
    if (heads < 1 || dim < heads || dim % heads) {
        fprintf(stderr, "bench_probe: dim must be a multiple of heads\n");
        return 2;
    }
    int ab = probe_base_create && probe_base_compute && probe_base_destroy;
    enum { B = 16, T = 128 };
    model_config cfg = {.vocab = 64,
                        .max_seq = T,
                        .layers = 4,
                        .heads = heads,
                        .dim = dim,
                        .norm = MODEL_NORM_PRE,
                        .reparam = reparam,
                        .gamma_init = MODEL_GAMMA_SIGMA};
    probe_config pc = {.examples = examples};
    model *m = model_create(&cfg, B, T, threads);
    optim *o = m ? optim_create(OPTIM_ADAMW, m->num_params, 0.9f, 0.95f, 1e-8f, 0.0f) : NULL;
    probe *pn = m ? probe_create(m, &pc) : NULL;
    probe *pb = m && ab ? probe_base_create(m, &pc) : NULL;
    int *in = malloc(sizeof(int) * B * T), *tg = malloc(sizeof(int) * B * T);
    double *st = malloc(sizeof(double) * reps * 5);
    if (!m || !o || !pn || (ab && !pb) || !in || !tg || !st) {
        fprintf(stderr, "bench_probe: out of memory\n");
        return 1;
    }
    uint64_t rng = 1;
    model_init(m, &rng);
    optim_group g = {.offset = 0, .n = m->num_params, .decay = 0, .frozen = 0};
    double *step = st, *wn = st + reps, *cn = st + 2 * reps, *wb = st + 3 * reps, *cb = st + 4 * reps;
    for (int r = -3; r < reps; r++) {
        for (int i = 0; i < B * T; i++) {
            in[i] = (int)(model_random_u32(&rng) % 64);
            tg[i] = (in[i] + 1) % 64;
        }
        double t0 = now(CLOCK_MONOTONIC);
        model_forward(m, in, tg, B, T, 1);
        double t1 = now(CLOCK_MONOTONIC), w = 0, c = 0, w2 = 0, c2 = 0;
        /* alternate the order, so neither probe always runs on a warm cache */
        if (ab && r % 2) timed(probe_base_compute, pb, m, &w2, &c2);
        timed(probe_compute, pn, m, &w, &c);
        if (ab && !(r % 2)) timed(probe_base_compute, pb, m, &w2, &c2);
        double t2 = now(CLOCK_MONOTONIC);
        model_zero_grad(m);
        model_backward(m);
        optim_clip(m->grads_memory, m->num_params, 1.0f);
        optim_step(o, m->params_memory, m->grads_memory, &g, 1, 1e-3f);
        double t3 = now(CLOCK_MONOTONIC);
        if (r < 0) continue; /* warm-up */
        step[r] = (t1 - t0) + (t3 - t2);
        wn[r] = w;
        cn[r] = c;
        wb[r] = w2;
        cb[r] = c2;
    }
    double ms = median(step, reps) * 1e3, nw = median(wn, reps) * 1e3, nc = median(cn, reps) * 1e3;
    double bw = median(wb, reps) * 1e3, bc = median(cb, reps) * 1e3;
    printf("bench_probe: L=4 H=%d C=%d (d=%d) T=%d B=%d reparam=%s threads=%d examples=%d, median of %d\n", heads, dim,
           dim / heads, T, B, reparam ? "sigma" : "none", threads, examples, reps);
    printf("  training step (forward+backward+AdamW): %.2f ms\n", ms);
    printf("  probe       : %.3f ms wall, %.3f ms cpu = %.2f%% of a step\n", nw, nc, 100 * nw / ms);
    if (ab)
        printf("  probe (base): %.3f ms wall, %.3f ms cpu = %.2f%% of a step; cpu now/base %.3f\n", bw, bc,
               100 * bw / ms, nc / bc);
    probe_destroy(pn);
    if (ab) probe_base_destroy(pb);
    optim_destroy(o);
    model_destroy(m);
    free(in);
    free(tg);
    free(st);
    return 0;
}
