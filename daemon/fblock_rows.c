/* fblock_rows.c: sealed blocks in SQLite, both layouts (fblock_rows.h,
 * schema/storage.md "Blocks"). */
#include "fblock_rows.h"

#include <stdlib.h>
#include <string.h>

#include "integrity.h"

/* A row's id: its series (the metric's base + the chunk) above
 * BLOCK_BITS bits of block number. */
#define BLOCK_BITS 26
#define BLOCK_MASK ((INT64_C(1) << BLOCK_BITS) - 1)
#define SERIES_MAX (INT64_C(1) << (62 - BLOCK_BITS)) /* ids stay below 2^62 */

enum {
    P_BASE,
    P_BASE_NEW,
    P_BASE_BUMP,
    P_FORGET,
    P_PUT,
    P_NEW_ASC,
    P_NEW_DESC,
    P_NEW_ONE,
    P_OLD_ASC,
    P_OLD_DESC,
    P_NEW_FIRST,
    P_NEW_LAST,
    P_OLD_FIRST,
    P_OLD_LAST,
    P_DEL_OLD,
    P_DEL_NEW_ONE,
    P_OLD_BOUND,
    P_DEL_OLD_BELOW,
    P_NEW_BOUND,
    P_DEL_NEW_BELOW,
    P_COUNT
};

static const char *const p_sql[P_COUNT] = {
    [P_BASE] = "SELECT base, chunks FROM block_series WHERE metric_id = ?1",
    [P_BASE_NEW] =
        "INSERT INTO block_series(metric_id, base, chunks) SELECT ?1, last, ?2 FROM id_seq WHERE name = 'block_series'",
    [P_BASE_BUMP] = "UPDATE id_seq SET last = last + ?1 WHERE name = 'block_series'",
    [P_FORGET] = "DELETE FROM block_series WHERE metric_id = ?1",
    /* a plain INSERT: a block is sealed once (a rewind into it deletes it
     * first), and a second row must fail loudly, never replace the first */
    [P_PUT] = "INSERT INTO block_chunks(id, mask, data, crc) VALUES (?1, ?2, ?3, ?4)",
    /* a walk is driven by the first chunk it reads; the others of the same
     * block are point lookups (a series of one head has none) */
    [P_NEW_ASC] = "SELECT id, mask, data, crc FROM block_chunks WHERE id BETWEEN ?1 AND ?2 ORDER BY id",
    [P_NEW_DESC] = "SELECT id, mask, data, crc FROM block_chunks WHERE id BETWEEN ?1 AND ?2 ORDER BY id DESC",
    [P_NEW_ONE] = "SELECT mask, data, crc FROM block_chunks WHERE id = ?1",
    /* length(data) comes from the record header, without reading the blob */
    [P_OLD_ASC] = "SELECT block, mask, id, length(data) FROM blocks WHERE metric_id = ?1 AND block BETWEEN ?2 AND ?3 "
                  "ORDER BY block",
    [P_OLD_DESC] = "SELECT block, mask, id, length(data) FROM blocks WHERE metric_id = ?1 AND block BETWEEN ?2 AND ?3 "
                   "ORDER BY block DESC",
    [P_NEW_FIRST] = "SELECT id, mask FROM block_chunks WHERE id BETWEEN ?1 AND ?2 ORDER BY id LIMIT 1",
    [P_NEW_LAST] = "SELECT id, mask FROM block_chunks WHERE id BETWEEN ?1 AND ?2 ORDER BY id DESC LIMIT 1",
    [P_OLD_FIRST] = "SELECT block, mask FROM blocks WHERE metric_id = ?1 ORDER BY block LIMIT 1",
    [P_OLD_LAST] = "SELECT block, mask FROM blocks WHERE metric_id = ?1 ORDER BY block DESC LIMIT 1",
    [P_DEL_OLD] = "DELETE FROM blocks WHERE metric_id = ?1 AND block = ?2",
    [P_DEL_NEW_ONE] = "DELETE FROM block_chunks WHERE id = ?1",
    [P_OLD_BOUND] = "SELECT block FROM blocks WHERE metric_id = ?1 AND block < ?2 ORDER BY block LIMIT 1 OFFSET ?3",
    [P_DEL_OLD_BELOW] = "DELETE FROM blocks WHERE metric_id = ?1 AND block < ?2",
    [P_NEW_BOUND] = "SELECT id FROM block_chunks WHERE id >= ?1 AND id < ?2 ORDER BY id LIMIT 1 OFFSET ?3",
    /* one chunk at a time: a range of blocks over every chunk is one
     * range of ids per chunk */
    [P_DEL_NEW_BELOW] = "DELETE FROM block_chunks WHERE id >= ?1 AND id < ?2",
};

