/* store_step.c: what a step writes: its frames, the blocks they are
 * sealed into and the rollups pooled from them, the latest values, and a
 * rewind to an earlier step (a resumed run's new branch). Not the runs'
 * rows, transactions or migrations (store.c), nor what takes data away
 * (store_purge.c). The contract is store.h; the layout schema/storage.md. */
#include "store.h"
#include "store_int.h"

#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fblock.h"
#include "fblock_rows.h"
#include "integrity.h"
#include "rollup.h"

static struct metric_cache *metric_get(struct store *st, struct run_cache *r, const struct proto_metric *pm,
                                       uint32_t hint, int *conflict) {
    struct metric_cache *m = NULL;
    *conflict = 0;
    if (hint < r->nmetrics && strcmp(r->metrics[hint].name, pm->name) == 0) m = &r->metrics[hint];
    for (uint32_t i = 0; !m && i < r->nmetrics; i++)
        if (strcmp(r->metrics[i].name, pm->name) == 0) m = &r->metrics[i];
    if (m) {
        if (m->kind != pm->kind) *conflict = 1;
        return m;
    }
    if (r->nmetrics == r->cap) {
        uint32_t cap = r->cap ? r->cap * 2 : 16;
        struct metric_cache *nm = realloc(r->metrics, cap * sizeof *nm);
        if (!nm) {
            store_set_err(st, SQLITE_NOMEM, "out of memory");
            return NULL;
        }
        r->metrics = nm;
        r->cap = cap;
    }
    sqlite3_stmt *s = st->stmt[S_INSERT_METRIC];
    sqlite3_bind_int64(s, 1, r->id);
    sqlite3_bind_text(s, 2, pm->name, -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 3, pm->kind);
    if (store_step_done(st, s, "creating metric")) return NULL;
    m = &r->metrics[r->nmetrics++];
    memcpy(m->name, pm->name, sizeof m->name);
    m->id = sqlite3_last_insert_rowid(st->db);
    m->kind = pm->kind;
    m->n = pm->rows * pm->cols;
    m->last_step = -1;
    return m;
}

/* Grows the scratch buffers for metrics of n values. */
static int scratch_grow(struct store *st, uint32_t n) {
    if (n > st->aggcap) {
        struct rollup_cell *a = realloc(st->agg, n * sizeof *a);
        if (a) st->agg = a;
        struct rollup_cell *src = a ? realloc(st->aggsrc, n * sizeof *src) : NULL;
        if (src) st->aggsrc = src;
        unsigned char *row = src ? realloc(st->aggrow, ROLLUP_MAX_BYTES(n)) : NULL;
        if (!row) return store_set_err(st, SQLITE_NOMEM, "out of memory");
        st->aggrow = row;
        st->aggcap = n;
    }
    size_t vals = (size_t)n * FBLOCK_STEPS;
    if (vals > st->blockcap) {
        float *v = realloc(st->blockvals, vals * sizeof *v);
        if (!v) return store_set_err(st, SQLITE_NOMEM, "out of memory");
        st->blockvals = v;
        st->blockcap = vals;
    }
    return 0;
}

/* Writes st->agg as rollup block `block` of level `level` of metric m. */
static int rollup_write(struct store *st, struct metric_cache *m, int level, int64_t block, int64_t nframes,
                        int poisoned) {
    return store_rollup_put(st, m->id, st->agg, m->n, level, block, nframes, poisoned);
}

/* Computes and stores rollup block `block` of level `level` (>= 2) for
 * metric m from the level below (rows of either format). An empty block
 * gets no row. A row below that fails its checksum or does not decode is
 * damaged: the block is written all the same but poisoned (integrity.h),
 * so that a reader of it reports the damage instead of a summary that
 * leaves the row out, and the damage is counted and logged once here. */
