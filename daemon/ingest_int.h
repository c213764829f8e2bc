/* ingest_int.h: what ingest.c, ingest_guard.c, ingest_lines.c and
 * ingest_loop.c share: ingest's state (runs, connections, budgets) and the
 * functions each calls in another. Not for use outside them: ingest's
 * contract is ingest.h.
 * Event loop thread only, except the stats under stats_mu. */
#ifndef INGEST_INT_H
#define INGEST_INT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "peers.h"
#include "ratelog.h"

/* Uses ingest.h's types (struct ingest_config, struct ingest_stats) but
 * does not include it: each file of the module includes ingest.h, then
 * this header (as store.c does with store.h and store_int.h), so that no
 * include runs from the inside back to the contract. */

#define READ_CHUNK (256 * 1024)
#define IN_INITIAL (16 * 1024)

/* Ingest's view of a run: enough to validate lines without the database. */
struct run {
    char name[PROTO_MAX_RUN + 1];
    int64_t id; /* 0 until the writer welcomed it */
    int64_t layers, heads;
    int64_t seq_len; /* its last hello's, with noncausal: what derive_step needs */
    int noncausal;
    int64_t last_seq; /* highest seq accepted (queued or committed) */
    int ended;
    struct conn *owner;    /* the connection that said hello last, or NULL */
    struct run *name_next; /* chain in the table by name */
    struct run *id_next;   /* chain in the table by id, once welcomed */
};

/* Runs with a connection, by name and by id: chained hash tables that
 * double as they fill, so a hello or a reply costs the same with 10 runs
 * connected as with 100,000. A run without a connection is not held: its
 * next hello brings its shape and last seq back from the writer. */
struct run_table {
    struct run **b;
    size_t nb, n;
};

struct conn {
    int fd;
    uint64_t id;
    int64_t ack_delay_ms; /* its hello's: how long the writer may hold its steps' commit */
    char *in;             /* buffered input not yet consumed */
    size_t in_len, in_cap;
    int skipping; /* discarding the rest of an overlong line */
    char *out;    /* pending output (welcome, errors) */
    size_t out_off, out_len, out_cap;
    int64_t ack_pending, ack_sent;
    struct run *run;
    int waiting;         /* hello sent to the writer, welcome not back yet */
    int closing;         /* close once output is flushed */
    int told_db_failing; /* got db_failing in the database's current streak of refusals */
    int eof;             /* peer closed its side */
    int want_out;        /* EPOLLOUT armed */
    int reading;         /* EPOLLIN armed */
    int held;            /* refused before its welcome: not read, closed at its deadline
                              * (see conn_hold) */
    /* budgets and timeouts (see "guards" below) */
    int welcomed;                            /* a hello of this connection was welcomed */
    int starved;                             /* not reading: the global input budget is spent */
    double accepted_ms, last_ms, starved_ms; /* monotonic */
    struct peer *peer;                       /* its uid or address, counted in ing->peers */
    struct conn *pprev, *pnext;              /* in ing's list of connections not welcomed yet, oldest first */
    int pending;                             /* on that list */
};

/* Marker values stored in epoll_event.data.u64 for non-connection fds. */
enum { EV_UNIX = 1, EV_TCP, EV_NOTIFY, EV_STOP, EV_CONN_BASE = 16 };

struct ingest {
    struct ingest_config cfg;
    size_t line_max; /* a welcomed connection's line limit: proto_line_max(max_cells_per_run) */
    struct writer *writer;
    int notify_fd, stop_fd;
    int ep, ctl_ep; /* all fds; control fds only (used while paused) */
    int unix_fd, tcp_fd, tcp_port;
    char *unix_path;
    struct conn **conns; /* by fd */
    int conns_cap;
    uint64_t next_id;
    struct run_table by_name, by_id;
    int paused;              /* the writer's queue was full */
    double accept_resume_ms; /* > 0: listeners out of epoll until then (out of descriptors) */
    int db_failing;          /* the writer's failing state at the last sweep (tell_db_failing) */
    struct ratelog accept_log;
    int wake_writer;                    /* steps or events were submitted quietly: wake it (ingest_run) */
    struct peers *peers;                /* open connections per uid / address */
    struct conn *pend_head, *pend_tail; /* not welcomed yet, in accept order */
    size_t in_bytes;                    /* sum of every connection's in_cap */
    int starved;                        /* connections waiting for input budget */
    double last_sweep_ms;
    pthread_mutex_t stats_mu;
    struct ingest_stats stats;
};

#define STAT_ADD(ing, field, n)                 \
    do {                                        \
        pthread_mutex_lock(&(ing)->stats_mu);   \
        (ing)->stats.field += (n);              \
        pthread_mutex_unlock(&(ing)->stats_mu); \
    } while (0)