struct fblock_rows {
    sqlite3 *db;
    struct fblock_codec *codec; /* borrowed */
    sqlite3_stmt *stmt[P_COUNT];
    /* the walk */
    int64_t metric_id, b0, b1, base; /* base -1: the metric has no chunk rows */
    uint32_t n, c0, c1;
    int desc, phase;   /* phase 0: the first table of the walk's order, 1 the second, 2 done */
    sqlite3_stmt *cur; /* the statement of the phase, once bound */
    /* reading a few cells of a migration-6 row through one blob handle:
     * only the header and the chunks of those cells */
    sqlite3_blob *blob;
    unsigned char *head, *span;
    size_t headcap, spancap;
    /* the row of the last FBLOCK_ECORRUPT (fblock_rows_fault) */
    int64_t bad_block, bad_chunk;
    const char *bad_why;
};

struct fblock_rows *fblock_rows_open(sqlite3 *db, struct fblock_codec *codec) {
    struct fblock_rows *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->db = db;
    r->codec = codec;
    for (int i = 0; i < P_COUNT; i++)
        if (sqlite3_prepare_v3(db, p_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &r->stmt[i], NULL) != SQLITE_OK) {
            fblock_rows_close(r);
            return NULL;
        }
    return r;
}

void fblock_rows_close(struct fblock_rows *r) {
    if (!r) return;
    fblock_rows_end(r);
    for (int i = 0; i < P_COUNT; i++) sqlite3_finalize(r->stmt[i]);
    free(r->head);
    free(r->span);
    free(r);
}

/* Steps s (bound by the caller) to its end and resets it: 0 or FBLOCK_EDB. */
static int run(sqlite3_stmt *s) {
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    return rc == SQLITE_DONE ? 0 : FBLOCK_EDB;
}

/* The id of block `block` of chunk k of the metric whose series base is
 * base; block may be 2^26, as the bound past the last (so +, not |). */
static int64_t row_id(int64_t base, int64_t k, int64_t block) { return ((base + k) << BLOCK_BITS) + block; }

/* The series base of metric_id and its number of chunks (when chunks is
 * not NULL): 1, 0 when it has none, or FBLOCK_EDB. A metric's chunks
 * must never reach into the next metric's series. */
static int base_of(struct fblock_rows *r, int64_t metric_id, int64_t *base, int64_t *chunks) {
    sqlite3_stmt *s = r->stmt[P_BASE];
    sqlite3_bind_int64(s, 1, metric_id);
    int rc = sqlite3_step(s), ret = rc == SQLITE_ROW ? 1 : rc == SQLITE_DONE ? 0 : FBLOCK_EDB;
    if (rc == SQLITE_ROW) {
        *base = sqlite3_column_int64(s, 0);
        if (chunks) *chunks = sqlite3_column_int64(s, 1);
    }
    sqlite3_reset(s);
    return ret;
}

/* The series base of metric_id, given one (nchunks series) if it has
 * none yet: 1 with *base, 0 when the series are used up, or FBLOCK_EDB. */
static int base_get(struct fblock_rows *r, int64_t metric_id, uint32_t nchunks, int64_t *base) {
    int64_t have;
    int got = base_of(r, metric_id, base, &have);
    if (got) return got < 0 || have == nchunks ? got : FBLOCK_ECORRUPT; /* a metric's shape is fixed */
    sqlite3_bind_int64(r->stmt[P_BASE_NEW], 1, metric_id);
    sqlite3_bind_int64(r->stmt[P_BASE_NEW], 2, nchunks);
    sqlite3_bind_int64(r->stmt[P_BASE_BUMP], 1, nchunks);
    if (run(r->stmt[P_BASE_NEW]) || run(r->stmt[P_BASE_BUMP]) || (got = base_of(r, metric_id, base, NULL)) <= 0)
        return FBLOCK_EDB;
    return *base + nchunks <= SERIES_MAX;
}

