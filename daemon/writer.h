/* writer.h: the writer thread — the only code that writes the database.
 *
 * The ingest loop hands it parsed, validated messages through a bounded
 * queue (writer_submit). The writer applies them in order inside one
 * transaction, each but steps under a savepoint (a step that fails for a
 * reason of its own has the batch applied again with every item under its
 * savepoint, so that it is undone alone), and commits when the queue runs dry,
 * after WRITER_MAX_BATCH items, or at the latest WRITER_COMMIT_MS after the
 * transaction began. Group commit: a transaction of fewer than
 * WRITER_LINGER_ITEMS steps and events whose queue ran dry stays open until
 * WRITER_LINGER_MS after it began (or the least linger_ms of its items, if
 * less: no item's client said it waits for acks), for the next steps of
 * trainers that log a step every few ms: a commit's fixed cost (every page it dirtied, 16 KiB
 * each, written to the WAL and again by the checkpoint) is then shared by
 * several steps instead of paid by each. A batch holding a hello, an end, a
 * stale mark or a delete commits at once. Only after a commit does it post replies (welcome, ack,
 * error) back to the ingest loop, which owns the sockets.
 *
 * When the database fails for a reason that may pass (disk full, I/O error,
 * busy, out of memory), the writer rolls back, keeps the whole batch, and
 * retries with backoff: nothing is acked meanwhile, the queue fills and the
 * ingest loop stops reading (back-pressure). Nothing accepted is dropped.
 *
 * Long work goes in chunks, each its own transaction of about WRITER_JOB_MS,
 * with at most one chunk between two batches; a chunk is done in pieces of
 * about WRITER_JOB_PIECE_MS and ends early, after a piece, once a trainer's
 * item waits, so that no ack waits behind much more than one piece:
 * - a rollback (a step <= the run's last step) is a rewind (store.h): the
 *   step and every later item of its run wait (with any hello) until the
 *   rewind is done, then go through in order; other runs go on meanwhile;
 * - a DELETE removes the run at once and purges its rows afterwards;
 * - with a raw retention (writer_config), raw frames past it are deleted.
 *
 * WAL policy (SQLite's autocheckpoint is off): a checkpointer thread with
 * its own connection runs a PASSIVE checkpoint (copy into the database and
 * sync, never blocking the writer) whenever commits have added
 * WRITER_WAL_PASSIVE bytes to the WAL since the last one (not at every
 * commit past that size: at a training loop's pace that was a checkpoint
 * and an fdatasync per commit), and after it a RESTART (waiting at most
 * 20 ms for readers of the old log, 250 ms past 3x) once it holds
 * WRITER_WAL_RESTART, so that the writer's next commit starts the log over;
 * journal_size_limit cuts the file back to STORE_WAL_LIMIT then. Should the
 * WAL still reach WRITER_WAL_HARD (the checkpointer starved of CPU or disk,
 * or readers holding the old log), the writer runs the RESTART itself
 * (waiting up to 250 ms) before its next batch: back-pressure, so the WAL
 * stays under WRITER_WAL_HARD plus one batch (64 MiB is the documented
 * bound). Readers keep their transactions short (query.h), so a restart
 * seldom waits; one that did not succeed is tried again every
 * WRITER_CK_RETRY_MS, as background work waits for it. (The WAL's bounds
 * are the writer's inside: writer_int.h.) */
#ifndef WRITER_H
#define WRITER_H

#include <stdint.h>

#include "proto.h"
#include "store.h"

struct strbuf;

#define WRITER_COMMIT_MS 100
#define WRITER_LINGER_MS 40    /* group commit: what an ack may wait for later steps */
#define WRITER_LINGER_ITEMS 64 /* a batch this large commits without waiting */
#define WRITER_MAX_BATCH 4096
#define WRITER_JOB_MS 10
#define WRITER_JOB_PIECE_MS 2 /* a chunk's pieces: a waiting item ends the chunk after one */
/* units (about a 12 x 12 frame's bytes each, store_purge.c) a piece may
 * take on: 1 << 16 let one piece of a 32 x 32 run's blocks or frames write
 * 150-260 MiB to the WAL */
#define WRITER_JOB_BUDGET_MAX (INT64_C(1) << 12)
#define WRITER_RETAIN_PASS_MS 10000

enum writer_kind {
    WRITER_HELLO,  /* msg is the hello; replies WELCOME (or ERROR) to conn;
                       the writer fills run_id once the run is open */
    WRITER_STEP,   /* run_id, seq, msg */
    WRITER_EVENT,  /* run_id, seq, msg */
    WRITER_END,    /* run_id, seq, msg.status */
    WRITER_STALE,  /* run_id: its connection closed without end */
    WRITER_DELETE, /* run_id: delete the run and its data (HTTP DELETE). No reply;
                     * conn is a ticket of the submitter's choosing, seen again by
                     * the commit hook. A run already gone is not an error. */
};

/* One unit of work. Allocated by the submitter, owned by the writer from
 * writer_submit() on, freed by it after commit. */
struct writer_item {
    int kind;      /* enum writer_kind */
    uint64_t conn; /* ingest's connection id, for replies */
    int64_t run_id;
    int64_t seq;
    double time;       /* message time (daemon clock when the line had none) */
    int64_t linger_ms; /* steps, events: the ack_delay_ms of its connection's hello
                              * (0: commit without lingering) */
    size_t bytes;      /* approximate memory held, for the queue bound */
    int applied;       /* set by the writer: 1 if stored, 0 if rejected (the
                                commit hook sees rejected items too: skip them) */
    struct proto_msg msg;
    struct writer_item *next;
};

