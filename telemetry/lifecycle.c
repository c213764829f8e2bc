/* lifecycle.c -- the client's lifecycle: configuration, create (spool,
 * ring, threads), flush, finish, destroy, counters (see telemetry.h; the
 * parts are listed in telemetry_int.h).
 *
 * Data flow (one way):
 *   producer --(SPSC ring of preallocated slots, no syscall)--> sender thread
 *   sender: format JSON body, prefix {"seq":N, -> append to spool segment
 *   sender: stream spool bytes from the welcome's last_seq+1 -> socket
 *   sender: read welcome / ack / error / alert -> trim spool, inbox ring
 *
 * Why the spool is a write-ahead log even when the daemon is healthy: one
 * code path for live sending and for resending after a reconnect or a
 * restart, and a process crash loses nothing that had a seq. The writes are
 * page-cache writes of the sender thread (no fsync); segments are deleted
 * once acknowledged, usually before the kernel writes them back.
 */
#include "telemetry_int.h"
#include "net.h"

#include <cJSON.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

double telemetry_now(void) { return now_wall(); }

int telemetry_format_float(char *buf, float v) { return proto_format_float(buf, v); }

void telemetry_config_init(telemetry_config *cfg) { memset(cfg, 0, sizeof *cfg); }

const char *telemetry_run_name(const telemetry *t) { return t->run; }

void telemetry_get_stats(const telemetry *tc, telemetry_stats *o) {
    telemetry *t = (telemetry *)tc; /* atomics are read-only here */
    memset(o, 0, sizeof *o);
    o->enqueued = ST_GET(t, st_enqueued);
    o->dropped_queue = ST_GET(t, st_dropped_queue);
    o->dropped_spool = ST_GET(t, st_dropped_spool);
    o->dropped_oversize = ST_GET(t, st_dropped_oversize);
    o->spooled = ST_GET(t, st_spooled);
    o->sent = ST_GET(t, st_sent);
    o->acked = ST_GET(t, st_acked);
    o->next_seq = ST_GET(t, st_next_seq);
    o->spool_bytes = ST_GET(t, st_spool_bytes);
    o->connects = ST_GET(t, st_connects);
    o->reconnects = o->connects ? o->connects - 1 : 0;
    o->connect_failures = ST_GET(t, st_connect_failures);
    o->errors = ST_GET(t, st_errors);
    o->inbox_dropped = ST_GET(t, st_inbox_dropped);
    o->connected = atomic_load_explicit(&t->st_connected, memory_order_relaxed);
}

/* While someone waits for the acks: the sender stops pacing (conn.c) and
 * is woken now. Calls nest; each hurry_on needs a hurry_off. */
static void hurry_on(telemetry *t) {
    atomic_fetch_add_explicit(&t->hurry, 1, memory_order_release);
    telemetry_wake(t);
}

static void hurry_off(telemetry *t) { atomic_fetch_sub_explicit(&t->hurry, 1, memory_order_release); }

static int refused(const telemetry *t) { return atomic_load_explicit(&t->refused, memory_order_acquire); }

int telemetry_flush(telemetry *t, int timeout_ms) {
    uint64_t end = telemetry_now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000u;
    int rc = TELEMETRY_OK;
    if (telemetry_settled(t)) return rc;
    hurry_on(t);
    while (!telemetry_settled(t)) {
        if (refused(t)) {
            rc = TELEMETRY_EREFUSED;
            break;
        }
        if (telemetry_now_ns() >= end) {
            rc = TELEMETRY_ETIMEDOUT;
            break;
        }
        telemetry_sleep_ms(1);
    }
    hurry_off(t);
    return rc;
}

int telemetry_wait_welcome(telemetry *t, int timeout_ms, char *err, size_t errlen) {
    uint64_t end = telemetry_now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000u;
    if (!t->has_address) return TELEMETRY_OK;
    for (;;) {
        if (ST_GET(t, st_connects)) return TELEMETRY_OK;
        if (refused(t)) {
            telemetry_set_err(err, errlen, "the daemon refused run %s: %s", t->run, t->refusal);
            return TELEMETRY_EREFUSED;
        }
        if (ST_GET(t, st_connect_failures)) {
            telemetry_set_err(err, errlen,
                              "run %s: could not connect to %s (the client goes on trying, the spool "
                              "keeps the steps)",
                              t->run, t->address);
            return TELEMETRY_ETIMEDOUT;
        }
        if (telemetry_now_ns() >= end) {
            telemetry_set_err(err, errlen, "run %s: no welcome from %s within %d ms (the client goes on trying)",
                              t->run, t->address, timeout_ms);
            return TELEMETRY_ETIMEDOUT;
        }
        telemetry_sleep_ms(1);
    }
}

