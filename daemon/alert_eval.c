/* alert_eval.c: a rule's per-cell state in one run (struct group,
 * alert_int.h) and its evaluation at each step: the windows the ops read,
 * each cell's condition, pending -> firing -> clear, the unless_training
 * guard, a rollback's rewind and the stalled rule. What a change of the
 * firing cells emits is alert_verdict.c's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "alert_int.h"

int alert_op_windowed(int op) {
    return op == ALERT_OP_DROP || op == ALERT_OP_GROWTH || op == ALERT_OP_ZSCORE || op == ALERT_OP_NEAR_BOUND;
}

/* Whether the op's ring holds the cell's own value, which is then its
 * latest value too (near_bound's ring holds the rising metric). */
static int ring_holds_value(int op) { return alert_op_windowed(op) && op != ALERT_OP_NEAR_BOUND; }

void alert_group_free(struct group *g) {
    free(g->steps32);
    free(g->steps64);
    free(g->flags);
    free(g->last);
    free(g->ring);
    free(g->mx);
    free(g->sums);
    free(g->hist32);
    free(g->hist64);
    free(g->last_cells);
}

/* Bytes a cell costs in the group, its window's rows aside. */
static uint64_t cell_bytes(const struct alert_rule *rule, const struct group *g) {
    uint64_t b = CELL_NSTEPS * (g->steps64 ? sizeof(int64_t) : sizeof(int32_t)) + sizeof(uint8_t);
    if (!ring_holds_value(rule->op)) b += sizeof(float);
    if (rule->op == ALERT_OP_DROP) b += sizeof(float);
    if (rule->op == ALERT_OP_ZSCORE) b += sizeof(struct cell_sums);
    if (rule->of_last) b += rule->of_last <= 32 ? sizeof(uint32_t) : sizeof(uint64_t);
    return b;
}

uint64_t alert_group_bytes(const struct alert_rule *rule, const struct group *g) {
    if (!g->ncells) return (uint64_t)g->last_cap * sizeof *g->last_cells;
    return (uint64_t)g->ncells * (cell_bytes(rule, g) + (uint64_t)g->ring_rows * sizeof(float)) +
           (uint64_t)g->last_cap * sizeof *g->last_cells;
}

int alert_group_init(struct group *g, const struct alert_rule *rule, int n, int64_t step) {
    if (g->flags && g->ncells == n) return 0;
    alert_group_free(g);
    memset(g, 0, sizeof *g);
    size_t un = (size_t)n;
    int failed = !(g->steps32 = malloc(un * CELL_NSTEPS * sizeof *g->steps32));
    failed |= !(g->flags = calloc(un, sizeof *g->flags));
    if (!ring_holds_value(rule->op)) failed |= !(g->last = calloc(un, sizeof *g->last));
    if (rule->op == ALERT_OP_DROP) failed |= !(g->mx = malloc(un * sizeof *g->mx));
    if (rule->op == ALERT_OP_ZSCORE) failed |= !(g->sums = calloc(un, sizeof *g->sums));
    if (rule->of_last && rule->of_last <= 32) failed |= !(g->hist32 = calloc(un, sizeof *g->hist32));
    else if (rule->of_last) failed |= !(g->hist64 = calloc(un, sizeof *g->hist64));
    if (failed) {
        alert_group_free(g);
        memset(g, 0, sizeof *g);
        return -1;
    }
    g->ncells = n;
    g->step_base = step > 0 ? step : 0;
    for (size_t i = 0; i < un * CELL_NSTEPS; i++) g->steps32[i] = INT32_MIN;
    if (g->mx)
        for (int i = 0; i < n; i++) g->mx[i] = -INFINITY;
    return 0;
}

/* Makes `step` one the group's cells can hold: the 32-bit steps give way
 * to 64-bit ones when it is 2^31 or more from step_base. -1 out of memory
 * (the group stays as it was). */
