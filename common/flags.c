/* flags.c: parsing argv through a flag table, and --help from the same
 * table (flags.h is the contract). */
#include "flags.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const flag *find_n(const flag_table *t, const char *name, size_t n) {
    for (int i = 0; i < t->n; i++) {
        const flag *fl = &t->flags[i];
        if (fl->kind != FLAG_SECTION && strlen(fl->name) == n && strncmp(fl->name, name, n) == 0) return fl;
    }
    return NULL;
}

const flag *flags_find(const flag_table *t, const char *name) { return find_n(t, name, strlen(name)); }

/* "90", "90s", "30m", "1h", "2d" -> seconds; -1 for anything else. */
static double parse_duration(const char *s) {
    char *end;
    errno = 0;
    double v = strtod(s, &end), unit = 1;
    if (errno || end == s || !(v >= 0)) return -1;
    switch (*end) {
    case 0: break;
    case 's': break;
    case 'm': unit = 60; break;
    case 'h': unit = 3600; break;
    case 'd': unit = 86400; break;
    default: return -1;
    }
    if (*end && end[1]) return -1;
    return v * unit;
}

/* An integer of flag fl in [fl->lo, fl->hi] into *x.  0, or -1 (printed). */
static int parse_integer(const flag_table *t, const flag *fl, const char *v, long *x) {
    char *end;
    errno = 0;
    *x = strtol(v, &end, 10);
    if (errno || *end || end == v || *x < fl->lo || *x > fl->hi) {
        fprintf(stderr, "%s: %s: expected an integer in [%ld, %ld], got '%s'\n", t->prog, fl->name, fl->lo, fl->hi, v);
        return -1;
    }
    return 0;
}

/* Stores v, the value of flag fl, into the options at o.  0, or -1 (printed). */
static int set_value(const flag_table *t, const flag *fl, const char *v, void *o) {
    char *dst = (char *)o + fl->off, *end;
    long x;
    switch (fl->kind) {
    case FLAG_INT:
        if (parse_integer(t, fl, v, &x) != 0) return -1;
        *(int *)dst = (int)x;
        return 0;
    case FLAG_LONG:
        if (parse_integer(t, fl, v, &x) != 0) return -1;
        *(long *)dst = x;
        return 0;
    case FLAG_U64:
        if (parse_integer(t, fl, v, &x) != 0) return -1;
        *(uint64_t *)dst = (uint64_t)x;
        return 0;
    case FLAG_FLOAT: {
        errno = 0;
        float f = strtof(v, &end);
        if (errno || *end || end == v || !isfinite(f) || f < fl->lo) {
            fprintf(stderr, "%s: %s: expected a number >= %ld, got '%s'\n", t->prog, fl->name, fl->lo, v);
            return -1;
        }
        *(float *)dst = f;
        return 0;
    }
    case FLAG_DURATION: {
        double s = parse_duration(v);
        if (s < 0 || s > (double)fl->hi) {
            fprintf(stderr, "%s: %s: expected a duration like 90s, 30m, 1h or 7d, got '%s'\n", t->prog, fl->name, v);
            return -1;
        }
        *(double *)dst = s;
        return 0;
    }
    case FLAG_ENUM:
        for (int i = 0; i < fl->nnames; i++)
            if (strcmp(v, fl->names[i]) == 0) {
                *(int *)dst = i;
                return 0;
            }
        fprintf(stderr, "%s: %s: unknown value '%s' (one of:", t->prog, fl->name, v);
        for (int i = 0; i < fl->nnames; i++) fprintf(stderr, " %s", fl->names[i]);
        fprintf(stderr, ")\n");
        return -1;
    case FLAG_LIST: {
        flag_list *l = (flag_list *)dst;
        if (l->n == FLAG_LIST_MAX || !*v) {
            fprintf(stderr, "%s: %s: expected a non-empty value, at most %d times\n", t->prog, fl->name, FLAG_LIST_MAX);
            return -1;
        }
        l->v[l->n++] = v;
        return 0;
    }
    default: /* FLAG_STR */ *(const char **)dst = v; return 0;
    }
}

int flags_parse(const flag_table *t, int argc, char **argv, void *o, char *given) {
    if (given) memset(given, 0, (size_t)t->n);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *eq = strchr(a, '=');
        const flag *fl = strcmp(a, "-h") == 0       ? flags_find(t, "--help")
                         : strncmp(a, "--", 2) == 0 ? find_n(t, a, eq ? (size_t)(eq - a) : strlen(a))
                                                    : NULL;
        if (!fl) {
            fprintf(stderr, "%s: unknown %s '%s' (see --help)\n", t->prog, strncmp(a, "--", 2) ? "argument" : "flag",
                    a);
            return FLAGS_BAD;
        }
        if (given) given[fl - t->flags] = 1;
        if (fl->kind == FLAG_HELP) return FLAGS_HELP;
        if (fl->kind == FLAG_VERSION) return FLAGS_VERSION;
        if (fl->kind == FLAG_BOOL) {
            if (eq) {
                fprintf(stderr, "%s: %s takes no value\n", t->prog, fl->name);
                return FLAGS_BAD;
            }
            *(int *)((char *)o + fl->off) = 1;
            continue;
        }
        const char *v = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        if (!v) {
            fprintf(stderr, "%s: %s needs a value (see --help)\n", t->prog, fl->name);
            return FLAGS_BAD;
        }
        if (set_value(t, fl, v, o) != 0) return FLAGS_BAD;
    }
    return FLAGS_RUN;
}

void flags_usage(const flag_table *t, FILE *f) {
    for (int i = 0; i < t->n; i++) {
        const flag *fl = &t->flags[i];
        if (fl->kind == FLAG_SECTION) {
            fprintf(f, "%s\n", fl->name);
            continue;
        }
        char head[64];
        snprintf(head, sizeof head, "%s%s%s", fl->name, fl->arg ? " " : "", fl->arg ? fl->arg : "");
        fprintf(f, "  %-21s ", head);
        for (const char *p = fl->help; *p;) { /* continuation lines under the text */
            const char *e = strchr(p, '\n');
            int n = e ? (int)(e - p) : (int)strlen(p);
            fprintf(f, "%.*s\n", n, p);
            if (!e) break;
            p = e + 1;
            fprintf(f, "  %-21s ", "");
        }
    }
}
