/* http_guard.c: what a request must pass before a handler sees it: the
 * token, the Host and Origin checks against DNS rebinding and cross-site
 * pages, and the query string's shape. Not the routes (http_api.c), the
 * answers (http.c), the order of the checks (http_server.c), nor the
 * connection slots (http_slots.c). The contract is in
 * http_int.h. */
#include "http.h"
#include "http_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#include "net.h"
#include "now.h"

/* 1 when the request carries the token (or none is needed), 0 when it
 * carries none, -1 when it carries a wrong one. The scheme is
 * case-insensitive (RFC 7235): "bearer" is "Bearer". */
int http_authorized(struct http *h, struct MHD_Connection *c) {
    if (!h->token) return 1;
    int presented = 0;
    const char *a = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (a && strncasecmp(a, "Bearer ", 7) == 0) {
        const char *t = a + 7;
        while (*t == ' ') t++;
        if (net_equal_ct(t, h->token)) return 1;
        presented = 1;
    }
    const char *t = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "token");
    if (t && net_equal_ct(t, h->token)) return 1;
    return presented || t ? -1 : 0;
}

/* Host, Origin, wrong tokens, query strings.
 *
 * A page on any site can make the user's browser send requests here; DNS
 * rebinding even makes them same-origin for the browser (attacker.example
 * resolving to 127.0.0.1). So: a Host that is a name must be "localhost"
 * or an --allow-host name (an IP address cannot be rebound: the listening
 * one is accepted, any when listening on every address); a request that
 * changes state from a browser page must come from the daemon's own origin
 * (Origin equal to the Host, or Sec-Fetch-Site: same-origin); a request
 * with neither header is not from a page (curl, scripts). */

#define HTTP_AUTH_DELAY_MS 250 /* each wrong token waits this long */
#define HTTP_AUTH_LOG_MS 10000 /* wrong tokens are logged once per this */
#define HTTP_MAX_PARAMS 64

/* The client's address as text, for the log. */
static void client_ip(struct MHD_Connection *c, char *out, size_t cap) {
    snprintf(out, cap, "?");
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (!ci || !ci->client_addr) return;
    const struct sockaddr *sa = ci->client_addr;
    if (sa->sa_family == AF_INET) inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, out, (socklen_t)cap);
    else if (sa->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, out, (socklen_t)cap);
}

/* A wrong token: counted, logged at most once per HTTP_AUTH_LOG_MS (with
 * how many since the last line), and made to wait HTTP_AUTH_DELAY_MS, so
 * guessing costs a connection a quarter second per guess. */
static void auth_failed(struct http *h, struct MHD_Connection *c) {
    char ip[INET6_ADDRSTRLEN];
    client_ip(c, ip, sizeof ip);
    double now = now_mono_ms();
    pthread_mutex_lock(&h->mu);
    h->auth_failures++;
    uint64_t n = 0;
    if (h->auth_log_ms == 0 || now - h->auth_log_ms >= HTTP_AUTH_LOG_MS) {
        n = h->auth_failures - h->auth_logged;
        h->auth_logged = h->auth_failures;
        h->auth_log_ms = now;
    }
    pthread_mutex_unlock(&h->mu);
    if (n)
        fprintf(stderr, "entropyd: http: %llu request(s) with a wrong token (the last from %s)\n",
                (unsigned long long)n, ip);
    struct timespec d = {0, HTTP_AUTH_DELAY_MS * 1000000L};
    while (nanosleep(&d, &d) < 0 && errno == EINTR) {}
}

/* The answer to a request that http_authorized() refused with rc (0 or -1). */
enum MHD_Result http_deny(struct http *h, struct MHD_Connection *c, int rc) {
    if (rc < 0) auth_failed(h, c);
    return http_send_error(h, c, 401, "a token is required: Authorization: Bearer TOKEN (or ?token=)");
}

/* The name part of a Host value: "[::1]:8080" gives "::1", "a.b:80"
 * "a.b". Returns -1 when it does not fit. */
static int host_name(const char *host, char *out, size_t cap) {
    const char *end;
    if (*host == '[') {
        host++;
        end = strchr(host, ']');
        if (!end) return -1;
    } else {
        end = strchr(host, ':');
        if (!end) end = host + strlen(host);
    }
    size_t n = (size_t)(end - host);
    if (n >= cap) return -1;
    memcpy(out, host, n);
    out[n] = 0;
    if (n && out[n - 1] == '.') out[n - 1] = 0; /* "localhost." */
    return 0;
}

