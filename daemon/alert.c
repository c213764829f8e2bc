/* alert.c: alert rules (parsing) and the evaluation engine. See alert.h. */
#include "alert.h"

#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- default rules ----
 * Thresholds are tuned on sigmatrain runs (README, "Alerts").
 * entropy_collapse ("below V for F steps") fires on a head iff some F
 * consecutive entropy_norm values of it are all below V, i.e. iff V is above
 * the run's F-step floor (the lowest F-step running maximum of any head).
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
 * 2000-3000 steps whose heads sharpen slowly to 0.002-0.02 (README, "Alerts").
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
 * 300 steps (README, "Alerts") it fired on the two that collapsed only
 * (pending from steps 21 and 103, the latter 62 steps before
 * entropy_collapse began at 165).
 * collapse_risk: fires before collapse begins.  Chosen by make experiments
 * (scripts/collapse_risk.py, docs/collapse-risk.md) from 112 candidate
 * rules (growth of max_logit, logit_scale or sigma_qk, drops and floors of
 * entropy_norm, with and without guards) simulated on a tune sweep of 12
 * toy runs (5 collapse, 3 of them after step 195 via warmup to a high peak
 * lr; 6 healthy, 2 of them sigmaReparam at lr 0.1): the best with no false
 * alarm, recall 5/5, median lead 111 steps before entropy_collapse began.
 * Entropy drops (50-80% of a 20-50 step maximum) led by more on the
 * collapsing runs but fired on healthy sigmaReparam and SGD runs, whose
 * heads sharpen from uniform.  Judged on a held-out sweep of a larger model
 * in docs/collapse-risk.md. */
static const char default_rules[] =
    "{\"rules\": [\n"
    "  {\"name\": \"entropy_collapse\", \"metric\": \"entropy_norm\", \"scope\": \"head\",\n"
    "   \"condition\": {\"op\": \"below\", \"value\": 0.01}, \"for\": 20, \"keep_firing_for\": 10,\n"
    "   \"severity\": \"critical\", \"verdict\": \"collapsed\",\n"
    "   \"annotations\": {\"summary\": \"attention entropy collapsed in run {run}\",\n"
    "                   \"description\": \"entropy_norm below 0.01 for 20 steps at {cells} (step {step}, worst {value})\"}},\n"
    "  {\"name\": \"entropy_drop\", \"metric\": \"entropy_norm\", \"scope\": \"head\",\n"
    "   \"condition\": {\"op\": \"drop\", \"pct\": 90, \"window\": 50}, \"for\": 5, \"keep_firing_for\": 20,\n"
    "   \"severity\": \"warning\",\n"
    "   \"annotations\": {\"summary\": \"attention entropy falling fast in run {run}\",\n"
    "                   \"description\": \"entropy_norm fell by more than 90% of its 50-step maximum at {cells}\"}},\n"
    "  {\"name\": \"collapse_risk\", \"metric\": \"max_logit\", \"scope\": \"head\",\n"
    "   \"condition\": {\"op\": \"growth\", \"rate\": 2, \"window\": 20}, \"for\": 5, \"keep_firing_for\": 10,\n"
    "   \"severity\": \"warning\",\n"
    "   \"annotations\": {\"summary\": \"attention entropy collapse likely soon in run {run}\",\n"
    "                   \"description\": \"max_logit grew faster than 2 per step over 20 steps at {cells}: in the tuning sweep collapse followed a median 111 steps later\"}},\n"
    "  {\"name\": \"low_entropy_sigma_rising\", \"metric\": \"entropy\", \"scope\": \"head\",\n"
    "   \"condition\": {\"op\": \"near_bound\", \"bound_metric\": \"entropy_bound\", \"rising_metric\": \"sigma_qk\",\n"
    "                 \"epsilon\": 0.05, \"window\": 20,\n"
    "                 \"and\": {\"metric\": \"entropy_norm\", \"op\": \"below\", \"value\": 0.9}},\n"
    "   \"for\": 10, \"keep_firing_for\": 10,\n"
    "   \"severity\": \"warning\",\n"
    "   \"annotations\": {\"summary\": \"attention entropy near zero while sigma_qk rises in run {run}\",\n"
    "                   \"description\": \"entropy within 0.05 nats of its Theorem 3.1 lower bound (near 0 once the logits grow) while sigma_qk rises, the head no longer near uniform, at {cells}\"}},\n"
    "  {\"name\": \"logit_growth\", \"metric\": \"max_logit\", \"scope\": \"head\",\n"
    "   \"condition\": {\"op\": \"growth\", \"value\": 1000, \"rate\": 5, \"window\": 50}, \"for\": 5, \"keep_firing_for\": 10,\n"
    "   \"severity\": \"warning\",\n"
    "   \"annotations\": {\"summary\": \"attention logits growing in run {run}\",\n"
    "                   \"description\": \"max_logit above 1000 or growing faster than 5 per step at {cells}\"}},\n"
    "  {\"name\": \"loss_spike\", \"metric\": \"loss\", \"scope\": \"scalar\",\n"
    "   \"condition\": {\"op\": \"zscore\", \"k\": 7, \"window\": 200}, \"for\": 0, \"keep_firing_for\": 20,\n"
    "   \"severity\": \"warning\",\n"
    "   \"annotations\": {\"summary\": \"loss spike in run {run}\",\n"
    "                   \"description\": \"loss {value} more than 7 standard deviations above its 200-step mean at step {step}\"}},\n"
    "  {\"name\": \"loss_nonfinite\", \"metric\": \"loss\", \"scope\": \"scalar\",\n"
    "   \"condition\": {\"op\": \"nonfinite\"}, \"for\": 0, \"keep_firing_for\": 0, \"severity\": \"critical\",\n"
    "   \"verdict\": \"diverged\",\n"
    "   \"annotations\": {\"summary\": \"loss is not finite in run {run}\",\n"
    "                   \"description\": \"the loss became NaN or infinite at step {step}\"}},\n"
    "  {\"name\": \"run_stalled\", \"scope\": \"run\", \"condition\": {\"op\": \"stalled\", \"seconds\": 120},\n"
    "   \"for\": 0, \"keep_firing_for\": 0, \"severity\": \"warning\", \"verdict\": \"stalled\",\n"
    "   \"annotations\": {\"summary\": \"run {run} sent nothing for 120 s\",\n"
    "                   \"description\": \"the trainer is connected but silent\"}}\n"
    "]}\n";

const char *alert_default_rules_json(void) { return default_rules; }

