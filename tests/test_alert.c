/* test_alert.c: the alert rules parser and engine on recorded series.
 * Each rule kind fires and resolves at the step its definition says; `for`
 * and `keep_firing_for` are counted in steps; cells of one run and rule are
 * grouped into one alert; no duplicate FIRING; never RESOLVED without FIRING. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "alert.h"
#include "fixture_store.h"

#define L 2
#define H 3

/* A step item with one head metric (or scalar when kind is PROTO_SCALAR). */
static struct writer_item *mk_step(int64_t run, int64_t step, const char *name, int kind, const float *vals, int n) {
    struct writer_item *it = calloc(1, sizeof *it);
    it->kind = WRITER_STEP;
    it->run_id = run;
    it->time = 1000.0 + (double)step;
    it->msg.type = PROTO_STEP;
    it->msg.step = step;
    it->msg.nmetrics = 1;
    it->msg.metrics = calloc(1, sizeof *it->msg.metrics);
    snprintf(it->msg.metrics[0].name, sizeof it->msg.metrics[0].name, "%s", name);
    it->msg.metrics[0].kind = kind;
    it->msg.metrics[0].rows = kind == PROTO_HEAD ? L : 1;
    it->msg.metrics[0].cols = kind == PROTO_HEAD ? H : 1;
    it->msg.nvalues = (uint32_t)n;
    it->msg.values = malloc((size_t)n * sizeof(float));
    memcpy(it->msg.values, vals, (size_t)n * sizeof(float));
    return it;
}

/* A head metric (L x H values) added to a step item (tests/fixture_store.h). */
static void add_metric(struct writer_item *it, const char *name, const float *vals) {
    msg_add(&it->msg, name, PROTO_HEAD, L, H, vals);
}

static int feed(struct alert_engine *e, struct writer_item *it) {
    int n = alert_feed(e, it, it->time);
    writer_item_free(it);
    return n;
}

static void hello(struct alert_engine *e, int64_t run, const char *name) {
    struct writer_item *it = calloc(1, sizeof *it);
    it->kind = WRITER_HELLO;
    it->run_id = run;
    it->time = 1000;
    snprintf(it->msg.run, sizeof it->msg.run, "%s", name);
    it->msg.layers = L;
    it->msg.heads = H;
    assert_int_equal(feed(e, it), 0);
}

static struct alert_rules *rules(const char *json) {
    char err[512];
    struct alert_rules *r = alert_rules_parse(json, strlen(json), err, sizeof err);
    if (!r) fprintf(stderr, "rules: %s\n", err);
    assert_non_null(r);
    return r;
}

/* Feeds `steps` steps whose head values come from f(step, cell) and records
 * at which steps FIRING/RESOLVED/UPDATE transitions happened. */
struct log {
    int nfire, nresolve, nupdate;
    int64_t fire_step[16], resolve_step[16];
    int fire_cells[16];
    int64_t start_step[16];
};

static void record(struct alert_engine *e, int n, struct log *lg) {
    for (int i = 0; i < n; i++) {
        const struct alert_transition *t = alert_transition_at(e, i);
        assert_non_null(t);
        if (t->state == ALERT_FIRING) {
            assert_true(lg->nfire == lg->nresolve); /* no duplicate FIRING within an episode */
            lg->fire_cells[lg->nfire] = t->ncells;
            lg->start_step[lg->nfire] = t->start_step;
            lg->fire_step[lg->nfire++] = t->step;
        } else if (t->state == ALERT_RESOLVED) {
            assert_true(lg->nresolve < lg->nfire); /* never resolved without firing */
            lg->resolve_step[lg->nresolve++] = t->step;
        } else {
            lg->nupdate++;
        }
    }
}

static const char *below_rule =
    "{\"rules\":[{\"name\":\"collapse\",\"metric\":\"entropy_norm\",\"scope\":\"head\","
    "\"condition\":{\"op\":\"below\",\"value\":0.1},\"for\":5,\"keep_firing_for\":3,\"severity\":\"critical\","
    "\"labels\":{\"team\":\"ml\"},\"annotations\":{\"summary\":\"run {run} collapsed at {cells}\"}}]}";

static void test_below_for_and_keep_firing_for(void **state) {
    (void)state;
    struct alert_rules *r = rules(below_rule);
    struct alert_engine *e = alert_engine_create(r);
    hello(e, 1, "run-a");
    struct log lg = {0};
    /* head (1,2) is low from step 10 to step 29, healthy otherwise */
    for (int s = 0; s < 60; s++) {
        float v[L * H];
        for (int i = 0; i < L * H; i++) v[i] = 0.8f;
        if (s >= 10 && s < 30) v[1 * H + 2] = 0.01f;
        record(e, feed(e, mk_step(1, s, "entropy_norm", PROTO_HEAD, v, L * H)), &lg);
    }
    assert_int_equal(lg.nfire, 1);
    assert_int_equal(lg.fire_step[0], 15); /* held from 10; for 5 steps -> fires at 15 */
    assert_int_equal(lg.start_step[0], 10);
    assert_int_equal(lg.fire_cells[0], 1);
    assert_int_equal(lg.nresolve, 1);
    assert_int_equal(lg.resolve_step[0], 33); /* clear from 30; keep 3 -> resolves at 33 */
    alert_engine_destroy(e);
    alert_rules_free(r);
}

/* Steps far apart (2^31 and more from the first a rule saw, past the
 * 32 bits the cell state keeps them in) fire, start and resolve at the
 * exact steps, and the state then holds 12 bytes a cell more. */
static void test_steps_past_32_bits(void **state) {
    (void)state;
    struct alert_rules *r = rules(below_rule);
    struct alert_engine *e = alert_engine_create(r);
    hello(e, 1, "run-far");
    struct log lg = {0};
    const int64_t far = 7 + 3 * ((int64_t)1 << 31) + 5;
    float v[L * H];
    for (int i = 0; i < L * H; i++) v[i] = 0.8f;
    record(e, feed(e, mk_step(1, 7, "entropy_norm", PROTO_HEAD, v, L * H)), &lg);
    uint64_t runs, near_bytes, far_bytes;
    alert_engine_usage(e, &runs, &near_bytes);
    for (int64_t s = far; s < far + 10; s++) {
        v[1 * H + 2] = s < far + 6 ? 0.01f : 0.8f;
        record(e, feed(e, mk_step(1, s, "entropy_norm", PROTO_HEAD, v, L * H)), &lg);
        if (s == far) { /* before a cell fires (its listed cells cost 12 bytes each) */
            alert_engine_usage(e, &runs, &far_bytes);
            assert_int_equal(far_bytes - near_bytes, (uint64_t)L * H * 12);
        }
    }
    assert_int_equal(lg.nfire, 1);
    assert_int_equal(lg.start_step[0], far);
    assert_int_equal(lg.fire_step[0], far + 5);
    assert_int_equal(lg.nresolve, 1);
    assert_int_equal(lg.resolve_step[0], far + 9); /* clear from far + 6; keep 3 */
    alert_engine_destroy(e);
    alert_rules_free(r);
}

static void test_blip_shorter_than_for_does_not_fire(void **state) {
    (void)state;
    struct alert_rules *r = rules(below_rule);
    struct alert_engine *e = alert_engine_create(r);
    hello(e, 1, "run-a");
    struct log lg = {0};
    for (int s = 0; s < 40; s++) {
        float v[L * H];
        for (int i = 0; i < L * H; i++) v[i] = (s % 7 < 4) ? 0.01f : 0.9f; /* 4 low steps at a time */
        record(e, feed(e, mk_step(1, s, "entropy_norm", PROTO_HEAD, v, L * H)), &lg);
    }
    assert_int_equal(lg.nfire, 0);
    assert_int_equal(lg.nresolve, 0);
    alert_engine_destroy(e);
    alert_rules_free(r);
}

