/* bench_http_gen: writes a benchmark database straight through store.h (no
 * daemon, no socket): one finished run "bench" of a 2-layer x 2-head model
 * with a scalar "loss" and a head metric "entropy" over STEPS steps, with
 * its rollups, exactly as the writer thread would store it.
 *
 *   bench_http_gen DB [STEPS (default 1000000)]
 *
 * Prints the run id and the time taken. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "store.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_http_gen DB [STEPS]\n");
        return 2;
    }
    long steps = argc > 2 ? atol(argv[2]) : 1000000;
    char err[512], conflict[80];
    struct store *st = store_open(argv[1], err, sizeof err);
    if (!st) {
        fprintf(stderr, "bench_http_gen: %s\n", err);
        return 1;
    }
    double t0 = now();
    struct store_run_info info;
    struct proto_metric met[2] = {
        {.name = "loss", .kind = PROTO_SCALAR, .rows = 1, .cols = 1, .offset = 0},
        {.name = "entropy", .kind = PROTO_HEAD, .rows = 2, .cols = 2, .offset = 1},
    };
    float vals[5];
    struct proto_msg m = {.type = PROTO_STEP, .has_seq = 1, .nmetrics = 2, .metrics = met, .nvalues = 5, .values = vals};
    if (store_begin(st) || store_run_open(st, "bench", 2, 2, 64, "{\"bench\":true}", t0, &info)) goto fail;
    for (long s = 0; s < steps; s++) {
        vals[0] = (float)(3.0 * exp(-s / 2e5) + 0.01 * sin(s * 0.1));
        for (int c = 0; c < 4; c++) vals[1 + c] = (float)(2.0 + sin(s * 1e-4 + c) + ((s + c) % 9973 == 0 ? -1.5 : 0));
        m.step = s;
        m.seq = s + 1;
        if (store_step(st, info.id, s + 1, &m, t0 + s * 0.01, conflict, sizeof conflict) < 0) goto fail;
        if (s % 50000 == 49999 && (store_commit(st) || store_begin(st))) goto fail;
    }
    if (store_run_status(st, info.id, PROTO_FINISHED, 0, now()) || store_commit(st)) goto fail;
    printf("bench_http_gen: run %lld, %ld steps written in %.1f s\n", (long long)info.id, steps, now() - t0);
    store_close(st);
    return 0;
fail:
    fprintf(stderr, "bench_http_gen: %s\n", store_errmsg(st));
    store_close(st);
    return 1;
}
