/* proto_parse.c: protocol v1's trainer -> daemon line parser (the daemon's
 * hot path). See proto.h for the contract and schema/protocol.md for the
 * messages. This file knows JSON and the message shapes; it knows nothing of
 * runs, sockets or storage. The names it checks against (metric and run
 * names, levels, statuses) are proto.c's. */
#include "proto.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64

/* Parser state: a cursor over one line and the message being filled. */
struct parser {
    const char *p, *end, *start;
    struct proto_msg *msg;
    char *err;
    size_t errlen;
    int code;
    uint32_t cap_values, cap_metrics;
    size_t max; /* the line limit */
};

static int fail(struct parser *ps, int code, const char *fmt, ...) {
    if (ps->code != PROTO_OK) return -1; /* keep the first error */
    ps->code = code;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(ps->err, ps->errlen, fmt, ap);
    va_end(ap);
    if (code == PROTO_E_BAD_JSON && n >= 0 && (size_t)n < ps->errlen)
        snprintf(ps->err + n, ps->errlen - (size_t)n, " at byte %zu", (size_t)(ps->p - ps->start));
    return -1;
}

static void skip_ws(struct parser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')) ps->p++;
}

static int expect(struct parser *ps, char c) {
    skip_ws(ps);
    if (ps->p >= ps->end || *ps->p != c) return fail(ps, PROTO_E_BAD_JSON, "expected '%c'", c);
    ps->p++;
    return 0;
}

/* Past a member of an object or an element of an array: 1 after a ','
 * (another one follows), 0 after close (the container ends), -1 with
 * bad_json otherwise. */
static int next_or_close(struct parser *ps, char close) {
    skip_ws(ps);
    if (ps->p < ps->end && (*ps->p == ',' || *ps->p == close)) return *ps->p++ == ',';
    return fail(ps, PROTO_E_BAD_JSON, "expected ',' or '%c'", close);
}

