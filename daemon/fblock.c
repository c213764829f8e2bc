/* fblock.c: the codec of a block of frames (fblock.h). The layout of a
 * blob: byte 0 is the format (FORMAT_BIT_PLANES when written), byte 1 the
 * cells per chunk (FBLOCK_CHUNK when written); then, per chunk, its
 * compressed size (u32, little-endian); then the chunks. A chunk holds m =
 * cells x nframes words, cell by cell and step by step within a cell; a
 * value is coded as the zigzag of the difference of its bits from the same
 * cell's previous frame (0 before the first). Before zstd the words are cut
 * into planes: format 2 32 bit planes (bit b of every word, then bit b+1;
 * the last m % 8 words as they are), format 1 four byte planes. Slowly moving values differ in their low
 * mantissa bits only, so the high planes are nearly all zeros, and the
 * sign, exponent and high mantissa bits each get a plane of their own. */
#include "fblock.h"

#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#define FORMAT_BYTE_PLANES 1 /* written before format 2; still read */
#define FORMAT_BIT_PLANES 2  /* a whole block of bit-plane chunks (migration 6's rows); still read */
#define FORMAT_CHUNK 3       /* one chunk of format 2, a row of its own (migration 8's rows): written now */
#define ZSTD_LEVEL -1 /* zstd's fast mode: 15% of the writer's instructions less than level 3 for 1% more bytes */
#define MAX_CHUNK 255 /* cells per chunk a blob can say (one byte) */
#define CHUNK_WORDS (MAX_CHUNK * FBLOCK_STEPS)

struct fblock_codec {
    ZSTD_CCtx *cctx;
    ZSTD_DCtx *dctx;
    unsigned char bytes[CHUNK_WORDS * 4];  /* a chunk's coded words as byte planes */
    unsigned char planes[CHUNK_WORDS * 4]; /* the same as bit planes, or zstd's output */
    unsigned char *out;                    /* fblock_encode's blob, grown on demand */
    size_t outcap;
};

struct fblock_codec *fblock_codec_create(void) {
    struct fblock_codec *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->cctx = ZSTD_createCCtx();
    c->dctx = ZSTD_createDCtx();
    if (!c->cctx || !c->dctx || ZSTD_isError(ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_compressionLevel, ZSTD_LEVEL))) {
        fblock_codec_destroy(c);
        return NULL;
    }
    return c;
}

void fblock_codec_destroy(struct fblock_codec *c) {
    if (!c) return;
    ZSTD_freeCCtx(c->cctx);
    ZSTD_freeDCtx(c->dctx);
    free(c->out);
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

/* The byte planes of the coded words of cells [c0, c0 + cells) of
 * nframes frames of n values, cell by cell: the zigzag of each value's
 * bits minus the same cell's in the frame before; byte k of word i at
 * bp[k*m + i] (format 1's planes). */
static void chunk_forward(unsigned char *bp, const float *vals, uint32_t nframes, uint32_t n, uint32_t c0,
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
            bp[i] = (unsigned char)z;
            bp[m + i] = (unsigned char)(z >> 8);
            bp[2 * m + i] = (unsigned char)(z >> 16);
            bp[3 * m + i] = (unsigned char)(z >> 24);
        }
    }
}

/* The inverse of chunk_forward, for cells [lo, hi) of the chunk only. */
static void chunk_backward(float *vals, const unsigned char *bp, uint32_t nframes, uint32_t n, uint32_t c0,
                           uint32_t cells, uint32_t lo, uint32_t hi) {
    size_t m = (size_t)cells * nframes;
    for (uint32_t c = lo; c < hi; c++) {
        uint32_t prev = 0;
        for (uint32_t f = 0; f < nframes; f++) {
            size_t i = (size_t)c * nframes + f;
            uint32_t z = (uint32_t)bp[i] | (uint32_t)bp[m + i] << 8 | (uint32_t)bp[2 * m + i] << 16 |
                         (uint32_t)bp[3 * m + i] << 24;
            prev += (z >> 1) ^ (0u - (z & 1));
            memcpy(&vals[(size_t)f * n + c0 + c], &prev, 4);
        }
    }
}

/* Transposes the 8x8 bit matrix whose row j is byte j of x (bit r of
 * row j becomes bit j of row r); its own inverse. */
static uint64_t transpose8(uint64_t x) {
    uint64_t t;
    t = (x ^ (x >> 7)) & UINT64_C(0x00AA00AA00AA00AA);
    x ^= t ^ (t << 7);
    t = (x ^ (x >> 14)) & UINT64_C(0x0000CCCC0000CCCC);
    x ^= t ^ (t << 14);
    t = (x ^ (x >> 28)) & UINT64_C(0x00000000F0F0F0F0);
    x ^= t ^ (t << 28);
    return x;
}