static int rollup_block(struct store *st, struct metric_cache *m, int level, int64_t block) {
    if (scratch_grow(st, m->n)) return -1;
    rollup_reset(st->agg, m->n);
    int64_t nframes = 0, bad_block = -1;
    int rc = SQLITE_DONE;
    sqlite3_stmt *s = st->stmt[S_SELECT_ROLLUPS];
    for (uint32_t c = 0; c < ROLLUP_CHUNKS(m->n) && rc == SQLITE_DONE; c++) {
        uint32_t c0 = c * ROLLUP_CHUNK_CELLS, cn = ROLLUP_CHUNK_LEN(m->n, c);
        sqlite3_bind_int64(s, 1, m->id);
        sqlite3_bind_int(s, 2, level - 1);
        sqlite3_bind_int64(s, 3, block * 8);
        sqlite3_bind_int64(s, 4, block * 8 + 8);
        sqlite3_bind_int(s, 5, (int)c);
        while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
            int64_t nf = sqlite3_column_int64(s, 0), b = sqlite3_column_int64(s, 3);
            const void *d = sqlite3_column_blob(s, 1);
            size_t len = (size_t)sqlite3_column_bytes(s, 1);
            if ((sqlite3_column_type(s, 2) != SQLITE_NULL &&
                 sqlite3_column_int64(s, 2) !=
                     integrity_stored(integrity_rollup_crc(m->id, level - 1, c, b, nf, d, len))) ||
                nf < 0 || nf > ROLLUP_LEVEL_SIZE(level - 1) ||
                rollup_decode(d, len, cn, (uint32_t)nf, 0, cn, st->aggsrc + c0)) {
                if (bad_block < 0) bad_block = b;
                continue;
            }
            if (!c) nframes += nf; /* every chunk has the block's frames */
            for (uint32_t i = c0; i < c0 + cn; i++) rollup_merge(&st->agg[i], &st->aggsrc[i]);
        }
        sqlite3_reset(s);
    }
    if (rc != SQLITE_DONE) return store_db_err(st, "reading rollup source");
    if (bad_block >= 0) {
        integrity_note();
        fprintf(stderr,
                "entropyd: store: damaged rollup row: metric %lld, level %d, block %lld (steps %lld..%lld) fails "
                "its checksum or does not decode; level %d block %lld, pooled from it, is marked damaged too\n",
                (long long)m->id, level - 1, (long long)bad_block,
                (long long)(bad_block * ROLLUP_LEVEL_SIZE(level - 1)),
                (long long)((bad_block + 1) * ROLLUP_LEVEL_SIZE(level - 1) - 1), level, (long long)block);
        if (!nframes) nframes = 1; /* a row must be there, for readers to find the damage */
    }
    return nframes ? rollup_write(st, m, level, block, nframes, bad_block >= 0) : 0;
}

/* Seals block `block` of metric m (its steps are complete): its raw frames
 * become its level-1 rollup and its coded rows (fblock_rows.h), and
 * leave `frames`. A block without raw frames is left as it is (one sealed
 * before a rewind that ended at its last step). */
static int block_seal(struct store *st, struct metric_cache *m, int64_t block) {
    int64_t lo = block * FBLOCK_STEPS;
    uint64_t mask = 0;
    uint32_t nf = 0;
    int rc;
    int64_t bad = -1; /* a frame that fails its checksum: the block is sealed poisoned */
    if (scratch_grow(st, m->n)) return -1;
    sqlite3_stmt *s = st->stmt[S_SEAL_FRAMES];
    sqlite3_bind_int64(s, 1, m->id);
    sqlite3_bind_int64(s, 2, lo);
    sqlite3_bind_int64(s, 3, lo + FBLOCK_STEPS);
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        int64_t step = sqlite3_column_int64(s, 0);
        if ((uint32_t)sqlite3_column_bytes(s, 1) != m->n * 4) continue; /* cannot happen: shapes are fixed per run */
        if (sqlite3_column_type(s, 2) != SQLITE_NULL &&
            sqlite3_column_int64(s, 2) !=
                integrity_stored(integrity_frame_crc(m->id, step, sqlite3_column_blob(s, 1), (size_t)m->n * 4)))
            bad = step;
        memcpy(st->blockvals + (size_t)nf * m->n, sqlite3_column_blob(s, 1), (size_t)m->n * 4);
        mask |= UINT64_C(1) << (step - lo);
        nf++;
    }
    sqlite3_reset(s);
    if (rc != SQLITE_DONE) return store_db_err(st, "reading a block's frames");
    if (!nf) return 0;
    rollup_reset(st->agg, m->n);
    for (uint32_t f = 0; f < nf; f++) {
        const float *v = st->blockvals + (size_t)f * m->n;
        for (uint32_t i = 0; i < m->n; i++) rollup_add(&st->agg[i], v[i]);
    }
    if (bad >= 0) {
        integrity_note();
        fprintf(stderr,
                "entropyd: store: damaged raw frame: metric %lld, step %lld fails its checksum; its block "
                "(steps %lld..%lld) is sealed marked damaged\n",
                (long long)m->id, (long long)bad, (long long)lo, (long long)(lo + FBLOCK_STEPS - 1));
    }
    if (rollup_write(st, m, 1, block, nf, bad >= 0)) return -1;
    if (st->lossy_bits) fblock_round(st->blockvals, (size_t)nf * m->n, st->lossy_bits);
    int put = fblock_rows_put(st->rows, m->id, block, mask, st->blockvals, nf, m->n, bad >= 0);
    if (store_rows_err(st, put, m->id, block, "writing a block")) return -1;
    if (put == 1) return 0; /* a step past 2^32: its frames stay raw */
    s = st->stmt[S_SEAL_DELETE];
    sqlite3_bind_int64(s, 1, m->id);
    sqlite3_bind_int64(s, 2, lo);
    sqlite3_bind_int64(s, 3, lo + FBLOCK_STEPS);
    return store_step_done(st, s, "deleting a sealed block's frames");
}

