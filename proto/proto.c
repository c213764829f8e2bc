/* proto.c: protocol v1's vocabulary, the ground every other part of proto/
 * stands on: the metric and run name rules, the wire names of levels,
 * statuses and error codes, JSON string escaping, and the float32 rule for
 * numbers. See proto.h for the contract.
 *
 * Not here: the trainer -> daemon parser (proto_parse.c), the writers and
 * float formatting (proto_write.c), the daemon -> trainer parser
 * (proto_reply.c). */
#include "proto.h"

#include <float.h>
#include <stdint.h>
#include <string.h>

/* ---------------------------------------------------------------- names */

static int metric_char(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == ':' || c == '-';
}

int proto_valid_name(const char *s, size_t n) {
    if (n < 1 || n > PROTO_MAX_NAME) return 0;
    for (size_t i = 0; i < n; i++)
        if (!metric_char((unsigned char)s[i])) return 0;
    return 1;
}

int proto_valid_run(const char *s, size_t n) {
    if (n < 1 || n > PROTO_MAX_RUN) return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!metric_char(c) && c != '@' && c != '+') return 0;
    }
    return 1;
}

static const char *const level_names[] = {"info", "warn", "error"};
static const char *const status_names[] = {"live", "stale", "finished", "failed", "aborted"};
static const char *const err_names[PROTO_E_COUNT] = {
    "ok",           "line_too_long", "bad_json",        "bad_type",      "missing_field", "bad_field", "bad_shape",
    "bad_protocol", "no_hello",      "shape_mismatch",  "kind_conflict", "seq_gap",       "duplicate", "run_ended",
    "unauthorized", "superseded",    "too_many_errors", "internal",      "db_failing"};

const char *proto_err_name(int code) { return code >= 0 && code < PROTO_E_COUNT ? err_names[code] : "internal"; }

const char *proto_level_name(int level) {
    return level >= PROTO_INFO && level <= PROTO_ERROR ? level_names[level] : "info";
}

const char *proto_status_name(int status) {
    return status >= PROTO_LIVE && status <= PROTO_ABORTED ? status_names[status] : "live";
}

int proto_level_parse(const char *s) {
    for (int i = PROTO_INFO; s && i <= PROTO_ERROR; i++)
        if (!strcmp(s, level_names[i])) return i;
    return -1;
}

int proto_status_parse(const char *s) {
    for (int i = PROTO_LIVE; s && i <= PROTO_ABORTED; i++)
        if (!strcmp(s, status_names[i])) return i;
    return -1;
}

/* ---------------------------------------------------------------- strings */

int proto_utf8_len(const unsigned char *s, size_t n) {
    if (n == 0) return 0;
    unsigned c = s[0];
    int k;
    unsigned min;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) {
        k = 2;
        min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
        k = 3;
        min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        k = 4;
        min = 0x10000;
    } else return 0;
    if (n < (size_t)k) return 0;
    unsigned cp = c & (0x3F >> (k - 1));
    for (int i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return k;
}

/* The one escaper: writes the body of s[0..len) as a JSON string into
 * out[0..cap) (bytes past cap are counted, not written) and returns the
 * length of the whole body. */
static size_t escape(char *out, size_t cap, const char *str, size_t len) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *s = (const unsigned char *)str;
    size_t n = 0;
#define PUT(c)                           \
    do {                                 \
        if (n < cap) out[n] = (char)(c); \
        n++;                             \
    } while (0)
    for (size_t i = 0; i < len;) {
        unsigned c = s[i];
        if (c == '"' || c == '\\') {
            PUT('\\');
            PUT(c);
            i++;
        } else if (c == '\n') {
            PUT('\\');
            PUT('n');
            i++;
        } else if (c == '\r') {
            PUT('\\');
            PUT('r');
            i++;
        } else if (c == '\t') {
            PUT('\\');
            PUT('t');
            i++;
        } else if (c < 0x20) {
            PUT('\\');
            PUT('u');
            PUT('0');
            PUT('0');
            PUT(hex[c >> 4]);
            PUT(hex[c & 15]);
            i++;
        } else if (c < 0x80) {
            PUT(c);
            i++;
        } else {
            int k = proto_utf8_len(s + i, len - i);
            if (k == 0) {
                PUT('?');
                i++;
                continue;
            }
            for (int j = 0; j < k; j++) PUT(s[i + j]);
            i += k;
        }
    }
#undef PUT
    return n;
}

size_t proto_json_escape(char *out, const char *s, size_t len) { return escape(out, SIZE_MAX, s, len); }

size_t proto_json_string(char *out, size_t cap, const char *s, size_t len) {
    size_t body = escape(cap > 1 ? out + 1 : NULL, cap > 1 ? cap - 1 : 0, s, len);
    size_t n = body + 2;
    if (cap > 0) out[0] = '"';
    if (n - 1 < cap) out[n - 1] = '"';
    if (n < cap) out[n] = 0;
    return n;
}

/* ---------------------------------------------------------------- numbers */

float proto_to_f32(double d) {
    /* a JSON number is always finite (the protocol sends null for NaN and
     * Inf): one beyond float32's range saturates rather than becoming Inf,
     * which would read as a diverged value */
    if (d > FLT_MAX) return FLT_MAX;
    if (d < -FLT_MAX) return -FLT_MAX;
    return (float)d;
}
