/* test_fblock.c: the codec of sealed blocks (daemon/fblock.h). Every bit
 * of every value comes back (NaN payloads, -0, infinities, denormals,
 * random bits), for shapes around the chunk size and any number of frames;
 * a partial decode writes exactly the cells asked for; a blob that is not
 * a block of that shape is refused, never read past its end. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <zstd.h>

#include "fblock.h"
#include "integrity.h"

uint32_t integrity_crc32c_soft(uint32_t crc, const void *p, size_t n); /* integrity.c, for tests */

static uint64_t rng = 88172645463325252ull;
static uint32_t next_u32(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* nf frames of n values: a slow drift per cell, some random bits and the
 * special values. */
static void fill(float *v, uint32_t nf, uint32_t n) {
    static const uint32_t special[] = {0x7fc00000u, 0x7fa12345u, 0xffc00001u, 0x80000000u,
                                       0x7f800000u, 0xff800000u, 0x00000001u, 0x00000000u};
    for (uint32_t f = 0; f < nf; f++)
        for (uint32_t c = 0; c < n; c++) {
            uint32_t u;
            float x = 0.5f + 0.01f * (float)c + 0.001f * (float)f;
            memcpy(&u, &x, 4);
            if (c % 7 == 3) u = next_u32();
            if (c % 11 == 5) u = special[(f + c) % 8];
            memcpy(&v[(size_t)f * n + c], &u, 4);
        }
}

static void test_roundtrip(void **state) {
    (void)state;
    struct fblock_codec *c = fblock_codec_create();
    assert_non_null(c);
    static const uint32_t shapes[] = {1, 7, 8, 9, 12, 144, 1000};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
        for (uint32_t nf = 1; nf <= FBLOCK_STEPS; nf += nf < 4 ? 1 : 15) {
            uint32_t n = shapes[si];
            float *v = malloc((size_t)nf * n * 4), *w = malloc((size_t)nf * (n + 8) * 4); /* room for the n + 8 check */
            assert_non_null(v);
            assert_non_null(w);
            fill(v, nf, n);
            const unsigned char *coded;
            size_t len;
            assert_int_equal(fblock_encode(c, v, nf, n, &coded, &len), 0);
            unsigned char *blob = malloc(len); /* a copy this test may spoil */
            assert_non_null(blob);
            memcpy(blob, coded, len);
            memset(w, 0xAB, (size_t)nf * n * 4);
            assert_int_equal(fblock_decode(c, blob, len, nf, n, 0, n, w), 0);
            assert_memory_equal(v, w, (size_t)nf * n * 4);
            /* a cell range: those cells exactly, nothing else touched */
            uint32_t c0 = n / 3, c1 = c0 + 1 + n / 4 > n ? n : c0 + 1 + n / 4;
            memset(w, 0xAB, (size_t)nf * n * 4);
            assert_int_equal(fblock_decode(c, blob, len, nf, n, c0, c1, w), 0);
            for (uint32_t f = 0; f < nf; f++)
                for (uint32_t k = 0; k < n; k++) {
                    uint32_t got, want = 0xABABABABu;
                    memcpy(&got, &w[(size_t)f * n + k], 4);
                    if (k >= c0 && k < c1) memcpy(&want, &v[(size_t)f * n + k], 4);
                    if (got != want)
                        fail_msg("n %u frames %u cells [%u,%u): cell %u of frame %u is %08x, not %08x", n, nf, c0, c1,
                                 k, f, got, want);
                }
            /* every cell alone (a series of one head): its words of the
             * chunk's bit planes only, at any position in the chunk */
            for (uint32_t k = 0; k < n && n <= 144; k++) {
                memset(w, 0xAB, (size_t)nf * n * 4);
                assert_int_equal(fblock_decode(c, blob, len, nf, n, k, k + 1, w), 0);
                for (uint32_t f = 0; f < nf; f++)
                    if (memcmp(&w[(size_t)f * n + k], &v[(size_t)f * n + k], 4))
                        fail_msg("n %u frames %u: cell %u alone, frame %u differs", n, nf, k, f);
            }
            /* the same through the span a blob reader would read */
            ssize_t hs = fblock_head_size(blob, n);
            assert_true(hs > 0 && (size_t)hs <= len);
            size_t off, span;
            fblock_span(blob, n, c0, c1, &off, &span);
            assert_true(off + span <= len);
            memset(w, 0xAB, (size_t)nf * n * 4);
            assert_int_equal(fblock_decode_span(c, blob, blob + off, span, nf, n, c0, c1, w), 0);
            assert_memory_equal(&w[c0], &v[c0], (c1 - c0) * 4);
            /* not a block of this shape, or cut short: refused */
            assert_int_equal(fblock_decode(c, blob, len - 1, nf, n, 0, n, w), -1);
            assert_int_equal(fblock_decode(c, blob, 1, nf, n, 0, n, w), -1);
            if (nf < FBLOCK_STEPS) assert_int_equal(fblock_decode(c, blob, len, nf + 1, n, 0, n, w), -1);
            assert_int_equal(fblock_decode(c, blob, len, nf, n + 8, 0, n, w), -1);
            blob[0] ^= 0xff;
            assert_int_equal(fblock_decode(c, blob, len, nf, n, 0, n, w), -1);
            free(blob);
            free(v);
            free(w);
        }
    fblock_codec_destroy(c);
}

/* Slowly moving values compress: the point of the codec. */
static void test_compresses(void **state) {
    (void)state;
    struct fblock_codec *c = fblock_codec_create();
    uint32_t n = 144, nf = FBLOCK_STEPS;
    float *v = malloc((size_t)nf * n * 4);
    for (uint32_t f = 0; f < nf; f++)
        for (uint32_t k = 0; k < n; k++) v[(size_t)f * n + k] = 0.3f + 0.002f * (float)k + 1e-4f * (float)f;
    const unsigned char *blob;
    size_t len;
    assert_int_equal(fblock_encode(c, v, nf, n, &blob, &len), 0);
    assert_true(len < (size_t)nf * n * 4 / 3);
    free(v);
    fblock_codec_destroy(c);
}

/* The format as schema/storage.md states it, written the naive way (bit
 * by bit, byte by byte): a chunk's zigzag words, then its planes. */
static void naive_planes(unsigned char *out, const float *v, uint32_t nf, uint32_t n, uint32_t c0, uint32_t cells,
                         int format, size_t *bytes) {
    size_t m = (size_t)cells * nf, pb = m / 8;
    uint32_t *w = calloc(m, 4);
    assert_non_null(w);
    for (uint32_t c = 0; c < cells; c++)
        for (uint32_t f = 0; f < nf; f++) {
            uint32_t u, p = 0;
            memcpy(&u, &v[(size_t)f * n + c0 + c], 4);
            if (f) memcpy(&p, &v[(size_t)(f - 1) * n + c0 + c], 4);
            int32_t d = (int32_t)(u - p);
            w[(size_t)c * nf + f] = ((uint32_t)d << 1) ^ (uint32_t)(d >> 31);
        }
    if (format == 1) {
        for (size_t i = 0; i < m; i++)
            for (int k = 0; k < 4; k++) out[k * m + i] = (unsigned char)(w[i] >> (8 * k));
        *bytes = m * 4;
    } else {
        memset(out, 0, m * 4);
        for (size_t i = 0; i < 8 * pb; i++)
            for (int b = 0; b < 32; b++)
                if (w[i] >> b & 1) out[(size_t)b * pb + i / 8] |= (unsigned char)(1u << (i % 8));
        for (size_t i = 8 * pb; i < m; i++)
            for (int k = 0; k < 4; k++) out[4 * i + (size_t)k] = (unsigned char)(w[i] >> (8 * k));
        *bytes = m * 4;
    }
    free(w);
}

/* A blob of the given format and chunk built from naive_planes. */
static unsigned char *naive_blob(const float *v, uint32_t nf, uint32_t n, uint32_t chunk, int format, size_t *len) {
    uint32_t nchunks = (n + chunk - 1) / chunk;
    size_t cap = 2 + 4 * (size_t)nchunks + (size_t)nchunks * ZSTD_compressBound((size_t)chunk * nf * 4 + 32);
    unsigned char *b = malloc(cap), *planes = malloc((size_t)chunk * nf * 4 + 32);
    assert_non_null(b);
    assert_non_null(planes);
    b[0] = (unsigned char)format;
    b[1] = (unsigned char)chunk;
    size_t at = 2 + 4 * (size_t)nchunks;
    for (uint32_t k = 0; k < nchunks; k++) {
        uint32_t c0 = k * chunk, cells = n - c0 < chunk ? n - c0 : chunk;
        size_t raw;
        naive_planes(planes, v, nf, n, c0, cells, format, &raw);
        size_t z = ZSTD_compress(b + at, cap - at, planes, raw, 1);
        assert_false(ZSTD_isError(z));
        for (int i = 0; i < 4; i++) b[2 + 4 * k + (uint32_t)i] = (unsigned char)(z >> (8 * i));
        at += z;
    }
    free(planes);
    *len = at;
    return b;
}

/* The codec writes format 2 as documented (its chunks decompress to the
 * naive planes), and reads both formats written the naive way, with any
 * chunk size a blob states. */
static void test_format(void **state) {
    (void)state;
    struct fblock_codec *c = fblock_codec_create();
    assert_non_null(c);
    static const uint32_t shapes[] = {1, 5, 16, 17, 144};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
        for (uint32_t nf = 1; nf <= FBLOCK_STEPS; nf += 21) {
            uint32_t n = shapes[si];
            float *v = malloc((size_t)nf * n * 4), *w = malloc((size_t)nf * n * 4);
            unsigned char *planes = malloc((size_t)FBLOCK_CHUNK * nf * 4 + 32),
                          *raw = malloc((size_t)FBLOCK_CHUNK * nf * 4 + 32);
            assert_non_null(v);
            assert_non_null(w);
            fill(v, nf, n);
            const unsigned char *blob;
            size_t len;
            assert_int_equal(fblock_encode(c, v, nf, n, &blob, &len), 0);
            assert_int_equal(blob[0], 2);
            assert_int_equal(blob[1], FBLOCK_CHUNK);
            size_t at = 2 + 4 * (size_t)((n + FBLOCK_CHUNK - 1) / FBLOCK_CHUNK);
            for (uint32_t k = 0; k * FBLOCK_CHUNK < n; k++) {
                uint32_t c0 = k * FBLOCK_CHUNK, cells = n - c0 < FBLOCK_CHUNK ? n - c0 : FBLOCK_CHUNK;
                size_t z = (size_t)blob[2 + 4 * k] | (size_t)blob[3 + 4 * k] << 8 | (size_t)blob[4 + 4 * k] << 16, want;
                naive_planes(planes, v, nf, n, c0, cells, 2, &want);
                size_t got = ZSTD_decompress(raw, (size_t)FBLOCK_CHUNK * nf * 4 + 32, blob + at, z);
                assert_int_equal(got, want);
                assert_memory_equal(raw, planes, want);
                at += z;
            }
            assert_int_equal(at, len);
            for (int format = 1; format <= 2; format++)
                for (uint32_t chunk = 3; chunk <= 24; chunk += 21) {
                    size_t blen;
                    unsigned char *b = naive_blob(v, nf, n, chunk, format, &blen);
                    memset(w, 0xAB, (size_t)nf * n * 4);
                    assert_int_equal(fblock_decode(c, b, blen, nf, n, 0, n, w), 0);
                    assert_memory_equal(v, w, (size_t)nf * n * 4);
                    free(b);
                }
            free(planes);
            free(raw);
            free(v);
            free(w);
        }
    fblock_codec_destroy(c);
}

/* Format 3, a chunk a blob: each chunk is the naive planes of its cells
 * (as format 2's chunks), decodes to those cells exactly with the others
 * untouched, and a blob of another chunk, shape or length is refused. */
static void test_chunk_rows(void **state) {
    (void)state;
    struct fblock_codec *c = fblock_codec_create();
    assert_non_null(c);
    static const uint32_t shapes[] = {1, 15, 16, 17, 35, 144};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
        for (uint32_t nf = 1; nf <= FBLOCK_STEPS; nf += 21) {
            uint32_t n = shapes[si], nchunks = fblock_nchunks(n);
            assert_int_equal(nchunks, (n + FBLOCK_CHUNK - 1) / FBLOCK_CHUNK);
            float *v = malloc((size_t)nf * n * 4), *w = malloc((size_t)nf * n * 4);
            unsigned char *planes = malloc((size_t)FBLOCK_CHUNK * nf * 4 + 32),
                          *raw = malloc((size_t)FBLOCK_CHUNK * nf * 4 + 32);
            assert_non_null(v);
            assert_non_null(w);
            fill(v, nf, n);
            memset(w, 0xAB, (size_t)nf * n * 4);
            for (uint32_t k = 0; k < nchunks; k++) {
                const unsigned char *coded;
                size_t len, want;
                assert_int_equal(fblock_encode_chunk(c, v, nf, n, k, &coded, &len), 0);
                unsigned char *blob = malloc(len);
                assert_non_null(blob);
                memcpy(blob, coded, len);
                assert_int_equal(blob[0], 3);
                assert_int_equal(blob[1], FBLOCK_CHUNK);
                uint32_t k0 = k * FBLOCK_CHUNK, cells = n - k0 < FBLOCK_CHUNK ? n - k0 : FBLOCK_CHUNK;
                naive_planes(planes, v, nf, n, k0, cells, 2, &want);
                assert_int_equal(ZSTD_decompress(raw, (size_t)FBLOCK_CHUNK * nf * 4 + 32, blob + 2, len - 2), want);
                assert_memory_equal(raw, planes, want);
                /* one cell of it, then all of it */
                uint32_t one = k0 + cells / 2;
                float *x = malloc((size_t)nf * n * 4);
                assert_non_null(x);
                memset(x, 0xAB, (size_t)nf * n * 4);
                assert_int_equal(fblock_decode_chunk(c, blob, len, nf, n, k, one, one + 1, x), 0);
                for (uint32_t f = 0; f < nf; f++)
                    for (uint32_t cc = 0; cc < n; cc++) {
                        uint32_t got, exp = 0xABABABABu;
                        memcpy(&got, &x[(size_t)f * n + cc], 4);
                        if (cc == one) memcpy(&exp, &v[(size_t)f * n + cc], 4);
                        if (got != exp)
                            fail_msg("n %u chunk %u cell %u: cell %u of frame %u is %08x", n, k, one, cc, f, got);
                    }
                free(x);
                assert_int_equal(fblock_decode_chunk(c, blob, len, nf, n, k, 0, n, w), 0);
                /* refused: cut short, another chunk's place, a shape it is not */
                assert_int_equal(fblock_decode_chunk(c, blob, len - 1, nf, n, k, 0, n, w), -1);
                assert_int_equal(fblock_decode_chunk(c, blob, 2, nf, n, k, 0, n, w), -1);
                assert_int_equal(fblock_decode_chunk(c, blob, len, nf, n, nchunks, 0, n, w), -1);
                if (nf < FBLOCK_STEPS) assert_int_equal(fblock_decode_chunk(c, blob, len, nf + 1, n, k, 0, n, w), -1);
                /* a short last chunk is not one of a metric with a cell more (the
                 * codec knows sizes; which block and chunk a row is, the row's id says) */
                if (cells < FBLOCK_CHUNK) {
                    float *y = malloc((size_t)nf * (n + 1) * 4);
                    assert_non_null(y);
                    assert_int_equal(fblock_decode_chunk(c, blob, len, nf, n + 1, k, 0, n + 1, y), -1);
                    free(y);
                }
                blob[0] = 2;
                assert_int_equal(fblock_decode_chunk(c, blob, len, nf, n, k, 0, n, w), -1);
                free(blob);
            }
            assert_memory_equal(v, w, (size_t)nf * n * 4); /* the chunks together are the block */
            assert_int_equal(fblock_encode_chunk(c, v, nf, n, nchunks, &(const unsigned char *){0}, &(size_t){0}), -1);
            free(planes);
            free(raw);
            free(v);
            free(w);
        }
    fblock_codec_destroy(c);
}

/* bfloat16 rounding: to nearest, ties to even, on the bits; the special
 * values stay what they are; it is what makes a lossy block small. */
static void test_bf16(void **state) {
    (void)state;
    static const uint32_t in[] = {0x3f800000u, 0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u,
                                  0xbf808001u, 0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0xff800000u,
                                  0x7fc00000u, 0x7f800001u, 0x00000001u, 0x80000000u};
    static const uint32_t want[] = {0x3f800000u, 0x3f800000u, 0x3f820000u, 0x3f800000u, 0x3f810000u,
                                    0xbf810000u, 0x7f7f0000u, 0xff7f0000u, 0x7f800000u, 0xff800000u,
                                    0x7fc00000u, 0x7fc00000u, 0x00000000u, 0x80000000u};
    float v[sizeof in / sizeof *in];
    memcpy(v, in, sizeof v);
    fblock_round(v, sizeof in / sizeof *in, FBLOCK_BITS_BF16);
    for (size_t i = 0; i < sizeof in / sizeof *in; i++) {
        uint32_t got;
        memcpy(&got, &v[i], 4);
        if (got != want[i]) fail_msg("bf16 of %08x: %08x, not %08x", in[i], got, want[i]);
    }
    /* a noisy block: rounded, it codes to under half its exact size */
    struct fblock_codec *c = fblock_codec_create();
    uint32_t n = 144, nf = FBLOCK_STEPS;
    float *x = malloc((size_t)nf * n * 4);
    assert_non_null(x);
    for (uint32_t i = 0; i < nf * n; i++) x[i] = 0.5f + (float)(next_u32() % 1000000) * 1e-6f;
    const unsigned char *blob;
    size_t exact, lossy;
    assert_int_equal(fblock_encode(c, x, nf, n, &blob, &exact), 0);
    fblock_round(x, (size_t)nf * n, FBLOCK_BITS_BF16);
    assert_int_equal(fblock_encode(c, x, nf, n, &blob, &lossy), 0);
    assert_true(lossy * 2 < exact);
    free(x);
    fblock_codec_destroy(c);
}

/* A reference for fblock_round at any precision, in double arithmetic
 * rather than on the bits: the finite value x rounded to `bits` mantissa
 * bits, to nearest, ties to even (nearbyint's default mode), clamped to the
 * largest finite value of that precision. */
static float round_ref(float x, int bits) {
    if (x == 0.0f) return x;
    int e;
    frexp((double)x, &e);   /* x = m 2^e, 0.5 <= |m| < 1: its unit in the last kept place is 2^(e - 1 - bits) */
    if (e < -125) e = -125; /* subnormals: a fixed exponent, like their bits */
    double q = ldexp(nearbyint(ldexp((double)x, bits + 1 - e)), e - bits - 1);
    double top = ldexp(2.0 - ldexp(1.0, -bits), 127);
    if (q > top) q = top;
    if (q < -top) q = -top;
    return (float)q;
}

/* Every precision from 1 to 22 bits agrees with the reference on random
 * values of every magnitude, on halfway cases and at the top of the range;
 * the error bound holds; 0 and 23 bits change nothing. */
static void test_round_bits(void **state) {
    (void)state;
    for (int bits = 1; bits <= 22; bits++) {
        for (int i = 0; i < 20000; i++) {
            uint32_t u = next_u32();
            if (i % 4 == 1) u = (u & ~((1u << (23 - bits)) - 1u)) | (1u << (22 - bits)); /* a tie */
            if (i % 4 == 2) u |= 0x7f000000u;                                            /* near the top */
            float x, got;
            memcpy(&x, &u, 4);
            if (!isfinite(x)) continue;
            got = x;
            fblock_round(&got, 1, bits);
            float want = round_ref(x, bits);
            uint32_t g, w;
            memcpy(&g, &got, 4);
            memcpy(&w, &want, 4);
            if (g != w) fail_msg("%d bits of %08x: %08x, not %08x", bits, u, g, w);
            int clamped = fabs((double)got) == ldexp(2.0 - ldexp(1.0, -bits), 127);
            if (isnormal(x) && !clamped && fabs((double)got - x) > ldexp(fabs((double)x), -bits - 1))
                fail_msg("%d bits of %08x: error over 2^-%d", bits, u, bits + 1);
        }
        /* a NaN stays NaN, made quiet, with its sign and the payload bits
         * that fit; an infinity stays itself */
        uint32_t low = (1u << (23 - bits)) - 1u;
        for (int i = 0; i < 1000; i++) {
            uint32_t payload = next_u32() & 0x007fffffu;
            if (!payload) payload = 1; /* a signalling NaN with only its lowest bit set */
            uint32_t u = (next_u32() & 0x80000000u) | 0x7f800000u | payload, g;
            float x;
            memcpy(&x, &u, 4);
            fblock_round(&x, 1, bits);
            memcpy(&g, &x, 4);
            if (g != ((u | 0x00400000u) & ~low)) fail_msg("%d bits of NaN %08x: %08x", bits, u, g);
        }
        for (int sign = 0; sign < 2; sign++) {
            uint32_t u = (uint32_t)sign << 31 | 0x7f800000u, g;
            float x;
            memcpy(&x, &u, 4);
            fblock_round(&x, 1, bits);
            memcpy(&g, &x, 4);
            assert_int_equal(g, u);
        }
    }
    float x = 1.2345678f, y = x;
    fblock_round(&y, 1, 0);
    assert_true(y == x);
    fblock_round(&y, 1, 23);
    assert_true(y == x);
}

static void test_steps(void **state) {
    (void)state;
    int64_t steps[FBLOCK_STEPS];
    uint64_t mask = (UINT64_C(1) << 0) | (UINT64_C(1) << 5) | (UINT64_C(1) << 63);
    assert_int_equal(fblock_count(mask), 3);
    assert_int_equal(fblock_steps(10, mask, steps), 3);
    assert_int_equal(steps[0], 640);
    assert_int_equal(steps[1], 645);
    assert_int_equal(steps[2], 703);
    assert_int_equal(fblock_step(10, mask, 2), 703);
    assert_int_equal(fblock_step(10, mask, 3), -1);
}

/* CRC32C: the standard check value, the table and the instruction agree
 * at every length and alignment, chaining equals one pass, and every
 * single bit flip of a coded chunk (blob, mask or id) changes its
 * checksum (integrity.h: how a damaged block chunk is told from a good one). */
static void test_chunk_checksum(void **state) {
    (void)state;
    assert_int_equal(integrity_crc32c(0, "123456789", 9), 0xE3069283u);
    assert_int_equal(integrity_crc32c_soft(0, "123456789", 9), 0xE3069283u);
    unsigned char buf[300];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)(i * 131 + 7);
    for (size_t off = 0; off < 8; off++)
        for (size_t n = 0; n + off <= sizeof buf; n += 13) {
            uint32_t a = integrity_crc32c(0, buf + off, n), b = integrity_crc32c_soft(0, buf + off, n);
            assert_int_equal(a, b);
            assert_int_equal(integrity_crc32c(integrity_crc32c(0, buf + off, n / 2), buf + off + n / 2, n - n / 2), a);
        }
    struct fblock_codec *c = fblock_codec_create();
    float vals[40 * 20];
    for (int i = 0; i < 40 * 20; i++) vals[i] = 1.0f + 0.001f * (float)((i * 7919) % 113);
    const unsigned char *blob;
    size_t len;
    assert_int_equal(fblock_encode_chunk(c, vals, 40, 20, 1, &blob, &len), 0);
    unsigned char *copy = malloc(len);
    memcpy(copy, blob, len);
    uint64_t mask = (UINT64_C(1) << 40) - 1;
    int64_t id = (INT64_C(5) << 26) + 3;
    uint32_t good = integrity_chunk_crc(id, mask, copy, len);
    for (size_t bit = 0; bit < len * 8; bit++) {
        copy[bit / 8] ^= (unsigned char)(1u << (bit % 8));
        if (integrity_chunk_crc(id, mask, copy, len) == good)
            fail_msg("bit %zu of the chunk flipped: same checksum", bit);
        copy[bit / 8] ^= (unsigned char)(1u << (bit % 8));
    }
    for (int bit = 0; bit < 64; bit++) {
        assert_true(integrity_chunk_crc(id, mask ^ (UINT64_C(1) << bit), copy, len) != good);
        assert_true(integrity_chunk_crc((int64_t)((uint64_t)id ^ (UINT64_C(1) << bit)), mask, copy, len) != good);
    }
    assert_int_equal(integrity_chunk_crc(id, mask, copy, len), good);
    free(copy);
    fblock_codec_destroy(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),  cmocka_unit_test(test_compresses),     cmocka_unit_test(test_format),
        cmocka_unit_test(test_chunk_rows), cmocka_unit_test(test_bf16),           cmocka_unit_test(test_round_bits),
        cmocka_unit_test(test_steps),      cmocka_unit_test(test_chunk_checksum),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
