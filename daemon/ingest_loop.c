/* ingest_loop.c: the trainer-facing event loop: listeners, admitting and
 * reading connections, the writer's replies, and the lifecycle
 * (ingest_create, ingest_run, ingest_destroy; the contract is ingest.h).
 * Not here: a connection's output, the run table and closing
 * (ingest.c), what each line does (ingest_lines.c), what a connection may
 * cost (ingest_guard.c). */
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

/* Tells a refused newcomer why (best effort) and closes it. */
static void refuse_fd(int fd, const char *why) {
    char line[1024];
    size_t n = proto_write_error(line, sizeof line, PROTO_E_INTERNAL, why, 0, 0);
    ssize_t ignored = send(fd, line, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)ignored;
    close(fd);
}

/* Decides whether a new connection may stay: its peer under
 * max_conns_per_peer, and a slot free under max_conns (or made free by
 * evicting a connection that has not said hello). Returns the peer's
 * entry, counted, or NULL after refusing and closing fd. */
static struct peer *admit(struct ingest *ing, int fd, int tcp) {
    if (fd >= 1 << 24) {
        refuse_fd(fd, "too many connections");
        return NULL;
    }
    char key[PEERS_KEY_MAX];
    ingest_peer_key(fd, tcp, key, sizeof key);
    struct peer *peer = peers_acquire(ing->peers, key);
    struct conn *own = peer ? NULL : ingest_peer_victim(ing, key);
    if (own) { /* the peer is at its limit: its own oldest idle stranger makes room */
        STAT_ADD(ing, conns_evicted, 1);
        ingest_conn_drop(ing, own, PROTO_E_NO_HELLO,
                         "too many connections from this peer: closed to make room, as this one had not said hello");
        peer = peers_acquire(ing->peers, key);
    }
    if (!peer) {
        pthread_mutex_lock(&ing->stats_mu);
        ing->stats.conns_rejected++;
        ing->stats.conns_peer_rejected++;
        pthread_mutex_unlock(&ing->stats_mu);
        refuse_fd(fd, "too many connections from this peer (--max-conns-per-peer)");
        return NULL;
    }
    pthread_mutex_lock(&ing->stats_mu);
    int full = (int)ing->stats.conns_open >= ing->cfg.max_conns;
    pthread_mutex_unlock(&ing->stats_mu);
    if (full) {
        struct conn *victim = ingest_eviction_victim(ing, peers_count(peer));
        if (victim) {
            STAT_ADD(ing, conns_evicted, 1);
            ingest_conn_drop(ing, victim, PROTO_E_NO_HELLO,
                             "too many connections: closed to make room, as this one had not said hello");
        } else {
            STAT_ADD(ing, conns_rejected, 1);
            peers_release(ing->peers, peer);
            refuse_fd(fd, "too many connections");
            return NULL;
        }
    }
    return peer;
}

/* Connections accepted per wakeup at most: a listener that attackers
 * refill as fast as it is drained must not keep the loop from the other
 * listener and every open connection (epoll is level-triggered: the rest
 * are accepted on the next round). */
#define ACCEPT_BATCH 64

/* How long the listeners rest when the process is out of descriptors:
 * epoll is level-triggered, so a pending connection that cannot be
 * accepted wakes the loop again at once (a busy loop at 134% of a core and
 * a million log lines in 12 s, with RLIMIT_NOFILE 96). The connection
 * waits in the backlog meanwhile and is taken once a descriptor frees. */
#define ACCEPT_REST_MS 100

static int ep_add(int ep, int fd, uint64_t tag);

/* Out of descriptors: the listeners leave epoll for ACCEPT_REST_MS
 * (ingest_run puts them back). */