static const char *const verdict_names[ALERT_V_COUNT] = {"healthy", "collapsing", "collapsed", "diverged", "stalled"};

const char *alert_verdict_name(int v) { return v >= 0 && v < ALERT_V_COUNT ? verdict_names[v] : "healthy"; }

const char *alert_reason_name(int reason) {
    return reason == ALERT_REASON_RUN_ENDED ? "run_ended" : reason == ALERT_REASON_RUN_DELETED ? "run_deleted" : NULL;
}

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
    free(r->severity);
    for (int i = 0; i < r->nlabels; i++) { free(r->labels[i].key); free(r->labels[i].value); }
    for (int i = 0; i < r->nannotations; i++) { free(r->annotations[i].key); free(r->annotations[i].value); }
}

void alert_rules_free(struct alert_rules *r) {
    if (!r) return;
    for (int i = 0; i < r->n; i++) rule_free(&r->rules[i]);
    free(r->rules);
    free(r);
}

static const char *const scope_names[] = {"head", "layer", "scalar", "run"};
static const char *const op_names[] = {"below", "above", "drop", "growth", "zscore", "nonfinite", "near_bound", "stalled"};

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
        if (copy_str(&e->key, it->string, why, whylen) || copy_str(&e->value, it->valuestring, why, whylen))
            return -1;
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
        snprintf(why, whylen, "condition \"and\" must be {\"metric\": NAME, \"op\": \"below\" or \"above\", "
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
        snprintf(why, whylen, "\"condition\" must be an object whose \"op\" is one of below, above, drop, growth, "
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
    double w = 1;
    switch (r->op) {
    case ALERT_OP_BELOW: case ALERT_OP_ABOVE:
        if (num(cond, "value", &r->value, 1, -1e300, 1e300, why, whylen)) return -1;
        break;
    case ALERT_OP_DROP:
        if (num(cond, "pct", &r->pct, 1, 0, 100, why, whylen) || num(cond, "window", &w, 1, 1, 100000, why, whylen)) return -1;
        break;
    case ALERT_OP_GROWTH:
        r->value = INFINITY;
        r->rate = INFINITY;
        if (num(cond, "value", &r->value, 0, -1e300, 1e300, why, whylen) ||
            num(cond, "rate", &r->rate, 0, -1e300, 1e300, why, whylen) ||
            num(cond, "window", &w, 1, 1, 100000, why, whylen)) return -1;
        break;
    case ALERT_OP_ZSCORE:
        if (num(cond, "k", &r->k, 1, 0, 1e6, why, whylen) || num(cond, "window", &w, 1, 2, 100000, why, whylen)) return -1;
        break;
    case ALERT_OP_NONFINITE:
        break;
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
        if (num(cond, "epsilon", &r->epsilon, 1, 0, 1e6, why, whylen) || num(cond, "window", &w, 1, 1, 100000, why, whylen))
            return -1;
        break;
    }
    case ALERT_OP_STALLED:
        if (num(cond, "seconds", &r->seconds, 1, 0.001, 1e9, why, whylen)) return -1;
        break;
    }
    cJSON *and = cJSON_GetObjectItemCaseSensitive(cond, "and");
    if (and && parse_and(and, r, why, whylen)) return -1;
    if (w != floor(w)) {
        snprintf(why, whylen, "\"window\" must be a whole number of steps");
        return -1;
    }
    r->window = (int)w;
    double f = 0, k = 0;
    cJSON *fo = cJSON_GetObjectItemCaseSensitive(o, "for");
    cJSON *ko = cJSON_GetObjectItemCaseSensitive(o, "keep_firing_for");
    if (fo && (!cJSON_IsNumber(fo) || fo->valuedouble < 0 || fo->valuedouble > 1e12 || fo->valuedouble != floor(fo->valuedouble))) {
        snprintf(why, whylen, "\"for\" must be a whole number of steps >= 0");
        return -1;
    }
    if (ko && (!cJSON_IsNumber(ko) || ko->valuedouble < 0 || ko->valuedouble > 1e12 || ko->valuedouble != floor(ko->valuedouble))) {
        snprintf(why, whylen, "\"keep_firing_for\" must be a whole number of steps >= 0");
        return -1;
    }
    if (fo) f = fo->valuedouble;
    if (ko) k = ko->valuedouble;
    r->for_steps = (int64_t)f;
    r->keep_firing_for = (int64_t)k;
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
    static const char *const known[] = {"name", "metric", "scope", "condition", "for", "keep_firing_for",
                                        "severity", "labels", "annotations", "description", "verdict", NULL};
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
            snprintf(err, errlen, "line %d: rule %d%s%s%s: %s", rule_line(json, len, name, i), i + 1,
                     name ? " (" : "", name ? name : "", name ? ")" : "", why);
            alert_rules_free(rs);
            rs = NULL;
            goto out;
        }
        for (int j = 0; j < i; j++)
            if (!strcmp(rs->rules[j].name, rs->rules[i].name)) {
                snprintf(err, errlen, "line %d: rule %d: the name \"%s\" is used twice",
                         rule_line(json, len, NULL, i), i + 1, rs->rules[i].name);
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

struct alert_rules *alert_rules_load(const char *path, char *err, size_t errlen) {
    if (!path) return alert_rules_parse(default_rules, sizeof default_rules - 1, err, errlen);
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
            if (!nb) { free(buf); fclose(f); snprintf(err, errlen, "out of memory"); return NULL; }
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

/* ---- engine ---- */

struct cell_state {
    int64_t pending_since;   /* -1 when the condition is not holding */
    int64_t clear_since;     /* -1 unless firing and clear */
    int64_t fired_from;      /* while firing: the step its condition began to hold; else -1 */
    int firing;
    float last;
    /* running summaries of the cell's window, kept in O(1) per step */
    float mx;                /* max of the finite values in the ring (-inf if none) */
    double sum, sumsq;       /* of the finite values in the ring */
    int nfinite;
};

/* The state of one rule in one run. ring holds, per cell, the last `window`
 * values of the watched series (the metric itself; the rising metric for
 * near_bound). */
struct group {
    int ncells;
    struct cell_state *cells;
    float *ring;
    int ring_n, ring_pos;    /* shared by all cells: they advance together */
    int firing;
    int nfiring;
    int npending;            /* cells whose condition holds but that do not fire yet */
    double starts_at;
    int64_t start_step;
    struct alert_cell *last_cells;   /* what fired, for RESOLVED and UPDATE detection */
    int nlast;
};

struct run_state {
    int64_t id;
    char *name;
    int64_t layers, heads;
    int live;
    int stale;               /* went stale (connection closed without end) */
    int failed;              /* ended with status failed */
    double last_seen;
    int64_t last_step;
    struct group *groups;    /* one per rule; cell state allocated on first use */
    /* the verdict last reported (alert_verdict_changed), to report changes only */
    int vstate;
    int64_t vsince;
    const struct alert_rule *vrule;
    uint64_t vcells_hash;
    int vdirty;              /* a tick changed it while another run's verdict was being reported */
    struct run_state *hnext; /* hash chain */
};

/* Runs by id in a chained hash table that doubles as it fills, so that
 * finding a run costs the same with 10 runs held as with 100,000. Only
 * runs that may still send are held: one that ends or is deleted is
 * released (its final verdict reported first), and comes back fresh with
 * its next hello. */
struct alert_engine {
    const struct alert_rules *rules;
    struct run_state **buckets;
    size_t nbuckets, nruns;
    struct run_state *released; /* released by the last feed; freed at the next (transitions name it) */
    int ntr, captr;
    struct alert_transition *tr;
    /* cells of transitions: owned per transition, freed at the next feed */
    struct alert_cell **tr_cells;
    struct alert_stats stats;
    int verdict_changed;
    struct alert_verdict verdict;
    struct alert_cell *vcells;
    int vcap;
    alert_resume_fn *resume;    /* may be NULL */
    void *resume_ctx;
};

struct alert_engine *alert_engine_create(const struct alert_rules *rules) {
    struct alert_engine *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->rules = rules;
    e->nbuckets = 64;
    if (!(e->buckets = calloc(e->nbuckets, sizeof *e->buckets))) {
        free(e);
        return NULL;
    }
    return e;
}

void alert_engine_set_resume(struct alert_engine *e, alert_resume_fn *fn, void *ctx) {
    e->resume = fn;
    e->resume_ctx = ctx;
}

static void group_free(struct group *g) {
    free(g->cells);
    free(g->ring);
    free(g->last_cells);
}

static void run_free(const struct alert_rules *rules, struct run_state *r) {
    if (r->groups)
        for (int i = 0; i < rules->n; i++) group_free(&r->groups[i]);
    free(r->groups);
    free(r->name);
    free(r);
}

static void clear_transitions(struct alert_engine *e) {
    for (int i = 0; i < e->ntr; i++) free(e->tr_cells[i]);
    e->ntr = 0;
    e->verdict_changed = 0;
    while (e->released) {
        struct run_state *n = e->released->hnext;
        run_free(e->rules, e->released);
        e->released = n;
    }
}

void alert_engine_destroy(struct alert_engine *e) {
    if (!e) return;
    clear_transitions(e);
    free(e->tr);
    free(e->tr_cells);
    for (size_t b = 0; b < e->nbuckets; b++)
        while (e->buckets[b]) {
            struct run_state *n = e->buckets[b]->hnext;
            run_free(e->rules, e->buckets[b]);
            e->buckets[b] = n;
        }
    free(e->buckets);
    free(e->vcells);
    free(e);
}

static size_t bucket_of(const struct alert_engine *e, int64_t id) {
    uint64_t h = (uint64_t)id * 0x9E3779B97F4A7C15ULL;
    return (size_t)(h >> 32) & (e->nbuckets - 1);
}

/* Doubles the table (best effort: a failed grow keeps the old one). */
static void runs_grow(struct alert_engine *e) {
    size_t nb = e->nbuckets * 2;
    struct run_state **b = calloc(nb, sizeof *b);
    if (!b) return;
    struct run_state **old = e->buckets;
    size_t onb = e->nbuckets;
    e->buckets = b;
    e->nbuckets = nb;
    for (size_t i = 0; i < onb; i++)
        while (old[i]) {
            struct run_state *r = old[i];
            old[i] = r->hnext;
            size_t k = bucket_of(e, r->id);
            r->hnext = b[k];
            b[k] = r;
        }
    free(old);
}

static struct run_state *run_find(struct alert_engine *e, int64_t id, int create) {
    for (struct run_state *r = e->buckets[bucket_of(e, id)]; r; r = r->hnext)
        if (r->id == id) return r;
    if (!create) return NULL;
    struct run_state *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->id = id;
    r->last_step = -1;
    r->vsince = -1;
    char nm[32];
    snprintf(nm, sizeof nm, "run-%lld", (long long)id);
    r->name = dupstr(nm);
    r->groups = calloc((size_t)(e->rules->n ? e->rules->n : 1), sizeof *r->groups);
    if (!r->name || !r->groups) {
        run_free(e->rules, r);
        return NULL;
    }
    if (e->nruns >= 2 * e->nbuckets) runs_grow(e);
    size_t k = bucket_of(e, id);
    r->hnext = e->buckets[k];
    e->buckets[k] = r;
    e->nruns++;
    return r;
}

/* Takes a run out of the table; it is freed at the next feed (the
 * transitions of this one still point at its name). */
static void run_release(struct alert_engine *e, struct run_state *r) {
    for (struct run_state **p = &e->buckets[bucket_of(e, r->id)]; *p; p = &(*p)->hnext)
        if (*p == r) {
            *p = r->hnext;
            e->nruns--;
            r->hnext = e->released;
            e->released = r;
            return;
        }
}

/* Bytes a run's state holds. */
static uint64_t run_bytes(const struct alert_engine *e, const struct run_state *r) {
    uint64_t b = sizeof *r + (size_t)e->rules->n * sizeof *r->groups;
    for (int k = 0; k < e->rules->n; k++) {
        const struct group *g = &r->groups[k];
        int w = e->rules->rules[k].window > 0 ? e->rules->rules[k].window : 1;
        b += (uint64_t)g->ncells * (sizeof *g->cells + sizeof *g->last_cells + (uint64_t)w * sizeof(float));
    }
    return b;
}

void alert_engine_usage(const struct alert_engine *e, uint64_t *runs, uint64_t *bytes) {
    uint64_t b = 0;
    for (size_t i = 0; i < e->nbuckets; i++)
        for (const struct run_state *r = e->buckets[i]; r; r = r->hnext) b += run_bytes(e, r);
    *runs = e->nruns;
    *bytes = b;
}

uint64_t alert_released_bytes(const struct alert_engine *e) {
    uint64_t b = 0;
    for (const struct run_state *r = e->released; r; r = r->hnext) b += run_bytes(e, r);
    return b;
}

static int cells_of(const struct alert_rule *rule, const struct run_state *r) {
    switch (rule->scope) {
    case ALERT_SCOPE_HEAD: return (int)(r->layers * r->heads);
    case ALERT_SCOPE_LAYER: return (int)r->layers;
    default: return 1;
    }
}

/* Allocates a group's state for n cells (once; shapes are fixed per run). */
static int group_init(struct group *g, const struct alert_rule *rule, int n) {
    if (g->cells && g->ncells == n) return 0;
    group_free(g);
    memset(g, 0, sizeof *g);
    g->cells = calloc((size_t)n, sizeof *g->cells);
    g->last_cells = calloc((size_t)n, sizeof *g->last_cells);
    int w = rule->window > 0 ? rule->window : 1;
    g->ring = calloc((size_t)n * (size_t)w, sizeof *g->ring);
    if (!g->cells || !g->last_cells || !g->ring) {
        group_free(g);
        memset(g, 0, sizeof *g);
        return -1;
    }
    g->ncells = n;
    for (int i = 0; i < n; i++) {
        g->cells[i].pending_since = g->cells[i].clear_since = g->cells[i].fired_from = -1;
        g->cells[i].mx = -INFINITY;
    }
    return 0;
}

/* Recomputes a cell's window summaries from its ring (count values). */
static void ring_rescan(struct cell_state *c, const float *ring, int count) {
    c->mx = -INFINITY;
    c->sum = c->sumsq = 0;
    c->nfinite = 0;
    for (int i = 0; i < count; i++) {
        float x = ring[i];
        if (!isfinite(x)) continue;
        if (x > c->mx) c->mx = x;
        c->sum += x;
        c->sumsq += (double)x * x;
        c->nfinite++;
    }
}

/* Puts x into the cell's window at pos, keeping only the summary the rule's
 * op reads: the max for drop (rescanned only when the value leaving was the
 * max), the sums for zscore (rescanned once per lap of the ring to shed
 * rounding drift); growth and near_bound read the ring itself. */
static void ring_push(int op, struct cell_state *c, float *ring, int w, int ring_n, int pos, float x) {
    int full = ring_n >= w;
    float out = full ? ring[pos] : NAN;
    ring[pos] = x;
    int count = full ? w : ring_n + 1;
    if (op == ALERT_OP_DROP) {
        if (isfinite(out) && out >= c->mx && !(isfinite(x) && x >= out)) {
            ring_rescan(c, ring, count);
        } else if (isfinite(x) && x > c->mx) {
            c->mx = x;
        }
    } else if (op == ALERT_OP_ZSCORE) {
        if (pos == w - 1) {
            ring_rescan(c, ring, count);
            return;
        }
        if (isfinite(out)) {
            c->sum -= out;
            c->sumsq -= (double)out * out;
            c->nfinite--;
        }
        if (isfinite(x)) {
            c->sum += x;
            c->sumsq += (double)x * x;
            c->nfinite++;
        }
    }
}

static struct alert_transition *tr_add(struct alert_engine *e, int state, const struct alert_rule *rule,
                                       struct run_state *r, struct group *g, int64_t step, double time) {
    if (e->ntr == e->captr) {
        int cap = e->captr ? e->captr * 2 : 16;
        struct alert_transition *t = realloc(e->tr, (size_t)cap * sizeof *t);
        if (!t) return NULL;
        e->tr = t;
        struct alert_cell **c = realloc(e->tr_cells, (size_t)cap * sizeof *c);
        if (!c) return NULL;
        e->tr_cells = c;
        e->captr = cap;
    }
    struct alert_transition *t = &e->tr[e->ntr];
    struct alert_cell *cells = malloc((size_t)(g->nlast ? g->nlast : 1) * sizeof *cells);
    if (!cells) return NULL;
    memcpy(cells, g->last_cells, (size_t)g->nlast * sizeof *cells);
    e->tr_cells[e->ntr++] = cells;
    /* FNV-1a over the identifying labels, each followed by a 0 byte */
    uint64_t h = 1469598103934665603ULL;
    const char *parts[2 + 2 * ALERT_MAX_LABELS] = {rule->name, r->name};
    int np = 2;
    for (int i = 0; i < rule->nlabels; i++) {
        parts[np++] = rule->labels[i].key;
        parts[np++] = rule->labels[i].value;
    }
    for (int i = 0; i < np; i++) {
        for (const char *p = parts[i]; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ULL;
        h *= 1099511628211ULL;
    }
    double worst = NAN;
    for (int i = 0; i < g->nlast; i++) {
        double v = cells[i].value;
        if (isnan(worst)) worst = v;
        else if (rule->op == ALERT_OP_BELOW || rule->op == ALERT_OP_DROP || rule->op == ALERT_OP_NEAR_BOUND) {
            if (v < worst) worst = v;
        } else if (v > worst) worst = v;
    }
    *t = (struct alert_transition){.state = state, .rule = rule, .run_id = r->id, .run_name = r->name,
                                   .fingerprint = h, .starts_at = g->starts_at, .at = time,
                                   /* a wall clock stepped back must not end an alert before it began
                                    * (Alertmanager refuses endsAt < startsAt) */
                                   .ends_at = state == ALERT_RESOLVED ? fmax(time, g->starts_at) : 0,
                                   .start_step = g->start_step,
                                   .step = step, .ncells = g->nlast, .cells = cells, .value = worst};
    e->stats.transitions++;
    return t;
}

/* After a group's cells were updated at `step`, emits its transition. */
static int group_settle(struct alert_engine *e, const struct alert_rule *rule, struct run_state *r, struct group *g,
                        int64_t step, double time) {
    int n = 0, changed = 0;
    int64_t earliest = -1;
    for (int i = 0; i < g->ncells; i++) {
        if (!g->cells[i].firing) continue;
        int layer = -1, head = -1;
        if (rule->scope == ALERT_SCOPE_HEAD) {
            layer = (int)(i / r->heads);
            head = (int)(i % r->heads);
        } else if (rule->scope == ALERT_SCOPE_LAYER) {
            layer = i;
        }
        if (n >= g->nlast || g->last_cells[n].layer != layer || g->last_cells[n].head != head) changed = 1;
        n++;
        if (g->cells[i].pending_since >= 0 && (earliest < 0 || g->cells[i].pending_since < earliest))
            earliest = g->cells[i].pending_since;
    }
    if (n != g->nlast) changed = 1;
    if (n > 0) {
        /* remember the firing cells (with their latest values) */
        int j = 0;
        for (int i = 0; i < g->ncells; i++) {
            if (!g->cells[i].firing) continue;
            g->last_cells[j].layer = rule->scope == ALERT_SCOPE_HEAD ? (int32_t)(i / r->heads)
                                     : rule->scope == ALERT_SCOPE_LAYER ? i : -1;
            g->last_cells[j].head = rule->scope == ALERT_SCOPE_HEAD ? (int32_t)(i % r->heads) : -1;
            g->last_cells[j].value = g->cells[i].last;
            j++;
        }
        g->nlast = n;
    }
    struct alert_transition *t = NULL;
    if (!g->firing && n > 0) {
        g->firing = 1;
        g->starts_at = time;
        g->start_step = earliest >= 0 ? earliest : step;
        int resumed = e->resume && e->resume(e->resume_ctx, r->id, rule->name, &g->starts_at, &g->start_step) == 1;
        t = tr_add(e, ALERT_FIRING, rule, r, g, step, time);
        if (t) t->resumed = resumed;
    } else if (g->firing && n == 0) {
        g->firing = 0;
        t = tr_add(e, ALERT_RESOLVED, rule, r, g, step, time);
        g->nlast = 0;
    } else if (g->firing && changed) {
        t = tr_add(e, ALERT_UPDATE, rule, r, g, step, time);
    } else {
        return 0;
    }
    return t ? 1 : -1;
}

static const struct proto_metric *find_metric(const struct proto_msg *m, const char *name, int kind) {
    for (uint32_t i = 0; i < m->nmetrics; i++)
        if (m->metrics[i].kind == kind && strcmp(m->metrics[i].name, name) == 0) return &m->metrics[i];
    return NULL;
}

static int scope_kind(int scope) {
    return scope == ALERT_SCOPE_HEAD ? PROTO_HEAD : scope == ALERT_SCOPE_LAYER ? PROTO_LAYER : PROTO_SCALAR;
}

/* One cell's condition at this step. ring is the cell's window (oldest at
 * ring_pos once full); x is the value pushed into it afterwards. */
static int eval_cell(const struct alert_rule *rule, const struct group *g, const struct cell_state *c,
                     const float *ring, float v, float bound, float rising) {
    int full = g->ring_n >= rule->window;
    int w = rule->window;
    switch (rule->op) {
    case ALERT_OP_BELOW: return v < rule->value;
    case ALERT_OP_ABOVE: return v > rule->value;
    case ALERT_OP_NONFINITE: return !isfinite(v);
    case ALERT_OP_DROP:
        if (!isfinite(v) || g->ring_n == 0) return 0;
        return c->mx > 0 && v < (1 - rule->pct / 100.0) * c->mx;
    case ALERT_OP_GROWTH: {
        if (!isfinite(v)) return 0;
        if (v > rule->value) return 1;
        if (!full) return 0;
        float oldest = ring[g->ring_pos];
        return isfinite(oldest) && (v - oldest) / w > rule->rate;
    }
    case ALERT_OP_ZSCORE: {
        if (!isfinite(v) || !full || c->nfinite < 2) return 0;
        double mean = c->sum / c->nfinite, var = c->sumsq / c->nfinite - mean * mean;
        double sd = var > 0 ? sqrt(var) : 0;
        return v > mean + rule->k * sd && v > mean;
    }
    case ALERT_OP_NEAR_BOUND: {
        if (!isfinite(v) || !isfinite(bound) || !isfinite(rising) || !full) return 0;
        float oldest = ring[g->ring_pos];
        return v - bound < rule->epsilon && isfinite(oldest) && rising > oldest;
    }
    }
    return 0;
}

/* Moves a cell through pending -> firing -> clear -> resolved. */
static void cell_step(const struct alert_rule *rule, struct cell_state *c, int cond, int64_t step) {
    if (cond) {
        c->clear_since = -1;
        if (c->pending_since < 0) c->pending_since = step;
        if (!c->firing && step - c->pending_since >= rule->for_steps) {
            c->firing = 1;
            c->fired_from = c->pending_since;
        }
    } else {
        c->pending_since = -1;
        if (c->firing) {
            if (c->clear_since < 0) c->clear_since = step;
            if (step - c->clear_since >= rule->keep_firing_for) {
                c->firing = 0;
                c->clear_since = -1;
                c->fired_from = -1;
            }
        }
    }
}

static int eval_rule(struct alert_engine *e, const struct alert_rule *rule, struct run_state *r, struct group *g,
                     const struct proto_msg *m, int64_t step, double time) {
    int kind = scope_kind(rule->scope);
    const struct proto_metric *pm = find_metric(m, rule->metric, kind);
    if (!pm) return 0;
    const struct proto_metric *pb = NULL, *pr = NULL;
    if (rule->op == ALERT_OP_NEAR_BOUND) {
        pb = find_metric(m, rule->bound_metric, kind);
        pr = find_metric(m, rule->rising_metric, kind);
        if (!pb || !pr) return 0;
    }
    const struct proto_metric *pa = NULL;
    if (rule->and_metric && !(pa = find_metric(m, rule->and_metric, kind))) return 0;
    int n = cells_of(rule, r);
    if ((int)(pm->rows * pm->cols) != n || group_init(g, rule, n)) return 0;
    /* every metric read per cell has the cell layout (the store refuses
     * other shapes; checked again so no read can leave the values) */
    if ((pa && (int)(pa->rows * pa->cols) != n) || (pb && (int)(pb->rows * pb->cols) != n) ||
        (pr && (int)(pr->rows * pr->cols) != n))
        return 0;
    const float *vals = m->values + pm->offset;
    int w = rule->window > 0 ? rule->window : 1;
    int changed = 0, npending = 0;
    int windowed = rule->op == ALERT_OP_DROP || rule->op == ALERT_OP_GROWTH || rule->op == ALERT_OP_ZSCORE ||
                   rule->op == ALERT_OP_NEAR_BOUND;
    for (int i = 0; i < n; i++) {
        float v = vals[i];
        float b = pb ? m->values[pb->offset + i] : 0, ri = pr ? m->values[pr->offset + i] : 0;
        float *ring = g->ring + (size_t)i * (size_t)w;
        int cond = eval_cell(rule, g, &g->cells[i], ring, v, b, ri);
        if (cond && pa) {
            float a = m->values[pa->offset + i];
            cond = rule->and_op == ALERT_OP_BELOW ? a < rule->and_value : a > rule->and_value;
        }
        if (windowed) ring_push(rule->op, &g->cells[i], ring, w, g->ring_n, g->ring_pos, pr ? ri : v);
        g->cells[i].last = v;
        int was = g->cells[i].firing;
        cell_step(rule, &g->cells[i], cond, step);
        changed |= was != g->cells[i].firing;
        npending += !g->cells[i].firing && g->cells[i].pending_since >= 0;
    }
    g->npending = npending;
    g->ring_pos = (g->ring_pos + 1) % w;
    if (g->ring_n < w) g->ring_n++;
    e->stats.evaluations += (uint64_t)n;
    /* transitions only happen when a cell starts or stops firing */
    return changed ? group_settle(e, rule, r, g, step, time) : 0;
}

/* Resolves every firing group of a run (the run ended or was deleted:
 * reason says which). */
static int resolve_all(struct alert_engine *e, struct run_state *r, int64_t step, double time, int reason) {
    int n = 0;
    for (int i = 0; i < e->rules->n; i++) {
        struct group *g = &r->groups[i];
        for (int c = 0; c < g->ncells; c++) {
            g->cells[c].firing = 0;
            g->cells[c].pending_since = g->cells[c].clear_since = g->cells[c].fired_from = -1;
        }
        g->npending = 0;
        if (g->firing) {
            if (group_settle(e, &e->rules->rules[i], r, g, step, time) < 0) return -1;
            e->tr[e->ntr - 1].reason = reason;
            n++;
        }
    }
    return n;
}

/* A step at or below the last one: the trainer rolled back to step - 1.
 * Windows and pending counts start over.  A firing cell whose condition
 * began at or after `step` rests only on abandoned steps: it stops firing
 * here (its group resolves, or is updated when other cells still fire), so
 * a collapse on the new branch fires anew and a trainer that answers firing
 * alerts hears it.  A cell that began firing before `step` stays firing
 * until it clears.  Returns the number of transitions, -1 when out of
 * memory. */
static int run_rewind(struct alert_engine *e, struct run_state *r, int64_t step, double time) {
    int n = 0;
    for (int i = 0; i < e->rules->n; i++) {
        struct group *g = &r->groups[i];
        int abandoned = 0;
        g->ring_n = g->ring_pos = 0;
        g->npending = 0;
        for (int c = 0; c < g->ncells; c++) {
            struct cell_state *cs = &g->cells[c];
            cs->pending_since = -1;
            cs->clear_since = -1;
            cs->mx = -INFINITY;
            cs->sum = cs->sumsq = 0;
            cs->nfinite = 0;
            if (cs->firing && cs->fired_from >= step) {
                cs->firing = 0;
                cs->fired_from = -1;
                abandoned = 1;
            }
        }
        if (abandoned) {
            int t = group_settle(e, &e->rules->rules[i], r, g, step, time);
            if (t < 0) return -1;
            n += t;
        }
    }
    return n;
}

static int stalled_eval(struct alert_engine *e, struct run_state *r, double now, int64_t step, int activity) {
    int n = 0;
    for (int i = 0; i < e->rules->n; i++) {
        const struct alert_rule *rule = &e->rules->rules[i];
        if (rule->op != ALERT_OP_STALLED) continue;
        struct group *g = &r->groups[i];
        if (group_init(g, rule, 1)) return -1;
        int cond = !activity && r->live && now - r->last_seen > rule->seconds;
        g->cells[0].last = (float)(now - r->last_seen);
        int was = g->cells[0].firing;
        g->cells[0].firing = cond;
        g->cells[0].pending_since = cond ? (was ? g->cells[0].pending_since : r->last_step) : -1;
        g->cells[0].fired_from = g->cells[0].pending_since; /* firing means fired_from >= 0 */
        int t = group_settle(e, rule, r, g, step, now);
        if (t < 0) return -1;
        n += t;
    }
    return n;
}

/* Appends a cell to the verdict's cell list. -1 out of memory. */
static int vcell_add(struct alert_engine *e, int *n, int32_t layer, int32_t head, float value) {
    if (*n == e->vcap) {
        int cap = e->vcap ? e->vcap * 2 : 16;
        struct alert_cell *c = realloc(e->vcells, (size_t)cap * sizeof *c);
        if (!c) return -1;
        e->vcells = c;
        e->vcap = cap;
    }
    e->vcells[(*n)++] = (struct alert_cell){.layer = layer, .head = head, .value = value};
    return 0;
}

/* The run's verdict from its groups and status, into e->verdict (cells in
 * e->vcells). Precedence: of a collapse and a divergence the one whose
 * condition began first (a collapse that led to NaN losses is the cause;
 * ties go to the collapse), then stalled, then healthy. -1 out of memory. */
static int run_verdict(struct alert_engine *e, const struct run_state *r) {
    struct alert_verdict best = {.run_id = r->id, .state = ALERT_V_HEALTHY, .since_step = -1};
    const struct group *bestg = NULL;
    int pending_best = 0;
    struct alert_verdict stall = best, div = best;
    for (int i = 0; i < e->rules->n; i++) {
        const struct alert_rule *rule = &e->rules->rules[i];
        const struct group *g = &r->groups[i];
        if (!rule->verdict || !g->cells) continue;
        if (rule->verdict == ALERT_V_COLLAPSED) {
            int64_t since = -1;
            int pending = 0;
            if (g->firing) {
                since = g->start_step;
            } else if (r->live && g->npending > 0) {
                pending = 1;
                for (int c = 0; c < g->ncells; c++)
                    if (!g->cells[c].firing && g->cells[c].pending_since >= 0 &&
                        (since < 0 || g->cells[c].pending_since < since))
                        since = g->cells[c].pending_since;
            } else {
                continue;
            }
            if (best.state == ALERT_V_HEALTHY || since < best.since_step) {
                best = (struct alert_verdict){.run_id = r->id, .state = r->live ? ALERT_V_COLLAPSING : ALERT_V_COLLAPSED,
                                              .since_step = since, .rule = rule};
                bestg = g;
                pending_best = pending;
            }
        } else if (rule->verdict == ALERT_V_DIVERGED && g->firing) {
            if (div.state == ALERT_V_HEALTHY || g->start_step < div.since_step)
                div = (struct alert_verdict){.run_id = r->id, .state = ALERT_V_DIVERGED, .since_step = g->start_step,
                                             .rule = rule};
        } else if (rule->verdict == ALERT_V_STALLED && g->firing && stall.state == ALERT_V_HEALTHY) {
            stall = (struct alert_verdict){.run_id = r->id, .state = ALERT_V_STALLED, .since_step = g->start_step,
                                           .rule = rule};
        }
    }
    if (r->failed && div.state == ALERT_V_HEALTHY)
        div = (struct alert_verdict){.run_id = r->id, .state = ALERT_V_DIVERGED, .since_step = r->last_step};
    if (r->stale && stall.state == ALERT_V_HEALTHY)
        stall = (struct alert_verdict){.run_id = r->id, .state = ALERT_V_STALLED, .since_step = r->last_step};
    if (div.state && (best.state == ALERT_V_HEALTHY || div.since_step < best.since_step)) {
        best = div;
        bestg = NULL;
    }
    if (best.state == ALERT_V_HEALTHY) best = stall;
    int n = 0;
    if (bestg) {
        const struct alert_rule *rule = best.rule;
        for (int c = 0; c < bestg->ncells; c++) {
            const struct cell_state *cs = &bestg->cells[c];
            if (pending_best ? !(cs->pending_since >= 0 && !cs->firing) : !cs->firing) continue;
            int32_t layer = rule->scope == ALERT_SCOPE_HEAD ? (int32_t)(c / r->heads) : rule->scope == ALERT_SCOPE_LAYER ? c : -1;
            int32_t head = rule->scope == ALERT_SCOPE_HEAD ? (int32_t)(c % r->heads) : -1;
            if (vcell_add(e, &n, layer, head, cs->last)) return -1;
        }
    }
    best.ncells = n;
    best.cells = e->vcells;
    e->verdict = best;
    return 0;
}

/* Computes the run's verdict and reports it when it differs from the last
 * one reported (always when force is set). -1 out of memory. */
static int verdict_update(struct alert_engine *e, struct run_state *r, int force) {
    if (run_verdict(e, r)) return -1;
    const struct alert_verdict *v = &e->verdict;
    uint64_t h = 1469598103934665603ULL;
    for (int i = 0; i < v->ncells; i++)
        h = (h ^ (uint64_t)(uint32_t)v->cells[i].layer ^ ((uint64_t)(uint32_t)v->cells[i].head << 32)) * 1099511628211ULL;
    h ^= (uint64_t)v->ncells;
    if (!force && v->state == r->vstate && v->since_step == r->vsince && v->rule == r->vrule && h == r->vcells_hash)
        return 0;
    r->vdirty = 0;
    r->vstate = v->state;
    r->vsince = v->since_step;
    r->vrule = v->rule;
    r->vcells_hash = h;
    e->verdict_changed = 1;
    return 0;
}

int alert_feed(struct alert_engine *e, const struct writer_item *it, double now) {
    clear_transitions(e);
    struct run_state *r = run_find(e, it->run_id, 1);
    if (!r) return -1;
    /* the daemon's clock, never the trainer's `time` (data only): a skewed
     * trainer clock would make stalled fire and resolve at every step, and
     * give Alertmanager a startsAt it rejects */
    double time = now;
    int n = 0, t;
    switch (it->kind) {
    case WRITER_HELLO:
        if (it->msg.run[0]) {
            char *name = dupstr(it->msg.run);
            if (!name) return -1; /* keeps the old name */
            free(r->name);
            r->name = name;
        }
        r->layers = it->msg.layers;
        r->heads = it->msg.heads;
        r->live = 1;
        r->stale = r->failed = 0;
        r->last_seen = time;
        return verdict_update(e, r, 1);
    case WRITER_STEP: {
        const struct proto_msg *m = &it->msg;
        if (r->layers == 0) { /* no hello seen (engine started mid-run): learn the shape from the data */
            for (uint32_t i = 0; i < m->nmetrics; i++)
                if (m->metrics[i].kind == PROTO_HEAD) { r->layers = m->metrics[i].rows; r->heads = m->metrics[i].cols; }
        }
        if (r->last_step >= 0 && m->step <= r->last_step) {
            if ((t = run_rewind(e, r, m->step, time)) < 0) return -1;
            n += t;
        }
        r->last_step = m->step;
        r->last_seen = time;
        r->live = 1;
        r->stale = 0;
        e->stats.steps++;
        struct timespec t0, t1; /* CPU time of this thread: the cost, whatever else runs */
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
        for (int i = 0; i < e->rules->n; i++) {
            const struct alert_rule *rule = &e->rules->rules[i];
            if (rule->op == ALERT_OP_STALLED) continue;
            t = eval_rule(e, rule, r, &r->groups[i], m, m->step, time);
            if (t < 0) return -1;
            n += t;
        }
        t = stalled_eval(e, r, time, m->step, 1);
        if (t < 0) return -1;
        n += t;
        verdict_update(e, r, 0); /* out of memory: the verdict waits for the next step, the transitions go on */
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
        e->stats.eval_ms += (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
        return n;
    }
    case WRITER_EVENT:
        r->last_seen = time;
        t = stalled_eval(e, r, time, r->last_step, 1);
        if (t >= 0) verdict_update(e, r, 0);
        return t;
    case WRITER_END:
        /* the verdict is taken before the end resolves what fired: a
         * collapse still firing at the end is the run's verdict */
        r->live = 0;
        r->stale = 0;
        r->failed = it->msg.status == PROTO_FAILED;
        verdict_update(e, r, 1); /* out of memory: no verdict, but the end still resolves and releases */
        t = resolve_all(e, r, r->last_step, time, ALERT_REASON_RUN_ENDED);
        run_release(e, r);
        return t;
    case WRITER_STALE:
        r->live = 0;
        r->stale = 1;
        t = stalled_eval(e, r, time, r->last_step, 1);
        if (t >= 0) verdict_update(e, r, 0);
        return t;
    default: /* WRITER_DELETE and anything newer: forget the run */
        t = resolve_all(e, r, r->last_step, time, ALERT_REASON_RUN_DELETED);
        r->live = 0;
        run_release(e, r);
        return t;
    }
}

int alert_tick(struct alert_engine *e, double now) {
    clear_transitions(e);
    int n = 0;
    for (size_t b = 0; b < e->nbuckets; b++)
        for (struct run_state *r = e->buckets[b]; r; r = r->hnext) {
            if (!r->live) continue;
            int t = stalled_eval(e, r, now, r->last_step, 0);
            if (t < 0) return -1;
            n += t;
            /* one verdict per tick (the API holds one): the next ticks report the rest */
            if (t > 0 || r->vdirty) {
                r->vdirty = e->verdict_changed;
                if (!e->verdict_changed && verdict_update(e, r, 0)) r->vdirty = 1; /* out of memory: next tick */
            }
        }
    return n;
}

const struct alert_verdict *alert_verdict_changed(const struct alert_engine *e) {
    return e->verdict_changed ? &e->verdict : NULL;
}

const struct alert_transition *alert_transition_at(const struct alert_engine *e, int i) {
    return i >= 0 && i < e->ntr ? &e->tr[i] : NULL;
}

void alert_get_stats(const struct alert_engine *e, struct alert_stats *out) { *out = e->stats; }

/* ---- JSON ---- */

static void iso8601(double t, char *buf, size_t n) {
    if (t <= 0) {
        snprintf(buf, n, "0001-01-01T00:00:00Z"); /* Alertmanager's "no end" */
        return;
    }
    /* rounded, not truncated: a time stored as %.3f and read back prints the same */
    long long all_ms = llround(t * 1000);
    time_t s = (time_t)(all_ms / 1000);
    struct tm tm;
    gmtime_r(&s, &tm);
    int ms = (int)(all_ms % 1000);
    snprintf(buf, n, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
             tm.tm_min, tm.tm_sec, ms);
}

static void cells_text(const struct alert_transition *t, char *buf, size_t n) {
    size_t off = 0;
    buf[0] = 0;
    for (int i = 0; i < t->ncells && off + 32 < n; i++) {
        if (i == 12) {
            snprintf(buf + off, n - off, " and %d more", t->ncells - 12);
            return;
        }
        const struct alert_cell *c = &t->cells[i];
        if (c->head >= 0) off += (size_t)snprintf(buf + off, n - off, "%slayer %d head %d", i ? ", " : "", c->layer, c->head);
        else if (c->layer >= 0) off += (size_t)snprintf(buf + off, n - off, "%slayer %d", i ? ", " : "", c->layer);
        else off += (size_t)snprintf(buf + off, n - off, "%s%s", i ? ", " : "", t->rule->metric ? t->rule->metric : "run");
    }
}

/* Replaces {run} {rule} {metric} {step} {value} {cells} in a template. */
static char *expand(const char *tpl, const struct alert_transition *t) {
    char cells[640], step[32], value[32];
    cells_text(t, cells, sizeof cells);
    snprintf(step, sizeof step, "%lld", (long long)t->step);
    snprintf(value, sizeof value, "%.4g", t->value);
    const char *keys[] = {"{run}", "{rule}", "{metric}", "{step}", "{value}", "{cells}"};
    const char *vals[] = {t->run_name, t->rule->name, t->rule->metric ? t->rule->metric : "", step, value, cells};
    size_t cap = strlen(tpl) + 1;
    for (const char *p = tpl; *p; p++)
        if (*p == '{') cap += sizeof cells + 64;
    char *out = malloc(cap), *o = out;
    if (!out) return NULL;
    for (const char *p = tpl; *p;) {
        int hit = 0;
        for (int k = 0; k < 6 && !hit; k++) {
            size_t kl = strlen(keys[k]);
            if (strncmp(p, keys[k], kl) == 0) {
                size_t vl = strlen(vals[k]);
                memcpy(o, vals[k], vl);
                o += vl;
                p += kl;
                hit = 1;
            }
        }
        if (!hit) *o++ = *p++;
    }
    *o = 0;
    return out;
}

char *alert_transition_json(const struct alert_transition *t) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    char buf[64];
    cJSON_AddStringToObject(o, "status", t->state == ALERT_RESOLVED ? "resolved" : "firing");
    cJSON_AddStringToObject(o, "transition", t->state == ALERT_FIRING ? "firing" : t->state == ALERT_RESOLVED ? "resolved" : "update");
    cJSON *labels = cJSON_AddObjectToObject(o, "labels");
    cJSON_AddStringToObject(labels, "alertname", t->rule->name);
    cJSON_AddStringToObject(labels, "run", t->run_name);
    cJSON_AddStringToObject(labels, "severity", t->rule->severity);
    if (t->rule->metric) cJSON_AddStringToObject(labels, "metric", t->rule->metric);
    for (int i = 0; i < t->rule->nlabels; i++)
        cJSON_AddStringToObject(labels, t->rule->labels[i].key, t->rule->labels[i].value);
    cJSON *ann = cJSON_AddObjectToObject(o, "annotations");
    for (int i = 0; i < t->rule->nannotations; i++) {
        char *v = expand(t->rule->annotations[i].value, t);
        cJSON_AddStringToObject(ann, t->rule->annotations[i].key, v ? v : "");
        free(v);
    }
    /* an end that is not a recovery says so, also to Alertmanager (which
     * keeps labels and annotations only) */
    const char *reason = t->state == ALERT_RESOLVED ? alert_reason_name(t->reason) : NULL;
    if (reason) cJSON_AddStringToObject(ann, "reason", reason);
    if (reason) cJSON_AddStringToObject(o, "reason", reason);
    iso8601(t->starts_at, buf, sizeof buf);
    cJSON_AddStringToObject(o, "startsAt", buf);
    iso8601(t->state == ALERT_RESOLVED ? t->ends_at : 0, buf, sizeof buf);
    cJSON_AddStringToObject(o, "endsAt", buf);
    snprintf(buf, sizeof buf, "%016llx", (unsigned long long)t->fingerprint);
    cJSON_AddStringToObject(o, "fingerprint", buf);
    cJSON_AddStringToObject(o, "generatorURL", "");
    cJSON_AddNumberToObject(o, "run_id", (double)t->run_id);
    cJSON_AddNumberToObject(o, "step", (double)t->step);
    cJSON_AddNumberToObject(o, "start_step", (double)t->start_step);
    if (isfinite(t->value)) cJSON_AddNumberToObject(o, "value", t->value);
    else cJSON_AddNullToObject(o, "value");
    cJSON *cells = cJSON_AddArrayToObject(o, "cells");
    for (int i = 0; i < t->ncells; i++) {
        cJSON *c = cJSON_CreateObject();
        if (t->cells[i].layer >= 0) cJSON_AddNumberToObject(c, "layer", t->cells[i].layer);
        if (t->cells[i].head >= 0) cJSON_AddNumberToObject(c, "head", t->cells[i].head);
        if (isfinite(t->cells[i].value)) cJSON_AddNumberToObject(c, "value", t->cells[i].value);
        else cJSON_AddNullToObject(c, "value");
        cJSON_AddItemToArray(cells, c);
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}
