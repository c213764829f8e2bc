/* fblock.h: the codec of a block of frames at rest (schema/storage.md,
 * "Blocks"): the frames of one metric in one aligned run of FBLOCK_STEPS
 * steps, losslessly compressed into one blob. Pure code: it knows bytes,
 * not SQL (the store writes the blobs, the query module reads them).
 *
 * A block holds nframes frames (the steps present, in order) of n float32
 * values each. The values are cut into chunks of FBLOCK_CHUNK cells; each
 * chunk is coded alone (so a reader of a few cells decodes only their
 * chunks): per cell, the difference of each value's bits from the previous
 * step's (zigzag-coded), those words split into 32 bit planes, then zstd
 * (format 2; format 1, byte planes, is still read). Decoding gives back
 * the very bits that were encoded (NaN payloads included). */
#ifndef FBLOCK_H
#define FBLOCK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define FBLOCK_STEPS 64 /* block b holds steps [b*64, b*64+63]: level 1 of the rollups */
#define FBLOCK_CHUNK 16 /* cells per independently coded chunk (a reader of one cell decodes 16) */

/* A codec's reusable state (zstd's contexts): one per thread at a time,
 * e.g. one per store or per read connection. fblock_codec_create returns
 * NULL when out of memory; fblock_codec_destroy accepts NULL. */
struct fblock_codec;
struct fblock_codec *fblock_codec_create(void);
void fblock_codec_destroy(struct fblock_codec *c);

/* Encodes nframes (1..FBLOCK_STEPS) frames of n (>= 1) values (vals:
 * frame-major, nframes x n) into a blob owned by the codec, valid until
 * its next fblock_encode or its destroy. Returns its size in *len and 0,
 * or -1 (out of memory, or a shape out of range). */
int fblock_encode(struct fblock_codec *c, const float *vals, uint32_t nframes, uint32_t n, const unsigned char **blob,
                  size_t *len);

/* Decodes cells [c0, c1) of every frame of a blob of nframes frames of n
 * values into vals (frame-major, nframes x n; the other cells are left as
 * they were). Returns 0, or -1 for a blob that is not such a block
 * (corrupt or another shape): vals is then partly written. */
int fblock_decode(struct fblock_codec *c, const unsigned char *blob, size_t len, uint32_t nframes, uint32_t n,
                  uint32_t c0, uint32_t c1, float *vals);

/* One chunk a blob (the rows of migration 8, fblock_rows.h): chunk k
 * holds cells [k*FBLOCK_CHUNK, (k+1)*FBLOCK_CHUNK) of every frame, so a
 * reader of one head reads and decodes one small blob a block. A metric
 * of n values has fblock_nchunks(n) chunks. fblock_encode_chunk codes
 * chunk k of nframes frames of n values (frame-major) into a blob owned
 * by the codec (as fblock_encode's; 0 or -1). fblock_decode_chunk decodes
 * the cells of [c0, c1) that chunk k holds into vals (frame-major, nframes
 * x n; the other cells left as they were): 0, or -1 for a blob that is
 * not chunk k of such a block. */
uint32_t fblock_nchunks(uint32_t n);
int fblock_encode_chunk(struct fblock_codec *c, const float *vals, uint32_t nframes, uint32_t n, uint32_t k,
                        const unsigned char **blob, size_t *len);
int fblock_decode_chunk(struct fblock_codec *c, const unsigned char *blob, size_t len, uint32_t nframes, uint32_t n,
                        uint32_t k, uint32_t c0, uint32_t c1, float *vals);

/* Reading a few cells without the whole blob (sqlite3_blob_read):
 * fblock_head_size gives the bytes of the header from the blob's first two
 * bytes (-1: not a block of n values); fblock_span the byte range [*off,
 * *off + *len) of the blob holding the chunks of cells [c0, c1), from the
 * header; fblock_decode_span decodes those cells from that range (head:
 * the header; 0, or -1 when they do not decode). */
ssize_t fblock_head_size(const unsigned char *first, uint32_t n);
void fblock_span(const unsigned char *head, uint32_t n, uint32_t c0, uint32_t c1, size_t *off, size_t *len);
int fblock_decode_span(struct fblock_codec *c, const unsigned char *head, const unsigned char *span, size_t spanlen,
                       uint32_t nframes, uint32_t n, uint32_t c0, uint32_t c1, float *vals);

/* The lossy precision (entropyd --lossy-bits, --lossy-bf16): rounds each
 * of n values in place to `bits` mantissa bits (float32's sign, exponent
 * and top `bits` of its 23 mantissa bits; to nearest, ties to even), so
 * that the low 23 - bits planes of a block are zeros: relative error at
 * most 2^-(bits + 1) for a normal value (a subnormal one, under 1.2e-38,
 * is rounded at the smallest normal's step, 2^-(126 + bits), so it may
 * even become 0). bits 7 is bfloat16; bits outside 1..22 leave the
 * values as they are. NaN stays NaN (quiet), an infinity stays itself, and
 * a finite value never rounds to an infinity (it stops at the largest
 * finite value of that precision). */
#define FBLOCK_BITS_BF16 7
void fblock_round(float *vals, size_t n, int bits);

/* The steps of a block from its mask (bit i: step block*64 + i present):
 * the number present; fblock_steps writes them, in order, into steps
 * (room for FBLOCK_STEPS); fblock_step gives the step of frame number f
 * (0-based) or -1. */
uint32_t fblock_count(uint64_t mask);
uint32_t fblock_steps(int64_t block, uint64_t mask, int64_t *steps);
int64_t fblock_step(int64_t block, uint64_t mask, uint32_t f);

#endif