static size_t put_utf8(char *o, unsigned cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static int hex4(const char *s, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

/* Reads a JSON string at the cursor. With out != NULL, decodes it into out
 * (cap bytes, NUL-terminated) and stores its length in *outlen; a string
 * longer than cap-1 is a PROTO_E_BAD_FIELD error naming `what`. With
 * out == NULL it only validates. Decoding never writes more bytes than the
 * escaped source holds, which is what lets callers size buffers by it. */
static int parse_string(struct parser *ps, char *out, size_t cap, size_t *outlen, const char *what) {
    skip_ws(ps);
    if (ps->p >= ps->end || *ps->p != '"') return fail(ps, PROTO_E_BAD_JSON, "expected string");
    ps->p++;
    size_t n = 0;
    char tmp[4];
    while (1) {
        if (ps->p >= ps->end) return fail(ps, PROTO_E_BAD_JSON, "unterminated string");
        unsigned char c = (unsigned char)*ps->p;
        const char *piece = ps->p;
        size_t plen;
        if (c == '"') {
            ps->p++;
            break;
        }
        if (c < 0x20) return fail(ps, PROTO_E_BAD_JSON, "control character in string");
        if (c == '\\') {
            if (ps->end - ps->p < 2) return fail(ps, PROTO_E_BAD_JSON, "bad escape");
            char e = ps->p[1];
            ps->p += 2;
            piece = tmp;
            plen = 1;
            switch (e) {
            case '"': tmp[0] = '"'; break;
            case '\\': tmp[0] = '\\'; break;
            case '/': tmp[0] = '/'; break;
            case 'b': tmp[0] = '\b'; break;
            case 'f': tmp[0] = '\f'; break;
            case 'n': tmp[0] = '\n'; break;
            case 'r': tmp[0] = '\r'; break;
            case 't': tmp[0] = '\t'; break;
            case 'u': {
                unsigned cp, lo;
                if (ps->end - ps->p < 4 || hex4(ps->p, &cp)) return fail(ps, PROTO_E_BAD_JSON, "bad \\u escape");
                ps->p += 4;
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    if (ps->end - ps->p < 6 || ps->p[0] != '\\' || ps->p[1] != 'u' || hex4(ps->p + 2, &lo) ||
                        lo < 0xDC00 || lo > 0xDFFF)
                        return fail(ps, PROTO_E_BAD_JSON, "unpaired surrogate");
                    ps->p += 6;
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                    return fail(ps, PROTO_E_BAD_JSON, "unpaired surrogate");
                }
                if (cp == 0) return fail(ps, PROTO_E_BAD_FIELD, "NUL character in string");
                plen = put_utf8(tmp, cp);
                break;
            }
            default: return fail(ps, PROTO_E_BAD_JSON, "bad escape");
            }
        } else {
            int l = proto_utf8_len((const unsigned char *)ps->p, (size_t)(ps->end - ps->p));
            if (l == 0) return fail(ps, PROTO_E_BAD_JSON, "invalid UTF-8");
            ps->p += l;
            plen = (size_t)l;
        }
        if (out) {
            if (n + plen + 1 > cap) return fail(ps, PROTO_E_BAD_FIELD, "%s is too long (max %zu bytes)", what, cap - 1);
            memcpy(out + n, piece, plen);
        }
        n += plen;
    }
    if (out) {
        out[n] = 0;
        *outlen = n;
    }
    return 0;
}

static const double pow10_tab[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                   1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* Reads a JSON number. The common case (at most 19 significant digits, small
 * exponent) is computed exactly enough for float32 storage and double time
 * stamps from an integer mantissa and a power-of-ten table; anything else goes
 * through strtod. *is_int is set when the literal has no fraction or exponent. */
static int parse_number(struct parser *ps, double *out, int *is_int) {
    skip_ws(ps);
    const char *s = ps->p, *p = ps->p;
    int neg = 0;
    if (p < ps->end && *p == '-') {
        neg = 1;
        p++;
    }
    if (p >= ps->end || *p < '0' || *p > '9') return fail(ps, PROTO_E_BAD_JSON, "expected value");
    uint64_t mant = 0;
    int digits = 0, exp10 = 0, slow = 0;
    if (*p == '0') {
        p++;
    } else {
        while (p < ps->end && *p >= '0' && *p <= '9') {
            if (digits < 19) {
                mant = mant * 10 + (uint64_t)(*p - '0');
                digits++;
            } else {
                exp10++;
                slow = 1;
            }
            p++;
        }
    }
    int integer = 1;
    if (p < ps->end && *p == '.') {
        integer = 0;
        p++;
        if (p >= ps->end || *p < '0' || *p > '9') return fail(ps, PROTO_E_BAD_JSON, "bad number");
        while (p < ps->end && *p >= '0' && *p <= '9') {
            if (mant == 0 && *p == '0') {
                exp10--;
            } else if (digits < 19) {
                mant = mant * 10 + (uint64_t)(*p - '0');
                digits++;
                exp10--;
            } else slow = 1;
            p++;
        }
    }
    if (p < ps->end && (*p == 'e' || *p == 'E')) {
        integer = 0;
        p++;
        int eneg = 0, e = 0;
        if (p < ps->end && (*p == '+' || *p == '-')) {
            eneg = *p == '-';
            p++;
        }
        if (p >= ps->end || *p < '0' || *p > '9') return fail(ps, PROTO_E_BAD_JSON, "bad number");
        while (p < ps->end && *p >= '0' && *p <= '9') {
            if (e < 100000) e = e * 10 + (*p - '0');
            p++;
        }
        exp10 += eneg ? -e : e;
    }
    ps->p = p;
    *is_int = integer;
    double v;
    if (!slow && exp10 >= -22 && exp10 <= 22 && mant < (1ull << 53)) {
        v = (double)mant;
        v = exp10 < 0 ? v / pow10_tab[-exp10] : v * pow10_tab[exp10];
    } else {
        char buf[512];
        size_t l = (size_t)(p - s);
        if (l >= sizeof buf) return fail(ps, PROTO_E_BAD_FIELD, "number literal too long");
        memcpy(buf, s, l);
        buf[l] = 0;
        v = strtod(buf, NULL);
        neg = 0; /* strtod saw the sign */
    }
    *out = neg ? -v : v;
    return 0;
}


/* The number of a vector element the common way writers print it
 * ([-]digits[.digits][e[+-]digits], at most 19 significant digits, the
 * integer part without a leading 0 unless it is 0): its value as
 * parse_number and proto_to_f32 give it, and the byte after it. NULL for
 * anything else, which parse_number then reads (or refuses) itself. One
 * pass over the characters with the position held in a register: the
 * per-value cost of a head frame's 144 numbers. */
static const char *fast_number(const char *p, const char *end, float *out) {
    int neg = 0;
    if (p < end && *p == '-') {
        neg = 1;
        p++;
    }
    if (p >= end || (unsigned)(*p - '0') > 9) return NULL;
    uint64_t mant = 0;
    int digits = 0, exp10 = 0;
    if (*p == '0') {
        p++;
        if (p < end && (unsigned)(*p - '0') <= 9) return NULL; /* 01: an error, said by parse_number */
    } else {
        for (; p < end && (unsigned)(*p - '0') <= 9; p++) {
            if (++digits > 19) return NULL;
            mant = mant * 10 + (uint64_t)(*p - '0');
        }
    }
    if (p < end && *p == '.') {
        p++;
        if (p >= end || (unsigned)(*p - '0') > 9) return NULL;
        for (; p < end && (unsigned)(*p - '0') <= 9; p++) {
            exp10--;
            if (mant == 0 && *p == '0') continue; /* leading zeros of 0.000123 */
            if (++digits > 19) return NULL;
            mant = mant * 10 + (uint64_t)(*p - '0');
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        int eneg = 0, e = 0, ed = 0;
        if (p < end && (*p == '+' || *p == '-')) {
            eneg = *p == '-';
            p++;
        }
        for (; p < end && (unsigned)(*p - '0') <= 9; p++, ed++) {
            if (ed >= 4) return NULL;
            e = e * 10 + (*p - '0');
        }
        if (!ed) return NULL;
        exp10 += eneg ? -e : e;
    }
    if (exp10 < -22 || exp10 > 22 || mant >= (UINT64_C(1) << 53)) return NULL;
    double v = exp10 < 0 ? (double)mant / pow10_tab[-exp10] : (double)mant * pow10_tab[exp10];
    *out = proto_to_f32(neg ? -v : v);
    return p;
}

static int skip_value(struct parser *ps, int depth);

static int skip_container(struct parser *ps, char close, int depth) {
    ps->p++; /* the opening bracket */
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        return 0;
    }
    while (1) {
        if (close == '}') {
            if (parse_string(ps, NULL, 0, NULL, "key") || expect(ps, ':')) return -1;
        }
        if (skip_value(ps, depth + 1)) return -1;
        int more = next_or_close(ps, close);
        if (more <= 0) return more;
    }
}

static int match_lit(struct parser *ps, const char *lit) {
    size_t n = strlen(lit);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, lit, n) != 0)
        return fail(ps, PROTO_E_BAD_JSON, "expected value");
    ps->p += n;
    return 0;
}

