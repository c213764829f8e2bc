/* writer.c: the writer thread: its queue, the batches it applies and
 * commits (retried while the database refuses them), the replies it
 * posts after a commit, the items held back behind a rollback and the
 * background work done in chunks between batches. The contract is
 * writer.h. Not here: the checkpointer and the WAL watch (writer_wal.c). */
#include "writer_int.h"
#include "strbuf.h"
#include "now.h"
#include "ratelog.h"

#include <errno.h>
#include <stdatomic.h>
#include <malloc.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* At shutdown, how long a batch the database refuses is retried before it,
 * and every batch after it, is given up unacked (commit_batch). */
#define WRITER_STOP_GRACE_MS 2000.0

static void notify(struct writer *w) {
    uint64_t one = 1;
    ssize_t r;
    do r = write(w->notify_fd, &one, sizeof one);
    while (r < 0 && errno == EINTR);
}

void writer_item_free(struct writer_item *it) {
    if (!it) return;
    proto_msg_free(&it->msg);
    free(it);
}

/* Replies produced while applying a batch; posted only after its commit. */
struct replies {
    struct writer_reply *head, *tail;
    uint64_t values; /* of the applied steps: counted at commit, as they may be applied again */
};

static void replies_clear(struct replies *r) {
    while (r->head) {
        struct writer_reply *n = r->head->next;
        free(r->head->payload);
        free(r->head);
        r->head = n;
    }
    r->tail = NULL;
    r->values = 0;
}

static struct writer_reply *reply_add(struct replies *r, int kind, uint64_t conn, int64_t run_id, int64_t seq) {
    struct writer_reply *rp = calloc(1, sizeof *rp);
    if (!rp) return NULL; /* a lost reply: the trainer learns on its next ack */
    rp->kind = kind;
    rp->conn = conn;
    rp->run_id = run_id;
    rp->seq = seq;
    if (r->tail) r->tail->next = rp;
    else r->head = rp;
    r->tail = rp;
    return rp;
}

static void reply_error(struct replies *r, uint64_t conn, int64_t seq, int code, const char *fmt, const char *arg) {
    struct writer_reply *rp = reply_add(r, WRITER_R_ERROR, conn, 0, seq);
    if (!rp) return;
    rp->code = code;
    snprintf(rp->message, sizeof rp->message, fmt, arg);
}

static int retryable(int code) {
    switch (code) {
    case SQLITE_FULL:
    case SQLITE_IOERR:
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_NOMEM:
    case SQLITE_CANTOPEN:
    case SQLITE_READONLY:
    case SQLITE_PROTOCOL: return 1;
    }
    return 0;
}

/* APPLY_GUARD: an unguarded step failed for a reason of its own; the
 * batch must be applied again under savepoints (writer.guarded). */
enum { APPLY_OK = 0, APPLY_RETRY = -1, APPLY_GUARD = -2 };

/* Applies one item, under a savepoint unless it is a step and the batch is
 * not guarded. An error of the item's own is undone alone and answered (an
 * unguarded step's asks for the guarded replay); an error that may pass
 * fails the whole transaction. */
