-- entropyd schema, migration 7: rollups clustered by (metric, level, block).
-- A series reads one metric's rows of one level in block order: as a
-- rowid table (rows in arrival order, the rows of every metric and level
-- interleaved) each row sat on its own page behind an index lookup, and a
-- 1000-point series of a 1M-step run read ~2000 pages; keyed by its
-- primary key, a row's neighbours in the series share its page (5 rows of
-- a 12x12 metric to a 16 KiB page) and the index is the table. The cost is
-- pages ~85% full instead of ~100% (rollups are ~15% of the database).
CREATE TABLE rollups_clustered (
  metric_id INTEGER NOT NULL,
  level     INTEGER NOT NULL,
  block     INTEGER NOT NULL,
  nframes   INTEGER NOT NULL,
  data      BLOB NOT NULL,
  PRIMARY KEY (metric_id, level, block)
) WITHOUT ROWID;
INSERT INTO rollups_clustered(metric_id, level, block, nframes, data)
  SELECT metric_id, level, block, nframes, data FROM rollups ORDER BY metric_id, level, block;
DROP TABLE rollups;
ALTER TABLE rollups_clustered RENAME TO rollups;
