DECLARE
    v_txid xid8 := pg_catalog.pg_current_xact_id();
    v_rows bigint := 0;
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO {{.Table}} (txid, schema_name, table_name, op, after)
        SELECT v_txid, TG_TABLE_SCHEMA, TG_TABLE_NAME, 'c', pg_catalog.to_json(n.*)
        FROM tidyconnect_new n;
        GET DIAGNOSTICS v_rows = ROW_COUNT;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO {{.Table}} (txid, schema_name, table_name, op, before, after)
        SELECT v_txid, TG_TABLE_SCHEMA, TG_TABLE_NAME, 'u', o.j, n.j
        FROM (SELECT pg_catalog.row_number() OVER () AS rn, pg_catalog.to_json(o.*) AS j FROM tidyconnect_old o) o
        JOIN (SELECT pg_catalog.row_number() OVER () AS rn, pg_catalog.to_json(n.*) AS j FROM tidyconnect_new n) n
          ON o.rn = n.rn
        ORDER BY o.rn;
        GET DIAGNOSTICS v_rows = ROW_COUNT;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO {{.Table}} (txid, schema_name, table_name, op, before)
        SELECT v_txid, TG_TABLE_SCHEMA, TG_TABLE_NAME, 'd', pg_catalog.to_json(o.*)
        FROM tidyconnect_old o;
        GET DIAGNOSTICS v_rows = ROW_COUNT;
    ELSIF TG_OP = 'TRUNCATE' THEN
        INSERT INTO {{.Table}} (txid, schema_name, table_name, op)
        VALUES (v_txid, TG_TABLE_SCHEMA, TG_TABLE_NAME, 't');
        v_rows := 1;
    END IF;
    -- A wake-up only, and only when a task is waiting for one: a NOTIFY
    -- serializes the commits of all notifying transactions (a database-wide
    -- lock held through the commit), which would make concurrent writers
    -- wait for each other while the tasks are busy anyway.
    IF v_rows > 0 AND EXISTS (SELECT 1 FROM {{.Wakeup}} WHERE waiting) THEN
        PERFORM pg_catalog.pg_notify({{.Channel}}, '');
    END IF;
    RETURN NULL;
END