static uint64_t load_u64(const unsigned char *p) {
    uint64_t x;
    memcpy(&x, p, 8); /* little-endian hosts only, as the rest of the store */
    return x;
}

/* Format 2 from format 1's byte planes bp of m words: the first 8*pb
 * words (pb = m / 8) as 32 bit planes of pb bytes (bit b of word i is bit
 * i%8 of planes[b*pb + i/8]), then the m % 8 others as they are (u32,
 * little-endian): 4m bytes. Bytes 8g..8g+7 of byte plane k, transposed,
 * are byte g of bit planes 8k..8k+7. */
static void bit_planes_forward(unsigned char *planes, const unsigned char *bp, size_t m) {
    size_t pb = m / 8;
    for (int k = 0; k < 4; k++) {
        const unsigned char *src = bp + (size_t)k * m;
        unsigned char *dst = planes + (size_t)8 * k * pb;
        for (size_t g = 0; g < pb; g++) {
            uint64_t x = transpose8(load_u64(src + 8 * g));
            for (int r = 0; r < 8; r++) dst[(size_t)r * pb + g] = (unsigned char)(x >> (8 * r));
        }
    }
    for (size_t i = 8 * pb; i < m; i++)
        for (int k = 0; k < 4; k++) planes[4 * i + (size_t)k] = bp[(size_t)k * m + i];
}

/* The inverse of bit_planes_forward, for words [w0, w1) only (a reader
 * of one cell of a 16-cell chunk transposes a sixteenth of it); the other
 * words of bp are left as they were. */
static void bit_planes_backward(unsigned char *bp, const unsigned char *planes, size_t m, size_t w0, size_t w1) {
    size_t pb = m / 8, g0 = w0 / 8, g1 = (w1 + 7) / 8 < pb ? (w1 + 7) / 8 : pb;
    for (int k = 0; k < 4; k++) {
        const unsigned char *src = planes + (size_t)8 * k * pb;
        unsigned char *dst = bp + (size_t)k * m;
        for (size_t g = g0; g < g1; g++) {
            uint64_t x = 0;
            for (int r = 0; r < 8; r++) x |= (uint64_t)src[(size_t)r * pb + g] << (8 * r);
            x = transpose8(x);
            memcpy(dst + 8 * g, &x, 8);
        }
    }
    for (size_t i = 8 * pb > w0 ? 8 * pb : w0; i < m && i < w1; i++)
        for (int k = 0; k < 4; k++) bp[(size_t)k * m + i] = planes[4 * i + (size_t)k];
}

/* Codes cells [k0, k0 + cells) of nframes frames of n values as one zstd
 * frame of their bit planes into dst (cap bytes): its size, or 0 on
 * failure. */
static size_t chunk_encode(struct fblock_codec *c, const float *vals, uint32_t nframes, uint32_t n, uint32_t k0,
                           uint32_t cells, unsigned char *dst, size_t cap) {
    size_t m = (size_t)cells * nframes;
    chunk_forward(c->bytes, vals, nframes, n, k0, cells);
    bit_planes_forward(c->planes, c->bytes, m);
    size_t z = ZSTD_compress2(c->cctx, dst, cap, c->planes, m * 4);
    return ZSTD_isError(z) ? 0 : z;
}

/* Decodes cells [k0 + lo, k0 + hi) of the chunk of cells [k0, k0 + cells)
 * coded in format fmt at src (z bytes) into vals: 0, or -1. */
static int chunk_decode(struct fblock_codec *c, int fmt, const unsigned char *src, size_t z, uint32_t nframes,
                        uint32_t n, uint32_t k0, uint32_t cells, uint32_t lo, uint32_t hi, float *vals) {
    size_t m = (size_t)cells * nframes, raw = m * 4;
    if (raw > sizeof c->planes) return -1; /* more frames or cells than a block holds */
    size_t got = ZSTD_decompressDCtx(c->dctx, c->planes, sizeof c->planes, src, z);
    if (ZSTD_isError(got) || got != raw) return -1;
    const unsigned char *bp = c->planes;
    if (fmt != FORMAT_BYTE_PLANES) {
        bit_planes_backward(c->bytes, c->planes, m, (size_t)lo * nframes, (size_t)hi * nframes);
        bp = c->bytes;
    }
    chunk_backward(vals, bp, nframes, n, k0, cells, lo, hi);
    return 0;
}

/* Makes room for cap bytes of output in the codec: 0, or -1. */
static int out_grow(struct fblock_codec *c, size_t cap) {
    if (cap <= c->outcap) return 0;
    unsigned char *o = realloc(c->out, cap);
    if (!o) return -1;
    c->out = o;
    c->outcap = cap;
    return 0;
}

