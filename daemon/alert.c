/* alert.c: the alert engine: per-run, per-rule, per-cell state fed by
 * committed items, and the transitions it yields (alert.h). The rules it
 * evaluates are parsed by alert_rules.c. */
#include "alert.h"

#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *alert_reason_name(int reason) {
    return reason == ALERT_REASON_RUN_ENDED ? "run_ended" : reason == ALERT_REASON_RUN_DELETED ? "run_deleted" : NULL;
}


/* What every rule keeps per cell: 32 bytes (at_least/of_last adds 8, its
 * history word). What a rule's op reads of the
 * cell's window is kept beside it, only for the ops that read it (the
 * per-cell bound is in alert_rules.h). */
struct cell_state {
    int64_t pending_since; /* -1 when the condition is not holding (at_least/of_last: held on
                                none of the last of_last steps) */
    int64_t clear_since;   /* -1 unless firing and clear */
    int64_t fired_from;    /* while firing: the step its condition began to hold; else -1 */
    float last;
    int16_t firing;
    int16_t sharp; /* holds the condition long enough, but unless_training says the loss
                                trains: not firing (the verdict's sharp heads) */
};

/* zscore's running sums of the finite values in a cell's window, kept in
 * O(1) per step. */
struct cell_sums {
    double sum, sumsq;
    int64_t nfinite;
};

#define UNLESS_OPENING 10 /* values of the guard metric that make its opening level */
#define UNLESS_SMOOTH 20  /* steps its smoothed level averages over */

/* The state of one rule in one run. ring holds, for the ops that read a
 * window, the last `window` values of the watched series of every cell (the
 * metric itself; the rising metric for near_bound), step-major: row r is
 * one step of all ncells cells, so that a step writes one contiguous row
 * (cell-major, each cell's write touched a cache line of its own), and rows
 * are added as steps arrive, up to `window` (a run that sent 3 steps holds
 * 3). mx (drop) and sums (zscore) summarise each cell's window. */
struct group {
    int ncells;
    struct cell_state *cells;
    float *ring;            /* ring_rows x ncells; NULL for ops without a window (or before a step) */
    int ring_rows;          /* rows allocated: grows to the window */
    float *mx;              /* drop: the max of the finite values in the ring (-inf if none); else NULL */
    struct cell_sums *sums; /* zscore; else NULL */
    uint64_t *hist;         /* at_least/of_last: bit k is the condition k steps ago; else NULL */
    /* unless_training: the run's guard metric's opening level (of its first open_n values) and
     * its smoothed level */
    double opening, smooth;
    int open_n;
    int nsharp;           /* cells sharp now */
    int ring_n, ring_pos; /* shared by all cells: they advance together */
    int firing;
    int nfiring;
    int npending; /* cells whose condition holds but that do not fire yet */
    double starts_at;
    int64_t start_step;
    struct alert_cell *last_cells; /* what fired, for RESOLVED and UPDATE detection */
    int nlast, last_cap;           /* last_cells grows with the cells firing: most never do */
    double last_tr;                /* the feed's clock at the group's last transition */
    int update_due;                /* the firing cells changed since the last transition, which was
                                under ALERT_UPDATE_MIN_S ago */
};

struct run_state {
    int64_t id;
    char *name;
    int64_t layers, heads;
    int live;
    int stale;  /* went stale (connection closed without end) */
    int failed; /* ended with status failed */
    double last_seen;
    int64_t last_step;
    struct group *groups; /* one per rule; cell state allocated on first use */
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
    struct alert_cell vcells[ALERT_MAX_CELLS_LISTED]; /* the verdict's listed cells */
    alert_resume_fn *resume;                          /* may be NULL */
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
    free(g->mx);
    free(g->sums);
    free(g->hist);
    free(g->last_cells);
}

static int op_windowed(int op) {
    return op == ALERT_OP_DROP || op == ALERT_OP_GROWTH || op == ALERT_OP_ZSCORE || op == ALERT_OP_NEAR_BOUND;
}