static int apply(struct writer *w, struct writer_item *it, struct replies *rep) {
    struct store *st = w->st;
    char conflict[PROTO_MAX_NAME + 1];
    int r = 0;
    int guard = w->guarded || it->kind != WRITER_STEP;
    it->applied = 0;
    if (!store_in_transaction(st)) return APPLY_RETRY; /* rolled back under us: retry the whole batch */
    if (guard && store_savepoint(st)) return retryable(store_errcode(st)) ? APPLY_RETRY : (store_rollback_to(st), 0);
    switch (it->kind) {
    case WRITER_HELLO: {
        struct store_run_info info;
        const struct proto_msg *m = &it->msg;
        r = store_run_open(st, m->run, m->layers, m->heads, m->seq_len, m->meta, it->time, &info);
        if (r == 0) {
            it->run_id = info.id; /* for the commit hook's readers */
            struct writer_reply *rp = reply_add(rep, WRITER_R_WELCOME, it->conn, info.id, info.last_seq);
            /* without its welcome the connection would wait for ever (ingest
             * reads nothing more from it): out of memory is retried like a
             * database error */
            if (!rp) return APPLY_RETRY;
            rp->layers = info.layers;
            rp->heads = info.heads;
            rp->seq_len = info.seq_len;
        } else if (store_errcode(st) == STORE_ESHAPE) {
            store_rollback_to(st);
            reply_error(rep, it->conn, 0, PROTO_E_SHAPE_MISMATCH, "%s", store_errmsg(st));
            return APPLY_OK; /* not applied */
        }
        break;
    }
    case WRITER_STEP:
        r = store_step(st, it->run_id, it->seq, &it->msg, it->time, conflict, sizeof conflict);
        if (r == 1) {
            reply_error(rep, it->conn, it->seq, PROTO_E_KIND_CONFLICT,
                        "metric %s already has another kind (or shape) in this run; it was not stored", conflict);
            r = 0;
        }
        if (r == 0) rep->values += it->msg.nvalues;
        if (r == 0) r = store_run_summary_step(st, it->run_id, &it->msg); /* the runs list's summary */
        break;
    case WRITER_EVENT:
        r = store_event(st, it->run_id, it->seq, it->time, it->msg.level, it->msg.text ? it->msg.text : "");
        break;
    case WRITER_END: r = store_run_status(st, it->run_id, it->msg.status, it->seq, it->time); break;
    case WRITER_STALE: r = store_run_status(st, it->run_id, PROTO_STALE, 0, it->time); break;
    case WRITER_DELETE:
        /* h_delete saw the run not live, but a trainer's hello may have
         * been committed since: the check that counts is this one, in the
         * transaction that deletes */
        if (store_run_is_live(st, it->run_id) == 1) {
            store_rollback_to(st);
            return APPLY_OK; /* not applied: h_delete answers 409 */
        }
        r = store_run_delete(st, it->run_id);
        if (r && store_errcode(st) == STORE_ENORUN) r = 0; /* already gone: nothing to undo */
        break;
    }
    if (r == 0) {
        if (!guard || store_release(st) == 0) {
            it->applied = 1;
            return APPLY_OK;
        }
    }
    int code = store_errcode(st);
    if (!guard && !retryable(code)) return APPLY_GUARD; /* counted when the guarded replay meets it */
    pthread_mutex_lock(&w->mu);
    w->stats.db_errors++;
    pthread_mutex_unlock(&w->mu);
    if (retryable(code)) return APPLY_RETRY;
    store_rollback_to(st);
    reply_error(rep, it->conn, it->seq, PROTO_E_INTERNAL, "database error: %s", store_errmsg(st));
    fprintf(stderr, "entropyd: writer: message rejected: %s\n", store_errmsg(st));
    return APPLY_OK;
}

/* After a commit: acks (one per run, the highest seq), the commit hook,
 * then the replies go to the ingest loop and the items are freed. */
static void finish_batch(struct writer *w, struct writer_item *batch, struct replies *rep, double commit_ms) {
    for (struct writer_item *it = batch; it; it = it->next) {
        if (it->seq <= 0 || it->kind == WRITER_HELLO || it->kind == WRITER_STALE || it->kind == WRITER_DELETE) continue;
        struct writer_reply *a = NULL;
        for (struct writer_reply *r = rep->head; r; r = r->next)
            if (r->kind == WRITER_R_ACK && r->run_id == it->run_id) {
                a = r;
                break;
            }
        if (!a) a = reply_add(rep, WRITER_R_ACK, 0, it->run_id, it->seq);
        if (a && it->seq > a->seq) a->seq = it->seq;
    }
    if (w->cfg.on_commit) w->cfg.on_commit(w->cfg.ctx, batch, commit_ms);
    size_t freed = 0;
    uint64_t n = 0;
    while (batch) {
        struct writer_item *next = batch->next;
        freed += batch->bytes;
        n++;
        writer_item_free(batch);
        batch = next;
    }
    pthread_mutex_lock(&w->mu);
    w->stats.items += n;
    w->stats.values += rep->values;
    rep->values = 0;
    if (rep->head) {
        if (w->rtail) w->rtail->next = rep->head;
        else w->rhead = rep->head;
        w->rtail = rep->tail;
    }
    w->bytes -= freed;
    pthread_mutex_unlock(&w->mu);
    rep->head = rep->tail = NULL;
    notify(w);
}

/* How applying a batch went: BATCH_RETRY, the database failed (retried
 * with backoff); BATCH_GUARD, an unguarded step failed for a reason of its
 * own (applied again at once, guarded). */
enum { BATCH_OK = 0, BATCH_RETRY = 1, BATCH_GUARD = 2 };

static int batch_status(int applied) {
    return applied == APPLY_GUARD ? BATCH_GUARD : applied == APPLY_RETRY ? BATCH_RETRY : BATCH_OK;
}

