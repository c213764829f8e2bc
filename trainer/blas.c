/* blas.c - the OpenBLAS core-type fix and the sgemm ceiling (see blas.h). */
#include "blas.h"

#include <cblas.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "now.h"

void blas_fix_coretype(char **argv)
{
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

const char *blas_core_name(void)
{
    return openblas_get_corename();
}

typedef struct {
    const float *a, *b;
    float *c;
    int n, reps;
    double seconds;
} gemm_job;

static void *gemm_worker(void *arg)
{
    gemm_job *j = arg;
    double t = now_mono_ms() / 1e3;
    for (int r = 0; r < j->reps; r++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->n, j->n, j->n, 1.0f, j->a, j->n,
                    j->b, j->n, 0.0f, j->c, j->n);
    j->seconds = now_mono_ms() / 1e3 - t;
    return NULL;
}

double blas_sgemm_peak(int threads, double *multi, double *concurrent)
{
    enum { N = 1024, MAX_THREADS = 256 };
    size_t nn = (size_t)N * N;
    gemm_job jobs[MAX_THREADS];
    pthread_t th[MAX_THREADS];
    *multi = *concurrent = 0.0;
    if (threads < 1 || threads > MAX_THREADS) return 0.0;
    float *a = malloc(sizeof(float) * nn), *b = malloc(sizeof(float) * nn);
    float *c = malloc(sizeof(float) * nn * (size_t)threads);
    if (!a || !b || !c) goto out;
    for (size_t i = 0; i < nn; i++) { a[i] = (float)(i % 7) * 0.1f; b[i] = (float)(i % 5) * 0.1f; }
    openblas_set_num_threads(threads);
    for (int rep = 0; rep < 8; rep++) {
        gemm_job j = {a, b, c, N, 1, 0.0};
        gemm_worker(&j);
        double g = 2.0 * N * N * N / j.seconds / 1e9;
        if (g > *multi) *multi = g;
    }
    openblas_set_num_threads(1);
    for (int rep = 0; rep < 3; rep++) {
        double t = now_mono_ms() / 1e3;
        int started = 0;
        for (; started < threads; started++) {
            jobs[started] = (gemm_job){a, b, c + nn * started, N, 3, 0.0};
            if (pthread_create(&th[started], NULL, gemm_worker, &jobs[started]) != 0) break;
        }
        for (int k = 0; k < started; k++) pthread_join(th[k], NULL);
        t = now_mono_ms() / 1e3 - t;
        double g = started * 3 * 2.0 * N * N * N / t / 1e9;
        if (g > *concurrent) *concurrent = g;
    }
out:
    free(a);
    free(b);
    free(c);
    return *multi > *concurrent ? *multi : *concurrent;
}
