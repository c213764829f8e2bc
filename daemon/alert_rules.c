/* alert_rules.c: alert rules: the JSON parser (a rules file, or the
 * built-in set embedded from schema/default_rules.json) and the rules'
 * names. Not the engine that evaluates them (alert.c). See alert_rules.h. */
#include "alert_rules.h"

#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "embed.h"

static const char *const verdict_names[ALERT_V_COUNT] = {"healthy",  "collapsing", "collapsed",
                                                         "diverged", "stalled",    "sharp"};

const char *alert_verdict_name(int v) { return v >= 0 && v < ALERT_V_COUNT ? verdict_names[v] : "healthy"; }

/* ---- parsing ---- */

static int line_of(const char *text, size_t len, const char *at) {
    int line = 1;
    for (const char *p = text; p < at && p < text + len; p++)
        if (*p == '\n') line++;
    return line;
}

/* Best-effort line of a rule: where its name appears in the text. */
static int rule_line(const char *text, size_t len, const char *name, int idx) {
    if (name) {
        char pat[300];
        snprintf(pat, sizeof pat, "\"%.280s\"", name);
        const char *p = memmem(text, len, pat, strlen(pat));
        if (p) return line_of(text, len, p);
    }
    /* fall back to the idx-th '{' after "rules" */
    const char *p = memmem(text, len, "\"rules\"", 7);
    int seen = -1;
    for (; p && p < text + len; p++)
        if (*p == '{' && ++seen == idx) return line_of(text, len, p);
    return 0;
}

static char *dupstr(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* *dst = a copy of src; on out of memory says so in why and returns -1. */
static int copy_str(char **dst, const char *src, char *why, size_t whylen) {
    if ((*dst = dupstr(src))) return 0;
    snprintf(why, whylen, "out of memory");
    return -1;
}

static void rule_free(struct alert_rule *r) {
    free(r->name);
    free(r->metric);
    free(r->bound_metric);
    free(r->rising_metric);
    free(r->and_metric);
    free(r->unless_metric);
    free(r->severity);
    for (int i = 0; i < r->nlabels; i++) {
        free(r->labels[i].key);
        free(r->labels[i].value);
    }
    for (int i = 0; i < r->nannotations; i++) {
        free(r->annotations[i].key);
        free(r->annotations[i].value);
    }
}

void alert_rules_free(struct alert_rules *r) {
    if (!r) return;
    for (int i = 0; i < r->n; i++) rule_free(&r->rules[i]);
    free(r->rules);
    free(r);
}

static const char *const scope_names[] = {"head", "layer", "scalar", "run"};
static const char *const op_names[] = {"below",  "above",     "drop",       "growth",
                                       "zscore", "nonfinite", "near_bound", "stalled"};

static int parse_kv(cJSON *obj, struct alert_kv *kv, int *n, char *why, size_t whylen, const char *what) {
    if (!obj) return 0;
    if (!cJSON_IsObject(obj)) {
        snprintf(why, whylen, "%s must be an object of strings", what);
        return -1;
    }
    cJSON *it;
    cJSON_ArrayForEach(it, obj) {
        if (!cJSON_IsString(it)) {
            snprintf(why, whylen, "%s.%s must be a string", what, it->string);
            return -1;
        }
        if (*n >= ALERT_MAX_LABELS) {
            snprintf(why, whylen, "more than %d %s", ALERT_MAX_LABELS, what);
            return -1;
        }
        struct alert_kv *e = &kv[(*n)++]; /* counted first: rule_free frees what was copied */
        if (copy_str(&e->key, it->string, why, whylen) || copy_str(&e->value, it->valuestring, why, whylen)) return -1;
    }
    return 0;
}

/* Reads a number field of the condition; required when need is set. */
static int num(cJSON *cond, const char *key, double *out, int need, double lo, double hi, char *why, size_t whylen) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(cond, key);
    if (!v) {
        if (!need) return 0;
        snprintf(why, whylen, "condition needs \"%s\"", key);
        return -1;
    }
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi)) {
        snprintf(why, whylen, "condition \"%s\" must be a number in [%g, %g]", key, lo, hi);
        return -1;
    }
    *out = v->valuedouble;
    return 0;
}

