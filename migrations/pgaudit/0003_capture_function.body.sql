-- Every initializer, every IF and RETURN NULL is an expression that
-- PL/pgSQL prepares again in each transaction (1 500 to a few thousand
-- instructions each), which a single-row transaction pays in full: the
-- transaction id is read in the INSERTs themselves, v_rows is set by each
-- branch, the rare cases before and after the first rows are asked for by
-- one IF each, and the function returns OLD (see the end).
DECLARE
    v_rows     pg_catalog.int8;
    v_work_mem pg_catalog.text;
    v_hashagg  pg_catalog.text;
    v_over     pg_catalog.bool;
    v_big      pg_catalog.bool;
    v_limit    pg_catalog.int8;
    -- The configured table the changes belong to: the name the trigger
    -- was made with (a trigger made before triggers had arguments: the
    -- table it is on). When the table has another name now, the images
    -- are of the table under that name (docs/decisions/0049). NULL while
    -- the table has the name the trigger was made with (the common case,
    -- left without an initializer): the INSERTs then take TG_TABLE_*.
    v_schema     pg_catalog.text;
    v_table      pg_catalog.text;
    v_img_schema pg_catalog.text;
    v_img_table  pg_catalog.text;
    v_img_relid  pg_catalog.oid;
    v_encoding   pg_catalog.text;
