/* store_int.h: the inside of the store, shared by its files and nobody
 * else (the contract is store.h):
 *   store.c        opening and migrating, transactions, the run cache,
 *                  runs, events, the WAL, writing a rollup row
 *   store_step.c   steps: frames, blocks and rollups, rewinds
 *   store_alerts.c alert episodes, the run's verdict and summary
 *   store_purge.c  taking data away in bounded chunks: the purge of deleted
 *                  runs and raw retention (--retain-raw)
 * All run on the writer thread only, like every store_ function. */
#ifndef STORE_INT_H
#define STORE_INT_H

#include <sqlite3.h>
#include <stddef.h>
#include <stdint.h>

/* the codecs' types, used here through pointers only; the files that
 * include this header include store.h first */
struct fblock_codec;
struct fblock_rows;
struct rollup_cell;

/* The statements prepared once at store_open (the SQL is in store.c). */
enum {
    S_INSERT_FRAME,
    S_INSERT_STEP,
    S_INSERT_METRIC,
    S_INSERT_ROLLUP,
    S_INSERT_TOTAL,
    S_SEAL_FRAMES,
    S_SEAL_DELETE,
    S_INSERT_ABANDONED,
    S_LAST_FRAME,
    S_SELECT_ROLLUPS,
    S_UPDATE_RUN,
    S_INSERT_EVENT,
    S_SELECT_RUN,
    S_SELECT_METRICS,
    S_UPSERT_LATEST,
    S_SELECT_REWIND,
    S_REWIND_LOW,
    S_REWIND_MOVE,
    S_REWIND_DELETE,
    S_REWIND_STEPS,
    S_REWIND_ROLLUPS,
    S_REWIND_TOTALS,
    S_PURGE_NEXT,
    /* the hello path and transaction control, prepared once: preparing them
     * at every hello costs a third of the daemon's CPU per hello, and its
     * mallocs grow slower as the heap fills (10,000 runs) */
    S_BEGIN,
    S_COMMIT,
    S_SAVEPOINT,
    S_RELEASE,
    S_RUN_BY_NAME,
    S_RUN_RESUME,
    S_RUN_ID_NEXT,
    S_RUN_CREATE,
    S_RUN_STATUS,
    S_RUN_VERDICT,
    S_ALERTS_CLOSE_RUN,
    S_COUNT
};

/* A metric of a cached run: its row id, kind, value count and last stored
 * step (-1 when none), which decides when a rollup block is complete. */
struct metric_cache {
    char name[PROTO_MAX_NAME + 1];
    int64_t id;
    int kind;
    uint32_t n;
    int64_t last_step;
};

/* What the writer knows of a run between messages: a cache of rows, safe
 * to drop at any time (every change is written to the database at once). */
struct run_cache {
    int64_t id, layers, heads;
    int64_t last_seq, last_step; /* last_step -1 when none */
    double updated;
    int rewinding; /* a rewinds row exists: finish it before any new step */
    /* how far the rewind got (in this cache's life: a reloaded cache starts
     * over, which is correct as every phase is idempotent, only slower):
     * phase 0 rollups, 1 raw frames, 2 blocks, 3 steps; the metric index
     * within it */
    int rewind_phase;
    uint32_t rewind_metric;
    uint32_t nmetrics, cap;
    struct metric_cache *metrics;
};

struct store {
    sqlite3 *db;
    sqlite3_stmt *stmt[S_COUNT];
    sqlite3_stmt *summary_stmt; /* store_run_summary_step's, prepared on first use */
    char err[512];
    int errcode;
    int in_txn;
    uint32_t nruns, capruns;
    struct run_cache **runs;
    int64_t wal_frames; /* frames in the WAL after the last commit (wal hook) */
    int64_t page_size;
    int autockpt; /* checkpoint at 1000 frames as SQLite would (default on) */
    /* scratch for rollups, grown on demand (aggcap cells): the block being
     * pooled, a row of the level below decoded, and the coded row */
    struct rollup_cell *agg, *aggsrc;
    unsigned char *aggrow;
    size_t aggcap;
    /* the codec of blocks, and the frames of one block (FBLOCK_STEPS x n) */
    struct fblock_codec *codec;
    struct fblock_rows *rows; /* sealed blocks' rows (fblock_rows.h) */
    float *blockvals;
    size_t blockcap;
    int lossy_bits; /* store_set_lossy_bits: 0 exact, else the mantissa bits kept */
};

/* ---- errors: each sets st->err and st->errcode and returns -1 */
__attribute__((format(printf, 3, 4))) int store_set_err(struct store *st, int code, const char *fmt, ...);
/* SQLite's error of the last call on st->db, prefixed with what */
int store_db_err(struct store *st, const char *what);
/* An fblock_rows result (fblock_rows.h) as the store's error: 0 for a
 * success, else -1 with the error set (metric_id and block name the block
 * when known, -1 otherwise). */
int store_rows_err(struct store *st, int64_t rc, int64_t metric_id, int64_t block, const char *what);

/* ---- running SQL */
/* Runs the statements of sql (no rows expected): 0, or -1 with the error set. */
int store_exec(struct store *st, const char *sql);
/* Runs s (bound by the caller) to completion; returns the rows it changed,
 * -1 on error. */
int64_t store_run_changes(struct store *st, sqlite3_stmt *s, const char *what);

/* Runs s (bound by the caller) to completion and resets it: 0, or -1 with
 * the error set (what names the operation). */
int store_step_done(struct store *st, sqlite3_stmt *s, const char *what);

/* ---- the run cache (store.c) */
/* Finds or loads the cache of run id: NULL with the error set when there
 * is no such run (STORE_ENORUN) or the database fails. */
struct run_cache *store_run_get(struct store *st, int64_t id);
/* Drops run id's cache (it is loaded again when next needed). */
void store_run_forget(struct store *st, int64_t id);
/* Writes the run's bookkeeping columns (last_seq, last_step, updated). */
int store_run_save(struct store *st, struct run_cache *r);

/* ---- rollups (store.c: the rollup migration recodes rows with it, and
 * store_step.c writes the blocks it seals) */
/* Writes a rollup row of metric_id at level and block from n pooled cells
 * (chunk rows and the total's row); poisoned marks its crc as damaged
 * input. 0, or -1 with the error set. */
int store_rollup_put(struct store *st, int64_t metric_id, const struct rollup_cell *a, uint32_t n, int level,
                     int64_t block, int64_t nframes, int poisoned);

#endif
