/* writer_wal.c: the writer's care of the WAL: the checkpointer thread
 * (PASSIVE copies, the RESTART that lets the log start over), the
 * writer's own checkpoint past WRITER_WAL_HARD (back-pressure), and the
 * watch that notices a WAL truncated, removed or replaced under the
 * daemon. The policy is writer.h's "WAL policy"; the calls are in
 * writer_int.h. Not here: the transactions and what goes into them
 * (writer.c), the checkpoint calls themselves (store.c). */
#include "writer_int.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "now.h"

/* The WAL was lost (why): from now on nothing is committed, so nothing
 * more is acked (the trainers keep what they sent and are told db_failing),
 * no checkpoint copies it into the database, and the database is marked so
 * that the next daemon refuses it (store.h). Either thread, once. */
static void wal_lost(struct writer *w, const char *why) {
    pthread_mutex_lock(&w->mu);
    int first = !atomic_load(&w->wal_lost);
    if (first) {
        snprintf(w->wal_lost_why, sizeof w->wal_lost_why, "%s", why);
        snprintf(w->stats.wal_lost_why, sizeof w->stats.wal_lost_why, "%s", why);
        w->stats.wal_lost = 1;
        w->stats.failing = 1;
        atomic_store(&w->wal_lost, 1);
    }
    pthread_mutex_unlock(&w->mu);
    if (!first) return;
    const char *db = store_path(w->st);
    fprintf(stderr,
            "entropyd: writer: %s: the database takes no more writes (nothing more is acknowledged; "
            "/healthz says wal_lost). Stop this daemon and run `entropyd --check` on %s; the next start refuses "
            "the database until %s-wal-lost is removed (docs/reliability.md, \"A lost WAL\")\n",
            why, db, db);
    if (store_wal_mark_lost(db, why))
        fprintf(stderr, "entropyd: writer: cannot write %s-wal-lost: %s\n", db, strerror(errno));
}

/* Writer thread: checks the WAL against the frames SQLite counts in it
 * (an open, a stat and a 4-byte read: ~5 us): before every commit, so that
 * nothing committed into a lost WAL is acked, and (idle) at most every
 * WRITER_WAL_WATCH_MS unless force. */
#define WRITER_WAL_WATCH_MS 1000.0
void writer_wal_watch(struct writer *w, int force) {
    double now = now_mono_ms();
    if (atomic_load(&w->wal_lost) || (!force && now - w->wal_check_ms < WRITER_WAL_WATCH_MS)) return;
    w->wal_check_ms = now;
    char why[400];
    if (store_wal_check(store_path(w->st), store_wal_used(w->st), &w->wal_id, why, sizeof why) == 1) wal_lost(w, why);
}

/* Whether the checkpointer has work (mu held): the WAL holds
 * WRITER_WAL_PASSIVE bytes that no checkpoint has seen (after a RESTART it
 * started over: all of it is new), or it is past WRITER_WAL_RESTART and
 * has grown since the last attempt, or no restart has succeeded yet and
 * WRITER_CK_RETRY_MS have passed (a RESTART kept busy by a reader, or by
 * the writer's own checkpoint, is tried again even if nothing is committed
 * meanwhile: background work waits for it and commits nothing until then,
 * and an idle daemon's purge stopped for good with a 153 MiB WAL). Not at
 * every commit past WRITER_WAL_PASSIVE: at a training loop's pace that was
 * a checkpoint, and its fdatasync, per commit. */
static int checkpoint_due(const struct writer *w) {
    if (atomic_load(&w->wal_lost)) return 0; /* it would copy what is left of the WAL into the database */
    if (w->wal_used >= WRITER_WAL_RESTART)
        return w->wal_used != w->wal_checked ||
               (!w->wal_reset_ok && now_mono_ms() - w->ck_last_ms >= WRITER_CK_RETRY_MS);
    int64_t fresh = w->wal_used >= w->wal_checked ? w->wal_used - w->wal_checked : w->wal_used;
    return fresh >= WRITER_WAL_PASSIVE;
}