int fblock_encode(struct fblock_codec *c, const float *vals, uint32_t nframes, uint32_t n, const unsigned char **blob,
                  size_t *len) {
    if (nframes < 1 || nframes > FBLOCK_STEPS || n < 1) return -1;
    uint32_t nchunks = fblock_nchunks(n);
    size_t head = 2 + 4 * (size_t)nchunks;
    size_t cap = head + (size_t)nchunks * ZSTD_compressBound((size_t)FBLOCK_CHUNK * FBLOCK_STEPS * 4);
    if (out_grow(c, cap)) return -1;
    unsigned char *b = c->out;
    b[0] = FORMAT_BIT_PLANES;
    b[1] = FBLOCK_CHUNK;
    size_t at = head;
    for (uint32_t k = 0; k < nchunks; k++) {
        uint32_t c0 = k * FBLOCK_CHUNK, cells = n - c0 < FBLOCK_CHUNK ? n - c0 : FBLOCK_CHUNK;
        size_t z = chunk_encode(c, vals, nframes, n, c0, cells, b + at, cap - at);
        if (!z) return -1;
        put_u32(b + 2 + 4 * (size_t)k, (uint32_t)z);
        at += z;
    }
    *blob = b;
    *len = at;
    return 0;
}

uint32_t fblock_nchunks(uint32_t n) { return (n + FBLOCK_CHUNK - 1) / FBLOCK_CHUNK; }

int fblock_encode_chunk(struct fblock_codec *c, const float *vals, uint32_t nframes, uint32_t n, uint32_t k,
                        const unsigned char **blob, size_t *len) {
    if (nframes < 1 || nframes > FBLOCK_STEPS || n < 1 || k >= fblock_nchunks(n)) return -1;
    size_t cap = 2 + ZSTD_compressBound((size_t)FBLOCK_CHUNK * FBLOCK_STEPS * 4);
    if (out_grow(c, cap)) return -1;
    uint32_t k0 = k * FBLOCK_CHUNK, cells = n - k0 < FBLOCK_CHUNK ? n - k0 : FBLOCK_CHUNK;
    c->out[0] = FORMAT_CHUNK;
    c->out[1] = FBLOCK_CHUNK;
    size_t z = chunk_encode(c, vals, nframes, n, k0, cells, c->out + 2, cap - 2);
    if (!z) return -1;
    *blob = c->out;
    *len = 2 + z;
    return 0;
}

int fblock_decode_chunk(struct fblock_codec *c, const unsigned char *blob, size_t len, uint32_t nframes, uint32_t n,
                        uint32_t k, uint32_t c0, uint32_t c1, float *vals) {
    if (!blob || len < 3 || blob[0] != FORMAT_CHUNK || blob[1] != FBLOCK_CHUNK || nframes < 1 ||
        nframes > FBLOCK_STEPS || c1 > n || k >= fblock_nchunks(n))
        return -1;
    uint32_t k0 = k * FBLOCK_CHUNK, cells = n - k0 < FBLOCK_CHUNK ? n - k0 : FBLOCK_CHUNK;
    uint32_t lo = c0 > k0 ? c0 - k0 : 0, hi = c1 < k0 + cells ? (c1 > k0 ? c1 - k0 : 0) : cells;
    if (lo >= hi) return 0; /* none of the chunk's cells wanted */
    return chunk_decode(c, FORMAT_CHUNK, blob + 2, len - 2, nframes, n, k0, cells, lo, hi, vals);
}

ssize_t fblock_head_size(const unsigned char *first, uint32_t n) {
    if ((first[0] != FORMAT_BYTE_PLANES && first[0] != FORMAT_BIT_PLANES) || !first[1] || !n) return -1;
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
        uint32_t lo = c0 > k0 ? c0 - k0 : 0, hi = c1 < k0 + cells ? c1 - k0 : cells;
        if (chunk_decode(c, head[0], span + at, z, nframes, n, k0, cells, lo, hi, vals)) return -1;
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

void fblock_round(float *vals, size_t n, int bits) {
    if (bits < 1 || bits >= 23) return;
    uint32_t drop = 23u - (uint32_t)bits, low = (1u << drop) - 1u, half = 1u << (drop - 1u);
    for (size_t i = 0; i < n; i++) {
        uint32_t u = bits_of(vals[i]), r;
        if ((u & 0x7f800000u) == 0x7f800000u) /* NaN (quiet, payload kept as far as it fits) or infinity */
            r = (u & 0x007fffffu) ? (u | 0x00400000u) & ~low : u;
        else {
            /* to nearest, ties to even: a carry out of the mantissa steps
             * the exponent, as it should */
            r = (u + (half - 1u) + (u >> drop & 1u)) & ~low;
            if ((r & 0x7f800000u) == 0x7f800000u) r = (u & 0x80000000u) | (0x7f7fffffu & ~low);
        }
        memcpy(&vals[i], &r, 4);
    }
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
