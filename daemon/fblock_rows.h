/* fblock_rows.h: where sealed blocks live in SQLite (schema/storage.md,
 * "Blocks"), for the store (writes, rewinds, purges, retention) and the
 * query module (reads) alike, so that both know the two layouts in one
 * place:
 *
 * - `block_chunks` (migration 8, written now): one row per (metric, chunk
 *   of FBLOCK_CHUNK cells, block), its rowid (series << 26 | block)
 *   ordering them so, where a metric's chunk k is series base + k
 *   (`block_series`, bases handed out in order): a series of one head
 *   reads its chunk of consecutive blocks from consecutive rows of the
 *   same few pages, and nothing of the other heads'. A block's chunks are
 *   written and deleted together, in one transaction.
 * - `blocks` (migration 6): one row per (metric, block) holding every
 *   chunk (fblock.h formats 1 and 2), written before migration 8 and
 *   still read, never rewritten. Every block in `blocks` is below every
 *   block of the same metric in `block_chunks` (blocks are sealed above a
 *   metric's last step only, and a rewind takes the ones above its step
 *   out of both), so a walk reads one table, then the other.
 *
 * One struct fblock_rows per connection, used by one thread at a time,
 * one walk at a time. Returns: 0 (or a count) on success; FBLOCK_EDB (the
 * connection's sqlite3_errmsg says why), FBLOCK_ECORRUPT (a row that does
 * not decode, or a block missing a chunk), FBLOCK_ENOMEM. */
#ifndef FBLOCK_ROWS_H
#define FBLOCK_ROWS_H

#include <sqlite3.h>
#include <stdint.h>

#include "fblock.h"

#define FBLOCK_EDB (-1)
#define FBLOCK_ECORRUPT (-2)
#define FBLOCK_ENOMEM (-3)

struct fblock_rows;

/* Prepares the statements on db (which must have migration 8) and borrows
 * codec (which must outlive it). NULL when a statement does not prepare
 * (sqlite3_errmsg(db)) or out of memory. fblock_rows_close accepts NULL. */
struct fblock_rows *fblock_rows_open(sqlite3 *db, struct fblock_codec *codec);
void fblock_rows_close(struct fblock_rows *r);

/* Writes block `block` of metric_id: nframes frames (vals, frame-major)
 * of n values, the steps in mask, as fblock_nchunks(n) rows of
 * block_chunks, each with its checksum (inverted when poisoned: the
 * frames came from a damaged row, and must read as damaged): 0; 1 when the block cannot have rows (a block number of
 * 2^26 or more, i.e. a step past 2^32: the caller keeps its frames raw);
 * a block already there fails (a constraint: FBLOCK_EDB). */
int fblock_rows_put(struct fblock_rows *r, int64_t metric_id, int64_t block, uint64_t mask, const float *vals,
                    uint32_t nframes, uint32_t n, int poisoned);

/* Starts a walk over metric_id's blocks b0..b1 (inclusive), ascending or
 * (desc) descending, decoding cells [c0, c1) (0 <= c0 < c1 <= n) of each;
 * fblock_rows_next gives the next block (its number, mask and frames in
 * vals, room for FBLOCK_STEPS x n, frame-major, only cells [c0, c1)
 * written): 1, 0 at the end, or an error. fblock_rows_end ends the walk
 * (releases its statements: call it before the transaction ends). */
void fblock_rows_walk(struct fblock_rows *r, int64_t metric_id, int64_t b0, int64_t b1, int desc, uint32_t n,
                      uint32_t c0, uint32_t c1);
int fblock_rows_next(struct fblock_rows *r, int64_t *block, uint64_t *mask, float *vals);
void fblock_rows_end(struct fblock_rows *r);

/* After FBLOCK_ECORRUPT: the block (its steps are [block*64, block*64 +
 * 63]) and chunk (-1: a row of migration 6's `blocks`) of the row at
 * fault, and why, a static string ("checksum mismatch", "does not decode",
 * "missing ..."). Rows of block_chunks carry a checksum since migration 11
 * (integrity.h), checked before they are decoded. */
const char *fblock_rows_fault(const struct fblock_rows *r, int64_t *block, int64_t *chunk);

/* The first (last = 0) or last of metric_id's blocks, its number and
 * mask: 1, 0 when it has none, or an error. */
int fblock_rows_edge(struct fblock_rows *r, int64_t metric_id, int last, int64_t *block, uint64_t *mask);

/* Deletes block `block` of metric_id, whichever table holds it: 0 or an
 * error. */
int fblock_rows_delete(struct fblock_rows *r, int64_t metric_id, int64_t block);

/* Forgets metric_id's series base, once its blocks are all deleted (a
 * purged metric): 0 or FBLOCK_EDB. */
int fblock_rows_forget(struct fblock_rows *r, int64_t metric_id);

/* Deletes metric_id's blocks below `below`, the lowest first, at most
 * `limit` (>= 1) of them, whole: the blocks deleted (< limit: none is
 * left below `below`), or an error. */
int64_t fblock_rows_delete_below(struct fblock_rows *r, int64_t metric_id, int64_t below, int64_t limit);

#endif
