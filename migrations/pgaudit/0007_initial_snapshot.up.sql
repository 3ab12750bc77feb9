-- The initial snapshot of one captured table (snapshot.mode = initial,
-- docs/decisions/0070): its rows as 'r' changes, grouped as a bulk
-- INSERT's are ({{.Chunk}} per audit row, fewer where the images pass
-- {{.GroupBytes}} bytes), so the task delivers them like any other
-- change. It runs in the transaction that creates the table's capture
-- triggers, right after them, under READ COMMITTED: CREATE TRIGGER's lock
-- has waited for the writers in flight and holds new ones off until
-- commit, and this statement's snapshot is taken after it. Every row is
-- therefore either here or changed later under the triggers (with higher
-- ids), never both and never neither. A partitioned table is read with
-- its partitions (no ONLY; tables with inheritance children or parents are
-- refused at validation).
-- Row security off: under FORCE ROW LEVEL SECURITY the owner would read
-- only the rows the policies let through, and the others would be missing
-- from the snapshot without a word. Off, such a table fails the copy (and
-- the Start) instead; a superuser or a role with BYPASSRLS reads every row
-- either way.
-- Hash aggregation keeps each group's rows in the order they came (a sort
-- need not): on, whatever the role's default.
SELECT pg_catalog.set_config('row_security', 'off', true), pg_catalog.set_config('enable_hashagg', 'on', true);
INSERT INTO {{.Table}} (txid, schema_name, table_name, op, changes, after)
SELECT pg_catalog.pg_current_xact_id(), {{.CapturedSchemaLiteral}}, {{.CapturedNameLiteral}}, 'r', pg_catalog.count(*),
       pg_catalog.array_send(pg_catalog.array_agg(g.r))
FROM (SELECT pg_catalog.row_number() OVER w AS rn, s.r, pg_catalog.sum(pg_catalog.octet_length(s.r)) OVER w AS run
      FROM (SELECT pg_catalog.record_send(c.*) AS r FROM {{.Captured}} c OFFSET 0) s
      WINDOW w AS (ROWS UNBOUNDED PRECEDING)) g
GROUP BY (((g.rn OPERATOR(pg_catalog.-) 1) OPERATOR(pg_catalog./) {{.Chunk}}) OPERATOR(pg_catalog.*) 1048576) OPERATOR(pg_catalog.+) (g.run OPERATOR(pg_catalog./) {{.GroupBytes}})
ORDER BY (((g.rn OPERATOR(pg_catalog.-) 1) OPERATOR(pg_catalog./) {{.Chunk}}) OPERATOR(pg_catalog.*) 1048576) OPERATOR(pg_catalog.+) (g.run OPERATOR(pg_catalog./) {{.GroupBytes}})
