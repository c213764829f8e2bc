-- entropyd schema, migration 8: sealed blocks one row per chunk of cells
-- (schema/storage.md, "Blocks"; daemon/fblock_rows.h). A block of a 12x12
-- metric was one ~20 KB row of `blocks` holding all nine 16-cell chunks:
-- a series of one head read a row (and its own page, or two) per block,
-- and the 2-16 KB part SQLite keeps on a row's leaf page packed badly
-- (~0.4 bytes a value of free space). Here a row is one chunk of one
-- block (~2.5 KB: inside a leaf page, no overflow), keyed by metric,
-- chunk, then block, so one head's chunks of consecutive blocks are
-- consecutive rows sharing pages. Blocks sealed before stay in `blocks`,
-- read as they are (never rewritten); new blocks are sealed here.
CREATE TABLE block_chunks (
  metric_id INTEGER NOT NULL,
  chunk     INTEGER NOT NULL,   -- cells [chunk*16, chunk*16 + 16) of every frame
  block     INTEGER NOT NULL,   -- steps [block*64, block*64 + 63]
  mask      INTEGER NOT NULL,   -- bit i set: step block*64 + i is in the block (the same in every chunk)
  data      BLOB NOT NULL,      -- the chunk coded (fblock.h, format 3)
  PRIMARY KEY (metric_id, chunk, block)
) WITHOUT ROWID;
