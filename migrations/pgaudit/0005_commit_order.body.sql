DECLARE
    v_id pg_catalog.int8;
BEGIN
    -- Runs at COMMIT, once per audit row the transaction wrote (a deferred
    -- constraint trigger is row-level, its events fire in the order they
    -- were queued). It gives the transaction's rows ids drawn as it
    -- commits, in the order they were written. Tasks read in id order, so
    -- they read in the order transactions reached COMMIT; a transaction
    -- that read or overwrote another's changes in a statement reached
    -- COMMIT after that one had become visible, so such transactions leave
    -- in their order (docs/decisions/0046). Writers do not wait for each
    -- other's commits.
    --
    -- A row whose id is still the last one drawn keeps it: a new id would
    -- be the next one, with nothing drawn in between, so it would stand in
    -- the same place among all ids, and the update (a dead tuple, an index
    -- entry, WAL) is saved. That is the common case of a short
    -- transaction: nobody drew an id between its statement and its COMMIT.
    IF pg_catalog.pg_sequence_last_value(@id_sequence@::pg_catalog.regclass) OPERATOR(pg_catalog.=) NEW.id THEN
        RETURN NULL;
    END IF;
    -- Renumbered already, with the transaction's first row.
    IF NOT EXISTS (SELECT FROM {{.Table}} WHERE id OPERATOR(pg_catalog.=) NEW.id) THEN
        RETURN NULL;
    END IF;
    -- The first row renumbers every row of the transaction from it on, in
    -- one block: under a lock of this audit table that only renumbering
    -- takes, and only for these updates, so no other transaction draws a
    -- commit-time id in between and transactions committing at the same
    -- moment do not interleave. The holder waits for nothing (its own rows,
    -- fresh ids), and the lock is a session lock released at once, also on
    -- error: it is not held through the commit.
    PERFORM pg_catalog.pg_advisory_lock({{.OrderLockBase}}::pg_catalog.int8 OPERATOR(pg_catalog.+) TG_RELID::pg_catalog.int8);
    BEGIN
        FOR v_id IN SELECT a.id FROM {{.Table}} a
                    WHERE a.id OPERATOR(pg_catalog.>=) NEW.id AND a.txid OPERATOR(pg_catalog.=) NEW.txid
                    ORDER BY a.id LOOP
            UPDATE {{.Table}} SET id = DEFAULT WHERE id OPERATOR(pg_catalog.=) v_id;
        END LOOP;
    EXCEPTION WHEN OTHERS OR query_canceled THEN
        PERFORM pg_catalog.pg_advisory_unlock({{.OrderLockBase}}::pg_catalog.int8 OPERATOR(pg_catalog.+) TG_RELID::pg_catalog.int8);
        RAISE;
    END;
    PERFORM pg_catalog.pg_advisory_unlock({{.OrderLockBase}}::pg_catalog.int8 OPERATOR(pg_catalog.+) TG_RELID::pg_catalog.int8);
    RETURN NULL;
END
