/* query_series.c: downsampled history (query_series in query.h), exact
 * per bucket from the rollups and raw frames (schema/storage.md, "Query
 * recipe"), and the same buckets as a grid of minima for other answers
 * (query_series_grid, query_db.h: the collapse timeline). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "integrity.h"
#include "query_db.h"
#include "rollup.h"
#include "store.h"

/* One bucket's pool of values (of one series). */
struct bucket {
    float mn, mx;
    double sum;
    uint64_t count, nonfinite;
};

/* One series of the answer: where its cells are, and how many it pools. */
struct group {
    int64_t layer, head; /* -1: not a single layer / head */
    uint32_t ncells;
};

/* A series query being answered. Each selected cell of a frame (a value
 * index, cells[c]) feeds one group (group[c]); the buckets form a table of
 * nb rows (time) by ngroups columns, so one pass over a frame or a rollup
 * row fills every series, and a split answer reads what one series does. */
struct series {
    struct query *q;
    int64_t metric_id;
    uint32_t n;      /* values per frame */
    uint32_t *cells; /* selected value indices */
    uint32_t *group; /* the group of each selected cell */
    uint32_t ncells;
    struct group *groups;
    uint32_t ngroups;
    int64_t a, w; /* bucket i covers [a + i*w, a + (i+1)*w), clipped to the range */
    int64_t last; /* the metric's last stored step */
    int64_t nb;
    struct bucket *b;         /* b[i * ngroups + g]: bucket i of group g */
    uint64_t *frames;         /* frames in bucket i (the same for every group) */
    int64_t resolution;       /* 1, or 64 when steps before raw_from (rollups only) are in the range */
    int64_t raw_from;         /* the first step with raw frames, -1 for none */
    struct rollup_cell *roll; /* a rollup row's selected cells, decoded (n, allocated on first use) */
    int kind;                 /* the metric's kind (0 scalar, 1 layer, 2 head) and shape */
    int64_t L, H;
    int64_t from, to; /* the range asked for (the metric's first / last step where left out) */
    int64_t lo, hi;   /* the part of it the metric holds */
};

static void series_free(struct series *sr) {
    free(sr->cells);
    free(sr->group);
    free(sr->groups);
    free(sr->b);
    free(sr->frames);
    free(sr->roll);
}

static void bucket_merge(struct bucket *b, float mn, float mx, double sum, uint64_t c) {
    if (!c) return;
    if (!b->count || mn < b->mn) b->mn = mn;
    if (!b->count || mx > b->mx) b->mx = mx;
    b->sum += sum;
    b->count += c;
}

/* One frame into its bucket (a query_walk callback). */
static int add_frame(void *ctx, int64_t step, const float *v, uint32_t n) {
    struct series *sr = ctx;
    (void)n;
    int64_t i = (step - sr->a) / sr->w;
    struct bucket *row = &sr->b[i * sr->ngroups];
    sr->frames[i]++;
    for (uint32_t c = 0; c < sr->ncells; c++) {
        struct bucket *b = &row[sr->group[c]];
        float x = v[sr->cells[c]];
        if (isfinite(x)) bucket_merge(b, x, x, x, 1);
        else b->nonfinite++;
    }
    return 0;
}

/* The frames of [lo, hi], raw or in blocks (only the selected cells are
 * decoded: they are [cells[0], cells[ncells-1]] in layer-major order). */
static int add_raw(struct series *sr, int64_t lo, int64_t hi) {
    int failed;
    query_walk(sr->q, sr->metric_id, sr->n, sr->cells[0], sr->cells[sr->ncells - 1] + 1, lo, hi, add_frame, sr,
               &failed);
    return failed ? -1 : 0;
}

/* Adds a row's total (rollup.h) into bucket b as bucket_merge of each of
 * its n cells would: 1, or 0 when that cannot be shown (then the caller
 * decodes the cells). */