/* Validates any JSON value and moves past it. */
static int skip_value(struct parser *ps, int depth) {
    if (depth > MAX_DEPTH) return fail(ps, PROTO_E_BAD_JSON, "nesting deeper than %d", MAX_DEPTH);
    skip_ws(ps);
    if (ps->p >= ps->end) return fail(ps, PROTO_E_BAD_JSON, "expected value");
    double d;
    int isint;
    switch (*ps->p) {
    case '{': return skip_container(ps, '}', depth);
    case '[': return skip_container(ps, ']', depth);
    case '"': return parse_string(ps, NULL, 0, NULL, "string");
    case 't': return match_lit(ps, "true");
    case 'f': return match_lit(ps, "false");
    case 'n': return match_lit(ps, "null");
    default: return parse_number(ps, &d, &isint);
    }
}

static char peek(struct parser *ps) {
    skip_ws(ps);
    return ps->p < ps->end ? *ps->p : 0;
}

/* At a value that must be an array (open '[') or an object ('{'): 1 past
 * the opening bracket with a member to come, 0 past an empty one, -1 with
 * bad_field (fmt names it with name) and the value skipped otherwise. */
static int open_container(struct parser *ps, char open, const char *fmt, const char *name) {
    if (peek(ps) != open) {
        if (skip_value(ps, 1)) return -1;
        return fail(ps, PROTO_E_BAD_FIELD, fmt, name);
    }
    ps->p++;
    if (peek(ps) != (open == '[' ? ']' : '}')) return 1;
    ps->p++;
    return 0;
}