static void accept_rest(struct ingest *ing) {
    if (ing->accept_resume_ms > 0) return;
    if (ing->unix_fd >= 0) epoll_ctl(ing->ep, EPOLL_CTL_DEL, ing->unix_fd, NULL);
    if (ing->tcp_fd >= 0) epoll_ctl(ing->ep, EPOLL_CTL_DEL, ing->tcp_fd, NULL);
    ing->accept_resume_ms = now_mono_ms() + ACCEPT_REST_MS;
}

static void accept_wake(struct ingest *ing) {
    if (ing->accept_resume_ms <= 0 || now_mono_ms() < ing->accept_resume_ms) return;
    ing->accept_resume_ms = 0;
    if (ing->unix_fd >= 0) ep_add(ing->ep, ing->unix_fd, EV_UNIX);
    if (ing->tcp_fd >= 0) ep_add(ing->ep, ing->tcp_fd, EV_TCP);
}

static void accept_ready(struct ingest *ing, int lfd) {
    for (int i = 0; i < ACCEPT_BATCH; i++) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            ratelog(&ing->accept_log, "accept: %s%s", strerror(errno),
                    errno == EMFILE || errno == ENFILE ? " (listeners rest 100 ms; raise the file limit, ulimit -n)"
                                                       : "");
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) accept_rest(ing);
            return;
        }
        struct peer *peer = admit(ing, fd, lfd == ing->tcp_fd);
        if (!peer) continue; /* refused and closed */
        if (fd >= ing->conns_cap) {
            int cap = ing->conns_cap ? ing->conns_cap : 1024;
            while (cap <= fd) cap *= 2;
            struct conn **cs = realloc(ing->conns, (size_t)cap * sizeof *cs);
            if (!cs) {
                peers_release(ing->peers, peer);
                close(fd);
                continue;
            }
            memset(cs + ing->conns_cap, 0, (size_t)(cap - ing->conns_cap) * sizeof *cs);
            ing->conns = cs;
            ing->conns_cap = cap;
        }
        struct conn *c = calloc(1, sizeof *c);
        if (!c) {
            peers_release(ing->peers, peer);
            close(fd);
            continue;
        }
        c->peer = peer;
        c->accepted_ms = c->last_ms = now_mono_ms();
        if (lfd == ing->tcp_fd) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        }
        c->fd = fd;
        c->id = (++ing->next_id << 32) | (uint32_t)fd; /* unique, and names its fd: see ingest_conn_by_id */
        c->reading = 1;
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = EV_CONN_BASE + (uint64_t)fd};
        if (epoll_ctl(ing->ep, EPOLL_CTL_ADD, fd, &ev) < 0) {
            peers_release(ing->peers, peer);
            close(fd);
            free(c);
            continue;
        }
        ing->conns[fd] = c;
        ingest_pending_add(ing, c);
        pthread_mutex_lock(&ing->stats_mu);
        ing->stats.conns_total++;
        ing->stats.conns_open++;
        pthread_mutex_unlock(&ing->stats_mu);
    }
}

/* ---- reading ---- */

static void conn_read(struct ingest *ing, struct conn *c) {
    if (c->held || ingest_in_room(ing, c)) return; /* starved (waits for memory), or refused */
    size_t room = c->in_cap - c->in_len;
    if (room > READ_CHUNK) room = READ_CHUNK;
    ssize_t n = recv(c->fd, c->in + c->in_len, room, 0);
    if (n < 0) {
        if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) return;
        ingest_conn_close(ing, c);
        return;
    }
    if (n == 0) {
        /* the peer has finished sending; what it sent is still handled and
         * acked before the connection closes (conn_done) */
        c->eof = 1;
        if (ingest_process_input(ing, c) == 0) ingest_conn_flush(ing, c);
        return;
    }
    c->in_len += (size_t)n;
    c->last_ms = now_mono_ms();
    STAT_ADD(ing, bytes, (uint64_t)n);
    if (ingest_process_input(ing, c)) return;
    ingest_in_shrink(ing, c);
    ingest_conn_flush(ing, c);
}

/* ---- writer replies ---- */