/* The condition's optional guard: "and": {"metric": M, "op": "below"|"above",
 * "value": V} -- another metric of the same cell that must hold as well. */
static int parse_and(cJSON *and, struct alert_rule *r, char *why, size_t whylen) {
    cJSON *m = cJSON_GetObjectItemCaseSensitive(and, "metric");
    cJSON *op = cJSON_GetObjectItemCaseSensitive(and, "op");
    if (r->op == ALERT_OP_STALLED || !cJSON_IsObject(and) || !cJSON_IsString(m) || !*m->valuestring ||
        !cJSON_IsString(op) || (strcmp(op->valuestring, "below") && strcmp(op->valuestring, "above"))) {
        snprintf(why, whylen,
                 "condition \"and\" must be {\"metric\": NAME, \"op\": \"below\" or \"above\", "
                 "\"value\": NUMBER} (not with stalled)");
        return -1;
    }
    if (copy_str(&r->and_metric, m->valuestring, why, whylen)) return -1;
    r->and_op = strcmp(op->valuestring, "below") ? ALERT_OP_ABOVE : ALERT_OP_BELOW;
    return num(and, "value", &r->and_value, 1, -1e300, 1e300, why, whylen);
}

/* The run verdict a rule stands for while it fires: "verdict": "collapsed",
 * "diverged", "stalled" or "none". Without one, rules files written before
 * verdicts existed keep meaning what the default set means: a rule named
 * entropy_collapse is a collapse, a nonfinite rule on loss a divergence,
 * a stalled rule a stall; any other rule does not change the verdict. */
static int parse_verdict(cJSON *v, struct alert_rule *r, char *why, size_t whylen) {
    r->verdict = ALERT_V_HEALTHY;
    if (!v) {
        if (!strcmp(r->name, "entropy_collapse")) r->verdict = ALERT_V_COLLAPSED;
        else if (r->op == ALERT_OP_NONFINITE && r->metric && !strcmp(r->metric, "loss")) r->verdict = ALERT_V_DIVERGED;
        else if (r->op == ALERT_OP_STALLED) r->verdict = ALERT_V_STALLED;
        return 0;
    }
    const char *s = cJSON_GetStringValue(v);
    if (s && !strcmp(s, "collapsed")) r->verdict = ALERT_V_COLLAPSED;
    else if (s && !strcmp(s, "diverged")) r->verdict = ALERT_V_DIVERGED;
    else if (s && !strcmp(s, "stalled")) r->verdict = ALERT_V_STALLED;
    else if (!s || strcmp(s, "none")) {
        snprintf(why, whylen, "\"verdict\" must be collapsed, diverged, stalled or none");
        return -1;
    }
    return 0;
}

/* The operands of the rule's condition op (r->op set), its window and its
 * "and" guard. */