static void test_grouping_and_updates(void **state) {
    (void)state;
    struct alert_rules *r = rules(below_rule);
    struct alert_engine *e = alert_engine_create(r);
    hello(e, 1, "run-a");
    hello(e, 2, "run-b");
    struct log la = {0}, lb = {0};
    for (int s = 0; s < 50; s++) {
        float v[L * H];
        /* run a: heads 0 and 4 collapse together at 5, head 2 joins at 20 */
        for (int i = 0; i < L * H; i++) v[i] = 0.7f;
        if (s >= 5) v[0] = v[4] = 0.02f;
        if (s >= 20) v[2] = 0.03f;
        int n = feed(e, mk_step(1, s, "entropy_norm", PROTO_HEAD, v, L * H));
        if (n > 0 && s == 10) {
            const struct alert_transition *t = alert_transition_at(e, 0);
            assert_int_equal(t->ncells, 2); /* one alert lists both heads */
            assert_int_equal(t->cells[0].layer, 0);
            assert_int_equal(t->cells[0].head, 0);
            assert_int_equal(t->cells[1].layer, 1);
            assert_int_equal(t->cells[1].head, 1);
            assert_string_equal(t->run_name, "run-a");
            char *json = alert_transition_json(t);
            assert_non_null(strstr(json, "\"alertname\":\"collapse\""));
            assert_non_null(strstr(json, "\"team\":\"ml\""));
            assert_non_null(strstr(json, "run run-a collapsed at layer 0 head 0, layer 1 head 1"));
            assert_non_null(strstr(json, "\"endsAt\":\"0001-01-01T00:00:00Z\""));
            free(json);
        }
        record(e, n, &la);
        /* run b stays healthy */
        for (int i = 0; i < L * H; i++) v[i] = 0.6f;
        record(e, feed(e, mk_step(2, s, "entropy_norm", PROTO_HEAD, v, L * H)), &lb);
    }
    assert_int_equal(la.nfire, 1);
    assert_int_equal(la.fire_step[0], 10);
    assert_int_equal(la.nupdate, 1); /* head 2 joined at 25 */
    assert_int_equal(la.nresolve, 0);
    assert_int_equal(lb.nfire, 0);
    alert_engine_destroy(e);
    alert_rules_free(r);
}

static void test_end_resolves_and_json_resolved(void **state) {
    (void)state;
    struct alert_rules *r = rules(below_rule);
    struct alert_engine *e = alert_engine_create(r);
    hello(e, 7, "ending");
    struct log lg = {0};
    float v[L * H] = {0.01f, 0.01f, 0.01f, 0.01f, 0.01f, 0.01f};
    for (int s = 0; s < 10; s++) record(e, feed(e, mk_step(7, s, "entropy_norm", PROTO_HEAD, v, L * H)), &lg);
    assert_int_equal(lg.nfire, 1);
    struct writer_item *end = calloc(1, sizeof *end);
    end->kind = WRITER_END;
    end->run_id = 7;
    end->time = 2000;
    int n = alert_feed(e, end, end->time);
    assert_int_equal(n, 1);
    const struct alert_transition *t = alert_transition_at(e, 0);
    assert_int_equal(t->state, ALERT_RESOLVED);
    char *json = alert_transition_json(t);
    assert_non_null(strstr(json, "\"status\":\"resolved\""));
    assert_null(strstr(json, "0001-01-01"));
    free(json);
    writer_item_free(end);
    alert_engine_destroy(e);
    alert_rules_free(r);
}

static struct writer_item *mk_end(int64_t run, int status) {
    struct writer_item *it = calloc(1, sizeof *it);
    it->kind = WRITER_END;
    it->run_id = run;
    it->time = 3000;
    it->msg.status = status;
    return it;
}

/* The verdict: collapsing while the condition holds on a live
 * run (pending, then firing), collapsed from the step it began once the run
 * ends with it firing; the end's RESOLVED says run_ended; the engine holds
 * nothing of an ended run. A rule named entropy_collapse in a rules file
 * without "verdict" still stands for a collapse. */
static void test_verdict_collapse_outlives_the_run(void **state) {
    (void)state;
    struct alert_rules *r =
        rules("{\"rules\":[{\"name\":\"entropy_collapse\",\"metric\":\"entropy_norm\",\"scope\":\"head\","
              "\"condition\":{\"op\":\"below\",\"value\":0.1},\"for\":5,\"keep_firing_for\":3}]}");
    assert_int_equal(r->rules[0].verdict, ALERT_V_COLLAPSED);
    struct alert_engine *e = alert_engine_create(r);
    hello(e, 3, "run-v");
    const struct alert_verdict *v = alert_verdict_changed(e);
    assert_non_null(v); /* a hello reports the run's verdict: healthy */
    assert_int_equal(v->state, ALERT_V_HEALTHY);
    int changes = 0;
    for (int s = 0; s < 20; s++) {
        float x[L * H];
        for (int i = 0; i < L * H; i++) x[i] = 0.8f;
        if (s >= 4) x[0 * H + 2] = x[1 * H + 1] = 0.01f;
        feed(e, mk_step(3, s, "entropy_norm", PROTO_HEAD, x, L * H));
        v = alert_verdict_changed(e);
        if (s < 4) assert_null(v);
        if (s == 4) { /* pending from step 4 */
            assert_non_null(v);
            assert_int_equal(v->state, ALERT_V_COLLAPSING);
            assert_int_equal(v->since_step, 4);
            assert_int_equal(v->ncells, 2);
            assert_int_equal(v->cells[0].layer, 0);
            assert_int_equal(v->cells[0].head, 2);
            assert_int_equal(v->cells[1].layer, 1);
            assert_int_equal(v->cells[1].head, 1);
            assert_string_equal(v->rule->name, "entropy_collapse");
        }
        changes += v != NULL;
    }
    assert_int_equal(changes, 1); /* firing at 9 keeps the same state, step and heads: no change */
    struct writer_item *end = mk_end(3, PROTO_FINISHED);
    alert_feed(e, end, end->time);
    v = alert_verdict_changed(e);
    assert_non_null(v);
    assert_int_equal(v->state, ALERT_V_COLLAPSED);
    assert_int_equal(v->since_step, 4);
    assert_int_equal(v->ncells, 2);
    const struct alert_transition *t = alert_transition_at(e, 0);
    assert_non_null(t);
    assert_int_equal(t->state, ALERT_RESOLVED);
    assert_int_equal(t->reason, ALERT_REASON_RUN_ENDED);
    char *json = alert_transition_json(t);
    assert_non_null(strstr(json, "\"reason\":\"run_ended\""));
    free(json);
    uint64_t runs, bytes;
    alert_engine_usage(e, &runs, &bytes);
    assert_int_equal(runs, 0);
    assert_int_equal(bytes, 0);
    writer_item_free(end);
    alert_engine_destroy(e); /* frees the released run and the end's transitions */
    alert_rules_free(r);
}

/* Divergence: a NaN loss, or an end as failed; of a collapse and a
 * divergence, the one that began first. A recovery is healthy again. */
static void test_verdict_diverged_and_recovery(void **state) {
    (void)state;
    char err[256];
    struct alert_rules *r = alert_rules_load(NULL, err, sizeof err); /* the built-in rules */
    assert_non_null(r);
    struct alert_engine *e = alert_engine_create(r);
    hello(e, 4, "nan");
    float loss = 2.0f;
    for (int s = 0; s < 5; s++) feed(e, mk_step(4, s, "loss", PROTO_SCALAR, &loss, 1));
    loss = NAN;
    feed(e, mk_step(4, 5, "loss", PROTO_SCALAR, &loss, 1));
    const struct alert_verdict *v = alert_verdict_changed(e);
    assert_non_null(v);
    assert_int_equal(v->state, ALERT_V_DIVERGED);
    assert_int_equal(v->since_step, 5);
    loss = 2.0f; /* the loss comes back: loss_nonfinite resolves, so does the verdict */
    feed(e, mk_step(4, 6, "loss", PROTO_SCALAR, &loss, 1));
    v = alert_verdict_changed(e);
    assert_non_null(v);
    assert_int_equal(v->state, ALERT_V_HEALTHY);
    struct writer_item *end = mk_end(4, PROTO_FAILED);
    alert_feed(e, end, end->time);
    v = alert_verdict_changed(e);
    assert_non_null(v);
    assert_int_equal(v->state, ALERT_V_DIVERGED);
    writer_item_free(end);
    /* many runs: each hello costs the same; none is held after its end */
    for (int64_t id = 100; id < 20100; id++) {
        hello(e, id, "bulk");
        end = mk_end(id, PROTO_FINISHED);
        alert_feed(e, end, end->time);
        writer_item_free(end);
    }
    uint64_t runs, bytes;
    alert_engine_usage(e, &runs, &bytes);
    assert_int_equal(runs, 0);
    alert_engine_destroy(e);
    alert_rules_free(r);
}