int fblock_rows_put(struct fblock_rows *r, int64_t metric_id, int64_t block, uint64_t mask, const float *vals,
                    uint32_t nframes, uint32_t n, int poisoned) {
    int64_t base;
    if (block < 0 || block > BLOCK_MASK) return 1;
    int got = base_get(r, metric_id, fblock_nchunks(n), &base);
    if (got <= 0) return got < 0 ? got : 1;
    sqlite3_stmt *s = r->stmt[P_PUT];
    for (uint32_t k = 0; k < fblock_nchunks(n); k++) {
        const unsigned char *blob;
        size_t len;
        if (fblock_encode_chunk(r->codec, vals, nframes, n, k, &blob, &len)) return FBLOCK_ENOMEM;
        sqlite3_bind_int64(s, 1, row_id(base, k, block));
        sqlite3_bind_int64(s, 2, (int64_t)mask);
        sqlite3_bind_blob(s, 3, blob, (int)len, SQLITE_STATIC); /* the codec's until its next encode */
        uint32_t crc = integrity_chunk_crc(row_id(base, k, block), mask, blob, len);
        sqlite3_bind_int64(s, 4, poisoned ? integrity_poisoned(crc) : integrity_stored(crc));
        int rc = run(s);
        if (rc) return rc;
    }
    return 0;
}

static int grow(unsigned char **buf, size_t *cap, size_t want) {
    if (want <= *cap) return 0;
    unsigned char *b = realloc(*buf, want);
    if (!b) return -1;
    *buf = b;
    *cap = want;
    return 0;
}

/* Notes the row at fault (chunk -1: a row of migration 6's table) and why;
 * returns FBLOCK_ECORRUPT. */
static int fault(struct fblock_rows *r, int64_t block, int64_t chunk, const char *why) {
    r->bad_block = block;
    r->bad_chunk = chunk;
    r->bad_why = why;
    return FBLOCK_ECORRUPT;
}

const char *fblock_rows_fault(const struct fblock_rows *r, int64_t *block, int64_t *chunk) {
    *block = r->bad_block;
    *chunk = r->bad_chunk;
    return r->bad_why ? r->bad_why : "does not decode";
}

/* Checks chunk row `id` (mask, blob d of len bytes; column col of s its
 * crc, NULL in a row written before migration 11) and decodes chunk k's
 * cells of [c0, c1) into vals: 0 or FBLOCK_ECORRUPT (fault noted). The
 * checksum comes first: a damaged blob must fail as damaged, not decode
 * into other numbers. */
static int new_decode(struct fblock_rows *r, sqlite3_stmt *s, int col, int64_t id, uint64_t mask, uint32_t nf,
                      uint32_t k, float *vals) {
    const void *d = sqlite3_column_blob(s, col - 1);
    size_t len = (size_t)sqlite3_column_bytes(s, col - 1);
    int64_t block = id & BLOCK_MASK;
    if (sqlite3_column_type(s, col) != SQLITE_NULL &&
        sqlite3_column_int64(s, col) != integrity_stored(integrity_chunk_crc(id, mask, d, len)))
        return fault(r, block, k, "checksum mismatch");
    if (fblock_decode_chunk(r->codec, d, len, nf, r->n, k, r->c0, r->c1, vals))
        return fault(r, block, k, "does not decode");
    return 0;
}

/* Decodes cells [c0, c1) of the nf frames of `blocks` row `id` (bytes
 * long) into vals, reading only their chunks: 0 or an error. */