static int parse_condition(cJSON *cond, struct alert_rule *r, char *why, size_t whylen) {
    double w = 1;
    switch (r->op) {
    case ALERT_OP_BELOW:
    case ALERT_OP_ABOVE:
        if (num(cond, "value", &r->value, 1, -1e300, 1e300, why, whylen)) return -1;
        if (cJSON_GetObjectItemCaseSensitive(cond, "clear_value")) {
            if (num(cond, "clear_value", &r->clear_value, 1, -1e300, 1e300, why, whylen)) return -1;
            if (r->op == ALERT_OP_BELOW ? r->clear_value < r->value : r->clear_value > r->value) {
                snprintf(why, whylen, "\"clear_value\" must be %s \"value\" (a firing cell holds until it crosses it)",
                         r->op == ALERT_OP_BELOW ? ">=" : "<=");
                return -1;
            }
            r->has_clear = 1;
        }
        break;
    case ALERT_OP_DROP:
        if (num(cond, "pct", &r->pct, 1, 0, 100, why, whylen) || num(cond, "window", &w, 1, 1, 100000, why, whylen))
            return -1;
        break;
    case ALERT_OP_GROWTH:
        r->value = INFINITY;
        r->rate = INFINITY;
        if (num(cond, "value", &r->value, 0, -1e300, 1e300, why, whylen) ||
            num(cond, "rate", &r->rate, 0, -1e300, 1e300, why, whylen) ||
            num(cond, "window", &w, 1, 1, 100000, why, whylen))
            return -1;
        break;
    case ALERT_OP_ZSCORE:
        if (num(cond, "k", &r->k, 1, 0, 1e6, why, whylen) || num(cond, "window", &w, 1, 2, 100000, why, whylen))
            return -1;
        break;
    case ALERT_OP_NONFINITE: break;
    case ALERT_OP_NEAR_BOUND: {
        cJSON *b = cJSON_GetObjectItemCaseSensitive(cond, "bound_metric");
        cJSON *ri = cJSON_GetObjectItemCaseSensitive(cond, "rising_metric");
        if (!cJSON_IsString(b) || !cJSON_IsString(ri)) {
            snprintf(why, whylen, "near_bound needs \"bound_metric\" and \"rising_metric\" names");
            return -1;
        }
        if (copy_str(&r->bound_metric, b->valuestring, why, whylen) ||
            copy_str(&r->rising_metric, ri->valuestring, why, whylen))
            return -1;
        if (num(cond, "epsilon", &r->epsilon, 1, 0, 1e6, why, whylen) ||
            num(cond, "window", &w, 1, 1, 100000, why, whylen))
            return -1;
        break;
    }
    case ALERT_OP_STALLED:
        if (num(cond, "seconds", &r->seconds, 1, 0.001, 1e9, why, whylen)) return -1;
        break;
    }
    if (r->op != ALERT_OP_BELOW && r->op != ALERT_OP_ABOVE && cJSON_GetObjectItemCaseSensitive(cond, "clear_value")) {
        snprintf(why, whylen, "\"clear_value\" goes with below and above only");
        return -1;
    }
    cJSON *and = cJSON_GetObjectItemCaseSensitive(cond, "and");
    if (and&&parse_and(and, r, why, whylen)) return -1;
    if (w != floor(w)) {
        snprintf(why, whylen, "\"window\" must be a whole number of steps");
        return -1;
    }
    r->window = (int)w;
    return 0;
}

/* A whole number of steps >= 0 at o[key] into *out (0 when absent). */
static int steps_field(cJSON *o, const char *key, int64_t *out, char *why, size_t whylen) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = 0;
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e12 || v->valuedouble != floor(v->valuedouble)) {
        snprintf(why, whylen, "\"%s\" must be a whole number of steps >= 0", key);
        return -1;
    }
    *out = (int64_t)v->valuedouble;
    return 0;
}

/* "for": a whole number of consecutive steps, or {"at_least": K,
 * "of_last": N} with 1 <= K <= N <= 64 (N steps of history are one 64-bit
 * word per cell). */
static int parse_for(cJSON *o, struct alert_rule *r, char *why, size_t whylen) {
    cJSON *f = cJSON_GetObjectItemCaseSensitive(o, "for");
    if (!cJSON_IsObject(f)) return steps_field(o, "for", &r->for_steps, why, whylen);
    cJSON *k = cJSON_GetObjectItemCaseSensitive(f, "at_least"), *n = cJSON_GetObjectItemCaseSensitive(f, "of_last");
    double kv = cJSON_IsNumber(k) ? k->valuedouble : -1, nv = cJSON_IsNumber(n) ? n->valuedouble : -1;
    if (cJSON_GetArraySize(f) != 2 || kv != floor(kv) || nv != floor(nv) || kv < 1 || nv > 64 || kv > nv) {
        snprintf(why, whylen,
                 "\"for\" must be a whole number of steps >= 0 or {\"at_least\": K, \"of_last\": N} "
                 "with 1 <= K <= N <= 64");
        return -1;
    }
    if (r->op == ALERT_OP_STALLED) {
        snprintf(why, whylen, "\"for\": {\"at_least\", \"of_last\"} does not go with stalled");
        return -1;
    }
    r->for_steps = (int64_t)kv;
    r->of_last = (int)nv;
    return 0;
}

