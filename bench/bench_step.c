/* bench_step.c -- where a sigmatrain training step goes, and its share of
 * the sgemm ceiling measured beside it.
 *
 * Trains the model of the command line on random tokens, the step as the
 * trainer runs it (forward with its power steps, zero_grad, backward with
 * the gradient reduction, the global norm, AdamW, each phase split over the
 * model's threads), and times each phase.  Before every step and after the
 * last, one quick round of `threads` concurrent single-threaded 1024^3
 * sgemm calls (blas_sgemm_concurrent) measures the ceiling: a step's share
 * is its GFLOP/s over the mean of the two rounds around it, so a shared
 * machine's load, which changes by the second, hits both alike.  The
 * figures are medians over the steps.  "cpu share" divides the same FLOPs
 * by CPU seconds instead (the process's for the step, each thread's for
 * the ceiling), a figure that waiting for a core moves much less.
 *
 * Usage: bench_step layers heads dim seq_len batch [reparam: none|sigma|
 *        spectral] [steps=5] [threads=2]
 * Prints one "step:" line (see the printf at the end). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "blas.h"
#include "data.h"
#include "model.h"
#include "now.h"
#include "optim.h"

enum { PH_FORWARD, PH_ZERO, PH_BACKWARD, PH_NORM, PH_UPDATE, PH_COUNT };
static const char *phase_name[PH_COUNT] = {"forward", "zero", "backward", "norm", "update"};

static double wall(void) { return now_mono_ms() / 1e3; }

static double cpu(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + u.ru_stime.tv_sec + u.ru_stime.tv_usec * 1e-6;
}

/* The optimizer's two passes over the flat buffers, as sigmatrain runs them. */
typedef struct {
    optim *opt;
    model *m;
    optim_group groups[MODEL_NUM_PARAMS];
    int phase;
    double sumsq[256];
    float scale;
} update_task;

