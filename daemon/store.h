/* store.h: the SQLite database of entropyd — the write side.
 *
 * One `struct store` owns one SQLite connection. The writer thread owns the
 * only writing store; readers (HTTP) open their own read-only connections
 * (see query.h). The schema and blob formats are in schema/ (storage.md).
 *
 * Writes happen inside explicit transactions: store_begin(), any number of
 * store_run_open/store_step/store_event/store_run_status calls, then
 * store_commit() or store_rollback(). A failed call leaves the transaction to
 * be rolled back by the caller; after store_rollback() every cached state is
 * dropped and reloaded from the database, so retrying the same calls in a new
 * transaction is always correct.
 *
 * Functions return 0 on success and -1 on failure with a message in the
 * store's error buffer (store_errmsg) and the SQLite result code in
 * store_errcode (SQLITE_FULL, SQLITE_BUSY, SQLITE_IOERR... ), or one of
 * the store's own codes (enum store_err). */
#ifndef STORE_H
#define STORE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <string.h>

#include "proto.h"

struct store;

/* (a rollup row's levels, cells and their coding: rollup.h) */

/* Result of store_run_open. */
struct store_run_info {
    int64_t id;
    int64_t last_seq; /* highest committed seq, 0 for a new run */
    int64_t layers, heads, seq_len;
    int created; /* 1 if the run did not exist */
};

/* Opens (creating if needed) the database at path and brings its schema up
 * to date. A new database gets 16 KiB pages (an existing one keeps its
 * own). Returns NULL with a
 * message in err on failure, including a database newer than this daemon
 * and one whose WAL was lost (marked by store_wal_mark_lost, or a WAL file
 * without a WAL header: SQLite would drop its frames silently).
 * The caller owns the result and frees it with store_close(). */
struct store *store_open(const char *path, char *err, size_t errlen);

/* Closes the connection (rolling back an open transaction). Accepts NULL. */
void store_close(struct store *st);

/* The store's own error codes in store_errcode: negative, so never one
 * of SQLite's result codes (which are positive). */
enum store_err {
    STORE_ESHAPE = -2, /* a resumed run has other layers/heads (store_run_open) */
    STORE_ENORUN = -3, /* no such run */
};

/* The message and the code of the last failure (SQLite's result code, or
 * an enum store_err). */
const char *store_errmsg(const struct store *st);
int store_errcode(const struct store *st);

/* The schema version this build knows (number of migrations). */
int store_schema_version(void);

int store_begin(struct store *st);
/* store_begin() that does not wait for a busy database (fails at once with
 * SQLITE_BUSY): for small side transactions on the writer's thread, which
 * must not hold the writer's own batches back by the busy timeout. */
int store_begin_nowait(struct store *st);
/* Commits. On failure the transaction is still open: call store_rollback(). */
int store_commit(struct store *st);
void store_rollback(struct store *st);

/* A savepoint around one message inside the transaction, so that a message
 * that fails for a reason of its own is undone alone: store_savepoint(),
 * the calls, then store_release() or store_rollback_to(). */
int store_savepoint(struct store *st);
int store_release(struct store *st);
void store_rollback_to(struct store *st);
/* 1 while the transaction store_begin() opened is still open.  SQLite rolls
 * a whole transaction back by itself on some errors (out of memory, a full
 * disk, an I/O error): after that a savepoint would open a transaction of
 * its own and its release would commit one message alone, ahead of the
 * batch that is then retried. The writer checks this before each message. */
int store_in_transaction(struct store *st);

/* Marks every run left `live` (by a daemon that died) as `stale`. Call once
 * at start, outside a transaction. Returns the number of runs changed or -1. */
int store_mark_live_stale(struct store *st, double now);

/* Creates run `name` or resumes it (status live, meta replaced when meta is
 * not NULL). A resumed run with other layers/heads fails with errcode
 * STORE_ESHAPE and a message; nothing is changed then. */
int store_run_open(struct store *st, const char *name, int64_t layers, int64_t heads, int64_t seq_len, const char *meta,
                   double now, struct store_run_info *out);

/* Stores one step message of run run_id with sequence seq. The message's
 * shape must already be validated against the run (ingest does). A metric
 * whose name the run already uses with another kind is skipped; its name is
 * written into conflict (cap bytes) and 1 is returned (the rest is stored).
 * A step <= the run's last step rewrites history (schema/protocol.md). */
int store_step(struct store *st, int64_t run_id, int64_t seq, const struct proto_msg *msg, double time, char *conflict,
               size_t cap);

/* Stores an event; seq 0 means written by the daemon itself (NULL in the db). */
int store_event(struct store *st, int64_t run_id, int64_t seq, double time, int level, const char *text);

/* Sets a run's status (enum proto_status); seq > 0 also advances last_seq. */
int store_run_status(struct store *st, int64_t run_id, int status, int64_t seq, double now);

