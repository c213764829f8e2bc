/* rollup.c: pooling values into rollup cells, and the coding of a row of
 * cells (rollup.h; the layout in schema/storage.md, "Rollups"). Not the
 * SQL: store.c writes the rows, query_series.c reads them.
 *
 * Why this coding. A row's cells are one block's summary of every value of
 * a frame (144 of a 12x12 head metric); its neighbours in time are
 * separate rows, read alone (a series starts anywhere), so a row is coded
 * on its own. Measured on a real sigmatrain stream the cells' mantissas
 * are noise from block to block (a delta from the previous block's cell
 * saved < 8%, zstd on byte planes of the fields less than bit-packing), so
 * what pays is removing what is not noise: the bits that every cell of the
 * row shares (frame of reference), the low zero bits of the f64 sum (an
 * exact sum of 64 float32 values has ~30 significant bits of its 53), the
 * count (almost always the frame count), and the sum's and the max's
 * closeness to count * min and to min. Each field is then packed at the
 * width of its widest cell: a reader of one cell reads its bits directly,
 * without decoding the row. */
#include "rollup.h"

#include <math.h>
#include <string.h>

/* header: byte offsets */
enum {
    H_FORMAT = 0,
    H_FLAGS = 1,
    H_W = 2,    /* 4 widths: min, max, sum, count */
    H_T = 6,    /* 3 shifts: min, max, sum */
    H_QE = 9,   /* i16: the fixed-point sum's exponent */
    H_REF = 11, /* u32 min, u32 max, u64 sum references */
};
#define FLAG_MAX_ABS 1u   /* max coded alone, not as its distance from min */
#define FLAG_SUM_FIXED 2u /* sum as an integer times 2^qe, not by its float bits */
#define FLAG_EMPTY 4u     /* every cell of count 0 is (NaN, NaN, +0) and is not coded */
#define FLAG_TOTAL 8u     /* the row's total follows the header */
#define FLAG_ALL 15u
/* the total: f32 min, f32 max, i64 k, u8 kbits (kabs < 2^kbits), then
 * u64 count unless it is n * nframes (the count field has width 0) */
#define TOTAL_BYTES(wcnt) (17u + ((wcnt) ? 8u : 0u))

enum { F_MIN, F_MAX, F_SUM, F_CNT, F_COUNT };

static const struct rollup_cell empty_cell = {NAN, NAN, 0.0, 0};

void rollup_reset(struct rollup_cell *a, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) a[i] = empty_cell;
}

void rollup_merge(struct rollup_cell *e, const struct rollup_cell *x) {
    if (!x->count) return;
    if (!e->count || x->mn < e->mn) e->mn = x->mn;
    if (!e->count || x->mx > e->mx) e->mx = x->mx;
    e->sum += x->sum;
    e->count += x->count;
}