/* "unless_training": {"metric": M, "below": R} with 0 < R <= 1 (alert_rules.h). */
static int parse_unless(cJSON *u, struct alert_rule *r, char *why, size_t whylen) {
    if (!u) return 0;
    cJSON *m = cJSON_GetObjectItemCaseSensitive(u, "metric"), *b = cJSON_GetObjectItemCaseSensitive(u, "below");
    if (!cJSON_IsObject(u) || cJSON_GetArraySize(u) != 2 || !cJSON_IsString(m) || !*m->valuestring ||
        !cJSON_IsNumber(b) || !(b->valuedouble > 0 && b->valuedouble <= 1) || r->op == ALERT_OP_STALLED) {
        snprintf(why, whylen,
                 "\"unless_training\" must be {\"metric\": SCALAR, \"below\": R} with 0 < R <= 1 "
                 "(not with stalled)");
        return -1;
    }
    r->unless_below = b->valuedouble;
    return copy_str(&r->unless_metric, m->valuestring, why, whylen);
}

static int parse_rule(cJSON *o, struct alert_rule *r, char *why, size_t whylen) {
    if (!cJSON_IsObject(o)) {
        snprintf(why, whylen, "a rule must be an object");
        return -1;
    }
    cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
    if (!cJSON_IsString(name) || !*name->valuestring || strlen(name->valuestring) > 128) {
        snprintf(why, whylen, "\"name\" must be a string of 1-128 bytes");
        return -1;
    }
    if (copy_str(&r->name, name->valuestring, why, whylen)) return -1;
    cJSON *scope = cJSON_GetObjectItemCaseSensitive(o, "scope");
    r->scope = -1;
    for (int i = 0; scope && cJSON_IsString(scope) && i < 4; i++)
        if (!strcmp(scope->valuestring, scope_names[i])) r->scope = i;
    if (r->scope < 0) {
        snprintf(why, whylen, "\"scope\" must be head, layer, scalar or run");
        return -1;
    }
    cJSON *cond = cJSON_GetObjectItemCaseSensitive(o, "condition");
    cJSON *op = cond ? cJSON_GetObjectItemCaseSensitive(cond, "op") : NULL;
    r->op = -1;
    for (int i = 0; op && cJSON_IsString(op) && i < 8; i++)
        if (!strcmp(op->valuestring, op_names[i])) r->op = i;
    if (!cJSON_IsObject(cond) || r->op < 0) {
        snprintf(why, whylen,
                 "\"condition\" must be an object whose \"op\" is one of below, above, drop, growth, "
                 "zscore, nonfinite, near_bound, stalled");
        return -1;
    }
    if ((r->op == ALERT_OP_STALLED) != (r->scope == ALERT_SCOPE_RUN)) {
        snprintf(why, whylen, "op stalled goes with scope run, and only it");
        return -1;
    }
    cJSON *metric = cJSON_GetObjectItemCaseSensitive(o, "metric");
    if (r->op != ALERT_OP_STALLED) {
        if (!cJSON_IsString(metric) || !*metric->valuestring) {
            snprintf(why, whylen, "\"metric\" must be a metric name");
            return -1;
        }
        if (copy_str(&r->metric, metric->valuestring, why, whylen)) return -1;
    }
    if (parse_condition(cond, r, why, whylen)) return -1;
    if (parse_for(o, r, why, whylen) || steps_field(o, "keep_firing_for", &r->keep_firing_for, why, whylen) ||
        parse_unless(cJSON_GetObjectItemCaseSensitive(o, "unless_training"), r, why, whylen))
        return -1;
    cJSON *sev = cJSON_GetObjectItemCaseSensitive(o, "severity");
    if (sev && !cJSON_IsString(sev)) {
        snprintf(why, whylen, "\"severity\" must be a string");
        return -1;
    }
    if (copy_str(&r->severity, sev ? sev->valuestring : "warning", why, whylen)) return -1;
    if (parse_kv(cJSON_GetObjectItemCaseSensitive(o, "labels"), r->labels, &r->nlabels, why, whylen, "labels") ||
        parse_kv(cJSON_GetObjectItemCaseSensitive(o, "annotations"), r->annotations, &r->nannotations, why, whylen,
                 "annotations"))
        return -1;
    if (parse_verdict(cJSON_GetObjectItemCaseSensitive(o, "verdict"), r, why, whylen)) return -1;
    cJSON *it;
    static const char *const known[] = {
        "name",        "metric",      "scope",   "condition",       "for", "keep_firing_for", "severity", "labels",
        "annotations", "description", "verdict", "unless_training", NULL};
    cJSON_ArrayForEach(it, o) {
        int ok = 0;
        for (int i = 0; known[i]; i++) ok |= !strcmp(it->string, known[i]);
        if (!ok) {
            snprintf(why, whylen, "unknown field \"%s\"", it->string);
            return -1;
        }
    }
    return 0;
}

