/* bench_http_gen: writes a benchmark database straight through store.h (no
 * daemon, no socket), exactly as the writer thread would store it, with
 * rollups. Two finished runs of STEPS steps each:
 *   1 "bench": 2 layers x 2 heads, a scalar "loss" and a head metric "entropy";
 *   2 "bench12": 1 layer x 12 heads, the head metric "entropy" (for the
 *     split=head figure: every head of a layer in one request).
 *
 *   bench_http_gen DB [STEPS (default 1000000)]
 *
 * Prints the run ids and the time taken. */
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

/* Writes run `name` of L x H heads (at most 64 cells) over `steps` steps,
 * with "loss" when with_loss. Returns 0, or -1 with the store's message. */
static int gen_run(struct store *st, const char *name, int L, int H, int with_loss, long steps) {
    double t0 = now();
    char conflict[80];
    struct store_run_info info;
    int cells = L * H, off = with_loss ? 1 : 0;
    struct proto_metric met[2] = {
        {.name = "loss", .kind = PROTO_SCALAR, .rows = 1, .cols = 1, .offset = 0},
        {.name = "entropy", .kind = PROTO_HEAD, .rows = (uint32_t)L, .cols = (uint32_t)H, .offset = (uint32_t)off},
    };
    float vals[1 + 64];
    struct proto_msg m = {.type = PROTO_STEP,
                          .has_seq = 1,
                          .nmetrics = 1 + off,
                          .metrics = met + 1 - off,
                          .nvalues = (uint32_t)(cells + off),
                          .values = vals};
    if (store_begin(st) || store_run_open(st, name, L, H, 64, "{\"bench\":true}", t0, &info)) return -1;
    for (long s = 0; s < steps; s++) {
        if (with_loss) vals[0] = (float)(3.0 * exp(-s / 2e5) + 0.01 * sin(s * 0.1));
        for (int c = 0; c < cells; c++)
            vals[off + c] = (float)(2.0 + sin(s * 1e-4 + c) + ((s + c) % 9973 == 0 ? -1.5 : 0));
        m.step = s;
        m.seq = s + 1;
        if (store_step(st, info.id, s + 1, &m, t0 + s * 0.01, conflict, sizeof conflict) < 0) return -1;
        if (s % 50000 == 49999 && (store_commit(st) || store_begin(st))) return -1;
    }
    if (store_run_status(st, info.id, PROTO_FINISHED, 0, now()) || store_commit(st)) return -1;
    printf("bench_http_gen: run %lld \"%s\" (%d x %d heads), %ld steps written in %.1f s\n", (long long)info.id, name,
           L, H, steps, now() - t0);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_http_gen DB [STEPS]\n");
        return 2;
    }
    long steps = argc > 2 ? atol(argv[2]) : 1000000;
    char err[512];
    struct store *st = store_open(argv[1], err, sizeof err);
    if (!st) {
        fprintf(stderr, "bench_http_gen: %s\n", err);
        return 1;
    }
    if (gen_run(st, "bench", 2, 2, 1, steps) || gen_run(st, "bench12", 1, 12, 0, steps)) {
        fprintf(stderr, "bench_http_gen: %s\n", store_errmsg(st));
        store_close(st);
        return 1;
    }
    store_close(st);
    return 0;
}
