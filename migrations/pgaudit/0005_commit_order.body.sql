DECLARE
    v_last  pg_catalog.int8 := pg_catalog.pg_sequence_last_value(@id_sequence@::pg_catalog.regclass);
    v_seen  pg_catalog.text;
    v_mine  pg_catalog.int8;
    v_guc   pg_catalog.text;
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
    --
    -- Every RETURN says OLD, which in an AFTER INSERT trigger is an empty
    -- record: PL/pgSQL returns it as NULL without evaluating anything, where
    -- RETURN NULL is an expression it prepares anew in each transaction
    -- (about 1 500 instructions). An AFTER trigger's result is ignored.
    IF v_last OPERATOR(pg_catalog.=) NEW.id THEN
        RETURN OLD;
    END IF;
    -- The same holds for a run of rows: when every id from this row's to
    -- the last one drawn is the transaction's own, the run keeps its ids
    -- (a bulk statement's grouped rows, and above all row-level capture,
    -- one row per changed row). The first row's event decides for the run
    -- and notes up to which id it decided, keep (+) or renumber (-), in a
    -- transaction-local setting, so the run's other events neither count
    -- again nor decide otherwise; rows written later (by a deferred
    -- trigger during this COMMIT) have higher ids and decide anew, unless
    -- the transaction renumbers: then every later row is renumbered too.
    -- A row written during COMMIT while earlier rows were being renumbered
    -- is followed by their new ids, which would pass for a run of its own,
    -- but those rows were written before it and must stay before it
    -- (TestCommitOrderRowWrittenAtCommitAfterRenumberedRows). Events run
    -- in the order the rows were written, so renumbering each in turn
    -- keeps that order.
    v_guc := 'tidyconnect.order_' OPERATOR(pg_catalog.||) TG_RELID::pg_catalog.text;
    v_seen := pg_catalog.current_setting(v_guc, true);
    IF v_seen IS NOT NULL AND v_seen OPERATOR(pg_catalog.<>) '' THEN
        IF v_seen::pg_catalog.int8 OPERATOR(pg_catalog.<) 0 THEN
            UPDATE {{.Table}} SET id = DEFAULT WHERE id OPERATOR(pg_catalog.=) NEW.id;
            RETURN OLD;
        END IF;
        IF NEW.id OPERATOR(pg_catalog.<=) v_seen::pg_catalog.int8 THEN
            RETURN OLD;
        END IF;
    END IF;
    SELECT pg_catalog.count(*) INTO v_mine FROM {{.Table}} a
    WHERE a.id OPERATOR(pg_catalog.>=) NEW.id AND a.id OPERATOR(pg_catalog.<=) v_last AND a.txid OPERATOR(pg_catalog.=) NEW.txid;
    IF v_mine OPERATOR(pg_catalog.=) ((v_last OPERATOR(pg_catalog.-) NEW.id) OPERATOR(pg_catalog.+) 1) THEN
        PERFORM pg_catalog.set_config(v_guc, v_last::pg_catalog.text, true);
        RETURN OLD;
    END IF;
    PERFORM pg_catalog.set_config(v_guc, (OPERATOR(pg_catalog.-) v_last)::pg_catalog.text, true);
    UPDATE {{.Table}} SET id = DEFAULT WHERE id OPERATOR(pg_catalog.=) NEW.id;
    RETURN OLD;
END
