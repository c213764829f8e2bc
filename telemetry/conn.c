/* conn.c -- the sender thread: drains the ring into the spool, connects
 * (unix or tcp, non-blocking, exponential backoff), sends the hello,
 * streams the spool from the welcome's last_seq + 1 and reads the daemon's
 * lines (acks trim the spool; errors and alerts go to the inbox). */
#include "telemetry_int.h"
#include "net.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A number in [lo, hi] from the client's own generator (xorshift64*):
 * reconnect jitter, so that clients dropped together do not come back in
 * step. */
static uint64_t jitter(telemetry *t, uint64_t lo, uint64_t hi) {
    if (!t->rng) t->rng = telemetry_now_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)t;
    t->rng ^= t->rng >> 12;
    t->rng ^= t->rng << 25;
    t->rng ^= t->rng >> 27;
    return hi > lo ? lo + (t->rng * 2685821657736338717ull) % (hi - lo + 1) : lo;
}

/* Closes the connection and schedules the next attempt: after the backoff
 * (jittered between half of it and all of it), which doubles up to
 * backoff_max, and never sooner than CONNECT_SPACING_MS after the last
 * attempt began, whatever the daemon answered. The backoff starts again
 * from backoff_min only once a connection proved useful (an ack that moved
 * on, or CONNECT_STABLE_MS up): a daemon that welcomes and then refuses or
 * drops every connection sees them slow down. */
static void disconnect(telemetry *t, int failed_connect) {
    if (t->fd >= 0) close(t->fd);
    t->fd = -1;
    t->olen = t->ooff = t->ilen = 0;
    t->iskip = 0;
    telemetry_rd_close(&t->rd);
    t->rd_opened = t->rd_have = t->rd_ready = 0;
    if (failed_connect) ST_ADD(t, st_connect_failures, 1);
    atomic_store_explicit(&t->st_connected, 0, memory_order_relaxed);
    uint64_t now = telemetry_now_ns();
    if (t->cstate == C_STREAMING && now - t->up_since >= (uint64_t)CONNECT_STABLE_MS * 1000000u)
        t->backoff = t->backoff_min;
    if (t->cstate != C_STOPPED) t->cstate = C_DOWN;
    uint64_t wait = jitter(t, (uint64_t)t->backoff * 500000u, (uint64_t)t->backoff * 1000000u);
    uint64_t next = now + wait, floor = t->last_attempt + (uint64_t)CONNECT_SPACING_MS * 1000000u;
    t->next_attempt = next > floor ? next : floor;
    t->backoff = t->backoff * 2 > t->backoff_max ? t->backoff_max : t->backoff * 2;
}

static void connected(telemetry *t) {
    t->cstate = C_HELLO;
    t->deadline = telemetry_now_ns() + (uint64_t)WELCOME_TIMEOUT_MS * 1000000u;
    memcpy(t->obuf, t->hello, t->hello_len);
    t->olen = t->hello_len;
    t->ooff = 0;
    t->hello_nl = 1;
}

static void start_connect(telemetry *t) {
    int fd = -1, rc;
    t->last_attempt = telemetry_now_ns();
    if (t->is_unix) {
        struct sockaddr_un sa;
        memset(&sa, 0, sizeof sa);
        sa.sun_family = AF_UNIX;
        memcpy(sa.sun_path, t->unix_path, strlen(t->unix_path));
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) goto fail;
        rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
    } else {
        /* resolving may block on DNS; it runs in the sender thread only,
         * and at every attempt, so a name that moves is followed */
        struct net_addr addr;
        char why[160];
        if (net_resolve(t->tcp_addr, "tcp", &addr, why, sizeof why)) goto fail;
        fd = socket(addr.ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) goto fail;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        rc = connect(fd, (struct sockaddr *)&addr.ss, addr.len);
    }
    t->fd = fd;
    if (rc == 0) {
        connected(t);
        return;
    }
    if (errno == EINPROGRESS) {
        t->cstate = C_CONNECTING;
        t->deadline = telemetry_now_ns() + (uint64_t)CONNECT_TIMEOUT_MS * 1000000u;
        return;
    }
    disconnect(t, 1);
    return;
