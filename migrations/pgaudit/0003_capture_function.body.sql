DECLARE
    v_txid     xid8 := pg_catalog.pg_current_xact_id();
    v_rows     bigint := 0;
    v_work_mem text;
    -- The configured table the changes belong to: the name the trigger
    -- was made with (a trigger made before triggers had arguments: the
    -- table it is on). When the table has another name now, the images
    -- are of the table under that name (docs/decisions/0049).
    v_schema     text := COALESCE(TG_ARGV[0], TG_TABLE_SCHEMA);
    v_table      text := COALESCE(TG_ARGV[1], TG_TABLE_NAME);
    v_img_schema text;
    v_img_table  text;
    v_img_relid  oid;
BEGIN
    IF v_table <> TG_TABLE_NAME OR v_schema <> TG_TABLE_SCHEMA THEN
        v_img_schema := TG_TABLE_SCHEMA;
        v_img_table := TG_TABLE_NAME;
        v_img_relid := TG_RELID;
    END IF;
    -- The first {{.Single}} changed rows of a statement get one audit row
    -- each (the cheapest shape for the many single-row statements); only a
    -- statement that changed more pays for grouping the rest, {{.Chunk}} rows
    -- per audit row, which is what keeps bulk statements cheap. Groups are
    -- arrays of record_send images (bytea[]): n.* rather than n names the
    -- whole row even when the table has a column called n.
    IF TG_OP = 'INSERT' THEN
        INSERT INTO {{.Table}} (txid, schema_name, table_name, image_schema, image_table, image_relid, op, after)
        SELECT v_txid, v_schema, v_table, v_img_schema, v_img_table, v_img_relid, 'c', pg_catalog.record_send(n.*)
        FROM tidyconnect_new n LIMIT {{.Single}};
        GET DIAGNOSTICS v_rows = ROW_COUNT;
        IF v_rows = {{.Single}} THEN
            -- Grouping holds the whole rest in a hash table: spilling it to
            -- disk would cost more than the grouping saves.
            v_work_mem := pg_catalog.current_setting('work_mem');
            PERFORM pg_catalog.set_config('work_mem', '64MB', true);
            INSERT INTO {{.Table}} (txid, schema_name, table_name, image_schema, image_table, image_relid, op, changes, after)
            SELECT v_txid, v_schema, v_table, v_img_schema, v_img_table, v_img_relid, 'c', pg_catalog.count(*),
                   pg_catalog.array_send(pg_catalog.array_agg(g.r))
            FROM (SELECT pg_catalog.row_number() OVER () AS rn, pg_catalog.record_send(n.*) AS r FROM tidyconnect_new n) g
            WHERE g.rn > {{.Single}}
            GROUP BY (g.rn - {{.Single}} - 1) / {{.Chunk}}
            ORDER BY (g.rn - {{.Single}} - 1) / {{.Chunk}};
            PERFORM pg_catalog.set_config('work_mem', v_work_mem, true);
        END IF;
    ELSIF TG_OP = 'UPDATE' THEN
        -- Old and new images pair by position: unnest of two arrays walks
        -- them in step. Cheaper for a single-row UPDATE than numbering
        -- both sides and joining them (about 7% more UPDATEs per second in
        -- pgbench, docs/pgaudit.md). Multi-array unnest is FROM-clause
        -- syntax and cannot be schema-qualified; search_path is pg_catalog.
        INSERT INTO {{.Table}} (txid, schema_name, table_name, image_schema, image_table, image_relid, op, before, after)
        SELECT v_txid, v_schema, v_table, v_img_schema, v_img_table, v_img_relid, 'u', u.o, u.n
        FROM unnest(ARRAY(SELECT pg_catalog.record_send(o.*) FROM tidyconnect_old o LIMIT {{.Single}}),
                    ARRAY(SELECT pg_catalog.record_send(n.*) FROM tidyconnect_new n LIMIT {{.Single}})) AS u(o, n);
        GET DIAGNOSTICS v_rows = ROW_COUNT;
        IF v_rows = {{.Single}} THEN
            v_work_mem := pg_catalog.current_setting('work_mem');
            PERFORM pg_catalog.set_config('work_mem', '64MB', true);
            INSERT INTO {{.Table}} (txid, schema_name, table_name, image_schema, image_table, image_relid, op, changes, before, after)
            SELECT v_txid, v_schema, v_table, v_img_schema, v_img_table, v_img_relid, 'u', o.cnt, o.img, n.img
            FROM (SELECT (g.rn - {{.Single}} - 1) / {{.Chunk}} AS chunk, pg_catalog.count(*) AS cnt,
                         pg_catalog.array_send(pg_catalog.array_agg(g.r)) AS img
                  FROM (SELECT pg_catalog.row_number() OVER () AS rn, pg_catalog.record_send(o.*) AS r FROM tidyconnect_old o) g
                  WHERE g.rn > {{.Single}} GROUP BY 1) o
            JOIN (SELECT (g.rn - {{.Single}} - 1) / {{.Chunk}} AS chunk,
                         pg_catalog.array_send(pg_catalog.array_agg(g.r)) AS img
                  FROM (SELECT pg_catalog.row_number() OVER () AS rn, pg_catalog.record_send(n.*) AS r FROM tidyconnect_new n) g
                  WHERE g.rn > {{.Single}} GROUP BY 1) n
              ON o.chunk = n.chunk
            ORDER BY o.chunk;
            PERFORM pg_catalog.set_config('work_mem', v_work_mem, true);
        END IF;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO {{.Table}} (txid, schema_name, table_name, image_schema, image_table, image_relid, op, before)
        SELECT v_txid, v_schema, v_table, v_img_schema, v_img_table, v_img_relid, 'd', pg_catalog.record_send(o.*)
        FROM tidyconnect_old o LIMIT {{.Single}};
        GET DIAGNOSTICS v_rows = ROW_COUNT;
        IF v_rows = {{.Single}} THEN
            v_work_mem := pg_catalog.current_setting('work_mem');
            PERFORM pg_catalog.set_config('work_mem', '64MB', true);
            INSERT INTO {{.Table}} (txid, schema_name, table_name, image_schema, image_table, image_relid, op, changes, before)
            SELECT v_txid, v_schema, v_table, v_img_schema, v_img_table, v_img_relid, 'd', pg_catalog.count(*),
                   pg_catalog.array_send(pg_catalog.array_agg(g.r))
            FROM (SELECT pg_catalog.row_number() OVER () AS rn, pg_catalog.record_send(o.*) AS r FROM tidyconnect_old o) g
            WHERE g.rn > {{.Single}}
            GROUP BY (g.rn - {{.Single}} - 1) / {{.Chunk}}
            ORDER BY (g.rn - {{.Single}} - 1) / {{.Chunk}};
            PERFORM pg_catalog.set_config('work_mem', v_work_mem, true);
        END IF;
    ELSIF TG_OP = 'TRUNCATE' THEN
        -- The image columns say which table was truncated when it is not
        -- the one the changes are filed under (renamed since).
        INSERT INTO {{.Table}} (txid, schema_name, table_name, image_schema, image_table, image_relid, op)
        VALUES (v_txid, v_schema, v_table, v_img_schema, v_img_table, v_img_relid, 't');
        v_rows := 1;
    END IF;
    -- A wake-up only, and only when a task is waiting for one: a NOTIFY
    -- serializes the commits of all notifying transactions (a database-wide
    -- lock held through the commit), which would make concurrent writers
    -- wait for each other while the tasks are busy anyway. The tasks keep
    -- the number of waiting tasks in a sequence, which PL/pgSQL reads
    -- without running a query (docs/decisions/0045). NULL (never set, or
    -- a server that answers NULL where it cannot tell) means notify.
    IF v_rows > 0 AND COALESCE(pg_catalog.pg_sequence_last_value({{.WaitersLiteral}}::pg_catalog.regclass), 1) > 0 THEN
        PERFORM pg_catalog.pg_notify({{.Channel}}, '');
    END IF;
    RETURN NULL;
END