static void test_drop_growth_zscore_nonfinite(void **state) {
    (void)state;
    struct alert_rules *r = rules(
        "{\"rules\":["
        "{\"name\":\"drop\",\"metric\":\"ent\",\"scope\":\"head\",\"condition\":{\"op\":\"drop\",\"pct\":50,\"window\":10},"
        " \"for\":0,\"keep_firing_for\":0},"
        "{\"name\":\"growth\",\"metric\":\"logit\",\"scope\":\"head\",\"condition\":{\"op\":\"growth\",\"value\":100,"
        " \"rate\":2,\"window\":5},\"for\":0,\"keep_firing_for\":0},"
        "{\"name\":\"spike\",\"metric\":\"loss\",\"scope\":\"scalar\",\"condition\":{\"op\":\"zscore\",\"k\":5,\"window\":20},"
        " \"for\":0,\"keep_firing_for\":0},"
        "{\"name\":\"nan\",\"metric\":\"loss\",\"scope\":\"scalar\",\"condition\":{\"op\":\"nonfinite\"}}"
        "]}");
    struct alert_engine *e = alert_engine_create(r);
    hello(e, 1, "r");
    int fired[4] = {-1, -1, -1, -1};
    for (int s = 0; s < 80; s++) {
        float ent[L * H], logit[L * H], loss;
        for (int i = 0; i < L * H; i++) {
            ent[i] = 2.0f;
            logit[i] = 10.0f;
        }
        if (s >= 30) ent[3] = 0.9f;                             /* a fall of 55% from 2.0 */
        if (s >= 40) logit[5] = 10.0f + 3.0f * (float)(s - 40); /* +3 per step > rate 2 */
        loss = 2.0f + 0.01f * (float)(s % 3);
        if (s == 60) loss = 9.0f; /* a spike */
        if (s == 70) loss = NAN;
        struct writer_item *it = mk_step(1, s, "loss", PROTO_SCALAR, &loss, 1);
        add_metric(it, "ent", ent);
        add_metric(it, "logit", logit);
        int n = alert_feed(e, it, it->time);
        for (int i = 0; i < n; i++) {
            const struct alert_transition *t = alert_transition_at(e, i);
            if (t->state != ALERT_FIRING) continue;
            int k = !strcmp(t->rule->name, "drop")     ? 0
                    : !strcmp(t->rule->name, "growth") ? 1
                    : !strcmp(t->rule->name, "spike")  ? 2
                                                       : 3;
            if (fired[k] < 0) fired[k] = s;
        }
        writer_item_free(it);
    }
    assert_int_equal(fired[0], 30);
    assert_int_equal(fired[1], 44); /* (v(44) - v(39)) / 5 = (22 - 10) / 5 = 2.4 > 2; at 43 it is 1.8 */
    assert_int_equal(fired[2], 60);
    assert_int_equal(fired[3], 70);
    alert_engine_destroy(e);
    alert_rules_free(r);
}

static void test_near_bound_and_stalled(void **state) {
    (void)state;
    struct alert_rules *r =
        rules("{\"rules\":["
              "{\"name\":\"sat\",\"metric\":\"entropy\",\"scope\":\"head\",\"condition\":{\"op\":\"near_bound\","
              " \"bound_metric\":\"entropy_bound\",\"rising_metric\":\"sigma_qk\",\"epsilon\":0.05,\"window\":4},"
              " \"for\":2,\"keep_firing_for\":0},"
              "{\"name\":\"stall\",\"scope\":\"run\",\"condition\":{\"op\":\"stalled\",\"seconds\":30}}"
              "]}");
    struct alert_engine *e = alert_engine_create(r);
    hello(e, 1, "r");
    int fired = -1;
    for (int s = 0; s < 30; s++) {
        float ent[L * H], bound[L * H], sig[L * H];
        for (int i = 0; i < L * H; i++) {
            ent[i] = 1.5f;
            bound[i] = 0.5f;
            sig[i] = 1.0f;
        }
        if (s >= 10) {
            sig[2] = 1.0f + 0.5f * (float)(s - 10);
            ent[2] = 0.52f;
            bound[2] = 0.50f;
        }
        struct writer_item *it = mk_step(1, s, "entropy", PROTO_HEAD, ent, L * H);
        add_metric(it, "entropy_bound", bound);
        add_metric(it, "sigma_qk", sig);
        int n = alert_feed(e, it, it->time);
        for (int i = 0; i < n; i++)
            if (alert_transition_at(e, i)->state == ALERT_FIRING && fired < 0) fired = s;
        writer_item_free(it);
    }
    assert_int_equal(fired, 13); /* sigma_qk first exceeds its value 4 steps earlier at 11; for 2 */
    /* stalled: the last step was at t=1029; nothing until t=1070 */
    assert_int_equal(alert_tick(e, 1050), 0);
    assert_int_equal(alert_tick(e, 1070), 1);
    assert_int_equal(alert_transition_at(e, 0)->state, ALERT_FIRING);
    assert_string_equal(alert_transition_at(e, 0)->rule->name, "stall");
    assert_int_equal(alert_tick(e, 1080), 0); /* no duplicate */
    float v[L * H] = {1.5f, 1.5f, 1.5f, 1.5f, 1.5f, 1.5f};
    struct writer_item *it = mk_step(1, 30, "entropy", PROTO_HEAD, v, L * H);
    it->time = 1081;
    int n = alert_feed(e, it, it->time);
    int resolved = 0;
    for (int i = 0; i < n; i++)
        if (alert_transition_at(e, i)->state == ALERT_RESOLVED &&
            !strcmp(alert_transition_at(e, i)->rule->name, "stall"))
            resolved = 1;
    assert_true(resolved);
    writer_item_free(it);
    alert_engine_destroy(e);
    alert_rules_free(r);
}

/* The condition's "and" guard: near_bound with entropy_norm below 0.9 stays
 * silent while a head is near uniform (entropy == bound ~ log T: the bound is
 * trivially tight), and fires once the head has concentrated; a step
 * without the guard's metric is not evaluated. */
static void test_and_guard(void **state) {
    (void)state;
    struct alert_rules *r = rules(
        "{\"rules\":[{\"name\":\"sat\",\"metric\":\"entropy\",\"scope\":\"head\",\"condition\":{\"op\":\"near_bound\","
        " \"bound_metric\":\"entropy_bound\",\"rising_metric\":\"sigma_qk\",\"epsilon\":0.05,\"window\":4,"
        " \"and\":{\"metric\":\"entropy_norm\",\"op\":\"below\",\"value\":0.9}},\"for\":2}]}");
    struct alert_engine *e = alert_engine_create(r);
    hello(e, 1, "g");
    int fired = -1, fired_cells = 0, joined = -1, joined_cells = 0;
    for (int s = 0; s < 40; s++) {
        float ent[L * H], bound[L * H], sig[L * H], norm[L * H];
        for (int i = 0; i < L * H; i++) { /* uniform: entropy = bound = log 64, sigma rising */
            ent[i] = 4.1589f;
            bound[i] = 4.1580f;
            sig[i] = 0.001f * (float)(s + 1);
            norm[i] = 1.0f;
        }
        if (s >= 20) { /* heads (0,1) and (1,1) concentrate; at step 20 (1,1)'s entropy_norm is still above 0.9 */
            ent[1] = ent[4] = 0.52f;
            bound[1] = bound[4] = 0.50f;
            norm[1] = 0.125f;
            norm[4] = s == 20 ? 0.95f : 0.125f;
        }
        struct writer_item *it = mk_step(1, s, "entropy", PROTO_HEAD, ent, L * H);
        add_metric(it, "entropy_bound", bound);
        add_metric(it, "sigma_qk", sig);
        if (s != 21) add_metric(it, "entropy_norm", norm); /* step 21: no guard metric, no evaluation */
        int n = alert_feed(e, it, it->time);
        for (int i = 0; i < n; i++) {
            const struct alert_transition *t = alert_transition_at(e, i);
            if (t->state == ALERT_FIRING && fired < 0) {
                fired = s;
                fired_cells = t->ncells;
                assert_int_equal(t->cells[0].layer, 0);
                assert_int_equal(t->cells[0].head, 1);
            } else if (t->state == ALERT_UPDATE && joined < 0) {
                joined = s;
                joined_cells = t->ncells;
            }
        }
        writer_item_free(it);
    }
    /* (0,1): pending from 20; step 21 is not evaluated, so it goes on, and
     * fires at 22 (had a missing guard metric counted as false: 24).
     * (1,1): the guard says no at 20; pending from 22, joins at 24 (had a
     * missing guard metric counted as holding: 23). Had the guard been
     * ignored, the uniform heads would have fired at 6 (as below). */
    assert_int_equal(fired, 22);
    assert_int_equal(fired_cells, 1);
    assert_int_equal(joined, 24);
    assert_int_equal(joined_cells, 2);
    alert_engine_destroy(e);
    alert_rules_free(r);
    /* without the guard the uniform heads fire as soon as the window is full */
    r = rules(
        "{\"rules\":[{\"name\":\"sat\",\"metric\":\"entropy\",\"scope\":\"head\",\"condition\":{\"op\":\"near_bound\","
        " \"bound_metric\":\"entropy_bound\",\"rising_metric\":\"sigma_qk\",\"epsilon\":0.05,\"window\":4},\"for\":2}]}");
    e = alert_engine_create(r);
    hello(e, 1, "g");
    fired = -1;
    for (int s = 0; s < 10 && fired < 0; s++) {
        float ent[L * H], bound[L * H], sig[L * H];
        for (int i = 0; i < L * H; i++) {
            ent[i] = 4.1589f;
            bound[i] = 4.1580f;
            sig[i] = 0.001f * (float)(s + 1);
        }
        struct writer_item *it = mk_step(1, s, "entropy", PROTO_HEAD, ent, L * H);
        add_metric(it, "entropy_bound", bound);
        add_metric(it, "sigma_qk", sig);
        if (alert_feed(e, it, it->time) > 0 && alert_transition_at(e, 0)->state == ALERT_FIRING) fired = s;
        writer_item_free(it);
    }
    assert_int_equal(fired, 6);
    alert_engine_destroy(e);
    alert_rules_free(r);
    /* a bad guard is refused with its reason */
    char err[512];
    const char *bad =
        "{\"rules\":[{\"name\":\"x\",\"metric\":\"e\",\"scope\":\"head\","
        "\"condition\":{\"op\":\"below\",\"value\":1,\"and\":{\"metric\":\"n\",\"op\":\"drop\",\"value\":1}}}]}";
    assert_null(alert_rules_parse(bad, strlen(bad), err, sizeof err));
    assert_non_null(strstr(err, "\"and\""));
    const char *novalue = "{\"rules\":[{\"name\":\"x\",\"metric\":\"e\",\"scope\":\"head\","
                          "\"condition\":{\"op\":\"below\",\"value\":1,\"and\":{\"metric\":\"n\",\"op\":\"above\"}}}]}";
    assert_null(alert_rules_parse(novalue, strlen(novalue), err, sizeof err));
    assert_non_null(strstr(err, "\"value\""));
}