struct alert_rules *alert_rules_parse(const char *json, size_t len, char *err, size_t errlen) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    struct alert_rules *rs = NULL;
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        snprintf(err, errlen, "line %d: not valid JSON", at ? line_of(json, len, at) : 0);
        return NULL;
    }
    cJSON *arr = cJSON_GetObjectItemCaseSensitive(root, "rules");
    if (!cJSON_IsArray(arr)) {
        snprintf(err, errlen, "line 1: the file must be an object with a \"rules\" array");
        goto out;
    }
    rs = calloc(1, sizeof *rs);
    int n = cJSON_GetArraySize(arr);
    if (!rs || !(rs->rules = calloc((size_t)(n ? n : 1), sizeof *rs->rules))) {
        snprintf(err, errlen, "out of memory");
        free(rs);
        rs = NULL;
        goto out;
    }
    cJSON *o;
    int i = 0;
    cJSON_ArrayForEach(o, arr) {
        char why[400];
        rs->n = i + 1;
        if (parse_rule(o, &rs->rules[i], why, sizeof why)) {
            cJSON *nm = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, "name") : NULL;
            const char *name = cJSON_IsString(nm) ? nm->valuestring : NULL;
            snprintf(err, errlen, "line %d: rule %d%s%s%s: %s", rule_line(json, len, name, i), i + 1, name ? " (" : "",
                     name ? name : "", name ? ")" : "", why);
            alert_rules_free(rs);
            rs = NULL;
            goto out;
        }
        for (int j = 0; j < i; j++)
            if (!strcmp(rs->rules[j].name, rs->rules[i].name)) {
                snprintf(err, errlen, "line %d: rule %d: the name \"%s\" is used twice", rule_line(json, len, NULL, i),
                         i + 1, rs->rules[i].name);
                alert_rules_free(rs);
                rs = NULL;
                goto out;
            }
        i++;
    }
out:
    cJSON_Delete(root);
    return rs;
}

