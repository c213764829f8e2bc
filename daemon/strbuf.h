/* strbuf.h: a growable text buffer for the daemon's answers (JSON,
 * Prometheus text, event-stream lines), with the number formats they use.
 *
 * Appends never fail loudly: when memory runs out `failed` is set and every
 * later append is ignored, so a writer appends freely and checks once at the
 * end. The buffer owns p; strbuf_free() (or free(p)) releases it. A zeroed
 * struct is an empty buffer. */
#ifndef STRBUF_H
#define STRBUF_H

#include <stddef.h>
#include <stdint.h>

/* A growable byte buffer. `failed` is set (and further appends ignored)
 * when memory ran out; p is NUL-terminated while not failed. The owner
 * frees p with free(). */
struct strbuf {
    char *p;
    size_t len, cap;
    int failed;
};
void strbuf_add(struct strbuf *b, const char *s, size_t n);
void strbuf_puts(struct strbuf *b, const char *s);
void strbuf_printf(struct strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends a float32 as a JSON number with 9 significant digits (reads
 * back to the same float), or null when not finite. */
void strbuf_f32(struct strbuf *b, float x);
/* Appends a double with 12 significant digits, or null when not finite. */
void strbuf_f64(struct strbuf *b, double x);
/* Appends s as a JSON string literal (with quotes). */
void strbuf_json_str(struct strbuf *b, const char *s);
/* Appends a decimal integer (faster than printf, which matters in answers
 * of 100,000 buckets). */
void strbuf_i64(struct strbuf *b, int64_t v);
/* Appends a Prometheus metric family's "# HELP name help" and
 * "# TYPE name type" lines; its samples follow. */
void strbuf_prom_head(struct strbuf *b, const char *name, const char *type, const char *help);
/* Appends a metric family of one sample without labels: its HELP and TYPE
 * lines and "name value" (17 significant digits: reads back exactly). */
void strbuf_prom(struct strbuf *b, const char *name, const char *type, const char *help, double v);
/* Frees p and leaves an empty buffer. */
void strbuf_free(struct strbuf *b);

#endif