/* Deletes a run: the run and its small rows (metrics, events, alerts,
 * branches) at once, so that it is gone for readers after this
 * transaction's commit; its bulk (frames, rollups, steps, abandoned frames)
 * is listed in the `purge` table for store_purge, so that deleting a run of
 * a million steps is not one long transaction. Returns 0, or -1 (errcode
 * STORE_ENORUN if no such run). */
int store_run_delete(struct store *st, int64_t run_id);

/* 1 when the run is live (a trainer holds it), 0 when not or when there is
 * no such run, -1 on a database error. Inside the writer's transaction
 * this is the truth, as only the writer changes a run's status. */
int store_run_is_live(struct store *st, int64_t run_id);

/* Deletes about `budget` rows (a frame's worth each) of the runs deleted
 * so far, in the caller's transaction. Returns 1 if more is left, 0 if
 * nothing is, -1 on failure. Purge ids are never reused meanwhile: new
 * metrics and branches take ids above them. */
int store_purge(struct store *st, int64_t budget);

/* Rollback of a run (a step <= its last step, schema/protocol.md) in
 * chunks: store_needs_rewind() says whether storing `step` must wait for a
 * rewind (1), not (0), or failed (-1). store_rewind() moves about `budget`
 * rows (a frame's worth each) of the run's steps >= step into a branch in
 * the caller's transaction, highest steps first, and returns 1 while more
 * is left, 0 once the run's last step is step - 1 (then store_step takes
 * the step as new), -1 on failure. A rewind in progress is kept in the
 * `rewinds` table across transactions and restarts: until it is done,
 * store_needs_rewind() is 1 for any step of the run, and it completes with
 * its own from_step (a later call's step may then need a new rewind).
 * store_step() on a run that needs one does the whole rewind itself, in
 * its transaction. */
int store_needs_rewind(struct store *st, int64_t run_id, int64_t step);
int store_rewind(struct store *st, int64_t run_id, int64_t step, double time, int64_t budget);

/* Raw retention (--retain-raw): deletes about `budget` frames' worth of
 * the sealed blocks (and raw frames of a database from before blocks) of
 * the metrics with id > *cursor whose steps all lie before their run's raw
 * window: the last keep_steps steps when keep_steps > 0, else the steps
 * whose time is at or after now - keep_s. Rollups (every level), steps
 * rows and each metric's open block stay, so series stay exact at the
 * rollups' resolution. A run being rewound is skipped. Advances *cursor
 * past every metric done; returns 1 when the budget ran out (call again),
 * 0 once the pass passed the last metric (*cursor is 0 again), -1 on
 * failure. In the caller's transaction. */
int store_retain_raw(struct store *st, int64_t keep_steps, double keep_s, double now, int64_t *cursor, int64_t budget);

/* One alert transition (see alert.h), as stored. Strings are borrowed. */
struct store_alert {
    int64_t run_id;
    const char *rule, *severity, *fingerprint;
    const char *transition; /* "firing", "update" or "resolved" */
    double time, starts_at, ends_at;
    int64_t start_step, step;
    double value;           /* NaN stores NULL */
    const char *cells_json; /* JSON array */
    const char *payload;    /* Alertmanager alert object (JSON) */
    const char *reason;     /* resolved: NULL for a recovery, "run_ended", "run_deleted" */
};

/* Records a transition: "firing" opens an alerts row for (run, rule) unless
 * one is open (then it is updated), "update" and "resolved" change the open
 * row; a "resolved" with no open row is ignored (never a resolved without a
 * firing). Adds an alert_transitions row. Sets *alert_id when not NULL. Runs
 * in the caller's transaction, or its own when there is none. */
int store_alert_transition(struct store *st, const struct store_alert *a, int64_t *alert_id);

/* Resolves every alert of the run still open (at the run's end), with
 * reason 'run_ended'. */
int store_alerts_close_run(struct store *st, int64_t run_id, double now);

/* ---- run summary and verdict (schema/005_runs.sql) ---- */

/* A run's verdict as the alert engine computed it (alert.h): verdict is
 * "healthy", "collapsing", "collapsed", "diverged", "stalled" or "sharp";
 * since_step -1 stores NULL; heads_json a JSON array of [layer, head]
 * pairs; rule NULL for none; evidence_json a JSON object (what the verdict
 * rests on beside its heads, schema/010_verdict_sharp.sql) or NULL. None
 * is copied. Runs in the caller's transaction. */
int store_run_verdict(struct store *st, int64_t run_id, const char *verdict, int64_t since_step, const char *heads_json,
                      const char *rule, const char *evidence_json);

/* Folds one stored step into the run's summary: the scalar `loss` becomes
 * last_loss (when the step has it) and the minimum of the finite
 * entropy_norm head values lowers min_entropy. Costs one row write for a
 * step that has either, nothing otherwise; never reads frames. */
