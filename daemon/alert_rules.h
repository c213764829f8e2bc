/* alert_rules.h: alert rules, as parsed from JSON (a --rules file or the
 * built-in set, schema/default_rules.json; docs/alerts.md), and the
 * verdicts a rule can stand for. What the rules mean when evaluated is the
 * engine's (alert.h). Pure: no I/O except reading a rules file. */
#ifndef ALERT_RULES_H
#define ALERT_RULES_H

#include <stddef.h>
#include <stdint.h>

/* A run's verdict (docs/alerts.md, "Verdicts"): what the run is, or ended, as.
 * A rule stands for one of collapsed, diverged or stalled (or none). */
enum alert_verdict_state {
    ALERT_V_HEALTHY = 0,
    ALERT_V_COLLAPSING, /* a collapse rule pending or firing on a live run */
    ALERT_V_COLLAPSED,  /* a collapse rule firing when the run stopped (ended or went stale) */
    ALERT_V_DIVERGED,   /* a divergence rule firing (NaN/Inf loss), or the run ended `failed` */
    ALERT_V_STALLED,    /* a stalled rule firing, or the run went stale (trainer gone without end) */
    ALERT_V_SHARP,      /* a collapse rule's entropy condition holds, but its unless_training guard
                             says the loss trains: sharp heads, training not harmed */
    ALERT_V_COUNT
};

/* "healthy", "collapsing", ... (ALERT_V_*); "none" is not a verdict. */
const char *alert_verdict_name(int v);

enum alert_scope { ALERT_SCOPE_HEAD = 0, ALERT_SCOPE_LAYER, ALERT_SCOPE_SCALAR, ALERT_SCOPE_RUN };

enum alert_op {
    ALERT_OP_BELOW = 0,  /* v < value */
    ALERT_OP_ABOVE,      /* v > value */
    ALERT_OP_DROP,       /* v < (1 - pct/100) * max of the last `window` values */
    ALERT_OP_GROWTH,     /* v > value, or (v - v[window steps ago]) / window > rate */
    ALERT_OP_ZSCORE,     /* v > mean + k * std of the previous `window` values */
    ALERT_OP_NONFINITE,  /* v is NaN or infinite (null on the wire) */
    ALERT_OP_NEAR_BOUND, /* v - bound_metric < epsilon while rising_metric grew over `window` */
    ALERT_OP_STALLED,    /* a live run sent nothing for `seconds` (scope run) */
};

#define ALERT_MAX_LABELS 16

struct alert_kv {
    char *key, *value;
};

struct alert_rule {
    char *name;
    char *metric; /* NULL for stalled */
    int scope;    /* enum alert_scope */
    int op;       /* enum alert_op */
    double value, pct, rate, k, epsilon, seconds;
    int window; /* steps, >= 1 where used */
    char *bound_metric, *rising_metric;
    /* optional guard (condition "and"): the cell's and_metric (same scope)
     * must also be below (and_op ALERT_OP_BELOW) or above and_value;
     * and_metric is NULL when the rule has none */
    char *and_metric;
    int and_op;
    double and_value;
    int64_t for_steps, keep_firing_for;
    /* "for": {"at_least": K, "of_last": N}: fires when the condition held on
     * at least K (for_steps) of the last N (of_last, 1..64) steps, so a head
     * flickering across the threshold is caught; 0: "for": K counts
     * consecutive steps (fires on the K+1-th) */
    int of_last;
    /* hysteresis ("clear_value" in a below/above condition): a firing cell
     * goes on holding while v < clear_value (below) or > it (above) */
    int has_clear;
    double clear_value;
    /* "unless_training": {"metric": M, "below": R}: cells do not fire, and
     * firing ones clear, while the run's scalar M (smoothed over ~20 steps)
     * is below R x its opening level (the lowest of its first 10 finite
     * values): the loss trains, so a head that holds the condition is sharp,
     * not collapsed. Before 10 values of M, or without M, the rule fires as
     * if it had no guard. unless_metric NULL: no guard. */
    char *unless_metric;
    double unless_below;
    char *severity;
    int verdict; /* enum alert_verdict_state this rule stands for when firing:
                              * "verdict" in the rule, or inferred (alert_rules_parse) */
    int nlabels, nannotations;
    struct alert_kv labels[ALERT_MAX_LABELS];
    struct alert_kv annotations[ALERT_MAX_LABELS];
};

struct alert_rules {
    int n;
    struct alert_rule *rules;
};

/* Parses rules from JSON text. On error returns NULL and writes a message
 * naming the line (and the rule) into err. The caller frees the result with
 * alert_rules_free(). */
struct alert_rules *alert_rules_parse(const char *json, size_t len, char *err, size_t errlen);
/* Reads and parses a file; NULL path gives the built-in rules
 * (schema/default_rules.json, embedded at build). */
struct alert_rules *alert_rules_load(const char *path, char *err, size_t errlen);
void alert_rules_free(struct alert_rules *r);

#endif
