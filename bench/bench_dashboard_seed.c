/* bench_dashboard_seed.c: writes one synthetic run straight into an
 * entropyd database through the store API (daemon/store.h), for the
 * dashboard benchmark (bench/dashboard.sh): much faster than streaming it
 * over the socket, and the same rows and rollups the daemon would write.
 *
 * The run looks like a sigmatrain run: head metrics entropy, entropy_norm,
 * entropy_bound, sigma_qk, max_logit, eig_mean, eig_var (and with
 * --head-metrics 8 and 9 logit_scale and attn_sink: the 9 head metrics of
 * bench/live.sh's 12x12x9 run); layer metrics
 * rank_ratio, sigma_qkv, gamma_qkv; scalars loss, lr, eval_loss (every 100
 * steps). Not a test of the store: it only fills it.
 *
 * usage: bench_dashboard_seed --db PATH [--layers 12] [--heads 12]
 *        [--steps 100000] [--head-metrics 7] [--run NAME] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "seed.h"
#include "store.h"

static const char *const HEAD_NAMES[] = {"entropy",  "entropy_norm", "entropy_bound", "sigma_qk", "max_logit",
                                         "eig_mean", "eig_var",      "logit_scale",   "attn_sink"};
static const char *const LAYER_NAMES[] = {"rank_ratio", "sigma_qkv", "gamma_qkv"};

struct dash_gen {
    long L, H, nhead;
};

/* A step that looks like sigmatrain's (the file's comment). */
static void dash_step(void *ctx, struct proto_msg *m, long s, long steps) {
    const struct dash_gen *g = ctx;
    const double logT = log(256.0);
    long L = g->L, H = g->H;
    float *v = m->values;
    /* entropy_norm per head: slow decay, a per-head level, a little noise */
    for (long k = 0; k < g->nhead; k++) {
        float *o = v + seed_add_metric(m, HEAD_NAMES[k], PROTO_HEAD, (uint32_t)L, (uint32_t)H);
        for (long l = 0; l < L; l++)
            for (long h = 0; h < H; h++) {
                double base = 0.5 + 0.4 * pow(cos(0.7 * l + 1.3 * h), 2);
                double n = base * (1 - 0.2 * s / (double)steps) + 0.02 * sin(s / 50.0 + h);
                if (l == 0 && s > steps / 2) n *= exp(-(s - steps / 2) / (steps / 10.0));
                double x;
                switch (k) {
                case 0: x = n * logT * 0.9; break;
                case 1: x = n; break;
                case 2: x = n * logT * 0.5; break;
                case 3: x = 1 + 5.0 * s / steps + 0.3 * l; break;
                case 4: x = 3 + 20.0 * s / steps + h; break;
                case 5: x = 0.1 * sin(h + l); break;
                case 6: x = 0.05 + 0.01 * h; break;
                case 7: x = 4 + 20.0 * s / steps + 0.5 * l; break;
                default: x = 0.1 + 0.3 * (1 - n); break;
                }
                o[l * H + h] = (float)x;
            }
    }
    for (int k = 0; k < 3; k++) {
        float *o = v + seed_add_metric(m, LAYER_NAMES[k], PROTO_LAYER, (uint32_t)L, 1);
        for (long l = 0; l < L; l++)
            o[l] = (float)(k == 0 ? 0.9 - 0.02 * l - 0.3 * s / steps : k == 1 ? 1 + 0.1 * l + s / 1e5 : 1 - 0.05 * l);
    }
    v[seed_add_metric(m, "loss", PROTO_SCALAR, 1, 1)] =
        (float)(4 * exp(-s / (steps / 5.0)) + 1.5 + 0.05 * sin((double)s));
    v[seed_add_metric(m, "lr", PROTO_SCALAR, 1, 1)] = (float)(1e-3 * (s < 1000 ? s / 1000.0 : 1.0));
    if (s % 100 == 0)
        v[seed_add_metric(m, "eval_loss", PROTO_SCALAR, 1, 1)] = (float)(4 * exp(-s / (steps / 5.0)) + 1.7);
}

int main(int argc, char **argv) {
    const char *db = NULL, *run = "bench-dashboard";
    long L = 12, H = 12, steps = 100000, nhead = 7;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--db")) db = argv[i + 1];
        else if (!strcmp(argv[i], "--layers")) L = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--heads")) H = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps")) steps = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--head-metrics")) nhead = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--run")) run = argv[i + 1];
        else {
            fprintf(stderr, "bench_dashboard_seed: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (!db || L < 1 || H < 1 || steps < 1 || nhead < 1 || nhead > 9) {
        fprintf(
            stderr,
            "usage: bench_dashboard_seed --db PATH [--layers L] [--heads H] [--steps N] [--head-metrics 1..9] [--run NAME]\n");
        return 2;
    }
    char err[512];
    struct store *st = store_open(db, err, sizeof err);
    if (!st) {
        fprintf(stderr, "bench_dashboard_seed: %s\n", err);
        return 1;
    }
    struct dash_gen g = {L, H, nhead};
    double t0 = seed_now();
    struct seed_spec spec = {.run = run,
                             .meta = "{\"reparam\":\"none\",\"norm\":\"post\",\"seed\":1,\"bench\":true}",
                             .layers = L,
                             .heads = H,
                             .steps = steps,
                             .max_metrics = 16,
                             .max_values = (uint32_t)(nhead * L * H + 3 * L + 3),
                             .t0 = t0,
                             .dt = 0.05,
                             .end_status = PROTO_FINISHED};
    int64_t id, values;
    int rc = seed_run(st, &spec, dash_step, &g, "bench_dashboard_seed", &id, &values) ? 1 : 0;
    if (!rc)
        printf("seeded run %lld: %ld steps, %ld x %ld heads, %ld head metrics, %.1f s\n", (long long)id, steps, L, H,
               nhead, seed_now() - t0);
    store_close(st);
    return rc;
}