/* Applies batch again in a new transaction, its replies started over. */
static int batch_apply(struct writer *w, struct writer_item *batch, struct replies *rep) {
    replies_clear(rep);
    if (store_begin(w->st)) return BATCH_RETRY;
    for (struct writer_item *it = batch; it; it = it->next) {
        int r = batch_status(apply(w, it, rep));
        if (r != BATCH_OK) return r;
    }
    return BATCH_OK;
}

/* The precommit hook (writer.h) in the open transaction: 1 when it failed
 * for a reason that may pass (the batch is retried). */
static int run_precommit(struct writer *w) {
    pthread_mutex_lock(&w->mu);
    writer_precommit_fn *fn = w->precommit;
    void *ctx = w->precommit_ctx;
    pthread_mutex_unlock(&w->mu);
    return fn && fn(ctx) && retryable(store_errcode(w->st));
}

/* The pause between two attempts at a batch the database refused: ms, or
 * less once the writer is asked to stop (writer_destroy signals cv): then
 * only what is left of WRITER_STOP_GRACE_MS, so a refusing database cannot
 * hold shutdown behind a sleep of up to 2 s begun before the stop. */
#ifndef WRITER_BACKOFF_HOOK /* tests/test_writer.c stands in: it acts between two attempts, on this thread */
#define WRITER_BACKOFF_HOOK(ms) (ms)
#endif
static void backoff_wait(struct writer *w, double ms) {
    double until = now_mono_ms() + WRITER_BACKOFF_HOOK(ms);
    pthread_mutex_lock(&w->mu);
    for (;;) {
        double grace_end = w->stop_ms + WRITER_STOP_GRACE_MS;
        double end = w->stop && grace_end < until ? grace_end : until;
        double left = end - now_mono_ms();
        if (left <= 0) break;
        writer_cond_wait_ms(&w->cv, &w->mu, left);
    }
    pthread_mutex_unlock(&w->mu);
}

/* Commits the open transaction holding batch. When the commit (or, with
 * failed BATCH_RETRY, an earlier write) failed, rolls back and re-applies the
 * whole batch with backoff until the database takes it; with BATCH_GUARD, at
 * once and guarded. Only when the daemon is stopping and the database still
 * refuses is the batch dropped unacked: the trainers resend it to the next
 * daemon from their last ack. */
static void commit_batch(struct writer *w, struct writer_item *batch, struct replies *rep, int failed) {
    double backoff = 50;
    int attempt = 0;
    for (;;) {
        if (failed == BATCH_GUARD) {
            store_rollback(w->st);
            w->guarded = 1;
            failed = batch_apply(w, batch, rep);
            continue;
        }
        if (!failed && run_precommit(w)) failed = BATCH_RETRY;
        if (!failed) writer_wal_watch(w, 1);
        if (!failed && atomic_load(&w->wal_lost)) failed = BATCH_RETRY;
        if (!failed) {
            double t0 = now_mono_ms();
            if (store_commit(w->st) == 0) {
                double ms = now_mono_ms() - t0;
                pthread_mutex_lock(&w->mu);
                w->stats.commits++;
                w->stats.commit_ms_total += ms;
                if (ms > w->stats.commit_ms_max) w->stats.commit_ms_max = ms;
                w->stats.failing = 0;
                pthread_mutex_unlock(&w->mu);
                if (attempt) fprintf(stderr, "entropyd: writer: database writable again after %d retries\n", attempt);
                w->guarded = 0;
                finish_batch(w, batch, rep, ms);
                return;
            }
        }
        if (attempt == 0 && !w->abandoning)
            ratelog(&w->write_log, "writer: write failed: %s (holding the batch, retrying)",
                    atomic_load(&w->wal_lost) ? w->wal_lost_why : store_errmsg(w->st));
        store_rollback(w->st);
        pthread_mutex_lock(&w->mu);
        w->stats.failing = 1;
        w->stats.retries++;
        int stopping = w->stop;
        double stop_ms = w->stop_ms;
        pthread_mutex_unlock(&w->mu);
        /* Stopping with a database that refuses (a full disk): the drain
         * already waited, so after WRITER_STOP_GRACE_MS of retries this batch,
         * and each one after it at its first failure, is given up unacked;
         * its trainers still hold it and send it again to the next daemon.
         * (20 retries with backoff per batch kept a daemon with 2,300 steps
         * queued running for minutes after SIGTERM.) */
        if (stopping && (w->abandoning || attempt >= 20 || now_mono_ms() - stop_ms >= WRITER_STOP_GRACE_MS)) {
            if (!w->abandoning)
                snprintf(w->abandon_why, sizeof w->abandon_why, "%s",
                         atomic_load(&w->wal_lost) ? "the WAL was lost" : store_errmsg(w->st));
            w->abandoning = 1;
            replies_clear(rep);
            size_t freed = 0;
            while (batch) {
                struct writer_item *n = batch->next;
                freed += batch->bytes;
                w->abandoned_steps += batch->kind == WRITER_STEP;
                writer_item_free(batch);
                batch = n;
            }
            pthread_mutex_lock(&w->mu);
            w->bytes -= freed;
            pthread_mutex_unlock(&w->mu);
            w->guarded = 0;
            return;
        }
        backoff_wait(w, backoff);
        if (backoff < 2000) backoff *= 2;
        attempt++;
        failed = batch_apply(w, batch, rep);
    }
}