/* ---- connections, output and runs (ingest.c) ------------------------- */

/* The list of connections not welcomed yet, oldest first. */
void ingest_pending_add(struct ingest *ing, struct conn *c);
void ingest_pending_remove(struct ingest *ing, struct conn *c); /* c not on it: nothing */

/* Publishes ing->in_bytes to the stats. */
void ingest_input_stat(struct ingest *ing);


/* Arms epoll for what c waits for now (input, output, its peer hanging up). */
void ingest_conn_arm(struct ingest *ing, struct conn *c);

/* Writes what can be written now without blocking; closes c when its peer
 * is gone or c is done. c may be freed when this returns. */
void ingest_conn_flush(struct ingest *ing, struct conn *c);

/* Appends n bytes at s to c's output. -1 when the client has let more
 * than it may pile up unread (cfg.max_out, INGEST_HELLO_MAX before its
 * welcome) or out of memory: nothing is appended. */
int ingest_out_append(struct ingest *ing, struct conn *c, const char *s, size_t n);

/* Queues an error line (seq > 0: the line names it). Closing codes, and a
 * client that does not read its errors, end the connection once the
 * output is flushed. */
void ingest_send_error(struct ingest *ing, struct conn *c, int code, const char *msg, int64_t seq);

/* Closes and frees c (its run turns stale unless it ended). */
void ingest_conn_close(struct ingest *ing, struct conn *c);

/* The open connection with that id, or NULL. */
struct conn *ingest_conn_by_id(struct ingest *ing, uint64_t id);

/* The run named name in the table, or NULL. */
struct run *ingest_run_by_name(struct ingest *ing, const char *name);

/* The run with that id in the table, or NULL. */
struct run *ingest_run_by_id(struct ingest *ing, int64_t id);

/* Gives a welcomed run its id (and its place by id). -1 out of memory
 * (the run keeps id 0). */
int ingest_run_set_id(struct ingest *ing, struct run *run, int64_t id);

/* Takes run out of the table and frees it. */
void ingest_run_remove(struct ingest *ing, struct run *run);

/* Adds a new run (id 0, not in the table yet) by its name. -1 out of
 * memory (r is not added; the caller still owns it). */
int ingest_run_add(struct ingest *ing, struct run *r);

/* Detaches c from its run; the run turns stale unless it ended, and
 * leaves the table (nothing more comes for it until its next hello). */
void ingest_conn_detach(struct ingest *ing, struct conn *c);

/* ---- lines (ingest_lines.c) ------------------------------------------ */

/* Handles the complete lines in c's input buffer, stopping at a hello
 * (the rest waits for the welcome) or when the writer is full (ing->paused
 * set). Returns 0, or -1 when c was refused (a stranger's overlong line:
 * held, or closed). */
int ingest_process_input(struct ingest *ing, struct conn *c);

/* ---- guards (ingest_guard.c) ----------------------------------------- */

/* Refuses a stranger without closing it: told why, no longer read, its
 * input buffer given back; closed at its hello deadline or when its slot
 * is wanted. c may be closed when this returns. */
void ingest_conn_hold(struct ingest *ing, struct conn *c, int code, const char *msg);

/* Closes a connection not welcomed yet: a held one at once, any other
 * after an error line. c is gone when this returns. */
void ingest_conn_drop(struct ingest *ing, struct conn *c, int code, const char *msg);

/* Makes room in c's input buffer for the next recv: 0 room, 1 c waits
 * for the global budget (starved), -1 c was refused (held or closed). */
int ingest_in_room(struct ingest *ing, struct conn *c);

/* Gives memory back once a long line is handled. */
void ingest_in_shrink(struct ingest *ing, struct conn *c);

/* The peer's key into key: "uid:N" on the Unix socket, "ip:ADDR" over TCP. */
void ingest_peer_key(int fd, int tcp, char *key, size_t cap);

/* When every slot is taken: the connection a newcomer whose peer holds
 * newcomer_count connections may push out, or NULL. */
struct conn *ingest_eviction_victim(struct ingest *ing, int newcomer_count);

/* The oldest connection of the peer named key not welcomed yet, or NULL. */
struct conn *ingest_peer_victim(struct ingest *ing, const char *key);

/* Closes connections past their deadline, resumes starved ones once
 * memory is free, tells connections the database refuses writes. A few
 * times a second. */
void ingest_guards_sweep(struct ingest *ing, double now);

/* Appends the guards' counters in is to b as Prometheus text. */
void ingest_guard_metrics(struct strbuf *b, const struct ingest_stats *is);

#endif