static int add_total(struct bucket *b, const struct rollup_total *t, uint32_t n, int64_t nframes) {
    if (t->count && !rollup_total_add(t, &b->sum)) return 0;
    if (t->count) {
        if (!b->count || t->mn < b->mn) b->mn = t->mn;
        if (!b->count || t->mx > b->mx) b->mx = t->mx;
        b->count += t->count;
    }
    b->nonfinite += (uint64_t)n * (uint64_t)nframes - t->count;
    return 1;
}

/* The selected cells a rollup row of cells [r0, r0 + rn) holds: the
 * indices [*k0, *k1) of sr->cells (which ascend). */
static void chunk_cells(const struct series *sr, uint32_t r0, uint32_t rn, uint32_t *k0, uint32_t *k1) {
    uint32_t k = 0;
    while (k < sr->ncells && sr->cells[k] < r0) k++;
    *k0 = k;
    while (k < sr->ncells && sr->cells[k] < r0 + rn) k++;
    *k1 = k;
}

/* Pools cells sr->cells[k0..k1) of sr->roll, decoded, into bucket row
 * `row` (of a block of nframes frames). */
static void pool_cells(struct series *sr, struct bucket *row, uint32_t k0, uint32_t k1, int64_t nframes) {
    for (uint32_t c = k0; c < k1; c++) {
        struct bucket *b = &row[sr->group[c]];
        const struct rollup_cell *e = &sr->roll[sr->cells[c]];
        bucket_merge(b, e->mn, e->mx, e->sum, e->count);
        b->nonfinite += (uint64_t)nframes - e->count;
    }
}

/* A row of Q_ROLLUPS or Q_TOTALS (block, nframes, data, crc), and the
 * bucket i its block of `size` steps falls in. */
struct rrow {
    int64_t block, nframes, i;
    const unsigned char *d;
    int len;
    int crc_ok; /* its checksum matches, or it has none (written before migration 11) */
};

/* Reads row s of level `level` (chunk: -1 for a total) and checks its
 * checksum (integrity.h) before anything of it is used. */
static void rrow_read(const struct series *sr, sqlite3_stmt *s, int level, int64_t chunk, struct rrow *r) {
    r->block = sqlite3_column_int64(s, 0);
    r->nframes = sqlite3_column_int64(s, 1);
    r->d = sqlite3_column_blob(s, 2);
    r->len = sqlite3_column_bytes(s, 2);
    r->i = (r->block * ROLLUP_LEVEL_SIZE(level) - sr->a) / sr->w;
    r->crc_ok =
        sqlite3_column_type(s, 3) == SQLITE_NULL ||
        sqlite3_column_int64(s, 3) == integrity_stored(integrity_rollup_crc(sr->metric_id, level, chunk, r->block,
                                                                            r->nframes, r->d, (size_t)r->len));
}

/* Notes a damaged rollup row (chunk -1: a total's) for query_db_fail,
 * naming its steps; returns -1. */
static int rollup_corrupt(struct series *sr, int level, const struct rrow *r, int64_t chunk) {
    int64_t size = ROLLUP_LEVEL_SIZE(level);
    char part[32] = " total";
    if (chunk >= 0) snprintf(part, sizeof part, ", chunk %lld", (long long)chunk);
    if (!r->crc_ok)
        return query_db_corrupt(sr->q, "steps %lld..%lld: the level-%d rollup%s (block %lld) fails its checksum",
                                (long long)(r->block * size), (long long)((r->block + 1) * size - 1), level, part,
                                (long long)r->block);
    return query_db_corrupt(sr->q,
                            "steps %lld..%lld: the level-%d rollup%s (block %lld, %lld frames, %d bytes) does "
                            "not decode as %u values",
                            (long long)(r->block * size), (long long)((r->block + 1) * size - 1), level, part,
                            (long long)r->block, (long long)r->nframes, r->len, sr->n);
}

/* Level `level`'s rows of chunk `chunk` (cells [chunk * ROLLUP_CHUNK_CELLS,
 * ...) of the frame, rollup.h) of blocks [b0, b1] into their buckets,
 * counting the frames when `frames` (once per block: every chunk has the
 * block's). Only the selected cells are decoded, and none for a series of
 * every value of a metric of one chunk whose row has its total.
 *
 * A block without frames has no row (schema/storage.md, "When a block
 * exists"), so a range without rows is no data: with sparse steps (one
 * every 1,000) most blocks of levels 1 and 2 are such, and a range of one
 * of them is common (the tail past a level's last complete block). Only
 * `must` (add_totals, for the block whose total's row it read) says the
 * block's row has to be there. */