static void update_slice(void *ctx, int t, int nt) {
    update_task *u = ctx;
    size_t lo, hi;
    pool_split(t, nt, u->m->num_params, &lo, &hi);
    if (u->phase == 0) u->sumsq[t] = optim_sumsq(u->m->grads_memory, lo, hi);
    else
        optim_update(u->opt, u->m->params_memory, u->m->grads_memory, u->scale, u->groups, MODEL_NUM_PARAMS, 1e-4f, lo,
                     hi);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *x, int n) {
    qsort(x, n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* One step; adds each phase's wall time into ph. */
static void step(model *m, update_task *u, const int *in, const int *tg, int B, int T, double *ph) {
    double t = wall();
    model_forward(m, in, tg, B, T, 1);
    ph[PH_FORWARD] += wall() - t;
    t = wall();
    model_zero_grad(m);
    ph[PH_ZERO] += wall() - t;
    t = wall();
    model_backward(m);
    ph[PH_BACKWARD] += wall() - t;
    t = wall();
    u->phase = 0;
    model_parallel(m, update_slice, u);
    double ss = 0.0;
    for (int k = 0; k < m->nthreads; k++) ss += u->sumsq[k];
    float norm;
    u->scale = optim_clip_scale(ss, 1.0f, &norm);
    ph[PH_NORM] += wall() - t;
    t = wall();
    optim_begin_step(u->opt);
    u->phase = 1;
    model_parallel(m, update_slice, u);
    ph[PH_UPDATE] += wall() - t;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: bench_step layers heads dim seq_len batch [none|sigma|spectral] [steps] [threads]\n");
        return 2;
    }
    blas_fix_coretype(argv);
    int L = atoi(argv[1]), H = atoi(argv[2]), C = atoi(argv[3]), T = atoi(argv[4]), B = atoi(argv[5]);
    const char *rp = argc > 6 ? argv[6] : "sigma";
    int steps = argc > 7 ? atoi(argv[7]) : 5, threads = argc > 8 ? atoi(argv[8]) : 2;
    int reparam = !strcmp(rp, "none")       ? MODEL_REPARAM_NONE
                  : !strcmp(rp, "spectral") ? MODEL_REPARAM_SPECTRAL
                                            : MODEL_REPARAM_SIGMA;
    if (steps < 1 || steps > 1000) steps = 5;
    model_config cfg = {.vocab = DATA_SYNTH_VOCAB,
                        .max_seq = T,
                        .layers = L,
                        .heads = H,
                        .dim = C,
                        .norm = MODEL_NORM_PRE,
                        .reparam = reparam,
                        .gamma_init = MODEL_GAMMA_ONE};
    model *m = model_create(&cfg, B, T, threads);
    update_task u = {0};
    int *in = malloc(sizeof(int) * B * T), *tg = malloc(sizeof(int) * B * T);
    double *share = malloc(sizeof(double) * steps), *cshare = malloc(sizeof(double) * steps);
    double *tps = malloc(sizeof(double) * steps), *gf = malloc(sizeof(double) * steps);
    double *peak = malloc(sizeof(double) * (steps + 1)), *cpeak = malloc(sizeof(double) * (steps + 1));
    double *rshare = malloc(sizeof(double) * steps), *util = malloc(sizeof(double) * steps);
    int status = 1;
    if (!m || !in || !tg || !share || !cshare || !tps || !gf || !peak || !cpeak || !rshare || !util) {
        fprintf(stderr, "bench_step: cannot build the model (bad config or out of memory)\n");
        goto out;
    }
    u.m = m;
    u.opt = optim_create(OPTIM_ADAMW, m->num_params, 0.9f, 0.95f, 1e-8f, 0.0f);
    if (!u.opt) goto out;
    size_t off = 0;
    for (int i = 0; i < MODEL_NUM_PARAMS; i++) {
        u.groups[i] = (optim_group){off, m->param_sizes[i], 0, i == MODEL_GAMMA && reparam != MODEL_REPARAM_SIGMA};
        off += m->param_sizes[i];
    }
    uint64_t rng = 1;
    model_init(m, &rng);
    for (int i = 0; i < B * T; i++) {
        in[i] = model_random_u32(&rng) % cfg.vocab;
        tg[i] = model_random_u32(&rng) % cfg.vocab;
    }
    double ph[PH_COUNT] = {0}, flops = model_step_flops(&cfg, B, T), total = 0.0;
    step(m, &u, in, tg, B, T, ph); /* warm-up: first touch of every buffer */
    memset(ph, 0, sizeof ph);
    peak[0] = blas_sgemm_concurrent(threads, &cpeak[0]);
    for (int s = 0; s < steps; s++) {
        double r0 = m->reparam_seconds, t = wall(), c = cpu();
        step(m, &u, in, tg, B, T, ph);
        double dt = wall() - t, dc = cpu() - c;
        total += dt;
        peak[s + 1] = blas_sgemm_concurrent(threads, &cpeak[s + 1]);
        tps[s] = B * T / dt;
        gf[s] = flops / dt / 1e9;
        share[s] = gf[s] / (0.5 * (peak[s] + peak[s + 1]));
        cshare[s] = flops / dc * m->nthreads / 1e9 / (0.5 * (cpeak[s] + cpeak[s + 1]));
        rshare[s] = (m->reparam_seconds - r0) / dt;
        util[s] = dc / dt;
    }
    printf("step: L%d H%d C%d T%d B%d reparam %s threads %d steps %d | %.0f tok/s | %.1f GFLOP/s | "
           "peak %.1f GFLOP/s | share %.1f%% | cpu share %.1f%% | sreparam %.2f%% of step | "
           "cpu/wall %.2f |",
           L, H, C, T, B, rp, m->nthreads, steps, median(tps, steps), median(gf, steps), median(peak, steps + 1),
           100 * median(share, steps), 100 * median(cshare, steps), 100 * median(rshare, steps), median(util, steps));
    for (int p = 0; p < PH_COUNT; p++) printf(" %s %.1f%%", phase_name[p], 100 * ph[p] / total);
    printf("\n");
    status = 0;
out:
    optim_destroy(u.opt);
    model_destroy(m);
    free(in);
    free(tg);
    free(share);
    free(cshare);
    free(tps);
    free(gf);
    free(peak);
    free(cpeak);
    free(rshare);
    free(util);
    return status;
}
