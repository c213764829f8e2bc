-- entropyd schema, migration 4: costs that stay flat in a run's history.

-- The latest frame of every metric, upserted by the writer in the same
-- transaction as the frame: /metrics reads one row per exported metric here
-- instead of a max(step) over the frames of every metric ever stored.
CREATE TABLE latest (
  metric_id INTEGER PRIMARY KEY,
  step      INTEGER NOT NULL,
  data      BLOB NOT NULL
);
INSERT INTO latest(metric_id, step, data)
  SELECT f.metric_id, f.step, f.data FROM metrics m
  JOIN frames f ON f.metric_id = m.id AND f.step = (SELECT max(step) FROM frames WHERE metric_id = m.id);

-- Rows still to be deleted after a DELETE of a run, deleted by the writer in
-- short transactions between other work (so no trainer waits behind a big
-- run's delete). kind 0: frames, rollups and latest of metric `id`; kind 1:
-- abandoned_frames of branch `id`; kind 2: steps of run `id`. Ids listed
-- here are not reused by new metrics or branches until their rows are gone.
CREATE TABLE purge (
  kind INTEGER NOT NULL CHECK (kind IN (0,1,2)),
  id   INTEGER NOT NULL,
  PRIMARY KEY (kind, id)
) WITHOUT ROWID;

-- A rollback (rewind) in progress: the frames and steps of `run_id` at or
-- after from_step move to branch `branch_id` a chunk per transaction; the
-- row goes when none is left.
CREATE TABLE rewinds (
  run_id    INTEGER PRIMARY KEY REFERENCES runs(id) ON DELETE CASCADE,
  branch_id INTEGER NOT NULL,
  from_step INTEGER NOT NULL
);

-- abandoned_frames without its ON DELETE CASCADE from branches: deleting a
-- run would otherwise delete every abandoned frame in the same transaction.
-- Frames of a deleted branch are removed through `purge` instead.
CREATE TABLE abandoned_frames_new (
  branch_id INTEGER NOT NULL,
  metric_id INTEGER NOT NULL,
  step      INTEGER NOT NULL,
  data      BLOB NOT NULL
);
INSERT INTO abandoned_frames_new SELECT branch_id, metric_id, step, data FROM abandoned_frames;
DROP TABLE abandoned_frames;
ALTER TABLE abandoned_frames_new RENAME TO abandoned_frames;
CREATE INDEX abandoned_frames_branch ON abandoned_frames(branch_id, metric_id, step);