static int add_chunk(struct series *sr, int level, uint32_t chunk, int64_t b0, int64_t b1, int frames, int must) {
    sqlite3_stmt *s = sr->q->stmt[Q_ROLLUPS];
    int64_t size = ROLLUP_LEVEL_SIZE(level);
    uint32_t r0 = chunk * ROLLUP_CHUNK_CELLS, rn = ROLLUP_CHUNK_LEN(sr->n, chunk);
    uint32_t k0, k1;
    chunk_cells(sr, r0, rn, &k0, &k1);
    if (k0 == k1) return 0; /* none of its cells selected (never the first chunk read) */
    /* the row's cells that are selected, local to the row */
    uint32_t lc0 = sr->cells[k0] - r0, lc1 = sr->cells[k1 - 1] + 1 - r0;
    int whole = sr->ngroups == 1 && sr->ncells == sr->n && rn == sr->n, rc, seen = 0;
    sqlite3_bind_int64(s, 1, sr->metric_id);
    sqlite3_bind_int(s, 2, level);
    sqlite3_bind_int64(s, 3, b0);
    sqlite3_bind_int64(s, 4, b1);
    sqlite3_bind_int(s, 5, (int)chunk);
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        struct rrow r;
        rrow_read(sr, s, level, chunk, &r);
        struct bucket *row = &sr->b[r.i * sr->ngroups];
        struct rollup_total t;
        int has = !r.crc_ok || r.nframes < 0 || r.nframes > size ? -1
                  : whole ? rollup_total(r.d, (size_t)r.len, sr->n, (uint32_t)r.nframes, &t)
                          : 0;
        seen = 1;
        if (frames) sr->frames[r.i] += (uint64_t)r.nframes;
        if (has == 1 && add_total(row, &t, sr->n, r.nframes)) continue;
        if (has < 0 || rollup_decode(r.d, (size_t)r.len, rn, (uint32_t)r.nframes, lc0, lc1, sr->roll + r0)) {
            rc = rollup_corrupt(sr, level, &r, chunk);
            break;
        }
        pool_cells(sr, row, k0, k1, r.nframes);
    }
    sqlite3_reset(s);
    if (rc == SQLITE_DONE && must && !seen)
        rc = query_db_corrupt(sr->q,
                              "steps %lld..%lld: the level-%d rollup of block %lld has a total's row but no row "
                              "of chunk %u",
                              (long long)(b0 * size), (long long)((b0 + 1) * size - 1), level, (long long)b0, chunk);
    return rc == SQLITE_DONE ? 0 : -1;
}

/* Level `level`'s blocks [b0, b1] into the one series of every value of a
 * metric of several chunks: its total's row per block (rollup_totals), and
 * the cells of the block's chunk rows where the row has no total that can
 * be added exactly (the dashboard's default series of a metric: a
 * whole-run one reads ~2,000 rows of 19 bytes, not the 144 values of each). */
static int add_totals(struct series *sr, int level, int64_t b0, int64_t b1) {
    sqlite3_stmt *s = sr->q->stmt[Q_TOTALS];
    int64_t size = ROLLUP_LEVEL_SIZE(level);
    int rc;
    sqlite3_bind_int64(s, 1, sr->metric_id);
    sqlite3_bind_int(s, 2, level);
    sqlite3_bind_int64(s, 3, b0);
    sqlite3_bind_int64(s, 4, b1);
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        struct rrow r;
        rrow_read(sr, s, level, -1, &r);
        struct rollup_total t;
        int has = !r.crc_ok || r.nframes < 0 || r.nframes > size
                      ? -1
                      : rollup_total_decode(r.d, (size_t)r.len, sr->n, (uint32_t)r.nframes, &t);
        if (has < 0) {
            rc = rollup_corrupt(sr, level, &r, -1);
            break;
        }
        if (has == 1 && add_total(&sr->b[r.i * sr->ngroups], &t, sr->n, r.nframes)) {
            sr->frames[r.i] += (uint64_t)r.nframes;
            continue;
        }
        int bad = 0;
        for (uint32_t c = 0; c < ROLLUP_CHUNKS(sr->n) && !bad; c++)
            bad = add_chunk(sr, level, c, r.block, r.block, c == 0, 1);
        if (bad) {
            rc = SQLITE_ERROR;
            break;
        }
    }
    sqlite3_reset(s);
    return rc == SQLITE_DONE ? 0 : -1;
}

