/* fblock.c: the codec of a block of frames (fblock.h). The layout of a
 * blob: byte 0 is the format (FORMAT_ZIGZAG_ZSTD), byte 1 the cells per
 * chunk (FBLOCK_CHUNK when written); then, per chunk, its compressed size
 * (u32, little-endian); then the chunks. A chunk of m = cells x nframes values is, before zstd, four
 * planes of m bytes (byte 0 of every coded value, then byte 1 ...), cell
 * by cell and step by step within a plane; a value is coded as the zigzag
 * of the difference of its bits from the same cell's previous frame (0
 * before the first). Slowly moving values differ in the low mantissa
 * bytes only, so the high planes are mostly zeros. */
#include "fblock.h"

#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#define FORMAT_ZIGZAG_ZSTD 1
#define ZSTD_LEVEL 3
#define MAX_CHUNK 255   /* cells per chunk a blob can say (one byte) */
#define CHUNK_BYTES (MAX_CHUNK * FBLOCK_STEPS * 4)

struct fblock_codec {
    ZSTD_CCtx *cctx;
    ZSTD_DCtx *dctx;
    unsigned char planes[CHUNK_BYTES];
};

struct fblock_codec *fblock_codec_create(void) {
    struct fblock_codec *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->cctx = ZSTD_createCCtx();
    c->dctx = ZSTD_createDCtx();
    if (!c->cctx || !c->dctx) {
        fblock_codec_destroy(c);
        return NULL;
    }
    return c;
}

void fblock_codec_destroy(struct fblock_codec *c) {
    if (!c) return;
    ZSTD_freeCCtx(c->cctx);
    ZSTD_freeDCtx(c->dctx);
    free(c);
}

