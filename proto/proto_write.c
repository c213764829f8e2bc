/* proto_write.c: protocol v1's float formatting and the writer of every
 * message (see proto.h). Pure: writes into the caller's buffer, allocates
 * nothing, no locale on the trainer's side, no printf on the hot path
 * (steps).
 *
 * Not here: names and escaping (proto.c), the trainer->daemon parser
 * (proto_parse.c), the daemon->trainer parser (proto_reply.c). */
#include "proto.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- numbers */

static const double P10[23] = {
    1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
    1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
};
static const uint64_t U10[11] = {
    1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000, 1000000000, 10000000000ull,
};

static int utoa(char *p, uint64_t v) {
    char tmp[20];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (int i = 0; i < n; i++) p[i] = tmp[n - 1 - i];
    return n;
}

/* Writes the ndig decimal digits of m (no trailing zeros required) with the
 * first digit at decimal exponent e10, in plain or exponent notation. */
static int emit_decimal(char *p, uint64_t m, int ndig, int e10) {
    char d[10];
    while (ndig > 1 && m % 10 == 0) {
        m /= 10;
        ndig--;
    }
    for (int i = ndig - 1; i >= 0; i--) {
        d[i] = (char)('0' + m % 10);
        m /= 10;
    }
    char *s = p;
    if (e10 >= 0 && e10 < 16) {
        if (e10 + 1 >= ndig) {
            memcpy(s, d, (size_t)ndig);
            s += ndig;
            for (int i = 0; i < e10 + 1 - ndig; i++) *s++ = '0';
        } else {
            memcpy(s, d, (size_t)e10 + 1);
            s += e10 + 1;
            *s++ = '.';
            memcpy(s, d + e10 + 1, (size_t)(ndig - e10 - 1));
            s += ndig - e10 - 1;
        }
    } else if (e10 < 0 && e10 >= -5) {
        *s++ = '0';
        *s++ = '.';
        for (int i = 0; i < -e10 - 1; i++) *s++ = '0';
        memcpy(s, d, (size_t)ndig);
        s += ndig;
    } else {
        *s++ = d[0];
        if (ndig > 1) {
            *s++ = '.';
            memcpy(s, d + 1, (size_t)ndig - 1);
            s += ndig - 1;
        }
        *s++ = 'e';
        if (e10 < 0) {
            *s++ = '-';
            e10 = -e10;
        }
        s += utoa(s, (uint64_t)e10);
    }
    return (int)(s - p);
}

/* Shortest-ish round-trip float32 formatting without printf: scale by an
 * exact power of ten in double (53 bits are plenty for 9 digits of a 24-bit
 * mantissa; 9 digits always round-trip), then try 8, 7 and 6 digits while
 * they convert back to the same float the way a parser does ((float) of a
 * correctly rounded double). Trailing zeros are then cut, so 0.5 is "0.5". Magnitudes whose scaling
 * needs a power of ten beyond 1e22 (|v| < ~1e-14 or > ~1e31) and subnormals
 * fall back to "%.9g". */
int proto_format_float(char *buf, float v) {
    char *p = buf;
    if (!isfinite(v)) {
        memcpy(p, "null", 4);
        return 4;
    }
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    if (bits >> 31) {
        *p++ = '-';
        bits &= 0x7fffffffu;
        memcpy(&v, &bits, sizeof v);
    }
    if (bits == 0) {
        *p++ = '0';
        return (int)(p - buf);
    }
    int be = (int)(bits >> 23);
    if (be == 0) goto slow;
    int e2 = be - 127;
    int e10 = e2 >= 0 ? (e2 * 1233) >> 12 : -((-e2 * 1233 + 4095) >> 12);
    double d = v;
    uint64_t m9 = 0;
    for (int tries = 0; tries < 3; tries++) {
        int k = 8 - e10;
        if (k > 22 || k < -22) goto slow;
        double s = k >= 0 ? d * P10[k] : d / P10[-k];
        m9 = (uint64_t)(s + 0.5);
        if (m9 >= U10[9]) e10++;
        else if (m9 < U10[8]) e10--;
        else break;
    }
    if (m9 >= U10[9] || m9 < U10[8]) goto slow;
    /* Fewer digits while they still read back (descending: most metric
     * values need 8 or 9, so this usually stops after one or two tries). */
    uint32_t best = (uint32_t)m9;
    int best_nd = 9, best_e = e10;
    for (int nd = 8; nd >= 6; nd--) {
        uint32_t div = (uint32_t)U10[9 - nd];
        uint32_t m = ((uint32_t)m9 + div / 2) / div;
        int ee = e10;
        if (m >= U10[nd]) {
            m /= 10;
            ee++;
        }
        int kk = nd - 1 - ee; /* value = m / 10^kk */
        if (kk > 22 || kk < -22) break;
        double back = kk >= 0 ? (double)m / P10[kk] : (double)m * P10[-kk];
        if ((float)back != v) break;
        best = m;
        best_nd = nd;
        best_e = ee;
    }
    return (int)(p - buf) + emit_decimal(p, best, best_nd, best_e);
slow:
    return (int)(p - buf) + snprintf(p, 20, "%.9g", (double)v);
}