static int destroy_impl(telemetry *t, const char *status, int timeout_ms, FILE *progress, telemetry_stats *out);

int telemetry_finish(telemetry *t, const char *status, int grace_ms, FILE *progress) {
    return telemetry_finish_stats(t, status, grace_ms, progress, NULL);
}

int telemetry_finish_stats(telemetry *t, const char *status, int grace_ms, FILE *progress, telemetry_stats *out) {
    if (out) memset(out, 0, sizeof *out);
    if (!t) return TELEMETRY_OK;
    if (status && !telemetry_valid_status(status)) return TELEMETRY_EINVAL;
    if (grace_ms < 0) grace_ms = 30000;
    uint64_t start = telemetry_now_ns(), end = start + (uint64_t)grace_ms * 1000000u;
    if (status && t->thread_started) {
        while (telemetry_ring_put(t, MSG_END, status, NULL) == TELEMETRY_EFULL && telemetry_now_ns() < end) {
            atomic_fetch_sub_explicit(&t->st_dropped_queue, 1, memory_order_relaxed);
            telemetry_sleep_ms(1);
        }
    }
    uint64_t next_line = start + 1000000000u;
    if (t->thread_started) hurry_on(t); /* the sender stops pacing: the end goes at once */
    /* the background uploads of other runs get the same grace period */
    while (t->thread_started && (!telemetry_settled(t) || (t->up_started && !atomic_load(&t->up_done))) &&
           !(refused(t) && !telemetry_settled(t)) && telemetry_now_ns() < end) {
        telemetry_sleep_ms(5);
        uint64_t now = telemetry_now_ns();
        /* the sleep may end past the deadline: no line saying "up to
         * (end - now)" then, which, unsigned, would be ~2^64 ns */
        if (progress && now >= next_line && now < end) {
            telemetry_stats st;
            telemetry_get_stats(t, &st);
            fprintf(progress,
                    "entropyd client: run %s: %llu of %llu messages acknowledged, %s%s; "
                    "waiting up to %.0f s more for the daemon\n",
                    t->run, (unsigned long long)st.acked, (unsigned long long)(st.next_seq - 1),
                    st.connected ? "connected" : "reconnecting",
                    telemetry_settled(t) ? ", uploading other runs of the spool" : "", (double)(end - now) / 1e9);
            fflush(progress);
            next_line = now + 1000000000u;
        }
    }
    if (t->thread_started) hurry_off(t);
    /* t is gone after this call: the client's own notes nobody polled (a
     * damaged spool record, an upload of another run, often met during
     * this wait) are written out instead of dropped */
    telemetry_msg m;
    while (progress && t->thread_started && telemetry_poll(t, &m)) {
        if (!strcmp(m.type, "client")) fprintf(progress, "entropyd client: %s\n", m.line);
        telemetry_msg_free(&m);
    }
    int rc = telemetry_settled(t) ? TELEMETRY_OK : refused(t) ? TELEMETRY_EREFUSED : TELEMETRY_ETIMEDOUT;
    if (progress && rc == TELEMETRY_EREFUSED)
        fprintf(progress, "entropyd client: the daemon refused run %s (%s); ", t->run, t->refusal);
    else if (progress && rc != TELEMETRY_OK)
        fprintf(progress,
                "entropyd client: run %s: not everything was acknowledged within the %.0f s grace "
                "period; ",
                t->run, grace_ms / 1e3);
    int rc2 = destroy_impl(t, NULL, 0, rc == TELEMETRY_OK ? NULL : progress, out);
    return rc == TELEMETRY_OK ? rc2 : rc;
}

static int parse_address(telemetry *t, const char *a, char *err, size_t errlen) {
    if (!strncmp(a, "unix:", 5)) {
        size_t n = strlen(a + 5);
        if (n == 0 || n >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
            telemetry_set_err(err, errlen, "address %s: bad unix socket path length", a);
            return -1;
        }
        t->is_unix = 1;
        t->unix_path = strdup(a + 5);
        return t->unix_path ? 0 : -1;
    }
    if (!strncmp(a, "tcp:", 4)) {
        char host[256];
        int pn;
        if (net_split_hostport(a + 4, host, sizeof host, &pn) != 0 || pn < 1) goto bad;
        t->tcp_addr = strdup(a + 4);
        return t->tcp_addr ? 0 : -1;
    }
bad:
    telemetry_set_err(err, errlen, "address %s: expected unix:PATH or tcp:HOST:PORT", a);
    return -1;
}

