/* alert_int.h: the alert engine's private state and the declarations its
 * files share (alert.c: the engine and its runs; alert_eval.c: a rule's
 * per-cell state and its evaluation; alert_verdict.c: transitions and
 * verdicts; alert_json.c: the JSON of a transition). Not a contract: only
 * alert.h is. */
#ifndef ALERT_INT_H
#define ALERT_INT_H

#include <math.h>
#include <stdint.h>

#include "alert.h"

#define UNLESS_OPENING 10 /* values of the guard metric that make its opening level */
#define UNLESS_SMOOTH 20  /* steps its smoothed level averages over */

/* zscore's running sums of the finite values in a cell's window, kept in
 * O(1) per step. */
struct cell_sums {
    double sum, sumsq;
    int64_t nfinite;
};

/* A cell's three steps (CELL_*), each -1 when unset. */
enum {
    CELL_PENDING = 0, /* the first step of the stretch the condition holds (at_least/of_last: held on
                       * one of the last of_last steps); -1 when it does not hold */
    CELL_CLEAR,       /* firing and clear since; else -1 */
    CELL_FIRED,       /* firing: the step its condition began to hold; else -1 */
    CELL_NSTEPS
};

/* A cell's flags. CELL_SHARP: it holds the condition long enough, but
 * unless_training says the loss trains: not firing (the verdict's sharp
 * heads). */
#define CELL_FIRING 1u
#define CELL_SHARP 2u

/* The state of one rule in one run, per cell in arrays of ncells (a cell
 * costs the same in every array: no padding, and a rule pays only for the
 * arrays its op reads).
 *
 * A cell's steps are kept in 32 bits each, relative to step_base (the first
 * step the group saw), while every step the run sends is within 2^31 of it
 * (steps32); a run whose steps go further has them in 64 bits (steps64,
 * 12 bytes a cell more), so that no step is ever rounded.
 *
 * ring holds, for the ops that read a window, the last `window` values of
 * the watched series of every cell (the metric itself; the rising metric
 * for near_bound), step-major: row r is one step of all ncells cells, so
 * that a step writes one contiguous row (cell-major, each cell's write
 * touched a cache line of its own), and rows are added as steps arrive, up
 * to `window` (a run that sent 3 steps holds 3). The ring's row last_row
 * is each cell's latest value where the ring holds the metric (drop,
 * growth, zscore); the other ops keep it in last. mx (drop) and sums
 * (zscore) summarise each cell's window. */
struct group {
    int ncells;
    int32_t *steps32; /* CELL_NSTEPS a cell, relative to step_base; INT32_MIN for -1 */
    int64_t *steps64; /* CELL_NSTEPS a cell; NULL while steps32 serves */
    int64_t step_base;
    uint8_t *flags;         /* CELL_FIRING | CELL_SHARP */
    float *last;            /* the value of the latest evaluated step, for ops whose ring does not hold it */
    float *ring;            /* ring_rows x ncells; NULL for ops without a window (or before a step) */
    int ring_rows;          /* rows allocated: grows to the window */
    int last_row;           /* the ring's row of the latest evaluated step */
    float *mx;              /* drop: the max of the finite values in the ring (-inf if none); else NULL */
    struct cell_sums *sums; /* zscore; else NULL */
    /* at_least/of_last: bit k is the condition k steps ago; hist32 up to 32 steps, hist64 up to 64 */
    uint32_t *hist32;
    uint64_t *hist64;
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

/* A cell's step `which` (CELL_*), -1 when unset. */
static inline int64_t cell_get(const struct group *g, int i, int which) {
    size_t k = (size_t)i * CELL_NSTEPS + (size_t)which;
    if (g->steps64) return g->steps64[k];
    return g->steps32[k] == INT32_MIN ? -1 : g->step_base + g->steps32[k];
}

/* Sets it: v is -1 or a step group_fit() admitted (or a cell's own step). */
static inline void cell_set(struct group *g, int i, int which, int64_t v) {
    size_t k = (size_t)i * CELL_NSTEPS + (size_t)which;
    if (g->steps64) g->steps64[k] = v;
    else g->steps32[k] = v < 0 ? INT32_MIN : (int32_t)(v - g->step_base);
}

static inline int cell_firing(const struct group *g, int i) { return (g->flags[i] & CELL_FIRING) != 0; }
static inline int cell_sharp(const struct group *g, int i) { return (g->flags[i] & CELL_SHARP) != 0; }

/* The cell's value at the group's latest evaluated step. */
static inline float cell_last(const struct group *g, int i) {
    if (g->last) return g->last[i];
    return g->ring ? g->ring[(size_t)g->last_row * (size_t)g->ncells + (size_t)i] : NAN;
}

/* alert_eval.c: a rule's per-cell state and its evaluation. */
int alert_op_windowed(int op);
void alert_group_free(struct group *g);
/* Allocates a group's state for n cells (once; shapes are fixed per run);
 * step: the first step it sees. -1 out of memory. */
int alert_group_init(struct group *g, const struct alert_rule *rule, int n, int64_t step);
/* Bytes a group's state holds. */
uint64_t alert_group_bytes(const struct alert_rule *rule, const struct group *g);
int alert_eval_rule(struct alert_engine *e, const struct alert_rule *rule, struct run_state *r, struct group *g,
                    const struct proto_msg *m, int64_t step, double time);
int alert_resolve_all(struct alert_engine *e, struct run_state *r, int64_t step, double time, int reason);
int alert_run_rewind(struct alert_engine *e, struct run_state *r, int64_t step, double time);
int alert_stalled_eval(struct alert_engine *e, struct run_state *r, double now, int64_t step, int activity);

/* alert_verdict.c: transitions and verdicts. */
int alert_group_settle(struct alert_engine *e, const struct alert_rule *rule, struct run_state *r, struct group *g,
                       int64_t step, double time, int held);
void alert_verdict_update(struct alert_engine *e, struct run_state *r, int force);

#endif