fail:
    if (fd >= 0) close(fd);
    disconnect(t, 1);
}

static void on_welcome(telemetry *t, uint64_t last) {
    if (last >= t->next_seq) {
        uint64_t was = t->next_seq - 1;
        long n = telemetry_spool_renumber(t, last + 1);
        if (n >= 0) {
            telemetry_inbox_note(t, "seq_reset",
                                 "daemon has seq %llu, spool was at %llu; %ld unsent messages renumbered from %llu",
                                 (unsigned long long)last, (unsigned long long)was, n, (unsigned long long)last + 1);
        } else {
            /* Cannot rewrite: continue after the daemon, losing the spool. */
            for (size_t i = 0; i < t->nsegs; i++) telemetry_spool_unlink(t, t->segs[i].first);
            t->nsegs = 0;
            t->spool_total = 0;
            t->next_seq = last + 1;
            ST_SET(t, st_next_seq, t->next_seq);
            telemetry_spool_rotate(t);
            telemetry_inbox_note(t, "spool_error", "renumbering the spool failed (%s); unsent messages dropped",
                                 strerror(errno));
        }
    } else if (t->nsegs && last + 1 < t->segs[0].first) {
        /* Messages the daemon never committed are gone from the spool (the
         * daemon lost data it had acknowledged): it would answer seq_gap to
         * everything. Stop; the spool keeps the rest. */
        telemetry_inbox_note(t, "seq_lost", "daemon expects seq %llu but the spool starts at %llu; stopped",
                             (unsigned long long)last + 1, (unsigned long long)t->segs[0].first);
        t->cstate = C_STOPPED;
        disconnect(t, 0);
        return;
    }
    if (last > t->acked) t->acked = last;
    ST_SET(t, st_acked, t->acked);
    telemetry_spool_trim(t);
    telemetry_spool_seek(t, last + 1);
    t->cstate = C_STREAMING;
    t->up_since = telemetry_now_ns();
    ST_ADD(t, st_connects, 1);
    atomic_store_explicit(&t->st_connected, 1, memory_order_relaxed);
}

/* Errors that refuse a record for what it says: sending it again gets the
 * same answer. */
static int refused_content(int code) {
    return code == PROTO_E_BAD_JSON || code == PROTO_E_BAD_TYPE || code == PROTO_E_MISSING_FIELD ||
           code == PROTO_E_BAD_FIELD || code == PROTO_E_BAD_SHAPE || code == PROTO_E_LINE_TOO_LONG;
}

/* Errors that answer a hello and will answer every later one alike (a
 * shape, a token, a field): not worth reconnecting for. */
static int hello_refused(int code) {
    return code == PROTO_E_SHAPE_MISMATCH || code == PROTO_E_UNAUTHORIZED || code == PROTO_E_BAD_FIELD ||
           code == PROTO_E_MISSING_FIELD || code == PROTO_E_BAD_PROTOCOL;
}

static void handle_line(telemetry *t, const char *line, size_t len) {
    struct proto_reply r;
    proto_parse_reply(line, len, &r);
    if (r.type == PROTO_R_WELCOME) {
        if (t->cstate == C_HELLO) {
            telemetry_inbox_push(t, line, len);
            on_welcome(t, r.last_seq);
        }
    } else if (r.type == PROTO_R_ACK) {
        if (r.seq > t->acked && r.seq < t->next_seq) {
            t->backoff = t->backoff_min; /* this connection is useful */
            t->acked = r.seq;
            ST_SET(t, st_acked, t->acked);
            telemetry_spool_trim(t);
        }
    } else if (strcmp(r.type_name, "ack") && strcmp(r.type_name, "welcome")) {
        if (r.type == PROTO_R_ERROR) ST_ADD(t, st_errors, 1);
        telemetry_inbox_push(t, line, len);
        if (refused_content(r.code) && r.has_seq && r.seq > t->acked && r.seq < t->rd_expect &&
            t->cstate == C_STREAMING) { /* (a seq it was sent) */
            /* The daemon will not take this record, however often it is
             * sent: the next connection sends a placeholder in its place
             * (spool_read.c), so the records after it are not gaps. */
            if (t->n_refused == REFUSED_MAX)
                memmove(t->refused_seqs, t->refused_seqs + 1, (REFUSED_MAX - 1) * sizeof *t->refused_seqs);
            else t->n_refused++;
            t->refused_seqs[t->n_refused - 1] = r.seq;
        }
        if (r.code == PROTO_E_SEQ_GAP) {
            /* A new hello makes the daemon state where to resume; the
             * backoff applies (a gap the client cannot close must not
             * become a reconnect loop). */
            disconnect(t, 0);
        } else if (t->cstate == C_HELLO && hello_refused(r.code)) {
            /* The hello itself was refused: saying it again gets the same
             * answer. Stop, and tell telemetry_wait_welcome and finish. */
            snprintf(t->refusal, sizeof t->refusal, "%s: %s", r.code_name, r.message);
            atomic_store_explicit(&t->refused, 1, memory_order_release);
            t->cstate = C_STOPPED;
            disconnect(t, 0);
        } else if (r.code == PROTO_E_SUPERSEDED) {
            /* Another client owns the run now; fighting it helps no one. */
            t->cstate = C_STOPPED;
            disconnect(t, 0);
        }
    }
}