/* ---- deferral behind a rollback, and chunked jobs ----------------------- */

static int run_blocked(const struct writer *w, int64_t run_id) {
    for (size_t i = 0; i < w->nblocked; i++)
        if (w->blocked[i] == run_id) return 1;
    return 0;
}

/* 1 if it must wait behind a rewind: added to the deferred list. Runs in
 * the batch's transaction (store_needs_rewind reads its state); -1 if that
 * read failed for a reason that may pass (SQLite may have rolled the
 * transaction back: the batch must be retried), 0 otherwise. */
static int defer(struct writer *w, struct writer_item *it) {
    int hold;
    if (w->dhead && it->kind == WRITER_HELLO) hold = 1;
    else if (it->kind == WRITER_HELLO || it->run_id <= 0) hold = 0;
    else if (w->dhead && run_blocked(w, it->run_id)) hold = 1;
    else if (it->kind != WRITER_STEP) hold = 0;
    else if ((hold = store_needs_rewind(w->st, it->run_id, it->msg.step)) < 0)
        return retryable(store_errcode(w->st)) ? -1 : 0; /* else apply() answers the error */
    if (!hold) return 0;
    if (it->kind != WRITER_HELLO && !run_blocked(w, it->run_id)) {
        if (w->nblocked == w->capblocked) {
            size_t cap = w->capblocked ? w->capblocked * 2 : 8;
            int64_t *b = realloc(w->blocked, cap * sizeof *b);
            if (!b) return 0; /* then the step is applied at once, its rewind whole */
            w->blocked = b;
            w->capblocked = cap;
        }
        w->blocked[w->nblocked++] = it->run_id;
    }
    it->next = NULL;
    if (w->dtail) w->dtail->next = it;
    else w->dhead = it;
    w->dtail = it;
    return 1;
}

/* Puts every deferred item back at the head of the queue, in order: each
 * is looked at again (another run's rollback is deferred again). */
static void release_deferred(struct writer *w) {
    pthread_mutex_lock(&w->mu);
    w->dtail->next = w->head;
    if (!w->head) w->tail = w->dtail;
    w->head = w->dhead;
    pthread_mutex_unlock(&w->mu);
    w->dhead = w->dtail = NULL;
    w->nblocked = 0;
}

/* Raw retention is on (writer_config), and its pass is under way or due. */
static int retain_on(const struct writer *w) { return w->cfg.retain_steps > 0 || w->cfg.retain_s > 0; }

static int retain_due(const struct writer *w) {
    return retain_on(w) && (w->retain_cursor > 0 || now_mono_ms() >= w->retain_next);
}

/* Background work yields to the checkpointer: none while the WAL is past
 * WRITER_WAL_RESTART and not restarted since, so that a big delete or
 * rollback goes at the pace the disk checkpoints instead of making the
 * writer wait at WRITER_WAL_HARD (trainers' acks would wait with it).
 * Called with mu held or from the writer thread. */
static int jobs_pending(const struct writer *w) {
    if (!w->dhead && !w->purge_pending && !retain_due(w)) return 0;
    if (w->ckstarted && w->wal_used >= WRITER_WAL_RESTART && !w->wal_reset_ok) return 0;
    return now_mono_ms() >= w->job_backoff_until;
}

static int jobs_ready(struct writer *w) {
    pthread_mutex_lock(&w->mu);
    int r = jobs_pending(w);
    pthread_mutex_unlock(&w->mu);
    return r;
}

/* 1 when items wait in the queue: a chunk stops between two pieces. */
static int queue_waiting(struct writer *w) {
    pthread_mutex_lock(&w->mu);
    int r = w->head != NULL;
    pthread_mutex_unlock(&w->mu);
    return r;
}