static int build_hello(telemetry *t, const telemetry_config *c, char *err, size_t errlen) {
    char *meta = NULL;
    if (c->meta_json) {
        cJSON *m = cJSON_Parse(c->meta_json);
        if (!cJSON_IsObject(m)) {
            cJSON_Delete(m);
            telemetry_set_err(err, errlen, "meta_json is not a JSON object");
            return -1;
        }
        meta = cJSON_PrintUnformatted(m); /* one line, whatever the input */
        cJSON_Delete(m);
        if (!meta) return -1;
    }
    size_t cap = 256 + strlen(t->run) + (meta ? strlen(meta) : 0) + 6 * (c->token ? strlen(c->token) : 0);
    t->hello = malloc(cap);
    if (!t->hello) {
        free(meta);
        return -1;
    }
    t->hello_len = proto_write_hello(t->hello, cap, t->run, t->L, t->H, c->seq_len, c->noncausal, meta, c->token,
                                     &t->hello_public_len);
    free(meta);
    if (t->hello_len == 0 || t->hello_len > OBUF_CAP) {
        telemetry_set_err(err, errlen, "hello too long (meta over %d bytes)", OBUF_CAP);
        return -1;
    }
    return 0;
}

static size_t step_body_max(const telemetry *t) {
    return proto_step_body_max(t->max_s, t->max_l, t->max_h, t->L, t->H);
}

/* The given run name, checked, or a generated one. */
static int name_run(telemetry *t, const char *run, char *err, size_t errlen) {
    if (run) {
        if (!telemetry_valid_run(run)) {
            telemetry_set_err(err, errlen, "bad run name \"%s\": 1..128 of [A-Za-z0-9._:@+-]", run);
            return -1;
        }
        snprintf(t->run, sizeof t->run, "%s", run);
    } else {
        time_t now = time(NULL);
        struct tm tm;
        gmtime_r(&now, &tm);
        unsigned rnd = (unsigned)(telemetry_now_ns() ^ ((uint64_t)getpid() << 16)) & 0xffffu;
        snprintf(t->run, sizeof t->run, "run-%04d%02d%02d-%02d%02d%02d-%d-%04x", tm.tm_year + 1900, tm.tm_mon + 1,
                 tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)getpid(), rnd);
    }
    return 0;
}

/* SPOOL_DIR/RUN (or a private temporary root), opened and recovered; the
 * counters and acked start from what it holds. */
static int open_spool(telemetry *t, const char *spool_dir, char *err, size_t errlen) {
    if (spool_dir) {
        t->root = strdup(spool_dir);
    } else {
        const char *tmp = getenv("TMPDIR");
        size_t n = strlen(tmp ? tmp : "/tmp") + 32;
        t->root = malloc(n);
        if (t->root) {
            snprintf(t->root, n, "%s/telemetry-XXXXXX", tmp ? tmp : "/tmp");
            if (!mkdtemp(t->root)) {
                telemetry_set_err(err, errlen, "mkdtemp %s: %s", t->root, strerror(errno));
                return -1;
            }
            t->root_is_tmp = 1;
        }
    }
    if (!t->root) {
        telemetry_set_err(err, errlen, "out of memory");
        return -1;
    }
    size_t dn = strlen(t->root) + strlen(t->run) + 2;
    t->dir = malloc(dn);
    if (!t->dir) {
        telemetry_set_err(err, errlen, "out of memory");
        return -1;
    }
    snprintf(t->dir, dn, "%s/%s", t->root, t->run);
    if (telemetry_spool_open(t, err, errlen)) return -1;
    if (!t->root_is_tmp && telemetry_spool_write_hello(t)) {
        telemetry_set_err(err, errlen, "spool: writing %s/hello.json: %s", t->dir, strerror(errno));
        return -1;
    }
    ST_SET(t, st_next_seq, t->next_seq);
    ST_SET(t, st_spool_bytes, t->spool_total);
    /* Nothing older than the spool's first line can still be unacknowledged. */
    t->acked = t->segs[0].first - 1;
    ST_SET(t, st_acked, t->acked);

    return 0;
}

/* Starts fn(t) on a thread named name (so that top -H and
 * /proc/PID/task/TID/comm tell it from the program's threads;
 * bench/bench_python_log.py reads the sender's CPU time by it). It takes no
 * signals: they belong to the program. */