/* A new frame at `step` completes every block that held the metric's
 * previous last step and ends at or before `step`: level 1 is the block of
 * frames itself (sealed), higher levels roll up the level below. */
static int rollup_advance(struct store *st, struct metric_cache *m, int64_t step) {
    if (m->last_step < 0) return 0;
    for (int k = 1; k <= ROLLUP_LEVELS; k++) {
        int64_t size = ROLLUP_LEVEL_SIZE(k);
        int64_t pb = m->last_step / size;
        if (step / size <= pb) break; /* higher levels cannot complete either */
        if (k == 1 ? block_seal(st, m, pb) : rollup_block(st, m, k, pb)) return -1;
    }
    return 0;
}

/* The last frame of metric m, raw or in its last block: its step (-1 when
 * it has none) and values in st->blockvals. */
static int last_frame(struct store *st, struct metric_cache *m, int64_t *step) {
    *step = -1;
    if (scratch_grow(st, m->n)) return -1;
    sqlite3_stmt *s = st->stmt[S_LAST_FRAME];
    sqlite3_bind_int64(s, 1, m->id);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW && (uint32_t)sqlite3_column_bytes(s, 1) == m->n * 4) {
        *step = sqlite3_column_int64(s, 0);
        memcpy(st->blockvals, sqlite3_column_blob(s, 1), (size_t)m->n * 4);
    }
    sqlite3_reset(s);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return store_db_err(st, "reading the last frame");
    int64_t block;
    uint64_t mask;
    fblock_rows_walk(st->rows, m->id, 0, INT64_MAX, 1, m->n, 0, m->n);
    int r = fblock_rows_next(st->rows, &block, &mask, st->blockvals), ret = 0;
    fblock_rows_end(st->rows);
    if (r < 0) return store_rows_err(st, r, m->id, -1, "reading the last block");
    uint32_t nf = fblock_count(mask);
    int64_t last = r ? fblock_step(block, mask, nf - 1) : -1;
    if (last > *step) {
        memmove(st->blockvals, st->blockvals + (size_t)(nf - 1) * m->n, (size_t)m->n * 4);
        *step = last;
    }
    return ret;
}

/* Refreshes the latest rows of every metric of r from its frames and
 * blocks (after a rewind moved its newest frames away): a seek or two per
 * metric. */
static int latest_reload(struct store *st, struct run_cache *r) {
    char sql[160];
    snprintf(sql, sizeof sql, "DELETE FROM latest WHERE metric_id IN (SELECT id FROM metrics WHERE run_id = %lld)",
             (long long)r->id);
    if (store_exec(st, sql)) return -1;
    for (uint32_t i = 0; i < r->nmetrics; i++) {
        struct metric_cache *m = &r->metrics[i];
        int64_t step;
        if (last_frame(st, m, &step)) return -1;
        if (step < 0) continue;
        sqlite3_stmt *s = st->stmt[S_UPSERT_LATEST];
        sqlite3_bind_int64(s, 1, m->id);
        sqlite3_bind_int64(s, 2, step);
        sqlite3_bind_blob(s, 3, st->blockvals, (int)(m->n * sizeof(float)), SQLITE_STATIC);
        if (store_step_done(st, s, "writing latest value")) return -1;
    }
    return 0;
}