/* One piece of background work of w->job_budget rows, in the open
 * transaction: the rewind the first deferred item waits for, else a purge
 * of deleted runs, else raw retention (*retain set, its place in *cursor).
 * Returns 1 while more is left, 0 once done, -1 on failure. */
static int job_piece(struct writer *w, int *retain, int64_t *cursor) {
    struct store *st = w->st;
    double t0 = now_mono_ms();
    int r;
    *retain = 0;
    if (w->dhead) r = store_rewind(st, w->dhead->run_id, w->dhead->msg.step, w->dhead->time, w->job_budget);
    else if (w->purge_pending) r = store_purge(st, w->job_budget);
    else {
        *retain = 1;
        r = store_retain_raw(st, w->cfg.retain_steps, w->cfg.retain_s, now_wall(), cursor, w->job_budget);
    }
    double ms = now_mono_ms() - t0;
    /* Only a piece that used its whole budget (r == 1) says the budget is
     * small: one that ran out of work early (the end of a table, a pass
     * with little to do) was quick for want of rows, and doubling on it
     * let the budget climb to a million rows, whose next piece (a run's
     * blocks) then held the writer for 1.2 s. */
    if (r == 1 && ms < WRITER_JOB_PIECE_MS / 2 && w->job_budget < WRITER_JOB_BUDGET_MAX) w->job_budget *= 2;
    else if (ms > WRITER_JOB_PIECE_MS) {
        /* back to a budget that would have taken WRITER_JOB_PIECE_MS, at
         * once (a sealed block, 64 frames, moves whole: no less than that) */
        int64_t b = (int64_t)((double)w->job_budget * WRITER_JOB_PIECE_MS / ms);
        w->job_budget = b > 64 ? b : 64;
    }
    return r;
}

/* One chunk of background work in its own transaction: pieces of about
 * WRITER_JOB_PIECE_MS until WRITER_JOB_MS have passed, the work is done,
 * or a trainer's item waits (so that no ack waits behind more than one
 * piece). */
static void job_chunk(struct writer *w) {
    struct store *st = w->st;
    writer_wal_watch(w, 1);
    if (atomic_load(&w->wal_lost)) { /* nothing is committed any more */
        w->job_backoff_until = now_mono_ms() + 1000;
        return;
    }
    double t0 = now_mono_ms();
    int r, retain = 0;
    int64_t cursor = w->retain_cursor;
    if (store_begin(st)) goto fail;
    do r = job_piece(w, &retain, &cursor);
    while (r == 1 && now_mono_ms() - t0 < WRITER_JOB_MS && !queue_waiting(w));
    if (r < 0 || store_commit(st)) goto fail;
    if (retain) {
        /* only once committed: a failed chunk is redone; a pass that
         * reached the last metric waits for the next */
        w->retain_cursor = cursor;
        if (!r) w->retain_next = now_mono_ms() + WRITER_RETAIN_PASS_MS;
    }
    double ms = now_mono_ms() - t0;
    pthread_mutex_lock(&w->mu);
    w->stats.job_chunks++;
    if (ms > w->stats.job_ms_max) w->stats.job_ms_max = ms;
    pthread_mutex_unlock(&w->mu);
    if (r == 0 && !retain) {
        if (w->dhead) release_deferred(w);
        else {
            /* the purge read the deleted run's pages back into the cache:
             * give them, and the heap they were freed into, back */
            w->purge_pending = 0;
            store_release_memory(st);
            malloc_trim(0);
        }
    }
    writer_checkpoint_policy(w);
    return;
fail:
    ratelog(&w->job_log, "writer: background chunk failed: %s (retrying)", store_errmsg(st));
    store_rollback(st);
    pthread_mutex_lock(&w->mu);
    w->stats.db_errors++;
    pthread_mutex_unlock(&w->mu);
    w->job_backoff_until = now_mono_ms() + 200;
}

/* Whether the open transaction, whose queue ran dry, may stay open for
 * more steps (writer.h, WRITER_LINGER_MS): only a few steps and events in
 * it, each from a client that does not wait for its ack (linger is the
 * least ack_delay_ms of the batch; an item someone waits on, a hello, an
 * end or a delete, commits at once), and not while stopping. */
static int may_linger(const struct writer *w, size_t nbatch, int urgent, double linger, double txn_start) {
    return !urgent && !w->stop && nbatch < WRITER_LINGER_ITEMS && now_mono_ms() - txn_start < linger;
}