void rollup_add(struct rollup_cell *e, float v) {
    if (!isfinite(v)) return;
    struct rollup_cell x = {v, v, v, 1};
    rollup_merge(e, &x);
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float f32_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint64_t f64_bits(double d) {
    uint64_t u;
    memcpy(&u, &d, 8);
    return u;
}

static double f64_of(uint64_t u) {
    double d;
    memcpy(&d, &u, 8);
    return d;
}

/* Float bits as unsigned integers in the floats' order (-inf lowest):
 * nearby floats of one sign are nearby integers. */
static uint32_t ord32(uint32_t u) { return u >> 31 ? ~u : u | 0x80000000u; }
static uint32_t unord32(uint32_t o) { return o >> 31 ? o & 0x7fffffffu : ~o; }
static uint64_t ord64(uint64_t u) { return u >> 63 ? ~u : u | (UINT64_C(1) << 63); }
static uint64_t unord64(uint64_t o) { return o >> 63 ? o & ~(UINT64_C(1) << 63) : ~o; }

static unsigned bit_width(uint64_t v) { return v ? 64u - (unsigned)__builtin_clzll(v) : 0u; }

/* The sum's prediction: count * min, exact in a double (a 24-bit
 * mantissa times a count below 2^32), 0 when there is no finite min. */
static double sum_pred(const struct rollup_cell *x) {
    return x->count && isfinite(x->mn) ? (double)x->count * (double)x->mn : 0.0;
}

/* A finite double's bits as m * 2^e0 (m with its implicit bit). */
static void f64_parts(uint64_t u, uint64_t *m, int *e0) {
    unsigned e = (unsigned)(u >> 52) & 0x7ffu;
    *m = u & ((UINT64_C(1) << 52) - 1);
    if (e) {
        *m |= UINT64_C(1) << 52;
        *e0 = (int)e - 1075;
    } else {
        *e0 = -1074;
    }
}

/* The sum as an integer K with sum = K * 2^qe (the cell is eligible). */
static int64_t fixed_k(uint64_t u, int qe) {
    uint64_t m;
    int e0;
    f64_parts(u, &m, &e0);
    if (!m) return 0;
    int s = e0 - qe;
    int64_t k = (int64_t)(s >= 0 ? m << s : m >> -s);
    return u >> 63 ? -k : k;
}

/* 2^-qe, the scale of the fixed-point prediction, or 0 where it is not a
 * double (then fixed_pred calls ldexp: slower, the same result). */
static double fixed_down(int qe) { return qe >= -1022 ? ldexp(1.0, -qe) : 0.0; }

/* floor(q) for |q| < 2^62, else 0 (libm's floor is a call). */
static inline int64_t fixed_floor(double q) {
    if (!(fabs(q) < 0x1p62)) return 0;
    int64_t k = (int64_t)q; /* toward zero, then down for negatives */
    return (double)k > q ? k - 1 : k;
}

/* The sum's prediction in units of 2^qe, rounded down (0 when out of
 * range). The encoder and the decoder compute it alike (rollup_decode
 * inlines it): all it needs is to be the same on both sides. */
static int64_t fixed_pred(const struct rollup_cell *x, int qe, double down) {
    return fixed_floor(down ? sum_pred(x) * down : ldexp(sum_pred(x), -qe));
}

/* The candidate codings of the fields: min; max as its distance from min
 * or alone; sum by its float bits' distance from count * min's, or as an
 * integer times 2^qe minus the same prediction; the count's distance from
 * the frame count. Each an unsigned integer (signed quantities offset by
 * half their range, so that the integers keep their order). */
enum { C_MIN, C_DMX, C_MAXABS, C_SUMD, C_SUMK, C_CNT, C_COUNT };

/* The coder's state for one row. */
struct plan {
    const struct rollup_cell *a;
    uint32_t n, nframes;
    unsigned flags;
    int fixed; /* C_SUMK is possible (fixed_ok) */
    int qe;
    double down; /* fixed_down(qe) */
    uint64_t ref[C_COUNT];
    unsigned w[C_COUNT], t[C_COUNT];
};

/* Whether cell i's min, max and sum are left out of the coding (an empty
 * cell: its count says it is empty). */
static int skipped(const struct plan *p, uint32_t i) { return (p->flags & FLAG_EMPTY) && !p->a[i].count; }

/* Every candidate of cell i into v. */
static void candidates(const struct plan *p, uint32_t i, uint64_t *v) {
    const struct rollup_cell *x = &p->a[i];
    uint32_t omn = ord32(f32_bits(x->mn)), omx = ord32(f32_bits(x->mx));
    v[C_MIN] = omn;
    v[C_DMX] = (uint32_t)(omx - omn) ^ 0x80000000u;
    v[C_MAXABS] = omx;
    v[C_SUMD] = (ord64(f64_bits(x->sum)) - ord64(f64_bits(sum_pred(x)))) ^ (UINT64_C(1) << 63);
    v[C_SUMK] = p->fixed
                    ? (uint64_t)(fixed_k(f64_bits(x->sum), p->qe) - fixed_pred(x, p->qe, p->down)) ^ (UINT64_C(1) << 63)
                    : 0;
    v[C_CNT] = (uint32_t)(p->nframes - x->count);
}

/* Frame of reference of every candidate: the smallest value (0 for the
 * count), the zero low bits every difference from it shares, and the
 * width of the largest difference. */
static void plan_fields(struct plan *p) {
    uint64_t v[C_COUNT], any[C_COUNT] = {0}, top[C_COUNT] = {0};
    for (int c = 0; c < C_COUNT; c++) p->ref[c] = c == C_CNT ? 0 : UINT64_MAX;
    int seen = 0;
    for (uint32_t i = 0; i < p->n; i++) {
        if (skipped(p, i)) continue;
        candidates(p, i, v);
        for (int c = 0; c < C_CNT; c++)
            if (v[c] < p->ref[c]) p->ref[c] = v[c];
        seen = 1;
    }
    for (int c = 0; c < C_CNT && !seen; c++) p->ref[c] = 0;
    for (uint32_t i = 0; i < p->n; i++) {
        candidates(p, i, v);
        for (int c = skipped(p, i) ? C_CNT : 0; c < C_COUNT; c++) {
            uint64_t d = v[c] - p->ref[c];
            any[c] |= d;
            if (d > top[c]) top[c] = d;
        }
    }
    for (int c = 0; c < C_COUNT; c++) {
        p->t[c] = any[c] && c != C_CNT ? (unsigned)__builtin_ctzll(any[c]) : 0;
        p->w[c] = bit_width(top[c] >> p->t[c]);
    }
}

/* Whether every sum is a finite double other than -0 whose bits fit an
 * integer times 2^qe below 2^62; sets p->qe. */
static int fixed_ok(struct plan *p) {
    int lo = INT32_MAX, hi = INT32_MIN;
    for (uint32_t i = 0; i < p->n; i++) {
        if (skipped(p, i)) continue;
        uint64_t u = f64_bits(p->a[i].sum), m;
        int e0;
        if (((u >> 52) & 0x7ffu) == 0x7ffu || u == UINT64_C(1) << 63) return 0;
        f64_parts(u, &m, &e0);
        if (!m) continue;
        int l = e0 + __builtin_ctzll(m), h = e0 + 63 - __builtin_clzll(m);
        if (l < lo) lo = l;
        if (h > hi) hi = h;
    }
    p->qe = lo == INT32_MAX ? 0 : lo;
    p->down = fixed_down(p->qe);
    return hi == INT32_MIN || hi - p->qe < 62;
}

/* Bits written least significant first, 8 bytes at a time. */
struct bitw {
    unsigned char *out;
    uint64_t acc;
    unsigned n;
};

static void bitw_put(struct bitw *b, uint64_t v, unsigned w) {
    if (!w) return;
    b->acc |= v << b->n;
    if (b->n + w < 64) {
        b->n += w;
        return;
    }
    memcpy(b->out, &b->acc, 8); /* little-endian, as every blob of the store */
    b->out += 8;
    unsigned used = 64 - b->n;
    b->acc = used < 64 ? v >> used : 0;
    b->n = b->n + w - 64;
}

static void bitw_end(struct bitw *b) { memcpy(b->out, &b->acc, (b->n + 7) / 8); }

static size_t encode_raw(const struct rollup_cell *a, uint32_t n, unsigned char *out) {
    for (uint32_t i = 0; i < n; i++) {
        unsigned char *e = out + (size_t)i * ROLLUP_RAW_BYTES;
        memcpy(e, &a[i].mn, 4);
        memcpy(e + 4, &a[i].mx, 4);
        memcpy(e + 8, &a[i].sum, 8);
        memcpy(e + 16, &a[i].count, 4);
    }
    return (size_t)n * ROLLUP_RAW_BYTES;
}

/* The row's total (rollup.h), pooling the cells as bucket_merge in
 * query_series.c does; 0 when its kabs would pass 2^53 (no reader could
 * use it). Every sum is k * 2^qe (fixed_ok). */
static int total_of(const struct plan *p, struct rollup_total *t) {
    *t = (struct rollup_total){.mn = NAN, .mx = NAN, .qe = p->qe};
    for (uint32_t i = 0; i < p->n; i++) {
        const struct rollup_cell *x = &p->a[i];
        if (!x->count) continue;
        if (!t->count || x->mn < t->mn) t->mn = x->mn;
        if (!t->count || x->mx > t->mx) t->mx = x->mx;
        int64_t k = fixed_k(f64_bits(x->sum), p->qe);
        t->kabs += (uint64_t)(k < 0 ? -k : k);
        if (t->kabs > UINT64_C(1) << 53) return 0;
        t->k += k;
        t->count += x->count;
    }
    return 1;
}

/* The row of n cells (rollup_encode), with its total where one can be
 * shown and `totals` allows it. */
static size_t encode(const struct rollup_cell *a, uint32_t n, uint32_t nframes, int totals, unsigned char *out) {
    struct plan p = {.a = a, .n = n, .nframes = nframes};
    int empty = 0, canonical = 1;
    for (uint32_t i = 0; i < n; i++) {
        if (a[i].count) continue;
        empty = 1;
        canonical &=
            f32_bits(a[i].mn) == f32_bits(NAN) && f32_bits(a[i].mx) == f32_bits(NAN) && f64_bits(a[i].sum) == 0;
    }
    if (empty && canonical) p.flags |= FLAG_EMPTY;
    p.fixed = fixed_ok(&p);
    plan_fields(&p);
    /* the narrower candidate of max and of sum */
    int cmax = p.w[C_MAXABS] < p.w[C_DMX] ? C_MAXABS : C_DMX;
    int csum = p.fixed && p.w[C_SUMK] < p.w[C_SUMD] ? C_SUMK : C_SUMD;
    if (cmax == C_MAXABS) p.flags |= FLAG_MAX_ABS;
    if (csum == C_SUMK) p.flags |= FLAG_SUM_FIXED;
    const int chosen[F_COUNT] = {C_MIN, cmax, csum, C_CNT};
    struct rollup_total tot = {0};
    if (totals && n >= ROLLUP_TOTAL_MIN && p.fixed && total_of(&p, &tot)) p.flags |= FLAG_TOTAL;
    size_t head = ROLLUP_HEAD_BYTES + (p.flags & FLAG_TOTAL ? TOTAL_BYTES(p.w[C_CNT]) : 0);
    uint64_t bits = 0;
    for (int f = 0; f < F_COUNT; f++) bits += (uint64_t)n * p.w[chosen[f]];
    uint64_t len = head + (bits + 7) / 8;
    if (len >= (uint64_t)n * ROLLUP_RAW_BYTES) return encode_raw(a, n, out);

    out[H_FORMAT] = ROLLUP_FORMAT_CODED;
    out[H_FLAGS] = (unsigned char)p.flags;
    for (int f = 0; f < F_COUNT; f++) out[H_W + f] = (unsigned char)p.w[chosen[f]];
    for (int f = 0; f < F_CNT; f++) out[H_T + f] = (unsigned char)p.t[chosen[f]];
    int16_t qe = (int16_t)(csum == C_SUMK || (p.flags & FLAG_TOTAL) ? p.qe : 0);
    memcpy(out + H_QE, &qe, 2);
    uint32_t r32 = (uint32_t)p.ref[C_MIN];
    memcpy(out + H_REF, &r32, 4);
    r32 = (uint32_t)p.ref[cmax];
    memcpy(out + H_REF + 4, &r32, 4);
    memcpy(out + H_REF + 8, &p.ref[csum], 8);
    /* field by field: one writer, so the cells' values are computed again
     * for each field (cheaper than a scratch of 6 words a cell) */
    if (p.flags & FLAG_TOTAL) {
        unsigned char *o = out + ROLLUP_HEAD_BYTES;
        memcpy(o, &tot.mn, 4);
        memcpy(o + 4, &tot.mx, 4);
        memcpy(o + 8, &tot.k, 8);
        o[16] = (unsigned char)bit_width(tot.kabs);
        if (p.w[C_CNT]) memcpy(o + 17, &tot.count, 8);
    }
    struct bitw b = {.out = out + head};
    uint64_t v[C_COUNT];
    for (int f = 0; f < F_COUNT; f++) {
        int c = chosen[f];
        if (!p.w[c]) continue;
        for (uint32_t i = 0; i < n; i++) {
            if (f != F_CNT && skipped(&p, i)) {
                bitw_put(&b, 0, p.w[c]);
                continue;
            }
            candidates(&p, i, v);
            bitw_put(&b, (v[c] - p.ref[c]) >> p.t[c], p.w[c]);
        }
    }
    bitw_end(&b);
    return (size_t)len;
}

size_t rollup_encode(const struct rollup_cell *a, uint32_t n, uint32_t nframes, unsigned char *out) {
    return encode(a, n, nframes, 1, out);
}

size_t rollup_encode_chunk(const struct rollup_cell *a, uint32_t n, uint32_t nframes, unsigned char *out) {
    return encode(a, n, nframes, 0, out);
}

size_t rollup_total_encode(const struct rollup_cell *a, uint32_t n, uint32_t nframes, unsigned char *out) {
    struct plan p = {.a = a, .n = n, .nframes = nframes};
    struct rollup_total t;
    if (!fixed_ok(&p) || !total_of(&p, &t)) return 0;
    memcpy(out, &t.mn, 4);
    memcpy(out + 4, &t.mx, 4);
    memcpy(out + 8, &t.k, 8);
    out[16] = (unsigned char)bit_width(t.kabs);
    int16_t qe = (int16_t)p.qe;
    memcpy(out + 17, &qe, 2);
    if (t.count == (uint64_t)n * nframes) return 19;
    memcpy(out + 19, &t.count, 8);
    return ROLLUP_TOTAL_BYTES;
}

static int decode_raw(const unsigned char *row, uint32_t nframes, uint32_t c0, uint32_t c1, struct rollup_cell *out) {
    for (uint32_t i = c0; i < c1; i++) {
        const unsigned char *e = row + (size_t)i * ROLLUP_RAW_BYTES;
        memcpy(&out[i].mn, e, 4);
        memcpy(&out[i].mx, e + 4, 4);
        memcpy(&out[i].sum, e + 8, 8);
        memcpy(&out[i].count, e + 16, 4);
        if (out[i].count > nframes) return -1;
    }
    return 0;
}

/* w (<= 64) bits at bit offset off of the len bytes at d, which hold them. */
static uint64_t bits_get(const unsigned char *d, size_t len, uint64_t off, unsigned w) {
    size_t at = (size_t)(off >> 3);
    unsigned sh = (unsigned)(off & 7);
    uint64_t lo = 0;
    memcpy(&lo, d + at, at + 8 <= len ? 8 : len - at);
    uint64_t v = lo >> sh;
    if (sh + w > 64) v |= (uint64_t)d[at + 8] << (64 - sh);
    return w == 64 ? v : v & ((UINT64_C(1) << w) - 1);
}

#define UNPACK_CELLS 256 /* cells unpacked at a time (4 fields: 8 KiB of stack) */

/* The values of cells [i0, i0 + k) of a field packed at width w from bit
 * base of the len bytes at d, into v: ref + (packed << t). Each value is
 * one unaligned 8-byte load where 8 bytes are there, so that the cells
 * are independent of each other (a running bit buffer made every cell
 * wait for the one before: twice as slow). */
static void unpack(const unsigned char *d, size_t len, uint64_t base, unsigned w, unsigned t, uint64_t ref, uint32_t i0,
                   uint32_t k, uint64_t *v) {
    size_t j = 0;
    uint64_t off = base + (uint64_t)i0 * w;
    if (!w) {
        for (; j < k; j++) v[j] = ref;
        return;
    }
    if (w <= 56 && len >= 8) {
        /* the cells whose value starts before bit end have 8 bytes there */
        uint64_t mask = (UINT64_C(1) << w) - 1, end = 8 * (uint64_t)(len - 7);
        size_t fast = off < end ? (size_t)((end - off + w - 1) / w) : 0;
        if (fast > k) fast = k;
        for (; j < fast; j++, off += w) {
            uint64_t x;
            memcpy(&x, d + (off >> 3), 8); /* little-endian, as every blob of the store */
            v[j] = ref + (((x >> (off & 7)) & mask) << t);
        }
    }
    for (; j < k; j++, off += w) v[j] = ref + (bits_get(d, len, off, w) << t);
}

/* A coded row's header, read and checked. */
struct head {
    unsigned flags, w[F_COUNT], t[F_COUNT];
    uint64_t base[F_COUNT], ref[F_COUNT];
    int qe;
    const unsigned char *d; /* the packed fields */
    size_t dlen;
};

/* Reads the header of a coded row of n values: 0, or -1 when the row is
 * not one. */
static int head_read(const unsigned char *row, size_t len, uint32_t n, struct head *h) {
    if (len < ROLLUP_HEAD_BYTES || row[H_FORMAT] != ROLLUP_FORMAT_CODED || (row[H_FLAGS] & ~FLAG_ALL)) return -1;
    h->flags = row[H_FLAGS];
    uint64_t bits = 0;
    for (int f = 0; f < F_COUNT; f++) {
        h->w[f] = row[H_W + f];
        h->t[f] = f < F_CNT ? row[H_T + f] : 0;
        if (h->t[f] > 63 || h->w[f] + h->t[f] > (f == F_SUM ? 64u : 32u)) return -1;
        h->base[f] = bits;
        bits += (uint64_t)n * h->w[f];
    }
    size_t head = ROLLUP_HEAD_BYTES + (h->flags & FLAG_TOTAL ? TOTAL_BYTES(h->w[F_CNT]) : 0);
    if (len != head + (bits + 7) / 8) return -1;
    int16_t qe;
    uint32_t r32;
    memcpy(&qe, row + H_QE, 2);
    if (qe < -1074 || qe > 1023) return -1;
    h->qe = qe;
    memcpy(&r32, row + H_REF, 4);
    h->ref[F_MIN] = r32;
    memcpy(&r32, row + H_REF + 4, 4);
    h->ref[F_MAX] = r32;
    memcpy(&h->ref[F_SUM], row + H_REF + 8, 8);
    h->ref[F_CNT] = 0;
    h->d = row + head;
    h->dlen = len - head;
    return 0;
}

/* Reads a total whose first 17 bytes are at o (f32 min, f32 max, i64 k,
 * u8 kbits), of exponent qe, its count at o + at when has_count (else
 * n * nframes): 1, or -1 when it cannot be one of n values of nframes
 * frames. */
static int total_read(const unsigned char *o, int qe, int has_count, size_t at, uint32_t n, uint32_t nframes,
                      struct rollup_total *t) {
    memcpy(&t->mn, o, 4);
    memcpy(&t->mx, o + 4, 4);
    memcpy(&t->k, o + 8, 8);
    if (o[16] > 54 || qe < -1074 || qe > 1023) return -1;
    t->kabs = (UINT64_C(1) << o[16]) - 1; /* a bound of the sum of |sum| / 2^qe */
    if (has_count) memcpy(&t->count, o + at, 8);
    else t->count = (uint64_t)n * nframes;
    t->qe = qe;
    uint64_t kmag = t->k < 0 ? -(uint64_t)t->k : (uint64_t)t->k;
    return t->count <= (uint64_t)n * nframes && t->kabs <= UINT64_C(1) << 53 && kmag <= t->kabs ? 1 : -1;
}

int rollup_total(const unsigned char *row, size_t len, uint32_t n, uint32_t nframes, struct rollup_total *t) {
    struct head h;
    if (len == (size_t)n * ROLLUP_RAW_BYTES) return 0;
    if (head_read(row, len, n, &h)) return -1;
    if (!(h.flags & FLAG_TOTAL)) return 0;
    return total_read(row + ROLLUP_HEAD_BYTES, h.qe, h.w[F_CNT] != 0, 17, n, nframes, t);
}

int rollup_total_decode(const unsigned char *d, size_t len, uint32_t n, uint32_t nframes, struct rollup_total *t) {
    if (!len) return 0;
    if (len != 19 && len != ROLLUP_TOTAL_BYTES) return -1;
    int16_t qe;
    memcpy(&qe, d + 17, 2);
    return total_read(d, qe, len == ROLLUP_TOTAL_BYTES, 19, n, nframes, t);
}

int rollup_total_add(const struct rollup_total *t, double *sum) {
    uint64_t u = f64_bits(*sum), m;
    int e0;
    int64_t b = 0;
    if (((u >> 52) & 0x7ffu) == 0x7ffu || t->qe + 53 > 1023) return 0;
    f64_parts(u, &m, &e0);
    if (m) {
        /* *sum must be a multiple of 2^qe, and small enough */
        if (e0 + __builtin_ctzll(m) < t->qe || e0 + 63 - __builtin_clzll(m) - t->qe > 53) return 0;
        b = fixed_k(u, t->qe);
    }
    if ((uint64_t)(b < 0 ? -b : b) + t->kabs > UINT64_C(1) << 53) return 0;
    *sum += (double)t->k * ldexp(1.0, t->qe);
    return 1;
}

int rollup_decode(const unsigned char *row, size_t len, uint32_t n, uint32_t nframes, uint32_t c0, uint32_t c1,
                  struct rollup_cell *out) {
    if (c0 > c1 || c1 > n) return -1;
    if (len == (size_t)n * ROLLUP_RAW_BYTES) return decode_raw(row, nframes, c0, c1, out);
    struct head h;
    if (head_read(row, len, n, &h)) return -1;
    unsigned flags = h.flags;
    int qe = h.qe;
    double down = fixed_down(qe), up = ldexp(1.0, qe);
    uint64_t v[F_COUNT][UNPACK_CELLS];
    int counts = h.w[F_CNT] != 0, fixed = (flags & FLAG_SUM_FIXED) != 0, abs_max = (flags & FLAG_MAX_ABS) != 0;
    for (uint32_t i0 = c0; i0 < c1; i0 += UNPACK_CELLS) {
        uint32_t k = c1 - i0 < UNPACK_CELLS ? c1 - i0 : UNPACK_CELLS;
        for (int f = 0; f < F_COUNT; f++)
            if (f != F_CNT || counts) unpack(h.d, h.dlen, h.base[f], h.w[f], h.t[f], h.ref[f], i0, k, v[f]);
        for (uint32_t j = 0; counts && j < k; j++)
            if (v[F_CNT][j] > nframes) return -1; /* a count below 0 */
        /* the common case (every count the frame count, max from min, the
         * sum by its float bits) costs ~40 instructions a value */
        for (uint32_t j = 0; j < k; j++) {
            struct rollup_cell *x = &out[i0 + j];
            uint32_t count = counts ? nframes - (uint32_t)v[F_CNT][j] : nframes;
            uint32_t omn = (uint32_t)v[F_MIN][j], mx = (uint32_t)v[F_MAX][j], mnb = unord32(omn);
            uint64_t s = v[F_SUM][j] ^ (UINT64_C(1) << 63);
            x->count = count;
            x->mn = f32_of(mnb);
            x->mx = f32_of(unord32(abs_max ? mx : omn + (mx ^ 0x80000000u)));
            /* sum_pred, from the bits at hand */
            double p = count && (mnb & 0x7f800000u) != 0x7f800000u ? (double)count * (double)x->mn : 0.0;
            if (!fixed) {
                x->sum = f64_of(unord64(s + ord64(f64_bits(p))));
            } else {
                /* K * 2^qe is exact: K has at most 53 significant bits,
                 * and the product is the sum that was coded */
                double q = down ? p * down : ldexp(p, -qe);
                x->sum = (double)((int64_t)s + fixed_floor(q)) * up;
            }
            if (!count && (flags & FLAG_EMPTY)) *x = empty_cell;
        }
    }
    return 0;
}
