/* alerter.h: entropyd's alerting, wired together.
 *
 * Runs in the writer thread: the writer's commit hook feeds every committed
 * item to the rule engine (alert.h) and its tick drives time-based rules.
 * Each transition is then
 *   - stored (alerts, alert_transitions) in a small transaction of its own
 *     right after the commit that caused it (if that write fails, e.g. on a
 *     full disk, the transition is still streamed and notified, and logged);
 *   - published on the live stream as an `alert` event (when a stream is set);
 *   - sent to the trainer of the run as a protocol `alert` line;
 *   - handed to the notifier (webhook, exec hook, log) when FIRING or RESOLVED.
 * A run's verdict (alert.h) is stored when it changes: at once, in a small
 * transaction, when a hello, an end, a stale mark, an event or a tick
 * changed it; when a step did, it rides in the writer's next batch
 * (writer_precommit_fn) or, if none comes first, the next tick's
 * transaction (at most ~1 s later): at a stream whose heads cross a
 * threshold back and forth it changes at nearly every step.
 * Nothing here blocks on the network: each of the notifier's receivers has
 * a thread of its own (notify.h). */
#ifndef ALERTER_H
#define ALERTER_H

#include <stddef.h>
#include <stdint.h>

#include "alert.h"
#include "notify.h"
#include "store.h"
#include "writer.h"

struct strbuf;

struct stream;
struct query_pool;

struct alerter_config {
    const char *rules_path; /* NULL: the default rules */
    struct notify_config notify;
    struct store *store;     /* the writer's store: used only from the writer thread */
    struct stream *stream;   /* may be NULL */
    struct query_pool *pool; /* borrowed, may be NULL: reads the episodes an earlier daemon left
                                 * firing, which a new FIRING resumes (no second page) */
};

struct alerter;

/* Loads the rules and starts the notifier. NULL with a message (a bad rules
 * file names its line) on failure. */
struct alerter *alerter_create(const struct alerter_config *cfg, char *err, size_t errlen);

/* The writer, for alert lines to trainers and the precommit hook that
 * stores deferred verdicts; set once it exists, before trainers connect. */
void alerter_set_writer(struct alerter *m, struct writer *w);

/* Accepts NULL. Waits at most wait_ms for pending notifications. */
void alerter_destroy(struct alerter *m, int wait_ms);

/* Writer thread only. */
void alerter_on_commit(struct alerter *m, const struct writer_item *items);
void alerter_on_tick(struct alerter *m, double now);

struct alerter_stats {
    struct alert_stats engine;
    struct notify_stats notify;
    uint64_t firing;  /* groups firing now */
    uint64_t resumed; /* firings that resumed an earlier daemon's episode (not paged again) */
    uint64_t store_errors;
    uint64_t state_runs, state_bytes; /* the engine's per-run state (alert_engine_usage) */
};
/* Safe from any thread (/metrics). */
void alerter_get_stats(struct alerter *m, struct alerter_stats *out);

/* Appends the alert engine's and the notifier's figures to b as Prometheus
 * text (entropyd_alert_*, entropyd_notification*, by sink). Safe from any
 * thread. */
void alerter_metrics(struct alerter *m, struct strbuf *b);

/* The daemon's URL for generatorURL and externalURL, once HTTP listens
 * (its real port when --http asked for port 0). Copied. */
void alerter_set_external_url(struct alerter *m, const char *url);

#endif
