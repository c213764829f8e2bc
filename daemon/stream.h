/* stream.h: the live event stream behind GET /api/stream (Server-Sent Events).
 *
 * The writer thread publishes events after each commit (stream_on_commit,
 * called from the writer's commit hook); HTTP threads read them through a
 * stream_client each. Events live in a bounded ring of the most recent
 * ones (by count and by bytes), each already formatted as SSE text with
 * its id, so one event costs one formatting however many clients read it.
 *
 * Event ids are "BOOT-N": BOOT is the daemon's start time in ms, N counts
 * events from 1. A client that reconnects with Last-Event-ID BOOT-N gets
 * every event after N, with no gap, as long as N+1 is still in the ring.
 * When it is not (the client was away longer than the ring holds, or the
 * id belongs to an earlier daemon), the client first receives an event
 * `reset` ({"reason":...}) and then the live events from that moment on:
 * it must reload state through the REST API. This module is not the
 * HTTP layer: it only produces bytes.
 *
 * Summaries (docs/http-api.md, "Ticks"): besides a `step` event per step,
 * the writer thread folds each live run's steps into one accumulator and,
 * publishes every tick_ms a `tick` (scalars: min, mean, max, last over the
 * tick's steps), a `layers` (per layer: layer metrics' mean, head metrics'
 * min, mean and max over heads and steps) and one `cells` event per head
 * metric (its values at the tick's last step); the last two, the bulk,
 * every rows_ms (over the steps since the last ones). Both are paced by a
 * token bucket of STREAM_BURST: a few steps after a quiet spell go out at
 * once, a fast run's steps once per interval. A client sees them only when
 * it subscribes (stream_client_subscribe), and then no `step` events: a
 * dashboard's budget is a few KB/s whatever the trainer's step rate. The
 * accumulators are bounded: STREAM_MAX_TICK_RUNS runs (one more is not
 * summarised), STREAM_MAX_TICK_VALUES values per run, freed when the run
 * ends, goes stale or is deleted. */
#ifndef STREAM_H
#define STREAM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "writer.h"

struct strbuf;

struct stream_config {
    size_t max_events; /* ring capacity in events (default 16384) */
    size_t max_bytes;  /* ring capacity in bytes (default 32 MiB) */
    int keepalive_ms;  /* comment sent to an idle client this often (default 15000) */
    int tick_ms;       /* a live run's tick event this often (default 1000) */
    int rows_ms;       /* its layers and cells events this often (default 1000) */
};

struct stream;
struct stream_client;

/* Returns NULL with a message on failure. */
struct stream *stream_create(const struct stream_config *cfg, char *err, size_t errlen);
/* Frees; every client must be closed first. Accepts NULL. */
void stream_destroy(struct stream *s);
/* Wakes every waiting client and makes their reads end (at shutdown). */
void stream_shutdown(struct stream *s);

/* Publishes one event: kind is the SSE event name ("step", "run",
 * "alert"), run_id the run it concerns (for ?run= filters), json the data
 * line (one line, no newline; copied). Safe from any thread. Returns 0, or
 * -1 out of memory (the event is lost; ids stay contiguous). */
int stream_publish(struct stream *s, const char *kind, int64_t run_id, const char *json, size_t len);

/* Publishes the events of one commit: a `step` event per step item (run,
 * step, time, commit time, scalars, layer metrics, and per-layer min and
 * mean of the head metric `entropy`), a `run` event per status change
 * (hello: live, end: its status, stale, delete: deleted). Writer thread. */
void stream_on_commit(struct stream *s, const struct writer_item *items);

/* Calls from the writer's tick (about once a second, writer thread):
 * publishes the summaries of runs whose steps stopped before a tick was
 * due, so the last steps of a paused run are not held back. */
void stream_on_tick(struct stream *s, double now);

#define STREAM_BURST 4
#define STREAM_MAX_TICK_RUNS 1024
#define STREAM_MAX_TICK_VALUES (1 << 20)
#define STREAM_MAX_CELLS 4

/* What a client receives (stream_client_subscribe). ticks 0: the default,
 * `step` events and no summaries. ticks 1: `tick` events instead of `step`
 * events; layers 1 adds `layers` events; cells names up to
 * STREAM_MAX_CELLS head metrics whose `cells` events it wants (borrowed
 * for the call: the names are copied). `run`, `alert` and `reset` events
 * go to every client. */
struct stream_sub {
    int ticks, layers;
    int ncells;
    const char *cells[STREAM_MAX_CELLS];
};
/* Sets what c receives from its next read on. Returns 0, or -1 when a
 * name is longer than a metric name may be (nothing is changed). */
int stream_client_subscribe(struct stream_client *c, const struct stream_sub *sub);

/* Lets stream_client_read notice a client that went away while it waits
 * for events: gone(ctx) is asked about every STREAM_WATCH_MS while it
 * waits, and when it returns nonzero the read returns -1 (the end), so a
 * closed client frees its connection within a second, not at the next
 * event or keep-alive. ctx is borrowed. */
#define STREAM_WATCH_MS 250
void stream_client_watch(struct stream_client *c, int (*gone)(void *ctx), void *ctx);


/* Opens a client that sees the events of run_filter (0: all runs) after
 * last_event_id (NULL or "": from now on). NULL when out of memory. */
struct stream_client *stream_client_open(struct stream *s, int64_t run_filter, const char *last_event_id);
/* Copies up to max bytes of the client's next events into buf, waiting for
 * one (or for the keep-alive comment) when there is none. Returns the
 * bytes written (> 0), or -1 when the stream shuts down. */
ssize_t stream_client_read(struct stream_client *c, char *buf, size_t max);
/* Accepts NULL. */
void stream_client_close(struct stream_client *c);

struct stream_stats {
    uint64_t published; /* events published */
    uint64_t resets;    /* clients that resumed from before the ring */
    uint64_t clients;   /* clients open now */
    uint64_t ring_events, ring_bytes;
};
void stream_get_stats(struct stream *s, struct stream_stats *out);

/* Appends the stream's figures to b as Prometheus text (clients, events
 * published, resets). Safe from any thread. */
void stream_metrics(struct stream *s, struct strbuf *b);

#endif
