/* proto.h: protocol v1 (schema/protocol.md), the one home of its limits,
 * names, escaping, number formatting, and a writer and a parser for every
 * message in both directions. Built once (libproto.a), linked into the
 * daemon and the trainer and carried inside the client library
 * (libentropyd_telemetry). Pure: no I/O, no globals, no knowledge of runs,
 * databases or sockets.
 *
 *   trainer -> daemon: proto_write_hello / _step_body / _event_body /
 *       _end_body write, proto_parse (proto_parse.c) reads;
 *   daemon -> trainer: proto_write_welcome / _ack / _error / _alert write,
 *       proto_parse_reply (proto_reply.c) reads; proto_parse_alert reads an
 *       alert line's fields for a trainer that acts on it.
 * tests/test_proto_roundtrip.c writes and parses every message type.
 *
 * The files: proto.c the vocabulary (names, escaping, the float32 rule),
 * proto_parse.c the trainer -> daemon parser, proto_write.c float formatting
 * and the writers, proto_reply.c the daemon -> trainer parser.
 *
 * proto_parse.c's parser:
 *
 * The parser is a hand-written JSON reader specialised for the hot message,
 * `step`: numbers go straight into one float array, so a 12x12 model's step
 * line costs one allocation or two instead of a node per value. Everything
 * it accepts is valid JSON (RFC 8259, UTF-8 checked); fields it does not know
 * are validated and skipped, so newer trainers can add fields. */
#ifndef PROTO_H
#define PROTO_H

#include <stddef.h>
#include <stdint.h>

#define PROTO_VERSION 1
#define PROTO_MAX_LINE (4u * 1024 * 1024) /* bytes, newline excluded: the limit of a run of no cells */
#define PROTO_MAX_NAME 64                 /* metric name bytes */
#define PROTO_MAX_RUN 128                 /* run name bytes */
#define PROTO_MAX_METRICS 256             /* per kind per step */
#define PROTO_MAX_DIM 4096                /* layers, heads */
#define PROTO_MAX_CELLS (1u << 20)        /* layers * heads */
#define PROTO_MAX_META (1u << 20)         /* meta JSON bytes */
#define PROTO_MAX_TEXT (64u * 1024)       /* event text bytes */

enum proto_type { PROTO_NONE = 0, PROTO_HELLO, PROTO_STEP, PROTO_EVENT, PROTO_END };

/* Error codes, in the order of the table in schema/protocol.md. The
 * parser itself returns only the ones up to PROTO_E_BAD_PROTOCOL; the rest
 * are raised by the ingest layer, which knows the runs. */
enum proto_err {
    PROTO_OK = 0,
    PROTO_E_LINE_TOO_LONG,
    PROTO_E_BAD_JSON,
    PROTO_E_BAD_TYPE,
    PROTO_E_MISSING_FIELD,
    PROTO_E_BAD_FIELD,
    PROTO_E_BAD_SHAPE,
    PROTO_E_BAD_PROTOCOL,
    PROTO_E_NO_HELLO,
    PROTO_E_SHAPE_MISMATCH,
    PROTO_E_KIND_CONFLICT,
    PROTO_E_SEQ_GAP,
    PROTO_E_DUPLICATE,
    PROTO_E_RUN_ENDED,
    PROTO_E_UNAUTHORIZED,
    PROTO_E_SUPERSEDED,
    PROTO_E_TOO_MANY_ERRORS,
    PROTO_E_INTERNAL,
    PROTO_E_DB_FAILING, /* the daemon cannot write its database (full disk, I/O error): nothing is
                             acked until it can; sent once a streak to each connection */
    PROTO_E_COUNT
};

enum proto_kind { PROTO_SCALAR = 0, PROTO_LAYER = 1, PROTO_HEAD = 2 };
enum proto_level { PROTO_INFO = 0, PROTO_WARN, PROTO_ERROR };
enum proto_status { PROTO_LIVE = 0, PROTO_STALE, PROTO_FINISHED, PROTO_FAILED, PROTO_ABORTED };

