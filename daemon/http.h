/* http.h: entropyd's HTTP server (libmicrohttpd): the JSON API over the
 * stored runs (query.h), the live stream (stream.h), Prometheus /metrics,
 * /healthz and the dashboard's static files (embedded web/, or a directory
 * while developing). The routes and their parameters are in
 * docs/http-api.md. What /metrics says of the other modules is not here:
 * the configured metrics writer (metrics.h) appends it.
 *
 * Threads: libmicrohttpd runs a thread per connection (so a stream client
 * may block waiting for events); each request borrows a read-only database
 * connection from the pool. Writes (DELETE) go through the writer thread. */
#ifndef HTTP_H
#define HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "query.h"
#include "stream.h"
#include "writer.h"

struct http_config {
    const char *listen;      /* "HOST:PORT"; port 0 picks a free one */
    const char *token;       /* when not NULL: /api and /metrics need it */
    const char *web_root;    /* serve static files from this directory; NULL: embedded web/ */
    int max_conns;           /* simultaneous connections (default 512); when all are
                                * taken, a newcomer pushes out the one idle longest, and
                                * is refused only if each is serving a request
                                * (http_slots.h) */
    int timeout_s;           /* a connection without progress, or without a request,
                                * this long is closed (default 60; http_tick) */
    struct query_pool *pool; /* borrowed, as are the two below */
    struct stream *stream;
    struct writer *writer;
    const char *rules_path; /* the alert rules file (NULL: the built-in set), read at
                                * create to list, per run, the rules it cannot run */
    /* Against DNS rebinding and cross-site requests (docs/reliability.md,
     * "Security"): a request's Host must be an IP address (the listening
     * one, or any when listening on every address), "localhost", or one of
     * these names (borrowed). */
    const char *const *allow_hosts;
    int n_allow_hosts;
    int max_conns_per_ip; /* connections per client address (default max_conns / 4, at least 8) */
    /* /metrics appends what this writes after http_metrics' figures (the
     * daemon's metrics_write); NULL: only those. Called from request
     * threads with metrics_ctx. Returns 0, or the HTTP status to answer
     * instead (503: no database connection, 500: a query failed) with a
     * message in err. */
    int (*metrics)(void *ctx, struct strbuf *b, char *err, size_t errlen);
    void *metrics_ctx;
};

struct http;

/* Binds and starts serving. Returns NULL with a message on failure
 * (address in use, bad HOST:PORT...). */
struct http *http_create(const struct http_config *cfg, char *err, size_t errlen);

/* The TCP port bound. */
int http_port(const struct http *h);

/* Closes the connections that sent no request (or not all of its
 * headers, however slowly they trickle in) for timeout_s since their
 * accept or their last answer. Any thread, about once a second. */
void http_tick(struct http *h);

/* For the writer's commit hook (writer thread): records the commit's
 * latency and completes DELETE requests waiting for their commit. */
void http_on_commit(struct http *h, const struct writer_item *items, double commit_ms);

/* Appends the server's own figures to b as Prometheus text: commit
 * latency (entropyd_commit_seconds), HTTP connections evicted and timed
 * out, responses by status class. Safe from any thread. */
void http_metrics(struct http *h, struct strbuf *b);

/* Stops the server (open streams end: call stream_shutdown first) and
 * frees. Accepts NULL. */
void http_destroy(struct http *h);

#endif
