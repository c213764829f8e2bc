/* fblock_rows.c: sealed blocks in SQLite, both layouts (fblock_rows.h,
 * schema/storage.md "Blocks"). */
#include "fblock_rows.h"

#include <stdlib.h>
#include <string.h>

enum {
    P_PUT, P_NEW_ASC, P_NEW_DESC, P_NEW_ONE, P_OLD_ASC, P_OLD_DESC, P_NEW_FIRST, P_NEW_LAST, P_OLD_FIRST,
    P_OLD_LAST, P_DEL_OLD, P_DEL_NEW_ONE, P_OLD_BOUND, P_DEL_OLD_BELOW, P_NEW_BOUND, P_DEL_NEW_BELOW,
    P_COUNT
};

static const char *const p_sql[P_COUNT] = {
    /* a plain INSERT: a block is sealed once (a rewind into it deletes it
     * first), and a second row must fail loudly, never replace the first */
    [P_PUT] = "INSERT INTO block_chunks(metric_id, chunk, block, mask, data) VALUES (?1, ?2, ?3, ?4, ?5)",
    /* a walk is driven by the first chunk it reads; the others of the same
     * block are point lookups (a series of one head has none) */
    [P_NEW_ASC] = "SELECT block, mask, data FROM block_chunks WHERE metric_id = ?1 AND chunk = ?2 "
                  "AND block BETWEEN ?3 AND ?4 ORDER BY block",
    [P_NEW_DESC] = "SELECT block, mask, data FROM block_chunks WHERE metric_id = ?1 AND chunk = ?2 "
                   "AND block BETWEEN ?3 AND ?4 ORDER BY block DESC",
    [P_NEW_ONE] = "SELECT mask, data FROM block_chunks WHERE metric_id = ?1 AND chunk = ?2 AND block = ?3",
    /* length(data) comes from the record header, without reading the blob */
    [P_OLD_ASC] = "SELECT block, mask, id, length(data) FROM blocks WHERE metric_id = ?1 AND block BETWEEN ?2 AND ?3 "
                  "ORDER BY block",
    [P_OLD_DESC] = "SELECT block, mask, id, length(data) FROM blocks WHERE metric_id = ?1 AND block BETWEEN ?2 AND ?3 "
                   "ORDER BY block DESC",
    [P_NEW_FIRST] = "SELECT block, mask FROM block_chunks WHERE metric_id = ?1 AND chunk = 0 ORDER BY block LIMIT 1",
    [P_NEW_LAST] = "SELECT block, mask FROM block_chunks WHERE metric_id = ?1 AND chunk = 0 ORDER BY block DESC LIMIT 1",
    [P_OLD_FIRST] = "SELECT block, mask FROM blocks WHERE metric_id = ?1 ORDER BY block LIMIT 1",
    [P_OLD_LAST] = "SELECT block, mask FROM blocks WHERE metric_id = ?1 ORDER BY block DESC LIMIT 1",
    [P_DEL_OLD] = "DELETE FROM blocks WHERE metric_id = ?1 AND block = ?2",
    [P_DEL_NEW_ONE] = "DELETE FROM block_chunks WHERE metric_id = ?1 AND chunk = ?2 AND block = ?3",
    [P_OLD_BOUND] = "SELECT block FROM blocks WHERE metric_id = ?1 AND block < ?2 ORDER BY block LIMIT 1 OFFSET ?3",
    [P_DEL_OLD_BELOW] = "DELETE FROM blocks WHERE metric_id = ?1 AND block < ?2",
    [P_NEW_BOUND] = "SELECT block FROM block_chunks WHERE metric_id = ?1 AND chunk = 0 AND block < ?2 "
                    "ORDER BY block LIMIT 1 OFFSET ?3",
    /* one chunk at a time: the key is (metric, chunk, block), so a range
     * of blocks over every chunk is one range per chunk */
    [P_DEL_NEW_BELOW] = "DELETE FROM block_chunks WHERE metric_id = ?1 AND chunk = ?2 AND block < ?3",
};

