-- entropyd schema, migration 8: sealed blocks one row per chunk of cells
-- (schema/storage.md, "Blocks"; daemon/fblock_rows.h). A block of a 12x12
-- metric was one ~20 KB row of `blocks` holding all nine 16-cell chunks:
-- a series of one head read a row (its own page or two) per block. Here a
-- row is one chunk of one block (~2.5 KB, inside its leaf page), and its
-- rowid orders the rows by metric, chunk, then block, so one head's chunks
-- of consecutive blocks are consecutive rows of the same few pages.
--
-- A rowid table, not WITHOUT ROWID keyed (metric_id, chunk, block): there
-- the inner pages of the b-tree hold whole rows (~5 to a page, a tree 5
-- deep, 16% of its pages inner ones); here they hold rowids only.
-- Blocks sealed before stay in `blocks`, read as they are (never
-- rewritten); new blocks are sealed here.
CREATE TABLE block_series (
  metric_id INTEGER PRIMARY KEY,  -- a metric with chunk rows
  base      INTEGER NOT NULL,     -- its chunk k is series base + k
  chunks    INTEGER NOT NULL      -- how many chunks (series) it has: bases + chunks <= the next base
);
-- the next series base: bases are handed out in order, never reused
INSERT INTO id_seq(name, last) VALUES ('block_series', 0);
CREATE TABLE block_chunks (
  id   INTEGER PRIMARY KEY,  -- (base + chunk) * 2^26 + block: chunk = cells [chunk*16, chunk*16 + 16)
  mask INTEGER NOT NULL,     -- bit i set: step block*64 + i is in the block (the same in every chunk)
  data BLOB NOT NULL         -- the chunk coded (fblock.h, format 3)
);
