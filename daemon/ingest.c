/* ingest.c: the base of the trainer-facing side: a connection's output,
 * the run table, closing a connection, the list of connections not
 * welcomed yet, and the stats. See ingest.h for the contract and
 * schema/protocol.md for what goes over the wire. Not here: the event loop,
 * listeners and lifecycle (ingest_loop.c), what each line does
 * (ingest_lines.c), what a connection may cost (budgets, timeouts,
 * per-peer limits: ingest_guard.c). */
#include "ingest.h"
#include "ingest_int.h"
#include "strbuf.h"
#include "net.h"
#include "now.h"
#include "peers.h"
#include "ratelog.h"

#include <arpa/inet.h>

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* ---- output ---- */

void ingest_conn_arm(struct ingest *ing, struct conn *c) {
    int want_out = c->out_len > c->out_off || c->ack_pending > c->ack_sent;
    int reading = !c->waiting && !c->closing && !c->eof && !c->starved && !c->held;
    if (want_out == c->want_out && reading == c->reading) return;
    /* a held connection is not read, but its peer's going away is seen */
    struct epoll_event ev = {.events = (reading ? EPOLLIN : 0) | (want_out ? EPOLLOUT : 0) | (c->held ? EPOLLRDHUP : 0),
                             .data.u64 = EV_CONN_BASE + (uint64_t)c->fd};
    epoll_ctl(ing->ep, EPOLL_CTL_MOD, c->fd, &ev);
    c->want_out = want_out;
    c->reading = reading;
}

/* Appends bytes to the connection's output. Returns -1 if the client has
 * let more than max_out bytes pile up unread. */
int ingest_out_append(struct ingest *ing, struct conn *c, const char *s, size_t n) {
    if (c->out_off && c->out_off == c->out_len) c->out_off = c->out_len = 0;
    size_t max_out = c->welcomed ? ing->cfg.max_out : INGEST_HELLO_MAX;
    if (c->out_len - c->out_off + n > max_out) return -1;
    if (c->out_len + n > c->out_cap) {
        if (c->out_off) {
            memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
            c->out_len -= c->out_off;
            c->out_off = 0;
        }
        size_t cap = c->out_cap ? c->out_cap : 4096;
        while (cap < c->out_len + n) cap *= 2;
        if (cap != c->out_cap) {
            char *o = realloc(c->out, cap);
            if (!o) return -1;
            c->out = o;
            c->out_cap = cap;
        }
    }
    memcpy(c->out + c->out_len, s, n);
    c->out_len += n;
    return 0;
}

/* A connection is done when it was told to close, or when its peer has
 * finished sending and every line it sent is handled and acked. */
static int conn_done(const struct conn *c) {
    if (c->closing) return 1;
    if (!c->eof || c->waiting || memchr(c->in, '\n', c->in_len)) return 0;
    return !c->run || c->run->owner != c || c->ack_sent >= c->run->last_seq;
}