static int start_thread(telemetry *t, pthread_t *th, void *(*fn)(void *), const char *name, char *err, size_t errlen) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(th, NULL, fn, t);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc) {
        telemetry_set_err(err, errlen, "pthread_create: %s", strerror(rc));
        return -1;
    }
    pthread_setname_np(*th, name);
    return 0;
}

/* The sender and, when asked and useful, the background uploader. */
static int start_threads(telemetry *t, int upload_others, char *err, size_t errlen) {
    if (start_thread(t, &t->thread, telemetry_sender_main, "entropyd-send", err, errlen)) return -1;
    t->thread_started = 1;
    if (t->has_address && !t->root_is_tmp && upload_others) {
        if (start_thread(t, &t->up_thread, telemetry_uploader_main, "entropyd-upload", err, errlen)) return -1;
        t->up_started = 1;
    }
    return 0;
}

telemetry *telemetry_create(const telemetry_config *c, char *err, size_t errlen) {
    telemetry *t = calloc(1, sizeof *t);
    if (!t) {
        telemetry_set_err(err, errlen, "out of memory");
        return NULL;
    }
    t->lock_fd = t->wfd = t->fd = t->rd.fd = t->wake_fd = -1;
    if (pthread_mutex_init(&t->in_lock, NULL)) {
        free(t);
        telemetry_set_err(err, errlen, "mutex");
        return NULL;
    }
    t->in_lock_init = 1;
    if (c->layers < 1 || c->layers > 4096 || c->heads < 1 || c->heads > 4096 || (long)c->layers * c->heads > 1048576 ||
        c->seq_len < 1) {
        telemetry_set_err(err, errlen, "bad shape: layers %d heads %d seq_len %d", c->layers, c->heads, c->seq_len);
        goto err;
    }
    t->L = c->layers;
    t->H = c->heads;
    t->max_s = c->max_scalars > 0 ? c->max_scalars : 64;
    t->max_l = c->max_layer_metrics > 0 ? c->max_layer_metrics : 32;
    t->max_h = c->max_head_metrics > 0 ? c->max_head_metrics : 16;
    if (t->max_s > METRICS_MAX || t->max_l > METRICS_MAX || t->max_h > METRICS_MAX) {
        telemetry_set_err(err, errlen, "at most %d metrics of a kind per step (protocol v1)", METRICS_MAX);
        goto err;
    }
    t->cap = c->queue_slots; /* 0: sized by telemetry_ring_alloc */
    t->spool_max = c->spool_max_bytes ? c->spool_max_bytes : (uint64_t)256 << 20;
    t->seg_bytes = t->spool_max / 8;
    if (t->seg_bytes < 4096) t->seg_bytes = 4096;
    if (t->seg_bytes > (16u << 20)) t->seg_bytes = 16u << 20;
    t->backoff_min = c->backoff_min_ms > 0 ? c->backoff_min_ms : 50;
    t->backoff_max = c->backoff_max_ms > 0 ? c->backoff_max_ms : 2000;
    if (t->backoff_max < t->backoff_min) t->backoff_max = t->backoff_min;
    t->backoff = t->backoff_min;
    t->interval_ms = c->send_interval_ms < 0 ? 0 : c->send_interval_ms ? c->send_interval_ms : SEND_INTERVAL_MS;

    if (name_run(t, c->run, err, errlen)) goto err;
    if (c->address) {
        t->has_address = 1;
        if (parse_address(t, c->address, err, errlen)) goto err;
        t->address = strdup(c->address);
        if (!t->address) {
            telemetry_set_err(err, errlen, "out of memory");
            goto err;
        }
    }
    if (c->token && !(t->token = strdup(c->token))) {
        telemetry_set_err(err, errlen, "out of memory");
        goto err;
    }
    if (build_hello(t, c, err, errlen)) goto err;

    if (open_spool(t, c->spool_dir, err, errlen)) goto err;
    size_t body = step_body_max(t);
    if (body < 6 * EVENT_TEXT_MAX + 256) body = 6 * EVENT_TEXT_MAX + 256;
    t->fmtcap = BODY_AT + body;
    t->fmt = malloc(t->fmtcap);
    t->wbuf = malloc(WBUF_CAP);
    t->obuf = malloc(OBUF_CAP);
    t->obuf_cap = OBUF_CAP;
    t->ibuf = malloc(IBUF_CAP);
    t->ph_buf = malloc(PH_CAP);
    if (!t->fmt || !t->wbuf || !t->obuf || !t->ibuf || !t->ph_buf || telemetry_ring_alloc(t)) {
        telemetry_set_err(err, errlen, "out of memory");
        goto err;
    }

    t->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (t->wake_fd < 0) {
        telemetry_set_err(err, errlen, "eventfd: %s", strerror(errno));
        goto err;
    }
    if (start_threads(t, !c->no_spool_upload, err, errlen)) goto err;
    return t;
err:
    telemetry_destroy(t, NULL, 0);
    return NULL;
}

