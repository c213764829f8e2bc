/* net.c: address parsing and resolution, constant-time comparison (net.h). */
#include "net.h"

#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>

int net_split_hostport(const char *spec, char *host, size_t hostcap, int *port) {
    const char *colon = strrchr(spec, ':');
    if (!colon || colon == spec || !colon[1]) return -1;
    const char *b = spec, *e = colon;
    if (*b == '[') {
        if (e - b < 3 || e[-1] != ']') return -1;
        b++, e--;
    }
    if (e == b || (size_t)(e - b) >= hostcap) return -1;
    if (memchr(b, '[', (size_t)(e - b)) || memchr(b, ']', (size_t)(e - b))) return -1;
    long p = 0;
    for (const char *d = colon + 1; *d; d++) {
        if (*d < '0' || *d > '9' || d - colon > 5) return -1;
        p = p * 10 + (*d - '0');
    }
    if (p > 65535) return -1;
    memcpy(host, b, (size_t)(e - b));
    host[e - b] = 0;
    *port = (int)p;
    return 0;
}

int net_resolve(const char *spec, const char *what, struct net_addr *out, char *err, size_t errlen) {
    char host[256], port_text[8];
    int port;
    if (net_split_hostport(spec, host, sizeof host, &port)) {
        snprintf(err, errlen, "%s wants HOST:PORT (port 0..65535), got \"%s\"", what, spec);
        return -1;
    }
    snprintf(port_text, sizeof port_text, "%d", port);
    /* the host is never NULL, so AI_PASSIVE would change nothing: a
     * listener names the address to bind ("0.0.0.0:N" for every one) */
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *ai;
    int rc = getaddrinfo(host, port_text, &hints, &ai);
    if (rc) {
        snprintf(err, errlen, "%s: cannot resolve \"%s\": %s", what, host,
                 rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
        return -1;
    }
    if (ai->ai_addrlen > sizeof out->ss) { /* no family getaddrinfo gives for TCP is larger */
        freeaddrinfo(ai);
        snprintf(err, errlen, "%s: cannot resolve \"%s\": address too long", what, host);
        return -1;
    }
    memset(out, 0, sizeof *out);
    memcpy(&out->ss, ai->ai_addr, ai->ai_addrlen);
    out->len = ai->ai_addrlen;
    freeaddrinfo(ai);
    return 0;
}

int net_host_is_loopback(const char *host) {
    return strcmp(host, "localhost") == 0 || strcmp(host, "::1") == 0 || strncmp(host, "127.", 4) == 0;
}

int net_equal_ct(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    unsigned char d = la != lb;
    for (size_t i = 0; i < la; i++) d |= (unsigned char)(a[i] ^ b[i % (lb ? lb : 1)]);
    return d == 0;
}
