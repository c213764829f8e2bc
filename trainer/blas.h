/* blas.h - sigmatrain's dealings with OpenBLAS itself: choosing its kernels
 * and measuring the sgemm ceiling the trainer's GFLOP/s are judged against.
 *
 * What it is not: the matmuls (model.c calls cblas_* directly). */
#ifndef BLAS_H
#define BLAS_H

/* OpenBLAS 0.3.21's DYNAMIC_ARCH does not know recent Xeons and falls back
 * to its generic "Prescott" kernels, 3-5x slower.  The core type is read
 * once at library load, so the only fix from inside the program is to set
 * OPENBLAS_CORETYPE and exec the program again with argv: on success this
 * does not return.  It returns (and the slow kernels stay) when the user set
 * OPENBLAS_CORETYPE, the core is known, or the exec failed. */
void blas_fix_coretype(char **argv);

/* The OpenBLAS core name in use ("Haswell", ...); static storage. */
const char *blas_core_name(void);

/* sgemm GFLOP/s on 1024^3, best of several runs: *multi gets one call on
 * `threads` OpenBLAS threads, *concurrent `threads` concurrent
 * single-threaded calls (how the trainer uses it).  Returns the larger, or
 * 0 (both 0) when out of memory or threads is not in 1..256.  Leaves
 * OpenBLAS single-threaded. */
double blas_sgemm_peak(int threads, double *multi, double *concurrent);

/* One quick round of `threads` concurrent single-threaded 1024^3 sgemm
 * calls (3 each, ~0.1 s idle): returns their wall GFLOP/s and sets *cpu to
 * GFLOP per CPU-second of each thread, times threads (what the threads
 * reach while they hold a core: a figure the load of a shared machine
 * moves much less).  0 (both) when out of memory or threads is not in
 * 1..256.  For benchmarks that interleave the ceiling with their runs.
 * Leaves OpenBLAS single-threaded. */
double blas_sgemm_concurrent(int threads, double *cpu);

#endif
