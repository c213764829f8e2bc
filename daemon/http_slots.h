/* http_slots.h: who holds the HTTP server's connection slots, and room for
 * a newcomer when they are all taken.
 *
 * libmicrohttpd refuses a connection once --http-max-conns are open, and
 * its per-address limit does not stop one local user: every address of
 * 127.0.0.0/8 is loopback, so 512 idle sockets from nine of them take
 * every slot and /healthz is closed unanswered for as long as they
 * stay. This module keeps the open connections in order of
 * idleness; when a newcomer finds every slot taken, the connection idle
 * longest (no request in progress: it never sent its headers, or waits
 * between keep-alive requests) is shut down to make room, as ingest does
 * with strangers. A request being answered (a stream included) is never
 * pushed out; when every slot has one, the newcomer gets one of
 * HTTP_SLOTS_RESERVED reserved slots, which serve /healthz and /metrics
 * only (the caller answers anything else 503, http_slots_reserved): a
 * health check needs a slot of its own, or 512 open streams would take
 * every slot and leave /healthz and /metrics unanswered. A reserved slot
 * serves one request and is shut down (no keep-alive), and is timed out
 * after HTTP_SLOTS_RESERVED_IDLE_MS without a request, so that idle
 * sockets cannot hold them for long; only when they too are taken is the
 * newcomer refused.
 *
 * The per-address limit is this module's too (libmicrohttpd's own refuses
 * at accept, before the request says what it asks for): an address that
 * holds its per_addr ordinary slots gets a reserved slot for its
 * newcomer, or nothing when they are taken, so a monitoring probe from an
 * address whose streams hold its share is still answered /healthz and
 * /metrics, and the address still holds no more than per_addr slots that
 * serve anything else.
 *
 * It also times idle connections out: libmicrohttpd's own timeout starts
 * again at every byte, so a client that sends its headers one byte at a
 * time (slowloris) would keep its thread and slot for ever. http_slots_sweep
 * shuts down every connection idle (no request in progress) for longer
 * than idle_ms, counted from its accept or the end of its last request,
 * whatever it trickled meanwhile.
 *
 * Threads: the connection and accept-policy callbacks run on the server's
 * listening thread, which alone closes sockets (libmicrohttpd closes a
 * connection's socket there, after the closed notification), so a socket
 * shut down here is still the connection's; the request callbacks run on
 * connection threads. One mutex guards the list. */
#ifndef HTTP_SLOTS_H
#define HTTP_SLOTS_H

#include <microhttpd.h>
#include <stdint.h>

struct http_slots;

/* max: the slots that may be held (libmicrohttpd's own limit must leave
 * HTTP_SLOTS_SPARE over it for newcomers admitted while their victims
 * close); per_addr: the ordinary slots one client address may hold (0: no
 * limit; libmicrohttpd's per-address limit, if set, must leave
 * HTTP_SLOTS_RESERVED over it); idle_ms: how long a connection may go
 * without a request in progress (http_slots_sweep). Returns NULL when out
 * of memory. */
struct http_slots *http_slots_create(unsigned max, unsigned per_addr, double idle_ms);

/* Frees. Accepts NULL. Call after the server stopped. */
void http_slots_destroy(struct http_slots *s);

/* Newcomers admitted beyond max while the connections they pushed out close. */
#define HTTP_SLOTS_SPARE 16u

/* Slots beyond max + HTTP_SLOTS_SPARE kept for /healthz and /metrics while
 * every ordinary slot serves a request (libmicrohttpd's limit must hold
 * them too), and how long one may go without a request. */
#define HTTP_SLOTS_RESERVED 8u
#define HTTP_SLOTS_RESERVED_IDLE_MS 2000.0

/* For MHD_OPTION_NOTIFY_CONNECTION (cls = the slots): a connection
 * started or closed. */
void http_slots_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                       enum MHD_ConnectionNotificationCode code);

/* For MHD_start_daemon's accept policy (cls = the slots): MHD_YES with a
 * slot free or made free, or a reserved one free; MHD_NO when every slot,
 * reserved ones included, is taken. A newcomer from an address that holds
 * its per_addr ordinary slots is admitted only into a reserved one. */
enum MHD_Result http_slots_admit(void *cls, const struct sockaddr *addr, socklen_t addrlen);

/* A request of c is being handled (its headers are in) / is done. A
 * reserved slot is shut down once its request is done. */
void http_slots_busy(struct http_slots *s, struct MHD_Connection *c);
void http_slots_idle(struct http_slots *s, struct MHD_Connection *c);

/* What slot c holds: an ordinary one, or a reserved one, given because
 * every ordinary slot serves a request or because c's address holds its
 * per_addr share. In a reserved slot it may be answered /healthz or
 * /metrics only (anything else: 503 saying which). */
enum http_slots_kind { HTTP_SLOTS_ORDINARY = 0, HTTP_SLOTS_FOR_ALL_BUSY, HTTP_SLOTS_FOR_ADDR };
int http_slots_reserved(struct MHD_Connection *c);

/* Shuts down the connections idle (no request in progress) for longer
 * than idle_ms at now_ms (now_mono_ms()); any thread, e.g. once a second.
 * Returns how many. */
unsigned http_slots_sweep(struct http_slots *s, double now_ms);

/* Connections pushed out to make room / timed out by http_slots_sweep /
 * admitted into a reserved slot, since start. */
uint64_t http_slots_evicted(struct http_slots *s);
uint64_t http_slots_timed_out(struct http_slots *s);
uint64_t http_slots_reserved_total(struct http_slots *s);

#endif
