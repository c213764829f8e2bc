/* fuzz_proto: libFuzzer harness for the protocol v1 line parser
 * (proto_parse). Not a unit test: built and run by
 * `make fuzz` and scripts/run-fuzz.sh (clang -fsanitize=fuzzer,address,undefined).
 *
 * The input is one line. It is copied into a buffer of exactly its size so
 * that ASan catches any read past [line, line+len) (proto.h promises none).
 * Beyond "no crash, no leak", it checks the parser's own contract: err is
 * always NUL-terminated, an accepted message is consistent (every metric's
 * values lie inside the value array, shapes as the kind says), and
 * proto_json_string round-trips through the parser. The file names are
 * proto/proto_parse.c (the parser) and proto/proto.c (the escaping). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"

static void check(int cond, const char *what) {
    if (!cond) {
        fprintf(stderr, "fuzz_proto: contract broken: %s\n", what);
        abort();
    }
}

/* RFC 3629 UTF-8, decoded to code points (an independent check of what
 * proto_json_string passes through): no overlong forms, no surrogates,
 * nothing above U+10FFFF. */
static int utf8_valid(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i], cp, k;
        if (c < 0x80) {
            i++;
            continue;
        }
        if ((c & 0xe0) == 0xc0) {
            k = 2;
            cp = c & 0x1f;
        } else if ((c & 0xf0) == 0xe0) {
            k = 3;
            cp = c & 0x0f;
        } else if ((c & 0xf8) == 0xf0) {
            k = 4;
            cp = c & 0x07;
        } else return 0;
        if (i + k > n) return 0;
        for (unsigned j = 1; j < k; j++) {
            if ((s[i + j] & 0xc0) != 0x80) return 0;
            cp = cp << 6 | (s[i + j] & 0x3f);
        }
        static const unsigned min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[k] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
        i += k;
    }
    return 1;
}

static void check_msg(const struct proto_msg *m) {
    check(m->type >= PROTO_HELLO && m->type <= PROTO_END, "type in range");
    if (m->type == PROTO_HELLO) {
        check(m->layers >= 1 && m->layers <= PROTO_MAX_DIM, "layers in range");
        check(m->heads >= 1 && m->heads <= PROTO_MAX_DIM, "heads in range");
        check((uint64_t)m->layers * (uint64_t)m->heads <= PROTO_MAX_CELLS, "cells in range");
        size_t n = strlen(m->run);
        check(n >= 1 && n <= PROTO_MAX_RUN, "run name length");
    }
    if (m->type == PROTO_STEP) {
        check(m->step >= 0, "step >= 0");
        check(m->has_seq && m->seq >= 1, "step has seq");
        for (uint32_t i = 0; i < m->nmetrics; i++) {
            const struct proto_metric *x = &m->metrics[i];
            size_t n = strlen(x->name);
            check(n >= 1 && n <= PROTO_MAX_NAME, "metric name length");
            check((uint64_t)x->offset + (uint64_t)x->rows * x->cols <= m->nvalues, "metric values inside the array");
            if (x->kind == PROTO_SCALAR) check(x->rows == 1 && x->cols == 1, "scalar shape");
            else if (x->kind == PROTO_LAYER) check(x->cols == 1, "layer shape");
            else check(x->kind == PROTO_HEAD, "kind in range");
        }
        /* touch every value: an uninitialised or out-of-range one shows under the sanitizers */
        volatile float sum = 0;
        for (uint32_t i = 0; i < m->nvalues; i++) sum += isnan(m->values[i]) ? 0 : m->values[i];
        (void)sum;
    }
    if (m->type == PROTO_EVENT) check(m->text && strlen(m->text) <= PROTO_MAX_TEXT, "event text");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > PROTO_MAX_LINE) return 0;
    char *line = malloc(size ? size : 1);
    if (!line) return 0;
    memcpy(line, data, size);
    struct proto_msg m = {0};
    char err[128];
    memset(err, 'x', sizeof err);
    int rc = proto_parse(line, size, &m, err, sizeof err);
    check(memchr(err, 0, sizeof err) != NULL, "err is NUL-terminated");
    check(rc >= PROTO_OK && rc < PROTO_E_COUNT, "return code in range");
    if (rc == PROTO_OK) check_msg(&m);
    (void)proto_err_name(rc);
    proto_msg_free(&m);
    check(m.values == NULL && m.metrics == NULL && m.meta == NULL, "free zeroes the message");

    /* Any bytes as an event's text: the escaped literal must parse back to
     * the same bytes when they are valid UTF-8 (else bad_json, never a crash). */
    if (size <= 4096) {
        size_t cap = size * 6 + 3;
        char *lit = malloc(cap);
        if (lit) {
            size_t n = proto_json_string(lit, cap, line, size);
            check(n < cap, "literal fits 6x + quotes");
            char *ev = malloc(n + 64);
            if (ev) {
                int k = snprintf(ev, n + 64, "{\"type\":\"event\",\"seq\":1,\"level\":\"info\",\"text\":%.*s}", (int)n,
                                 lit);
                struct proto_msg e = {0};
                int r2 = proto_parse(ev, (size_t)k, &e, err, sizeof err);
                if (size <= PROTO_MAX_TEXT && memchr(line, 0, size) == NULL) {
                    /* the literal is valid JSON whatever the bytes (invalid
                     * UTF-8 becomes '?'), and valid UTF-8 comes back as it was */
                    check(r2 == PROTO_OK, "an escaped literal always parses");
                    if (r2 == PROTO_OK && utf8_valid((const unsigned char *)line, size))
                        check(strlen(e.text) == size && memcmp(e.text, line, size) == 0, "event text round-trips");
                }
                proto_msg_free(&e);
                free(ev);
            }
            free(lit);
        }
    }
    free(line);
    return 0;
}
