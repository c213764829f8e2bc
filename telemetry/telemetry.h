/* telemetry.h -- protocol v1 client for entropyd (schema/protocol.md).
 *
 * The whole contract of libentropyd_telemetry (telemetry/, `pkg-config
 * entropyd_telemetry`, installed as <entropyd/telemetry.h>): any C program, and
 * the Python package python/entropyd through ctypes, reports per-step
 * metrics with it. It knows nothing of models or trainers; it moves named
 * floats.
 *
 * Threads. The caller (the "producer", typically the training loop) builds
 * steps and events; a private sender thread formats them as JSON lines,
 * assigns seq, appends them to an on-disk spool (a write-ahead log of
 * checksummed records) and streams the spool to the daemon, reconnecting
 * with exponential, jittered backoff, never more than 4 times a second.
 * The producer functions (telemetry_step_*, telemetry_event, telemetry_poll)
 * must be called from one thread at a time; telemetry_get_stats and
 * telemetry_wait_welcome from any thread.
 *
 * Hot path. telemetry_step_begin / _scalar / _layer / _heads / _commit make
 * no system call, take no lock and allocate nothing: they copy floats into a
 * preallocated slot of a bounded single-producer ring. When the ring is full,
 * the step is dropped and counted (stats.dropped_queue) instead of waiting.
 *
 * Reliability. Every message is appended to the spool before it is sent, and
 * removed from it only when the daemon acknowledged it. The spool survives
 * the process: a new client with the same run name and spool directory
 * resumes seq numbering and uploads what was never acknowledged. A damaged
 * spool record is skipped and named (an inbox note, code "spool_damage"),
 * its seq sent as a warn event, so that every intact one is delivered
 * (docs/client.md, "Damage"). When the
 * spool is at its byte bound, messages are dropped and counted
 * (stats.dropped_spool), and an `event` reporting the loss is sent once room
 * is back. Nothing the daemon does (refusing, closing, stalling, never
 * reading) can block the producer.
 */
#ifndef TELEMETRY_H
#define TELEMETRY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Return codes. */
#define TELEMETRY_OK 0
#define TELEMETRY_EFULL -1     /* queue (or metric slot table) full: dropped, counted */
#define TELEMETRY_EINVAL -2    /* bad argument: name, level, status, shape */
#define TELEMETRY_ETIMEDOUT -3 /* a bounded wait ended before everything was acknowledged */
#define TELEMETRY_EREFUSED \
    -4 /* the daemon refused the run's hello (e.g. shape_mismatch: the
                                  name is taken by a run of another shape); the client
                                  stopped connecting, see telemetry_wait_welcome */

#define TELEMETRY_NAME_MAX 64 /* metric names: 1..64 bytes of [A-Za-z0-9._:-] */
#define TELEMETRY_RUN_MAX 128 /* run names: 1..128 bytes of [A-Za-z0-9._:@+-] */

typedef struct telemetry telemetry;
typedef struct telemetry_step telemetry_step; /* one slot of the ring */

/* Configuration. Strings are copied by telemetry_create; the struct may be
 * freed afterwards. Zero / NULL fields take the default given. */