/* true or false into *out (1 / 0); anything else is bad_field. */
static int parse_bool_field(struct parser *ps, const char *name, int *out) {
    (void)peek(ps);
    size_t left = (size_t)(ps->end - ps->p);
    if (left >= 4 && !memcmp(ps->p, "true", 4)) {
        ps->p += 4;
        *out = 1;
        return 0;
    }
    if (left >= 5 && !memcmp(ps->p, "false", 5)) {
        ps->p += 5;
        *out = 0;
        return 0;
    }
    if (skip_value(ps, 1)) return -1;
    return fail(ps, PROTO_E_BAD_FIELD, "%s must be true or false", name);
}

/* Reads an integer field into *out, within [lo, hi]. */
static int parse_int_field(struct parser *ps, const char *name, int64_t lo, int64_t hi, int64_t *out) {
    double d;
    int isint;
    char c = peek(ps);
    if (c != '-' && (c < '0' || c > '9')) {
        if (skip_value(ps, 1)) return -1;
        return fail(ps, PROTO_E_BAD_FIELD, "%s must be an integer", name);
    }
    const char *s = ps->p; /* peek skipped the whitespace */
    if (parse_number(ps, &d, &isint)) return -1;
    if (isint && fabs(d) >= 0x1p53) {
        /* a double rounds here (2^53+1 reads as 2^53): decide on the exact literal */
        char buf[24];
        size_t l = (size_t)(ps->p - s);
        long long v = 0;
        errno = 0;
        if (l < sizeof buf) {
            memcpy(buf, s, l);
            buf[l] = 0;
            v = strtoll(buf, NULL, 10);
        }
        if (l >= sizeof buf || errno || v < lo || v > hi)
            return fail(ps, PROTO_E_BAD_FIELD, "%s must be an integer in %lld..%lld", name, (long long)lo,
                        (long long)hi);
        *out = v;
        return 0;
    }
    if (!isint || d != floor(d) || d < (double)lo || d > (double)hi)
        return fail(ps, PROTO_E_BAD_FIELD, "%s must be an integer in %lld..%lld", name, (long long)lo, (long long)hi);
    *out = (int64_t)d;
    return 0;
}

/* Appends one value (number or null) to the message's value array. */
static int push_value(struct parser *ps) {
    struct proto_msg *m = ps->msg;
    if (m->nvalues == ps->cap_values) {
        uint32_t cap = ps->cap_values ? ps->cap_values * 2 : 256;
        if (cap > ps->max / 2) return fail(ps, PROTO_E_BAD_FIELD, "too many values");
        float *v = realloc(m->values, cap * sizeof *v);
        if (!v) return fail(ps, PROTO_E_INTERNAL, "out of memory");
        m->values = v;
        ps->cap_values = cap;
    }
    char c = peek(ps);
    if (c == 'n') {
        if (match_lit(ps, "null")) return -1;
        m->values[m->nvalues++] = NAN;
        return 0;
    }
    if (c != '-' && (c < '0' || c > '9')) {
        if (skip_value(ps, 1)) return -1;
        return fail(ps, PROTO_E_BAD_FIELD, "metric values must be numbers or null");
    }
    double d;
    int isint;
    if (parse_number(ps, &d, &isint)) return -1;
    m->values[m->nvalues++] = proto_to_f32(d);
    return 0;
}

/* Reads an array of values; returns its length in *n. */
static int parse_vector(struct parser *ps, const char *metric, uint32_t *n) {
    *n = 0;
    int any = open_container(ps, '[', "metric %s must be an array", metric);
    if (any <= 0) return any;
    struct proto_msg *m = ps->msg;
    while (1) {
        float x;
        const char *q = m->nvalues < ps->cap_values ? fast_number(ps->p, ps->end, &x) : NULL;
        if (q) {
            m->values[m->nvalues++] = x;
            ps->p = q;
        } else if (push_value(ps)) {
            return -1;
        }
        (*n)++;
        int more = next_or_close(ps, ']');
        if (more <= 0) return more;
    }
}


