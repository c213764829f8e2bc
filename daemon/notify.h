/* notify.h: delivery of alert notifications to the slow outside world.
 *
 * One notifier thread owns a bounded queue, so a slow or dead webhook
 * receiver never delays a commit. Sinks:
 *   - webhook: POST of the Alertmanager webhook JSON (version "4") with
 *     libcurl; retried with exponential backoff on connection errors, 5xx
 *     and 429 (up to `retries` attempts), given up on other 4xx;
 *   - exec: `/bin/sh -c CMD` with the same JSON on stdin and
 *     ENTROPYD_ALERT_STATUS / _NAME / _RUN in the environment, killed after
 *     10 s;
 *   - log: one line per notification on stderr;
 *   - alertmanager: POST of Alertmanager's own API, `POST /api/v2/alerts`
 *     with an array of {labels, annotations, startsAt, endsAt,
 *     generatorURL}.  Alertmanager expects a client to re-send its firing
 *     alerts (it resolves one whose endsAt passes), so the notifier keeps
 *     the firing set and re-sends it every `am_resend_s` seconds with
 *     endsAt = now + 4 x am_resend_s (Prometheus' convention: if entropyd
 *     dies, its alerts resolve by themselves after that); a resolved alert
 *     is sent once with its real endsAt and retried like the webhook.
 * Only FIRING and RESOLVED transitions are notified (UPDATEs are not). When
 * the queue is full the oldest notification is dropped and counted. */
#ifndef NOTIFY_H
#define NOTIFY_H

#include <stddef.h>
#include <stdint.h>

struct notify_config {
    const char *webhook_url;   /* NULL: no webhook */
    const char *exec_cmd;      /* NULL: no exec hook */
    int log;                   /* 1: log each notification */
    int max_queue;             /* default 1000 */
    int retries;               /* attempts per webhook notification, default 6 */
    int timeout_ms;            /* per HTTP request, default 5000 */
    int backoff_ms;            /* first retry delay, doubled each time, default 500 */
    const char *external_url;  /* the daemon's URL, for externalURL (may be NULL) */
    const char *alertmanager_url; /* Alertmanager base URL (http://host:9093) or NULL */
    int am_resend_s;           /* re-send period of firing alerts, default 60 */
};

struct notify;

/* Starts the notifier thread. NULL with a message on failure. */
struct notify *notify_create(const struct notify_config *cfg, char *err, size_t errlen);

/* Stops the thread, waiting at most wait_ms for the queue to drain
 * (what remains is dropped and counted). Accepts NULL. */
void notify_destroy(struct notify *n, int wait_ms);

/* Queues one notification. status is "firing" or "resolved"; alert_json is
 * one Alertmanager alert object (alert_transition_json); group labels are
 * alertname and run. resumed: a firing an earlier daemon already sent (the
 * episode goes on after a restart): it rejoins Alertmanager's firing set
 * and is logged, but the webhook and the hook are not called again.
 * Copies what it needs. Never blocks. Returns 0, or -1 out of memory. */
int notify_post(struct notify *n, const char *status, const char *alertname, const char *run,
                const char *alert_json, int resumed);

/* The daemon's URL, for externalURL and each alert's generatorURL
 * (URL/?run=ID). Set once HTTP listens: with --http HOST:0 only then is the
 * port known. Copied; safe from any thread. */
void notify_set_external_url(struct notify *n, const char *url);

struct notify_stats {
    uint64_t queued, sent, failed, retries, dropped, exec_runs, exec_failed;
    uint64_t am_sent, am_failed;   /* Alertmanager POSTs (re-sends included) */
    uint64_t am_firing;            /* alerts in the firing set Alertmanager is re-sent; while
                                      it is 0 the re-send timer is off */
};
void notify_get_stats(struct notify *n, struct notify_stats *out);

#endif
