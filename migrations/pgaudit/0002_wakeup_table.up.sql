-- Which tasks are waiting for a NOTIFY. Unlogged: after a crash it is empty
-- and tasks mark themselves again before they next wait.
CREATE UNLOGGED TABLE IF NOT EXISTS {{.Wakeup}} (
    task    int PRIMARY KEY,
    waiting boolean NOT NULL
);
COMMENT ON TABLE {{.Wakeup}} IS {{.Marker}};