int telemetry_destroy(telemetry *t, const char *status, int timeout_ms) {
    return destroy_impl(t, status, timeout_ms, NULL, NULL);
}

/* telemetry_destroy; with progress, it ends the line finish began by
 * saying where the unacknowledged messages are; out gets the counters
 * once the sender has stopped. */
static int destroy_impl(telemetry *t, const char *status, int timeout_ms, FILE *progress, telemetry_stats *out) {
    if (!t) return TELEMETRY_OK;
    if (status && !telemetry_valid_status(status)) return TELEMETRY_EINVAL;
    int rc = TELEMETRY_OK;
    if (t->thread_started) {
        uint64_t end = telemetry_now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000u;
        if (status) {
            /* The end must not be lost to a momentarily full ring. */
            while (telemetry_ring_put(t, MSG_END, status, NULL) == TELEMETRY_EFULL && telemetry_now_ns() < end) {
                atomic_fetch_sub_explicit(&t->st_dropped_queue, 1, memory_order_relaxed);
                telemetry_sleep_ms(1);
            }
        }
        uint64_t left = telemetry_now_ns() < end ? (end - telemetry_now_ns()) / 1000000u : 0;
        rc = telemetry_flush(t, (int)left);
    }
    if (t->up_started) {
        atomic_store_explicit(&t->up_stop, 1, memory_order_release);
        pthread_join(t->up_thread, NULL);
    }
    if (t->thread_started) {
        atomic_store_explicit(&t->stop, 1, memory_order_release);
        telemetry_wake(t); /* out of a paced sleep */
        pthread_join(t->thread, NULL);
        if (!t->root_is_tmp && telemetry_settled(t)) telemetry_spool_compact(t);
    }
    /* A private spool holding what the daemon never acknowledged is kept,
     * not removed: removing it would lose the messages (the daemon away
     * for the whole grace period, or refusing the run). */
    int keep =
        t->root_is_tmp && t->dir && t->thread_started && !telemetry_settled(t) && telemetry_spool_write_hello(t) == 0;
    if (progress && t->thread_started) {
        telemetry_stats st;
        telemetry_get_stats(t, &st);
        unsigned long long left = (unsigned long long)(st.next_seq - 1 - st.acked);
        if (!t->root_is_tmp || keep)
            fprintf(progress,
                    "%llu of %llu messages acknowledged; the other %llu are in the spool %s "
                    "(the next client on that spool directory, or `python3 -m entropyd upload %s`, "
                    "uploads them)\n",
                    (unsigned long long)st.acked, (unsigned long long)(st.next_seq - 1), left, t->dir, t->root);
        else
            fprintf(progress,
                    "%llu of %llu messages acknowledged; the other %llu are lost (the private "
                    "spool could not be kept)\n",
                    (unsigned long long)st.acked, (unsigned long long)(st.next_seq - 1), left);
        fflush(progress);
    }
    if (out) telemetry_get_stats(t, out);
    telemetry_msg m;
    while (t->thread_started && telemetry_poll(t, &m)) telemetry_msg_free(&m);
    if (t->fd >= 0) close(t->fd);
    if (t->wake_fd >= 0) close(t->wake_fd);
    telemetry_rd_free(&t->rd);
    if (t->wfd >= 0) close(t->wfd);
    if (t->root_is_tmp && t->dir && !keep) telemetry_spool_remove(t);
    if (t->lock_fd >= 0) close(t->lock_fd);
    for (size_t i = 0; t->slots && i < t->cap; i++) free(t->slots[i].text);
    free(t->slots);
    free(t->slot_mem);
    free(t->segs);
    free(t->fmt);
    free(t->wbuf);
    free(t->obuf);
    free(t->ibuf);
    free(t->ph_buf);
    free(t->hello);
    free(t->unix_path);
    free(t->address);
    free(t->token);
    if (t->in_lock_init) pthread_mutex_destroy(&t->in_lock);
    free(t->tcp_addr);
    free(t->root);
    free(t->dir);
    free(t);
    return rc;
}
