/* http_server.c: entropyd's HTTP server: libmicrohttpd's callbacks, the
 * order of the checks every request passes (no body, a reserved slot's two
 * paths, the Host, the query string, a cross-site write) before
 * http_api.c's routes or http_static.c's files answer it, and its
 * lifecycle. The
 * contract is in http.h. Not here: the routes and their handlers
 * (http_api.c; documented in docs/http-api.md), what each guard checks
 * (http_guard.c), the answers' helpers and the server's own figures
 * (http.c), the figures of the other modules (metrics.c).
 *
 * Request flow (libmicrohttpd): the access handler is called once with the
 * headers (we allocate the request state into *req_cls), then with each
 * piece of a body (we refuse bodies), then once more to answer. The state
 * is freed in the completion callback; streamed answers (export, SSE) own
 * their own state, freed by the response's free callback. */
#include "http.h"
#include "http_int.h"
#include "alert_rules.h"

#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "net.h"
#include "now.h"

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
