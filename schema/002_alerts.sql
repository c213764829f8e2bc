-- entropyd schema, migration 2: alerts, and the branches a rollback abandons.

-- One row per alert episode of a (run, rule) group: created when it starts
-- firing, updated as heads join or leave, closed when it resolves.
CREATE TABLE alerts (
  id          INTEGER PRIMARY KEY,
  run_id      INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
  rule        TEXT NOT NULL,
  severity    TEXT NOT NULL,
  fingerprint TEXT NOT NULL,
  state       TEXT NOT NULL CHECK (state IN ('firing','resolved')),
  starts_at   REAL NOT NULL,
  ends_at     REAL,
  start_step  INTEGER,          -- the step the condition began to hold
  last_step   INTEGER,          -- the step of the latest transition
  value       REAL,             -- worst value of the latest transition
  cells       TEXT NOT NULL,    -- JSON array of {layer, head, value}
  payload     TEXT NOT NULL     -- the latest Alertmanager alert object (JSON)
);
CREATE INDEX alerts_run ON alerts(run_id, id);
CREATE INDEX alerts_state ON alerts(state, id);

-- Every transition of every alert, in order.
CREATE TABLE alert_transitions (
  id         INTEGER PRIMARY KEY,
  alert_id   INTEGER NOT NULL REFERENCES alerts(id) ON DELETE CASCADE,
  time       REAL NOT NULL,
  step       INTEGER,
  transition TEXT NOT NULL CHECK (transition IN ('firing','update','resolved')),
  value      REAL,
  cells      TEXT NOT NULL
);
CREATE INDEX alert_transitions_alert ON alert_transitions(alert_id, id);

-- A trainer that rolls back to a checkpoint repeats steps. The steps it
-- abandons are moved here, apart from the branch that continued (which the
-- API and the dashboard show): one row per rollback, and the moved values.
CREATE TABLE branches (
  id        INTEGER PRIMARY KEY,
  run_id    INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
  from_step INTEGER NOT NULL,   -- the first abandoned step
  to_step   INTEGER NOT NULL,   -- the last abandoned step
  time      REAL NOT NULL
);
CREATE INDEX branches_run ON branches(run_id, id);

CREATE TABLE abandoned_frames (
  branch_id INTEGER NOT NULL REFERENCES branches(id) ON DELETE CASCADE,
  metric_id INTEGER NOT NULL,
  step      INTEGER NOT NULL,
  data      BLOB NOT NULL
);
CREATE INDEX abandoned_frames_branch ON abandoned_frames(branch_id, metric_id, step);
