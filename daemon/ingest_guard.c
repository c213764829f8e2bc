/* ingest_guard.c: what a trainer connection may cost: budgets, timeouts,
 * per-peer limits. Not the event loop (ingest_loop.c) or the protocol
 * (ingest_lines.c).
 *
 * What a connection may cost before it is welcomed is small (INGEST_HELLO_MAX
 * of input and of output, hello_ms of time); all input buffers together stay
 * under max_input (a welcomed connection that needs more waits, then is
 * closed; one not welcomed is refused at once); a peer (uid or address)
 * holds at most max_conns_per_peer connections; and when every slot is
 * taken, a newcomer takes the slot of the oldest connection that has not
 * said hello yet, so idle sockets cannot lock trainers out. */
#include "ingest.h"
#include "ingest_int.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "now.h"
#include "strbuf.h"

/* Gives c's input buffer cap bytes (cap >= c->in_len), keeping
 * ing->in_bytes the sum of every buffer. Returns 0, or -1 (out of memory). */
static int in_resize(struct ingest *ing, struct conn *c, size_t cap) {
    char *in = realloc(c->in, cap);
    if (!in) return -1;
    ing->in_bytes = ing->in_bytes - c->in_cap + cap;
    c->in = in;
    c->in_cap = cap;
    ingest_input_stat(ing);
    return 0;
}

/* Closes c now, after an error line (best effort: a peer that does not
 * read is not waited for). c is gone when this returns. */
static void conn_refuse(struct ingest *ing, struct conn *c, int code, const char *msg) {
    uint64_t id = c->id;
    ingest_send_error(ing, c, code, msg, 0);
    c->closing = 1;
    ingest_conn_flush(ing, c);
    if ((c = ingest_conn_by_id(ing, id))) ingest_conn_close(ing, c);
}

/* Refuses a stranger that pushes past its budget (an overlong line, or
 * input while the global budget is spent) without closing it: it is told
 * why, is no longer read, gives its input buffer back and shrinks its
 * kernel receive buffer, and is closed at its hello deadline or sooner
 * when its slot is wanted (ingest_conn_drop). Closing at once would hand
 * a flooding client a loop as fast as it can reconnect: 60 TCP floods
 * reconnecting without pause take enough CPU to delay /healthz and
 * trainers' welcomes past their bounds on a loaded 2-core machine. Held,
 * their sends block and cost neither side anything but a slot. c may be closed
 * when this returns (its peer was gone). */
void ingest_conn_hold(struct ingest *ing, struct conn *c, int code, const char *msg) {
    ingest_send_error(ing, c, code, msg, 0);
    c->held = 1;
    c->skipping = 0;
    ing->in_bytes -= c->in_cap;
    free(c->in);
    c->in = NULL;
    c->in_len = c->in_cap = 0;
    ingest_input_stat(ing);
    int tiny = 1; /* the kernel's minimum: what is queued stays, nothing more is */
    setsockopt(c->fd, SOL_SOCKET, SO_RCVBUF, &tiny, sizeof tiny);
    ingest_conn_flush(ing, c);
}

/* Closes a connection that has not been welcomed, to end its wait or to
 * make room: a held one at once (it was told why already), any other
 * after an error line. */
void ingest_conn_drop(struct ingest *ing, struct conn *c, int code, const char *msg) {
    if (c->held) ingest_conn_close(ing, c);
    else conn_refuse(ing, c, code, msg);
}

/* The largest input buffer a connection may have: a line of line_max
 * (the step of the largest run admitted, proto_line_max) once welcomed,
 * INGEST_HELLO_MAX before. */
static size_t in_limit(const struct ingest *ing, const struct conn *c) {
    return c->welcomed ? ing->line_max + 2 * READ_CHUNK : INGEST_HELLO_MAX + 1;
}

/* The total input memory under which c may grow its buffer: welcomed
 * connections stop at three quarters of max_input, so that trainers
 * holding long unfinished lines leave room for a newcomer's hello. */
static size_t in_budget(const struct ingest *ing, const struct conn *c) {
    return c->welcomed ? ing->cfg.max_input / 4 * 3 : ing->cfg.max_input;
}

/* The oldest connection other than c that has not said hello (and is not
 * waiting for its welcome) and holds input memory, or NULL. */
static struct conn *input_victim(struct ingest *ing, const struct conn *c) {
    for (struct conn *v = ing->pend_head; v; v = v->pnext)
        if (v != c && v->in_cap && !v->waiting && !v->closing) return v;
    return NULL;
}