/* Starts a rewind of r to `step`: a branch row (its id above any still
 * being purged), the rewinds row and the event. */
static int rewind_start(struct store *st, struct run_cache *r, int64_t step, double time) {
    char sql[700];
    long long id = (long long)r->id, from = (long long)step;
    snprintf(
        sql, sizeof sql,
        "INSERT INTO branches(id, run_id, from_step, to_step, time) VALUES (max(coalesce((SELECT max(id) FROM branches), 0), "
        "coalesce((SELECT max(id) FROM purge WHERE kind = 1), 0)) + 1, %lld, %lld, %lld, %.6f);"
        "INSERT INTO rewinds(run_id, branch_id, from_step) VALUES (%lld, last_insert_rowid(), %lld);",
        id, from, (long long)r->last_step, time, id, from);
    if (store_exec(st, sql)) return -1;
    char text[128];
    snprintf(text, sizeof text, "rollback to step %lld (was at step %lld; the abandoned steps are kept as a branch)",
             from, (long long)r->last_step);
    if (store_event(st, r->id, 0, time, PROTO_WARN, text)) return -1;
    r->rewinding = 1;
    return 0;
}

int64_t store_run_changes(struct store *st, sqlite3_stmt *s, const char *what) {
    if (store_step_done(st, s, what)) return -1;
    return sqlite3_changes64(st->db);
}

/* Writes frame (metric_id, step) of n values into `frames`. */
static int frame_insert(struct store *st, int64_t metric_id, int64_t step, const float *v, uint32_t n,
                        const char *what) {
    sqlite3_stmt *s = st->stmt[S_INSERT_FRAME];
    sqlite3_bind_int64(s, 1, metric_id);
    sqlite3_bind_int64(s, 2, step);
    sqlite3_bind_blob(s, 3, v, (int)(n * sizeof(float)), SQLITE_STATIC);
    sqlite3_bind_int64(s, 4, integrity_stored(integrity_frame_crc(metric_id, step, v, n * sizeof(float))));
    return store_step_done(st, s, what);
}

/* Puts one frame (n values) into a branch's abandoned frames, or back
 * into `frames` when branch is 0. */
static int frame_put(struct store *st, int64_t branch, int64_t metric_id, int64_t step, const float *v, uint32_t n) {
    if (!branch) return frame_insert(st, metric_id, step, v, n, "moving a frame out of its block");
    sqlite3_stmt *s = st->stmt[S_INSERT_ABANDONED];
    sqlite3_bind_int64(s, 1, branch);
    sqlite3_bind_int64(s, 2, metric_id);
    sqlite3_bind_int64(s, 3, step);
    sqlite3_bind_blob(s, 4, v, (int)(n * sizeof(float)), SQLITE_STATIC);
    return store_step_done(st, s, "moving a frame out of its block");
}

/* Moves metric m's sealed blocks holding steps >= from into the branch,
 * the highest first, a block at a time, charging its frames to *left: the
 * frames at or after `from` go to the branch, those before it (in the
 * block holding `from`) back to `frames`, where the block is open again.
 * Returns 1 when the budget ran out (more may be left), 0 when no such
 * block is left, -1 on failure. */
static int rewind_blocks(struct store *st, struct metric_cache *m, int64_t from, int64_t branch, int64_t *left) {
    if (scratch_grow(st, m->n)) return -1;
    while (*left > 0) {
        int64_t block;
        uint64_t mask;
        fblock_rows_walk(st->rows, m->id, from / FBLOCK_STEPS, INT64_MAX, 1, m->n, 0, m->n);
        int r = fblock_rows_next(st->rows, &block, &mask, st->blockvals);
        fblock_rows_end(st->rows);
        if (r <= 0) return r ? store_rows_err(st, r, m->id, -1, "reading blocks to rewind") : 0;
        uint32_t nf = fblock_count(mask);
        for (uint32_t f = 0; f < nf; f++) {
            int64_t step = fblock_step(block, mask, f);
            if (frame_put(st, step >= from ? branch : 0, m->id, step, st->blockvals + (size_t)f * m->n, m->n))
                return -1;
        }
        if (store_rows_err(st, fblock_rows_delete(st->rows, m->id, block), m->id, block, "deleting a rewound block"))
            return -1;
        *left -= nf;
    }
    return 1;
}

