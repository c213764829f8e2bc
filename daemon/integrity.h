/* integrity.h: the checksums of stored rows and the offline check
 * (schema/storage.md, "Checksums"; docs/storage.md says why a checksum
 * per row and not SQLite's checksum VFS).
 *
 * Since migration 11 every row of block_chunks, rollups, rollup_totals and frames
 * the daemon writes carries `crc`: CRC32C (Castagnoli) of the row's key,
 * the fields a reader trusts and its blob, stored as a signed 32-bit
 * integer (4 bytes in the record). A reader recomputes it before it
 * decodes the row; a row whose crc is NULL was written before migration
 * 11 and is read as before (unchecked). What is not covered: `latest`
 * (/metrics' newest values), abandoned frames, the migration-6 `blocks` table (read only)
 * and the small tables; SQLite's own page checks (and `entropyd --check`,
 * which runs integrity_check) cover the b-tree structure.
 *
 * Also the process-wide count of damaged rows met by readers and the
 * writer (/metrics entropyd_integrity_errors_total, /healthz), and the
 * offline verification of a whole database (entropyd --check). */
#ifndef INTEGRITY_H
#define INTEGRITY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* CRC32C of n bytes at p, continuing crc (0 to start): SSE4.2's crc32
 * instruction where the CPU has it, else a table (slice-by-8); both give
 * the same value. */
uint32_t integrity_crc32c(uint32_t crc, const void *p, size_t n);

/* The checksum of a block_chunks row: id, mask (each as 8 bytes,
 * little-endian), then the blob. The key is covered so that a row whose
 * rowid was damaged (which would move it to another block) fails too. */
uint32_t integrity_chunk_crc(int64_t id, uint64_t mask, const void *data, size_t len);

/* The checksum of a rollups row (chunk >= 0) or rollup_totals row (chunk
 * -1): metric_id, level, chunk, block, nframes (8 bytes each,
 * little-endian), then the blob. */
uint32_t integrity_rollup_crc(int64_t metric_id, int64_t level, int64_t chunk, int64_t block, int64_t nframes,
                              const void *data, size_t len);

/* The checksum of a raw frame (`frames`, an open block's): metric_id,
 * step (8 bytes each, little-endian), then the values. */
uint32_t integrity_frame_crc(int64_t metric_id, int64_t step, const void *data, size_t len);

/* What a row stores in its crc column for checksum c (a signed 32-bit
 * integer: SQLite's 4-byte integer; a u32 above 2^31 would take 6). */
static inline int64_t integrity_stored(uint32_t c) { return (int64_t)(int32_t)c; }

/* The crc written for a row derived from a damaged one (a level-k rollup
 * pooled from a level k-1 row that failed its check): the checksum
 * inverted, so that the row reads as damaged, never as good data. */
static inline int64_t integrity_poisoned(uint32_t c) { return (int64_t)(int32_t)~c; }

/* The process-wide count of damaged rows found (a checksum mismatch, a
 * row that does not decode, SQLite's SQLITE_CORRUPT): integrity_note adds
 * one (any thread), integrity_errors reads it. */
void integrity_note(void);
uint64_t integrity_errors(void);

/* entropyd --check: verifies the database at path, opened read-only (the
 * daemon may be running: the check reads one snapshot, in one read
 * transaction), in two parts: SQLite's `PRAGMA integrity_check` (pages
 * and b-trees), then every block chunk, rollup and total row against its
 * checksum and decoded as its metric's shape, and every raw frame's size.
 * Writes a line per damaged row to out ("damaged: run 1 \"name\" metric
 * \"loss\" steps 128..191: block chunk 0: checksum mismatch") and a
 * summary line; errors opening to errout. Returns 0 when clean, 1 when
 * damage was found, 2 when the database cannot be opened or read. */
int integrity_check(const char *path, FILE *out, FILE *errout);

#endif