static void test_bad_rules_name_their_line(void **state) {
    (void)state;
    char err[512];
    const char *bad_json = "{\"rules\": [\n  {\"name\": \"a\",\n   \"scope\": \"head\" \"metric\": \"x\"}\n]}";
    assert_null(alert_rules_parse(bad_json, strlen(bad_json), err, sizeof err));
    assert_non_null(strstr(err, "line 3"));
    const char *bad_field =
        "{\"rules\": [\n {\"name\":\"ok\",\"scope\":\"scalar\",\"metric\":\"loss\",\"condition\":{\"op\":\"nonfinite\"}},\n"
        " {\"name\": \"second\", \"scope\": \"head\", \"metric\": \"e\",\n"
        "  \"condition\": {\"op\": \"below\", \"value\": 1}, \"for\": -3}\n]}";
    assert_null(alert_rules_parse(bad_field, strlen(bad_field), err, sizeof err));
    assert_non_null(strstr(err, "line 3"));
    assert_non_null(strstr(err, "second"));
    assert_non_null(strstr(err, "\"for\""));
    const char *unknown_op =
        "{\"rules\":[{\"name\":\"u\",\"scope\":\"head\",\"metric\":\"e\",\"condition\":{\"op\":\"sideways\"}}]}";
    assert_null(alert_rules_parse(unknown_op, strlen(unknown_op), err, sizeof err));
    assert_non_null(strstr(err, "op"));
    const char *dup = "{\"rules\":[{\"name\":\"u\",\"scope\":\"run\",\"condition\":{\"op\":\"stalled\",\"seconds\":1}},"
                      "{\"name\":\"u\",\"scope\":\"run\",\"condition\":{\"op\":\"stalled\",\"seconds\":1}}]}";
    assert_null(alert_rules_parse(dup, strlen(dup), err, sizeof err));
    assert_non_null(strstr(err, "twice"));
    const char *field =
        "{\"rules\":[{\"name\":\"u\",\"scope\":\"run\",\"condition\":{\"op\":\"stalled\",\"seconds\":1},\"fro\":3}]}";
    assert_null(alert_rules_parse(field, strlen(field), err, sizeof err));
    assert_non_null(strstr(err, "unknown field \"fro\""));
    /* the built-in set parses */
    struct alert_rules *def = alert_rules_load(NULL, err, sizeof err);
    assert_non_null(def);
    assert_true(def->n >= 7);
    alert_rules_free(def);
}

static void test_rollback_restarts_windows(void **state) {
    (void)state;
    struct alert_rules *r = rules(below_rule);
    struct alert_engine *e = alert_engine_create(r);
    hello(e, 1, "rb");
    struct log lg = {0};
    for (int s = 0; s < 20; s++) {
        float v[L * H] = {0.8f, 0.8f, 0.8f, 0.8f, 0.8f, 0.8f};
        if (s >= 12) v[0] = 0.01f;
        record(e, feed(e, mk_step(1, s, "entropy_norm", PROTO_HEAD, v, L * H)), &lg);
    }
    assert_int_equal(lg.nfire, 1);
    assert_int_equal(lg.start_step[0], 12);
    /* the trainer rolls back to step 9 (repeats from 10): the alert rested
     * only on abandoned steps, so it resolves at once, without keep_firing_for */
    for (int s = 10; s < 30; s++) {
        float v[L * H] = {0.8f, 0.8f, 0.8f, 0.8f, 0.8f, 0.8f};
        if (s >= 20) v[3] = 0.02f; /* the new branch collapses again, elsewhere */
        record(e, feed(e, mk_step(1, s, "entropy_norm", PROTO_HEAD, v, L * H)), &lg);
    }
    assert_int_equal(lg.nresolve, 1);
    assert_int_equal(lg.resolve_step[0], 10);
    /* and fires anew: a second FIRING the trainer hears, with its own start */
    assert_int_equal(lg.nfire, 2);
    assert_int_equal(lg.start_step[1], 20);
    assert_int_equal(lg.fire_step[1], 25);
    alert_engine_destroy(e);
    alert_rules_free(r);
}

/* A rollback to a step after the alert began keeps it firing: the steps that
 * made it fire are still on the run's line.  It resolves when its cells
 * clear on the new branch (keep_firing_for counted from there). */
static void test_rollback_after_start_keeps_firing(void **state) {
    (void)state;
    struct alert_rules *r = rules(below_rule);
    struct alert_engine *e = alert_engine_create(r);
    hello(e, 1, "rb");
    struct log lg = {0};
    for (int s = 0; s < 25; s++) {
        float v[L * H] = {0.8f, 0.8f, 0.8f, 0.8f, 0.8f, 0.8f};
        if (s >= 12) v[0] = 0.01f;
        record(e, feed(e, mk_step(1, s, "entropy_norm", PROTO_HEAD, v, L * H)), &lg);
    }
    assert_int_equal(lg.nfire, 1);
    for (int s = 20; s < 40; s++) { /* back to 19, healthy from there */
        float v[L * H] = {0.8f, 0.8f, 0.8f, 0.8f, 0.8f, 0.8f};
        record(e, feed(e, mk_step(1, s, "entropy_norm", PROTO_HEAD, v, L * H)), &lg);
    }
    assert_int_equal(lg.nfire, 1);
    assert_int_equal(lg.nresolve, 1);
    assert_int_equal(lg.resolve_step[0], 23); /* clear from 20, keep 3 */
    alert_engine_destroy(e);
    alert_rules_free(r);
}

/* Abandoned is decided per cell: head A fires from step 12 and stops, head
 * B takes over from 28 while the group stays firing (its start_step is still
 * A's 12). A rollback to step 27 abandons B's evidence: the group resolves,
 * and B collapsing again on the new branch is a new FIRING. */