/* Level `level`'s rows of blocks [b0, b1] into their buckets: the totals
 * for a series of every value of a metric of several chunks, else the
 * rows of the chunks that hold the selected cells, one chunk after the
 * other (a series of one head of a 32x32 metric reads rows of 64 cells,
 * not of 1,024). */
static int add_rollups(struct series *sr, int level, int64_t b0, int64_t b1) {
    uint32_t chunks = ROLLUP_CHUNKS(sr->n);
    if (!sr->roll && !(sr->roll = malloc(sr->n * sizeof *sr->roll))) return -1;
    if (sr->ngroups == 1 && sr->ncells == sr->n && chunks > 1) return add_totals(sr, level, b0, b1);
    uint32_t first = sr->cells[0] / ROLLUP_CHUNK_CELLS, last = sr->cells[sr->ncells - 1] / ROLLUP_CHUNK_CELLS;
    for (uint32_t c = first; c <= last; c++)
        if (add_chunk(sr, level, c, b0, b1, c == first, 0)) return -1;
    return 0;
}

/* Adds the steps [lo, hi] using level k's complete blocks where they fit,
 * lower levels for the unaligned edges and the tail the level does not
 * cover yet, and raw frames at the bottom. Every block used lies inside one
 * bucket because bucket edges are multiples of the top level's size. */
static int cover(struct series *sr, int64_t lo, int64_t hi, int k) {
    if (lo > hi) return 0;
    if (k == 0) return add_raw(sr, lo, hi);
    int64_t size = ROLLUP_LEVEL_SIZE(k);
    int64_t complete = sr->last / size * size; /* level k has every block below this */
    int64_t top = hi < complete - 1 ? hi : complete - 1;
    int64_t b0 = (lo + size - 1) / size, b1 = (top + 1) / size - 1;
    if (top < lo || b0 > b1) return cover(sr, lo, hi, k - 1);
    if (cover(sr, lo, b0 * size - 1, k - 1)) return -1;
    if (add_rollups(sr, k, b0, b1)) return -1;
    return cover(sr, (b1 + 1) * size, hi, k - 1);
}

/* QUERY_BAD (with a message) when the request's layer, head and split do
 * not fit a metric of this kind with L x H cells. */
static int series_check(const struct query_series_req *req, int kind, int64_t L, int64_t H, char *err, size_t errlen) {
    const char *m = req->metric;
    if (req->agg < QUERY_AGG_MEAN || req->agg > QUERY_AGG_MAX || req->split < QUERY_SPLIT_NONE ||
        req->split > QUERY_SPLIT_LAYER)
        snprintf(err, errlen, "bad agg or split");
    else if (kind == 0 && (req->layer >= 0 || req->head >= 0))
        snprintf(err, errlen, "%s is a scalar: it has no layer or head", m);
    else if (kind == 1 && req->head >= 0) snprintf(err, errlen, "%s is a layer metric: it has no head", m);
    else if (req->layer >= L || req->head >= H)
        snprintf(err, errlen, "%s has %lld layers x %lld heads; layer or head out of range", m, (long long)L,
                 (long long)H);
    else if (req->split == QUERY_SPLIT_HEAD && kind != 2)
        snprintf(err, errlen, "split=head needs a head metric; %s is a %s metric", m, query_kind_name(kind));
    else if (req->split == QUERY_SPLIT_HEAD && req->head >= 0)
        snprintf(err, errlen, "split=head gives one series per head: leave out head");
    else if (req->split == QUERY_SPLIT_LAYER && kind == 0)
        snprintf(err, errlen, "split=layer needs a head or layer metric; %s is a scalar", m);
    else if (req->split == QUERY_SPLIT_LAYER && (req->layer >= 0 || req->head >= 0))
        snprintf(err, errlen, "split=layer gives one series per layer: leave out layer and head");
    else return QUERY_OK;
    return QUERY_BAD;
}