/* Reads and parses a rules file, or, without a path, the built-in rules
 * (schema/default_rules.json, embedded at build), whose thresholds are:
 * Thresholds are tuned on sigmatrain runs (docs/alerts.md, "How the built-in rules were tuned").
 * entropy_collapse ("below V for F steps") fires on a head iff some F + 1
 * consecutive entropy_norm values of it are all below V (alert.c's
 * cell_step: `for` is a span of steps, step - pending_since >= F), i.e. iff
 * V is above the run's (F + 1)-value floor, which is at least the F-step
 * floor (the lowest F-step running maximum of any head) measured below.
 * Measured 20-step floors (docs/experiments.md; 2 layers x 4 heads, C=64,
 * T=64, synthetic corpus): the 15 baseline runs that collapsed and diverged
 * or stalled (Adam lr >= 0.03 pre/no LN, 0.1 post-LN, 3 seeds): 0.000-0.0053.
 * Healthy runs: >= 0.097 after 300 steps, but healthy heads keep sharpening
 * as the model learns copy/recall (near-one-hot attention is the right
 * answer there): the demo's sigmaReparam run (post-LN Adam 0.1, the best
 * model) has a floor of 0.063 at 1000 steps and 0.037 at 3000 (per-step
 * minimum 0.016, eval loss still falling).  0.01 is below every value that
 * healthy head took and ~2x above the worst collapsed floor; 0.05 (the first
 * default) and 0.08 (which split the 300-step runs; it fired on the healthy
 * run at step 841) would flag healthy runs as they train longer.  Missed at
 * 0.01: milder failures whose heads stay in the healthy range (post-LN Adam
 * 3e-2: floor 0.056, loss stalled at 3.7; pre-LN SGD lr 1: 0.069);
 * logit_growth fires on those.
 * entropy_drop: 90%, not 60%: healthy heads sharpen from uniform fast
 * (60% fired on 14 of the 68 runs that did not fail in the 300-step sweep,
 * 9 of them sigmaReparam, and on the demo's sigmaReparam run at step 50);
 * 90% fired on 20 runs, all failures (the 16 that collapsed, 3 that
 * diverged, one whose loss stalled: pre-LN SGD lr 1), 0-141 steps before
 * entropy_collapse began, on no healthy run, and on none of 4 runs of
 * 2000-3000 steps whose heads sharpen slowly to 0.002-0.02 (docs/alerts.md).
 * low_entropy_sigma_rising (called bound_saturation until the bound was
 * made exact): entropy within 0.05 nats of the Theorem 3.1 bound while
 * sigma_qk rises.  With every norm exact the bound is below 1e-6 nats on
 * almost every head after the first steps, so what the rule detects is
 * entropy near zero while sigma_qk rises; its name says so.  At
 * initialisation and while a small sigma_qk keeps a head near uniform, the
 * bound is close to log T and so is the entropy: "within epsilon of the
 * bound" holds trivially. Without its guard
 * (entropy_norm below 0.9) the rule fired on low-lr sigmaReparam runs at
 * steps 76-96 with every head at entropy_norm 1.000; with it, on 11 runs of
 * 300 steps (docs/alerts.md) it fired on the two that collapsed only
 * (pending from steps 21 and 103, the latter 62 steps before
 * entropy_collapse began at 165).
 * collapse_risk, collapse_risk_sigma_qk and collapse_risk_loss: one model,
 * three rules (either firing is the alarm), chosen by make experiments
 * (research/collapse_risk.py, docs/collapse-risk.md) on the tune half of a
 * broad sweep (96 configurations of width, depth, heads, LayerNorm,
 * optimizer, schedule, warmup, clipping and sigmaReparam, 3 seeds, split by
 * configuration) from 546 rules of this language and their ORs: false
 * alarms at most 2.5% of the tune half's healthy runs, every collapse of
 * the first 20 steps flagged no later than entropy_drop, then recall, then
 * median lead.  Short windows (5 steps, for 0 on the sigma_qk rule)
 * because a third of the collapses begin in the first 50 steps: the
 * previous 10-step window and for 10 could not speak before step 21.
 * Judged on the held-out half: recall 68%, false alarms 18%, median lead
 * 14 steps (short of 90% recall, 5% false alarms and a 50-step lead; the
 * false alarms are the growth rules firing on runs that go on training). */
struct alert_rules *alert_rules_load(const char *path, char *err, size_t errlen) {
    if (!path)
        return alert_rules_parse((const char *)default_rules[0].data, (size_t)default_rules[0].size, err, errlen);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot read rules file %s", path);
        return NULL;
    }
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 > cap) {
            cap = cap ? cap * 2 : 8192;
            if (cap > (16u << 20)) {
                snprintf(err, errlen, "rules file %s is larger than 16 MiB", path);
                free(buf);
                fclose(f);
                return NULL;
            }
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                snprintf(err, errlen, "out of memory");
                return NULL;
            }
            buf = nb;
        }
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0) break;
    }
    fclose(f);
    char inner[512];
    struct alert_rules *r = alert_rules_parse(buf, len, inner, sizeof inner);
    if (!r) snprintf(err, errlen, "rules file %s: %s", path, inner);
    free(buf);
    return r;
}