static int ip_literal(const char *name, unsigned char *bin, int *family) {
    if (inet_pton(AF_INET, name, bin) == 1) return *family = AF_INET, 1;
    if (inet_pton(AF_INET6, name, bin) == 1) return *family = AF_INET6, 1;
    return 0;
}

/* 1 when the Host header names this daemon (see above). No Host (HTTP/1.0)
 * is not a browser's request and passes. */
int http_host_allowed(struct http *h, struct MHD_Connection *c) {
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
    if (!host) return 1;
    char name[256];
    if (host_name(host, name, sizeof name)) return 0;
    if (strcasecmp(name, "localhost") == 0) return 1;
    for (int i = 0; i < h->cfg.n_allow_hosts; i++)
        if (strcasecmp(name, h->cfg.allow_hosts[i]) == 0) return 1;
    unsigned char a[16], b[16];
    int fa, fb;
    if (!ip_literal(name, a, &fa)) return 0;
    if (h->listen_any) return 1;
    if (strcasecmp(name, h->listen_host) == 0) return 1;
    return ip_literal(h->listen_host, b, &fb) && fa == fb && memcmp(a, b, fa == AF_INET ? 4 : 16) == 0;
}

/* 1 when a state-changing request may go on without the token: it comes
 * from the daemon's own pages, or not from a browser page at all. */
int http_same_origin(struct MHD_Connection *c) {
    const char *site = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Sec-Fetch-Site");
    if (site && strcasecmp(site, "same-origin") != 0 && strcasecmp(site, "none") != 0) return 0;
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (!origin) return 1; /* browsers send Origin with every DELETE and POST */
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
    const char *rest = strncasecmp(origin, "http://", 7) == 0    ? origin + 7
                       : strncasecmp(origin, "https://", 8) == 0 ? origin + 8
                                                                 : NULL;
    return rest && host && strcasecmp(rest, host) == 0;
}

static int hexval(int ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* Why a raw query string is refused, or NULL: more than HTTP_MAX_PARAMS
 * parameters, a parameter given twice (which one counts would be a
 * guess), or a NUL byte (%00), which would cut the value short. */
static const char *query_problem(const char *q) {
    char keys[HTTP_MAX_PARAMS][32];
    int n = 0;
    while (*q) {
        const char *end = strchr(q, '&');
        if (!end) end = q + strlen(q);
        if (end == q) {
            q++;
            continue;
        }
        if (n == HTTP_MAX_PARAMS) return "too many query parameters";
        char *k = keys[n];
        size_t kl = 0;
        int in_key = 1;
        for (const char *p = q; p < end; p++) {
            int ch = (unsigned char)*p;
            if (ch == '=' && in_key) {
                in_key = 0;
                continue;
            }
            if (ch == '%' && p + 2 < end && hexval(p[1]) >= 0 && hexval(p[2]) >= 0) {
                ch = hexval(p[1]) * 16 + hexval(p[2]);
                p += 2;
                if (ch == 0) return "a query parameter holds a NUL byte (%00)";
            } else if (ch == '+') {
                ch = ' ';
            }
            if (in_key && kl < sizeof keys[0] - 1) k[kl++] = (char)ch;
        }
        k[kl] = 0;
        for (int i = 0; i < n; i++)
            if (strcmp(keys[i], k) == 0) return "a query parameter is given more than once";
        n++;
        q = end;
    }
    return NULL;
}

/* libmicrohttpd's URI callback: called with the raw request target before
 * the query is parsed; its result becomes the request's state. A refused
 * query is cut off here (libmicrohttpd keeps the target in its own
 * writable buffer) so that 9,000 parameters are answered 400 instead of
 * overflowing the connection's memory pool unanswered. */
void *http_on_uri(void *cls, const char *uri, struct MHD_Connection *c) {
    (void)cls;
    (void)c;
    struct req *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    const char *q = strchr(uri, '?');
    if (q && (r->bad_query = query_problem(q + 1))) ((char *)q)[1] = 0;
    return r;
}

void http_guard_listen(struct http *h, const char *listen) {
    int port;
    if (net_split_hostport(listen, h->listen_host, sizeof h->listen_host, &port)) return;
    unsigned char any[16] = {0}, bin[16];
    int fam;
    h->listen_any = ip_literal(h->listen_host, bin, &fam) && memcmp(bin, any, fam == AF_INET ? 4 : 16) == 0;
}
