BEGIN
    -- Runs at COMMIT, once per audit row the transaction wrote (a deferred
    -- constraint trigger is row-level): the row's statement-time id becomes
    -- an id drawn as the transaction commits, and rows are renumbered in
    -- the order they were written. Tasks read in id order, so they read in
    -- the order transactions entered COMMIT; a transaction that read or
    -- overwrote another's changes entered COMMIT after that one had become
    -- visible, so dependent transactions always leave in their order. No
    -- lock: writers do not wait for each other (docs/decisions/0046).
    UPDATE {{.Table}} SET id = DEFAULT WHERE id = NEW.id;
    RETURN NULL;
END