static void handle_replies(struct ingest *ing) {
    uint64_t v;
    ssize_t ignored = read(ing->notify_fd, &v, sizeof v);
    (void)ignored;
    struct writer_reply *r = writer_take_replies(ing->writer);
    while (r) {
        struct writer_reply *next = r->next;
        struct conn *c = NULL;
        if (r->kind == WRITER_R_ACK) {
            struct run *run = ingest_run_by_id(ing, r->run_id);
            c = run ? run->owner : NULL;
            if (c && !c->waiting && r->seq > c->ack_pending) c->ack_pending = r->seq;
        } else if (r->kind == WRITER_R_LINE) {
            struct run *run = ingest_run_by_id(ing, r->run_id);
            c = run ? run->owner : NULL;
            /* a line for a run with no connection (an alert while the
             * trainer is away) is dropped: it is stored and streamed anyway */
            if (c && r->payload &&
                (ingest_out_append(ing, c, r->payload, strlen(r->payload)) || ingest_out_append(ing, c, "\n", 1)))
                c->closing = 1;
        } else {
            c = ingest_conn_by_id(ing, r->conn);
            if (r->kind == WRITER_R_WELCOME && c && c->waiting && c->run) {
                struct run *run = c->run;
                struct run *dup = ingest_run_by_id(ing, r->run_id);
                if (dup && dup != run) { /* stale entry of an older hello */
                    if (dup->owner) dup->owner->run = NULL;
                    ingest_run_remove(ing, dup);
                }
                if (run->id != r->run_id && ingest_run_set_id(ing, run, r->run_id)) {
                    ingest_send_error(ing, c, PROTO_E_INTERNAL, "out of memory", 0);
                    c->closing = 1; /* the trainer reconnects and says hello again */
                }
                run->layers = r->layers;
                run->heads = r->heads;
                run->last_seq = r->seq;
                run->ended = 0;
                c->waiting = 0;
                c->welcomed = 1;
                ingest_pending_remove(ing, c);
                c->ack_pending = c->ack_sent = r->seq;
                char line[128];
                size_t n = proto_write_welcome(line, sizeof line, r->run_id, (uint64_t)r->seq);
                /* a welcome that cannot be queued (out of memory) would leave
                 * the trainer waiting for it: close, so that it reconnects */
                if (ingest_out_append(ing, c, line, n)) c->closing = 1;
            } else if (r->kind == WRITER_R_ERROR && c) {
                ingest_send_error(ing, c, r->code, r->message, r->seq);
                if (c->waiting) { /* the hello failed */
                    struct run *run = c->run;
                    c->waiting = 0;
                    c->run = NULL;
                    if (run && run->owner == c) {
                        run->owner = NULL;
                        ingest_run_remove(ing, run);
                    }
                }
            }
        }
        if (c) {
            /* lines held back behind the hello */
            if (ingest_process_input(ing, c) == 0) ingest_conn_flush(ing, c);
        }
        free(r->payload);
        free(r);
        r = next;
    }
}

/* ---- listeners ---- */

