/* stream_steps.c -- the smallest program that streams to entropyd.
 *
 *   stream_steps ADDRESS RUN [STEPS]     e.g. stream_steps unix:/tmp/d/entropyd.sock demo 5
 *
 * Built from outside the tree with
 *   cc stream_steps.c $(pkg-config --cflags --libs entropyd_telemetry) -o stream_steps
 * It opens a run of 2 layers x 2 heads, logs STEPS steps (a loss scalar and
 * the per-head entropy, one of them NaN to show how a non-finite value
 * travels: as null, stored as NaN), ends the run and waits (at most 30 s,
 * reconnecting) until the daemon acknowledged everything.  `entropy` alone
 * is enough for the collapse rules and the verdict: the daemon derives
 * entropy_norm from it and the hello's seq_len (docs/metrics.md).  Exit
 * status 0 when everything was acknowledged, 1 otherwise (the rest is
 * spooled); 1 at once when the daemon refuses the run (its name taken by a
 * run of another shape).
 */
#include <entropyd/telemetry.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s ADDRESS RUN [STEPS]\n", argv[0]);
        return 2;
    }
    int steps = argc > 3 ? atoi(argv[3]) : 5;
    telemetry_config cfg;
    telemetry_config_init(&cfg);
    cfg.address = argv[1];
    cfg.run = argv[2];
    cfg.layers = 2;
    cfg.heads = 2;
    cfg.seq_len = 16;
    cfg.meta_json = "{\"example\":\"stream_steps\"}";
    char err[256];
    telemetry *t = telemetry_create(&cfg, err, sizeof err);
    if (!t) {
        fprintf(stderr, "stream_steps: %s\n", err);
        return 1;
    }
    /* the daemon's answer to the hello; no daemon yet (ETIMEDOUT, at once)
     * is fine: the steps are spooled and sent when it comes */
    if (telemetry_wait_welcome(t, 5000, err, sizeof err) == TELEMETRY_EREFUSED) {
        fprintf(stderr, "stream_steps: %s\n", err);
        telemetry_destroy(t, NULL, 0);
        return 1;
    }
    for (int step = 0; step < steps; step++) {
        float entropy[4] = {2.0f, 1.5f, 1.0f - 0.1f * (float)step, step == 1 ? NAN : 0.5f};
        telemetry_step *s = telemetry_step_begin(t, step, telemetry_now());
        if (!s) continue; /* queue full: dropped and counted, never blocks */
        telemetry_step_scalar(s, "loss", 3.0 / (step + 1));
        telemetry_step_heads(s, "entropy", entropy);
        telemetry_step_commit(t, s);
    }
    telemetry_event(t, "info", "stream_steps done");
    int rc = telemetry_finish(t, "finished", 30000, stderr);
    printf("stream_steps: run %s, %d steps, %s\n", argv[2], steps,
           rc == TELEMETRY_OK ? "all acknowledged" : "not all acknowledged (spooled)");
    return rc == TELEMETRY_OK ? 0 : 1;
}