int store_rewind(struct store *st, int64_t run_id, int64_t step, double time, int64_t budget) {
    struct run_cache *r = store_run_get(st, run_id);
    if (!r) return -1;
    if (budget < 1) budget = 1;
    if (!r->rewinding) {
        if (r->last_step < 0 || step > r->last_step) return 0;
        if (rewind_start(st, r, step, time)) return -1;
    }
    sqlite3_stmt *s = st->stmt[S_SELECT_REWIND];
    sqlite3_bind_int64(s, 1, run_id);
    int rc = sqlite3_step(s);
    int64_t branch = rc == SQLITE_ROW ? sqlite3_column_int64(s, 0) : 0;
    int64_t from = rc == SQLITE_ROW ? sqlite3_column_int64(s, 1) : 0;
    sqlite3_reset(s);
    if (rc != SQLITE_ROW)
        return rc == SQLITE_DONE ? store_set_err(st, SQLITE_CORRUPT, "rewind of run %lld lost", (long long)run_id)
                                 : store_db_err(st, "reading rewind");
    int64_t left = budget, n;
    char sql[256];
    /* 1. rollups from the block holding `from` on (few rows, of at most 64
     * values, up to 20 bytes each, ~12 coded: each counts as 4 frames; a
     * total's row too), so no reader
     * sees a rollup over frames already moved */
    for (; r->rewind_phase == 0 && r->rewind_metric < r->nmetrics && left > 0; r->rewind_metric++) {
        const struct metric_cache *m = &r->metrics[r->rewind_metric];
        uint32_t chunks = ROLLUP_CHUNKS(m->n);
        for (int k = 1; k <= ROLLUP_LEVELS && left > 0; k++) {
            /* the chunks' rows, then (c == chunks) the totals' */
            for (uint32_t c = 0; c <= chunks && left > 0; c++) {
                if (c == chunks && chunks == 1) break;
                s = st->stmt[c < chunks ? S_REWIND_ROLLUPS : S_REWIND_TOTALS];
                sqlite3_bind_int64(s, 1, m->id);
                sqlite3_bind_int(s, 2, k);
                sqlite3_bind_int64(s, 3, from / ROLLUP_LEVEL_SIZE(k));
                sqlite3_bind_int64(s, 4, (left + 3) / 4);
                if (c < chunks) sqlite3_bind_int(s, 5, (int)c);
                if ((n = store_run_changes(st, s, "deleting rewound rollups")) < 0) return -1;
                left -= 4 * n;
            }
        }
        if (left <= 0) break; /* this metric may have more */
    }
    if (r->rewind_phase == 0 && r->rewind_metric >= r->nmetrics) {
        r->rewind_phase = 1;
        r->rewind_metric = 0;
    }
    /* 2. frames, the highest steps first, into the branch */
    for (; r->rewind_phase == 1 && r->rewind_metric < r->nmetrics && left > 0; r->rewind_metric++) {
        int64_t mid = r->metrics[r->rewind_metric].id, lo = from;
        s = st->stmt[S_REWIND_LOW];
        sqlite3_bind_int64(s, 1, mid);
        sqlite3_bind_int64(s, 2, from);
        sqlite3_bind_int64(s, 3, left - 1);
        rc = sqlite3_step(s);
        if (rc == SQLITE_ROW) lo = sqlite3_column_int64(s, 0);
        sqlite3_reset(s);
        if (rc != SQLITE_ROW && rc != SQLITE_DONE) return store_db_err(st, "reading frames to rewind");
        s = st->stmt[S_REWIND_MOVE];
        sqlite3_bind_int64(s, 1, mid);
        sqlite3_bind_int64(s, 2, lo);
        sqlite3_bind_int64(s, 3, branch);
        if (store_step_done(st, s, "moving frames to a branch")) return -1;
        s = st->stmt[S_REWIND_DELETE];
        sqlite3_bind_int64(s, 1, mid);
        sqlite3_bind_int64(s, 2, lo);
        if ((n = store_run_changes(st, s, "deleting rewound frames")) < 0) return -1;
        left -= n;
        if (rc == SQLITE_ROW) break; /* the budget ran out inside this metric */
    }
    if (r->rewind_phase == 1 && r->rewind_metric >= r->nmetrics) {
        r->rewind_phase = 2;
        r->rewind_metric = 0;
    }
    /* 3. sealed blocks, the highest first, into the branch */
    for (; r->rewind_phase == 2 && r->rewind_metric < r->nmetrics && left > 0; r->rewind_metric++) {
        int more = rewind_blocks(st, &r->metrics[r->rewind_metric], from, branch, &left);
        if (more < 0) return -1;
        if (more) break; /* the budget ran out inside this metric */
    }
    if (r->rewind_phase == 2 && r->rewind_metric >= r->nmetrics) r->rewind_phase = 3;
    /* 4. steps (small rows: 8 per frame's worth) */
    if (r->rewind_phase == 3 && left > 0) {
        int64_t want = left * 8;
        s = st->stmt[S_REWIND_STEPS];
        sqlite3_bind_int64(s, 1, run_id);
        sqlite3_bind_int64(s, 2, from);
        sqlite3_bind_int64(s, 3, want - 1);
        if ((n = store_run_changes(st, s, "deleting rewound steps")) < 0) return -1;
        if (n >= want) left = 0;
    } else if (r->rewind_phase < 3) {
        left = 0;
    }
    if (left <= 0) return 1;
    /* 5. done: the run continues from `from` */
    snprintf(sql, sizeof sql, "DELETE FROM rewinds WHERE run_id = %lld", (long long)run_id);
    if (store_exec(st, sql)) return -1;
    int64_t last_seq = r->last_seq;
    double updated = r->updated;
    store_run_forget(st, run_id);
    r = store_run_get(st, run_id); /* the metrics' last steps from what remains */
    if (!r) return -1;
    r->last_seq = last_seq;
    r->updated = updated;
    r->last_step = from - 1;
    if (store_run_save(st, r) || latest_reload(st, r)) return -1;
    return 0;
}