static int listen_unix(struct ingest *ing, const char *path, char *err, size_t errlen) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sa.sun_path) {
        snprintf(err, errlen, "socket path too long: %s", path);
        return -1;
    }
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return -1;
    }
    /* a socket file left by a dead daemon is removed; a live one is not */
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
        snprintf(err, errlen, "another entropyd is listening on %s", path);
        close(fd);
        return -1;
    }
    close(fd);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return -1;
    }
    /* only a socket is removed: --socket pointing at the database (or any
     * other file) must not destroy it */
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            snprintf(err, errlen, "--socket %s: the path exists and is not a socket; not removing it", path);
            close(fd);
            return -1;
        }
        unlink(path);
    }
    mode_t old = umask(0177); /* mode 0600 from birth: no window for others */
    int rc = bind(fd, (struct sockaddr *)&sa, sizeof sa);
    umask(old);
    if (rc < 0 || listen(fd, 1024) < 0) {
        snprintf(err, errlen, "cannot listen on %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    ing->unix_path = strdup(path);
    return fd;
}

static int listen_tcp(struct ingest *ing, const char *spec, char *err, size_t errlen) {
    struct net_addr addr;
    if (net_resolve(spec, "--listen-tcp", &addr, err, errlen)) return -1;
    int fd = socket(addr.ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, (struct sockaddr *)&addr.ss, addr.len) < 0 || listen(fd, 1024) < 0) {
        snprintf(err, errlen, "cannot listen on %s: %s", spec, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    ing->tcp_port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                             : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    return fd;
}

static int ep_add(int ep, int fd, uint64_t tag) {
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = tag};
    return epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
}

struct ingest *ingest_create(const struct ingest_config *cfg, struct writer *writer, int notify_fd, char *err,
                             size_t errlen) {
    struct ingest *ing = calloc(1, sizeof *ing);
    if (!ing) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    ing->cfg = *cfg;
    if (ing->cfg.max_conns <= 0) ing->cfg.max_conns = 10000;
    if (!ing->cfg.max_out) ing->cfg.max_out = 4u << 20;
    if (ing->cfg.max_conns_per_peer <= 0) { /* half the slots, or all of them while there are few */
        int half = ing->cfg.max_conns / 2, few = ing->cfg.max_conns < 1024 ? ing->cfg.max_conns : 1024;
        ing->cfg.max_conns_per_peer = half > few ? half : few;
    }
    if (ing->cfg.hello_ms <= 0) ing->cfg.hello_ms = 10000;
    if (ing->cfg.idle_ms < 0) ing->cfg.idle_ms = 0;
    if (!ing->cfg.max_input) ing->cfg.max_input = (size_t)64 << 20;
    if (ing->cfg.max_cells_per_run <= 0) ing->cfg.max_cells_per_run = INGEST_MAX_CELLS;
    /* a step of the largest run admitted fits in a line (proto.h); the
     * line fits in the input budget when welcomed connections' three
     * quarters of it (ingest_guard.c) hold one: said, not forced, since a
     * small --input-mb is a choice (such a line waits for memory) */
    ing->line_max = proto_line_max(ing->cfg.max_cells_per_run);
    size_t need = (ing->line_max + 2 * READ_CHUNK) / 3 * 4 + 1;
    if (ing->cfg.max_input < need)
        fprintf(stderr,
                "entropyd: warning: --input-mb %zu holds no step line of the largest run --max-cells-per-run "
                "%lld admits (%zu MiB); give --input-mb %zu for them to pass\n",
                ing->cfg.max_input >> 20, (long long)ing->cfg.max_cells_per_run, (ing->line_max + (1u << 20) - 1) >> 20,
                (need + (1u << 20) - 1) >> 20);
    ing->writer = writer;
    ing->notify_fd = notify_fd;
    ing->unix_fd = ing->tcp_fd = ing->stop_fd = ing->ep = ing->ctl_ep = -1;
    pthread_mutex_init(&ing->stats_mu, NULL);
    if (!(ing->peers = peers_create(ing->cfg.max_conns_per_peer))) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    ing->ep = epoll_create1(EPOLL_CLOEXEC);
    ing->ctl_ep = epoll_create1(EPOLL_CLOEXEC);
    ing->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (ing->ep < 0 || ing->ctl_ep < 0 || ing->stop_fd < 0) {
        snprintf(err, errlen, "epoll/eventfd: %s", strerror(errno));
        goto fail;
    }
    if (cfg->socket_path && (ing->unix_fd = listen_unix(ing, cfg->socket_path, err, errlen)) < 0) goto fail;
    if (cfg->tcp && (ing->tcp_fd = listen_tcp(ing, cfg->tcp, err, errlen)) < 0) goto fail;
    if ((ing->unix_fd >= 0 && ep_add(ing->ep, ing->unix_fd, EV_UNIX)) ||
        (ing->tcp_fd >= 0 && ep_add(ing->ep, ing->tcp_fd, EV_TCP)) || ep_add(ing->ep, notify_fd, EV_NOTIFY) ||
        ep_add(ing->ep, ing->stop_fd, EV_STOP) || ep_add(ing->ctl_ep, notify_fd, EV_NOTIFY) ||
        ep_add(ing->ctl_ep, ing->stop_fd, EV_STOP)) {
        snprintf(err, errlen, "epoll_ctl: %s", strerror(errno));
        goto fail;
    }
    return ing;
fail:
    ingest_destroy(ing);
    return NULL;
}

void ingest_stop(struct ingest *ing) {
    uint64_t one = 1;
    ssize_t ignored = write(ing->stop_fd, &one, sizeof one);
    (void)ignored;
}

int ingest_tcp_port(const struct ingest *ing) { return ing->tcp_port; }

/* Resumes connections that hold complete lines once the writer has room. */
/* Wakes the writer once for every step and event submitted since the last
 * call (ingest_lines.c's handle_line submits them quietly). */
static void wake_writer(struct ingest *ing) {
    if (!ing->wake_writer) return;
    ing->wake_writer = 0;
    writer_wake(ing->writer);
}

static void resume_all(struct ingest *ing) {
    ing->paused = 0;
    for (int fd = 0; fd < ing->conns_cap && !ing->paused; fd++) {
        struct conn *c = ing->conns[fd];
        if (!c || !c->in_len) continue;
        if (ingest_process_input(ing, c) == 0 && ing->conns[fd] == c) ingest_conn_flush(ing, c);
    }
}

int ingest_run(struct ingest *ing, int drain_ms) {
    struct epoll_event evs[256];
    int stopping = 0;
    double pause_start = 0;
    while (!stopping) {
        int ep = ing->paused ? ing->ctl_ep : ing->ep;
        int n = epoll_wait(ep, evs, 256, ing->paused ? 20 : ing->accept_resume_ms > 0 ? ACCEPT_REST_MS : 250);
        if (n < 0) {
            if (errno == EINTR) continue;
            fprintf(stderr, "entropyd: epoll_wait: %s\n", strerror(errno));
            return -1;
        }
        for (int i = 0; i < n; i++) {
            uint64_t tag = evs[i].data.u64;
            if (tag == EV_STOP) stopping = 1;
            else if (tag == EV_NOTIFY) handle_replies(ing);
            else if (tag == EV_UNIX) accept_ready(ing, ing->unix_fd);
            else if (tag == EV_TCP) accept_ready(ing, ing->tcp_fd);
            else {
                int fd = (int)(tag - EV_CONN_BASE);
                struct conn *c = fd < ing->conns_cap ? ing->conns[fd] : NULL;
                if (!c) continue;
                if ((evs[i].events & (EPOLLERR | EPOLLHUP) && !(evs[i].events & EPOLLIN)) ||
                    (c->held && evs[i].events & (EPOLLERR | EPOLLHUP | EPOLLRDHUP))) {
                    ingest_conn_close(ing, c);
                    continue;
                }
                if ((evs[i].events & EPOLLIN) && !ing->paused) conn_read(ing, c);
                if (ing->conns[fd] == c && (evs[i].events & EPOLLOUT)) ingest_conn_flush(ing, c);
            }
        }
        accept_wake(ing);
        if (ing->paused && !writer_full(ing->writer)) {
            STAT_ADD(ing, paused_ms, (uint64_t)(now_mono_ms() - pause_start));
            resume_all(ing);
        }
        wake_writer(ing);
        if (ing->paused && pause_start == 0) pause_start = now_mono_ms();
        if (!ing->paused) pause_start = 0;
        double now = now_mono_ms();
        if (now - ing->last_sweep_ms >= 200) ingest_guards_sweep(ing, now);
    }
    /* Shutdown: stop accepting, let the writer commit what was accepted,
     * pass on its acks, then close. */
    if (ing->accept_resume_ms <= 0) { /* resting listeners are out already */
        if (ing->unix_fd >= 0) epoll_ctl(ing->ep, EPOLL_CTL_DEL, ing->unix_fd, NULL);
        if (ing->tcp_fd >= 0) epoll_ctl(ing->ep, EPOLL_CTL_DEL, ing->tcp_fd, NULL);
    }
    double deadline = now_mono_ms() + drain_ms;
    while (now_mono_ms() < deadline) {
        struct writer_stats ws;
        writer_get_stats(ing->writer, &ws);
        handle_replies(ing);
        wake_writer(ing);
        int pending_out = 0;
        for (int fd = 0; fd < ing->conns_cap; fd++) {
            struct conn *c = ing->conns[fd];
            if (!c) continue;
            ingest_conn_flush(ing, c);
            if (ing->conns[fd] == c && (c->out_len > c->out_off || c->ack_pending > c->ack_sent)) pending_out = 1;
        }
        if (ws.queue_bytes == 0 && !pending_out) break;
        epoll_wait(ing->ctl_ep, evs, 256, 10);
    }
    return 0;
}

void ingest_destroy(struct ingest *ing) {
    if (!ing) return;
    for (int fd = 0; fd < ing->conns_cap; fd++)
        if (ing->conns[fd]) { ingest_conn_close(ing, ing->conns[fd]); /* its run turns stale */ }
    free(ing->conns);
    peers_destroy(ing->peers);
    for (size_t i = 0; i < ing->by_name.nb; i++)
        for (struct run *r = ing->by_name.b[i], *next; r; r = next) {
            next = r->name_next;
            free(r);
        }
    free(ing->by_name.b);
    free(ing->by_id.b);
    if (ing->unix_fd >= 0) close(ing->unix_fd);
    if (ing->tcp_fd >= 0) close(ing->tcp_fd);
    if (ing->unix_path) {
        unlink(ing->unix_path);
        free(ing->unix_path);
    }
    if (ing->stop_fd >= 0) close(ing->stop_fd);
    if (ing->ep >= 0) close(ing->ep);
    if (ing->ctl_ep >= 0) close(ing->ctl_ep);
    pthread_mutex_destroy(&ing->stats_mu);
    free(ing);
}

void ingest_metrics(struct ingest *ing, struct strbuf *b) {
    struct ingest_stats is;
    ingest_get_stats(ing, &is);
    strbuf_prom(b, "entropyd_connections_total", "counter", "Trainer connections accepted.", (double)is.conns_total);
    strbuf_prom(b, "entropyd_connections_open", "gauge", "Trainer connections open.", (double)is.conns_open);
    strbuf_prom(b, "entropyd_connections_rejected_total", "counter", "Trainer connections refused (limit).",
                (double)is.conns_rejected);
    strbuf_prom(b, "entropyd_lines_total", "counter", "Protocol lines received.", (double)is.lines);
    strbuf_prom(b, "entropyd_received_bytes_total", "counter", "Bytes received from trainers.", (double)is.bytes);
    strbuf_prom(b, "entropyd_messages_total", "counter", "Protocol messages accepted.", (double)is.messages);
    strbuf_prom(b, "entropyd_ingest_paused_seconds_total", "counter",
                "Time ingest stopped reading because the writer queue was full.", is.paused_ms / 1e3);
    ingest_guard_metrics(b, &is);
    strbuf_prom_head(b, "entropyd_errors_total", "counter", "Protocol errors sent to trainers, by code.");
    for (int e = 1; e < PROTO_E_COUNT; e++)
        strbuf_printf(b, "entropyd_errors_total{code=\"%s\"} %llu\n", proto_err_name(e),
                      (unsigned long long)is.errors[e]);
}