/* Selects the request's cells (every layer / head where left out) of a
 * frame of L x H values and assigns each to its series (enum query_split). */
static int series_select(struct series *sr, const struct query_series_req *req, int64_t L, int64_t H, char *err,
                         size_t errlen) {
    int64_t l0 = req->layer >= 0 ? req->layer : 0, l1 = req->layer >= 0 ? req->layer + 1 : L;
    int64_t h0 = req->head >= 0 ? req->head : 0, h1 = req->head >= 0 ? req->head + 1 : H;
    sr->n = (uint32_t)(L * H);
    sr->ncells = (uint32_t)((l1 - l0) * (h1 - h0));
    sr->ngroups = req->split == QUERY_SPLIT_HEAD    ? sr->ncells
                  : req->split == QUERY_SPLIT_LAYER ? (uint32_t)(l1 - l0)
                                                    : 1;
    sr->cells = malloc(sr->ncells * sizeof *sr->cells);
    sr->group = malloc(sr->ncells * sizeof *sr->group);
    sr->groups = calloc(sr->ngroups, sizeof *sr->groups);
    if (!sr->cells || !sr->group || !sr->groups) {
        snprintf(err, errlen, "out of memory");
        return QUERY_ERR;
    }
    uint32_t c = 0;
    for (int64_t l = l0; l < l1; l++)
        for (int64_t h = h0; h < h1; h++, c++) {
            uint32_t g = req->split == QUERY_SPLIT_HEAD ? c : req->split == QUERY_SPLIT_LAYER ? (uint32_t)(l - l0) : 0;
            struct group *gr = &sr->groups[g];
            sr->cells[c] = (uint32_t)(l * H + h);
            sr->group[c] = g;
            if (!gr->ncells++) {
                gr->layer = req->split ? l : req->layer;
                gr->head = req->split == QUERY_SPLIT_HEAD ? h : req->split ? -1 : req->head;
            }
        }
    return QUERY_OK;
}

/* Chooses the buckets over [lo, hi] (sr->a, w, nb) for at most `points` of
 * them, their edges aligned to rollup level min_k or above; returns the
 * level they align to. */
static int series_plan(struct series *sr, int64_t lo, int64_t hi, int64_t points, int min_k) {
    /* the largest level no wider than a bucket needs to be */
    uint64_t span = (uint64_t)(hi - lo) + 1;
    uint64_t w0 = (span + (uint64_t)points - 1) / (uint64_t)points;
    int k = 0;
    while (k < ROLLUP_LEVELS && (uint64_t)ROLLUP_LEVEL_SIZE(k + 1) <= w0) k++;
    /* A bucket at least half a level-(k+1) block wide takes that block
     * whole: at most half the resolution (never fewer than points/2
     * buckets), and it reads one row a bucket instead of up to 8 of level
     * k (or up to 64 raw frames), so no window reads more than ~4 rows a
     * point. */
    if (k < ROLLUP_LEVELS && 2 * w0 >= (uint64_t)ROLLUP_LEVEL_SIZE(k + 1)) k++;
    if (k < min_k) k = min_k;
    int64_t size = k ? ROLLUP_LEVEL_SIZE(k) : 1;
    sr->a = lo / size * size;
    uint64_t reach = (uint64_t)(hi - sr->a) + 1;
    uint64_t w = (reach + (uint64_t)points - 1) / (uint64_t)points;
    w = (w + (uint64_t)size - 1) / (uint64_t)size * (uint64_t)size;
    sr->w = (int64_t)w;
    sr->nb = (int64_t)((reach + w - 1) / w);
    return k;
}

