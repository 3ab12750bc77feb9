BEGIN
    -- Runs at COMMIT, once per audit row the transaction wrote (a deferred
    -- constraint trigger is row-level). The first run takes one lock that
    -- every capturing commit of the database takes, and holds it until the
    -- transaction has committed: PostgreSQL releases transaction locks only
    -- after the commit is visible. Ids drawn under it are therefore larger
    -- than the ids of every transaction that committed before, and smaller
    -- than those of every later one, so id order is commit order
    -- (docs/decisions/0046). One key for all connectors: two keys taken in
    -- different orders by two transactions would deadlock.
    IF pg_catalog.current_setting('tidyconnect.commit_order', true) IS DISTINCT FROM NEW.txid::text THEN
        PERFORM pg_catalog.pg_advisory_xact_lock({{.OrderLockKey}});
        -- Transaction-local, and undone with the lock when a savepoint
        -- that took it rolls back.
        PERFORM pg_catalog.set_config('tidyconnect.commit_order', NEW.txid::text, true);
    END IF;
    -- The row's statement-time id becomes its commit-time id; rows are
    -- renumbered in the order they were written.
    UPDATE {{.Table}} SET id = DEFAULT WHERE id = NEW.id;
    RETURN NULL;
END
