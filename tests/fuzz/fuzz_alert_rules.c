/* fuzz_alert_rules: libFuzzer harness for the alert rules-file parser
 * (daemon/alert.c, alert_rules_parse). Built and run by `make fuzz` and
 * scripts/run-fuzz.sh; not a unit test.
 *
 * The input is a rules file. It is copied into a buffer of exactly its size
 * (no NUL after it) so that a read past the end shows under ASan. When the
 * file parses, the rules also drive an engine for a few steps whose values
 * come from the input's bytes (NaN and infinities included), and every
 * transition is formatted as JSON: a rule that parses must be usable. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alert.h"

#define FL 2
#define FH 2

static float value_at(const uint8_t *d, size_t n, size_t i) {
    if (!n) return 0.5f;
    uint8_t b = d[i % n];
    if (b == 0xff) return NAN;
    if (b == 0xfe) return INFINITY;
    if (b == 0xfd) return -INFINITY;
    return (float)(b - 100) / 10.0f;
}

/* One step carrying every metric the rules name, each with the kind its
 * rule's scope wants (a name used under two scopes gets the first). */
static void feed_step(struct alert_engine *e, const struct alert_rules *rs, int64_t step, const uint8_t *d, size_t n) {
    struct writer_item it = {.kind = WRITER_STEP, .run_id = 1, .seq = step + 1, .time = 1764500000.0 + step};
    struct proto_msg *m = &it.msg;
    m->type = PROTO_STEP;
    m->has_seq = 1;
    m->seq = it.seq;
    m->step = step;
    struct proto_metric metrics[64];
    float values[64 * FL * FH];
    uint32_t nm = 0, nv = 0;
    for (int i = 0; i < rs->n && nm < 64; i++) {
        const struct alert_rule *r = &rs->rules[i];
        const char *names[5] = {r->metric, r->bound_metric, r->rising_metric, r->and_metric, r->unless_metric};
        for (int k = 0; k < 5 && nm < 64; k++) {
            if (!names[k] || strlen(names[k]) > PROTO_MAX_NAME) continue;
            int dup = 0;
            for (uint32_t j = 0; j < nm; j++) dup |= strcmp(metrics[j].name, names[k]) == 0;
            if (dup) continue;
            struct proto_metric *x = &metrics[nm++];
            memset(x, 0, sizeof *x);
            strcpy(x->name, names[k]);
            x->kind = k == 4                          ? PROTO_SCALAR /* unless_training reads a scalar */
                      : r->scope == ALERT_SCOPE_HEAD  ? PROTO_HEAD
                      : r->scope == ALERT_SCOPE_LAYER ? PROTO_LAYER
                                                      : PROTO_SCALAR;
            x->rows = x->kind == PROTO_SCALAR ? 1 : FL;
            x->cols = x->kind == PROTO_HEAD ? FH : 1;
            x->offset = nv;
            for (uint32_t v = 0; v < x->rows * x->cols; v++, nv++) values[nv] = value_at(d, n, (size_t)(step * 7 + nv));
        }
    }
    m->nmetrics = nm;
    m->metrics = metrics;
    m->nvalues = nv;
    m->values = values;
    int t = alert_feed(e, &it, it.time);
    for (int i = 0; i < t; i++) free(alert_transition_json(alert_transition_at(e, i)));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1u << 20)) return 0;
    char *text = malloc(size ? size : 1);
    if (!text) return 0;
    memcpy(text, data, size);
    char err[512];
    memset(err, 'x', sizeof err);
    struct alert_rules *rs = alert_rules_parse(text, size, err, sizeof err);
    if (!rs && !memchr(err, 0, sizeof err)) abort(); /* a refused file must come with a message */
    if (rs) {
        struct alert_engine *e = alert_engine_create(rs);
        if (e) {
            struct writer_item hello = {.kind = WRITER_HELLO, .run_id = 1, .time = 1764500000.0};
            hello.msg.type = PROTO_HELLO;
            strcpy(hello.msg.run, "fuzz");
            hello.msg.layers = FL;
            hello.msg.heads = FH;
            hello.msg.seq_len = 8;
            alert_feed(e, &hello, hello.time);
            for (int64_t s = 0; s < 40; s++) feed_step(e, rs, s, data, size);
            int t = alert_tick(e, 1764500000.0 + 1e6); /* stalled rules fire */
            for (int i = 0; i < t; i++) free(alert_transition_json(alert_transition_at(e, i)));
            struct writer_item end = {.kind = WRITER_END, .run_id = 1, .seq = 41, .time = 1764500100.0};
            end.msg.type = PROTO_END;
            end.msg.status = PROTO_FINISHED;
            t = alert_feed(e, &end, end.time);
            for (int i = 0; i < t; i++) free(alert_transition_json(alert_transition_at(e, i)));
            alert_engine_destroy(e);
        }
        alert_rules_free(rs);
    }
    free(text);
    return 0;
}
