/* strbuf.c: the growable text buffer every answer is written into, and its
 * number formatting. See strbuf.h. */
#include "strbuf.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"

static int reserve(struct strbuf *b, size_t n) {
    if (b->failed) return -1;
    if (b->len + n + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->failed = 1;
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

void strbuf_add(struct strbuf *b, const char *s, size_t n) {
    if (reserve(b, n)) return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void strbuf_puts(struct strbuf *b, const char *s) { strbuf_add(b, s, strlen(s)); }

void strbuf_printf(struct strbuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        strbuf_add(b, tmp, (size_t)n);
        return;
    }
    if (reserve(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void strbuf_json_str(struct strbuf *b, const char *s) {
    size_t len = strlen(s);
    char tmp[512];
    size_t need = proto_json_string(tmp, sizeof tmp, s, len);
    if (need <= sizeof tmp - 1) {
        strbuf_add(b, tmp, need);
        return;
    }
    if (reserve(b, need + 1)) return;
    proto_json_string(b->p + b->len, need + 1, s, len);
    b->len += need;
    b->p[b->len] = 0;
}

void strbuf_free(struct strbuf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* Appends a decimal integer (printf is slow enough to matter in series
 * answers of 100,000 buckets). */
void strbuf_prom_head(struct strbuf *b, const char *name, const char *type, const char *help) {
    strbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void strbuf_prom(struct strbuf *b, const char *name, const char *type, const char *help, double v) {
    strbuf_prom_head(b, name, type, help);
    strbuf_printf(b, "%s %.17g\n", name, v);
}

void strbuf_i64(struct strbuf *b, int64_t v) {
    char tmp[24], *p = tmp + sizeof tmp;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do *--p = (char)('0' + u % 10);
    while (u /= 10);
    if (v < 0) *--p = '-';
    strbuf_add(b, p, (size_t)(tmp + sizeof tmp - p));
}

/* Writes finite d with nd (<= 15) significant digits, trailing zeros
 * dropped, in the style of %g; returns the length. printf("%.9g") is
 * exact but slow (multi-precision), and series answers print up to 500,000
 * numbers. Here one double multiplication scales d: its error (<= 1 ulp,
 * ~1e-16) is far below the last digit kept, so 9 digits of a float32 still
 * read back to the same float32, which the tests check. */
static int fmt_sig(char *out, double d, int nd) {
    static const double p10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
    char *o = out;
    if (d == 0) {
        *o++ = '0';
        return 1;
    }
    if (d < 0) {
        *o++ = '-';
        d = -d;
    }
    int e = (int)floor(log10(d));
    uint64_t m = 0, lim = (uint64_t)p10[nd];
    for (int tries = 0; tries < 3; tries++) {
        int sh = nd - 1 - e;
        double sc =
            sh >= 0 ? (sh <= 22 ? d * p10[sh] : d * pow(10, sh)) : (-sh <= 22 ? d / p10[-sh] : d / pow(10, -sh));
        m = (uint64_t)llround(sc);
        if (m >= lim) {
            if (sc >= (double)lim) { /* log10 was one low */
                e++;
                continue;
            }
            m = lim / 10; /* rounding carried: 9.999999996 -> 10.0000000 */
            e++;
        } else if (m < lim / 10) { /* log10 was one high */
            e--;
            continue;
        }
        break;
    }
    char dig[20];
    for (int i = nd - 1; i >= 0; i--) {
        dig[i] = (char)('0' + m % 10);
        m /= 10;
    }
    int n = nd;
    while (n > 1 && dig[n - 1] == '0') n--;
    if (e >= -5 && e < nd) {
        if (e >= 0) {
            for (int i = 0; i <= e; i++) *o++ = i < n ? dig[i] : '0';
            if (n > e + 1) {
                *o++ = '.';
                for (int i = e + 1; i < n; i++) *o++ = dig[i];
            }
        } else {
            *o++ = '0';
            *o++ = '.';
            for (int i = 0; i < -e - 1; i++) *o++ = '0';
            for (int i = 0; i < n; i++) *o++ = dig[i];
        }
    } else {
        *o++ = dig[0];
        if (n > 1) {
            *o++ = '.';
            for (int i = 1; i < n; i++) *o++ = dig[i];
        }
        o += sprintf(o, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
    return (int)(o - out);
}

/* A float as JSON: 9 significant digits, which read back to the same
 * float32; null when not finite. */
void strbuf_f32(struct strbuf *b, float x) {
    if (!isfinite(x)) {
        strbuf_add(b, "null", 4);
        return;
    }
    char tmp[40];
    strbuf_add(b, tmp, (size_t)fmt_sig(tmp, x, 9));
}

/* A mean: 12 significant digits, beyond what float32 inputs carry. */
void strbuf_f64(struct strbuf *b, double x) {
    if (!isfinite(x)) {
        strbuf_add(b, "null", 4);
        return;
    }
    char tmp[40];
    strbuf_add(b, tmp, (size_t)fmt_sig(tmp, x, 12));
}
