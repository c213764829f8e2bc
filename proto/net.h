/* net.h: the small pieces of networking both programs need the same way:
 * reading a "HOST:PORT" address, telling a loopback host, and comparing a
 * secret in constant time. Pure functions: no sockets are opened here. */
#ifndef NET_H
#define NET_H

#include <stddef.h>

/* Splits "HOST:PORT" at its last colon into host (brackets of an IPv6
 * literal removed: "[::1]:80" gives "::1") and the port number. The host
 * must be non-empty and shorter than hostcap; the port a decimal number in
 * 0..65535 (0: any free port, for callers that allow it). Returns 0, or -1
 * when spec does not have that form (host and *port then undefined). */
int net_split_hostport(const char *spec, char *host, size_t hostcap, int *port);

/* 1 when host (as net_split_hostport gives it) is "localhost", "::1" or in
 * 127.0.0.0/8 as text: only this machine can reach it. */
int net_host_is_loopback(const char *host);

/* 1 when the strings are equal, in time that depends on their lengths only
 * (strcmp stops at the first differing byte, which a client on the network
 * could time). For tokens. */
int net_equal_ct(const char *a, const char *b);

#endif
