-- entropyd schema, migration 10: the verdict `sharp` and the verdict's
-- evidence (issue 34; docs/runs.md "Verdicts", docs/science.md "What
-- counts as an entropy collapse"). A collapse now needs harmed training:
-- heads that hold the collapse condition while the loss trains are `sharp`,
-- not `collapsed`. SQLite cannot change a CHECK constraint in place, so the
-- table is rebuilt (one row per run: small even at 10,000 runs).
CREATE TABLE run_summary_v10 (
  run_id      INTEGER PRIMARY KEY REFERENCES runs(id) ON DELETE CASCADE,
  verdict     TEXT NOT NULL DEFAULT 'healthy'
              CHECK (verdict IN ('healthy','collapsing','collapsed','diverged','stalled','sharp')),
  since_step  INTEGER,                 -- the step the condition behind the verdict began
  heads       TEXT NOT NULL DEFAULT '[]',  -- JSON [[layer, head], ...] behind it
  rule        TEXT,                    -- the alert rule behind it
  last_loss   REAL,                    -- the scalar `loss` of the latest step that had one
  min_entropy REAL,                    -- min entropy_norm over every head and step stored
  evidence    TEXT                     -- JSON: what the verdict rests on beside its heads
                                       -- ({"loss_opening", "loss_smoothed", "train_below"}), or NULL
);
INSERT INTO run_summary_v10(run_id, verdict, since_step, heads, rule, last_loss, min_entropy)
  SELECT run_id, verdict, since_step, heads, rule, last_loss, min_entropy FROM run_summary;
DROP TABLE run_summary;
ALTER TABLE run_summary_v10 RENAME TO run_summary;
CREATE INDEX IF NOT EXISTS run_summary_verdict ON run_summary(verdict, run_id);