struct fblock_rows {
    sqlite3 *db;
    struct fblock_codec *codec; /* borrowed */
    sqlite3_stmt *stmt[P_COUNT];
    /* the walk */
    int64_t metric_id, b0, b1;
    uint32_t n, c0, c1;
    int desc, phase; /* phase 0: the first table of the walk's order, 1 the second, 2 done */
    sqlite3_stmt *cur; /* the statement of the phase, once bound */
    /* reading a few cells of a migration-6 row through one blob handle:
     * only the header and the chunks of those cells */
    sqlite3_blob *blob;
    unsigned char *head, *span;
    size_t headcap, spancap;
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

int fblock_rows_put(struct fblock_rows *r, int64_t metric_id, int64_t block, uint64_t mask, const float *vals,
                    uint32_t nframes, uint32_t n) {
    sqlite3_stmt *s = r->stmt[P_PUT];
    for (uint32_t k = 0; k < fblock_nchunks(n); k++) {
        const unsigned char *blob;
        size_t len;
        if (fblock_encode_chunk(r->codec, vals, nframes, n, k, &blob, &len)) return FBLOCK_ENOMEM;
        sqlite3_bind_int64(s, 1, metric_id);
        sqlite3_bind_int(s, 2, (int)k);
        sqlite3_bind_int64(s, 3, block);
        sqlite3_bind_int64(s, 4, (int64_t)mask);
        sqlite3_bind_blob(s, 5, blob, (int)len, SQLITE_STATIC); /* the codec's until its next encode */
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

/* Decodes cells [c0, c1) of the nf frames of `blocks` row `id` (bytes
 * long) into vals, reading only their chunks: 0 or an error. */
static int old_decode(struct fblock_rows *r, int64_t id, size_t bytes, uint32_t nf, float *vals) {
    uint32_t n = r->n;
    int rc = r->blob ? sqlite3_blob_reopen(r->blob, id) : sqlite3_blob_open(r->db, "main", "blocks", "data", id, 0, &r->blob);
    if (rc != SQLITE_OK) return FBLOCK_EDB;
    if (bytes < 2 || grow(&r->head, &r->headcap, 2) || sqlite3_blob_read(r->blob, r->head, 2, 0) != SQLITE_OK)
        return bytes < 2 ? FBLOCK_ECORRUPT : FBLOCK_EDB;
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

/* Decodes the chunks after the driving one (k0) of block `block` of the
 * walk's metric, each a point lookup, into vals: 0 or an error. */
static int new_rest(struct fblock_rows *r, int64_t block, uint64_t mask, uint32_t nf, float *vals) {
    sqlite3_stmt *s = r->stmt[P_NEW_ONE];
    for (uint32_t k = r->c0 / FBLOCK_CHUNK + 1; k * FBLOCK_CHUNK < r->c1; k++) {
        sqlite3_bind_int64(s, 1, r->metric_id);
        sqlite3_bind_int(s, 2, (int)k);
        sqlite3_bind_int64(s, 3, block);
        int rc = sqlite3_step(s), ret = 0;
        if (rc == SQLITE_ROW) {
            if ((uint64_t)sqlite3_column_int64(s, 0) != mask ||
                fblock_decode_chunk(r->codec, sqlite3_column_blob(s, 1), (size_t)sqlite3_column_bytes(s, 1), nf, r->n,
                                    k, r->c0, r->c1, vals))
                ret = FBLOCK_ECORRUPT;
        } else {
            ret = rc == SQLITE_DONE ? FBLOCK_ECORRUPT : FBLOCK_EDB; /* a block without all its chunks */
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
    r->b0 = b0;
    r->b1 = b1;
    r->desc = desc;
    r->n = n;
    r->c0 = c0;
    r->c1 = c1;
    r->phase = c0 < c1 && c1 <= n ? 0 : 2;
}

/* The statement of the walk's phase, bound (NULL when done). */
static sqlite3_stmt *phase_stmt(struct fblock_rows *r) {
    if (r->cur || r->phase > 1) return r->cur;
    int old = (r->phase == 0) == !r->desc; /* ascending: the old table first */
    sqlite3_stmt *s = r->stmt[old ? (r->desc ? P_OLD_DESC : P_OLD_ASC) : (r->desc ? P_NEW_DESC : P_NEW_ASC)];
    int i = 1;
    sqlite3_bind_int64(s, i++, r->metric_id);
    if (!old) sqlite3_bind_int(s, i++, (int)(r->c0 / FBLOCK_CHUNK));
    sqlite3_bind_int64(s, i++, r->b0);
    sqlite3_bind_int64(s, i, r->b1);
    return r->cur = s;
}

int fblock_rows_next(struct fblock_rows *r, int64_t *block, uint64_t *mask, float *vals) {
    sqlite3_stmt *s;
    while ((s = phase_stmt(r))) {
        int rc = sqlite3_step(s);
        if (rc == SQLITE_DONE) {
            sqlite3_reset(s);
            r->cur = NULL;
            r->phase++;
            continue;
        }
        if (rc != SQLITE_ROW) return FBLOCK_EDB;
        *block = sqlite3_column_int64(s, 0);
        *mask = (uint64_t)sqlite3_column_int64(s, 1);
        uint32_t nf = fblock_count(*mask);
        if (!nf) return FBLOCK_ECORRUPT;
        int ret;
        if (s == r->stmt[P_OLD_ASC] || s == r->stmt[P_OLD_DESC])
            ret = old_decode(r, sqlite3_column_int64(s, 2), (size_t)sqlite3_column_int64(s, 3), nf, vals);
        else if (fblock_decode_chunk(r->codec, sqlite3_column_blob(s, 2), (size_t)sqlite3_column_bytes(s, 2), nf, r->n,
                                     r->c0 / FBLOCK_CHUNK, r->c0, r->c1, vals))
            ret = FBLOCK_ECORRUPT;
        else
            ret = new_rest(r, *block, *mask, nf, vals);
        return ret ? ret : 1;
    }
    return 0;
}

void fblock_rows_end(struct fblock_rows *r) {
    if (r->cur) sqlite3_reset(r->cur);
    r->cur = NULL;
    r->phase = 2;
    sqlite3_blob_close(r->blob);
    r->blob = NULL;
}

/* One row of the edge statement s: 1 with block and mask, 0, or FBLOCK_EDB. */
static int edge_row(sqlite3_stmt *s, int64_t metric_id, int64_t *block, uint64_t *mask) {
    sqlite3_bind_int64(s, 1, metric_id);
    int rc = sqlite3_step(s), ret = rc == SQLITE_ROW ? 1 : rc == SQLITE_DONE ? 0 : FBLOCK_EDB;
    if (rc == SQLITE_ROW) {
        *block = sqlite3_column_int64(s, 0);
        *mask = (uint64_t)sqlite3_column_int64(s, 1);
    }
    sqlite3_reset(s);
    return ret;
}

int fblock_rows_edge(struct fblock_rows *r, int64_t metric_id, int last, int64_t *block, uint64_t *mask) {
    /* the old table's blocks are the lower ones */
    int ret = edge_row(r->stmt[last ? P_NEW_LAST : P_OLD_FIRST], metric_id, block, mask);
    if (ret) return ret;
    return edge_row(r->stmt[last ? P_OLD_LAST : P_NEW_FIRST], metric_id, block, mask);
}

/* Deletes rows of block_chunks of metric_id with block < below, chunk
 * by chunk until a chunk has none (every block has the same chunks): the
 * rows of chunk 0 deleted, or an error. */
static int64_t new_delete_below(struct fblock_rows *r, int64_t metric_id, int64_t below) {
    sqlite3_stmt *s = r->stmt[P_DEL_NEW_BELOW];
    int64_t first = 0;
    for (int k = 0;; k++) {
        sqlite3_bind_int64(s, 1, metric_id);
        sqlite3_bind_int(s, 2, k);
        sqlite3_bind_int64(s, 3, below);
        if (run(s)) return FBLOCK_EDB;
        int64_t n = sqlite3_changes64(r->db);
        if (!k) first = n;
        if (!n) return first;
    }
}

/* The block `limit` places past the lowest of s's metric below `below`
 * (so deleting the blocks below it deletes `limit` of them), or `below`
 * when there are not that many; FBLOCK_EDB. */
static int64_t bound(sqlite3_stmt *s, int64_t metric_id, int64_t below, int64_t limit, int64_t *out) {
    sqlite3_bind_int64(s, 1, metric_id);
    sqlite3_bind_int64(s, 2, below);
    sqlite3_bind_int64(s, 3, limit);
    int rc = sqlite3_step(s);
    *out = rc == SQLITE_ROW ? sqlite3_column_int64(s, 0) : below;
    sqlite3_reset(s);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : FBLOCK_EDB;
}

int64_t fblock_rows_delete_below(struct fblock_rows *r, int64_t metric_id, int64_t below, int64_t limit) {
    int64_t b, done;
    if (limit < 1) limit = 1;
    if (bound(r->stmt[P_OLD_BOUND], metric_id, below, limit, &b)) return FBLOCK_EDB;
    sqlite3_stmt *s = r->stmt[P_DEL_OLD_BELOW];
    sqlite3_bind_int64(s, 1, metric_id);
    sqlite3_bind_int64(s, 2, b);
    if (run(s)) return FBLOCK_EDB;
    if ((done = sqlite3_changes64(r->db)) >= limit) return done;
    if (bound(r->stmt[P_NEW_BOUND], metric_id, below, limit - done, &b)) return FBLOCK_EDB;
    int64_t n = new_delete_below(r, metric_id, b);
    return n < 0 ? n : done + n;
}

int fblock_rows_delete(struct fblock_rows *r, int64_t metric_id, int64_t block) {
    sqlite3_stmt *s = r->stmt[P_DEL_OLD];
    sqlite3_bind_int64(s, 1, metric_id);
    sqlite3_bind_int64(s, 2, block);
    if (run(s)) return FBLOCK_EDB;
    s = r->stmt[P_DEL_NEW_ONE];
    for (int k = 0;; k++) {
        sqlite3_bind_int64(s, 1, metric_id);
        sqlite3_bind_int(s, 2, k);
        sqlite3_bind_int64(s, 3, block);
        if (run(s)) return FBLOCK_EDB;
        if (!sqlite3_changes64(r->db)) return 0;
    }
}
