/* http.c: entropyd's HTTP server: libmicrohttpd's callbacks, the order of
 * the checks every request passes (no body, a reserved slot's two paths,
 * the Host, the query string, a cross-site write) before http_api.c's
 * routes or http_static.c's files answer it, the answers' helpers, the
 * server's own figures for /metrics, and its lifecycle. The contract is in
 * http.h. Not here: the routes and their handlers (http_api.c; documented
 * in docs/http-api.md), what each guard checks (http_guard.c), the figures
 * of the other modules (metrics.c).
 *
 * Request flow (libmicrohttpd): the access handler is called once with the
 * headers (we allocate the request state into *req_cls), then with each
 * piece of a body (we refuse bodies), then once more to answer. The state
 * is freed in the completion callback; streamed answers (export, SSE) own
 * their own state, freed by the response's free callback. */
#include "http_int.h"
#include "alert_rules.h"

#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "net.h"
#include "now.h"

/* Commit latency histogram bounds, seconds. */
static const double hist_le[HTTP_HIST_N] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5};
#define HIST_N HTTP_HIST_N

/* ---- responses ------------------------------------------------------- */

enum MHD_Result http_respond(struct http *h, struct MHD_Connection *c, unsigned status, struct MHD_Response *r) {
    if (!r) return MHD_NO;
    pthread_mutex_lock(&h->mu);
    if (status / 100 < 6) h->responses[status / 100]++;
    pthread_mutex_unlock(&h->mu);
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

/* Answers with the buffer's text (taken over and freed). */
enum MHD_Result http_send_buf(struct http *h, struct MHD_Connection *c, unsigned status, const char *ctype,
                              struct strbuf *b) {
    if (b->failed) {
        strbuf_free(b);
        static const char oom[] = "{\"error\":{\"code\":\"internal\",\"message\":\"out of memory\"}}";
        struct MHD_Response *r = MHD_create_response_from_buffer(sizeof oom - 1, (void *)oom, MHD_RESPMEM_PERSISTENT);
        if (r) MHD_add_response_header(r, "Content-Type", "application/json");
        return http_respond(h, c, MHD_HTTP_INTERNAL_SERVER_ERROR, r);
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(b->len, b->p ? b->p : (void *)"",
                                                             b->p ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        strbuf_free(b);
        return MHD_NO;
    }
    memset(b, 0, sizeof *b);
    MHD_add_response_header(r, "Content-Type", ctype);
    MHD_add_response_header(r, "Cache-Control", "no-store");
    return http_respond(h, c, status, r);
}

enum MHD_Result http_send_json(struct http *h, struct MHD_Connection *c, unsigned status, struct strbuf *b) {
    return http_send_buf(h, c, status, "application/json", b);
}

static const char *error_code(unsigned status) {
    switch (status) {
    case 400: return "bad_request";
    case 401: return "unauthorized";
    case 403: return "forbidden";
    case 404: return "not_found";
    case 405: return "method_not_allowed";
    case 409: return "conflict";
    case 413: return "payload_too_large";
    case 503: return "unavailable";
    default: return status >= 500 ? "internal" : "error";
    }
}

enum MHD_Result http_send_error(struct http *h, struct MHD_Connection *c, unsigned status, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    struct strbuf b = {0};
    strbuf_printf(&b, "{\"error\":{\"code\":\"%s\",\"message\":", error_code(status));
    strbuf_json_str(&b, msg);
    strbuf_puts(&b, "}}");
    if (status == 401) {
        struct MHD_Response *r = MHD_create_response_from_buffer(b.len, b.p, MHD_RESPMEM_MUST_FREE);
        if (!r) {
            strbuf_free(&b);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", "application/json");
        MHD_add_response_header(r, "WWW-Authenticate", "Bearer realm=\"entropyd\"");
        return http_respond(h, c, status, r);
    }
    return http_send_json(h, c, status, &b);
}

/* ---- requests -------------------------------------------------------- */

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **req_cls) {
    (void)version;
    (void)upload_data;
    struct http *h = cls;
    struct req *r = *req_cls;
    if (!r) { /* http_on_uri found no memory */
        if (!(r = calloc(1, sizeof *r))) return MHD_NO;
        *req_cls = r;
    }
    if (!r->seen) { /* the first call: headers only */
        r->seen = 1;
        http_slots_busy(h->slots, c); /* a request in progress: its slot is not pushed out */
        return MHD_YES;
    }
    if (*upload_data_size) { /* bodies are refused; read and drop, answer at the end */
        r->had_body = 1;
        *upload_data_size = 0;
        return MHD_YES;
    }
    int is_get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    int is_api = strncmp(url, "/api/", 5) == 0 || strcmp(url, "/api") == 0 || strcmp(url, "/metrics") == 0 ||
                 strcmp(url, "/healthz") == 0;
    if (r->had_body) return http_send_error(h, c, 413, "request bodies are not accepted");
    /* a reserved slot (http_slots.h) is a health check's, not a newcomer's */
    int slot = http_slots_reserved(c);
    if (slot && strcmp(url, "/healthz") != 0 && strcmp(url, "/metrics") != 0)
        return http_send_error(h, c, 503, "%s: only /healthz and /metrics are answered now",
                               slot == HTTP_SLOTS_FOR_ADDR
                                   ? "this address holds its share of HTTP connections (--http-max-conns-per-ip)"
                                   : "every HTTP connection slot serves a request (--http-max-conns)");
    if (!http_host_allowed(h, c))
        return http_send_error(h, c, 403,
                               "Host %.200s is not this daemon's: use its address or localhost, or start it "
                               "with --allow-host NAME",
                               MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST));
    if (r->bad_query) return http_send_error(h, c, 400, "%s", r->bad_query);
    if (!is_get && !(h->token && http_authorized(h, c) == 1) && !http_same_origin(c))
        return http_send_error(h, c, 403,
                               "a %s from another site's page: only the daemon's own pages (or a request with "
                               "the token) may change data",
                               method);
    if (!is_api) {
        if (!is_get) return http_send_error(h, c, 405, "method %s not allowed here", method);
        return http_static(h, c, url);
    }
    return http_api_answer(h, c, url, method);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **req_cls, enum MHD_RequestTerminationCode toe) {
    struct http *h = cls;
    (void)toe;
    http_slots_idle(h->slots, c);
    free(*req_cls);
    *req_cls = NULL;
}

/* The HTTP server's own figures: commit latency (from the writer's hook),
 * connection slots, responses by status class. */
void http_metrics(struct http *h, struct strbuf *b) {
    pthread_mutex_lock(&h->mu);
    uint64_t hist[HIST_N + 1], cnt = h->hist_count, resp[6];
    double sum = h->hist_sum;
    memcpy(hist, h->hist, sizeof hist);
    memcpy(resp, h->responses, sizeof resp);
    pthread_mutex_unlock(&h->mu);
    strbuf_prom_head(b, "entropyd_commit_seconds", "histogram", "Time to commit one writer transaction.");
    uint64_t acc = 0;
    for (size_t i = 0; i < HIST_N; i++) {
        acc += hist[i];
        strbuf_printf(b, "entropyd_commit_seconds_bucket{le=\"%g\"} %llu\n", hist_le[i], (unsigned long long)acc);
    }
    strbuf_printf(b, "entropyd_commit_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)cnt);
    strbuf_printf(b, "entropyd_commit_seconds_sum %.9g\nentropyd_commit_seconds_count %llu\n", sum,
                  (unsigned long long)cnt);
    strbuf_prom(b, "entropyd_http_connections_evicted_total", "counter",
                "Idle HTTP connections closed to make room for a newcomer (every slot was taken).",
                (double)http_slots_evicted(h->slots));
    strbuf_prom(b, "entropyd_http_connections_timed_out_total", "counter",
                "HTTP connections closed for sending no request (or no complete headers) in --http-timeout-s.",
                (double)http_slots_timed_out(h->slots));
    strbuf_prom(
        b, "entropyd_http_connections_reserved_total", "counter",
        "HTTP connections admitted into a slot reserved for /healthz and /metrics (every other slot served a request).",
        (double)http_slots_reserved_total(h->slots));
    strbuf_prom_head(b, "entropyd_http_responses_total", "counter", "HTTP responses by status class.");
    for (int k = 2; k <= 5; k++)
        strbuf_printf(b, "entropyd_http_responses_total{class=\"%dxx\"} %llu\n", k, (unsigned long long)resp[k]);
}

/* ---- lifecycle ------------------------------------------------------- */

struct http *http_create(const struct http_config *cfg, char *err, size_t errlen) {
    struct http *h = calloc(1, sizeof *h);
    if (!h) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    h->cfg = *cfg;
    pthread_mutex_init(&h->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&h->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (cfg->token && *cfg->token && !(h->token = strdup(cfg->token))) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    if (!(h->rules = alert_rules_load(cfg->rules_path, err, errlen))) goto fail;
    if (cfg->web_root) {
        char real[PATH_MAX];
        if (!realpath(cfg->web_root, real)) {
            snprintf(err, errlen, "--web-root %s: %s", cfg->web_root, strerror(errno));
            goto fail;
        }
        if (!(h->web_root = strdup(real))) {
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
    }
    struct net_addr addr;
    if (net_resolve(cfg->listen ? cfg->listen : "127.0.0.1:8080", "--http", &addr, err, errlen)) goto fail;
    struct sockaddr_storage ss = addr.ss;
    http_guard_listen(h, cfg->listen ? cfg->listen : "127.0.0.1:8080");
    int max_conns = cfg->max_conns > 0 ? cfg->max_conns : 512;
    int per_ip = cfg->max_conns_per_ip > 0 ? cfg->max_conns_per_ip : max_conns / 4 < 8 ? 8 : max_conns / 4;
    int timeout_s = cfg->timeout_s > 0 ? cfg->timeout_s : 60;
    if (!(h->slots = http_slots_create((unsigned)max_conns, (unsigned)per_ip, timeout_s * 1e3))) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG;
    if (ss.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
    /* the port argument only names the port in libmicrohttpd's messages:
     * the address given with MHD_OPTION_SOCK_ADDR is what is bound */
    uint16_t port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                             : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    h->d = MHD_start_daemon(flags, port, http_slots_admit, h->slots, on_request, h, MHD_OPTION_SOCK_ADDR,
                            (struct sockaddr *)&ss,
                            /* max_conns are held; the spare ones admit newcomers
                             * while the idle connections they pushed out close */
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)max_conns + HTTP_SLOTS_SPARE + HTTP_SLOTS_RESERVED,
                            MHD_OPTION_NOTIFY_CONNECTION, http_slots_notify, h->slots,
                            /* a client that stops reading (an export, a stream) is
                             * closed after this long without progress; one that
                             * sends no request this long, by http_tick */
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)timeout_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
                            (size_t)(128 * 1024), MHD_OPTION_THREAD_STACK_SIZE, (size_t)(512 * 1024),
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_URI_LOG_CALLBACK, http_on_uri, h,
                            /* the slots apply per_ip (a health check over it gets a
                             * reserved slot): this bound only backs them up */
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)per_ip + HTTP_SLOTS_RESERVED, MHD_OPTION_END);
    if (!h->d) {
        snprintf(err, errlen, "cannot serve HTTP on %s (address in use?)",
                 cfg->listen ? cfg->listen : "127.0.0.1:8080");
        goto fail;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : 0;
    return h;
fail:
    http_destroy(h);
    return NULL;
}

int http_port(const struct http *h) { return h->port; }

void http_tick(struct http *h) { http_slots_sweep(h->slots, now_mono_ms()); }

void http_on_commit(struct http *h, const struct writer_item *items, double commit_ms) {
    double s = commit_ms / 1e3;
    size_t i = 0;
    while (i < HIST_N && s > hist_le[i]) i++;
    pthread_mutex_lock(&h->mu);
    h->hist[i]++;
    h->hist_sum += s;
    h->hist_count++;
    int woke = 0;
    for (const struct writer_item *it = items; it; it = it->next)
        if (it->kind == WRITER_DELETE && it->conn > h->done_ticket) {
            h->done_ticket = it->conn;
            woke = 1;
        }
    if (woke) pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

void http_destroy(struct http *h) {
    if (!h) return;
    if (h->d) MHD_stop_daemon(h->d);
    http_slots_destroy(h->slots);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h->token);
    free(h->web_root);
    alert_rules_free(h->rules);
    free(h);
}
