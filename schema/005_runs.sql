-- entropyd schema, migration 5: many runs (issue 15). Each run's summary and
-- verdict, kept by the daemon as data arrives so that listing runs never
-- reads frames, and why an alert closed.

-- One row per run that has sent anything (a run without one is healthy and
-- has no summary yet). verdict: see docs (alerts, "Verdicts").
CREATE TABLE IF NOT EXISTS run_summary (
  run_id      INTEGER PRIMARY KEY REFERENCES runs(id) ON DELETE CASCADE,
  verdict     TEXT NOT NULL DEFAULT 'healthy'
              CHECK (verdict IN ('healthy','collapsing','collapsed','diverged','stalled')),
  since_step  INTEGER,                 -- the step the condition behind the verdict began
  heads       TEXT NOT NULL DEFAULT '[]',  -- JSON [[layer, head], ...] behind it
  rule        TEXT,                    -- the alert rule behind it
  last_loss   REAL,                    -- the scalar `loss` of the latest step that had one
  min_entropy REAL                     -- min entropy_norm over every head and step stored
);
CREATE INDEX IF NOT EXISTS run_summary_verdict ON run_summary(verdict, run_id);
CREATE INDEX IF NOT EXISTS runs_created ON runs(created, id);

-- NULL for an alert that resolved because its condition cleared;
-- 'run_ended' / 'run_deleted' when it closed because its run did.
ALTER TABLE alerts ADD COLUMN reason TEXT;