/* Makes room in c's input buffer for the next recv. Returns 0 when there
 * is room, 1 when c must wait for the global budget (it is starved: not
 * read until memory is freed), -1 when c was refused (held, or closed).
 * A stranger over the budget first takes memory from older strangers
 * (their unfinished lines are closed, oldest first): a trainer's hello
 * fits in one read, so strangers that hold the budget cannot keep a
 * trainer out; only then is c itself refused. */
int ingest_in_room(struct ingest *ing, struct conn *c) {
    size_t limit = in_limit(ing, c);
    if (c->in_cap - c->in_len >= READ_CHUNK / 4 || c->in_cap >= limit) return 0;
    size_t cap = c->in_cap ? c->in_cap * 2 : IN_INITIAL;
    while (cap - c->in_len < READ_CHUNK / 4) cap *= 2;
    if (cap > limit) cap = limit;
    struct conn *v;
    while (!c->welcomed && ing->in_bytes - c->in_cap + cap > in_budget(ing, c) && (v = input_victim(ing, c))) {
        STAT_ADD(ing, conns_evicted, 1);
        conn_refuse(ing, v, PROTO_E_INTERNAL,
                    "the daemon's input memory is spent: this unfinished line was closed to make room");
    }
    if (ing->in_bytes - c->in_cap + cap > in_budget(ing, c)) {
        if (!c->welcomed) {
            STAT_ADD(ing, input_refused, 1);
            ingest_conn_hold(ing, c, PROTO_E_INTERNAL, "the daemon's input memory is spent: try again later");
            return -1;
        }
        if (!c->starved) {
            c->starved = 1;
            c->starved_ms = now_mono_ms();
            ing->starved++;
            ingest_conn_arm(ing, c);
        }
        return 1;
    }
    if (in_resize(ing, c, cap)) {
        conn_refuse(ing, c, PROTO_E_INTERNAL, "out of memory");
        return -1;
    }
    return 0;
}

/* Gives memory back once a long line is handled: a connection that sent
 * one 4 MiB line does not keep 4 MiB. */
void ingest_in_shrink(struct ingest *ing, struct conn *c) {
    if (c->in_cap > 4 * READ_CHUNK && c->in_len <= READ_CHUNK / 2) in_resize(ing, c, READ_CHUNK);
}

/* The peer's key: "uid:N" on the Unix socket, "ip:ADDR" over TCP. */
void ingest_peer_key(int fd, int tcp, char *key, size_t cap) {
    if (!tcp) {
        struct ucred cr;
        socklen_t l = sizeof cr;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &l) == 0) snprintf(key, cap, "uid:%u", (unsigned)cr.uid);
        else snprintf(key, cap, "uid:?");
        return;
    }
    struct sockaddr_storage ss;
    socklen_t l = sizeof ss;
    char addr[INET6_ADDRSTRLEN] = "?";
    if (getpeername(fd, (struct sockaddr *)&ss, &l) == 0) {
        if (ss.ss_family == AF_INET) inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, addr, sizeof addr);
        else if (ss.ss_family == AF_INET6)
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, addr, sizeof addr);
    }
    const char *a = strncmp(addr, "::ffff:", 7) == 0 && strchr(addr + 7, '.') ? addr + 7 : addr;
    snprintf(key, cap, "ip:%s", a);
}

/* When every slot is taken: the oldest connection that has not said hello
 * (and is not waiting for its welcome) whose peer holds at least as many
 * connections as the newcomer's, or NULL; a held one (already refused)
 * before any other. A trainer from a quiet peer can push out a crowd's
 * idle sockets; the crowd cannot push out the trainer. */
struct conn *ingest_eviction_victim(struct ingest *ing, int newcomer_count) {
    for (int held = 1; held >= 0; held--)
        for (struct conn *c = ing->pend_head; c; c = c->pnext)
            if (c->held == held && !c->waiting && !c->closing && (!c->peer || peers_count(c->peer) >= newcomer_count))
                return c;
    return NULL;
}

/* The oldest connection of the peer named key that has not said hello
 * (and is not waiting for its welcome), or NULL. */
struct conn *ingest_peer_victim(struct ingest *ing, const char *key) {
    for (struct conn *c = ing->pend_head; c; c = c->pnext)
        if (!c->waiting && !c->closing && c->peer && strncmp(peers_key(c->peer), key, PEERS_KEY_MAX - 1) == 0) return c;
    return NULL;
}