/* Unix seconds with microseconds, trailing zeros cut; p holds 40 bytes. */
static int format_time(char *p, double t) {
    int n = snprintf(p, 40, "%.6f", t);
    while (n > 1 && p[n - 1] == '0') n--;
    if (p[n - 1] == '.') n--;
    return n;
}

/* ---------------------------------------------------------------- writers */

#define PUT(str) (memcpy(p, str, sizeof(str) - 1), p += sizeof(str) - 1)

size_t proto_write_seq_prefix(char *out, uint64_t seq) {
    char *p = out;
    PUT("{\"seq\":");
    p += utoa(p, seq);
    *p++ = ',';
    return (size_t)(p - out);
}

size_t proto_write_hello(char *out, size_t cap, const char *run, int layers, int heads, int seq_len, int noncausal,
                         const char *meta, const char *token, size_t *public_len) {
    size_t tlen = token ? strlen(token) : 0;
    size_t need = 128 + strlen(run) + (meta ? strlen(meta) : 0) + 6 * tlen;
    if (need > cap) return 0;
    int n = snprintf(out, cap,
                     "{\"type\":\"hello\",\"protocol\":%d,\"run\":\"%s\",\"layers\":%d,\"heads\":%d,"
                     "\"seq_len\":%d,\"ack_delay_ms\":%d",
                     PROTO_VERSION, run, layers, heads, seq_len, PROTO_ACK_DELAY_MS);
    if (noncausal) n += snprintf(out + n, cap - (size_t)n, ",\"causal\":false");
    if (meta) n += snprintf(out + n, cap - (size_t)n, ",\"meta\":%s", meta);
    if (public_len) *public_len = (size_t)n;
    if (token) {
        n += snprintf(out + n, cap - (size_t)n, ",\"token\":\"");
        n += (int)proto_json_escape(out + n, token, tlen);
        out[n++] = '"';
    }
    out[n++] = '}';
    out[n++] = '\n';
    return (size_t)n;
}

size_t proto_step_body_max(int n_scalar, int n_layer, int n_head, int L, int H) {
    /* a value: at most PROTO_FLOAT_MAX bytes and a comma; a name, quoted, and a colon */
    size_t v = PROTO_FLOAT_MAX + 1, nm = PROTO_MAX_NAME + 8;
    return 256 + (size_t)n_scalar * (nm + v) + (size_t)n_layer * (nm + 2 + (size_t)L * v) +
           (size_t)n_head * (nm + 2 + (size_t)L * (2 + (size_t)H * v));
}

size_t proto_write_step_body(char *out, const struct proto_step_view *s) {
    char *p = out;
    PUT("\"type\":\"step\",\"step\":");
    p += utoa(p, (uint64_t)s->step);
    if (s->time >= 0) {
        PUT(",\"time\":");
        p += format_time(p, s->time);
    }
    if (s->n_scalar) {
        PUT(",\"scalars\":{");
        for (int i = 0; i < s->n_scalar; i++) {
            if (i) *p++ = ',';
            *p++ = '"';
            p += strlen(strcpy(p, s->scalar_names[i]));
            *p++ = '"';
            *p++ = ':';
            p += proto_format_float(p, s->scalars[i]);
        }
        *p++ = '}';
    }
    int L = s->L, H = s->H;
    if (s->n_layer) {
        PUT(",\"layers\":{");
        for (int i = 0; i < s->n_layer; i++) {
            const float *v = s->layers + (size_t)i * (size_t)L;
            if (i) *p++ = ',';
            *p++ = '"';
            p += strlen(strcpy(p, s->layer_names[i]));
            *p++ = '"';
            *p++ = ':';
            *p++ = '[';
            for (int l = 0; l < L; l++) {
                if (l) *p++ = ',';
                p += proto_format_float(p, v[l]);
            }
            *p++ = ']';
        }
        *p++ = '}';
    }
    if (s->n_head) {
        PUT(",\"heads\":{");
        for (int i = 0; i < s->n_head; i++) {
            const float *v = s->heads + (size_t)i * (size_t)L * (size_t)H;
            if (i) *p++ = ',';
            *p++ = '"';
            p += strlen(strcpy(p, s->head_names[i]));
            *p++ = '"';
            *p++ = ':';
            *p++ = '[';
            for (int l = 0; l < L; l++) {
                if (l) *p++ = ',';
                *p++ = '[';
                for (int h = 0; h < H; h++) {
                    if (h) *p++ = ',';
                    p += proto_format_float(p, v[(size_t)l * (size_t)H + (size_t)h]);
                }
                *p++ = ']';
            }
            *p++ = ']';
        }
        *p++ = '}';
    }
    *p++ = '}';
    *p++ = '\n';
    return (size_t)(p - out);
}

