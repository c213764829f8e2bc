/* fixture_frames.h: reading a database's frames in tests wherever the
 * store keeps them (raw rows or sealed blocks). Header-only; include it
 * after <cmocka.h>, whose assertions it uses. */
#ifndef FIXTURE_FRAMES_H
#define FIXTURE_FRAMES_H

#include <sqlite3.h>
#include <stdint.h>
#include <stdlib.h>

#include "fblock.h"

/* Inserts the nf frames of n values v of block `block` (steps in mask)
 * of metric_id into temp.frames through ins. */
static inline void shadow_put(sqlite3_stmt *ins, int64_t metric_id, int64_t block, uint64_t mask, uint32_t nf,
                              uint32_t n, const float *v) {
    for (uint32_t f = 0; f < nf; f++) {
        sqlite3_bind_int64(ins, 1, metric_id);
        sqlite3_bind_int64(ins, 2, fblock_step(block, mask, f));
        sqlite3_bind_blob(ins, 3, v + (size_t)f * n, (int)(n * sizeof *v), SQLITE_TRANSIENT);
        assert_int_equal(sqlite3_step(ins), SQLITE_DONE);
        sqlite3_reset(ins);
    }
}

/* The SQL of a block table's rows with their metric's value count n
 * (the last column). */
#define SHADOW_SQL(cols, table, order)                                                                    \
    "SELECT " cols                                                                                        \
    ", r.layers * (CASE m.kind WHEN 0 THEN 0 ELSE 1 END) * (CASE m.kind WHEN 2 THEN r.heads ELSE 1 END) " \
    "FROM main." table " b JOIN main.metrics m ON m.id = b.metric_id JOIN main.runs r ON r.id = m.run_id" order

/* Migration 8's rows (fblock_rows.h): one per chunk, id (series << 26 |
 * block) where series = the metric's base + chunk; a block's chunks
 * gathered and checked complete (chunks 0..nchunks-1, one mask). */
static inline void shadow_chunks(sqlite3 *db, sqlite3_stmt *ins, struct fblock_codec *c) {
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(
            db,
            "WITH s AS (SELECT b.metric_id, b.base, max(1, r.layers * (CASE m.kind WHEN 0 THEN 0 ELSE 1 END) "
            "* (CASE m.kind WHEN 2 THEN r.heads ELSE 1 END)) AS n FROM main.block_series b "
            "JOIN main.metrics m ON m.id = b.metric_id JOIN main.runs r ON r.id = m.run_id) "
            "SELECT s.metric_id, c.id & 67108863 AS block, c.mask, (c.id >> 26) - s.base AS chunk, c.data, s.n "
            "FROM main.block_chunks c JOIN s ON c.id >> 26 >= s.base AND c.id >> 26 < s.base + (s.n + 15) / 16 "
            "ORDER BY s.metric_id, block, chunk",
            -1, &s, NULL) != SQLITE_OK)
        return; /* a database before migration 8 */
    float *v = NULL;
    int64_t mid = -1, block = -1;
    uint64_t mask = 0;
    uint32_t n = 0, next = 0;
    for (int rc = sqlite3_step(s);; rc = sqlite3_step(s)) {
        int row = rc == SQLITE_ROW;
        if (!row) assert_int_equal(rc, SQLITE_DONE);
        if (v && (!row || sqlite3_column_int64(s, 0) != mid || sqlite3_column_int64(s, 1) != block)) {
            if (next != fblock_nchunks(n))
                fail_msg("block %lld of metric %lld has %u of its chunks", (long long)block, (long long)mid, next);
            shadow_put(ins, mid, block, mask, fblock_count(mask), n, v);
            free(v);
            v = NULL;
        }
        if (!row) break;
        if (!v) {
            mid = sqlite3_column_int64(s, 0);
            block = sqlite3_column_int64(s, 1);
            mask = (uint64_t)sqlite3_column_int64(s, 2);
            n = (uint32_t)sqlite3_column_int64(s, 5);
            if (!n) n = 1;
            next = 0;
            v = malloc((size_t)fblock_count(mask) * n * sizeof *v);
            assert_non_null(v);
        }
        uint32_t k = (uint32_t)sqlite3_column_int64(s, 3);
        if (k != next || (uint64_t)sqlite3_column_int64(s, 2) != mask ||
            fblock_decode_chunk(c, sqlite3_column_blob(s, 4), (size_t)sqlite3_column_bytes(s, 4), fblock_count(mask), n,
                                k, 0, n, v))
            fail_msg("chunk %u of block %lld of metric %lld does not decode", k, (long long)block, (long long)mid);
        next++;
    }
    sqlite3_finalize(s);
}

/* Shadows the database's `frames` with a TEMP table of the same name
 * holding every frame, raw or sealed in `blocks` or `block_chunks`
 * (decoded: schema/storage.md, "Blocks"), so that a test reads frames as
 * plain rows wherever the store keeps them. The blocks must decode. */
static inline void shadow_frames(sqlite3 *db) {
    sqlite3_stmt *s, *ins;
    int rc =
        sqlite3_exec(db,
                     "CREATE TEMP TABLE frames(id INTEGER PRIMARY KEY, metric_id INTEGER, step INTEGER, data BLOB);"
                     "INSERT INTO temp.frames SELECT id, metric_id, step, data FROM main.frames;",
                     NULL, NULL, NULL);
    if (rc != SQLITE_OK) fail_msg("shadowing frames: %s", sqlite3_errmsg(db));
    if (sqlite3_prepare_v2(db, SHADOW_SQL("b.metric_id, b.block, b.mask, b.data", "blocks", ""), -1, &s, NULL) !=
        SQLITE_OK)
        return; /* a database before migration 6, or an orphan's blocks only */
    assert_int_equal(
        sqlite3_prepare_v2(db, "INSERT INTO temp.frames(metric_id, step, data) VALUES (?1, ?2, ?3)", -1, &ins, NULL),
        SQLITE_OK);
    struct fblock_codec *c = fblock_codec_create();
    assert_non_null(c);
    while (sqlite3_step(s) == SQLITE_ROW) {
        int64_t block = sqlite3_column_int64(s, 1);
        uint64_t mask = (uint64_t)sqlite3_column_int64(s, 2);
        uint32_t n = (uint32_t)sqlite3_column_int64(s, 4), nf = fblock_count(mask);
        if (!n) n = 1;
        float *v = malloc((size_t)nf * n * sizeof *v);
        assert_non_null(v);
        if (fblock_decode(c, sqlite3_column_blob(s, 3), (size_t)sqlite3_column_bytes(s, 3), nf, n, 0, n, v))
            fail_msg("block %lld of metric %lld does not decode", (long long)block,
                     (long long)sqlite3_column_int64(s, 0));
        shadow_put(ins, sqlite3_column_int64(s, 0), block, mask, nf, n, v);
        free(v);
    }
    sqlite3_finalize(s);
    shadow_chunks(db, ins, c);
    sqlite3_finalize(ins);
    fblock_codec_destroy(c);
}

#endif
