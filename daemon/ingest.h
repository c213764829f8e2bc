/* ingest.h: the event loop that serves trainer connections.
 *
 * One thread, one epoll set: it accepts connections on a Unix socket and
 * optionally TCP, frames input into lines, parses them (proto.h), checks
 * them against what it knows of each run (hello first, seq order, shapes),
 * answers bad lines with an error line, and hands good messages to the
 * writer (writer.h). Replies the writer posts after each commit (welcome,
 * ack, error) are written back here, so only this thread touches sockets.
 *
 * Flow control: when the writer's queue is full the loop stops reading all
 * sockets until it drains; a client that never reads its acks costs one
 * coalesced ack, not a growing buffer. */
#ifndef INGEST_H
#define INGEST_H

#include <stddef.h>
#include <stdint.h>

#include "proto.h"
#include "writer.h"

struct strbuf;

struct ingest_config {
    const char *socket_path; /* Unix socket to listen on; NULL for none */
    const char *tcp;         /* "HOST:PORT" to listen on; NULL for none; port 0 picks one */
    const char *token;       /* required in hello when not NULL */
    int max_conns;           /* default 10000 */
    size_t max_out;          /* per-connection unread error bytes before closing; default 4 MiB */
    /* Against strangers and careless clients (docs/reliability.md, "Security"): */
    int max_conns_per_peer;    /* connections per uid (Unix socket, SO_PEERCRED) or per address
                                * (TCP); default half of max_conns, but all of
                                * the first 1024 */
    int hello_ms;              /* a connection not welcomed this long after accept is closed;
                                * default 10000 */
    int idle_ms;               /* a welcomed connection that sends nothing this long is closed;
                                * 0 (default): never */
    size_t max_input;          /* input buffered across all connections (partial lines); over
                                * it, welcomed connections wait and others are refused;
                                * default 64 MiB */
    int64_t max_cells_per_run; /* layers * heads of a run at most; a hello over it is answered
                                * bad_field and the run is not opened (what a run costs the
                                * daemon grows with its cells: alert state, frames, caches);
                                * 0: INGEST_MAX_CELLS */
};

/* The default of max_cells_per_run: 65,536 cells (e.g. 128 layers x 512
 * heads), four times the largest published models' layers x heads. */
#define INGEST_MAX_CELLS 65536

/* Before its hello is welcomed a connection may buffer at most this much
 * of a line, and have this much unread output: a stranger costs 64 KiB,
 * not a 4 MiB line. A hello (meta included) must fit in it. */
#define INGEST_HELLO_MAX (64u * 1024)

struct ingest;

/* Binds the listeners. writer and notify_fd (the eventfd the writer
 * signals) are borrowed and must outlive the ingest. Returns NULL with a
 * message in err on failure (address in use, bad HOST:PORT...). */
struct ingest *ingest_create(const struct ingest_config *cfg, struct writer *writer, int notify_fd, char *err,
                             size_t errlen);

/* Runs the loop until ingest_stop(); then stops accepting and reading,
 * waits (at most drain_ms) for the writer to commit what was accepted,
 * sends the last acks and closes every connection. Returns 0, or -1 if
 * epoll itself failed. */
int ingest_run(struct ingest *ing, int drain_ms);

/* Asks the loop to stop. Async-signal-safe. */
void ingest_stop(struct ingest *ing);

/* Closes listeners and connections, removes the Unix socket file, frees.
 * Accepts NULL. */
void ingest_destroy(struct ingest *ing);

/* The TCP port actually bound (for --listen-tcp HOST:0), or 0. */
int ingest_tcp_port(const struct ingest *ing);

struct ingest_stats {
    uint64_t conns_total, conns_open, conns_rejected;
    uint64_t lines, bytes, messages;
    uint64_t errors[PROTO_E_COUNT]; /* by enum proto_err */
    uint64_t paused_ms;             /* time spent not reading because the writer was full */
    uint64_t conns_timed_out;       /* closed: no hello in time, or idle */
    uint64_t conns_evicted;         /* closed before their hello to make room for a newcomer */
    uint64_t conns_peer_rejected;   /* refused: their peer held --max-conns-per-peer */
    uint64_t input_bytes;           /* memory held by input buffers now */
    uint64_t input_refused;         /* connections closed because the input budget was spent */
};

/* Copies the counters. Safe from any thread (values may be a moment old). */
void ingest_get_stats(struct ingest *ing, struct ingest_stats *out);

/* Appends ingest's figures to b as Prometheus text: connections, lines,
 * bytes, messages, the guards' counters, protocol errors by code. Safe
 * from any thread. */
void ingest_metrics(struct ingest *ing, struct strbuf *b);

#endif