static void do_read(telemetry *t) {
    for (;;) {
        ssize_t r = recv(t->fd, t->ibuf + t->ilen, IBUF_CAP - t->ilen, MSG_DONTWAIT);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (r <= 0) {
            disconnect(t, 0);
            return;
        }
        t->ilen += (size_t)r;
        size_t start = 0;
        for (size_t i = t->ilen - (size_t)r; i < t->ilen; i++) {
            if (t->ibuf[i] != '\n') continue;
            size_t n = i - start;
            if (n && t->ibuf[i - 1] == '\r') n--;
            if (!t->iskip && n) handle_line(t, t->ibuf + start, n);
            t->iskip = 0;
            start = i + 1;
            if (t->fd < 0) return; /* the line closed the connection */
        }
        memmove(t->ibuf, t->ibuf + start, t->ilen - start);
        t->ilen -= start;
        if (t->ilen == IBUF_CAP) {
            t->iskip = 1;
            t->ilen = 0;
        }
    }
}

static void count_sent(telemetry *t, const char *p, size_t n) {
    uint64_t nl = 0;
    const char *e = p + n;
    while ((p = memchr(p, '\n', (size_t)(e - p)))) {
        nl++;
        p++;
    }
    if (nl && t->hello_nl) {
        nl--;
        t->hello_nl = 0;
    }
    if (nl) ST_ADD(t, st_sent, nl);
}