/* Reads one of "scalars", "layers", "heads": an object of metrics. */
static int parse_metrics(struct parser *ps, int kind, const char *field) {
    struct proto_msg *m = ps->msg;
    int any = open_container(ps, '{', "%s must be an object", field);
    if (any <= 0) return any;
    int count = 0;
    while (1) {
        if (m->nmetrics == ps->cap_metrics) {
            uint32_t cap = ps->cap_metrics ? ps->cap_metrics * 2 : 16;
            struct proto_metric *nm = realloc(m->metrics, cap * sizeof *nm);
            if (!nm) return fail(ps, PROTO_E_INTERNAL, "out of memory");
            m->metrics = nm;
            ps->cap_metrics = cap;
        }
        struct proto_metric *mt = &m->metrics[m->nmetrics];
        size_t nlen;
        if (parse_string(ps, mt->name, sizeof mt->name, &nlen, "metric name")) return -1;
        if (!proto_valid_name(mt->name, nlen))
            return fail(ps, PROTO_E_BAD_FIELD, "metric name must be 1-64 bytes of [A-Za-z0-9._:-]");
        for (uint32_t i = 0; i < m->nmetrics; i++)
            if (strcmp(m->metrics[i].name, mt->name) == 0)
                return fail(ps, PROTO_E_BAD_FIELD, "metric %s appears twice", mt->name);
        if (++count > PROTO_MAX_METRICS)
            return fail(ps, PROTO_E_BAD_FIELD, "more than %d metrics in %s", PROTO_MAX_METRICS, field);
        if (expect(ps, ':')) return -1;
        mt->kind = kind;
        mt->offset = m->nvalues;
        mt->rows = mt->cols = 1;
        if (kind == PROTO_SCALAR) {
            if (push_value(ps)) return -1;
        } else if (kind == PROTO_LAYER) {
            if (parse_vector(ps, mt->name, &mt->rows)) return -1;
        } else {
            int rows = open_container(ps, '[', "head metric %s must be an array of arrays", mt->name);
            mt->rows = 0;
            while (rows > 0) {
                uint32_t n;
                if (parse_vector(ps, mt->name, &n)) return -1;
                if (mt->rows == 0) mt->cols = n;
                else if (n != mt->cols)
                    return fail(ps, PROTO_E_BAD_SHAPE, "head metric %s has rows of different lengths", mt->name);
                mt->rows++;
                rows = next_or_close(ps, ']');
            }
            if (rows < 0) return -1;
        }
        m->nmetrics++;
        int more = next_or_close(ps, '}');
        if (more <= 0) return more;
    }
}

/* Reads a string field into a freshly allocated buffer (at most max bytes). */
static int parse_owned_string(struct parser *ps, const char *name, size_t max, char **out) {
    if (peek(ps) != '"') {
        if (skip_value(ps, 1)) return -1;
        return fail(ps, PROTO_E_BAD_FIELD, "%s must be a string", name);
    }
    const char *save = ps->p;
    if (parse_string(ps, NULL, 0, NULL, name)) return -1;
    size_t raw = (size_t)(ps->p - save);
    /* the decoded text is never longer than its escaped source */
    size_t cap = (raw < max ? raw : max) + 1;
    ps->p = save;
    free(*out);
    *out = malloc(cap);
    if (!*out) return fail(ps, PROTO_E_INTERNAL, "out of memory");
    size_t n;
    return parse_string(ps, *out, cap, &n, name);
}

static int parse_enum(struct parser *ps, const char *name, int (*lookup)(const char *), int *out) {
    char buf[32];
    size_t n;
    if (peek(ps) != '"') {
        if (skip_value(ps, 1)) return -1;
        return fail(ps, PROTO_E_BAD_FIELD, "%s must be a string", name);
    }
    if (parse_string(ps, buf, sizeof buf, &n, name)) {
        if (ps->code == PROTO_E_BAD_FIELD) {
            ps->code = PROTO_OK;
            return fail(ps, PROTO_E_BAD_FIELD, "bad %s", name);
        }
        return -1;
    }
    int v = strlen(buf) == n ? lookup(buf) : -1;
    if (v < 0) return fail(ps, PROTO_E_BAD_FIELD, "bad %s \"%s\"", name, buf);
    *out = v;
    return 0;
}

static const char *const type_names[] = {NULL, "hello", "step", "event", "end"};