static void test_rollback_abandons_per_cell(void **state) {
    (void)state;
    struct alert_rules *r = rules(below_rule);
    struct alert_engine *e = alert_engine_create(r);
    hello(e, 1, "rb");
    struct log lg = {0};
    for (int s = 0; s < 41; s++) {
        float v[L * H] = {0.8f, 0.8f, 0.8f, 0.8f, 0.8f, 0.8f};
        if (s >= 12 && s <= 30) v[0] = 0.01f; /* A: fires at 17, clear from 31, stops at 34 */
        if (s >= 28) v[5] = 0.01f;            /* B: fires at 33 */
        record(e, feed(e, mk_step(1, s, "entropy_norm", PROTO_HEAD, v, L * H)), &lg);
    }
    assert_int_equal(lg.nfire, 1);
    assert_int_equal(lg.nresolve, 0); /* one episode: B joined before A left */
    assert_int_equal(lg.start_step[0], 12);
    for (int s = 28; s < 45; s++) { /* back to 27; B collapses again from 30 */
        float v[L * H] = {0.8f, 0.8f, 0.8f, 0.8f, 0.8f, 0.8f};
        if (s >= 30) v[5] = 0.01f;
        record(e, feed(e, mk_step(1, s, "entropy_norm", PROTO_HEAD, v, L * H)), &lg);
    }
    assert_int_equal(lg.nresolve, 1);
    assert_int_equal(lg.resolve_step[0], 28);
    assert_int_equal(lg.nfire, 2);
    assert_int_equal(lg.start_step[1], 30);
    assert_int_equal(lg.fire_step[1], 35);
    alert_engine_destroy(e);
    alert_rules_free(r);
}

/* Times are the daemon's (alert_feed's now), never the step's `time`: a
 * trainer clock hours off gives neither a startsAt in the past or future,
 * nor a stall that fires between two steps sent 50 ms apart. */
static void test_daemon_clock_not_trainer_clock(void **state) {
    (void)state;
    struct alert_rules *r =
        rules("{\"rules\":[{\"name\":\"collapse\",\"metric\":\"entropy_norm\",\"scope\":\"head\","
              "\"condition\":{\"op\":\"below\",\"value\":0.1},\"for\":2,\"keep_firing_for\":0},"
              "{\"name\":\"stall\",\"scope\":\"run\",\"condition\":{\"op\":\"stalled\",\"seconds\":30}}]}");
    struct alert_engine *e = alert_engine_create(r);
    hello(e, 1, "skewed");
    double now = 5000;
    int fired = 0, stalled = 0;
    for (int s = 0; s < 40; s++, now += 0.05) {
        float v[L * H] = {0.8f, 0.8f, 0.8f, 0.8f, 0.8f, 0.8f};
        if (s >= 20) v[4] = 0.01f;
        struct writer_item *it = mk_step(1, s, "entropy_norm", PROTO_HEAD, v, L * H);
        it->time = now - 300; /* the trainer's clock: 5 minutes behind */
        int n = alert_feed(e, it, now);
        for (int i = 0; i < n; i++) {
            const struct alert_transition *t = alert_transition_at(e, i);
            if (t->state == ALERT_FIRING && !strcmp(t->rule->name, "collapse")) {
                fired++;
                assert_true(fabs(t->starts_at - now) < 1e-9);
                assert_true(fabs(t->at - now) < 1e-9);
            }
        }
        writer_item_free(it);
        for (int i = 0, n2 = alert_tick(e, now + 0.01); i < n2; i++)
            stalled += !strcmp(alert_transition_at(e, i)->rule->name, "stall");
    }
    assert_int_equal(fired, 1);
    assert_int_equal(stalled, 0);
    alert_engine_destroy(e);
    alert_rules_free(r);
}

static int resume_calls;
static int resume_open(void *ctx, int64_t run_id, const char *rule, double *starts_at, int64_t *start_step) {
    (void)ctx;
    resume_calls++;
    if (run_id != 1 || strcmp(rule, "collapse")) return 0;
    *starts_at = 123.5;
    *start_step = 3;
    return 1;
}

/* An episode an earlier daemon left open goes on: the FIRING says resumed
 * and carries the old start, which the RESOLVED keeps; the transition's own
 * time (at) is now. */
static void test_resume_earlier_episode(void **state) {
    (void)state;
    struct alert_rules *r = rules(below_rule);
    struct alert_engine *e = alert_engine_create(r);
    alert_engine_set_resume(e, resume_open, NULL);
    hello(e, 1, "run-a");
    int fired = 0, resolved = 0;
    for (int s = 10; s < 40; s++) {
        float v[L * H] = {0.8f, 0.8f, 0.8f, 0.8f, 0.8f, 0.8f};
        if (s < 20) v[0] = 0.01f;
        struct writer_item *it = mk_step(1, s, "entropy_norm", PROTO_HEAD, v, L * H);
        int n = alert_feed(e, it, 2000.0 + s);
        for (int i = 0; i < n; i++) {
            const struct alert_transition *t = alert_transition_at(e, i);
            assert_true(fabs(t->starts_at - 123.5) < 1e-9);
            assert_int_equal(t->start_step, 3);
            assert_true(fabs(t->at - (2000.0 + s)) < 1e-9);
            if (t->state == ALERT_FIRING) fired++, assert_int_equal(t->resumed, 1);
            if (t->state == ALERT_RESOLVED) resolved++, assert_true(fabs(t->ends_at - (2000.0 + s)) < 1e-9);
        }
        writer_item_free(it);
    }
    assert_int_equal(fired, 1);
    assert_int_equal(resolved, 1);
    assert_int_equal(resume_calls, 1);
    alert_engine_destroy(e);
    alert_rules_free(r);
}

/* ---- flicker, hysteresis and training harm ---- */

/* The built-in rules on a run whose head 0 of layer 0 follows head(s) and
 * whose loss follows loss(s), `steps` steps, then an end. Returns the
 * final verdict's state; *fired gets the step entropy_collapse fired at
 * (-1 never), *last_live the verdict state just before the end. */
static int run_builtin(int64_t id, int steps, float (*head)(int), float (*loss)(int), int64_t *fired, int *last_live) {
    char err[256];
    struct alert_rules *r = alert_rules_load(NULL, err, sizeof err);
    assert_non_null(r);
    struct alert_engine *e = alert_engine_create(r);
    hello(e, id, "issue34");
    *fired = -1;
    int live = ALERT_V_HEALTHY;
    for (int s = 0; s < steps; s++) {
        float x[L * H];
        for (int i = 0; i < L * H; i++) x[i] = 0.8f;
        x[0] = head(s);
        struct writer_item *it = mk_step(id, s, "entropy_norm", PROTO_HEAD, x, L * H);
        float l = loss(s);
        msg_add(&it->msg, "loss", PROTO_SCALAR, 1, 1, &l);
        int n = alert_feed(e, it, it->time);
        writer_item_free(it);
        for (int k = 0; k < n; k++) {
            const struct alert_transition *t = alert_transition_at(e, k);
            if (t->state == ALERT_FIRING && !strcmp(t->rule->name, "entropy_collapse") && *fired < 0) *fired = s;
        }
        const struct alert_verdict *v = alert_verdict_changed(e);
        if (v) live = v->state;
    }
    *last_live = live;
    struct writer_item *end = mk_end(id, PROTO_FINISHED);
    alert_feed(e, end, end->time);
    const struct alert_verdict *v = alert_verdict_changed(e);
    assert_non_null(v);
    int state = v->state;
    writer_item_free(end);
    alert_engine_destroy(e);
    alert_rules_free(r);
    return state;
}

static float flicker_0003_002(int s) { return s % 2 ? 0.02f : 0.003f; }
/* below 0.05 on 3 steps of 4, above the clear value on the fourth: never
 * 20 steps in a row, 22-23 of every 30 */
static float flicker_3_of_4(int s) { return s < 10 ? 0.8f : s % 4 == 3 ? 0.3f : 0.003f; }
static float sharp_003(int s) { return s < 100 ? 0.8f - 0.0077f * (float)s : 0.03f; }
static float stuck_loss(int s) {
    (void)s;
    return 4.16f;
} /* ln 64: a uniform guess */
static float falling_loss(int s) { return 4.16f * expf(-(float)s / 150.0f) + 2.0f * (1 - expf(-(float)s / 150.0f)); }

/* A head that flickers around the old 0.01 threshold (0.003 / 0.02, the
 * PyTorch baseline that ended "healthy" under the old rule) with the loss stuck at a
 * uniform guess is collapsed; so is one that leaves the collapse one step
 * in four, which no run of 20 consecutive steps would catch. */