/* After a commit: tells the checkpointer how much of the WAL is in use. */
void writer_checkpoint_policy(struct writer *w) {
    int64_t used = store_wal_used(w->st), wal = -1;
    pthread_mutex_lock(&w->mu);
    w->wal_used = used;
    if (used >= WRITER_WAL_RESTART) w->wal_reset_ok = 0; /* this commit did not start the log over */
    if (checkpoint_due(w)) pthread_cond_signal(&w->ckcv);
    pthread_mutex_unlock(&w->mu);
    if (used < WRITER_WAL_HARD || atomic_load(&w->wal_lost)) return;
    /* the checkpointer fell behind (or readers held the log): the writer
     * checkpoints itself before taking more, which is back-pressure */
    int r;
    double t0 = now_mono_ms();
    /* busy: the checkpointer is copying (checkpoints exclude each other,
     * without a busy wait) or a reader holds the old log; try again, for at
     * most 5 s, so that the WAL cannot outgrow the disk's checkpoint pace */
    while ((r = store_checkpoint(w->st, 1, 250, &wal)) == 1 && now_mono_ms() - t0 < 5000) usleep(10 * 1000);
    pthread_mutex_lock(&w->mu);
    if (r == 0) { /* the log starts over at the next commit: background work may go on */
        w->wal_used = store_wal_used(w->st);
        w->wal_reset_ok = 1;
    }
    w->stats.checkpoints++;
    w->stats.checkpoints_writer++;
    if (r == 1) w->stats.checkpoints_busy++;
    if (r < 0) w->stats.db_errors++;
    if (wal > (int64_t)w->stats.wal_peak_bytes) w->stats.wal_peak_bytes = (uint64_t)wal;
    pthread_mutex_unlock(&w->mu);
}

/* The checkpointer thread, on its own connection: a PASSIVE checkpoint
 * copies the WAL into the database (and syncs it) without ever blocking
 * the writer; once the WAL holds WRITER_WAL_RESTART, a RESTART (which only
 * waits, briefly, for readers of the old log, the copying being done) lets
 * the writer's next commit start the log over (writer.h). */
void *writer_checkpointer_main(void *arg) {
    struct writer *w = arg;
    pthread_mutex_lock(&w->mu);
    while (!w->ckstop) {
        if (!checkpoint_due(w)) {
            int retrying = w->wal_used >= WRITER_WAL_RESTART && !w->wal_reset_ok;
            writer_cond_wait_ms(&w->ckcv, &w->mu, retrying ? WRITER_CK_RETRY_MS : 1000);
            continue;
        }
        int64_t used = w->wal_checked = w->wal_used, wal = -1;
        w->ck_last_ms = now_mono_ms();
        pthread_mutex_unlock(&w->mu);
        /* a WAL that regrew after a truncation reads as zeros: never copy
         * them into the database (its size is the writer's to check: a
         * commit may cut the file back to STORE_WAL_LIMIT meanwhile) */
        char why[400];
        if (store_wal_check(store_path(w->ck), -1, &w->ck_wal_id, why, sizeof why) == 1) {
            wal_lost(w, why);
            pthread_mutex_lock(&w->mu);
            continue;
        }
        int r = store_checkpoint(w->ck, 0, 0, &wal);
        if (r == 0 && used >= WRITER_WAL_RESTART)
            r = store_checkpoint(w->ck, 1, used >= 3 * WRITER_WAL_RESTART ? 250 : 20, &wal);
        if (r < 0) ratelog(&w->ck_log, "writer: %s", store_errmsg(w->ck));
        pthread_mutex_lock(&w->mu);
        w->stats.checkpoints++;
        if (r == 1) w->stats.checkpoints_busy++;
        if (r < 0) w->stats.db_errors++;
        if (r == 0 && used >= WRITER_WAL_RESTART) {
            w->wal_reset_ok = 1;
            pthread_cond_signal(&w->cv); /* background work may go on */
        }
        if (wal > (int64_t)w->stats.wal_peak_bytes) w->stats.wal_peak_bytes = (uint64_t)wal;
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}