static int type_parse(const char *s) {
    for (int i = PROTO_HELLO; i <= PROTO_END; i++)
        if (!strcmp(s, type_names[i])) return i;
    return -1;
}

/* Field presence bits, checked once the type is known. */
enum {
    F_TYPE = 1 << 0,
    F_SEQ = 1 << 1,
    F_STEP = 1 << 2,
    F_RUN = 1 << 3,
    F_PROTOCOL = 1 << 4,
    F_LAYERS_N = 1 << 5,
    F_HEADS_N = 1 << 6,
    F_SEQLEN = 1 << 7,
    F_LEVEL = 1 << 8,
    F_TEXT = 1 << 9,
    F_STATUS = 1 << 10,
    F_LAYERS_OBJ = 1 << 11,
    F_HEADS_OBJ = 1 << 12,
};

static int key_is(const char *k, size_t n, const char *lit) { return strlen(lit) == n && memcmp(k, lit, n) == 0; }

/* Reads an object key into key (cap bytes). A key too long for key is no
 * field of ours: it is validated, skipped, and answered as the empty key
 * (*kn 0), whose value is skipped like any unknown field's. */
static int parse_key(struct parser *ps, char *key, size_t cap, size_t *kn) {
    const char *kstart = ps->p;
    if (!parse_string(ps, key, cap, kn, "key")) return 0;
    if (ps->code != PROTO_E_BAD_FIELD) return -1;
    ps->code = PROTO_OK;
    ps->err[0] = 0;
    ps->p = kstart;
    if (parse_string(ps, NULL, 0, NULL, "key")) return -1;
    *kn = 0;
    key[0] = 0;
    return 0;
}

/* "type": one of type_names; anything else is PROTO_E_BAD_TYPE. */
static int parse_type_field(struct parser *ps) {
    int t;
    if (peek(ps) != '"') {
        if (skip_value(ps, 1)) return -1;
        return fail(ps, PROTO_E_BAD_TYPE, "type must be a string");
    }
    if (parse_enum(ps, "type", type_parse, &t)) {
        if (ps->code == PROTO_E_BAD_FIELD) ps->code = PROTO_E_BAD_TYPE;
        return -1;
    }
    ps->msg->type = t;
    return 0;
}

/* "time": Unix seconds, a number in [0, 1e11). */
static int parse_time_field(struct parser *ps) {
    struct proto_msg *m = ps->msg;
    char c = peek(ps);
    int isint;
    if (c != '-' && (c < '0' || c > '9')) {
        if (skip_value(ps, 1)) return -1;
        return fail(ps, PROTO_E_BAD_FIELD, "time must be a number");
    }
    int r = parse_number(ps, &m->time, &isint);
    if (!r && !(m->time >= 0 && m->time < 1e11)) return fail(ps, PROTO_E_BAD_FIELD, "time must be Unix seconds");
    m->has_time = 1;
    return r;
}

/* "run": a run name (proto_valid_run). */
static int parse_run_field(struct parser *ps) {
    struct proto_msg *m = ps->msg;
    size_t n;
    if (peek(ps) != '"') {
        if (skip_value(ps, 1)) return -1;
        return fail(ps, PROTO_E_BAD_FIELD, "run must be a string");
    }
    int r = parse_string(ps, m->run, sizeof m->run, &n, "run");
    if (!r && !proto_valid_run(m->run, n))
        return fail(ps, PROTO_E_BAD_FIELD, "run must be 1-128 bytes of [A-Za-z0-9._:@+-]");
    return r;
}

/* "meta": any JSON object of at most PROTO_MAX_META bytes, kept as its
 * text (malloc'd into m->meta). */
static int parse_meta_field(struct parser *ps) {
    struct proto_msg *m = ps->msg;
    if (peek(ps) != '{') {
        if (skip_value(ps, 1)) return -1;
        return fail(ps, PROTO_E_BAD_FIELD, "meta must be an object");
    }
    const char *s = ps->p;
    if (skip_value(ps, 1)) return -1;
    size_t n = (size_t)(ps->p - s);
    if (n > PROTO_MAX_META) return fail(ps, PROTO_E_BAD_FIELD, "meta is larger than 1 MiB");
    free(m->meta);
    m->meta = malloc(n + 1);
    if (!m->meta) return fail(ps, PROTO_E_INTERNAL, "out of memory");
    memcpy(m->meta, s, n);
    m->meta[n] = 0;
    return 0;
}

