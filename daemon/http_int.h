/* http_int.h: what the HTTP server's files share (http.c, http_api.c,
 * http_guard.c, http_static.c, http_server.c): the server's state and the
 * functions that answer. Not for use outside them: the server's contract is http.h. */
#ifndef HTTP_INT_H
#define HTTP_INT_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdint.h>

#include "http_slots.h"

/* Uses http.h's types (struct http_config) but does not include it: each
 * file of the server includes http.h, then this header (as store.c does
 * with store.h and store_int.h), so that no include runs from the inside
 * back to the contract. */

#define HTTP_HIST_N 13 /* commit latency buckets, +Inf apart (http.c) */

struct http {
    struct http_config cfg;
    struct MHD_Daemon *d;
    struct http_slots *slots; /* who holds the connection slots (http_slots.h) */
    int port;
    char *token;
    char *web_root;            /* realpath of cfg.web_root, or NULL */
    struct alert_rules *rules; /* cfg.rules_path's, for GET /api/runs/{id} */

    pthread_mutex_t mu; /* guards everything below */
    pthread_cond_t cv;  /* a DELETE committed */
    uint64_t next_ticket, done_ticket;
    uint64_t hist[HTTP_HIST_N + 1]; /* last: +Inf */
    double hist_sum;
    uint64_t hist_count;
    uint64_t responses[6];  /* by status class: [2]=2xx ... [5]=5xx */
    uint64_t auth_failures; /* wrong tokens, all time */
    uint64_t auth_logged;   /* auth_failures when last logged */
    double auth_log_ms;     /* monotonic time of that log line */
    char listen_host[256];  /* the address part of cfg.listen */
    int listen_any;         /* listening on every address (0.0.0.0, ::) */
};

struct req {
    int seen; /* the first call (headers) is past */
    int had_body;
    const char *bad_query; /* why the query string is refused (static text), or NULL */
};

/* ---- answers (http.c) ------------------------------------------------ */

/* Queues r (NULL: MHD_NO) with status, counts the status class, and
 * releases the caller's reference to r. */
enum MHD_Result http_respond(struct http *h, struct MHD_Connection *c, unsigned status, struct MHD_Response *r);

/* Answers with b's text as ctype; b's memory is taken over (b is left
 * empty). A failed b answers 500 "out of memory". */
enum MHD_Result http_send_buf(struct http *h, struct MHD_Connection *c, unsigned status, const char *ctype,
                              struct strbuf *b);

/* http_send_buf as application/json. */
enum MHD_Result http_send_json(struct http *h, struct MHD_Connection *c, unsigned status, struct strbuf *b);

/* Answers {"error":{"code","message"}} with the printf-formatted message;
 * a 401 also carries WWW-Authenticate. */
enum MHD_Result http_send_error(struct http *h, struct MHD_Connection *c, unsigned status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---- guards (http_guard.c) ------------------------------------------- */

/* 1 when the request carries the token (or none is needed), 0 when it
 * carries none, -1 when it carries a wrong one. */
int http_authorized(struct http *h, struct MHD_Connection *c);

/* The 401 for a request that http_authorized refused with rc (0 or -1); a
 * wrong token is counted, logged at most every 10 s, and delayed. */
enum MHD_Result http_deny(struct http *h, struct MHD_Connection *c, int rc);

/* 1 when the Host header names this daemon: an IP address it listens on
 * (any when listening on every address), "localhost", or an --allow-host
 * name. No Host (HTTP/1.0) passes. */
int http_host_allowed(struct http *h, struct MHD_Connection *c);

/* 1 when a state-changing request may go on without the token: it comes
 * from the daemon's own pages, or not from a browser page at all. */
int http_same_origin(struct MHD_Connection *c);

/* libmicrohttpd's URI callback: allocates the request's struct req
 * (freed by the completion callback; NULL without memory) and marks a
 * refused query string in it. */
void *http_on_uri(void *cls, const char *uri, struct MHD_Connection *c);

/* Sets h->listen_host and h->listen_any from the HOST:PORT being served
 * (left empty when it does not parse: http_create reports that). */
void http_guard_listen(struct http *h, const char *listen);

/* ---- the API's routes (http_api.c) ---------------------------------- */

/* Answers a request for /api/..., /metrics or /healthz once it passed the
 * server's checks: the route's handler, or 401 (a route that needs the
 * token), 400 (a bad run id, an unknown parameter), 405, 404. */
enum MHD_Result http_api_answer(struct http *h, struct MHD_Connection *c, const char *url, const char *method);

/* ---- the dashboard's files (http_static.c) --------------------------- */

/* Answers a GET of a path outside /api: 200 with the file, 304 when
 * If-None-Match has its tag, 400 for a path leaving the root, 404. */
enum MHD_Result http_static(struct http *h, struct MHD_Connection *c, const char *url);

#endif
