/* bench_probe.c -- cost of probe_compute against a training step, in one
 * process, on the benchmark config (L=4 H=4 C=128 T=128 B=16, σReparam).
 *
 * Interleaves training steps (forward + backward + AdamW, --threads 2 as
 * the trainer) with probe_compute calls and reports the median of each, for
 * the probe on 4 examples (the default) and on the whole batch.  CPU time
 * of the calling thread is reported too: on a shared machine wall time
 * includes waiting for a core.
 * Usage: bench_probe [reps=30] [threads=2] [reparam: sigma|none]. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model.h"
#include "optim.h"
#include "probe.h"

static double now(clockid_t c)
{
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 30, threads = argc > 2 ? atoi(argv[2]) : 2;
    int reparam = argc > 3 && !strcmp(argv[3], "none") ? MODEL_REPARAM_NONE : MODEL_REPARAM_SIGMA;
    if (reps < 3) reps = 3;
    enum { B = 16, T = 128 };
    model_config cfg = {.vocab = 64, .max_seq = T, .layers = 4, .heads = 4, .dim = 128,
                        .norm = MODEL_NORM_PRE, .reparam = reparam, .gamma_init = MODEL_GAMMA_SIGMA};
    model *m = model_create(&cfg, B, T, threads);
    optim *o = m ? optim_create(OPTIM_ADAMW, m->num_params, 0.9f, 0.95f, 1e-8f, 0.0f) : NULL;
    probe *p4 = m ? probe_create(m, &(probe_config){.examples = 4}) : NULL;
    probe *pall = m ? probe_create(m, &(probe_config){.examples = 0}) : NULL;
    int *in = malloc(sizeof(int) * B * T), *tg = malloc(sizeof(int) * B * T);
    double *st = malloc(sizeof(double) * reps * 5);
    if (!m || !o || !p4 || !pall || !in || !tg || !st) { fprintf(stderr, "bench_probe: out of memory\n"); return 1; }
    uint64_t rng = 1;
    model_init(m, &rng);
    optim_group g = {.offset = 0, .n = m->num_params, .decay = 0, .frozen = 0};
    double *step = st, *w4 = st + reps, *c4 = st + 2 * reps, *wall = st + 3 * reps, *call = st + 4 * reps;
    for (int r = -3; r < reps; r++) {
        for (int i = 0; i < B * T; i++) { in[i] = (int)(model_random_u32(&rng) % 64); tg[i] = (in[i] + 1) % 64; }
        double t0 = now(CLOCK_MONOTONIC);
        model_forward(m, in, tg, B, T, 1);
        double t1 = now(CLOCK_MONOTONIC), c1 = now(CLOCK_THREAD_CPUTIME_ID);
        probe_compute(p4, m);
        double t2 = now(CLOCK_MONOTONIC), c2 = now(CLOCK_THREAD_CPUTIME_ID);
        probe_compute(pall, m);
        double t3 = now(CLOCK_MONOTONIC), c3 = now(CLOCK_THREAD_CPUTIME_ID);
        model_zero_grad(m);
        model_backward(m);
        optim_clip(m->grads_memory, m->num_params, 1.0f);
        optim_step(o, m->params_memory, m->grads_memory, &g, 1, 1e-3f);
        double t4 = now(CLOCK_MONOTONIC);
        if (r < 0) continue; /* warm-up */
        step[r] = (t1 - t0) + (t4 - t3);
        w4[r] = t2 - t1; c4[r] = c2 - c1;
        wall[r] = t3 - t2; call[r] = c3 - c2;
    }
    double ms = median(step, reps) * 1e3, p4w = median(w4, reps) * 1e3, p4c = median(c4, reps) * 1e3;
    double paw = median(wall, reps) * 1e3, pac = median(call, reps) * 1e3;
    printf("bench_probe: L=4 H=4 C=128 T=128 B=16 reparam=%s threads=%d, median of %d\n",
           reparam ? "sigma" : "none", threads, reps);
    printf("  training step (forward+backward+AdamW): %.2f ms\n", ms);
    printf("  probe, 4 examples : %.3f ms wall, %.3f ms cpu = %.2f%% of a step\n", p4w, p4c, 100 * p4w / ms);
    printf("  probe, 16 examples: %.3f ms wall, %.3f ms cpu = %.2f%% of a step\n", paw, pac, 100 * paw / ms);
    probe_destroy(p4);
    probe_destroy(pall);
    optim_destroy(o);
    model_destroy(m);
    free(in); free(tg); free(st);
    return 0;
}
