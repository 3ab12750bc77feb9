BEGIN
    -- Runs at COMMIT, once per audit row the transaction wrote (a deferred
    -- constraint trigger is row-level). Every capturing commit of the
    -- database takes this one lock and holds it until the transaction has
    -- committed: PostgreSQL releases transaction locks only after the
    -- commit is visible. Ids drawn under it are therefore larger than the
    -- ids of every transaction that committed before, and smaller than
    -- those of every later one, so id order is commit order
    -- (docs/decisions/0046). One key for all connectors: two keys taken in
    -- different orders by two transactions would deadlock. Asking again
    -- while holding it only counts up in the backend's own lock table.
    PERFORM pg_catalog.pg_advisory_xact_lock({{.OrderLockKey}});
    -- The row's statement-time id becomes its commit-time id; rows are
    -- renumbered in the order they were written.
    UPDATE {{.Table}} SET id = DEFAULT WHERE id = NEW.id;
    RETURN NULL;
END