/* One metric of a step. values points into the message's value array. */
struct proto_metric {
    char name[PROTO_MAX_NAME + 1];
    int kind;        /* enum proto_kind */
    uint32_t rows;   /* scalar: 1; layer: array length; head: outer length */
    uint32_t cols;   /* scalar, layer: 1; head: inner length (all equal) */
    uint32_t offset; /* first value in proto_msg.values */
};

/* A parsed message. Every pointer is owned by the message and freed by
 * proto_msg_free(); a zeroed struct is a valid empty message. */
struct proto_msg {
    int type; /* enum proto_type */
    int has_seq;
    int64_t seq;
    /* hello */
    char run[PROTO_MAX_RUN + 1];
    int64_t protocol, layers, heads, seq_len;
    int noncausal;        /* "causal":false: every row attends all seq_len
                                  * positions; 0 (also when absent): causal */
    int64_t ack_delay_ms; /* how late acks may come (0 when absent): the client
                                  * sends without waiting for them (schema/protocol.md) */
    char *meta;           /* JSON object text, NUL-terminated; NULL if absent */
    char *token;          /* NULL if absent */
    /* step */
    int64_t step;
    int has_time;
    double time;
    uint32_t nmetrics;
    struct proto_metric *metrics;
    uint32_t nvalues;
    float *values; /* NaN where the line had null */
    /* event */
    int level; /* enum proto_level */
    char *text;
    /* end */
    int status; /* enum proto_status */
};

/* ---- line limit --------------------------------------------------------- */

/* A step's line grows with its run's cells: a 1,048,576-cell run was
 * admitted, but any step of it with real values was over 4 MiB.
 * So the limit grows with the cells: a run of n cells may send lines of
 * proto_line_max(n) bytes: PROTO_MAX_LINE for everything but the head
 * metrics (scalars, layer metrics, the JSON around them) plus room for
 * PROTO_STEP_HEAD_METRICS head metrics of n values, each at its longest as
 * proto_format_float writes it ("-1.17549435e-38" and a comma: 16 bytes).
 * A step of more head metrics fits while its values are shorter. The
 * client drops a step over its run's limit (dropped_oversize); the daemon
 * takes lines up to the limit of its --max-cells-per-run. */
#define PROTO_STEP_HEAD_METRICS 8
#define PROTO_VALUE_MAX_BYTES 16
size_t proto_line_max(int64_t cells); /* cells clamped to 0..PROTO_MAX_CELLS */
#define PROTO_MAX_LINE_ANY \
    ((size_t)PROTO_MAX_LINE + (size_t)PROTO_MAX_CELLS * PROTO_STEP_HEAD_METRICS * PROTO_VALUE_MAX_BYTES)

/* ---- parser, trainer -> daemon (proto_parse.c) */

/* Parses one line (without its newline; a trailing '\r' is allowed) into
 * *msg, which must be zeroed or freed. Returns PROTO_OK, or an error code
 * with a one-line explanation in err (always NUL-terminated). On error, msg
 * may hold partial results (seq, when it was read: has_seq) and must still be
 * passed to proto_msg_free(). Never reads outside [line, line+len). */
int proto_parse(const char *line, size_t len, struct proto_msg *msg, char *err, size_t errlen);

/* proto_parse with a line limit of max bytes (proto_line_max) instead of
 * PROTO_MAX_LINE; values are bounded by it too. */
int proto_parse_max(const char *line, size_t len, size_t max, struct proto_msg *msg, char *err, size_t errlen);

/* Frees what the message owns and zeroes it. Accepts a zeroed message. */
void proto_msg_free(struct proto_msg *msg);

/* ---- names, levels, statuses, strings, the float32 rule (proto.c) */

/* The wire name of an error code ("bad_json"), or "internal" out of range. */
const char *proto_err_name(int code);

/* Names for levels and statuses, as on the wire and in the database. */
const char *proto_level_name(int level);
const char *proto_status_name(int status);

/* A metric value as stored: float32, a finite double beyond its range
 * saturated to +-FLT_MAX (a JSON number is finite; Inf is sent as null). */
