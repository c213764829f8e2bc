/* proto.h: protocol v1 line parser (schema/protocol.md). Pure: no I/O, no
 * globals, no knowledge of runs or the database. One line in, one message
 * (or one error) out.
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
#define PROTO_MAX_LINE (4u * 1024 * 1024)   /* bytes, newline excluded */
#define PROTO_MAX_NAME 64                   /* metric name bytes */
#define PROTO_MAX_RUN 128                   /* run name bytes */
#define PROTO_MAX_METRICS 256               /* per kind per step */
#define PROTO_MAX_DIM 4096                  /* layers, heads */
#define PROTO_MAX_CELLS (1u << 20)          /* layers * heads */
#define PROTO_MAX_META (1u << 20)           /* meta JSON bytes */
#define PROTO_MAX_TEXT (64u * 1024)         /* event text bytes */

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
    PROTO_E_COUNT
};

enum proto_kind { PROTO_SCALAR = 0, PROTO_LAYER = 1, PROTO_HEAD = 2 };
enum proto_level { PROTO_INFO = 0, PROTO_WARN, PROTO_ERROR };
enum proto_status { PROTO_LIVE = 0, PROTO_STALE, PROTO_FINISHED, PROTO_FAILED, PROTO_ABORTED };

/* One metric of a step. values points into the message's value array. */
struct proto_metric {
    char name[PROTO_MAX_NAME + 1];
    int kind;          /* enum proto_kind */
    uint32_t rows;     /* scalar: 1; layer: array length; head: outer length */
    uint32_t cols;     /* scalar, layer: 1; head: inner length (all equal) */
    uint32_t offset;   /* first value in proto_msg.values */
};

/* A parsed message. Every pointer is owned by the message and freed by
 * proto_msg_free(); a zeroed struct is a valid empty message. */
struct proto_msg {
    int type;                    /* enum proto_type */
    int has_seq;
    int64_t seq;
    /* hello */
    char run[PROTO_MAX_RUN + 1];
    int64_t protocol, layers, heads, seq_len;
    char *meta;                  /* JSON object text, NUL-terminated; NULL if absent */
    char *token;                 /* NULL if absent */
    /* step */
    int64_t step;
    int has_time;
    double time;
    uint32_t nmetrics;
    struct proto_metric *metrics;
    uint32_t nvalues;
    float *values;               /* NaN where the line had null */
    /* event */
    int level;                   /* enum proto_level */
    char *text;
    /* end */
    int status;                  /* enum proto_status */
};

/* Parses one line (without its newline; a trailing '\r' is allowed) into
 * *msg, which must be zeroed or freed. Returns PROTO_OK, or an error code
 * with a one-line explanation in err (always NUL-terminated). On error, msg
 * may hold partial results (seq, when it was read: has_seq) and must still be
 * passed to proto_msg_free(). Never reads outside [line, line+len). */
int proto_parse(const char *line, size_t len, struct proto_msg *msg,
                char *err, size_t errlen);

/* Frees what the message owns and zeroes it. Accepts a zeroed message. */
void proto_msg_free(struct proto_msg *msg);

/* The wire name of an error code ("bad_json"), or "internal" out of range. */
const char *proto_err_name(int code);

/* Names for levels and statuses, as on the wire and in the database. */
const char *proto_level_name(int level);
const char *proto_status_name(int status);

/* Writes a JSON string literal (with quotes) of s[0..len) into out, escaping
 * as JSON requires. Returns the bytes written (without NUL), or the length
 * needed if it exceeds cap (then out is not terminated). */
size_t proto_json_string(char *out, size_t cap, const char *s, size_t len);

/* A metric value as stored: float32, a finite double beyond its range
 * saturated to +-FLT_MAX (a JSON number is finite; Inf is sent as null). */
float proto_to_f32(double d);

#endif