typedef struct telemetry_config {
    const char *address;    /* "unix:PATH" or "tcp:HOST:PORT"; NULL: spool only,
                              never connect */
    const char *run;        /* run name; NULL: generated, see telemetry_run_name */
    int layers, heads;      /* L, H: 1..4096, L*H <= 1048576 (required) */
    int seq_len;            /* T >= 1 (required) */
    const char *meta_json;  /* JSON object text sent in hello, or NULL */
    const char *token;      /* daemon token, or NULL */
    const char *spool_dir;  /* spool root; the run spools in SPOOL_DIR/RUN/.
                              NULL: a private temporary directory removed by
                              destroy (no persistence across processes) */
    size_t queue_slots;     /* ring capacity in messages; default 256, fewer
                              (at least 16) when 256 slots would take over
                              64 MiB. The ring is allocated and touched at
                              create: slots * (max_scalars + max_layer_metrics*L
                              + max_head_metrics*L*H) floats, plus names */
    size_t spool_max_bytes; /* spool bound; default 256 MiB */
    int max_scalars;        /* per-step metric slots; defaults 64, 32, 16;
                              at most 256 each (protocol v1). A step's line
                              must stay under 4 MiB, roughly 11 bytes a value */
    int max_layer_metrics;
    int max_head_metrics;
    int backoff_min_ms; /* reconnect backoff; defaults 50 and 2000: it
                              doubles per attempt, each wait jittered to
                              50..100% of it, and starts again from the
                              minimum only after a useful connection (an
                              ack, or 5 s up); attempts are at least 250 ms
                              apart whatever these say */
    int backoff_max_ms;
    int no_spool_upload;  /* 0 (default): with an address and a spool_dir,
                              a background thread uploads every other run
                              found in spool_dir with unacknowledged
                              messages (see telemetry_upload_all), one at a
                              time, and reports each in the inbox (type
                              "client", code "uploaded" or "upload_failed").
                              Nonzero: only this run. */
    int send_interval_ms; /* 0: default, 100 ms. While connected and caught
                              up, the sender thread wakes once per interval:
                              it moves what the ring holds to the spool,
                              sends it in one write and reads the daemon's
                              acks and alerts, so that a training loop's
                              steps reach the daemon (and its threads wake)
                              once per interval instead of once per step.
                              A ring half full, a backlog to resend, a
                              connection being set up, telemetry_flush and
                              the end of the run (finish, destroy) are
                              served at once. Negative: no pacing (every
                              message is sent within a millisecond or two
                              of being enqueued; the sender wakes ~60
                              times a second when idle). */
    int noncausal;        /* 0 (default): causal attention, row i attends
                              positions 0..i; nonzero: every row attends all
                              seq_len positions. Sent in the hello
                              ("causal":false); the daemon derives
                              entropy_norm from a step's entropy with it
                              when the step has no entropy_norm
                              (docs/metrics.md). */
} telemetry_config;

/* Counters, a snapshot. Monotonic except spool_bytes and connected. */
typedef struct telemetry_stats {
    uint64_t enqueued;         /* messages accepted into the ring */
    uint64_t dropped_queue;    /* messages dropped because the ring was full */
    uint64_t dropped_spool;    /* messages dropped because the spool was full or failing */
    uint64_t dropped_oversize; /* steps whose line would exceed protocol v1's 4 MiB */
    uint64_t spooled;          /* messages written to the spool (each has a seq) */
    uint64_t sent;             /* message lines written to the socket, resends included */
    uint64_t acked;            /* highest seq the daemon acknowledged (or welcomed) */
    uint64_t next_seq;         /* seq the next message will get */
    uint64_t spool_bytes;      /* bytes in the spool now */
    uint64_t connects;         /* welcomes received */
    uint64_t reconnects;       /* welcomes after the first one */
    uint64_t connect_failures;
    uint64_t errors;        /* error lines received from the daemon */
    uint64_t inbox_dropped; /* incoming lines lost because the inbox was full */
    int connected;          /* 1 while a welcomed connection is up */
} telemetry_stats;

/* A line received from the daemon (welcome, error, alert, or any unknown
 * type; acks are not delivered, see stats.acked), or a note from the client
 * itself, type "client" with a "code": "seq_reset" (the daemon knew more of
 * the run than the spool; unsent lines were renumbered after its last_seq),
 * "seq_lost" (the daemon lost acknowledged data; the client stopped
 * connecting), "spool_error", "spool_damage" (a damaged spool record was
 * skipped: "run R: FILE byte N: WHAT", docs/client.md), and, from the
 * background uploader, "uploaded", "upload_failed". */
typedef struct telemetry_msg {
    char type[32]; /* the "type" field, truncated; "" when absent */
    char *line;    /* the JSON text without newline; malloc()ed, the caller
                      owns it: free it, or call telemetry_msg_free */
} telemetry_msg;

/* Fills *cfg with zeros (all defaults). */
void telemetry_config_init(telemetry_config *cfg);

/* Creates a client and starts its sender thread. Validates the config
 * (address syntax, run name, shape, meta is a JSON object), opens and locks
 * the spool directory (creating it), recovers seq numbering from it.
 * Does not wait for the daemon. Returns NULL on failure with a message in
 * err (when err is not NULL). */
telemetry *telemetry_create(const telemetry_config *cfg, char *err, size_t errlen);

/* Waits at most timeout_ms (from any thread) for the daemon's answer to
 * the run's hello. Returns TELEMETRY_OK once the run is welcomed (or at
 * once without an address); TELEMETRY_EREFUSED when the daemon refused
 * the hello (a name reused with another shape: shape_mismatch; a wrong
 * token: unauthorized; a bad field), err then holding "CODE: the daemon's
 * message"; the client has stopped connecting, steps still go to the
 * spool, and finish and flush return TELEMETRY_EREFUSED at once;
 * TELEMETRY_ETIMEDOUT when no answer came in time or a connection attempt
 * failed (no daemon listening: it returns at once), err saying which; the
 * client goes on connecting in the background. Sleeps: call it once,
 * after create, not in the training loop. */