float proto_to_f32(double d);

/* Writes a JSON string literal (with quotes) of s[0..len) into out, escaping
 * as JSON requires; a byte that does not begin a valid UTF-8 sequence is
 * written as '?', so the literal is always valid JSON. Returns the bytes
 * written (without NUL), or the length needed if it exceeds cap (then out
 * is not terminated). */
size_t proto_json_string(char *out, size_t cap, const char *s, size_t len);
/* The same escaping, the body only (no quotes, not terminated), into an out
 * that holds 6 * len bytes. Returns the bytes written. */
size_t proto_json_escape(char *out, const char *s, size_t len);

/* The length (1..4) of the valid UTF-8 sequence that begins s[0..n), or 0
 * when none does (n 0, a stray or truncated byte, an overlong form, a
 * surrogate, beyond U+10FFFF): what the parser accepts in a string and the
 * escaper passes through. */
int proto_utf8_len(const unsigned char *s, size_t n);

/* 1 when s[0..n) is a metric name: 1..PROTO_MAX_NAME bytes of [A-Za-z0-9._:-]. */
int proto_valid_name(const char *s, size_t n);
/* 1 when s[0..n) is a run name: 1..PROTO_MAX_RUN bytes of [A-Za-z0-9._:@+-]. */
int proto_valid_run(const char *s, size_t n);
/* The enum value of a wire name, or -1: "info|warn|error";
 * "live|stale|finished|failed|aborted". */
int proto_level_parse(const char *s);
int proto_status_parse(const char *s);

/* ---- numbers (proto_write.c) */

/* v as a JSON number that reads back as the same float32 (the fewest of
 * 6..9 significant digits that do, trailing zeros cut: 0.1f is "0.1"), or
 * "null" when v is not finite: the protocol's only spelling of NaN and
 * +-Inf. No locale. buf must hold PROTO_FLOAT_MAX bytes; not terminated.
 * Returns the length. */
#define PROTO_FLOAT_MAX 24
int proto_format_float(char *buf, float v);

/* ---- writers, trainer -> daemon (proto_write.c)
 *
 * Every message after hello is a prefix {"seq":N, and a body: a client's
 * spool renumbers lines by rewriting the prefix alone. The bodies end with
 * "}\n". Writers do not check their arguments (the caller validated names
 * and levels); the _max functions bound what they write. */
#define PROTO_SEQ_PREFIX_MAX 32 /* {"seq":18446744073709551615, */
size_t proto_write_seq_prefix(char *out, uint64_t seq);

/* What this library's clients say in hello as ack_delay_ms: they send
 * without waiting for acks (a queue and a spool hold what is unacked), so
 * the daemon may hold a commit this long to share it with later steps. */
#define PROTO_ACK_DELAY_MS 40
#define PROTO_MAX_ACK_DELAY_MS 60000

/* The hello line (with its newline), with ack_delay_ms PROTO_ACK_DELAY_MS.
 * noncausal: nonzero adds "causal":false (causal, the default, is not
 * written). meta: JSON object text on one line,
 * or NULL; token or NULL. Returns the length, or 0 when it would not fit
 * in cap. *public_len (if not NULL) gets the length before the token, so
 * the hello can be stored without it. */
size_t proto_write_hello(char *out, size_t cap, const char *run, int layers, int heads, int seq_len, int noncausal,
                         const char *meta, const char *token, size_t *public_len);

/* A step: names are arrays of PROTO_MAX_NAME+1 chars (NUL-terminated),
 * values row-major: layers (n_layer, L), heads (n_head, L, H). */
typedef char proto_name[PROTO_MAX_NAME + 1];
struct proto_step_view {
    int64_t step;
    double time; /* < 0: omitted (the daemon stamps it) */
    int L, H;
    int n_scalar, n_layer, n_head;
    const proto_name *scalar_names;
    const float *scalars;
    const proto_name *layer_names;
    const float *layers;
    const proto_name *head_names;
    const float *heads;
};
size_t proto_step_body_max(int n_scalar, int n_layer, int n_head, int L, int H);
size_t proto_write_step_body(char *out, const struct proto_step_view *v);
/* text: UTF-8 (invalid bytes become '?'), tlen <= PROTO_MAX_TEXT; needs
 * 6 * tlen + 128 bytes. time < 0: omitted. */