enum writer_reply_kind { WRITER_R_WELCOME, WRITER_R_ACK, WRITER_R_ERROR, WRITER_R_LINE };

/* A reply for the ingest loop. For ACK and LINE, conn is 0 and the reply
 * goes to whichever connection owns run_id. LINE carries a whole protocol
 * line in payload (an alert), which the taker frees. */
struct writer_reply {
    int kind;
    uint64_t conn;
    int64_t run_id;
    int64_t seq;                    /* WELCOME: last_seq; ACK: acked seq; ERROR: the line's seq or 0 */
    int64_t layers, heads, seq_len; /* WELCOME */
    int code;                       /* ERROR: enum proto_err */
    char message[240];
    char *payload; /* LINE: malloc'd, no newline */
    struct writer_reply *next;
};

/* Called in the writer thread after each successful commit, with the
 * committed items in order (valid only during the call); items whose
 * `applied` is 0 were rejected and are not in the database. For the live
 * stream, alerts and metrics; it must not block for long. */
typedef void writer_commit_fn(void *ctx, const struct writer_item *items, double commit_ms);

/* Called in the writer thread, outside any transaction, about once a
 * second (for time-based alert rules). */
typedef void writer_tick_fn(void *ctx, double now);

/* Called in the writer thread inside a batch's transaction, just before
 * its commit (again for each retry of the batch), and once more in a
 * transaction of its own when the writer stops: what it writes commits
 * with the batch (the alerter's verdicts, which then cost no transaction
 * of their own). Returns 0, or -1 when a write failed: a failure that may
 * pass (disk full, busy...) has the batch retried; any other was the
 * statement's alone, and the batch commits. */
typedef int writer_precommit_fn(void *ctx);

struct writer_config {
    size_t max_bytes; /* queue bound (default 256 MiB) */
    /* --retain-raw: raw frames (sealed blocks) of a run are kept for its
     * last retain_steps steps, or (retain_steps 0) for the steps of the
     * last retain_s seconds; older ones are deleted by a background job
     * that passes over every metric every WRITER_RETAIN_PASS_MS, rollups
     * kept (store_retain_raw). Both 0: every frame is kept. */
    int64_t retain_steps;
    double retain_s;
    writer_commit_fn *on_commit; /* may be NULL */
    writer_tick_fn *on_tick;     /* may be NULL */
    void *ctx;
};

struct writer;

/* Starts the writer thread on st (which it uses exclusively until
 * writer_destroy). notify_fd is an eventfd the writer signals when replies
 * are ready or queue space frees up. Returns NULL with a message on failure. */
struct writer *writer_create(struct store *st, int notify_fd, const struct writer_config *cfg, char *err,
                             size_t errlen);

/* Stops the thread after committing everything submitted, then frees.
 * Accepts NULL. Replies not taken are freed. */
void writer_destroy(struct writer *w);

/* Queues an item (never blocks). Returns 0, or -1 if the queue is over its
 * bound: the caller keeps the item and should stop reading input until
 * writer_full() turns false. HELLO, END, STALE and DELETE items are always taken. */
int writer_submit(struct writer *w, struct writer_item *it);

/* As writer_submit, but the writer thread is not woken: the submitter
 * calls writer_wake once after a run of submits (the lines of one read, or
 * of one round of the ingest loop, cost the writer one wake-up instead of
 * one each). Until then the items wait, unless the writer wakes for
 * another reason. */
int writer_submit_quiet(struct writer *w, struct writer_item *it);
void writer_wake(struct writer *w);

/* Sets the precommit hook (NULL: none); any thread, before trainers
 * connect (the alerter sets itself in alerter_set_writer). */
void writer_set_precommit(struct writer *w, writer_precommit_fn *fn, void *ctx);

/* 1 if the queue is at its bound. */
int writer_full(struct writer *w);

/* Posts a protocol line (copied; without newline) for the connection that
 * owns run_id, e.g. an alert. Safe from any thread. Returns 0 or -1. */
int writer_post_line(struct writer *w, int64_t run_id, const char *line);

/* Takes all replies posted so far (a list the caller frees: free(payload)
 * and free() per node), oldest first; NULL if none. */
struct writer_reply *writer_take_replies(struct writer *w);

/* Frees an item and its message. */
void writer_item_free(struct writer_item *it);

/* Counters, read without locking (approximate while running). */
struct writer_stats {
    uint64_t commits, items, values, retries, db_errors, queue_bytes;
    double commit_ms_total, commit_ms_max;
    uint64_t checkpoints, checkpoints_busy; /* busy: readers kept a RESTART from finishing */
    uint64_t checkpoints_writer;            /* run by the writer itself at WRITER_WAL_HARD */
    uint64_t wal_peak_bytes;                /* largest WAL file seen after a checkpoint */
    uint64_t job_chunks;                    /* rewind, purge and retention chunks committed */
    double job_ms_max;
    int failing;            /* 1 while the database refuses writes */
    int wal_lost;           /* 1 once the WAL was found lost (store_wal_check): for good */
    char wal_lost_why[512]; /* what was found, when wal_lost */
};
void writer_get_stats(struct writer *w, struct writer_stats *out);

/* Appends the writer's figures to b as Prometheus text: commits, items,
 * values, retries, database errors, the queue, db_failing, the WAL's peak
 * and checkpoints, background work. Safe from any thread. */
void writer_metrics(struct writer *w, struct strbuf *b);

#endif
