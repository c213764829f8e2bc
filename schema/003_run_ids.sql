-- entropyd schema, migration 3: run ids are never reused. runs.id is an
-- INTEGER PRIMARY KEY without AUTOINCREMENT, so deleting the newest run
-- would hand its id to the next one, and old links and stream filters would
-- point at a different run. The writer takes new ids from this counter.
CREATE TABLE id_seq (
  name TEXT PRIMARY KEY,
  last INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO id_seq(name, last) VALUES ('runs', (SELECT coalesce(max(id), 0) FROM runs));
