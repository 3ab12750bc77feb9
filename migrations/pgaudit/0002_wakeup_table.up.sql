-- Which tasks are waiting for a NOTIFY. Unlogged: after a crash it is empty
-- and tasks mark themselves again before they next wait.
CREATE UNLOGGED TABLE IF NOT EXISTS {{.Wakeup}} (
    task    int PRIMARY KEY,
    waiting boolean NOT NULL
);
COMMENT ON TABLE {{.Wakeup}} IS {{.Marker}};
-- How many rows of the wake-up table say waiting, set by the tasks under a
-- lock on the table. Writers read it with pg_sequence_last_value, a plain
-- function call in PL/pgSQL, instead of querying the table: a query per
-- captured statement costs writers about 15% (docs/decisions/0045).
-- OWNED BY the table: dropping the table drops it.
CREATE SEQUENCE IF NOT EXISTS {{.Waiters}} AS bigint MINVALUE 0 START 0 OWNED BY {{.Wakeup}}.task;
COMMENT ON SEQUENCE {{.Waiters}} IS {{.Marker}};
-- This file runs only when the table or the sequence is missing, and the
-- sequence goes with the table: it is new, and no task waits yet. Without
-- this it would read NULL, which the trigger takes as "notify".
SELECT pg_catalog.setval({{.WaitersLiteral}}::pg_catalog.regclass, 0, true);