/* While the writer's database refuses writes (a full disk), tells each
 * connection once, with an error line that keeps it open: otherwise a
 * trainer sees only acks that stop coming. A streak ends when a commit
 * succeeds; the next one tells everyone again. */
static void tell_db_failing(struct ingest *ing) {
    struct writer_stats ws;
    writer_get_stats(ing->writer, &ws);
    if (!ws.failing && !ing->db_failing) return; /* the common case: no connection to visit */
    ing->db_failing = ws.failing;
    for (int fd = 0; fd < ing->conns_cap; fd++) {
        struct conn *c = ing->conns[fd];
        if (!c || c->closing || c->told_db_failing == ws.failing) continue;
        c->told_db_failing = ws.failing;
        if (ws.failing) {
            ingest_send_error(
                ing, c, PROTO_E_DB_FAILING,
                "the daemon cannot write its database (disk full or I/O error): nothing is acked until it "
                "can; keep what you sent, it is taken when the database recovers",
                0);
            /* now: a trainer that waits for acks sends nothing that would
             * flush it (the line sat queued until the trainer's next line) */
            ingest_conn_flush(ing, c);
        }
    }
}

/* Closes connections past their deadline and resumes starved ones once
 * memory is free. Called from the loop a few times a second. */
void ingest_guards_sweep(struct ingest *ing, double now) {
    ing->last_sweep_ms = now;
    tell_db_failing(ing);
    char msg[160];
    while (ing->pend_head) {
        struct conn *c = ing->pend_head, *timed_out = NULL;
        for (; c && c->accepted_ms + ing->cfg.hello_ms <= now; c = c->pnext)
            if (!c->waiting) {
                timed_out = c;
                break;
            }
        if (!timed_out) break;
        snprintf(msg, sizeof msg, "no hello within %d ms of connecting", ing->cfg.hello_ms);
        STAT_ADD(ing, conns_timed_out, 1);
        ingest_conn_drop(ing, timed_out, PROTO_E_NO_HELLO, msg);
    }
    if (!ing->starved && ing->cfg.idle_ms <= 0) return;
    for (int fd = 0; fd < ing->conns_cap; fd++) {
        struct conn *c = ing->conns[fd];
        if (!c) continue;
        if (c->starved) {
            size_t want = c->in_cap * 2 > in_limit(ing, c) ? in_limit(ing, c) : c->in_cap * 2;
            if (ing->in_bytes - c->in_cap + want <= in_budget(ing, c)) {
                c->starved = 0;
                ing->starved--;
                ingest_conn_arm(ing, c);
            } else if (c->starved_ms + ing->cfg.hello_ms <= now) {
                c->starved = 0;
                ing->starved--;
                STAT_ADD(ing, input_refused, 1);
                conn_refuse(ing, c, PROTO_E_INTERNAL,
                            "the daemon's input memory stayed spent while this line was unfinished: closed");
            }
            continue;
        }
        if (ing->cfg.idle_ms > 0 && c->welcomed && !c->waiting && c->last_ms + ing->cfg.idle_ms <= now) {
            snprintf(msg, sizeof msg, "nothing received for %d ms: closed (--idle-timeout-s)", ing->cfg.idle_ms);
            STAT_ADD(ing, conns_timed_out, 1);
            conn_refuse(ing, c, PROTO_E_INTERNAL, msg);
        }
    }
}


/* The counters of ingest's guards: deadlines, eviction, per-peer limits,
 * the input budget. */
void ingest_guard_metrics(struct strbuf *b, const struct ingest_stats *is) {
    strbuf_prom(b, "entropyd_connections_timed_out_total", "counter",
                "Trainer connections closed for sending no hello in time, or for idling.", (double)is->conns_timed_out);
    strbuf_prom(b, "entropyd_connections_evicted_total", "counter",
                "Connections without a hello closed to make room for a newcomer.", (double)is->conns_evicted);
    strbuf_prom(b, "entropyd_connections_peer_rejected_total", "counter",
                "Trainer connections refused: their user or address held --max-conns-per-peer.",
                (double)is->conns_peer_rejected);
    strbuf_prom(b, "entropyd_input_bytes", "gauge", "Memory held by unfinished input lines.", (double)is->input_bytes);
    strbuf_prom(b, "entropyd_input_refused_total", "counter", "Connections closed because --input-mb was spent.",
                (double)is->input_refused);
}
