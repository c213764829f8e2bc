-- entropyd schema, migration 9: rollups one row per chunk of 64 cells
-- (schema/storage.md, "Rollups"; daemon/rollup.h). A rollup row held every
-- cell of its metric: ~5.7 KB for a 32x32 head metric, past the ~4 KB a
-- row of this table keeps in its page, so each spilled to an overflow page,
-- and a series of one head read all 1,024 cells of every row to use one
-- (a 1000-point series of a 100k-step run: 1,563 rows, ~9 MB). Here a row
-- is one chunk of 64 cells of one block, keyed so that one chunk's blocks
-- of one level are neighbours; a metric of several chunks keeps the total
-- of all its cells (what the dashboard's default series reads) in
-- `rollup_totals`, a small row per block.
--
-- Metrics of at most 64 values keep their rows as they were (chunk 0).
-- Wider ones are left in rollups_v8 here and recoded by entropyd in the
-- same transaction (store.c, migrate_rollup_chunks), which then drops it.
ALTER TABLE rollups RENAME TO rollups_v8;
CREATE TABLE rollups (
  metric_id INTEGER NOT NULL,
  level     INTEGER NOT NULL,
  chunk     INTEGER NOT NULL,  -- cells [chunk * 64, chunk * 64 + 64) of the frame
  block     INTEGER NOT NULL,
  nframes   INTEGER NOT NULL,
  data      BLOB NOT NULL,     -- rollup.h: with its total for a metric of one chunk, else without
  PRIMARY KEY (metric_id, level, chunk, block)
) WITHOUT ROWID;
-- one row per block of a metric of several chunks
CREATE TABLE rollup_totals (
  metric_id INTEGER NOT NULL,
  level     INTEGER NOT NULL,
  block     INTEGER NOT NULL,
  nframes   INTEGER NOT NULL,
  data      BLOB NOT NULL,     -- rollup_total_encode; empty: no total (pool the cells)
  PRIMARY KEY (metric_id, level, block)
) WITHOUT ROWID;
-- rows of metrics already deleted (waiting in `purge`) go to chunk 0 too:
-- nothing reads them, and the purge deletes them by metric
INSERT INTO rollups(metric_id, level, chunk, block, nframes, data)
  SELECT o.metric_id, o.level, 0, o.block, o.nframes, o.data FROM rollups_v8 o
  WHERE NOT EXISTS (SELECT 1 FROM metrics m JOIN runs r ON r.id = m.run_id WHERE m.id = o.metric_id
                    AND (CASE m.kind WHEN 2 THEN r.layers * r.heads WHEN 1 THEN r.layers ELSE 1 END) > 64)
  ORDER BY o.metric_id, o.level, o.block;
DELETE FROM rollups_v8 WHERE NOT EXISTS (SELECT 1 FROM metrics m JOIN runs r ON r.id = m.run_id WHERE m.id = rollups_v8.metric_id
                    AND (CASE m.kind WHEN 2 THEN r.layers * r.heads WHEN 1 THEN r.layers ELSE 1 END) > 64);
