/* net.c: address parsing and constant-time comparison (net.h). */
#include "net.h"

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

int net_host_is_loopback(const char *host) {
    return strcmp(host, "localhost") == 0 || strcmp(host, "::1") == 0 || strncmp(host, "127.", 4) == 0;
}

int net_equal_ct(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    unsigned char d = la != lb;
    for (size_t i = 0; i < la; i++) d |= (unsigned char)(a[i] ^ b[i % (lb ? lb : 1)]);
    return d == 0;
}