/* Bytes of per-cell state a rule keeps (alert_rules.h's bound). */
static uint64_t cell_bytes(const struct alert_rule *rule) {
    uint64_t b = sizeof(struct cell_state);
    if (op_windowed(rule->op)) b += (uint64_t)(rule->window > 0 ? rule->window : 1) * sizeof(float); /* at most */
    if (rule->op == ALERT_OP_DROP) b += sizeof(float);
    if (rule->op == ALERT_OP_ZSCORE) b += sizeof(struct cell_sums);
    if (rule->of_last) b += sizeof(uint64_t);
    return b;
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
    r->name = strdup(nm);
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
        const struct alert_rule *rule = &e->rules->rules[k];
        uint64_t window = op_windowed(rule->op) ? (uint64_t)(rule->window > 0 ? rule->window : 1) : 0;
        b +=
            (uint64_t)g->ncells * (cell_bytes(rule) - window * sizeof(float) + (uint64_t)g->ring_rows * sizeof(float)) +
            (uint64_t)g->last_cap * sizeof *g->last_cells;
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
    int failed = !(g->cells = calloc((size_t)n, sizeof *g->cells));
    if (rule->op == ALERT_OP_DROP) failed |= !(g->mx = malloc((size_t)n * sizeof *g->mx));
    if (rule->op == ALERT_OP_ZSCORE) failed |= !(g->sums = calloc((size_t)n, sizeof *g->sums));
    if (rule->of_last) failed |= !(g->hist = calloc((size_t)n, sizeof *g->hist));
    if (failed) {
        group_free(g);
        memset(g, 0, sizeof *g);
        return -1;
    }
    g->ncells = n;
    for (int i = 0; i < n; i++) g->cells[i].pending_since = g->cells[i].clear_since = g->cells[i].fired_from = -1;
    if (g->mx)
        for (int i = 0; i < n; i++) g->mx[i] = -INFINITY;
    return 0;
}

/* Makes room in the ring for the row at ring_pos (rows double up to the
 * window, w). -1 out of memory (the ring stays as it was). */
static int ring_reserve(struct group *g, int w) {
    if (g->ring_pos < g->ring_rows) return 0;
    int rows = g->ring_rows ? g->ring_rows * 2 : 1;
    if (rows > w) rows = w;
    float *r = realloc(g->ring, (size_t)rows * (size_t)g->ncells * sizeof *r);
    if (!r) return -1;
    g->ring = r;
    g->ring_rows = rows;
    return 0;
}

/* The max of the finite values of cell i's first count steps (-inf if none). */
static float ring_max(const struct group *g, int i, int count) {
    float mx = -INFINITY;
    for (int k = 0; k < count; k++) {
        float x = g->ring[(size_t)k * (size_t)g->ncells + (size_t)i];
        if (isfinite(x) && x > mx) mx = x;
    }
    return mx;
}

/* The sums of the finite values of cell i's first count steps. */
static void ring_sums(struct cell_sums *c, const struct group *g, int i, int count) {
    *c = (struct cell_sums){0};
    for (int k = 0; k < count; k++) {
        float x = g->ring[(size_t)k * (size_t)g->ncells + (size_t)i];
        if (!isfinite(x)) continue;
        c->sum += x;
        c->sumsq += (double)x * x;
        c->nfinite++;
    }
}

/* Puts x into cell i's window, keeping only the summary the rule's op
 * reads: the max for drop (rescanned only when the value leaving was the
 * max), the sums for zscore (rescanned once per lap of the ring to shed
 * rounding drift); growth and near_bound read the ring itself. */