static void test_flicker_with_stuck_loss_collapses(void **state) {
    (void)state;
    int64_t fired;
    int live;
    assert_int_equal(run_builtin(40, 150, flicker_0003_002, stuck_loss, &fired, &live), ALERT_V_COLLAPSED);
    assert_int_equal(fired, 19); /* the 20th of 20 steps below 0.05 */
    assert_int_equal(live, ALERT_V_COLLAPSING);
    assert_int_equal(run_builtin(41, 150, flicker_3_of_4, stuck_loss, &fired, &live), ALERT_V_COLLAPSED);
    assert_true(fired > 10 && fired <= 10 + 27); /* 20 of the first 27 flickering steps are below */
}

/* A head that is sharp (entropy_norm 0.03, steady) while the loss trains
 * from 4.16 towards 2.0 is not collapsed and fires nothing: the verdict
 * says sharp. The same head with the loss stuck is collapsed. */
static void test_sharp_head_while_training_is_not_collapse(void **state) {
    (void)state;
    int64_t fired;
    int live;
    assert_int_equal(run_builtin(42, 600, sharp_003, falling_loss, &fired, &live), ALERT_V_SHARP);
    assert_int_equal(fired, -1);
    assert_int_equal(live, ALERT_V_SHARP);
    assert_string_equal(alert_verdict_name(ALERT_V_SHARP), "sharp");
    assert_int_equal(run_builtin(43, 600, sharp_003, stuck_loss, &fired, &live), ALERT_V_COLLAPSED);
    assert_true(fired > 100 && fired < 130);
}

/* Hysteresis: below 0.1 fires (for 2), a firing cell holds while below
 * clear_value 0.3 and clears above it; and "for" as at_least/of_last
 * fires on the K-th step of the last N, not the K+1-th. */
static void test_hysteresis_and_at_least_of_last(void **state) {
    (void)state;
    struct alert_rules *r = rules(
        "{\"rules\":[{\"name\":\"h\",\"metric\":\"entropy_norm\",\"scope\":\"head\","
        "\"condition\":{\"op\":\"below\",\"value\":0.1,\"clear_value\":0.3},\"for\":2,\"keep_firing_for\":0},"
        "{\"name\":\"k\",\"metric\":\"entropy_norm\",\"scope\":\"head\","
        "\"condition\":{\"op\":\"below\",\"value\":0.1},\"for\":{\"at_least\":3,\"of_last\":5},\"keep_firing_for\":0}]}");
    assert_int_equal(r->rules[1].of_last, 5);
    assert_int_equal(r->rules[1].for_steps, 3);
    struct alert_engine *e = alert_engine_create(r);
    hello(e, 44, "hyst");
    const float seq[] = {0.05f, 0.5f, 0.05f, 0.05f, 0.05f, 0.2f, 0.2f, 0.4f};
    int64_t fire_h = -1, fire_k = -1, res_h = -1, res_k = -1;
    for (int s = 0; s < 8; s++) {
        float x[L * H];
        for (int i = 0; i < L * H; i++) x[i] = 0.8f;
        x[0] = seq[s];
        int n = feed(e, mk_step(44, s, "entropy_norm", PROTO_HEAD, x, L * H));
        for (int k = 0; k < n; k++) {
            const struct alert_transition *t = alert_transition_at(e, k);
            int is_h = !strcmp(t->rule->name, "h");
            if (t->state == ALERT_FIRING) *(is_h ? &fire_h : &fire_k) = s;
            if (t->state == ALERT_RESOLVED) *(is_h ? &res_h : &res_k) = s;
        }
    }
    assert_int_equal(fire_k, 3); /* steps 0, 2, 3: 3 of the last 5 */
    assert_int_equal(fire_h, 4); /* 2, 3, 4: "for" 2 counts steps after the first */
    assert_int_equal(res_k, 7);  /* steps 3..7 hold 3 and 4 only: 2 of 5, not held (2..6 held 3) */
    assert_int_equal(res_h, 7);  /* 0.2 at 5 and 6 is below clear_value: held; 0.4 clears */
    alert_engine_destroy(e);
    alert_rules_free(r);
}