static uint32_t bits_of(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static void put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The planes of cells [c0, c0 + cells) of nframes frames of n values. */
static void chunk_forward(unsigned char *planes, const float *vals, uint32_t nframes, uint32_t n, uint32_t c0,
                          uint32_t cells) {
    size_t m = (size_t)cells * nframes;
    for (uint32_t c = 0; c < cells; c++) {
        uint32_t prev = 0;
        for (uint32_t f = 0; f < nframes; f++) {
            uint32_t u = bits_of(vals[(size_t)f * n + c0 + c]);
            int32_t d = (int32_t)(u - prev);
            uint32_t z = ((uint32_t)d << 1) ^ (uint32_t)(d >> 31);
            size_t i = (size_t)c * nframes + f;
            prev = u;
            planes[i] = (unsigned char)z;
            planes[m + i] = (unsigned char)(z >> 8);
            planes[2 * m + i] = (unsigned char)(z >> 16);
            planes[3 * m + i] = (unsigned char)(z >> 24);
        }
    }
}

/* The inverse of chunk_forward, for cells [lo, hi) of the chunk only. */
static void chunk_backward(float *vals, const unsigned char *planes, uint32_t nframes, uint32_t n, uint32_t c0,
                           uint32_t cells, uint32_t lo, uint32_t hi) {
    size_t m = (size_t)cells * nframes;
    for (uint32_t c = lo; c < hi; c++) {
        uint32_t prev = 0;
        for (uint32_t f = 0; f < nframes; f++) {
            size_t i = (size_t)c * nframes + f;
            uint32_t z = (uint32_t)planes[i] | (uint32_t)planes[m + i] << 8 | (uint32_t)planes[2 * m + i] << 16 |
                         (uint32_t)planes[3 * m + i] << 24;
            uint32_t d = (z >> 1) ^ (0u - (z & 1));
            prev += d;
            memcpy(&vals[(size_t)f * n + c0 + c], &prev, 4);
        }
    }
}

int fblock_encode(struct fblock_codec *c, const float *vals, uint32_t nframes, uint32_t n, unsigned char **blob,
                  size_t *len) {
    uint32_t nchunks = (n + FBLOCK_CHUNK - 1) / FBLOCK_CHUNK;
    size_t head = 2 + 4 * (size_t)nchunks;
    size_t cap = head + (size_t)nchunks * ZSTD_compressBound(FBLOCK_CHUNK * FBLOCK_STEPS * 4);
    unsigned char *b = malloc(cap);
    if (!b || nframes < 1 || nframes > FBLOCK_STEPS) {
        free(b);
        return -1;
    }
    b[0] = FORMAT_ZIGZAG_ZSTD;
    b[1] = FBLOCK_CHUNK;
    size_t at = head;
    for (uint32_t k = 0; k < nchunks; k++) {
        uint32_t c0 = k * FBLOCK_CHUNK, cells = n - c0 < FBLOCK_CHUNK ? n - c0 : FBLOCK_CHUNK;
        size_t raw = (size_t)cells * nframes * 4;
        chunk_forward(c->planes, vals, nframes, n, c0, cells);
        size_t z = ZSTD_compressCCtx(c->cctx, b + at, cap - at, c->planes, raw, ZSTD_LEVEL);
        if (ZSTD_isError(z)) {
            free(b);
            return -1;
        }
        put_u32(b + 2 + 4 * (size_t)k, (uint32_t)z);
        at += z;
    }
    *blob = b;
    *len = at;
    return 0;
}

ssize_t fblock_head_size(const unsigned char *first, uint32_t n) {
    if (first[0] != FORMAT_ZIGZAG_ZSTD || !first[1] || !n) return -1;
    return (ssize_t)(2 + 4 * (size_t)((n + first[1] - 1) / first[1]));
}

void fblock_span(const unsigned char *head, uint32_t n, uint32_t c0, uint32_t c1, size_t *off, size_t *len) {
    uint32_t chunk = head[1], nchunks = (n + chunk - 1) / chunk;
    size_t at = 2 + 4 * (size_t)nchunks;
    *off = at;
    *len = 0;
    for (uint32_t k = 0; k < nchunks; k++) {
        size_t z = get_u32(head + 2 + 4 * (size_t)k);
        uint32_t k0 = k * chunk;
        if (k0 + chunk <= c0) *off = at + z;
        else if (k0 < c1) *len = at + z - *off;
        at += z;
    }
}

int fblock_decode_span(struct fblock_codec *c, const unsigned char *head, const unsigned char *span, size_t spanlen,
                       uint32_t nframes, uint32_t n, uint32_t c0, uint32_t c1, float *vals) {
    if (nframes < 1 || nframes > FBLOCK_STEPS || c1 > n || c0 >= c1) return c0 >= c1 && c1 <= n ? 0 : -1;
    uint32_t chunk = head[1], nchunks = (n + chunk - 1) / chunk;
    size_t at = 0;
    for (uint32_t k = c0 / chunk; k < nchunks && k * chunk < c1; k++) {
        size_t z = get_u32(head + 2 + 4 * (size_t)k);
        uint32_t k0 = k * chunk, cells = n - k0 < chunk ? n - k0 : chunk;
        if (z > spanlen - at) return -1;
        size_t raw = (size_t)cells * nframes * 4;
        size_t got = ZSTD_decompressDCtx(c->dctx, c->planes, sizeof c->planes, span + at, z);
        if (ZSTD_isError(got) || got != raw) return -1;
        uint32_t lo = c0 > k0 ? c0 - k0 : 0, hi = c1 < k0 + cells ? c1 - k0 : cells;
        chunk_backward(vals, c->planes, nframes, n, k0, cells, lo, hi);
        at += z;
    }
    return at == spanlen ? 0 : -1;
}

int fblock_decode(struct fblock_codec *c, const unsigned char *blob, size_t len, uint32_t nframes, uint32_t n,
                  uint32_t c0, uint32_t c1, float *vals) {
    ssize_t head = blob && len >= 2 ? fblock_head_size(blob, n) : -1;
    if (head < 0 || (size_t)head > len) return -1;
    size_t off, span, total;
    fblock_span(blob, n, 0, n, &off, &total);
    if (off + total != len) return -1; /* the chunks' sizes must add up to the blob */
    fblock_span(blob, n, c0, c1, &off, &span);
    return fblock_decode_span(c, blob, blob + off, span, nframes, n, c0, c1, vals);
}

uint32_t fblock_steps(int64_t block, uint64_t mask, int64_t *steps) {
    uint32_t nf = 0;
    for (; mask; mask &= mask - 1) steps[nf++] = block * FBLOCK_STEPS + __builtin_ctzll(mask);
    return nf;
}

uint32_t fblock_count(uint64_t mask) { return (uint32_t)__builtin_popcountll(mask); }

int64_t fblock_step(int64_t block, uint64_t mask, uint32_t f) {
    for (uint32_t i = 0; i < FBLOCK_STEPS; i++)
        if (mask >> i & 1 && f-- == 0) return block * FBLOCK_STEPS + i;
    return -1;
}