/* The value of field key (kn bytes) into the message, its presence into
 * *seen; an unknown field's value is skipped. 0, or -1 with the error. */
static int parse_field(struct parser *ps, const char *key, size_t kn, unsigned *seen) {
    struct proto_msg *m = ps->msg;
    int r = 0;
    char c = peek(ps);
    if (key_is(key, kn, "type")) {
        r = parse_type_field(ps);
        if (!r) *seen |= F_TYPE;
    } else if (key_is(key, kn, "seq")) {
        r = parse_int_field(ps, "seq", 1, INT64_C(1) << 53, &m->seq);
        if (!r) {
            m->has_seq = 1;
            *seen |= F_SEQ;
        }
    } else if (key_is(key, kn, "step")) {
        r = parse_int_field(ps, "step", 0, INT64_C(1) << 53, &m->step);
        *seen |= F_STEP;
    } else if (key_is(key, kn, "time")) {
        r = parse_time_field(ps);
    } else if (key_is(key, kn, "run")) {
        r = parse_run_field(ps);
        *seen |= F_RUN;
    } else if (key_is(key, kn, "protocol")) {
        r = parse_int_field(ps, "protocol", INT64_MIN / 2, INT64_MAX / 2, &m->protocol);
        *seen |= F_PROTOCOL;
    } else if (key_is(key, kn, "ack_delay_ms")) {
        r = parse_int_field(ps, "ack_delay_ms", 0, PROTO_MAX_ACK_DELAY_MS, &m->ack_delay_ms);
    } else if (key_is(key, kn, "causal")) {
        r = parse_bool_field(ps, "causal", &m->noncausal);
        m->noncausal = !m->noncausal;
    } else if (key_is(key, kn, "seq_len")) {
        r = parse_int_field(ps, "seq_len", 1, INT64_C(1) << 40, &m->seq_len);
        *seen |= F_SEQLEN;
    } else if (key_is(key, kn, "layers")) {
        if (c == '{') {
            r = parse_metrics(ps, PROTO_LAYER, "layers");
            *seen |= F_LAYERS_OBJ;
        } else {
            r = parse_int_field(ps, "layers", 1, PROTO_MAX_DIM, &m->layers);
            *seen |= F_LAYERS_N;
        }
    } else if (key_is(key, kn, "heads")) {
        if (c == '{') {
            r = parse_metrics(ps, PROTO_HEAD, "heads");
            *seen |= F_HEADS_OBJ;
        } else {
            r = parse_int_field(ps, "heads", 1, PROTO_MAX_DIM, &m->heads);
            *seen |= F_HEADS_N;
        }
    } else if (key_is(key, kn, "scalars")) {
        r = parse_metrics(ps, PROTO_SCALAR, "scalars");
    } else if (key_is(key, kn, "meta")) {
        r = parse_meta_field(ps);
    } else if (key_is(key, kn, "token")) {
        r = parse_owned_string(ps, "token", 256, &m->token);
    } else if (key_is(key, kn, "level")) {
        r = parse_enum(ps, "level", proto_level_parse, &m->level);
        *seen |= F_LEVEL;
    } else if (key_is(key, kn, "text")) {
        r = parse_owned_string(ps, "text", PROTO_MAX_TEXT, &m->text);
        *seen |= F_TEXT;
    } else if (key_is(key, kn, "status")) {
        r = parse_enum(ps, "status", proto_status_parse, &m->status);
        if (!r && m->status < PROTO_FINISHED)
            return fail(ps, PROTO_E_BAD_FIELD, "status must be finished, failed or aborted");
        *seen |= F_STATUS;
    } else {
        r = skip_value(ps, 1);
    }
    return r ? -1 : 0;
}

/* The line's one object, field by field (parse_field), the fields seen
 * into *seen for check_fields. */