int telemetry_wait_welcome(telemetry *t, int timeout_ms, char *err, size_t errlen);

/* Enqueues `end` with status "finished", "failed" or "aborted" (or nothing
 * when status is NULL: the run stays resumable and is marked stale), waits
 * at most timeout_ms for the daemon to acknowledge everything, stops the
 * sender and frees. What was not acknowledged stays in the spool for a later
 * client. Returns TELEMETRY_OK when everything was acknowledged (or, with no
 * address, spooled), TELEMETRY_ETIMEDOUT otherwise, TELEMETRY_EINVAL for a
 * bad status (then nothing is freed). Accepts NULL and is the only way to
 * free t. (With a tcp: address the final join may also wait for a DNS
 * lookup in progress.) */
int telemetry_destroy(telemetry *t, const char *status, int timeout_ms);

/* The end of a run: enqueues `end` with status (as destroy does; NULL: no
 * end), then waits at most grace_ms (negative: the default, 30000; 0: no
 * wait) for the
 * daemon to acknowledge everything, the sender reconnecting meanwhile (so a
 * daemon that comes back within the grace period gets the spool). While it
 * waits and something is unacknowledged it writes a progress line to
 * progress about once a second (NULL: silent), and at the end the client
 * notes (type "client": spool_damage, uploaded, ...) nobody polled, one
 * "entropyd client: LINE" each. The background uploads of
 * other runs (see no_spool_upload) get the same grace period: they stop
 * when it ends and go on in the next client. Then destroys t. Returns as
 * telemetry_destroy does, or TELEMETRY_EREFUSED at once when the daemon
 * refused the run; what was not acknowledged stays in the spool, and
 * the next client started on the same spool directory uploads it. A
 * private spool (spool_dir NULL) that still holds unacknowledged messages
 * is kept (with its hello.json) instead of removed, and the last progress
 * line names it: `python3 -m entropyd upload DIR` or telemetry_upload_all
 * sends it later. */
int telemetry_finish(telemetry *t, const char *status, int grace_ms, FILE *progress);

/* telemetry_finish that also fills *out (when not NULL) with the counters
 * as they are after the last acknowledgement, the sender stopped: the
 * run's final figures (telemetry_get_stats cannot be called after t is
 * gone). */
int telemetry_finish_stats(telemetry *t, const char *status, int grace_ms, FILE *progress, telemetry_stats *out);

/* Uploads every run found in spool_dir (its subdirectories SPOOL_DIR/RUN
 * that hold unacknowledged messages and a hello.json, which every client
 * with a spool_dir writes) to address, one run at a time, each waiting at
 * most timeout_ms for its acks. A run whose spool another live client holds
 * is skipped. One line per run goes to log (NULL: silent), and one per
 * damaged spool record (see telemetry_upload_spool). Returns the
 * number of runs left with unacknowledged messages (0: everything
 * uploaded), or -1 with a message in err when spool_dir cannot be read. */
int telemetry_upload_all(const char *address, const char *spool_dir, const char *token, int timeout_ms, FILE *log,
                         char *err, size_t errlen);

/* What telemetry_upload_spool did. */
typedef struct telemetry_upload_result {
    int runs_uploaded; /* runs whose every intact record is now acknowledged */
    int runs_left;     /* runs still holding unacknowledged records (no
                           daemon, refused, timed out, in use by a live
                           client, no hello.json) */
    uint64_t damaged;  /* damaged spool records met and skipped, each
                           named on log: "entropyd upload: damaged: run R:
                           FILE byte OFFSET: WHAT" (docs/client.md) */
} telemetry_upload_result;

/* telemetry_upload_all for every run (run NULL) or run alone, filling *out
 * (when not NULL). A damaged record does not stop an upload: the intact
 * records before and after it are delivered exactly once, the damage is
 * named on log and counted in out->damaged. Returns out->runs_left, or -1
 * with a message in err when spool_dir cannot be read. */
int telemetry_upload_spool(const char *address, const char *spool_dir, const char *run, const char *token,
                           int timeout_ms, FILE *log, telemetry_upload_result *out, char *err, size_t errlen);

