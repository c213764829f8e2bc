/* net.h: the small pieces of networking the daemon, the trainer and the
 * client library need the same way: reading a "HOST:PORT" address and
 * resolving it, telling a loopback host, and comparing a secret in constant
 * time. No socket is opened here: callers bind or connect what
 * net_resolve gives them. */
#ifndef NET_H
#define NET_H

#include <stddef.h>
#include <sys/socket.h>

/* Splits "HOST:PORT" at its last colon into host (brackets of an IPv6
 * literal removed: "[::1]:80" gives "::1") and the port number. The host
 * must be non-empty and shorter than hostcap; the port a decimal number in
 * 0..65535 (0: any free port, for callers that allow it). Returns 0, or -1
 * when spec does not have that form (host and *port then undefined). */
int net_split_hostport(const char *spec, char *host, size_t hostcap, int *port);

/* A resolved TCP address: what socket(2) (family: ss.ss_family) and
 * bind(2) or connect(2) (addr, len) take. */
struct net_addr {
    struct sockaddr_storage ss;
    socklen_t len;
};

/* Resolves spec "HOST:PORT" (net_split_hostport's form; the port may be 0)
 * to the first TCP address getaddrinfo gives for it: a name may need DNS
 * and block, so call it where blocking is allowed. Returns 0 and fills
 * *out, or -1 with a message in err ("wants HOST:PORT ..." or "cannot
 * resolve ..."; what names the address for the message, e.g. "--http"). */
int net_resolve(const char *spec, const char *what, struct net_addr *out, char *err, size_t errlen);

/* 1 when host (as net_split_hostport gives it) is "localhost", "::1" or in
 * 127.0.0.0/8 as text: only this machine can reach it. */
int net_host_is_loopback(const char *host);

/* 1 when the strings are equal, in time that depends on their lengths only
 * (strcmp stops at the first differing byte, which a client on the network
 * could time). For tokens. */
int net_equal_ct(const char *a, const char *b);

#endif