static void do_write(telemetry *t) {
    while (t->ooff < t->olen) {
        ssize_t w = send(t->fd, t->obuf + t->ooff, t->olen - t->ooff, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (w <= 0) {
            disconnect(t, 0);
            return;
        }
        count_sent(t, t->obuf + t->ooff, (size_t)w);
        t->ooff += (size_t)w;
    }
    t->olen = t->ooff = 0;
}

/* Refills the output buffer from the spool reader, whole records only
 * (each checked before it goes out); obuf grows for a record larger than
 * it (up to a protocol line). */
static void fill_obuf(telemetry *t) {
    if (t->ooff == t->olen) t->olen = t->ooff = 0;
    telemetry_record r;
    while (telemetry_spool_peek(t, &r)) {
        if (t->olen + r.len + 1 > t->obuf_cap) {
            if (t->olen) return; /* what is in it goes first */
            char *nb = realloc(t->obuf, r.len + 1);
            if (!nb) return;
            t->obuf = nb;
            t->obuf_cap = r.len + 1;
        }
        memcpy(t->obuf + t->olen, r.line, r.len);
        t->obuf[t->olen + r.len] = '\n';
        t->olen += r.len + 1;
        telemetry_spool_take(t);
    }
}

/* Sends what the spool holds beyond what was sent, while the socket takes
 * it. 1 when everything went out (caught up), 0 when the socket is full or
 * the connection dropped. */
static int send_all(telemetry *t) {
    for (;;) {
        fill_obuf(t);
        if (t->olen == t->ooff) return 1;
        do_write(t);
        if (t->fd < 0 || t->olen > t->ooff) return 0;
    }
}

/* Empties the wake eventfd (telemetry_int.h, woken). */
static void clear_wake(telemetry *t) {
    uint64_t v;
    atomic_store_explicit(&t->woken, 0, memory_order_relaxed);
    ssize_t ignored = read(t->wake_fd, &v, sizeof v);
    (void)ignored;
}

/* One paced wake-up (telemetry.h, send_interval_ms), after the ring was
 * drained: the daemon's lines that came meanwhile (acks trim the spool,
 * alerts go to the inbox), everything new in one write, then a sleep of
 * one interval that only the wake eventfd (a ring half full, a flush, the
 * end) or a dropped connection cuts short; acks and alerts wait in the
 * socket meanwhile. Returns 0 when it could not pace (a backlog the socket
 * would not take, the connection gone): the caller polls as unpaced. */
static int paced_wait(telemetry *t) {
    if (t->has_address) {
        do_read(t);
        if (t->fd < 0 || t->cstate != C_STREAMING || !send_all(t)) return 0;
    }
    struct pollfd pf[2] = {{t->wake_fd, POLLIN, 0}, {t->fd, 0, 0}};
    atomic_store_explicit(&t->asleep, 1, memory_order_release);
    int pr = poll(pf, t->fd >= 0 ? 2 : 1, t->interval_ms);
    atomic_store_explicit(&t->asleep, 0, memory_order_release);
    if (pr > 0 && pf[0].revents) clear_wake(t);
    if (pr > 0 && t->fd >= 0 && pf[1].revents) do_read(t); /* hang-up or error: disconnects */
    return 1;
}

void *telemetry_sender_main(void *arg) {
    telemetry *t = arg;
    int idle = 1;
    while (!atomic_load_explicit(&t->stop, memory_order_acquire)) {
        /* The producer does not wake us (a syscall on its hot path) unless
         * the ring is half full. Paced (the common case: connected and
         * caught up, or spool only): one wake-up per send interval.
         * Otherwise (connecting, resending a backlog, someone waiting for
         * the acks, a fast producer, or pacing off): poll the ring, more
         * slowly the longer it stays empty, so that an idle client wakes
         * ~60 times a second and a busy one sees new messages within a
         * millisecond or two. */
        if (atomic_load_explicit(&t->woken, memory_order_acquire)) clear_wake(t);
        int busy = telemetry_ring_drain(t);
        int timeout = busy ? 0 : idle;
        idle = busy ? 1 : (idle * 2 > TICK_MAX_MS ? TICK_MAX_MS : idle * 2);
        uint64_t now = telemetry_now_ns();
        if (t->has_address) {
            if (t->cstate == C_DOWN && now >= t->next_attempt) start_connect(t);
            if ((t->cstate == C_HELLO || t->cstate == C_CONNECTING) && now > t->deadline)
                disconnect(t, t->cstate == C_CONNECTING);
        }
        if (t->interval_ms && busy < DRAIN_BATCH && !atomic_load_explicit(&t->hurry, memory_order_acquire) &&
            (t->has_address ? t->cstate == C_STREAMING : 1) && paced_wait(t))
            continue;
        if (t->has_address && t->cstate == C_STREAMING) fill_obuf(t);
        if (t->fd < 0) {
            if (timeout) telemetry_sleep_ms(timeout);
            continue;
        }
        struct pollfd pf = {t->fd, POLLIN, 0};
        if (t->cstate == C_CONNECTING || t->olen > t->ooff) pf.events |= POLLOUT;
        int pr = poll(&pf, 1, timeout);
        if (pr <= 0) continue;
        if (t->cstate == C_CONNECTING) {
            int e = 0;
            socklen_t el = sizeof e;
            if (getsockopt(t->fd, SOL_SOCKET, SO_ERROR, &e, &el) || e) disconnect(t, 1);
            else if (pf.revents & (POLLOUT | POLLERR | POLLHUP)) connected(t);
            continue;
        }
        if (pf.revents & (POLLIN | POLLHUP | POLLERR)) do_read(t);
        if (t->fd >= 0 && (pf.revents & POLLOUT)) do_write(t);
    }
    /* Whatever is still in the ring goes to the spool for a later client. */
    while (telemetry_ring_drain(t)) {}
    return NULL;
}
