-- entropyd schema, migration 6: frames compressed at rest (schema/storage.md,
-- "Blocks"). Once a block of 64 steps of a metric is complete (a frame of
-- that metric arrives at a later block), its raw frames are coded into one
-- row here (daemon/fblock.h) and deleted from `frames`, in the same
-- transaction as the block's level-1 rollup: `frames` then holds only the
-- open block of each metric (and, in a database upgraded from migration 5,
-- the frames stored before it, which stay raw and readable).
CREATE TABLE blocks (
  id        INTEGER PRIMARY KEY,   -- a rowid table: rows are appended, pages fill (as frames)
  metric_id INTEGER NOT NULL,
  block     INTEGER NOT NULL,      -- steps [block*64, block*64 + 63]
  mask      INTEGER NOT NULL,      -- bit i set: step block*64 + i is in the block (frame order)
  data      BLOB NOT NULL          -- the coded frames (fblock.h)
);
CREATE UNIQUE INDEX blocks_metric_block ON blocks(metric_id, block);