static int parse_top(struct parser *ps, unsigned *seen) {
    if (peek(ps) != '{') return fail(ps, PROTO_E_BAD_JSON, "a line must be one JSON object");
    ps->p++;
    if (peek(ps) == '}') {
        ps->p++;
        return 0;
    }
    while (1) {
        char key[32];
        size_t kn;
        if (parse_key(ps, key, sizeof key, &kn) || expect(ps, ':') || parse_field(ps, key, kn, seen)) return -1;
        int more = next_or_close(ps, '}');
        if (more <= 0) return more;
    }
}

/* Checks that the fields the type needs are there and that the others fit. */
static int check_fields(struct parser *ps, unsigned seen) {
    struct proto_msg *m = ps->msg;
    if (!(seen & F_TYPE)) return fail(ps, PROTO_E_BAD_TYPE, "missing type");
    const char *tn = type_names[m->type];
#define NEED(bit, name) \
    if (!(seen & (bit))) return fail(ps, PROTO_E_MISSING_FIELD, "%s needs field %s", tn, name)
    switch (m->type) {
    case PROTO_HELLO:
        NEED(F_PROTOCOL, "protocol");
        if (m->protocol != PROTO_VERSION)
            return fail(ps, PROTO_E_BAD_PROTOCOL, "protocol %lld is not supported (this daemon speaks 1)",
                        (long long)m->protocol);
        NEED(F_RUN, "run");
        /* before NEED: an object there is a wrongly typed field, not a missing one */
        if (seen & (F_LAYERS_OBJ | F_HEADS_OBJ))
            return fail(ps, PROTO_E_BAD_FIELD, "hello's layers and heads must be integers");
        NEED(F_LAYERS_N, "layers");
        NEED(F_HEADS_N, "heads");
        NEED(F_SEQLEN, "seq_len");
        if (m->layers * m->heads > (int64_t)PROTO_MAX_CELLS)
            return fail(ps, PROTO_E_BAD_FIELD, "layers * heads must be at most %u", PROTO_MAX_CELLS);
        break;
    case PROTO_STEP:
        NEED(F_SEQ, "seq");
        NEED(F_STEP, "step");
        if (seen & (F_LAYERS_N | F_HEADS_N))
            return fail(ps, PROTO_E_BAD_FIELD, "step's layers and heads must be objects");
        break;
    case PROTO_EVENT:
        NEED(F_SEQ, "seq");
        NEED(F_LEVEL, "level");
        NEED(F_TEXT, "text");
        break;
    case PROTO_END:
        NEED(F_SEQ, "seq");
        NEED(F_STATUS, "status");
        break;
    }
#undef NEED
    return 0;
}

size_t proto_line_max(int64_t cells) {
    if (cells < 0) cells = 0;
    if (cells > (int64_t)PROTO_MAX_CELLS) cells = PROTO_MAX_CELLS;
    return (size_t)PROTO_MAX_LINE + (size_t)cells * PROTO_STEP_HEAD_METRICS * PROTO_VALUE_MAX_BYTES;
}

int proto_parse(const char *line, size_t len, struct proto_msg *msg, char *err, size_t errlen) {
    return proto_parse_max(line, len, PROTO_MAX_LINE, msg, err, errlen);
}

int proto_parse_max(const char *line, size_t len, size_t max, struct proto_msg *msg, char *err, size_t errlen) {
    if (max > PROTO_MAX_LINE_ANY) max = PROTO_MAX_LINE_ANY;
    struct parser ps = {.p = line,
                        .end = line + len,
                        .start = line,
                        .msg = msg,
                        .err = err,
                        .errlen = errlen,
                        .code = PROTO_OK,
                        .max = max};
    unsigned seen = 0;
    if (errlen) err[0] = 0;
    if (len > max) {
        fail(&ps, PROTO_E_LINE_TOO_LONG, "line longer than %zu bytes", max);
        return ps.code;
    }
    if (len && line[len - 1] == '\r') ps.end--;
    if (parse_top(&ps, &seen) == 0) {
        skip_ws(&ps);
        if (ps.p != ps.end) fail(&ps, PROTO_E_BAD_JSON, "trailing characters after the object");
        else check_fields(&ps, seen);
    }
    return ps.code;
}

void proto_msg_free(struct proto_msg *msg) {
    free(msg->meta);
    free(msg->token);
    free(msg->metrics);
    free(msg->values);
    free(msg->text);
    memset(msg, 0, sizeof *msg);
}
