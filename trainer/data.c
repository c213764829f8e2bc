/* data.c - see data.h. */
#include "data.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h" /* model_random_u32: one RNG for the whole trainer */

enum {
    TOK_EOS = 0,
    TOK_COPY = 1,
    TOK_SEP = 2,
    TOK_KV = 3,
    TOK_QRY = 4,
    TOK_DET = 5,   /* 5..7 */
    TOK_ADJ = 8,   /* 8..15 */
    TOK_NOUN = 16, /* 16..31, class = (tok - 16) / 4 */
    TOK_VERB = 32, /* 32..47, class = (tok - 32) / 4 */
    TOK_SYM = 48,  /* copy symbols 48..63 */
    TOK_KEY = 16,  /* recall keys 16..23 */
    TOK_VAL = 48
}; /* recall values 48..63 */

static uint32_t rnd(uint64_t *s, uint32_t n) { return model_random_u32(s) % n; }

static uint64_t fnv1a(const uint8_t *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h;
}

static data *data_new(size_t n, int vocab) {
    data *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->tokens = malloc(n ? n : 1);
    if (!d->tokens) {
        free(d);
        return NULL;
    }
    d->n = n;
    d->vocab = vocab;
    d->split = n - n / 10;
    return d;
}

/* Appends one episode at out (room for at least 32 tokens); returns its length. */
static int episode(uint8_t *out, uint64_t *s) {
    int n = 0;
    uint32_t kind = rnd(s, 10);
    if (kind < 3) {
        int k = 2 + (int)rnd(s, 6);
        out[n++] = TOK_COPY;
        for (int i = 0; i < k; i++) out[n + i] = (uint8_t)(TOK_SYM + rnd(s, 16));
        n += k;
        out[n++] = TOK_SEP;
        memcpy(out + n, out + 1, (size_t)k);
        n += k;
    } else if (kind < 6) {
        int pairs = 2 + (int)rnd(s, 3);
        uint8_t keys[8];
        out[n++] = TOK_KV;
        for (int i = 0; i < pairs; i++) {
            int fresh;
            do { /* distinct keys so the query has one answer */
                keys[i] = (uint8_t)(TOK_KEY + rnd(s, 8));
                fresh = 1;
                for (int j = 0; j < i; j++) fresh &= keys[j] != keys[i];
            } while (!fresh);
            out[n++] = keys[i];
            out[n++] = (uint8_t)(TOK_VAL + rnd(s, 16));
        }
        int q = (int)rnd(s, (uint32_t)pairs);
        out[n++] = TOK_QRY;
        out[n++] = out[1 + 2 * q];
        out[n++] = out[2 + 2 * q];
    } else {
        uint32_t subj = rnd(s, 16), cls = subj / 4;
        uint32_t verb = cls * 4 + rnd(s, 4);
        uint32_t obj = ((cls + 1) % 4) * 4 + rnd(s, 4);
        out[n++] = (uint8_t)(TOK_DET + rnd(s, 3));
        if (rnd(s, 2)) out[n++] = (uint8_t)(TOK_ADJ + rnd(s, 8));
        out[n++] = (uint8_t)(TOK_NOUN + subj);
        out[n++] = (uint8_t)(TOK_VERB + verb);
        out[n++] = (uint8_t)(TOK_DET + rnd(s, 3));
        if (rnd(s, 2)) out[n++] = (uint8_t)(TOK_ADJ + rnd(s, 8));
        out[n++] = (uint8_t)(TOK_NOUN + obj);
    }
    out[n++] = TOK_EOS;
    return n;
}

data *data_synthetic(uint64_t seed, size_t ntokens) {
    data *d = data_new(ntokens, DATA_SYNTH_VOCAB);
    if (!d) return NULL;
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 0x1234567ull; /* never zero for xorshift */
    if (!s) s = 1;
    uint8_t ep[64];
    size_t n = 0;
    while (n < ntokens) {
        int k = episode(ep, &s);
        size_t take = (size_t)k < ntokens - n ? (size_t)k : ntokens - n;
        memcpy(d->tokens + n, ep, take);
        n += take;
    }
    d->hash = fnv1a(d->tokens, d->n);
    return d;
}

data *data_file(const char *path, char *err, size_t errlen) {
    data *d = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return NULL;
    }
    if (fseek(f, 0, SEEK_END) != 0) goto ioerr;
    long len = ftell(f);
    if (len < 0 || fseek(f, 0, SEEK_SET) != 0) goto ioerr;
    if (len < 64) {
        snprintf(err, errlen, "%s: too small (%ld bytes, need at least 64)", path, len);
        goto out;
    }
    d = data_new((size_t)len, 256);
    if (!d) {
        snprintf(err, errlen, "%s: out of memory", path);
        goto out;
    }
    if (fread(d->tokens, 1, d->n, f) != d->n) {
        data_destroy(d);
        d = NULL;
        goto ioerr;
    }
    d->hash = fnv1a(d->tokens, d->n);
    goto out;
ioerr:
    snprintf(err, errlen, "%s: read error: %s", path, strerror(errno));
out:
    fclose(f);
    return d;
}

void data_destroy(data *d) {
    if (!d) return;
    free(d->tokens);
    free(d);
}

int data_check(const data *d, int B, int T, char *err, size_t errlen) {
    size_t need = (size_t)B * T + 1;
    if (d->split < need || d->n - d->split < need) {
        snprintf(err, errlen, "data too small: %zu train / %zu val tokens, a batch needs %zu", d->split,
                 d->n - d->split, need);
        return -1;
    }
    return 0;
}

static void fill(const uint8_t *tok, int *inputs, int *targets, int B, int T) {
    for (long i = 0; i < (long)B * T; i++) {
        inputs[i] = tok[i];
        targets[i] = tok[i + 1];
    }
}

void data_next_train(data *d, int *inputs, int *targets, int B, int T) {
    size_t bt = (size_t)B * T;
    if (d->pos + bt + 1 > d->split) d->pos = 0;
    fill(d->tokens + d->pos, inputs, targets, B, T);
    d->pos += bt;
}

void data_val_batch(const data *d, int k, int *inputs, int *targets, int B, int T) {
    size_t bt = (size_t)B * T, nval = d->n - d->split;
    size_t span = nval - bt; /* >= 1 by data_check */
    size_t off = ((size_t)k * bt) % span;
    fill(d->tokens + d->split + off, inputs, targets, B, T);
}