/* The run name (given or generated); owned by t, valid until destroy. */
const char *telemetry_run_name(const telemetry *t);

/* Starts a step in the next free ring slot and returns it, or NULL when the
 * ring is full (the step is counted in dropped_queue) or step < 0. time is
 * Unix seconds (e.g. telemetry_now()), or negative to let the daemon stamp
 * it. The slot belongs to t; it is the caller's only until commit. Calling
 * begin again before commit discards the open step. No syscall. */
telemetry_step *telemetry_step_begin(telemetry *t, int64_t step, double time);

/* Adds a metric to an open step. name is copied; values are copied (layer:
 * L floats; heads: L*H floats, row-major [layer][head]). NaN and +-Inf are
 * sent as null. Returns TELEMETRY_OK, TELEMETRY_EINVAL for a bad name or a
 * NULL argument, TELEMETRY_EFULL when the step already holds max_* metrics
 * of that kind. Names are not checked for duplicates. No syscall. */
int telemetry_step_scalar(telemetry_step *s, const char *name, double value);
int telemetry_step_layer(telemetry_step *s, const char *name, const float *values);
int telemetry_step_heads(telemetry_step *s, const char *name, const float *values);

/* Zero-copy variants: add the metric and return where to write its L
 * (layer) or L*H (heads, row-major) floats, inside the slot; valid until
 * commit. Write every value: the slot still holds an older message's.
 * NULL for a bad name, a NULL argument or a full metric table. No syscall. */
float *telemetry_step_layer_buf(telemetry_step *s, const char *name);
float *telemetry_step_heads_buf(telemetry_step *s, const char *name);

/* Publishes the open step to the sender. Returns TELEMETRY_OK, or
 * TELEMETRY_EINVAL when s is not the step begin returned last. No syscall. */
int telemetry_step_commit(telemetry *t, telemetry_step *s);

/* A whole step in one call: begin, the metrics, commit (for bindings, where
 * each foreign call costs more than the copying: one call a step). Kind by
 * kind, n names and their values: scalars n doubles; layer metrics n rows
 * of L floats; head metrics n rows of L*H floats (row-major
 * [metric][layer][head]), each block contiguous. n may be 0 (names and
 * values then unused). Returns TELEMETRY_OK; TELEMETRY_EFULL when the ring
 * is full (the step is dropped and counted, as begin does); TELEMETRY_EINVAL
 * for step < 0, a NULL array with n > 0, a bad name, or more metrics of a
 * kind than max_* (nothing is enqueued). No syscall. */
int telemetry_step_log(telemetry *t, int64_t step, double time, int n_scalar, const char *const *scalar_names,
                       const double *scalars, int n_layer, const char *const *layer_names, const float *layers,
                       int n_head, const char *const *head_names, const float *heads);

/* Enqueues an event: level "info", "warn" or "error", text (copied, UTF-8,
 * at most 64 KiB; invalid bytes become '?'). Allocates, so it is meant for
 * rare messages, not for every step. Returns TELEMETRY_OK, TELEMETRY_EINVAL,
 * or TELEMETRY_EFULL when the ring is full (counted in dropped_queue). */
int telemetry_event(telemetry *t, const char *level, const char *text);

/* Takes the oldest received line, without blocking. Returns 1 and fills
 * *out (the caller owns out->line), or 0 when there is none. */
int telemetry_poll(telemetry *t, telemetry_msg *out);
void telemetry_msg_free(telemetry_msg *m);

/* Fills *out with a snapshot of the counters. Any thread. */
void telemetry_get_stats(const telemetry *t, telemetry_stats *out);

/* Waits at most timeout_ms until every enqueued message is acknowledged
 * (with no address: spooled). Returns TELEMETRY_OK, TELEMETRY_ETIMEDOUT,
 * or TELEMETRY_EREFUSED (at once) when the daemon refused the run.
 * Sleeps: not for the hot path. */
int telemetry_flush(telemetry *t, int timeout_ms);

/* Formats v as a JSON number that reads back as the same float32 (the
 * fewest of 6..9 significant digits that do, trailing zeros cut, so 0.1f is
 * "0.1"), or "null" when v is not finite. No printf, no locale. buf must
 * hold 24 bytes; no terminating NUL is guaranteed. Returns the length. */
int telemetry_format_float(char *buf, float v);

/* Unix time in seconds (CLOCK_REALTIME through the vDSO). */
double telemetry_now(void);

#endif