static void *writer_main(void *arg) {
    struct writer *w = arg;
    struct writer_item *batch = NULL, *btail = NULL;
    struct replies rep = {0};
    size_t nbatch = 0;
    double txn_start = 0, last_tick = 0;
    int in_txn = 0, failed = 0, urgent = 0;
    double linger = WRITER_LINGER_MS;
    for (;;) {
        pthread_mutex_lock(&w->mu);
        if (in_txn && !w->head && may_linger(w, nbatch, urgent, linger, txn_start))
            writer_cond_wait_ms(&w->cv, &w->mu, txn_start + linger - now_mono_ms());
        while (!w->head && !w->stop && !in_txn && !jobs_pending(w)) {
            if (!w->cfg.on_tick && !w->dhead && !w->purge_pending && !retain_on(w)) {
                pthread_cond_wait(&w->cv, &w->mu);
                continue;
            }
            double t = now_wall();
            if (w->cfg.on_tick && t - last_tick >= 1.0) {
                pthread_mutex_unlock(&w->mu);
                w->cfg.on_tick(w->cfg.ctx, t);
                last_tick = t;
                writer_wal_watch(w, 0); /* an idle daemon notices a lost WAL too */
                pthread_mutex_lock(&w->mu);
                continue;
            }
            writer_cond_wait_ms(&w->cv, &w->mu, 200); /* also the retry of a failed background chunk */
        }
        /* at the end, deferred items are still applied (their rewinds done);
         * a purge is left for the next start */
        if (!w->head && w->stop && !in_txn && !w->dhead) {
            pthread_mutex_unlock(&w->mu);
            break;
        }
        if (!w->head && !in_txn) {
            pthread_mutex_unlock(&w->mu);
            if (jobs_ready(w)) job_chunk(w);
            else if (w->dhead) usleep(50 * 1000); /* stopping while a chunk backs off */
            double t = now_wall();
            if (w->cfg.on_tick && t - last_tick >= 1.0) {
                w->cfg.on_tick(w->cfg.ctx, t);
                last_tick = t;
            }
            continue;
        }
        struct writer_item *take = w->head, *take_tail = w->tail;
        w->head = w->tail = NULL;
        pthread_mutex_unlock(&w->mu);

        if (take && !in_txn) {
            failed = store_begin(w->st) != 0;
            in_txn = 1;
            txn_start = now_mono_ms();
        }
        while (take) {
            /* A long queue is split (writer.h: commit after WRITER_MAX_BATCH
             * items or WRITER_COMMIT_MS): the rest goes back to the head of
             * the queue for the next transaction. */
            if (nbatch >= WRITER_MAX_BATCH || (nbatch % 64 == 63 && now_mono_ms() - txn_start >= WRITER_COMMIT_MS)) {
                pthread_mutex_lock(&w->mu);
                take_tail->next = w->head;
                if (!w->head) w->tail = take_tail;
                w->head = take;
                pthread_mutex_unlock(&w->mu);
                break;
            }
            struct writer_item *it = take;
            take = take->next;
            it->next = NULL;
            int d = failed ? 0 : defer(w, it);
            if (d > 0) continue;
            if (d < 0) failed = BATCH_RETRY;
            if (it->kind == WRITER_DELETE) w->purge_pending = 1;
            urgent |= it->kind != WRITER_STEP && it->kind != WRITER_EVENT;
            if ((double)it->linger_ms < linger) linger = (double)it->linger_ms;
            if (btail) btail->next = it;
            else batch = it;
            btail = it;
            nbatch++;
            /* giving up at shutdown (commit_batch): what is left is not
             * applied only to be refused, it goes unacked at once */
            if (!failed && w->abandoning) failed = BATCH_RETRY;
            if (!failed) failed = batch_status(apply(w, it, &rep));
        }
        pthread_mutex_lock(&w->mu);
        int empty = w->head == NULL;
        pthread_mutex_unlock(&w->mu);
        if (in_txn && ((empty && !may_linger(w, nbatch, urgent, linger, txn_start)) || failed ||
                       nbatch >= WRITER_MAX_BATCH || now_mono_ms() - txn_start >= WRITER_COMMIT_MS)) {
            if (batch) commit_batch(w, batch, &rep, failed);
            else store_rollback(w->st); /* everything taken was deferred */
            batch = btail = NULL;
            nbatch = 0;
            in_txn = 0;
            failed = urgent = 0;
            linger = WRITER_LINGER_MS;
            writer_checkpoint_policy(w);
            /* between two batches, at most one chunk of background work:
             * no trainer's ack waits behind more than that */
            if (jobs_ready(w)) job_chunk(w);
            /* a busy writer still ticks */
            double t = now_wall();
            if (w->cfg.on_tick && t - last_tick >= 1.0) {
                w->cfg.on_tick(w->cfg.ctx, t);
                last_tick = t;
            }
        }
    }
    /* what the hook still holds (the alerter's last verdicts) */
    pthread_mutex_lock(&w->mu);
    int hooked = w->precommit != NULL;
    pthread_mutex_unlock(&w->mu);
    if (hooked && store_begin(w->st) == 0) {
        run_precommit(w);
        if (store_commit(w->st)) store_rollback(w->st);
    }
    replies_clear(&rep);
    return NULL;
}

