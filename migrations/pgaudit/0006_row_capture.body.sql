DECLARE
    v_encoding pg_catalog.text;
BEGIN
    -- Runs with the writer's search_path (no SET clause, see the .up.sql):
    -- every function, operator, table and type here is schema-qualified.
    -- Images are made in UTF8 whatever the writer's client_encoding, which
    -- record_send converts text to (see 0003_capture_function.body.sql).
    IF pg_catalog.current_setting('client_encoding') OPERATOR(pg_catalog.<>) 'UTF8'
       AND pg_catalog.current_setting('server_encoding') OPERATOR(pg_catalog.<>) 'SQL_ASCII' THEN
        v_encoding := pg_catalog.current_setting('client_encoding');
        PERFORM pg_catalog.set_config('client_encoding', 'UTF8', true);
    END IF;
    -- One audit row per changed row. An UPDATE that moves a row into
    -- another partition fires DELETE on the old partition and INSERT on the
    -- new one, as PostgreSQL's logical replication reports it.
    IF TG_OP OPERATOR(pg_catalog.=) 'INSERT' THEN
        INSERT INTO {{.Table}} (txid, schema_name, table_name, op, after, image_schema, image_table, image_relid)
        VALUES (pg_catalog.pg_current_xact_id(), TG_ARGV[0], TG_ARGV[1], 'c', pg_catalog.record_send(NEW), TG_TABLE_SCHEMA, TG_TABLE_NAME, TG_RELID);
    ELSIF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' THEN
        INSERT INTO {{.Table}} (txid, schema_name, table_name, op, before, after, image_schema, image_table, image_relid)
        VALUES (pg_catalog.pg_current_xact_id(), TG_ARGV[0], TG_ARGV[1], 'u', pg_catalog.record_send(OLD), pg_catalog.record_send(NEW), TG_TABLE_SCHEMA, TG_TABLE_NAME, TG_RELID);
    ELSE
        INSERT INTO {{.Table}} (txid, schema_name, table_name, op, before, image_schema, image_table, image_relid)
        VALUES (pg_catalog.pg_current_xact_id(), TG_ARGV[0], TG_ARGV[1], 'd', pg_catalog.record_send(OLD), TG_TABLE_SCHEMA, TG_TABLE_NAME, TG_RELID);
    END IF;
    -- A wake-up only when a task waits for one (docs/decisions/0045); a
    -- transaction's identical notifications are sent once.
    IF COALESCE(pg_catalog.pg_sequence_last_value({{.WaitersLiteral}}::pg_catalog.regclass), 1) OPERATOR(pg_catalog.>) 0 THEN
        PERFORM pg_catalog.pg_notify({{.Channel}}, '');
    END IF;
    IF v_encoding IS NOT NULL THEN
        PERFORM pg_catalog.set_config('client_encoding', v_encoding, true);
    END IF;
    RETURN NULL;
END