enum stat { STAT_MIN, STAT_MAX, STAT_MEAN, STAT_COUNT, STAT_NONFINITE };

/* Appends "name":[...], statistic `what` of group g in each listed bucket
 * (one holding a frame). */
static void emit_stat(struct strbuf *out, const char *name, const struct series *sr, uint32_t g, int what) {
    strbuf_printf(out, "\"%s\":[", name);
    int first = 1;
    for (int64_t i = 0; i < sr->nb; i++) {
        if (!sr->frames[i]) continue;
        const struct bucket *b = &sr->b[i * sr->ngroups + g];
        if (!first) strbuf_add(out, ",", 1);
        first = 0;
        if (what == STAT_COUNT) strbuf_i64(out, (int64_t)b->count);
        else if (what == STAT_NONFINITE) strbuf_i64(out, (int64_t)b->nonfinite);
        else if (!b->count) strbuf_add(out, "null", 4);
        else if (what == STAT_MIN) strbuf_f32(out, b->mn);
        else if (what == STAT_MAX) strbuf_f32(out, b->mx);
        else strbuf_f64(out, b->sum / (double)b->count);
    }
    strbuf_add(out, "]", 1);
}

/* Appends ,"min":[..],"max":..,"mean":..,"count":..,"nonfinite":.. of group
 * g, and ,"value":[..] (the agg statistic) when it pools several cells. */
static void emit_group(struct strbuf *out, const struct series *sr, uint32_t g, int agg) {
    static const char *const names[] = {
        [STAT_MIN] = "min", [STAT_MAX] = "max", [STAT_MEAN] = "mean", [STAT_COUNT] = "count", [STAT_NONFINITE] = "nonfinite"};
    static const int agg_stat[] = {
        [QUERY_AGG_MEAN] = STAT_MEAN, [QUERY_AGG_MIN] = STAT_MIN, [QUERY_AGG_MAX] = STAT_MAX};
    for (int what = STAT_MIN; what <= STAT_NONFINITE; what++) {
        strbuf_add(out, ",", 1);
        emit_stat(out, names[what], sr, g, what);
    }
    if (sr->groups[g].ncells > 1) {
        strbuf_add(out, ",", 1);
        emit_stat(out, "value", sr, g, agg_stat[agg]);
    }
}

/* Appends "name":[...], the first (last = 0) or last step of each listed
 * bucket, clipped to [lo, hi]. */
static void emit_edges(struct strbuf *out, const char *name, const struct series *sr, int last, int64_t lo,
                       int64_t hi) {
    strbuf_printf(out, "\"%s\":[", name);
    int first = 1;
    for (int64_t i = 0; i < sr->nb; i++) {
        if (!sr->frames[i]) continue;
        int64_t st = last ? sr->a + (i + 1) * sr->w - 1 : sr->a + i * sr->w;
        if (st < lo) st = lo;
        if (st > hi) st = hi;
        if (!first) strbuf_add(out, ",", 1);
        strbuf_i64(out, st);
        first = 0;
    }
    strbuf_add(out, "]", 1);
}

/* The answer (query.h): the shared fields, then the one series' arrays, or
 * with a split the list of series. */