struct writer *writer_create(struct store *st, int notify_fd, const struct writer_config *cfg, char *err,
                             size_t errlen) {
    struct writer *w = calloc(1, sizeof *w);
    if (!w) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    w->st = st;
    w->notify_fd = notify_fd;
    if (cfg) w->cfg = *cfg;
    if (!w->cfg.max_bytes) w->cfg.max_bytes = (size_t)256 << 20;
    w->purge_pending = 1; /* a purge left by an earlier daemon goes on */
    w->job_budget = 1024;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    pthread_cond_init(&w->ckcv, NULL);
    store_set_autocheckpoint(st, 0);
    const char *path = store_path(st);
    /* a migration (or a daemon killed mid-delete) may have left a big WAL
     * that an idle daemon would keep: cut it before taking work */
    if (path && *path && store_wal_bytes_of(path) > WRITER_WAL_RESTART && store_checkpoint(st, 2, 1000, NULL) < 0)
        fprintf(stderr, "entropyd: writer: %s\n", store_errmsg(st));
    if (path && *path) { /* an in-memory database has no WAL */
        if (!(w->ck = store_open(path, err, errlen))) {
            writer_destroy(w);
            return NULL;
        }
        int rc = pthread_create(&w->ckthread, NULL, writer_checkpointer_main, w);
        if (rc) {
            snprintf(err, errlen, "cannot start checkpointer thread: %s", strerror(rc));
            writer_destroy(w);
            return NULL;
        }
        w->ckstarted = 1;
    }
    int rc = pthread_create(&w->thread, NULL, writer_main, w);
    if (rc) {
        snprintf(err, errlen, "cannot start writer thread: %s", strerror(rc));
        writer_destroy(w);
        return NULL;
    }
    w->started = 1;
    return w;
}