static int old_decode(struct fblock_rows *r, int64_t id, size_t bytes, uint32_t nf, float *vals) {
    uint32_t n = r->n;
    int rc = r->blob ? sqlite3_blob_reopen(r->blob, id)
                     : sqlite3_blob_open(r->db, "main", "blocks", "data", id, 0, &r->blob);
    if (rc != SQLITE_OK) return FBLOCK_EDB;
    if (bytes < 2) return FBLOCK_ECORRUPT;
    if (grow(&r->head, &r->headcap, 2)) return FBLOCK_ENOMEM;
    if (sqlite3_blob_read(r->blob, r->head, 2, 0) != SQLITE_OK) return FBLOCK_EDB;
    ssize_t hs = fblock_head_size(r->head, n);
    if (hs < 0 || (size_t)hs > bytes) return FBLOCK_ECORRUPT;
    if (grow(&r->head, &r->headcap, (size_t)hs)) return FBLOCK_ENOMEM;
    if (sqlite3_blob_read(r->blob, r->head + 2, (int)hs - 2, 2) != SQLITE_OK) return FBLOCK_EDB;
    size_t off, len;
    fblock_span(r->head, n, r->c0, r->c1, &off, &len);
    if (off + len > bytes) return FBLOCK_ECORRUPT;
    if (grow(&r->span, &r->spancap, len ? len : 1)) return FBLOCK_ENOMEM;
    if (len && sqlite3_blob_read(r->blob, r->span, (int)len, (int)off) != SQLITE_OK) return FBLOCK_EDB;
    return fblock_decode_span(r->codec, r->head, r->span, len, nf, n, r->c0, r->c1, vals) ? FBLOCK_ECORRUPT : 0;
}

/* Decodes the chunks after the driving one of block `block` of the
 * walk's metric, each a point lookup, into vals: 0 or an error. */
static int new_rest(struct fblock_rows *r, int64_t block, uint64_t mask, uint32_t nf, float *vals) {
    sqlite3_stmt *s = r->stmt[P_NEW_ONE];
    for (uint32_t k = r->c0 / FBLOCK_CHUNK + 1; k * FBLOCK_CHUNK < r->c1; k++) {
        int64_t id = row_id(r->base, k, block);
        sqlite3_bind_int64(s, 1, id);
        int rc = sqlite3_step(s), ret = 0;
        if (rc == SQLITE_ROW) {
            uint64_t m = (uint64_t)sqlite3_column_int64(s, 0);
            ret = new_decode(r, s, 2, id, m, nf, k, vals);
            if (!ret && m != mask) ret = fault(r, block, k, "its mask is not its block's");
        } else if (rc == SQLITE_DONE) {
            ret = fault(r, block, k, "missing (a block without all its chunks)");
        } else {
            ret = FBLOCK_EDB;
        }
        sqlite3_reset(s);
        if (ret) return ret;
    }
    return 0;
}

void fblock_rows_walk(struct fblock_rows *r, int64_t metric_id, int64_t b0, int64_t b1, int desc, uint32_t n,
                      uint32_t c0, uint32_t c1) {
    fblock_rows_end(r);
    r->metric_id = metric_id;
    r->b0 = b0 < 0 ? 0 : b0;
    r->b1 = b1;
    r->desc = desc;
    r->n = n;
    r->c0 = c0;
    r->c1 = c1;
    r->base = -2; /* looked up when the walk reaches block_chunks */
    r->phase = c0 < c1 && c1 <= n && r->b0 <= b1 ? 0 : 2;
}

/* The statement of the walk's phase, bound (NULL when done; *err set
 * when the lookup of the metric's series failed). */
static sqlite3_stmt *phase_stmt(struct fblock_rows *r, int *err) {
    while (!r->cur && r->phase < 2) {
        int old = (r->phase == 0) == !r->desc; /* ascending: the old table first */
        sqlite3_stmt *s = r->stmt[old ? (r->desc ? P_OLD_DESC : P_OLD_ASC) : (r->desc ? P_NEW_DESC : P_NEW_ASC)];
        if (old) {
            sqlite3_bind_int64(s, 1, r->metric_id);
            sqlite3_bind_int64(s, 2, r->b0);
            sqlite3_bind_int64(s, 3, r->b1);
            return r->cur = s;
        }
        int got = r->base == -2 ? base_of(r, r->metric_id, &r->base, NULL) : 1;
        if (got < 0) {
            *err = got;
            return NULL;
        }
        if (!got || r->b0 > BLOCK_MASK) { /* no chunk rows */
            r->base = -1;
            r->phase++;
            continue;
        }
        int64_t k0 = r->c0 / FBLOCK_CHUNK;
        sqlite3_bind_int64(s, 1, row_id(r->base, k0, r->b0));
        sqlite3_bind_int64(s, 2, row_id(r->base, k0, r->b1 < BLOCK_MASK ? r->b1 : BLOCK_MASK));
        return r->cur = s;
    }
    return r->cur;
}

