/* rollup.h: the exact summary of a block of steps per value (min, max,
 * sum and count of the finite values), and the coding of a row of them at
 * rest (schema/storage.md, "Rollups"). Pure code: it knows bytes, not SQL
 * (the store writes the rows, the series query reads them).
 *
 * A row holds one cell per value of a frame. Two formats are read:
 * - raw (every row written before the coding, and the coder's fallback):
 *   ROLLUP_RAW_BYTES per value, f32 min, f32 max, f64 sum, u32 count;
 * - coded (format 1): a header, then each field of every cell as a
 *   bit-packed integer of one width per field and row (frame of reference,
 *   the common low zero bits shifted out), the count left out when every
 *   cell's count is the block's frame count. Decoding gives back the very
 *   bits encoded (NaN payloads, -0, infinities, subnormals included).
 * A row's size tells them apart: a raw row is exactly ROLLUP_RAW_BYTES * n
 * bytes, and the coder never writes a coded row of that size. */
#ifndef ROLLUP_H
#define ROLLUP_H

#include <stddef.h>
#include <stdint.h>

#define ROLLUP_RAW_BYTES 20   /* per value in a raw row: f32 min, f32 max, f64 sum, u32 finite count */
#define ROLLUP_FORMAT_CODED 1 /* byte 0 of a coded row */
#define ROLLUP_HEAD_BYTES 27  /* the coded row's header */

/* Rollup levels: level k (1..ROLLUP_LEVELS) summarizes blocks of
 * ROLLUP_LEVEL_SIZE(k) steps (the store writes every level, the series
 * query and the integrity check read them). */
#define ROLLUP_LEVELS 5
#define ROLLUP_LEVEL_SIZE(k) (INT64_C(64) << (3 * ((k)-1))) /* 64, 512, 4096, 32768, 262144 */

/* One value's summary. count is the number of finite values pooled; with
 * count 0, min and max are NaN and sum 0 (rollup_reset). */
struct rollup_cell {
    float mn, mx;
    double sum;
    uint32_t count;
};

/* Sets n cells to the empty summary. */
void rollup_reset(struct rollup_cell *a, uint32_t n);

/* Pools summary x into e (exactly as the series query pools buckets:
 * min and max of the two, sums added in this order). An empty x changes
 * nothing. */
void rollup_merge(struct rollup_cell *e, const struct rollup_cell *x);

/* Pools one value (a frame's) into e: a non-finite one is not counted. */
void rollup_add(struct rollup_cell *e, float v);

/* The largest row rollup_encode writes for n values. */
#define ROLLUP_MAX_BYTES(n) ((size_t)(n)*ROLLUP_RAW_BYTES)

/* Writes the row of n (>= 1) cells of a block of nframes frames into out
 * (room for ROLLUP_MAX_BYTES(n)): coded, or raw where coding would not be
 * smaller. Returns its length. A coded row of at least ROLLUP_TOTAL_MIN
 * cells carries their total where one can be shown (rollup_total). */
size_t rollup_encode(const struct rollup_cell *a, uint32_t n, uint32_t nframes, unsigned char *out);

/* A metric's row is stored cut into chunks of ROLLUP_CHUNK_CELLS cells
 * (the last one shorter), a row each: a reader of one head reads its
 * chunk's row, not every cell's (schema/storage.md, "Rollups"). A metric
 * of one chunk has one row, as rollup_encode writes it; a metric of
 * several has rows without totals (rollup_encode_chunk), and its total
 * in a row of its own (rollup_total_encode). */
#define ROLLUP_CHUNK_CELLS 64
#define ROLLUP_CHUNKS(n) (((n) + ROLLUP_CHUNK_CELLS - 1) / ROLLUP_CHUNK_CELLS)
/* The cells of chunk c of a row of n: it starts at c * ROLLUP_CHUNK_CELLS
 * and holds this many (ROLLUP_CHUNK_CELLS, or fewer for the last). */
#define ROLLUP_CHUNK_LEN(n, c) \
    ((n) - (c)*ROLLUP_CHUNK_CELLS < ROLLUP_CHUNK_CELLS ? (n) - (c)*ROLLUP_CHUNK_CELLS : ROLLUP_CHUNK_CELLS)

/* rollup_encode without the total: a chunk of a metric of several. */
size_t rollup_encode_chunk(const struct rollup_cell *a, uint32_t n, uint32_t nframes, unsigned char *out);

/* Decodes cells [c0, c1) of a row of n values of a block of nframes frames
 * (either format) into out[c0..c1) (the other cells are left as they
 * were). Returns 0, or -1 for a row that is not such a row (corrupt, or
 * another shape): out is then partly written. */
int rollup_decode(const unsigned char *row, size_t len, uint32_t n, uint32_t nframes, uint32_t c0, uint32_t c1,
                  struct rollup_cell *out);

/* What pooling every value of a row one by one gives (a series over all
 * of a metric's values pools them so): min and max of the values with a
 * count (NaN if none), the sum of the counts, and the sum of the sums,
 * exactly k * 2^qe, with kabs a bound of the sum of |sum| / 2^qe (< 2^54). Coded
 * rows of at least ROLLUP_TOTAL_MIN values carry one where every sum is
 * such a multiple. */
#define ROLLUP_TOTAL_MIN 16
struct rollup_total {
    float mn, mx;
    uint64_t count;
    int64_t k;
    uint64_t kabs;
    int qe;
};

/* The total of a row of n values of a block of nframes frames: 1 and *t,
 * 0 when the row has none (decode its cells), -1 for a row that is not
 * such a row. */
int rollup_total(const unsigned char *row, size_t len, uint32_t n, uint32_t nframes, struct rollup_total *t);

/* The total of n cells of a block of nframes frames, alone (a metric of
 * several chunks keeps it in a row of its own): f32 min, f32 max, i64 k,
 * u8 bit width of kabs, i16 qe, then u64 count unless it is n * nframes.
 * Writes it into out (room for ROLLUP_TOTAL_BYTES) and returns its length,
 * or 0 when the cells have none (a sum not a multiple of a common 2^qe
 * below 2^53 of it: the reader pools the cells). */
#define ROLLUP_TOTAL_BYTES 27
size_t rollup_total_encode(const struct rollup_cell *a, uint32_t n, uint32_t nframes, unsigned char *out);

/* Reads what rollup_total_encode wrote (len bytes at d, for n values of
 * nframes frames): 1 and *t, 0 for none (len 0), -1 for bytes that are not
 * a total. */
int rollup_total_decode(const unsigned char *d, size_t len, uint32_t n, uint32_t nframes, struct rollup_total *t);

/* Adds t's sum to *sum when that gives the very double that adding the
 * row's sums to *sum one by one, in order, gives (every partial sum is a
 * multiple of 2^qe below 2^53 * 2^qe, so none is rounded): returns 1.
 * Returns 0, *sum as it was, when that cannot be shown. */
int rollup_total_add(const struct rollup_total *t, double *sum);

#endif