static void ring_push(int op, struct group *g, int i, int w, float x) {
    int pos = g->ring_pos, full = g->ring_n >= w;
    float *slot = &g->ring[(size_t)pos * (size_t)g->ncells + (size_t)i];
    float out = full ? *slot : NAN;
    *slot = x;
    int count = full ? w : g->ring_n + 1;
    if (op == ALERT_OP_DROP) {
        float *mx = &g->mx[i];
        if (isfinite(out) && out >= *mx && !(isfinite(x) && x >= out)) *mx = ring_max(g, i, count);
        else if (isfinite(x) && x > *mx) *mx = x;
    } else if (op == ALERT_OP_ZSCORE) {
        struct cell_sums *c = &g->sums[i];
        if (pos == w - 1) {
            ring_sums(c, g, i, count);
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
    int listed = g->nlast < ALERT_MAX_CELLS_LISTED ? g->nlast : ALERT_MAX_CELLS_LISTED;
    struct alert_cell *cells = malloc((size_t)(listed ? listed : 1) * sizeof *cells);
    if (!cells) return NULL;
    if (listed) memcpy(cells, g->last_cells, (size_t)listed * sizeof *cells);
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
        double v = g->last_cells[i].value;
        if (isnan(worst)) worst = v;
        else if (rule->op == ALERT_OP_BELOW || rule->op == ALERT_OP_DROP || rule->op == ALERT_OP_NEAR_BOUND) {
            if (v < worst) worst = v;
        } else if (v > worst) worst = v;
    }
    *t = (struct alert_transition){.state = state,
                                   .rule = rule,
                                   .run_id = r->id,
                                   .run_name = r->name,
                                   .fingerprint = h,
                                   .starts_at = g->starts_at,
                                   .at = time,
                                   /* a wall clock stepped back must not end an alert before it began
                                    * (Alertmanager refuses endsAt < startsAt) */
                                   .ends_at = state == ALERT_RESOLVED ? fmax(time, g->starts_at) : 0,
                                   .start_step = g->start_step,
                                   .step = step,
                                   .ncells_total = g->nlast,
                                   .ncells = listed,
                                   .cells = cells,
                                   .value = worst};
    e->stats.transitions++;
    return t;
}

/* After a group's cells were updated at `step`, emits its transition;
 * with held, an update comes at most every ALERT_UPDATE_MIN_S (alert.h). */
static int group_settle(struct alert_engine *e, const struct alert_rule *rule, struct run_state *r, struct group *g,
                        int64_t step, double time, int held) {
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
    if (n > g->last_cap) {
        int cap = g->last_cap ? g->last_cap : 4;
        while (cap < n) cap = cap > g->ncells / 2 ? g->ncells : cap * 2;
        struct alert_cell *lc = realloc(g->last_cells, (size_t)cap * sizeof *lc);
        if (!lc) return -1; /* out of memory: the group's cells stay as they were */
        g->last_cells = lc;
        g->last_cap = cap;
    }
    if (n > 0) {
        /* remember the firing cells (with their latest values) */
        int j = 0;
        for (int i = 0; i < g->ncells; i++) {
            if (!g->cells[i].firing) continue;
            g->last_cells[j].layer = rule->scope == ALERT_SCOPE_HEAD    ? (int32_t)(i / r->heads)
                                     : rule->scope == ALERT_SCOPE_LAYER ? i
                                                                        : -1;
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
    } else if (g->firing && (changed || g->update_due)) {
        /* a clock stepped back does not hold updates back until it catches up */
        if (held && time >= g->last_tr && time - g->last_tr < ALERT_UPDATE_MIN_S) {
            g->update_due = 1;
            return 0;
        }
        t = tr_add(e, ALERT_UPDATE, rule, r, g, step, time);
    } else {
        return 0;
    }
    g->last_tr = time;
    g->update_due = 0;
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

/* Cell i's condition at this step, from its value v (and for near_bound
 * the bound and rising metrics) and its window (oldest at ring_pos once
 * full), before this step's value is pushed into it. */
static int eval_cell(const struct alert_rule *rule, const struct group *g, int i, float v, float bound, float rising) {
    int full = g->ring_n >= rule->window;
    int w = rule->window;
    /* the oldest value of the window, once full */
    float oldest = full && g->ring ? g->ring[(size_t)g->ring_pos * (size_t)g->ncells + (size_t)i] : NAN;
    switch (rule->op) {
    /* a firing cell holds until it crosses clear_value (hysteresis) */
    case ALERT_OP_BELOW: return v < (rule->has_clear && g->cells[i].firing ? rule->clear_value : rule->value);
    case ALERT_OP_ABOVE: return v > (rule->has_clear && g->cells[i].firing ? rule->clear_value : rule->value);
    case ALERT_OP_NONFINITE: return !isfinite(v);
    case ALERT_OP_DROP:
        if (!isfinite(v) || g->ring_n == 0) return 0;
        return g->mx[i] > 0 && v < (1 - rule->pct / 100.0) * g->mx[i];
    case ALERT_OP_GROWTH: {
        if (!isfinite(v)) return 0;
        if (v > rule->value) return 1;
        if (!full) return 0;
        return isfinite(oldest) && (v - oldest) / w > rule->rate;
    }
    case ALERT_OP_ZSCORE: {
        const struct cell_sums *c = &g->sums[i];
        if (!isfinite(v) || !full || c->nfinite < 2) return 0;
        double mean = c->sum / (double)c->nfinite, var = c->sumsq / (double)c->nfinite - mean * mean;
        double sd = var > 0 ? sqrt(var) : 0;
        return v > mean + rule->k * sd && v > mean;
    }
    case ALERT_OP_NEAR_BOUND: {
        if (!isfinite(v) || !isfinite(bound) || !isfinite(rising) || !full) return 0;
        return v - bound < rule->epsilon && isfinite(oldest) && rising > oldest;
    }
    }
    return 0;
}

/* Whether cell c holds its condition long enough to fire (or, firing, to
 * go on firing), with cond this step's condition: for K consecutive steps
 * (pending since K steps; a firing cell at every step cond holds), or on
 * at least K of the last N (its history word, shifted here). Keeps
 * pending_since: the first step of the current stretch. */
static int cell_held(const struct alert_rule *rule, struct cell_state *c, uint64_t *hist, int cond, int64_t step) {
    if (!rule->of_last) {
        if (!cond) {
            c->pending_since = -1;
            return 0;
        }
        if (c->pending_since < 0) c->pending_since = step;
        return c->firing || step - c->pending_since >= rule->for_steps; /* a firing cell holds while cond does */
    }
    uint64_t mask = rule->of_last == 64 ? ~0ULL : (1ULL << rule->of_last) - 1;
    *hist = ((*hist << 1) | (uint64_t)(cond != 0)) & mask;
    if (!*hist) {
        c->pending_since = -1;
        return 0;
    }
    if (c->pending_since < 0) c->pending_since = step;
    return __builtin_popcountll(*hist) >= rule->for_steps;
}

/* Moves a cell through pending -> firing -> clear -> resolved. held: the
 * condition held long enough (cell_held); training: the rule's
 * unless_training guard says the loss trains, so the cell does not fire
 * (it is sharp) and a firing one clears. */
static void cell_step(const struct alert_rule *rule, struct cell_state *c, int held, int training, int64_t step) {
    c->sharp = held && training;
    if (held && !training) {
        c->clear_since = -1;
        if (!c->firing) {
            c->firing = 1;
            c->fired_from = c->pending_since;
        }
    } else if (c->firing) {
        if (c->clear_since < 0) c->clear_since = step;
        if (step - c->clear_since >= rule->keep_firing_for) {
            c->firing = 0;
            c->clear_since = -1;
            c->fired_from = -1;
        }
    }
}

/* The unless_training guard at this step: feeds the run's guard metric
 * into the group's opening level (the lowest of its first UNLESS_OPENING
 * finite values: the loss at initialisation as a rule, and a spike in the
 * first steps, common at a high learning rate, does not raise it; the
 * demo's baseline opens 4.17, 4.18, 5.80, 7.05, 7.44 ... and stalls at 3.8)
 * and its smoothed level (an exponential mean over ~UNLESS_SMOOTH steps),
 * and says whether the loss trains: smoothed below unless_below x opening. */
static int unless_training(const struct alert_rule *rule, struct group *g, const struct proto_msg *m) {
    if (!rule->unless_metric) return 0;
    const struct proto_metric *pm = find_metric(m, rule->unless_metric, PROTO_SCALAR);
    float v = pm && pm->rows * pm->cols == 1 ? m->values[pm->offset] : NAN;
    if (isfinite(v)) {
        if (g->open_n < UNLESS_OPENING) {
            if (g->open_n++ == 0 || v < g->opening) g->opening = v;
            g->smooth = v;
        } else {
            g->smooth += (v - g->smooth) * (2.0 / (UNLESS_SMOOTH + 1));
        }
    }
    return g->open_n >= UNLESS_OPENING && g->smooth < rule->unless_below * g->opening;
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
    int changed = 0, npending = 0, nsharp = 0;
    int windowed = op_windowed(rule->op);
    int training = unless_training(rule, g, m);
    if (windowed && ring_reserve(g, w)) return 0; /* out of memory: this step is not evaluated */
    for (int i = 0; i < n; i++) {
        float v = vals[i];
        float b = pb ? m->values[pb->offset + i] : 0, ri = pr ? m->values[pr->offset + i] : 0;
        int cond = eval_cell(rule, g, i, v, b, ri);
        if (cond && pa) {
            float a = m->values[pa->offset + i];
            cond = rule->and_op == ALERT_OP_BELOW ? a < rule->and_value : a > rule->and_value;
        }
        if (windowed) ring_push(rule->op, g, i, w, pr ? ri : v);
        g->cells[i].last = v;
        int was = g->cells[i].firing;
        int held = cell_held(rule, &g->cells[i], g->hist ? &g->hist[i] : NULL, cond, step);
        cell_step(rule, &g->cells[i], held, training, step);
        changed |= was != g->cells[i].firing;
        /* pending: on its way to firing; a sharp cell is not (the loss trains) */
        npending += !g->cells[i].firing && g->cells[i].pending_since >= 0 && !training;
        nsharp += g->cells[i].sharp;
    }
    g->npending = npending;
    g->nsharp = nsharp;
    g->ring_pos = (g->ring_pos + 1) % w;
    if (g->ring_n < w) g->ring_n++;
    e->stats.evaluations += (uint64_t)n;
    /* transitions only happen when a cell starts or stops firing, or an
     * update held back is due */
    return changed || g->update_due ? group_settle(e, rule, r, g, step, time, 1) : 0;
}

/* Resolves every firing group of a run (the run ended or was deleted:
 * reason says which). */
static int resolve_all(struct alert_engine *e, struct run_state *r, int64_t step, double time, int reason) {
    int n = 0;
    for (int i = 0; i < e->rules->n; i++) {
        struct group *g = &r->groups[i];
        for (int c = 0; c < g->ncells; c++) {
            g->cells[c].firing = g->cells[c].sharp = 0;
            g->cells[c].pending_since = g->cells[c].clear_since = g->cells[c].fired_from = -1;
        }
        g->npending = g->nsharp = 0;
        if (g->firing) {
            if (group_settle(e, &e->rules->rules[i], r, g, step, time, 0) < 0) return -1;
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
        g->npending = g->nsharp = 0;
        for (int c = 0; c < g->ncells; c++) {
            struct cell_state *cs = &g->cells[c];
            cs->pending_since = -1;
            cs->clear_since = -1;
            cs->sharp = 0;
            if (g->hist) g->hist[c] = 0;
            if (g->mx) g->mx[c] = -INFINITY;
            if (g->sums) g->sums[c] = (struct cell_sums){0};
            if (cs->firing && cs->fired_from >= step) {
                cs->firing = 0;
                cs->fired_from = -1;
                abandoned = 1;
            }
        }
        if (abandoned) {
            int t = group_settle(e, &e->rules->rules[i], r, g, step, time, 0);
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
        int t = group_settle(e, rule, r, g, step, now, 0);
        if (t < 0) return -1;
        n += t;
    }
    return n;
}

/* The run's verdict from its groups and status, into e->verdict (cells in
 * e->vcells). Precedence: of a collapse and a divergence the one whose
 * condition began first (a collapse that led to NaN losses is the cause;
 * ties go to the collapse), then stalled, then sharp (a collapse rule held
 * back by its unless_training guard), then healthy. */
static void run_verdict(struct alert_engine *e, const struct run_state *r) {
    struct alert_verdict best = {.run_id = r->id, .state = ALERT_V_HEALTHY, .since_step = -1};
    const struct group *bestg = NULL;
    int pending_best = 0;
    struct alert_verdict stall = best, div = best, sharp = best;
    const struct group *sharpg = NULL;
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
                if (g->nsharp > 0 && !sharpg) { /* held back by unless_training: the loss trains */
                    for (int c = 0; c < g->ncells; c++)
                        if (g->cells[c].sharp && (since < 0 || g->cells[c].pending_since < since))
                            since = g->cells[c].pending_since;
                    sharp = (struct alert_verdict){
                        .run_id = r->id, .state = ALERT_V_SHARP, .since_step = since, .rule = rule};
                    sharpg = g;
                }
                continue;
            }
            if (best.state == ALERT_V_HEALTHY || since < best.since_step) {
                best = (struct alert_verdict){.run_id = r->id,
                                              .state = r->live ? ALERT_V_COLLAPSING : ALERT_V_COLLAPSED,
                                              .since_step = since,
                                              .rule = rule};
                bestg = g;
                pending_best = pending;
            }
        } else if (rule->verdict == ALERT_V_DIVERGED && g->firing) {
            if (div.state == ALERT_V_HEALTHY || g->start_step < div.since_step)
                div = (struct alert_verdict){
                    .run_id = r->id, .state = ALERT_V_DIVERGED, .since_step = g->start_step, .rule = rule};
        } else if (rule->verdict == ALERT_V_STALLED && g->firing && stall.state == ALERT_V_HEALTHY) {
            stall = (struct alert_verdict){
                .run_id = r->id, .state = ALERT_V_STALLED, .since_step = g->start_step, .rule = rule};
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
    if (best.state == ALERT_V_HEALTHY && sharpg) {
        best = sharp;
        bestg = sharpg;
    }
    int n = 0, total = 0;
    if (bestg) {
        const struct alert_rule *rule = best.rule;
        for (int c = 0; c < bestg->ncells; c++) {
            const struct cell_state *cs = &bestg->cells[c];
            int listed = best.state == ALERT_V_SHARP ? cs->sharp
                         : pending_best              ? cs->pending_since >= 0 && !cs->firing
                                                     : cs->firing;
            if (!listed) continue;
            total++;
            if (n == ALERT_MAX_CELLS_LISTED) continue;
            int32_t layer = rule->scope == ALERT_SCOPE_HEAD    ? (int32_t)(c / r->heads)
                            : rule->scope == ALERT_SCOPE_LAYER ? c
                                                               : -1;
            int32_t head = rule->scope == ALERT_SCOPE_HEAD ? (int32_t)(c % r->heads) : -1;
            e->vcells[n++] = (struct alert_cell){.layer = layer, .head = head, .value = cs->last};
        }
    }
    best.ncells = n;
    best.ncells_total = total;
    best.cells = e->vcells;
    best.loss_opening = best.loss_smoothed = best.train_below = NAN;
    if (bestg && best.rule->unless_metric && bestg->open_n >= UNLESS_OPENING) {
        best.loss_opening = bestg->opening;
        best.loss_smoothed = bestg->smooth;
        best.train_below = best.rule->unless_below;
    }
    e->verdict = best;
}

/* Computes the run's verdict and reports it when it differs from the last
 * one reported (always when force is set). */
static void verdict_update(struct alert_engine *e, struct run_state *r, int force) {
    run_verdict(e, r);
    const struct alert_verdict *v = &e->verdict;
    uint64_t h = 1469598103934665603ULL;
    for (int i = 0; i < v->ncells; i++)
        h = (h ^ (uint64_t)(uint32_t)v->cells[i].layer ^ ((uint64_t)(uint32_t)v->cells[i].head << 32)) *
            1099511628211ULL;
    h ^= (uint64_t)v->ncells_total;
    if (!force && v->state == r->vstate && v->since_step == r->vsince && v->rule == r->vrule && h == r->vcells_hash)
        return;
    r->vdirty = 0;
    r->vstate = v->state;
    r->vsince = v->since_step;
    r->vrule = v->rule;
    r->vcells_hash = h;
    e->verdict_changed = 1;
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
            char *name = strdup(it->msg.run);
            if (!name) return -1; /* keeps the old name */
            free(r->name);
            r->name = name;
        }
        r->layers = it->msg.layers;
        r->heads = it->msg.heads;
        r->live = 1;
        r->stale = r->failed = 0;
        r->last_seen = time;
        verdict_update(e, r, 1);
        return 0;
    case WRITER_STEP: {
        const struct proto_msg *m = &it->msg;
        if (r->layers == 0) { /* no hello seen (engine started mid-run): learn the shape from the data */
            for (uint32_t i = 0; i < m->nmetrics; i++)
                if (m->metrics[i].kind == PROTO_HEAD) {
                    r->layers = m->metrics[i].rows;
                    r->heads = m->metrics[i].cols;
                }
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
        verdict_update(e, r, 0);
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
        verdict_update(e, r, 1);
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
                if (!e->verdict_changed) verdict_update(e, r, 0);
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
            snprintf(buf + off, n - off, " and %d more", t->ncells_total - 12);
            return;
        }
        const struct alert_cell *c = &t->cells[i];
        if (c->head >= 0)
            off += (size_t)snprintf(buf + off, n - off, "%slayer %d head %d", i ? ", " : "", c->layer, c->head);
        else if (c->layer >= 0) off += (size_t)snprintf(buf + off, n - off, "%slayer %d", i ? ", " : "", c->layer);
        else
            off +=
                (size_t)snprintf(buf + off, n - off, "%s%s", i ? ", " : "", t->rule->metric ? t->rule->metric : "run");
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
    cJSON_AddStringToObject(o, "transition",
                            t->state == ALERT_FIRING     ? "firing"
                            : t->state == ALERT_RESOLVED ? "resolved"
                                                         : "update");
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
    cJSON_AddNumberToObject(o, "ncells", t->ncells_total);
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
