/* writer_int.h: what the writer's files share (writer.c, writer_wal.c):
 * the writer's state and the calls each makes into the other. Not for use
 * outside them: the writer's contract is writer.h. */
#ifndef WRITER_INT_H
#define WRITER_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "ratelog.h"
#include "store.h"
#include "writer.h"

/* The WAL's bounds (writer.h's head says what each one does). */
#define WRITER_WAL_PASSIVE (INT64_C(2) << 20)
#define WRITER_WAL_RESTART (INT64_C(8) << 20)
#define WRITER_WAL_HARD (INT64_C(32) << 20)
#define WRITER_CK_RETRY_MS 100 /* a RESTART that did not succeed is tried again this often */

struct writer {
    struct store *st;
    int notify_fd;
    struct writer_config cfg;
    pthread_t thread;
    int started;

    pthread_mutex_t mu; /* guards everything below */
    pthread_cond_t cv;
    struct writer_item *head, *tail; /* submitted, not yet taken */
    size_t bytes;                    /* held by queued and uncommitted items */
    int stop;
    double stop_ms; /* monotonic ms writer_destroy asked the thread to stop */
    /* writer thread only: at shutdown, the database refused and batches are given up unacked */
    int abandoning;
    uint64_t abandoned_steps;
    char abandon_why[256];
    struct ratelog write_log, ck_log, job_log; /* ck_log: the checkpointer thread's */
    struct writer_reply *rhead, *rtail;

    struct writer_stats stats;      /* written by the writer thread only */
    writer_precommit_fn *precommit; /* writer_set_precommit */
    void *precommit_ctx;

    /* Writer thread only. Items held back behind a rollback: the first is
     * a step that needs a rewind (store_needs_rewind), the rest are later
     * items of a run that has one deferred, and hellos (one could resume
     * such a run). They are counted in `bytes` until committed. */
    struct writer_item *dhead, *dtail;
    int64_t *blocked; /* runs with a deferred item */
    size_t nblocked, capblocked;
    int purge_pending;        /* store_purge has (or may have) work */
    int64_t job_budget;       /* units per piece (store_purge.c), adapted to WRITER_JOB_PIECE_MS */
    double job_backoff_until; /* after a failed chunk (monotonic ms) */
    int64_t retain_cursor;    /* store_retain_raw's place in its pass */
    double retain_next;       /* when the next retention pass may start (monotonic ms) */

    /* The checkpointer: its own connection and thread; wal_used (bytes of
     * the WAL in use after the writer's last commit) and wal_checked (the
     * figure it last acted on) are guarded by mu. */
    struct store *ck;
    pthread_t ckthread;
    int ckstarted;
    pthread_cond_t ckcv;
    int64_t wal_used, wal_checked;
    int ckstop;        /* after the writer thread ended */
    int wal_reset_ok;  /* a RESTART succeeded since the WAL passed WRITER_WAL_RESTART */
    double ck_last_ms; /* when the checkpointer last began one (now_mono_ms) */

    /* Writer thread only. Steps go without a savepoint (in WAL mode a
     * savepoint copies every page a step touches into SQLite's statement
     * journal: ~110 KB per 12x12 step, more than the step itself wrote);
     * when one fails for a reason of its own, the batch is rolled back and
     * applied again with this set, every item under its savepoint, so that
     * the failing step is undone alone. */
    int guarded;

    /* The WAL watch (store_wal_check): lost is set once, by either thread,
     * and never cleared; why is written before lost is set. */
    atomic_int wal_lost;
    char wal_lost_why[512];
    struct store_wal_id wal_id, ck_wal_id; /* the writer's / the checkpointer's */
    double wal_check_ms;                   /* writer thread: its last check */
};

/* Waits on cv (mu held) for at most ms milliseconds (none if ms <= 0):
 * the writer thread's waits and the checkpointer's. */
static inline void writer_cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, double ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long long ns = ts.tv_nsec + (long long)(ms > 0 ? ms * 1e6 : 0);
    ts.tv_sec += (time_t)(ns / 1000000000LL);
    ts.tv_nsec = (long)(ns % 1000000000LL);
    pthread_cond_timedwait(cv, mu, &ts);
}

/* ---- the WAL (writer_wal.c) ----------------------------------------- */

/* Writer thread: checks the WAL against the frames SQLite counts in it;
 * at most every WRITER_WAL_WATCH_MS unless force. A lost WAL sets
 * w->wal_lost for good: nothing is committed from then on. */
void writer_wal_watch(struct writer *w, int force);

/* Writer thread, after a commit or a chunk: tells the checkpointer how much
 * of the WAL is in use, and past WRITER_WAL_HARD checkpoints itself
 * (back-pressure). */
void writer_checkpoint_policy(struct writer *w);

/* The checkpointer thread's body (pthread_create's start routine; arg is
 * the writer). Runs until w->ckstop. */
void *writer_checkpointer_main(void *arg);

#endif
