/* blas.c - the OpenBLAS core-type fix and the sgemm ceiling (see blas.h). */
#include "blas.h"

#include <cblas.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "now.h"

void blas_fix_coretype(char **argv) {
    if (getenv("OPENBLAS_CORETYPE")) return;
    const char *core = openblas_get_corename();
    if (!core || strcmp(core, "Prescott") != 0) return;
    const char *want = NULL;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512bf16")) want = "Cooperlake";
    else if (__builtin_cpu_supports("avx512f")) want = "SkylakeX";
    else if (__builtin_cpu_supports("avx2")) want = "Haswell";
    if (!want) return;
    setenv("OPENBLAS_CORETYPE", want, 1);
    execv("/proc/self/exe", argv);
    /* exec failed: carry on with the slow kernels */
}

const char *blas_core_name(void) { return openblas_get_corename(); }

typedef struct {
    const float *a, *b;
    float *c;
    int n, reps;
    double seconds, cpu_seconds;
} gemm_job;

static double thread_cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *gemm_worker(void *arg) {
    gemm_job *j = arg;
    double t = now_mono_ms() / 1e3, c = thread_cpu_seconds();
    for (int r = 0; r < j->reps; r++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->n, j->n, j->n, 1.0f, j->a, j->n, j->b, j->n, 0.0f, j->c,
                    j->n);
    j->seconds = now_mono_ms() / 1e3 - t;
    j->cpu_seconds = thread_cpu_seconds() - c;
    return NULL;
}

enum { PEAK_N = 1024, MAX_THREADS = 256 };

/* Operands of the 1024^3 products, c with one (N, N) block per thread. */
typedef struct {
    float *a, *b, *c;
} peak_buffers;

static int peak_alloc(peak_buffers *p, int threads) {
    size_t nn = (size_t)PEAK_N * PEAK_N;
    p->a = malloc(sizeof(float) * nn);
    p->b = malloc(sizeof(float) * nn);
    p->c = malloc(sizeof(float) * nn * (size_t)threads);
    if (!p->a || !p->b || !p->c) return -1;
    for (size_t i = 0; i < nn; i++) {
        p->a[i] = (float)(i % 7) * 0.1f;
        p->b[i] = (float)(i % 5) * 0.1f;
    }
    return 0;
}

static void peak_free(peak_buffers *p) {
    free(p->a);
    free(p->b);
    free(p->c);
}

/* One round of `threads` concurrent single-threaded calls (3 each): wall
 * GFLOP/s, and *cpu GFLOP per CPU-second of each thread times threads. */
static double concurrent_round(const peak_buffers *p, int threads, double *cpu) {
    gemm_job jobs[MAX_THREADS];
    pthread_t th[MAX_THREADS];
    size_t nn = (size_t)PEAK_N * PEAK_N;
    openblas_set_num_threads(1);
    double t = now_mono_ms() / 1e3, cpu_s = 0.0;
    int started = 0;
    for (; started < threads; started++) {
        jobs[started] = (gemm_job){p->a, p->b, p->c + nn * started, PEAK_N, 3, 0.0, 0.0};
        if (pthread_create(&th[started], NULL, gemm_worker, &jobs[started]) != 0) break;
    }
    for (int k = 0; k < started; k++) {
        pthread_join(th[k], NULL);
        cpu_s += jobs[k].cpu_seconds;
    }
    t = now_mono_ms() / 1e3 - t;
    double flops = started * 3 * 2.0 * PEAK_N * PEAK_N * PEAK_N;
    *cpu = cpu_s > 0 ? flops / cpu_s * started / 1e9 : 0.0;
    return flops / t / 1e9;
}

double blas_sgemm_concurrent(int threads, double *cpu) {
    peak_buffers p = {0};
    double g = 0.0;
    *cpu = 0.0;
    if (threads >= 1 && threads <= MAX_THREADS && peak_alloc(&p, threads) == 0) g = concurrent_round(&p, threads, cpu);
    peak_free(&p);
    return g;
}

double blas_sgemm_peak(int threads, double *multi, double *concurrent) {
    peak_buffers p = {0};
    *multi = *concurrent = 0.0;
    if (threads < 1 || threads > MAX_THREADS || peak_alloc(&p, threads) != 0) goto out;
    openblas_set_num_threads(threads);
    for (int rep = 0; rep < 8; rep++) {
        gemm_job j = {p.a, p.b, p.c, PEAK_N, 1, 0.0, 0.0};
        gemm_worker(&j);
        double g = 2.0 * PEAK_N * PEAK_N * PEAK_N / j.seconds / 1e9;
        if (g > *multi) *multi = g;
    }
    for (int rep = 0; rep < 3; rep++) {
        double cpu, g = concurrent_round(&p, threads, &cpu);
        if (g > *concurrent) *concurrent = g;
    }
out:
    openblas_set_num_threads(1);
    peak_free(&p);
    return *multi > *concurrent ? *multi : *concurrent;
}
