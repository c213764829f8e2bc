-- entropyd schema, migration 1. Applied in one transaction at start; the
-- daemon records the version in PRAGMA user_version (see schema/storage.md).

CREATE TABLE runs (
  id        INTEGER PRIMARY KEY,
  name      TEXT NOT NULL UNIQUE,
  status    TEXT NOT NULL CHECK (status IN ('live','stale','finished','failed','aborted')),
  created   REAL NOT NULL,          -- Unix seconds
  updated   REAL NOT NULL,          -- Unix seconds of the last committed message
  layers    INTEGER NOT NULL,
  heads     INTEGER NOT NULL,
  seq_len   INTEGER NOT NULL,
  meta      TEXT NOT NULL DEFAULT '{}',  -- JSON object, verbatim from hello
  last_seq  INTEGER NOT NULL DEFAULT 0,  -- highest committed seq (exactly-once)
  last_step INTEGER                      -- highest stored step, NULL before any
);

-- One row per metric name of a run. kind: 0 scalar (1 value), 1 layer
-- (L values), 2 head (L*H values, layer-major).
CREATE TABLE metrics (
  id      INTEGER PRIMARY KEY,
  run_id  INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
  name    TEXT NOT NULL,
  kind    INTEGER NOT NULL CHECK (kind IN (0,1,2)),
  UNIQUE (run_id, name)
);

-- The steps of a run, with the trainer's clock and the seq that carried them.
CREATE TABLE steps (
  run_id INTEGER NOT NULL,
  step   INTEGER NOT NULL,
  seq    INTEGER NOT NULL,
  time   REAL NOT NULL,
  PRIMARY KEY (run_id, step)
) WITHOUT ROWID;

-- Raw values: one row per metric and step holding all its values as a
-- little-endian float32 array (NaN where the trainer sent null). A rowid
-- table so that rows are appended at the end of the b-tree and pages fill
-- completely (keyed by (metric_id, step) they would be inserted in many
-- places at once and pages would split half-empty); the index is small.
CREATE TABLE frames (
  id        INTEGER PRIMARY KEY,
  metric_id INTEGER NOT NULL,
  step      INTEGER NOT NULL,
  data      BLOB NOT NULL
);
CREATE UNIQUE INDEX frames_metric_step ON frames(metric_id, step);

-- Exact summaries of aligned step blocks, for fast downsampled history.
-- Level k covers blocks of 64 * 8^(k-1) steps: block b is steps
-- [b*size, (b+1)*size). data holds per value {f32 min, f32 max, f64 sum,
-- u32 finite count} (20 bytes, little-endian); nframes counts the frames
-- in the block, so non-finite = nframes - finite count.
-- (A rowid table for the same reason as frames.)
CREATE TABLE rollups (
  id        INTEGER PRIMARY KEY,
  metric_id INTEGER NOT NULL,
  level     INTEGER NOT NULL,
  block     INTEGER NOT NULL,
  nframes   INTEGER NOT NULL,
  data      BLOB NOT NULL
);
CREATE UNIQUE INDEX rollups_metric_level_block ON rollups(metric_id, level, block);

CREATE TABLE events (
  id      INTEGER PRIMARY KEY,
  run_id  INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
  seq     INTEGER,                 -- NULL for events the daemon wrote itself
  time    REAL NOT NULL,
  level   TEXT NOT NULL CHECK (level IN ('info','warn','error')),
  text    TEXT NOT NULL
);
CREATE INDEX events_run ON events(run_id, id);