size_t proto_write_event_body(char *out, int level, const char *text, size_t tlen, double time);
size_t proto_write_end_body(char *out, int status);

/* ---- writers, daemon -> trainer (proto_write.c); each line with its
 * newline, cap >= 512 + 6 * strlen(message) for errors. */
size_t proto_write_welcome(char *out, size_t cap, int64_t run_id, uint64_t last_seq);
size_t proto_write_ack(char *out, size_t cap, uint64_t seq);
size_t proto_write_error(char *out, size_t cap, int code, const char *message, int has_seq, int64_t seq);

/* An alert transition as the daemon sends it to the run's trainer:
 * {"type":"alert","transition":T,"rule":R,"severity":S,"start_step":N,
 *  "step":N[,"step_time":X],"alert":{...}} (schema/protocol.md). Nothing is
 * copied: the strings must outlive the write. */
struct proto_alert_view {
    const char *transition; /* firing|update|resolved */
    const char *rule, *severity;
    int64_t start_step, step;
    double step_time;  /* not finite: omitted (a clock-driven rule, a step without time) */
    const char *alert; /* the alert object: JSON text on one line, written as it is */
};
/* The bytes proto_write_alert needs for v, its NUL included. */
size_t proto_alert_max(const struct proto_alert_view *v);
/* Writes v's line WITHOUT a newline (the daemon posts it to the run's
 * connection and to its event stream, which add their own framing) and a
 * NUL, into out of proto_alert_max(v) bytes. Returns the length. Numbers
 * are written as cJSON writes them (an integer as one; step_time in the
 * fewest of 15 or 17 significant digits that read back exactly). */
size_t proto_write_alert(char *out, const struct proto_alert_view *v);

/* ---- parser, daemon -> trainer (proto_reply.c) */

enum proto_reply_type { PROTO_R_UNKNOWN = 0, PROTO_R_WELCOME, PROTO_R_ACK, PROTO_R_ERROR, PROTO_R_ALERT };

#define PROTO_MAX_RULE 128 /* rule name bytes (the daemon's rules file) */

/* An alert line's fields (the "alert" object itself is not read: a trainer
 * acts on the transition, not on its labels). Strings longer than their
 * array are truncated. */
struct proto_alert {
    char transition[16]; /* firing|update|resolved */
    char rule[PROTO_MAX_RULE + 1];
    char severity[64];        /* "" when absent */
    int64_t start_step, step; /* the step the condition began at; this transition's */
    int has_step_time;
    double step_time; /* when has_step_time: the trainer's "time" of the step evaluated */
};

/* Reads an alert line (without newline). Returns 0 and fills *a, or -1 when
 * the line is not JSON, not of type "alert", or lacks "transition", "rule"
 * (strings), "start_step" or "step" (integers). Never reads outside
 * [line, line+len). */
int proto_parse_alert(const char *line, size_t len, struct proto_alert *a);

struct proto_reply {
    int type;           /* enum proto_reply_type; UNKNOWN for other or bad lines */
    char type_name[32]; /* the "type" field, truncated; "" when absent */
    int64_t run_id;     /* welcome */
    uint64_t last_seq;  /* welcome */
    int has_seq;        /* ack (always), error (when present) */
    uint64_t seq;
    int code;                 /* error: enum proto_err, -1 for a code this side does not know */
    char code_name[32];       /* error: the code as sent, truncated */
    char message[256];        /* error: truncated */
    struct proto_alert alert; /* alert (proto_parse_alert's fields) */
};

/* Parses one daemon line (without newline). Returns 0 and fills *r, or -1
 * (r->type UNKNOWN) when the line is not a JSON object or a known type
 * lacks a required field (an alert: proto_parse_alert's). Never reads
 * outside [line, line+len). */
int proto_parse_reply(const char *line, size_t len, struct proto_reply *r);

#endif
