/* http.c: the base of entropyd's HTTP server: what every part of it
 * answers with (http_respond and the send_ helpers, http_int.h) and the
 * server's own figures for /metrics (http.h): the responses by status
 * class, counted as they are queued, and the commit latency, from the
 * writer's hook (which also wakes a DELETE waiting for its commit). Not
 * here: the server's callbacks and lifecycle (http_server.c), when to
 * answer what (http_api.c, http_guard.c, http_static.c). */
#include "http.h"
#include "http_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Commit latency histogram bounds, seconds. */
static const double hist_le[HTTP_HIST_N] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5};
#define HIST_N HTTP_HIST_N

/* ---- answers -------------------------------------------------------- */

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

/* ---- figures -------------------------------------------------------- */

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