static int group_fit(struct group *g, int64_t step) {
    if (g->steps64 || step < 0) return 0;
    int64_t d = step - g->step_base;
    if (d > INT32_MIN && d <= INT32_MAX) return 0;
    size_t n = (size_t)g->ncells * CELL_NSTEPS;
    int64_t *w = malloc((n ? n : 1) * sizeof *w);
    if (!w) return -1;
    for (size_t k = 0; k < n; k++) w[k] = g->steps32[k] == INT32_MIN ? -1 : g->step_base + g->steps32[k];
    free(g->steps32);
    g->steps32 = NULL;
    g->steps64 = w;
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

static const struct proto_metric *find_metric(const struct proto_msg *m, const char *name, int kind) {
    for (uint32_t i = 0; i < m->nmetrics; i++)
        if (m->metrics[i].kind == kind && strcmp(m->metrics[i].name, name) == 0) return &m->metrics[i];
    return NULL;
}

static int scope_kind(int scope) {
    return scope == ALERT_SCOPE_HEAD ? PROTO_HEAD : scope == ALERT_SCOPE_LAYER ? PROTO_LAYER : PROTO_SCALAR;
}

static int cells_of(const struct alert_rule *rule, const struct run_state *r) {
    switch (rule->scope) {
    case ALERT_SCOPE_HEAD: return (int)(r->layers * r->heads);
    case ALERT_SCOPE_LAYER: return (int)r->layers;
    default: return 1;
    }
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
    case ALERT_OP_BELOW: return v < (rule->has_clear && cell_firing(g, i) ? rule->clear_value : rule->value);
    case ALERT_OP_ABOVE: return v > (rule->has_clear && cell_firing(g, i) ? rule->clear_value : rule->value);
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

/* Shifts cond into cell i's at_least/of_last history; returns the number
 * of the last of_last steps it held on. */
static int hist_push(const struct alert_rule *rule, struct group *g, int i, int cond) {
    if (g->hist32) {
        uint32_t mask = rule->of_last == 32 ? ~0U : (1U << rule->of_last) - 1;
        g->hist32[i] = ((g->hist32[i] << 1) | (uint32_t)(cond != 0)) & mask;
        return __builtin_popcount(g->hist32[i]);
    }
    uint64_t mask = rule->of_last == 64 ? ~0ULL : (1ULL << rule->of_last) - 1;
    g->hist64[i] = ((g->hist64[i] << 1) | (uint64_t)(cond != 0)) & mask;
    return __builtin_popcountll(g->hist64[i]);
}

/* Whether cell i holds its condition long enough to fire (or, firing, to
 * go on firing), with cond this step's condition: for K consecutive steps
 * (pending since K steps; a firing cell at every step cond holds), or on
 * at least K of the last N (its history word, shifted here). Keeps
 * CELL_PENDING: the first step of the current stretch. */
static int cell_held(const struct alert_rule *rule, struct group *g, int i, int cond, int64_t step) {
    if (!rule->of_last) {
        if (!cond) {
            cell_set(g, i, CELL_PENDING, -1);
            return 0;
        }
        int64_t since = cell_get(g, i, CELL_PENDING);
        if (since < 0) cell_set(g, i, CELL_PENDING, since = step);
        return cell_firing(g, i) || step - since >= rule->for_steps; /* a firing cell holds while cond does */
    }
    int held = hist_push(rule, g, i, cond);
    if (!held) {
        cell_set(g, i, CELL_PENDING, -1);
        return 0;
    }
    if (cell_get(g, i, CELL_PENDING) < 0) cell_set(g, i, CELL_PENDING, step);
    return held >= rule->for_steps;
}

/* Moves cell i through pending -> firing -> clear -> resolved. held: the
 * condition held long enough (cell_held); training: the rule's
 * unless_training guard says the loss trains, so the cell does not fire
 * (it is sharp) and a firing one clears. */
static void cell_step(const struct alert_rule *rule, struct group *g, int i, int held, int training, int64_t step) {
    uint8_t f = (uint8_t)((g->flags[i] & ~CELL_SHARP) | (held && training ? CELL_SHARP : 0));
    if (held && !training) {
        cell_set(g, i, CELL_CLEAR, -1);
        if (!(f & CELL_FIRING)) {
            f |= CELL_FIRING;
            cell_set(g, i, CELL_FIRED, cell_get(g, i, CELL_PENDING));
        }
    } else if (f & CELL_FIRING) {
        int64_t clear = cell_get(g, i, CELL_CLEAR);
        if (clear < 0) cell_set(g, i, CELL_CLEAR, clear = step);
        if (step - clear >= rule->keep_firing_for) {
            f &= (uint8_t)~CELL_FIRING;
            cell_set(g, i, CELL_CLEAR, -1);
            cell_set(g, i, CELL_FIRED, -1);
        }
    }
    g->flags[i] = f;
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

/* Evaluates a rule on a step of a run: every cell's condition, its window
 * and its state, then what the change of firing cells emits. Returns the
 * number of transitions, -1 out of memory. A step without the rule's
 * metrics (or out of memory for its state) is not evaluated. */
int alert_eval_rule(struct alert_engine *e, const struct alert_rule *rule, struct run_state *r, struct group *g,
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
    if ((int)(pm->rows * pm->cols) != n || alert_group_init(g, rule, n, step) || group_fit(g, step)) return 0;
    /* every metric read per cell has the cell layout (the store refuses
     * other shapes; checked again so no read can leave the values) */
    if ((pa && (int)(pa->rows * pa->cols) != n) || (pb && (int)(pb->rows * pb->cols) != n) ||
        (pr && (int)(pr->rows * pr->cols) != n))
        return 0;
    const float *vals = m->values + pm->offset;
    int w = rule->window > 0 ? rule->window : 1;
    int changed = 0, npending = 0, nsharp = 0;
    int windowed = alert_op_windowed(rule->op);
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
        if (g->last) g->last[i] = v;
        int was = cell_firing(g, i);
        int held = cell_held(rule, g, i, cond, step);
        cell_step(rule, g, i, held, training, step);
        changed |= was != cell_firing(g, i);
        /* pending: on its way to firing; a sharp cell is not (the loss trains) */
        npending += !cell_firing(g, i) && cell_get(g, i, CELL_PENDING) >= 0 && !training;
        nsharp += cell_sharp(g, i);
    }
    g->npending = npending;
    g->nsharp = nsharp;
    if (windowed) g->last_row = g->ring_pos;
    g->ring_pos = (g->ring_pos + 1) % w;
    if (g->ring_n < w) g->ring_n++;
    e->stats.evaluations += (uint64_t)n;
    /* transitions only happen when a cell starts or stops firing, or an
     * update held back is due */
    return changed || g->update_due ? alert_group_settle(e, rule, r, g, step, time, 1) : 0;
}

/* Takes every cell of a group out of pending, firing and sharp. */
static void group_reset_cells(struct group *g) {
    memset(g->flags, 0, (size_t)g->ncells * sizeof *g->flags);
    for (int c = 0; c < g->ncells; c++)
        for (int k = 0; k < CELL_NSTEPS; k++) cell_set(g, c, k, -1);
    g->npending = g->nsharp = 0;
}

/* Resolves every firing group of a run (the run ended or was deleted:
 * reason says which). */
int alert_resolve_all(struct alert_engine *e, struct run_state *r, int64_t step, double time, int reason) {
    int n = 0;
    for (int i = 0; i < e->rules->n; i++) {
        struct group *g = &r->groups[i];
        if (g->ncells) group_reset_cells(g);
        if (g->firing) {
            if (alert_group_settle(e, &e->rules->rules[i], r, g, step, time, 0) < 0) return -1;
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
int alert_run_rewind(struct alert_engine *e, struct run_state *r, int64_t step, double time) {
    int n = 0;
    for (int i = 0; i < e->rules->n; i++) {
        struct group *g = &r->groups[i];
        int abandoned = 0;
        g->ring_n = g->ring_pos = 0;
        g->npending = g->nsharp = 0;
        for (int c = 0; c < g->ncells; c++) {
            cell_set(g, c, CELL_PENDING, -1);
            cell_set(g, c, CELL_CLEAR, -1);
            g->flags[c] &= (uint8_t)~CELL_SHARP;
            if (g->hist32) g->hist32[c] = 0;
            if (g->hist64) g->hist64[c] = 0;
            if (g->mx) g->mx[c] = -INFINITY;
            if (g->sums) g->sums[c] = (struct cell_sums){0};
            if (cell_firing(g, c) && cell_get(g, c, CELL_FIRED) >= step) {
                g->flags[c] &= (uint8_t)~CELL_FIRING;
                cell_set(g, c, CELL_FIRED, -1);
                abandoned = 1;
            }
        }
        if (abandoned) {
            int t = alert_group_settle(e, &e->rules->rules[i], r, g, step, time, 0);
            if (t < 0) return -1;
            n += t;
        }
    }
    return n;
}

/* The stalled rules of a run at `now`: a live run that sent nothing
 * (activity: it just did) for a rule's seconds. */
int alert_stalled_eval(struct alert_engine *e, struct run_state *r, double now, int64_t step, int activity) {
    int n = 0;
    for (int i = 0; i < e->rules->n; i++) {
        const struct alert_rule *rule = &e->rules->rules[i];
        if (rule->op != ALERT_OP_STALLED) continue;
        struct group *g = &r->groups[i];
        if (alert_group_init(g, rule, 1, r->last_step) || group_fit(g, r->last_step)) return -1;
        int cond = !activity && r->live && now - r->last_seen > rule->seconds;
        g->last[0] = (float)(now - r->last_seen);
        int was = cell_firing(g, 0);
        g->flags[0] = cond ? CELL_FIRING : 0;
        int64_t since = cond ? (was ? cell_get(g, 0, CELL_PENDING) : r->last_step) : -1;
        cell_set(g, 0, CELL_PENDING, since);
        cell_set(g, 0, CELL_FIRED, since); /* firing means CELL_FIRED >= 0 */
        int t = alert_group_settle(e, rule, r, g, step, now, 0);
        if (t < 0) return -1;
        n += t;
    }
    return n;
}