static void test_issue34_rules_refused(void **state) {
    (void)state;
    char err[512];
    static const char *const bad[][2] = {
        {"\"for\":{\"at_least\":5,\"of_last\":3}", "at_least"},
        {"\"for\":{\"at_least\":1,\"of_last\":65}", "64"},
        {"\"for\":{\"at_least\":2}", "of_last"},
        {"\"unless_training\":{\"metric\":\"loss\",\"below\":1.5}", "unless_training"},
        {"\"unless_training\":{\"metric\":\"loss\"}", "unless_training"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char json[512];
        snprintf(json, sizeof json,
                 "{\"rules\":[{\"name\":\"x\",\"metric\":\"e\",\"scope\":\"head\","
                 "\"condition\":{\"op\":\"below\",\"value\":0.1},%s}]}",
                 bad[i][0]);
        assert_null(alert_rules_parse(json, strlen(json), err, sizeof err));
        if (!strstr(err, bad[i][1])) fail_msg("%s: %s", bad[i][0], err);
    }
    const char *clear_low = "{\"rules\":[{\"name\":\"x\",\"metric\":\"e\",\"scope\":\"head\","
                            "\"condition\":{\"op\":\"below\",\"value\":0.1,\"clear_value\":0.05}}]}";
    assert_null(alert_rules_parse(clear_low, strlen(clear_low), err, sizeof err));
    assert_non_null(strstr(err, "clear_value"));
    const char *clear_drop = "{\"rules\":[{\"name\":\"x\",\"metric\":\"e\",\"scope\":\"head\","
                             "\"condition\":{\"op\":\"drop\",\"pct\":50,\"window\":5,\"clear_value\":0.05}}]}";
    assert_null(alert_rules_parse(clear_drop, strlen(clear_drop), err, sizeof err));
    assert_non_null(strstr(err, "below and above only"));
}

/* The memory bound of docs/alerts.md: per head and head rule the engine
 * holds 13 bytes of cell state (three steps in 32 bits, a flag byte), 4
 * for the cell's latest value unless the rule's window holds it (below,
 * above, nonfinite, near_bound), 4 bytes per window step (per step seen, up
 * to the window) for the rules that read a window (and 4 for drop's max,
 * 24 for zscore's sums, 4 for an at_least/of_last history of up to 32
 * steps), plus 12 bytes per cell that fires; the built-in rules, with every
 * metric they read, hold 614 bytes a head (724 with 32 bytes of cell state
 * a rule and a 64-bit history; earlier rule sets: 692 with one
 * collapse-risk head rule, 684 before entropy_collapse counted 20 of 30
 * steps, 844 when every rule kept every summary and a window). */
static void test_state_bytes_per_head(void **state) {
    (void)state;
    char err[256];
    struct alert_rules *r = alert_rules_load(NULL, err, sizeof err);
    assert_non_null(r);
    struct alert_engine *e = alert_engine_create(r);
    uint64_t runs, base, bytes;
    hello(e, 7, "sized");
    alert_engine_usage(e, &runs, &base);
    float v[L * H] = {0.8f, 0.8f, 0.8f, 0.8f, 0.8f, 0.8f};
    static const char *const more[] = {"max_logit", "entropy", "entropy_bound", "sigma_qk"};
    for (int s = 1; s <= 60; s++) {
        struct writer_item *it = mk_step(7, s, "entropy_norm", PROTO_HEAD, v, L * H);
        for (int i = 0; i < 4; i++) add_metric(it, more[i], v);
        alert_feed(e, it, 1.0);
        writer_item_free(it);
        alert_engine_usage(e, &runs, &bytes);
        assert_int_equal(runs, 1);
        /* per head: 13 a rule, the latest value of entropy_collapse and
         * near_bound 4 each, the history 4, drop's max 4, and a window row
         * of 4 per step so far in each of the five windowed rules */
        if (s == 1) assert_int_equal(bytes - base, (uint64_t)L * H * (6 * 13 + 2 * 4 + 4 + 4 + 5 * 4) + 17);
    }
    /* with the windows full, the documented bound, from the rules' windows */
    uint64_t per_head = 0;
    int nhead = 0;
    for (int k = 0; k < r->n; k++) {
        const struct alert_rule *rule = &r->rules[k];
        if (rule->scope != ALERT_SCOPE_HEAD) continue;
        nhead++;
        per_head += 13;
        if (rule->op == ALERT_OP_DROP || rule->op == ALERT_OP_GROWTH || rule->op == ALERT_OP_NEAR_BOUND)
            per_head += 4 * (uint64_t)rule->window;
        if (rule->op != ALERT_OP_DROP && rule->op != ALERT_OP_GROWTH) per_head += 4; /* the latest value */
        if (rule->op == ALERT_OP_DROP) per_head += 4;
        if (rule->of_last) per_head += 4; /* entropy_collapse's history of 30 steps */
    }
    assert_int_equal(nhead, 6);
    printf("alert state: %llu bytes a head (built-in rules, no cell firing)\n",
           (unsigned long long)((bytes - base - 17) / (L * H)));
    assert_int_equal(bytes - base, (uint64_t)L * H * per_head + 17); /* + run_stalled's one cell */
    assert_int_equal(per_head, 614);                                 /* the figure docs/alerts.md gives */
    alert_engine_destroy(e);
    alert_rules_free(r);
}

/* The built-in collapse-risk model (schema/default_rules.json, chosen by
 * make experiments on the tune half of its sweep): collapse_risk fires 10
 * steps after a head's max_logit began to grow faster than 2 per step over
 * 5 steps; collapse_risk_sigma_qk on the first step a head's sigma_qk grew
 * faster than 0.1 per step over 5 steps, only where that head's
 * entropy_norm is below 0.5; collapse_risk_loss on the first step the loss
 * grew faster than 0.05 per step over 20 steps, and not on a loss that
 * only oscillates. */
static int64_t first_fire(struct alert_engine *e, int n, const char *rule, int64_t step, int64_t *at, int *cells) {
    for (int i = 0; i < n; i++) {
        const struct alert_transition *t = alert_transition_at(e, i);
        if (t->state == ALERT_FIRING && !strcmp(t->rule->name, rule) && *at < 0) {
            *at = step;
            *cells = t->ncells;
        }
    }
    return *at;
}

static void test_builtin_collapse_risk(void **state) {
    (void)state;
    char err[256];
    struct alert_rules *r = alert_rules_load(NULL, err, sizeof err);
    assert_non_null(r);
    struct alert_engine *e = alert_engine_create(r);
    hello(e, 1, "heads");
    hello(e, 2, "loss");
    int64_t logit_at = -1, sigma_at = -1, head_loss_at = -1, loss_at = -1, loss_head_at = -1;
    int logit_cells = 0, sigma_cells = 0, ignored = 0;
    for (int s = 0; s < 200; s++) {
        float sq[L * H], en[L * H], ml[L * H], flat = 2.0f + 0.5f * (float)(s % 2);
        for (int i = 0; i < L * H; i++) {
            sq[i] = 1.0f;
            en[i] = 0.8f;
            ml[i] = 3.0f;
        }
        if (s >= 40) en[4] = 0.4f; /* head 4 sharpening; head 5 not */
        if (s >= 50) sq[4] = sq[5] = 1.0f + 0.3f * (float)(s - 50);
        if (s >= 50) ml[2] = 3.0f + 3.0f * (float)(s - 50); /* head 2's logits take off */
        struct writer_item *it = mk_step(1, s, "loss", PROTO_SCALAR, &flat, 1);
        add_metric(it, "sigma_qk", sq);
        add_metric(it, "entropy_norm", en);
        add_metric(it, "max_logit", ml);
        int n = alert_feed(e, it, it->time);
        first_fire(e, n, "collapse_risk", s, &logit_at, &logit_cells);
        first_fire(e, n, "collapse_risk_sigma_qk", s, &sigma_at, &sigma_cells);
        first_fire(e, n, "collapse_risk_loss", s, &head_loss_at, &ignored);
        writer_item_free(it);
        /* run 2: healthy heads, the loss flat then rising 0.08 per step from step 100 */
        float loss = s < 100 ? 2.0f : 2.0f + 0.08f * (float)(s - 100), sq2[L * H], en2[L * H], ml2[L * H];
        for (int i = 0; i < L * H; i++) {
            sq2[i] = 1.0f;
            en2[i] = 0.8f;
            ml2[i] = 3.0f;
        }
        it = mk_step(2, s, "loss", PROTO_SCALAR, &loss, 1);
        add_metric(it, "sigma_qk", sq2);
        add_metric(it, "entropy_norm", en2);
        add_metric(it, "max_logit", ml2);
        n = alert_feed(e, it, it->time);
        first_fire(e, n, "collapse_risk_loss", s, &loss_at, &ignored);
        first_fire(e, n, "collapse_risk", s, &loss_head_at, &ignored);
        first_fire(e, n, "collapse_risk_sigma_qk", s, &loss_head_at, &ignored);
        writer_item_free(it);
    }
    /* (v(t) - v(t-5)) / 5 = 3 (t - 50) / 5 > 2 from t = 54; for 10 */
    assert_int_equal(logit_at, 64);
    assert_int_equal(logit_cells, 1);
    /* (v(t) - v(t-5)) / 5 = 0.06 (t - 50) > 0.1 from t = 52 (t - 50 > 1.67), for 0 */
    assert_int_equal(sigma_at, 52);
    assert_int_equal(sigma_cells, 1);   /* head 5's entropy_norm is 0.8: not it */
    assert_int_equal(head_loss_at, -1); /* an oscillating loss is no growth */
    /* 0.08 (t - 100) / 20 > 0.05 from t = 113, for 0 */
    assert_int_equal(loss_at, 113);
    assert_int_equal(loss_head_at, -1);
    alert_engine_destroy(e);
    alert_rules_free(r);
}

/* Early collapse: the built-in predictor needs no long
 * history. A head whose entropy_norm falls from 0.9 to 0.004 between steps
 * 3 and 6 of a run whose loss stays at a uniform guess (with sigma_qk and
 * max_logit jumping with it, as at a high learning rate) is flagged by a
 * collapse_risk* rule no later than entropy_drop flags it; a head that
 * sharpens as fast while the loss trains (from step 120, the loss at 0.6 of
 * its opening level by then), with its norms flat, fires no collapse_risk*. */
static int64_t first_of(struct alert_engine *e, int n, const char *prefix, int64_t step, int64_t at) {
    for (int i = 0; i < n && at < 0; i++) {
        const struct alert_transition *t = alert_transition_at(e, i);
        if (t->state == ALERT_FIRING && !strncmp(t->rule->name, prefix, strlen(prefix))) at = step;
    }
    return at;
}

static float early_head(int s) { return s < 3 ? 0.9f : s < 6 ? 0.9f - 0.3f * (float)(s - 2) : 0.004f; }
static float late_sharp_head(int s) { return s < 120 ? 0.9f : s < 123 ? 0.9f - 0.3f * (float)(s - 119) : 0.004f; }

static void run_early(int64_t id, float (*head)(int), float (*loss)(int), int grow, int64_t *risk, int64_t *drop) {
    char err[256];
    struct alert_rules *r = alert_rules_load(NULL, err, sizeof err);
    assert_non_null(r);
    struct alert_engine *e = alert_engine_create(r);
    hello(e, id, "early");
    *risk = *drop = -1;
    for (int s = 0; s < 200; s++) {
        float en[L * H], sq[L * H], ml[L * H], l = loss(s);
        for (int i = 0; i < L * H; i++) {
            en[i] = 0.9f;
            sq[i] = 1.0f;
            ml[i] = 3.0f;
        }
        en[0] = head(s);
        if (grow && s >= 3) {
            sq[0] = 1.0f + 4.0f * (float)(s - 2);
            ml[0] = 3.0f + 80.0f * (float)(s - 2);
        }
        struct writer_item *it = mk_step(id, s, "entropy_norm", PROTO_HEAD, en, L * H);
        add_metric(it, "sigma_qk", sq);
        add_metric(it, "max_logit", ml);
        msg_add(&it->msg, "loss", PROTO_SCALAR, 1, 1, &l);
        int n = alert_feed(e, it, it->time);
        *risk = first_of(e, n, "collapse_risk", s, *risk);
        *drop = first_of(e, n, "entropy_drop", s, *drop);
        writer_item_free(it);
    }
    alert_engine_destroy(e);
    alert_rules_free(r);
}

static float trained_loss(int s) {
    return s < 10 ? 4.16f : 4.16f * (s < 100 ? 1.0f - 0.004f * (float)(s - 10) : 0.64f);
}

/* Heads flickering across a threshold: head (0,0) fires throughout, head
 * (0,1) joins and leaves at every step, 100 steps a second. The group
 * fires once and is updated at most once per ALERT_UPDATE_MIN_S (not per
 * step); a set that changed within the second goes out with the first
 * step after it, so once the flicker stops the last update lists the
 * settled set. A rollback's update is not held back. */
static void test_update_at_most_once_a_second(void **state) {
    (void)state;
    struct alert_rules *r = rules("{\"rules\":[{\"name\":\"low\",\"metric\":\"entropy_norm\",\"scope\":\"head\","
                                  "\"condition\":{\"op\":\"below\",\"value\":0.5},\"for\":0}]}");
    struct alert_engine *e = alert_engine_create(r);
    hello(e, 1, "flicker");
    int fired = 0, updates = 0, last_ncells = -1;
    for (int s = 1; s <= 350; s++) {
        float v[L * H] = {0.1f, 0.9f, 0.9f, 0.9f, 0.9f, 0.9f};
        if (s <= 300 && s % 2) v[1] = 0.1f; /* flickers for 3 s, then settles above */
        struct writer_item *it = mk_step(1, s, "entropy_norm", PROTO_HEAD, v, L * H);
        it->time = 1000.0 + 0.01 * s;
        int n = alert_feed(e, it, it->time);
        for (int i = 0; i < n; i++) {
            const struct alert_transition *t = alert_transition_at(e, i);
            fired += t->state == ALERT_FIRING;
            if (t->state == ALERT_UPDATE) {
                updates++;
                last_ncells = t->ncells_total;
            }
            assert_int_not_equal(t->state, ALERT_RESOLVED);
        }
        writer_item_free(it);
    }
    assert_int_equal(fired, 1);
    /* 3.5 s of the feed's clock: at most one update a second (unheld: ~175) */
    assert_in_range(updates, 2, 4);
    assert_int_equal(last_ncells, 1); /* the settled set, (0,0) alone */
    /* a rollback to a step after (0,1) last joined abandons it at once */
    float v[L * H] = {0.1f, 0.1f, 0.9f, 0.9f, 0.9f, 0.9f};
    struct writer_item *it = mk_step(1, 351, "entropy_norm", PROTO_HEAD, v, L * H);
    it->time = 1004.6;
    int n = alert_feed(e, it, it->time);
    writer_item_free(it);
    assert_int_equal(n, 1); /* (0,1) joins: the last update was over a second ago */
    it = mk_step(1, 351, "entropy_norm", PROTO_HEAD, v, L * H);
    it->time = 1004.61; /* 10 ms later: an ordinary update would be held */
    n = alert_feed(e, it, it->time);
    int rewound = 0;
    for (int i = 0; i < n; i++) {
        const struct alert_transition *t = alert_transition_at(e, i);
        if (t->state == ALERT_UPDATE && t->ncells_total == 1) rewound = 1;
    }
    writer_item_free(it);
    assert_true(rewound);
    alert_engine_destroy(e);
    alert_rules_free(r);
}

static void test_builtin_early_collapse(void **state) {
    (void)state;
    int64_t risk, drop;
    run_early(50, early_head, stuck_loss, 1, &risk, &drop);
    assert_true(drop >= 0);
    if (risk < 0 || risk > drop)
        fail_msg("collapse_risk* at %lld, entropy_drop at %lld", (long long)risk, (long long)drop);
    assert_true(risk <= 13);
    run_early(51, late_sharp_head, trained_loss, 0, &risk, &drop);
    assert_int_equal(risk, -1);
}

/* A verdict and a transition list at most ALERT_MAX_CELLS_LISTED heads
 * (the first, in layer-major order) and count them all: a collapse of 300
 * of 32 x 32 heads lists 256 and says 300, and a 301st head joining is a
 * change; the FIRING lists 256 of 300 and says 300. */
static void test_verdict_cells_capped(void **state) {
    (void)state;
    enum { VL = 32, VH = 32, N = VL * VH };
    struct alert_rules *r =
        rules("{\"rules\":[{\"name\":\"entropy_collapse\",\"metric\":\"entropy_norm\",\"scope\":\"head\","
              "\"condition\":{\"op\":\"below\",\"value\":0.1},\"for\":5,\"keep_firing_for\":3,"
              "\"annotations\":{\"description\":\"at {cells}\"}}]}");
    struct alert_engine *e = alert_engine_create(r);
    struct writer_item *it = calloc(1, sizeof *it);
    it->kind = WRITER_HELLO;
    it->run_id = 9;
    snprintf(it->msg.run, sizeof it->msg.run, "wide");
    it->msg.layers = VL;
    it->msg.heads = VH;
    feed(e, it);
    static float x[N];
    for (int s = 0; s < 3; s++) {
        for (int i = 0; i < N; i++) x[i] = i < 300 + (s == 2) ? 0.01f : 0.8f;
        it = calloc(1, sizeof *it);
        it->kind = WRITER_STEP;
        it->run_id = 9;
        it->msg.step = s;
        msg_add(&it->msg, "entropy_norm", PROTO_HEAD, VL, VH, x);
        alert_feed(e, it, 1000.0 + s);
        writer_item_free(it);
        const struct alert_verdict *v = alert_verdict_changed(e);
        if (s == 1) {
            assert_null(v); /* the same 300 heads pending: no change */
            continue;
        }
        assert_non_null(v);
        assert_int_equal(v->state, ALERT_V_COLLAPSING);
        assert_int_equal(v->ncells, ALERT_MAX_CELLS_LISTED);
        assert_int_equal(v->ncells_total, s == 2 ? 301 : 300);
        assert_int_equal(v->cells[255].layer, 255 / VH);
        assert_int_equal(v->cells[255].head, 255 % VH);
    }
    /* firing (held for 5 steps) lists 256 cells and counts them all */
    int fired = 0;
    for (int s = 3; s < 8 && !fired; s++) {
        it = calloc(1, sizeof *it);
        it->kind = WRITER_STEP;
        it->run_id = 9;
        it->msg.step = s;
        msg_add(&it->msg, "entropy_norm", PROTO_HEAD, VL, VH, x);
        int n = alert_feed(e, it, 1000.0 + s);
        writer_item_free(it);
        for (int i = 0; i < n; i++) {
            const struct alert_transition *t = alert_transition_at(e, i);
            if (t->state != ALERT_FIRING) continue;
            fired = 1;
            assert_int_equal(t->ncells, ALERT_MAX_CELLS_LISTED);
            assert_int_equal(t->ncells_total, 300); /* the 301st began 2 steps later */
            char *json = alert_transition_json(t);
            assert_non_null(strstr(json, "\"ncells\":300"));
            assert_non_null(strstr(json, "and 288 more"));
            assert_true(strlen(json) < 16384); /* not 301 cells' worth (nor 350k's) */
            free(json);
        }
    }
    assert_true(fired);
    alert_engine_destroy(e);
    alert_rules_free(r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_below_for_and_keep_firing_for),
        cmocka_unit_test(test_steps_past_32_bits),
        cmocka_unit_test(test_blip_shorter_than_for_does_not_fire),
        cmocka_unit_test(test_grouping_and_updates),
        cmocka_unit_test(test_end_resolves_and_json_resolved),
        cmocka_unit_test(test_verdict_collapse_outlives_the_run),
        cmocka_unit_test(test_verdict_diverged_and_recovery),
        cmocka_unit_test(test_drop_growth_zscore_nonfinite),
        cmocka_unit_test(test_near_bound_and_stalled),
        cmocka_unit_test(test_and_guard),
        cmocka_unit_test(test_bad_rules_name_their_line),
        cmocka_unit_test(test_rollback_restarts_windows),
        cmocka_unit_test(test_rollback_after_start_keeps_firing),
        cmocka_unit_test(test_rollback_abandons_per_cell),
        cmocka_unit_test(test_daemon_clock_not_trainer_clock),
        cmocka_unit_test(test_resume_earlier_episode),
        cmocka_unit_test(test_state_bytes_per_head),
        cmocka_unit_test(test_flicker_with_stuck_loss_collapses),
        cmocka_unit_test(test_sharp_head_while_training_is_not_collapse),
        cmocka_unit_test(test_hysteresis_and_at_least_of_last),
        cmocka_unit_test(test_issue34_rules_refused),
        cmocka_unit_test(test_verdict_cells_capped),
        cmocka_unit_test(test_builtin_collapse_risk),
        cmocka_unit_test(test_builtin_early_collapse),
        cmocka_unit_test(test_update_at_most_once_a_second),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