int fblock_rows_next(struct fblock_rows *r, int64_t *block, uint64_t *mask, float *vals) {
    sqlite3_stmt *s;
    int err = 0;
    while ((s = phase_stmt(r, &err))) {
        int rc = sqlite3_step(s);
        if (rc == SQLITE_DONE) {
            sqlite3_reset(s);
            r->cur = NULL;
            r->phase++;
            continue;
        }
        if (rc != SQLITE_ROW) return FBLOCK_EDB;
        int old = s == r->stmt[P_OLD_ASC] || s == r->stmt[P_OLD_DESC], ret;
        *block = old ? sqlite3_column_int64(s, 0) : sqlite3_column_int64(s, 0) & BLOCK_MASK;
        *mask = (uint64_t)sqlite3_column_int64(s, 1);
        uint32_t nf = fblock_count(*mask), k0 = r->c0 / FBLOCK_CHUNK;
        if (old) {
            ret = nf ? old_decode(r, sqlite3_column_int64(s, 2), (size_t)sqlite3_column_int64(s, 3), nf, vals)
                     : FBLOCK_ECORRUPT;
            if (ret == FBLOCK_ECORRUPT) fault(r, *block, -1, "does not decode");
        } else if (!(ret = new_decode(r, s, 3, sqlite3_column_int64(s, 0), *mask, nf ? nf : 1, k0, vals))) {
            ret = nf ? new_rest(r, *block, *mask, nf, vals) : fault(r, *block, k0, "has no frames");
        }
        return ret ? ret : 1;
    }
    return err;
}

void fblock_rows_end(struct fblock_rows *r) {
    if (r->cur) sqlite3_reset(r->cur);
    r->cur = NULL;
    r->phase = 2;
    sqlite3_blob_close(r->blob);
    r->blob = NULL;
}

/* One row of the edge statement s (bound but for the ranges: old tables
 * by metric, new by id range [lo, hi]): 1 with block and mask, 0, or
 * FBLOCK_EDB. */
static int edge_row(sqlite3_stmt *s, int old, int64_t metric_id, int64_t lo, int64_t hi, int64_t *block,
                    uint64_t *mask) {
    if (old) sqlite3_bind_int64(s, 1, metric_id);
    else {
        sqlite3_bind_int64(s, 1, lo);
        sqlite3_bind_int64(s, 2, hi);
    }
    int rc = sqlite3_step(s), ret = rc == SQLITE_ROW ? 1 : rc == SQLITE_DONE ? 0 : FBLOCK_EDB;
    if (rc == SQLITE_ROW) {
        *block = sqlite3_column_int64(s, 0) & (old ? INT64_MAX : BLOCK_MASK);
        *mask = (uint64_t)sqlite3_column_int64(s, 1);
    }
    sqlite3_reset(s);
    return ret;
}

int fblock_rows_edge(struct fblock_rows *r, int64_t metric_id, int last, int64_t *block, uint64_t *mask) {
    int64_t base;
    int got = base_of(r, metric_id, &base, NULL), ret;
    if (got < 0) return got;
    int64_t lo = got ? row_id(base, 0, 0) : 0, hi = got ? row_id(base, 0, BLOCK_MASK) : 0;
    /* the old table's blocks are the lower ones */
    if (last) {
        if (got && (ret = edge_row(r->stmt[P_NEW_LAST], 0, metric_id, lo, hi, block, mask))) return ret;
        return edge_row(r->stmt[P_OLD_LAST], 1, metric_id, 0, 0, block, mask);
    }
    if ((ret = edge_row(r->stmt[P_OLD_FIRST], 1, metric_id, 0, 0, block, mask)) || !got) return ret;
    return edge_row(r->stmt[P_NEW_FIRST], 0, metric_id, lo, hi, block, mask);
}

