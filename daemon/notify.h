/* notify.h: delivery of alert notifications to the slow outside world.
 *
 * Every receiver has a worker thread of its own, so a slow or dead one
 * delays only itself: never a commit, never another receiver. Receivers:
 *   - webhook: POST of the Alertmanager webhook JSON (version "4") with
 *     libcurl; retried with exponential backoff on connection errors, 5xx
 *     and 429 (up to `retries` attempts), given up on other 4xx. Its queue
 *     holds at most max_queue notes; when full the oldest is dropped and
 *     counted (entropyd_notifications_dropped_total{sink="webhook"});
 *   - exec: `/bin/sh -c CMD` with the same JSON on stdin and
 *     ENTROPYD_ALERT_STATUS / _NAME / _RUN in the environment, killed after
 *     10 s; a queue of its own, bounded the same way;
 *   - alertmanager: POST of Alertmanager's own API, `POST /api/v2/alerts`
 *     with an array of {labels, annotations, startsAt, endsAt,
 *     generatorURL}. Alertmanager wants state, not events: it keeps the
 *     latest of each alert (by labels) and resolves one whose endsAt passes.
 *     So this receiver has no queue of notes that could overflow: each
 *     transition updates a set keyed by fingerprint (firing alerts, and
 *     resolved ones not yet delivered), and the worker POSTs the whole set
 *     as soon as it changed, again after a failure (backoff 0.5 s doubling
 *     up to am_resend_s), and every am_resend_s seconds while anything
 *     fires, firing ones with endsAt = now + 4 x am_resend_s (Prometheus'
 *     convention: if entropyd dies its alerts resolve by themselves). A
 *     resolved alert leaves the set once a POST that carried it succeeded.
 *     Only resolved alerts waiting for delivery can be dropped (more than
 *     max_queue of them), and are counted;
 *   - log: one line per notification on stderr, written by notify_post
 *     itself, at most 20 per 10 s.
 * Only FIRING and RESOLVED transitions are notified (UPDATEs are not). The
 * trainer's alert line does not pass here: it goes through the writer's
 * reply queue to that trainer's connection (alerter.c). */
#ifndef NOTIFY_H
#define NOTIFY_H

#include <stddef.h>
#include <stdint.h>

struct notify_config {
    const char *webhook_url;      /* NULL: no webhook */
    const char *exec_cmd;         /* NULL: no exec hook */
    int log;                      /* 1: log each notification */
    int max_queue;                /* default 1000 */
    int retries;                  /* attempts per webhook notification, default 6 */
    int timeout_ms;               /* per HTTP request, default 5000 */
    int backoff_ms;               /* first retry delay, doubled each time, default 500 */
    const char *external_url;     /* the daemon's URL, for externalURL (may be NULL) */
    const char *alertmanager_url; /* Alertmanager base URL (http://host:9093) or NULL */
    int am_resend_s;              /* re-send period of firing alerts, default 60 */
};

struct notify;

/* Starts a worker thread per receiver configured. NULL with a message on
 * failure. */
struct notify *notify_create(const struct notify_config *cfg, char *err, size_t errlen);

/* Stops the workers, waiting at most wait_ms (plus one request in flight,
 * cut to what is left of wait_ms) for each receiver to deliver what it
 * holds; what remains is dropped and counted. Accepts NULL. */
void notify_destroy(struct notify *n, int wait_ms);

/* Queues one notification. status is "firing" or "resolved"; alert_json is
 * one Alertmanager alert object (alert_transition_json); group labels are
 * alertname and run. resumed: a firing an earlier daemon already sent (the
 * episode goes on after a restart): it rejoins Alertmanager's firing set
 * and is logged, but the webhook and the hook are not called again.
 * Copies what it needs. Never blocks. Returns 0, or -1 out of memory. */
int notify_post(struct notify *n, const char *status, const char *alertname, const char *run, const char *alert_json,
                int resumed);

/* The daemon's URL, for externalURL and each alert's generatorURL
 * (URL/?run=ID). Set once HTTP listens: with --http HOST:0 only then is the
 * port known. Copied; safe from any thread. */
void notify_set_external_url(struct notify *n, const char *url);

/* One receiver's counters. webhook and exec count notes; alertmanager
 * counts POSTs of its set (re-sends included) and, in queued and dropped,
 * the transitions it took and the resolved alerts it had to forget. */
struct notify_sink_stats {
    uint64_t queued, sent, failed, retries, dropped;
    uint64_t pending; /* notes queued now (alertmanager: alerts in its set not yet sent) */
};

struct notify_stats {
    uint64_t queued; /* transitions handed to notify_post */
    struct notify_sink_stats webhook, exec, alertmanager;
    uint64_t am_firing; /* alerts in the firing set Alertmanager is re-sent; while
                                      it is 0 the re-send timer is off */
};
void notify_get_stats(struct notify *n, struct notify_stats *out);

#endif
