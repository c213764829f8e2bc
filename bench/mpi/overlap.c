/* overlap.c - would overlapping the gradient all-reduce with the backward
 * pay on this machine?  Built and run by bench/mpi.sh with mpicc (not by the
 * Makefile's bench rule: it needs MPI).  Each of 2 ranks, 1 thread each:
 *   comm    : MPI_Allreduce of N floats (sigmatrain's gradient size) alone;
 *   comp    : a compute phase standing in for the backward (sgemm-free:
 *             a fixed number of fused multiply-adds over a cache-resident
 *             array, tuned to take about 3x comm);
 *   overlap : MPI_Iallreduce started, the same compute, MPI_Wait;
 *   overlap+test: the same, calling MPI_Test every 1/64 of the compute (what
 *             a backward would do between layers to drive progress).
 * Hidden share = (comm + comp - overlap) / comm: 1 means the all-reduce was
 * free, 0 means nothing was hidden.  Medians of REPS repetitions.
 * usage: mpirun -np 2 overlap N REPS */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double work_sink;

/* About `units` x 64k multiply-adds on a 64 KiB array (stays in L2). */
static void compute(long units, int test_every, MPI_Request *req) {
    static float a[16384];
    float acc = 0.0f;
    for (long u = 0; u < units; u++) {
        for (int i = 0; i < 16384; i++) {
            a[i] = a[i] * 0.999f + 0.001f;
            acc += a[i];
        }
        if (test_every && req && u % test_every == 0) {
            int done;
            MPI_Test(req, &done, MPI_STATUS_IGNORE);
        }
    }
    work_sink += acc;
}

static int cmp(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    long n = argc > 1 ? atol(argv[1]) : 826129;
    int reps = argc > 2 ? atoi(argv[2]) : 20;
    if (n < 1 || reps < 1 || reps > 1000) MPI_Abort(MPI_COMM_WORLD, 2);
    float *g = malloc(sizeof(float) * (size_t)n);
    double *t[4];
    for (int k = 0; k < 4; k++) t[k] = malloc(sizeof(double) * (size_t)reps);
    if (!g || !t[0] || !t[1] || !t[2] || !t[3]) MPI_Abort(MPI_COMM_WORLD, 2);
    for (long i = 0; i < n; i++) g[i] = 1e-3f * (float)(i % 97);
    /* calibrate: comm time, then compute units for ~3x of it */
    double c = 0.0;
    for (int r = 0; r < 5; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        MPI_Allreduce(MPI_IN_PLACE, g, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        c += MPI_Wtime() - t0;
    }
    c /= 5;
    double t0 = MPI_Wtime();
    compute(64, 0, NULL);
    double per_unit = (MPI_Wtime() - t0) / 64;
    long units = (long)(3.0 * c / per_unit) + 1;
    MPI_Allreduce(MPI_IN_PLACE, &units, 1, MPI_LONG, MPI_MAX, MPI_COMM_WORLD); /* same work on both */
    for (int r = 0; r < reps; r++) {
        MPI_Request req;
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        MPI_Allreduce(MPI_IN_PLACE, g, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        t[0][r] = MPI_Wtime() - t0;
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        compute(units, 0, NULL);
        t[1][r] = MPI_Wtime() - t0;
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        MPI_Iallreduce(MPI_IN_PLACE, g, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req);
        compute(units, 0, NULL);
        MPI_Wait(&req, MPI_STATUS_IGNORE);
        t[2][r] = MPI_Wtime() - t0;
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        MPI_Iallreduce(MPI_IN_PLACE, g, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req);
        compute(units, units / 64 > 0 ? units / 64 : 1, &req);
        MPI_Wait(&req, MPI_STATUS_IGNORE);
        t[3][r] = MPI_Wtime() - t0;
    }
    double m[4];
    for (int k = 0; k < 4; k++) m[k] = median(t[k], reps);
    if (rank == 0)
        printf("overlap: %ld floats, medians of %d: all-reduce %.2f ms, compute %.2f ms, "
               "overlapped %.2f ms (hidden %.0f%% of the all-reduce), with MPI_Test %.2f ms (hidden %.0f%%)\n",
               n, reps, 1e3 * m[0], 1e3 * m[1], 1e3 * m[2], 100.0 * (m[0] + m[1] - m[2]) / m[0], 1e3 * m[3],
               100.0 * (m[0] + m[1] - m[3]) / m[0]);
    for (int k = 0; k < 4; k++) free(t[k]);
    free(g);
    MPI_Finalize();
    return work_sink == 12345.678 ? 1 : 0;
}