void writer_destroy(struct writer *w) {
    if (!w) return;
    if (w->started) {
        pthread_mutex_lock(&w->mu);
        w->stop = 1;
        w->stop_ms = now_mono_ms();
        pthread_cond_signal(&w->cv);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->thread, NULL);
        if (w->abandoned_steps)
            fprintf(stderr,
                    "entropyd: writer: %llu step(s) stay unacked at shutdown: the database refused them (%s); "
                    "their trainers still hold them and send them again to the next daemon\n",
                    (unsigned long long)w->abandoned_steps, w->abandon_why);
    }
    if (w->ckstarted) {
        pthread_mutex_lock(&w->mu);
        w->ckstop = 1;
        pthread_cond_signal(&w->ckcv);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->ckthread, NULL);
    }
    store_close(w->ck);
    while (w->head) {
        struct writer_item *n = w->head->next;
        writer_item_free(w->head);
        w->head = n;
    }
    while (w->dhead) {
        struct writer_item *n = w->dhead->next;
        writer_item_free(w->dhead);
        w->dhead = n;
    }
    free(w->blocked);
    while (w->rhead) {
        struct writer_reply *n = w->rhead->next;
        free(w->rhead->payload);
        free(w->rhead);
        w->rhead = n;
    }
    pthread_cond_destroy(&w->cv);
    pthread_cond_destroy(&w->ckcv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

static int queue_item(struct writer *w, struct writer_item *it, int wake) {
    if (!it->bytes)
        it->bytes = sizeof *it + it->msg.nvalues * sizeof(float) + it->msg.nmetrics * sizeof(struct proto_metric);
    if (it->time == 0) it->time = it->msg.has_time ? it->msg.time : now_wall();
    pthread_mutex_lock(&w->mu);
    /* control items are tiny and must never be refused: a lost STALE or
     * HELLO would leave a run in the wrong state */
    int control =
        it->kind == WRITER_HELLO || it->kind == WRITER_STALE || it->kind == WRITER_END || it->kind == WRITER_DELETE;
    if (!control && w->bytes >= w->cfg.max_bytes) {
        pthread_mutex_unlock(&w->mu);
        return -1;
    }
    it->next = NULL;
    if (w->tail) w->tail->next = it;
    else w->head = it;
    w->tail = it;
    w->bytes += it->bytes;
    if (wake) pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return 0;
}

int writer_submit(struct writer *w, struct writer_item *it) { return queue_item(w, it, 1); }

int writer_submit_quiet(struct writer *w, struct writer_item *it) { return queue_item(w, it, 0); }

void writer_set_precommit(struct writer *w, writer_precommit_fn *fn, void *ctx) {
    pthread_mutex_lock(&w->mu);
    w->precommit = fn;
    w->precommit_ctx = ctx;
    pthread_mutex_unlock(&w->mu);
}

void writer_wake(struct writer *w) {
    pthread_mutex_lock(&w->mu);
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

int writer_full(struct writer *w) {
    pthread_mutex_lock(&w->mu);
    int full = w->bytes >= w->cfg.max_bytes;
    pthread_mutex_unlock(&w->mu);
    return full;
}

int writer_post_line(struct writer *w, int64_t run_id, const char *line) {
    struct writer_reply *rp = calloc(1, sizeof *rp);
    if (!rp || !(rp->payload = strdup(line))) {
        free(rp);
        return -1;
    }
    rp->kind = WRITER_R_LINE;
    rp->run_id = run_id;
    pthread_mutex_lock(&w->mu);
    if (w->rtail) w->rtail->next = rp;
    else w->rhead = rp;
    w->rtail = rp;
    pthread_mutex_unlock(&w->mu);
    notify(w);
    return 0;
}

struct writer_reply *writer_take_replies(struct writer *w) {
    pthread_mutex_lock(&w->mu);
    struct writer_reply *r = w->rhead;
    w->rhead = w->rtail = NULL;
    pthread_mutex_unlock(&w->mu);
    return r;
}

void writer_get_stats(struct writer *w, struct writer_stats *out) {
    pthread_mutex_lock(&w->mu);
    *out = w->stats;
    out->queue_bytes = w->bytes;
    pthread_mutex_unlock(&w->mu);
}

void writer_metrics(struct writer *w, struct strbuf *b) {
    struct writer_stats ws;
    writer_get_stats(w, &ws);
    strbuf_prom(b, "entropyd_commits_total", "counter", "Database transactions committed.", (double)ws.commits);
    strbuf_prom(b, "entropyd_items_total", "counter", "Messages committed.", (double)ws.items);
    strbuf_prom(b, "entropyd_values_total", "counter", "Metric values ingested (committed).", (double)ws.values);
    strbuf_prom(b, "entropyd_commit_retries_total", "counter", "Batches retried after a database failure.",
                (double)ws.retries);
    strbuf_prom(b, "entropyd_db_errors_total", "counter", "Database errors met by the writer.", (double)ws.db_errors);
    strbuf_prom(b, "entropyd_wal_lost", "gauge",
                "1 once the WAL was found truncated, removed or replaced under the daemon "
                "(no more writes; docs/reliability.md).",
                ws.wal_lost);
    strbuf_prom(b, "entropyd_queue_bytes", "gauge", "Memory held by accepted, uncommitted messages.",
                (double)ws.queue_bytes);
    strbuf_prom(b, "entropyd_db_failing", "gauge", "1 while the database refuses writes.", ws.failing);
    strbuf_prom(b, "entropyd_wal_peak_bytes", "gauge", "Largest WAL file seen after a checkpoint since start.",
                (double)ws.wal_peak_bytes);
    strbuf_prom(b, "entropyd_checkpoints_total", "counter", "WAL checkpoints run by the writer.",
                (double)ws.checkpoints);
    strbuf_prom(b, "entropyd_checkpoints_busy_total", "counter", "WAL restarts that readers kept from finishing.",
                (double)ws.checkpoints_busy);
    strbuf_prom(b, "entropyd_checkpoints_writer_total", "counter",
                "WAL restarts the writer ran itself because the WAL reached its hard limit (back-pressure).",
                (double)ws.checkpoints_writer);
    strbuf_prom(b, "entropyd_background_chunks_total", "counter", "Chunks of rollback and delete work committed.",
                (double)ws.job_chunks);
    strbuf_prom(b, "entropyd_background_chunk_max_seconds", "gauge", "Longest chunk of rollback or delete work.",
                ws.job_ms_max / 1e3);
}
