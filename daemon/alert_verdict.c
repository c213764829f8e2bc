/* alert_verdict.c: what the engine's state yields: a group's
 * transitions (firing, resolved, update) when its firing cells change, and
 * a run's verdict from its groups (alert.h). The per-cell state they read
 * is alert_eval.c's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "alert_int.h"

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
int alert_group_settle(struct alert_engine *e, const struct alert_rule *rule, struct run_state *r, struct group *g,
                       int64_t step, double time, int held) {
    int n = 0, changed = 0;
    int64_t earliest = -1;
    for (int i = 0; i < g->ncells; i++) {
        if (!cell_firing(g, i)) continue;
        int layer = -1, head = -1;
        if (rule->scope == ALERT_SCOPE_HEAD) {
            layer = (int)(i / r->heads);
            head = (int)(i % r->heads);
        } else if (rule->scope == ALERT_SCOPE_LAYER) {
            layer = i;
        }
        if (n >= g->nlast || g->last_cells[n].layer != layer || g->last_cells[n].head != head) changed = 1;
        n++;
        int64_t since = cell_get(g, i, CELL_PENDING);
        if (since >= 0 && (earliest < 0 || since < earliest)) earliest = since;
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
            if (!cell_firing(g, i)) continue;
            g->last_cells[j].layer = rule->scope == ALERT_SCOPE_HEAD    ? (int32_t)(i / r->heads)
                                     : rule->scope == ALERT_SCOPE_LAYER ? i
                                                                        : -1;
            g->last_cells[j].head = rule->scope == ALERT_SCOPE_HEAD ? (int32_t)(i % r->heads) : -1;
            g->last_cells[j].value = cell_last(g, i);
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
        if (!rule->verdict || !g->flags) continue;
        if (rule->verdict == ALERT_V_COLLAPSED) {
            int64_t since = -1;
            int pending = 0;
            if (g->firing) {
                since = g->start_step;
            } else if (r->live && g->npending > 0) {
                pending = 1;
                for (int c = 0; c < g->ncells; c++)
                    if (!cell_firing(g, c) && cell_get(g, c, CELL_PENDING) >= 0 &&
                        (since < 0 || cell_get(g, c, CELL_PENDING) < since))
                        since = cell_get(g, c, CELL_PENDING);
            } else {
                if (g->nsharp > 0 && !sharpg) { /* held back by unless_training: the loss trains */
                    for (int c = 0; c < g->ncells; c++)
                        if (cell_sharp(g, c) && (since < 0 || cell_get(g, c, CELL_PENDING) < since))
                            since = cell_get(g, c, CELL_PENDING);
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
            int listed = best.state == ALERT_V_SHARP ? cell_sharp(bestg, c)
                         : pending_best              ? cell_get(bestg, c, CELL_PENDING) >= 0 && !cell_firing(bestg, c)
                                                     : cell_firing(bestg, c);
            if (!listed) continue;
            total++;
            if (n == ALERT_MAX_CELLS_LISTED) continue;
            int32_t layer = rule->scope == ALERT_SCOPE_HEAD    ? (int32_t)(c / r->heads)
                            : rule->scope == ALERT_SCOPE_LAYER ? c
                                                               : -1;
            int32_t head = rule->scope == ALERT_SCOPE_HEAD ? (int32_t)(c % r->heads) : -1;
            e->vcells[n++] = (struct alert_cell){.layer = layer, .head = head, .value = cell_last(bestg, c)};
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
void alert_verdict_update(struct alert_engine *e, struct run_state *r, int force) {
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