/* Writes what can be written now without blocking. */
void ingest_conn_flush(struct ingest *ing, struct conn *c) {
    if (c->ack_pending > c->ack_sent) {
        char line[96];
        size_t n = proto_write_ack(line, sizeof line, (uint64_t)c->ack_pending);
        if (ingest_out_append(ing, c, line, n) == 0) c->ack_sent = c->ack_pending;
    }
    while (c->out_off < c->out_len) {
        ssize_t w = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (w > 0) {
            c->out_off += (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        ingest_conn_close(ing, c); /* peer gone */
        return;
    }
    if (c->out_off >= c->out_len && conn_done(c)) {
        ingest_conn_close(ing, c);
        return;
    }
    ingest_conn_arm(ing, c);
}

/* An error message on the wire is cut to this many bytes. */
#define ERROR_TEXT_MAX 700

/* Queues an error line (seq > 0: the line names it). Closing codes, and a
 * client that does not read its errors, end the connection once the output
 * is flushed. */
void ingest_send_error(struct ingest *ing, struct conn *c, int code, const char *msg, int64_t seq) {
    char text[ERROR_TEXT_MAX + 1], line[128 + 6 * sizeof text];
    snprintf(text, sizeof text, "%s", msg);
    size_t n = proto_write_error(line, sizeof line, code, text, seq > 0, seq);
    STAT_ADD(ing, errors[code], 1);
    if (ingest_out_append(ing, c, line, n)) {
        STAT_ADD(ing, errors[PROTO_E_TOO_MANY_ERRORS], 1);
        c->closing = 1;
        return;
    }
    if (code == PROTO_E_UNAUTHORIZED || code == PROTO_E_SUPERSEDED || code == PROTO_E_TOO_MANY_ERRORS) c->closing = 1;
}

/* ---- runs ---- */

static uint64_t name_hash(const char *s) {
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

static uint64_t id_hash(int64_t id) { return ((uint64_t)id * 0x9E3779B97F4A7C15ULL) >> 17; }

static struct run **chain(struct run_table *t, uint64_t h) { return &t->b[h & (t->nb - 1)]; }

/* Makes room for one more entry (doubling; best effort: a failed grow
 * keeps the old table, only slower). by_id selects the chain pointer. */
static int table_reserve(struct run_table *t, int by_id) {
    if (t->b && t->n < 2 * t->nb) return 0;
    size_t nb = t->nb ? t->nb * 2 : 256;
    struct run **b = calloc(nb, sizeof *b);
    if (!b) return t->b ? 0 : -1;
    for (size_t i = 0; i < t->nb; i++)
        for (struct run *r = t->b[i], *next; r; r = next) {
            next = by_id ? r->id_next : r->name_next;
            struct run **head = &b[(by_id ? id_hash(r->id) : name_hash(r->name)) & (nb - 1)];
            if (by_id) r->id_next = *head;
            else r->name_next = *head;
            *head = r;
        }
    free(t->b);
    t->b = b;
    t->nb = nb;
    return 0;
}

struct run *ingest_run_by_name(struct ingest *ing, const char *name) {
    if (!ing->by_name.b) return NULL;
    for (struct run *r = *chain(&ing->by_name, name_hash(name)); r; r = r->name_next)
        if (strcmp(r->name, name) == 0) return r;
    return NULL;
}

struct run *ingest_run_by_id(struct ingest *ing, int64_t id) {
    if (!ing->by_id.b || id == 0) return NULL;
    for (struct run *r = *chain(&ing->by_id, id_hash(id)); r; r = r->id_next)
        if (r->id == id) return r;
    return NULL;
}

/* Adds a new run (id 0) by name. -1 out of memory. */
int ingest_run_add(struct ingest *ing, struct run *r) {
    if (table_reserve(&ing->by_name, 0)) return -1;
    struct run **head = chain(&ing->by_name, name_hash(r->name));
    r->name_next = *head;
    *head = r;
    ing->by_name.n++;
    return 0;
}

static void unlink_id(struct ingest *ing, struct run *run) {
    if (!run->id || !ing->by_id.b) return;
    for (struct run **p = chain(&ing->by_id, id_hash(run->id)); *p; p = &(*p)->id_next)
        if (*p == run) {
            *p = run->id_next;
            ing->by_id.n--;
            return;
        }
}

/* Gives a welcomed run its id. -1 out of memory (the run keeps id 0). */
int ingest_run_set_id(struct ingest *ing, struct run *run, int64_t id) {
    unlink_id(ing, run);
    run->id = 0;
    if (table_reserve(&ing->by_id, 1)) return -1;
    run->id = id;
    struct run **head = chain(&ing->by_id, id_hash(id));
    run->id_next = *head;
    *head = run;
    ing->by_id.n++;
    return 0;
}

void ingest_run_remove(struct ingest *ing, struct run *run) {
    unlink_id(ing, run);
    for (struct run **p = chain(&ing->by_name, name_hash(run->name)); *p; p = &(*p)->name_next)
        if (*p == run) {
            *p = run->name_next;
            ing->by_name.n--;
            break;
        }
    free(run);
}

static void submit_control(struct ingest *ing, int kind, struct run *run, struct conn *c) {
    struct writer_item *it = calloc(1, sizeof *it);
    if (!it) {
        fprintf(stderr, "entropyd: out of memory marking run %s\n", run->name);
        return;
    }
    it->kind = kind;
    it->run_id = run->id;
    it->conn = c ? c->id : 0;
    it->time = now_wall();
    writer_submit(ing->writer, it); /* control items are always taken */
}

/* Detaches a connection from its run; the run turns stale unless it ended. */
void ingest_conn_detach(struct ingest *ing, struct conn *c) {
    struct run *run = c->run;
    c->run = NULL;
    if (!run || run->owner != c) return;
    run->owner = NULL;
    /* never welcomed: the writer's reply will find no owner */
    if (run->id != 0 && !run->ended) submit_control(ing, WRITER_STALE, run, NULL);
    ingest_run_remove(ing, run); /* nothing more comes for it until its next hello */
}

/* ---- the list of connections not welcomed yet ---- */

void ingest_pending_add(struct ingest *ing, struct conn *c) {
    c->pprev = ing->pend_tail;
    c->pnext = NULL;
    if (ing->pend_tail) ing->pend_tail->pnext = c;
    else ing->pend_head = c;
    ing->pend_tail = c;
    c->pending = 1;
}

void ingest_pending_remove(struct ingest *ing, struct conn *c) {
    if (!c->pending) return;
    if (c->pprev) c->pprev->pnext = c->pnext;
    else ing->pend_head = c->pnext;
    if (c->pnext) c->pnext->pprev = c->pprev;
    else ing->pend_tail = c->pprev;
    c->pprev = c->pnext = NULL;
    c->pending = 0;
}

void ingest_input_stat(struct ingest *ing) {
    pthread_mutex_lock(&ing->stats_mu);
    ing->stats.input_bytes = ing->in_bytes;
    pthread_mutex_unlock(&ing->stats_mu);
}

/* ---- connections ---- */

void ingest_conn_close(struct ingest *ing, struct conn *c) {
    ingest_conn_detach(ing, c);
    ingest_pending_remove(ing, c);
    peers_release(ing->peers, c->peer);
    if (c->starved) ing->starved--;
    ing->in_bytes -= c->in_cap;
    ingest_input_stat(ing);
    epoll_ctl(ing->ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    ing->conns[c->fd] = NULL;
    free(c->in);
    free(c->out);
    free(c);
    pthread_mutex_lock(&ing->stats_mu);
    ing->stats.conns_open--;
    pthread_mutex_unlock(&ing->stats_mu);
}

/* The connection with this id, or NULL when it has closed since. An id's
 * low 32 bits are the connection's fd; fds are reused, so the whole id must
 * match too. O(1): a writer reply is routed without scanning every fd. */
struct conn *ingest_conn_by_id(struct ingest *ing, uint64_t id) {
    int fd = (int)(uint32_t)id;
    if (fd < 0 || fd >= ing->conns_cap) return NULL;
    struct conn *c = ing->conns[fd];
    return c && c->id == id ? c : NULL;
}

/* ---- stats ---- */

void ingest_get_stats(struct ingest *ing, struct ingest_stats *out) {
    pthread_mutex_lock(&ing->stats_mu);
    *out = ing->stats;
    pthread_mutex_unlock(&ing->stats_mu);
}