static void series_emit(struct strbuf *out, const struct series *sr, const struct query_series_req *req, int kind,
                        int64_t from, int64_t to, int64_t lo, int64_t hi) {
    static const char *const aggs[] = {"mean", "min", "max"};
    static const char *const splits[] = {"none", "head", "layer"};
    int pooled = 0;
    for (uint32_t g = 0; g < sr->ngroups; g++) pooled |= sr->groups[g].ncells > 1;
    strbuf_printf(out, "{\"run\":%lld,\"metric\":", (long long)req->run_id);
    strbuf_json_str(out, req->metric);
    strbuf_printf(out, ",\"kind\":\"%s\"", query_kind_name(kind));
    if (req->layer >= 0) strbuf_printf(out, ",\"layer\":%lld", (long long)req->layer);
    else strbuf_puts(out, ",\"layer\":null");
    if (req->head >= 0) strbuf_printf(out, ",\"head\":%lld", (long long)req->head);
    else strbuf_puts(out, ",\"head\":null");
    if (req->split) strbuf_printf(out, ",\"split\":\"%s\"", splits[req->split]);
    if (pooled) strbuf_printf(out, ",\"agg\":\"%s\"", aggs[req->agg]);
    else strbuf_puts(out, ",\"agg\":null");
    strbuf_printf(out, ",\"from\":%lld,\"to\":%lld,\"width\":%lld,\"resolution\":%lld,\"raw_from\":", (long long)from,
                  (long long)to, (long long)sr->w, (long long)sr->resolution);
    if (sr->raw_from >= 0) strbuf_i64(out, sr->raw_from);
    else strbuf_puts(out, "null");
    strbuf_add(out, ",", 1);
    emit_edges(out, "step", sr, 0, lo, hi);
    strbuf_add(out, ",", 1);
    emit_edges(out, "end", sr, 1, lo, hi);
    if (!req->split) {
        emit_group(out, sr, 0, req->agg);
    } else {
        strbuf_puts(out, ",\"series\":[");
        for (uint32_t g = 0; g < sr->ngroups; g++) {
            const struct group *gr = &sr->groups[g];
            strbuf_printf(out, "%s{\"layer\":%lld,\"head\":", g ? "," : "", (long long)gr->layer);
            if (gr->head >= 0) strbuf_i64(out, gr->head);
            else strbuf_puts(out, "null");
            emit_group(out, sr, g, req->agg);
            strbuf_add(out, "}", 1);
        }
        strbuf_add(out, "]", 1);
    }
    strbuf_add(out, "}", 1);
}

/* Computes the buckets of req into sr (the shared part of query_series
 * and query_series_grid), in the caller's read transaction. */
static int series_run(struct query *q, const struct query_series_req *req, struct series *sr, char *err,
                      size_t errlen) {
    struct query_runinfo ri;
    int ret;
    int64_t first = 0;
    if ((ret = query_run_get(q, req->run_id, &ri, err, errlen)) ||
        (ret = query_metric_get(q, req->run_id, req->metric, &sr->metric_id, &sr->kind, err, errlen)))
        return ret;
    int kind = sr->kind;
    int64_t L = kind == 0 ? 1 : ri.layers, H = kind == 2 ? ri.heads : 1;
    sr->L = L;
    sr->H = H;
    if ((ret = series_check(req, kind, L, H, err, errlen)) || (ret = series_select(sr, req, L, H, err, errlen)))
        return ret;

    int have = query_step_range(q, sr->metric_id, &first, &sr->last), empty = have != 1;
    if (have < 0) return query_db_fail(q, err, errlen, "reading the step range");
    /* steps before the raw horizon (--retain-raw) have rollups only:
     * there the buckets are whole level-1 blocks */
    int64_t raw_from = first, rolled = 0;
    int cut = empty ? 0 : query_raw_horizon(q, sr->metric_id, first, &rolled);
    if (cut < 0) return query_db_fail(q, err, errlen, "reading the rollups");
    if (cut) first = rolled;
    int64_t from = req->has_from ? req->from : first, to = req->has_to ? req->to : sr->last;
    int64_t lo = from > first ? from : first, hi = to < sr->last ? to : sr->last;
    int coarse = cut && lo < raw_from;
    if (coarse) lo = lo / ROLLUP_LEVEL_SIZE(1) * ROLLUP_LEVEL_SIZE(1);
    sr->from = from;
    sr->to = to;
    sr->lo = lo;
    sr->hi = hi;
    sr->w = 1;
    int k = !empty && lo <= hi ? series_plan(sr, lo, hi, req->points, coarse) : 0;
    sr->resolution = coarse ? ROLLUP_LEVEL_SIZE(1) : 1;
    sr->raw_from = empty ? -1 : raw_from;
    /* the bound holds for an empty range too: each series is still listed */
    if ((uint64_t)(sr->nb ? sr->nb : 1) * sr->ngroups > QUERY_MAX_SERIES_BUCKETS) {
        snprintf(err, errlen, "%u series x %lld buckets is more than %d: ask for fewer points%s", sr->ngroups,
                 (long long)(sr->nb ? sr->nb : 1), QUERY_MAX_SERIES_BUCKETS,
                 req->split == QUERY_SPLIT_HEAD && req->layer < 0 ? " or one layer" : "");
        return QUERY_BAD;
    }
    if (sr->nb > 0) {
        sr->b = calloc((size_t)sr->nb * sr->ngroups, sizeof *sr->b);
        sr->frames = calloc((size_t)sr->nb, sizeof *sr->frames);
        if (!sr->b || !sr->frames) {
            snprintf(err, errlen, "out of memory");
            return QUERY_ERR;
        }
        if (cover(sr, lo, hi, k)) {
            char what[160];
            query_db_what(what, sizeof what, "reading the series", req->run_id, req->metric);
            return query_db_fail(q, err, errlen, what);
        }
    }
    return QUERY_OK;
}