int store_needs_rewind(struct store *st, int64_t run_id, int64_t step) {
    struct run_cache *r = store_run_get(st, run_id);
    if (!r) return -1;
    return r->rewinding || (r->last_step >= 0 && step <= r->last_step);
}

int store_step(struct store *st, int64_t run_id, int64_t seq, const struct proto_msg *msg, double time, char *conflict,
               size_t cap) {
    struct run_cache *r = store_run_get(st, run_id);
    int conflicts = 0;
    if (!r) return -1;
    /* a caller that did not rewind in chunks first (store.h) has it done
     * here, whole, in its transaction */
    while (r->rewinding || (r->last_step >= 0 && msg->step <= r->last_step)) {
        if (store_rewind(st, run_id, msg->step, time, INT64_MAX / 16) < 0) return -1;
        r = store_run_get(st, run_id);
        if (!r) return -1;
    }
    sqlite3_stmt *s = st->stmt[S_INSERT_STEP];
    sqlite3_bind_int64(s, 1, run_id);
    sqlite3_bind_int64(s, 2, msg->step);
    sqlite3_bind_int64(s, 3, seq);
    sqlite3_bind_double(s, 4, time);
    if (store_step_done(st, s, "writing step")) return -1;
    for (uint32_t i = 0; i < msg->nmetrics; i++) {
        const struct proto_metric *pm = &msg->metrics[i];
        int conf;
        struct metric_cache *m = metric_get(st, r, pm, i, &conf);
        if (!m) return -1;
        if (conf || m->n != pm->rows * pm->cols) {
            if (!conflicts++ && cap) snprintf(conflict, cap, "%s", pm->name);
            continue;
        }
        if (rollup_advance(st, m, msg->step)) return -1;
        if (frame_insert(st, m->id, msg->step, msg->values + pm->offset, m->n, "writing frame")) return -1;
        s = st->stmt[S_UPSERT_LATEST];
        sqlite3_bind_int64(s, 1, m->id);
        sqlite3_bind_int64(s, 2, msg->step);
        sqlite3_bind_blob(s, 3, msg->values + pm->offset, (int)(m->n * sizeof(float)), SQLITE_STATIC);
        if (store_step_done(st, s, "writing latest value")) return -1;
        m->last_step = msg->step;
    }
    r->last_seq = seq;
    r->last_step = msg->step;
    r->updated = time;
    if (store_run_save(st, r)) return -1;
    return conflicts ? 1 : 0;
}
