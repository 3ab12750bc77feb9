BEGIN
    -- Runs at COMMIT, once per audit row the transaction wrote (a deferred
    -- constraint trigger is row-level): the row's statement-time id becomes
    -- an id drawn as the transaction commits, and rows are renumbered in
    -- the order they were written. Tasks read in id order, so they read in
    -- the order transactions entered COMMIT; a transaction that read or
    -- overwrote another's changes entered COMMIT after that one had become
    -- visible, so dependent transactions always leave in their order. No
    -- lock: writers do not wait for each other (docs/decisions/0046).
    --
    -- A row whose id is still the last one drawn keeps it: a new id would
    -- be the next one, with nothing drawn in between, so it would stand in
    -- the same place among all ids, and the update (a dead tuple, an index
    -- entry, WAL) is saved. That is the common case of a short
    -- transaction: nobody drew an id between its statement and its COMMIT.
    -- Any row of the transaction written after this one is a later id, so
    -- the transaction's earlier rows are always renumbered when a later
    -- one exists.
    --
    -- Rows are renumbered one by one, without a lock: a transaction
    -- committing at the same moment can draw ids between them, so the
    -- changes of two such transactions can interleave (each in its own
    -- order). Renumbering a transaction's rows in one block under a short
    -- lock prevented that, but cost single-row writers about a quarter of
    -- their throughput (docs/decisions/0046).
    IF pg_catalog.pg_sequence_last_value(@id_sequence@::pg_catalog.regclass) OPERATOR(pg_catalog.=) NEW.id THEN
        RETURN NULL;
    END IF;
    UPDATE {{.Table}} SET id = DEFAULT WHERE id = NEW.id;
    RETURN NULL;
END