int query_series(struct query *q, const struct query_series_req *req, struct strbuf *out,
                 struct query_series_range *range, char *err, size_t errlen) {
    struct series sr = {.q = q};
    if (query_db_begin(q, err, errlen)) return QUERY_ERR;
    int ret = series_run(q, req, &sr, err, errlen);
    if (ret == QUERY_OK) series_emit(out, &sr, req, sr.kind, sr.from, sr.to, sr.lo, sr.hi);
    if (ret == QUERY_OK && range) *range = (struct query_series_range){sr.from, sr.to};
    series_free(&sr);
    query_db_end(q);
    return ret;
}

int query_series_grid(struct query *q, const struct query_series_req *req, struct query_grid *g, char *err,
                      size_t errlen) {
    struct series sr = {.q = q};
    memset(g, 0, sizeof *g);
    int ret = series_run(q, req, &sr, err, errlen);
    if (ret) goto out;
    int64_t nb = 0;
    for (int64_t i = 0; i < sr.nb; i++) nb += sr.frames[i] != 0;
    *g = (struct query_grid){.kind = sr.kind,
                             .L = sr.L,
                             .H = sr.H,
                             .from = sr.from,
                             .to = sr.to,
                             .width = sr.w,
                             .resolution = sr.resolution,
                             .raw_from = sr.raw_from,
                             .nb = nb,
                             .ngroups = sr.ngroups};
    g->step = malloc((size_t)(nb ? nb : 1) * sizeof *g->step);
    g->end = malloc((size_t)(nb ? nb : 1) * sizeof *g->end);
    g->layer = malloc(sr.ngroups * sizeof *g->layer);
    g->head = malloc(sr.ngroups * sizeof *g->head);
    g->min = malloc((size_t)(nb ? nb : 1) * sr.ngroups * sizeof *g->min);
    if (!g->step || !g->end || !g->layer || !g->head || !g->min) {
        snprintf(err, errlen, "out of memory");
        ret = QUERY_ERR;
        goto out;
    }
    for (uint32_t k = 0; k < sr.ngroups; k++) {
        g->layer[k] = sr.groups[k].layer;
        g->head[k] = sr.groups[k].head;
    }
    int64_t j = 0;
    for (int64_t i = 0; i < sr.nb; i++) {
        if (!sr.frames[i]) continue;
        int64_t a = sr.a + i * sr.w, e = a + sr.w - 1;
        g->step[j] = a < sr.lo ? sr.lo : a > sr.hi ? sr.hi : a;
        g->end[j] = e < sr.lo ? sr.lo : e > sr.hi ? sr.hi : e;
        for (uint32_t k = 0; k < sr.ngroups; k++) {
            const struct bucket *b = &sr.b[i * sr.ngroups + k];
            g->min[(size_t)k * (size_t)nb + (size_t)j] = b->count ? b->mn : NAN;
        }
        j++;
    }
out:
    if (ret) query_grid_free(g);
    series_free(&sr);
    return ret;
}

void query_grid_free(struct query_grid *g) {
    if (!g) return;
    free(g->step);
    free(g->end);
    free(g->layer);
    free(g->head);
    free(g->min);
    memset(g, 0, sizeof *g);
}