size_t proto_write_event_body(char *out, int level, const char *text, size_t tlen, double time) {
    char *p = out;
    PUT("\"type\":\"event\",\"level\":\"");
    p += strlen(strcpy(p, proto_level_name(level)));
    PUT("\",\"text\":\"");
    p += proto_json_escape(p, text, tlen);
    *p++ = '"';
    if (time >= 0) {
        PUT(",\"time\":");
        p += format_time(p, time);
    }
    *p++ = '}';
    *p++ = '\n';
    return (size_t)(p - out);
}

size_t proto_write_end_body(char *out, int status) {
    char *p = out;
    PUT("\"type\":\"end\",\"status\":\"");
    p += strlen(strcpy(p, proto_status_name(status)));
    PUT("\"}\n");
    return (size_t)(p - out);
}

size_t proto_write_welcome(char *out, size_t cap, int64_t run_id, uint64_t last_seq) {
    int n = snprintf(out, cap, "{\"type\":\"welcome\",\"run_id\":%lld,\"last_seq\":%llu}\n", (long long)run_id,
                     (unsigned long long)last_seq);
    return n > 0 && (size_t)n < cap ? (size_t)n : 0;
}

size_t proto_write_ack(char *out, size_t cap, uint64_t seq) {
    int n = snprintf(out, cap, "{\"type\":\"ack\",\"seq\":%llu}\n", (unsigned long long)seq);
    return n > 0 && (size_t)n < cap ? (size_t)n : 0;
}

size_t proto_write_error(char *out, size_t cap, int code, const char *message, int has_seq, int64_t seq) {
    size_t mlen = strlen(message);
    if (cap < 128 + 6 * mlen) return 0;
    char *p = out;
    PUT("{\"type\":\"error\",\"code\":\"");
    p += strlen(strcpy(p, proto_err_name(code)));
    PUT("\",\"message\":\"");
    p += proto_json_escape(p, message, mlen);
    *p++ = '"';
    if (has_seq) p += snprintf(p, 32, ",\"seq\":%lld", (long long)seq);
    *p++ = '}';
    *p++ = '\n';
    return (size_t)(p - out);
}

/* ---------------------------------------------------------- alert lines */

/* The JSON strings of an alert line, quotes and escapes at their longest. */
static size_t alert_strings_max(const struct proto_alert_view *v) {
    return 6 * (strlen(v->transition) + strlen(v->rule) + strlen(v->severity)) + 6;
}

size_t proto_alert_max(const struct proto_alert_view *v) {
    /* the keys and punctuation (< 128), two integers (20 bytes each) and
     * step_time (%.17g: at most 24) */
    return alert_strings_max(v) + strlen(v->alert) + 128 + 2 * 21 + 32;
}

/* A string field: ,"key": and the value as a JSON literal. */
static char *put_string(char *p, const char *key, const char *value) {
    p += sprintf(p, "\"%s\":", key);
    size_t len = strlen(value);
    *p++ = '"';
    p += proto_json_escape(p, value, len);
    *p++ = '"';
    return p;
}

size_t proto_write_alert(char *out, const struct proto_alert_view *v) {
    char *p = out;
    PUT("{\"type\":\"alert\",");
    p = put_string(p, "transition", v->transition);
    *p++ = ',';
    p = put_string(p, "rule", v->rule);
    *p++ = ',';
    p = put_string(p, "severity", v->severity);
    p += sprintf(p, ",\"start_step\":%lld,\"step\":%lld", (long long)v->start_step, (long long)v->step);
    if (isfinite(v->step_time)) {
        /* as cJSON prints a double: an integer in int's range as one, else
         * 15 significant digits when they read back as the same double, else
         * 17 (cJSON accepts a 15-digit form within an epsilon; an exact
         * read-back keeps the stamp the trainer compares with its own).
         * %g follows LC_NUMERIC, which the daemon leaves at "C". */
        double d = v->step_time;
        char num[32];
        if (fabs(d) <= 2147483647.0 && d == (double)(int)d) {
            snprintf(num, sizeof num, "%d", (int)d);
        } else {
            snprintf(num, sizeof num, "%1.15g", d);
            if (strtod(num, NULL) != d) snprintf(num, sizeof num, "%1.17g", d);
        }
        p += sprintf(p, ",\"step_time\":%s", num);
    }
    PUT(",\"alert\":");
    size_t alen = strlen(v->alert);
    memcpy(p, v->alert, alen);
    p += alen;
    *p++ = '}';
    *p = 0;
    return (size_t)(p - out);
}
#undef PUT
