/* remote_write.h: pushes every committed step to a Prometheus remote-write
 * receiver (protocol 1.0: a protobuf WriteRequest, snappy block-compressed,
 * POSTed to a URL), from the committed store, so that nothing is lost when
 * the receiver is down or the daemon restarts. docs/remote-write.md is the
 * user's side of it: labels, timestamps, rollbacks, limits.
 *
 * A thread of its own reads what the writer committed (query.h's
 * query_frames, on a read connection of its own) and sends it run by run
 * in batches of at most REMOTE_WRITE_MAX_SAMPLES samples (or one step of a
 * run, when a step alone holds more). What has been delivered is kept in a
 * cursor file beside the database (DB.remote-write), rewritten after every
 * delivered batch: per run, its last pushed step, that step's sample
 * timestamp and the newest rollback seen. It is not the database: the
 * writer thread stays the only one that writes SQLite.
 *
 * A receiver that is down, times out, or answers 5xx or 429 gets the same
 * batch again with exponential backoff (REMOTE_WRITE_BACKOFF_MIN_MS ..
 * REMOTE_WRITE_BACKOFF_MAX_MS), as does any other 4xx but 400 (401, 404:
 * a configuration to fix). A 400 (out of order, too old) means the
 * receiver will never take the batch as it is: it is split in halves
 * by steps until each rejected step is alone, and those are counted as
 * rejected and skipped. */
#ifndef REMOTE_WRITE_H
#define REMOTE_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "strbuf.h"
#include "writer.h"

#define REMOTE_WRITE_MAX_SAMPLES 65536
#define REMOTE_WRITE_BACKOFF_MIN_MS 100
#define REMOTE_WRITE_BACKOFF_MAX_MS 30000

struct remote_write_config {
    const char *url;     /* http(s)://host:port/api/v1/write; copied */
    const char *db_path; /* the database (must exist); copied. The cursor is db_path + ".remote-write" */
    int timeout_ms;      /* one request at most this long (default 30000) */
};

struct remote_write;

/* Opens a read connection, loads the cursor and starts the thread, which
 * begins with whatever the cursor says is not yet delivered. A cursor
 * written for another URL is ignored (the new receiver gets everything).
 * Returns NULL with a message on failure. */
struct remote_write *remote_write_create(const struct remote_write_config *cfg, char *err, size_t errlen);

/* For the writer's commit hook (writer thread): wakes the pusher when a
 * step was committed. Never blocks on the network. Accepts NULL. */
void remote_write_on_commit(struct remote_write *rw, const struct writer_item *items);

/* Appends the pusher's counters to b as Prometheus text
 * (entropyd_remote_write_*). Safe from any thread. Accepts NULL (appends
 * nothing). */
void remote_write_metrics(void *rw, struct strbuf *b);

/* Stops the thread (a request in flight is abandoned: its batch is sent
 * again next time), writes the cursor and frees. Accepts NULL. */
void remote_write_destroy(struct remote_write *rw);

#endif