/* Deletes the chunk rows of blocks [0, below) of the metric of series
 * base and `chunks` chunks, chunk by chunk: the rows of chunk 0 deleted,
 * or an error. */
static int64_t new_delete_below(struct fblock_rows *r, int64_t base, int64_t chunks, int64_t below) {
    sqlite3_stmt *s = r->stmt[P_DEL_NEW_BELOW];
    int64_t first = 0;
    for (int64_t k = 0; k < chunks; k++) {
        sqlite3_bind_int64(s, 1, row_id(base, k, 0));
        sqlite3_bind_int64(s, 2, row_id(base, k, below));
        if (run(s)) return FBLOCK_EDB;
        if (!k) first = sqlite3_changes64(r->db);
    }
    return first;
}

/* The first value of s's row (bound here: ?1 a, ?2 b, ?3 limit), or dflt
 * when there is none: 0, or FBLOCK_EDB. */
static int bound(sqlite3_stmt *s, int64_t a, int64_t b, int64_t limit, int64_t dflt, int64_t *out) {
    sqlite3_bind_int64(s, 1, a);
    sqlite3_bind_int64(s, 2, b);
    sqlite3_bind_int64(s, 3, limit);
    int rc = sqlite3_step(s);
    *out = rc == SQLITE_ROW ? sqlite3_column_int64(s, 0) : dflt;
    sqlite3_reset(s);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : FBLOCK_EDB;
}

int64_t fblock_rows_delete_below(struct fblock_rows *r, int64_t metric_id, int64_t below, int64_t limit) {
    int64_t b, done, base, chunks;
    if (limit < 1) limit = 1;
    /* the old table first (its blocks are the lower ones): the block
     * `limit` places past its lowest bounds what goes */
    if (bound(r->stmt[P_OLD_BOUND], metric_id, below, limit, below, &b)) return FBLOCK_EDB;
    sqlite3_stmt *s = r->stmt[P_DEL_OLD_BELOW];
    sqlite3_bind_int64(s, 1, metric_id);
    sqlite3_bind_int64(s, 2, b);
    if (run(s)) return FBLOCK_EDB;
    if ((done = sqlite3_changes64(r->db)) >= limit) return done;
    int got = base_of(r, metric_id, &base, &chunks);
    if (got <= 0) return got < 0 ? got : done;
    int64_t cut = below < BLOCK_MASK ? below : BLOCK_MASK + 1;
    if (bound(r->stmt[P_NEW_BOUND], row_id(base, 0, 0), row_id(base, 0, 0) + cut, limit - done, row_id(base, 0, cut),
              &b))
        return FBLOCK_EDB;
    int64_t n = new_delete_below(r, base, chunks, b - row_id(base, 0, 0));
    return n < 0 ? n : done + n;
}

int fblock_rows_delete(struct fblock_rows *r, int64_t metric_id, int64_t block) {
    int64_t base, chunks;
    sqlite3_stmt *s = r->stmt[P_DEL_OLD];
    sqlite3_bind_int64(s, 1, metric_id);
    sqlite3_bind_int64(s, 2, block);
    if (run(s)) return FBLOCK_EDB;
    int got = base_of(r, metric_id, &base, &chunks);
    if (got <= 0 || block < 0 || block > BLOCK_MASK) return got < 0 ? got : 0;
    s = r->stmt[P_DEL_NEW_ONE];
    for (int64_t k = 0; k < chunks; k++) {
        sqlite3_bind_int64(s, 1, row_id(base, k, block));
        if (run(s)) return FBLOCK_EDB;
    }
    return 0;
}

int fblock_rows_forget(struct fblock_rows *r, int64_t metric_id) {
    sqlite3_bind_int64(r->stmt[P_FORGET], 1, metric_id);
    return run(r->stmt[P_FORGET]);
}