BEGIN
    -- record_send converts text, varchar, json, jsonb, enum labels and
    -- the like to the writer's client_encoding, and the task reads images
    -- as UTF8: a LATIN1 writer's images would come out garbled or as hex,
    -- and a character its encoding lacks would fail the captured write.
    -- Images are made in UTF8 whatever the writer's encoding (set back
    -- before returning; an error rolls it back). A SQL_ASCII database
    -- converts nothing. Writers in UTF8 pay only for the comparison.
    -- The same IF asks whether the table is no longer called what the
    -- trigger's arguments say (a trigger without arguments: TG_ARGV is
    -- NULL, so is the comparison, and the names are the table's own); both
    -- are rare, and one expression for both is cheaper than two.
    IF pg_catalog.current_setting('client_encoding') OPERATOR(pg_catalog.<>) 'UTF8'
       OR TG_ARGV[1] OPERATOR(pg_catalog.<>) TG_TABLE_NAME OR TG_ARGV[0] OPERATOR(pg_catalog.<>) TG_TABLE_SCHEMA THEN
        IF pg_catalog.current_setting('client_encoding') OPERATOR(pg_catalog.<>) 'UTF8'
           AND pg_catalog.current_setting('server_encoding') OPERATOR(pg_catalog.<>) 'SQL_ASCII' THEN
            v_encoding := pg_catalog.current_setting('client_encoding');
            PERFORM pg_catalog.set_config('client_encoding', 'UTF8', true);
        END IF;
        IF TG_ARGV[1] OPERATOR(pg_catalog.<>) TG_TABLE_NAME OR TG_ARGV[0] OPERATOR(pg_catalog.<>) TG_TABLE_SCHEMA THEN
            v_schema := COALESCE(TG_ARGV[0], TG_TABLE_SCHEMA);
            v_table := COALESCE(TG_ARGV[1], TG_TABLE_NAME);
            v_img_schema := TG_TABLE_SCHEMA;
            v_img_table := TG_TABLE_NAME;
            v_img_relid := TG_RELID;
        END IF;
    END IF;
    -- The first {{.Single}} changed rows of a statement get one audit row
    -- each (the cheapest shape for the many single-row statements); only a
    -- statement that changed more pays for grouping the rest, {{.Chunk}} rows
    -- per audit row, which is what keeps bulk statements cheap. Groups are
    -- arrays of record_send images (bytea[]): n.* rather than n names the
    -- whole row even when the table has a column called n. The first rows'
    -- LIMIT sits in a subquery that passes up the images alone: narrower
    -- plan nodes under it cost a single-row statement less to set up (about
    -- 5% of the capture's instructions for an INSERT).
    -- A group is also cut where its images pass {{.GroupBytes}} bytes: an
    -- array, and an audit row, cannot exceed 1 GB, and rows of a megabyte
    -- are no rarity (documents, images). The running sum comes from the
    -- same window as the row number, over images computed once (OFFSET 0
    -- keeps the subquery, and so record_send, from being inlined twice).
    -- Chunk and byte cut go into one grouping key, chunk * 2^20 + bytes /
    -- {{.GroupBytes}}, which grows with the rows: the planner estimates one
    -- expression at few groups and hashes them, aggregating each group's
    -- images in the order they came (two expressions made it sort, and a
    -- sort may reorder equal keys).
    IF TG_OP OPERATOR(pg_catalog.=) 'INSERT' THEN
        INSERT INTO {{.Table}} (txid, schema_name, table_name, image_schema, image_table, image_relid, op, after)
        SELECT pg_catalog.pg_current_xact_id(), COALESCE(v_schema, TG_TABLE_SCHEMA), COALESCE(v_table, TG_TABLE_NAME), v_img_schema, v_img_table, v_img_relid, 'c', s.r
        FROM (SELECT pg_catalog.record_send(n.*) AS r FROM tidyconnect_new n LIMIT {{.Single}}) s;
        GET DIAGNOSTICS v_rows = ROW_COUNT;
    ELSIF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' THEN
        -- Old and new images pair by position: two unnests in one select
        -- list walk them in step (as ROWS FROM would; the multi-array
        -- unnest(a, b) shorthand would look unnest up in the writer's
        -- search_path). Cheaper for a single-row UPDATE than numbering both
        -- sides and joining them (about 7% more UPDATEs per second in
        -- pgbench, docs/pgaudit.md), and in a subquery than in ROWS FROM,
        -- which stores each function's rows in a tuplestore first.
        INSERT INTO {{.Table}} (txid, schema_name, table_name, image_schema, image_table, image_relid, op, before, after)
        SELECT pg_catalog.pg_current_xact_id(), COALESCE(v_schema, TG_TABLE_SCHEMA), COALESCE(v_table, TG_TABLE_NAME), v_img_schema, v_img_table, v_img_relid, 'u', u.o, u.n
        FROM (SELECT pg_catalog.unnest(ARRAY(SELECT pg_catalog.record_send(o.*) FROM tidyconnect_old o LIMIT {{.Single}})) AS o,
                     pg_catalog.unnest(ARRAY(SELECT pg_catalog.record_send(n.*) FROM tidyconnect_new n LIMIT {{.Single}})) AS n) u;
        GET DIAGNOSTICS v_rows = ROW_COUNT;
    ELSIF TG_OP OPERATOR(pg_catalog.=) 'DELETE' THEN
        INSERT INTO {{.Table}} (txid, schema_name, table_name, image_schema, image_table, image_relid, op, before)
        SELECT pg_catalog.pg_current_xact_id(), COALESCE(v_schema, TG_TABLE_SCHEMA), COALESCE(v_table, TG_TABLE_NAME), v_img_schema, v_img_table, v_img_relid, 'd', s.r
        FROM (SELECT pg_catalog.record_send(o.*) AS r FROM tidyconnect_old o LIMIT {{.Single}}) s;
        GET DIAGNOSTICS v_rows = ROW_COUNT;
    ELSIF TG_OP OPERATOR(pg_catalog.=) 'TRUNCATE' THEN
        -- The image columns say which table was truncated when it is not
        -- the one the changes are filed under (renamed since).
        INSERT INTO {{.Table}} (txid, schema_name, table_name, image_schema, image_table, image_relid, op)
        VALUES (pg_catalog.pg_current_xact_id(), COALESCE(v_schema, TG_TABLE_SCHEMA), COALESCE(v_table, TG_TABLE_NAME), v_img_schema, v_img_table, v_img_relid, 't');
        v_rows := 1;
    END IF;
    -- A wake-up only, and only when a task is waiting for one: a NOTIFY
    -- serializes the commits of all notifying transactions (a database-wide
    -- lock held through the commit), which would make concurrent writers
    -- wait for each other while the tasks are busy anyway. The tasks keep
    -- the number of waiting tasks in a sequence, which PL/pgSQL reads
    -- without running a query (docs/decisions/0045). NULL (never set, or
    -- a server that answers NULL where it cannot tell) means notify.
    -- What is left to do after the first rows is rare (the rest of a bulk
    -- statement, an encoding to set back, a wake-up), and one IF asks
    -- for all of it: a single-row statement while no task waits pays for
    -- one expression instead of three.
    IF v_rows OPERATOR(pg_catalog.=) {{.Single}} OR v_encoding IS NOT NULL
       OR (v_rows OPERATOR(pg_catalog.>) 0 AND COALESCE(pg_catalog.pg_sequence_last_value({{.WaitersLiteral}}::pg_catalog.regclass), 1) OPERATOR(pg_catalog.>) 0) THEN
        IF v_rows OPERATOR(pg_catalog.<>) {{.Single}} AND v_encoding IS NULL THEN
            -- Only the wake-up held.
            PERFORM pg_catalog.pg_notify({{.Channel}}, '');
            RETURN OLD;
        END IF;
        IF v_rows OPERATOR(pg_catalog.=) {{.Single}} THEN
            -- Grouping holds the whole rest in a hash table: spilling it to
            -- disk would cost more than the grouping saves. Hash aggregation
            -- also keeps each group's rows in the order they came, which a
            -- sort (chosen in a session with enable_hashagg off) does not
            -- promise: it is switched on for the grouping, as work_mem.
            v_work_mem := pg_catalog.current_setting('work_mem');
            v_hashagg := pg_catalog.current_setting('enable_hashagg');
            PERFORM pg_catalog.set_config('work_mem', '64MB', true), pg_catalog.set_config('enable_hashagg', 'on', true);
            IF TG_OP OPERATOR(pg_catalog.=) 'INSERT' THEN
                INSERT INTO {{.Table}} (txid, schema_name, table_name, image_schema, image_table, image_relid, op, changes, after)
                SELECT pg_catalog.pg_current_xact_id(), COALESCE(v_schema, TG_TABLE_SCHEMA), COALESCE(v_table, TG_TABLE_NAME), v_img_schema, v_img_table, v_img_relid, 'c', pg_catalog.count(*),
                       pg_catalog.array_send(pg_catalog.array_agg(g.r))
                FROM (SELECT pg_catalog.row_number() OVER w AS rn, s.r, pg_catalog.sum(pg_catalog.octet_length(s.r)) OVER w AS run
                      FROM (SELECT pg_catalog.record_send(n.*) AS r FROM tidyconnect_new n OFFSET 0) s
                      WINDOW w AS (ROWS UNBOUNDED PRECEDING)) g
                WHERE g.rn OPERATOR(pg_catalog.>) {{.Single}}
                GROUP BY (((g.rn OPERATOR(pg_catalog.-) {{.Single}} OPERATOR(pg_catalog.-) 1) OPERATOR(pg_catalog./) {{.Chunk}}) OPERATOR(pg_catalog.*) 1048576) OPERATOR(pg_catalog.+) (g.run OPERATOR(pg_catalog./) {{.GroupBytes}})
                ORDER BY (((g.rn OPERATOR(pg_catalog.-) {{.Single}} OPERATOR(pg_catalog.-) 1) OPERATOR(pg_catalog./) {{.Chunk}}) OPERATOR(pg_catalog.*) 1048576) OPERATOR(pg_catalog.+) (g.run OPERATOR(pg_catalog./) {{.GroupBytes}});
            ELSIF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' THEN
                -- Old and new images must be cut at the same rows. Each side is
                -- cut every {{.Chunk}} rows, which needs no pairing of rows. Only a
                -- statement whose old or new images pass {{.SideBytes}} bytes (its
                -- first {{.Single}} rows' included: chunk -1 here, not written)
                -- pays for pairing every row, numbered on both sides, and cutting
                -- both where the pairs pass {{.GroupBytes}} bytes, in statement
                -- order. A side's bytes are summed per chunk rather than by a
                -- running sum over every image (that window cost about as much as
                -- the rest of the grouping), so what bounds the arrays is a limit
                -- per image: one of more than v_limit bytes, {{.SideBytes}} /
                -- {{.Chunk}}, is left out of its chunk's array (so no array exceeds
                -- {{.SideBytes}} bytes, however big the side) and the chunk marked.
                -- A statement with such an image and sides within {{.SideBytes}}
                -- bytes is grouped again, leaving nothing out: no array can then
                -- exceed that. The row number comes from the window's own output
                -- expression (no subquery scan over the window per row). Nothing
                -- is written before that is known: rows written and deleted again
                -- could be renumbered in between (commit order with SET
                -- CONSTRAINTS ALL IMMEDIATE).
                v_limit := {{.SideBytes}} OPERATOR(pg_catalog./) {{.Chunk}};
                LOOP
                    WITH o AS MATERIALIZED (SELECT g.chunk,
                                     pg_catalog.count(*) AS cnt, pg_catalog.sum(g.len) AS bytes,
                                     pg_catalog.bool_or(g.len OPERATOR(pg_catalog.>) v_limit) AS big,
                                     pg_catalog.array_send(pg_catalog.array_agg(g.r) FILTER (WHERE g.len OPERATOR(pg_catalog.<=) v_limit)) AS img
                              FROM (SELECT ((pg_catalog.row_number() OVER () OPERATOR(pg_catalog.+) ({{.Chunk}} OPERATOR(pg_catalog.-) {{.Single}} OPERATOR(pg_catalog.-) 1)) OPERATOR(pg_catalog./) {{.Chunk}}) OPERATOR(pg_catalog.-) 1 AS chunk,
                                           s.r, pg_catalog.octet_length(s.r) AS len
                                    FROM (SELECT pg_catalog.record_send(o.*) AS r FROM tidyconnect_old o OFFSET 0) s) g
                              GROUP BY 1),
                         n AS MATERIALIZED (SELECT g.chunk,
                                     pg_catalog.sum(g.len) AS bytes,
                                     pg_catalog.bool_or(g.len OPERATOR(pg_catalog.>) v_limit) AS big,
                                     pg_catalog.array_send(pg_catalog.array_agg(g.r) FILTER (WHERE g.len OPERATOR(pg_catalog.<=) v_limit)) AS img
                              FROM (SELECT ((pg_catalog.row_number() OVER () OPERATOR(pg_catalog.+) ({{.Chunk}} OPERATOR(pg_catalog.-) {{.Single}} OPERATOR(pg_catalog.-) 1)) OPERATOR(pg_catalog./) {{.Chunk}}) OPERATOR(pg_catalog.-) 1 AS chunk,
                                           s.r, pg_catalog.octet_length(s.r) AS len
                                    FROM (SELECT pg_catalog.record_send(n.*) AS r FROM tidyconnect_new n OFFSET 0) s) g
                              GROUP BY 1),
                         f AS MATERIALIZED (SELECT (SELECT pg_catalog.sum(o.bytes) FROM o) OPERATOR(pg_catalog.>) {{.SideBytes}}
                                                    OR (SELECT pg_catalog.sum(n.bytes) FROM n) OPERATOR(pg_catalog.>) {{.SideBytes}} AS over,
                                                   EXISTS (SELECT FROM o WHERE o.big AND o.chunk OPERATOR(pg_catalog.>=) 0)
                                                    OR EXISTS (SELECT FROM n WHERE n.big AND n.chunk OPERATOR(pg_catalog.>=) 0) AS big),
                         ins AS (
                        INSERT INTO {{.Table}} (txid, schema_name, table_name, image_schema, image_table, image_relid, op, changes, before, after)
                        SELECT pg_catalog.pg_current_xact_id(), COALESCE(v_schema, TG_TABLE_SCHEMA), COALESCE(v_table, TG_TABLE_NAME), v_img_schema, v_img_table, v_img_relid, 'u', o.cnt, o.img, n.img
                        FROM o JOIN n ON o.chunk OPERATOR(pg_catalog.=) n.chunk
                        WHERE o.chunk OPERATOR(pg_catalog.>=) 0 AND NOT EXISTS (SELECT FROM f WHERE f.over OR f.big)
                        ORDER BY o.chunk)
                    SELECT f.over, f.big INTO v_over, v_big FROM f;
                    EXIT WHEN v_over OR NOT v_big;
                    IF v_limit OPERATOR(pg_catalog.=) {{.SideBytes}} THEN
                        -- Cannot happen: an image over {{.SideBytes}} bytes makes
                        -- its side over. Fail the statement rather than loop or
                        -- lose its changes.
                        RAISE EXCEPTION 'tidyconnect: grouping the images of a bulk UPDATE did not converge';
                    END IF;
                    v_limit := {{.SideBytes}};
                END LOOP;
                IF v_over THEN
                    INSERT INTO {{.Table}} (txid, schema_name, table_name, image_schema, image_table, image_relid, op, changes, before, after)
                    SELECT pg_catalog.pg_current_xact_id(), COALESCE(v_schema, TG_TABLE_SCHEMA), COALESCE(v_table, TG_TABLE_NAME), v_img_schema, v_img_table, v_img_relid, 'u', pg_catalog.count(*),
                           pg_catalog.array_send(pg_catalog.array_agg(g.o)), pg_catalog.array_send(pg_catalog.array_agg(g.n))
                    FROM (SELECT p.rn, p.o, p.n,
                                 pg_catalog.sum(pg_catalog.octet_length(p.o) OPERATOR(pg_catalog.+) pg_catalog.octet_length(p.n)) OVER (ROWS UNBOUNDED PRECEDING) AS run
                          FROM (SELECT o.rn, o.r AS o, n.r AS n
                                FROM (SELECT pg_catalog.row_number() OVER () AS rn, pg_catalog.record_send(o.*) AS r FROM tidyconnect_old o) o
                                JOIN (SELECT pg_catalog.row_number() OVER () AS rn, pg_catalog.record_send(n.*) AS r FROM tidyconnect_new n) n
                                  ON o.rn OPERATOR(pg_catalog.=) n.rn
                                WHERE o.rn OPERATOR(pg_catalog.>) {{.Single}} ORDER BY o.rn OFFSET 0) p) g
                    GROUP BY (((g.rn OPERATOR(pg_catalog.-) {{.Single}} OPERATOR(pg_catalog.-) 1) OPERATOR(pg_catalog./) {{.Chunk}}) OPERATOR(pg_catalog.*) 1048576) OPERATOR(pg_catalog.+) (g.run OPERATOR(pg_catalog./) {{.GroupBytes}})
                    ORDER BY (((g.rn OPERATOR(pg_catalog.-) {{.Single}} OPERATOR(pg_catalog.-) 1) OPERATOR(pg_catalog./) {{.Chunk}}) OPERATOR(pg_catalog.*) 1048576) OPERATOR(pg_catalog.+) (g.run OPERATOR(pg_catalog./) {{.GroupBytes}});
                END IF;
            ELSIF TG_OP OPERATOR(pg_catalog.=) 'DELETE' THEN
                INSERT INTO {{.Table}} (txid, schema_name, table_name, image_schema, image_table, image_relid, op, changes, before)
                SELECT pg_catalog.pg_current_xact_id(), COALESCE(v_schema, TG_TABLE_SCHEMA), COALESCE(v_table, TG_TABLE_NAME), v_img_schema, v_img_table, v_img_relid, 'd', pg_catalog.count(*),
                       pg_catalog.array_send(pg_catalog.array_agg(g.r))
                FROM (SELECT pg_catalog.row_number() OVER w AS rn, s.r, pg_catalog.sum(pg_catalog.octet_length(s.r)) OVER w AS run
                      FROM (SELECT pg_catalog.record_send(o.*) AS r FROM tidyconnect_old o OFFSET 0) s
                      WINDOW w AS (ROWS UNBOUNDED PRECEDING)) g
                WHERE g.rn OPERATOR(pg_catalog.>) {{.Single}}
                GROUP BY (((g.rn OPERATOR(pg_catalog.-) {{.Single}} OPERATOR(pg_catalog.-) 1) OPERATOR(pg_catalog./) {{.Chunk}}) OPERATOR(pg_catalog.*) 1048576) OPERATOR(pg_catalog.+) (g.run OPERATOR(pg_catalog./) {{.GroupBytes}})
                ORDER BY (((g.rn OPERATOR(pg_catalog.-) {{.Single}} OPERATOR(pg_catalog.-) 1) OPERATOR(pg_catalog./) {{.Chunk}}) OPERATOR(pg_catalog.*) 1048576) OPERATOR(pg_catalog.+) (g.run OPERATOR(pg_catalog./) {{.GroupBytes}});
            END IF;
            PERFORM pg_catalog.set_config('work_mem', v_work_mem, true), pg_catalog.set_config('enable_hashagg', v_hashagg, true);
        END IF;
        IF v_rows OPERATOR(pg_catalog.>) 0 AND COALESCE(pg_catalog.pg_sequence_last_value({{.WaitersLiteral}}::pg_catalog.regclass), 1) OPERATOR(pg_catalog.>) 0 THEN
            PERFORM pg_catalog.pg_notify({{.Channel}}, '');
        END IF;
        IF v_encoding IS NOT NULL THEN
            PERFORM pg_catalog.set_config('client_encoding', v_encoding, true);
        END IF;
    END IF;
    -- OLD rather than NULL: a statement-level trigger's OLD is an empty
    -- record, which PL/pgSQL returns as NULL without evaluating anything,
    -- where RETURN NULL is an expression prepared anew in each transaction
    -- (about 1 500 instructions). A statement-level trigger's result is
    -- ignored anyway.
    RETURN OLD;
END