int store_run_summary_step(struct store *st, int64_t run_id, const struct proto_msg *msg);

/* The lossy precision (off by default): with bits in 1..22, a block of
 * frames is rounded to that many mantissa bits (fblock_round; 7 is
 * bfloat16, about 1.2-1.3 bytes per value all-in instead of ~3.5 on a
 * real run) when it is sealed; any other bits (0, 23) stores exactly. The
 * frames of a metric's open block (its last < 64 steps), its latest values
 * and every rollup (min, max, sum, count: computed before the rounding)
 * stay exact, with one exception: a rewind into a sealed block reopens it
 * with the rounded values of its steps before the rewind's step (the exact
 * ones are gone), so that block's rollup, sealed again, is of those rounded
 * values (and they are rounded again if bits changed meanwhile: their
 * error is then at most the sum of both precisions' bounds). */
void store_set_lossy_bits(struct store *st, int bits);

/* Gives the connection's unused page cache back to the allocator (after a
 * large run ended or was deleted, its pages are dead weight). Call outside
 * a transaction. */
void store_release_memory(struct store *st);

/* Committed facts of a run for tests and callers outside a transaction:
 * last_seq (or -1 if no such run). */
int64_t store_run_last_seq(struct store *st, int64_t run_id);

/* Bytes of the database file (page_count * page_size). */
int64_t store_db_bytes(struct store *st);

/* The WAL: PRAGMA journal_size_limit is STORE_WAL_LIMIT, so the file is cut
 * back to it when it restarts. */
#define STORE_WAL_LIMIT (INT64_C(16) << 20)
#define STORE_WAL_LIMIT_STR "16777216"

/* The database file's path (owned by the store; "" for an in-memory one). */
const char *store_path(struct store *st);

/* Bytes of the WAL file of the database at db_path (0 when there is none;
 * NULL or "": -1). */
int64_t store_wal_bytes_of(const char *db_path);

/* A WAL lost under the daemon: truncated, removed or replaced
 * while SQLite still counts committed frames in it. SQLite does not notice
 * (its index of the WAL is in shared memory): the daemon went on acking,
 * a checkpoint could copy zeros into the database, and the next start
 * found a database whose integrity_check failed. The writer checks the
 * file (store_wal_check), stops taking writes and marks the database
 * (store_wal_mark_lost); store_open then refuses it until the mark is
 * removed (docs/reliability.md, "A lost WAL"). */
struct store_wal_id {
    dev_t dev;
    ino_t ino;
    int known; /* 0 until the WAL was first seen */
};

/* Checks the WAL of the database at db_path against wal_bytes, the bytes
 * of frames SQLite counts in it (store_wal_used; -1: unknown, then only the
 * header and the file's identity are checked): the file must exist while
 * frames are counted, be at least 32 + wal_bytes long, start with a WAL
 * header, and be the file seen at the first call (*id, the caller's, set
 * then). Returns 0 when it holds, 1 with the reason in why when it does
 * not, -1 when it cannot tell (stat or read failed for another reason). */
int store_wal_check(const char *db_path, int64_t wal_bytes, struct store_wal_id *id, char *why, size_t whylen);

/* Writes DB-wal-lost (db_path + "-wal-lost") holding why and the time, so
 * that store_open refuses the database until it is removed. 0, or -1 with
 * errno. */
int store_wal_mark_lost(const char *db_path, const char *why);

/* SQLite's autocheckpoint (a PASSIVE checkpoint in the committing thread
 * once the WAL holds 1000 pages) is on by default; the writer turns it off
 * and checkpoints on its own terms (writer.h). */
void store_set_autocheckpoint(struct store *st, int on);

/* Bytes of the WAL in use after the last commit (its frames; the file may
 * be longer, from before a restart). */
int64_t store_wal_used(struct store *st);

/* Checkpoints the WAL outside a transaction: PASSIVE (copies what no
 * reader needs, never waits), or with restart set RESTART (copies all,
 * then waits up to busy_ms for readers of the old WAL so the next writes
 * start at its beginning); restart 2 is a TRUNCATE (a RESTART that also
 * cuts the file to nothing: at start, after a migration wrote a big log
 * that no later commit would cut back while the daemon is idle). Sets *wal_bytes (if not NULL) to the WAL's size
 * after it. Returns 0, 1 if readers held it (SQLITE_BUSY: try later), -1
 * on failure. */
int store_checkpoint(struct store *st, int restart, int busy_ms, int64_t *wal_bytes);

/* For tests of full-disk behaviour: caps the file at max_pages pages
 * (PRAGMA max_page_count); 0 removes the cap (restores the default). */
int store_set_max_pages(struct store *st, int64_t max_pages);

#endif
