-- Incremental snapshots (snapshot.mode = incremental, docs/decisions/0073):
-- one row per table (per leaf partition of a partitioned table) whose
-- existing rows the tasks still copy into the audit table, a few pages at
-- a time. filed_schema/filed_table are the captured table the copies are
-- filed under (as the triggers' arguments); relid is the relation read.
-- next_block is where the next chunk starts, end_block the relation's size
-- when its capture triggers were installed (rows in later pages came
-- after, under the triggers); filenode tells a rewrite (VACUUM FULL,
-- CLUSTER, a column type change), which moves rows between pages: the
-- copy then starts again from the first page. A row is deleted when its
-- copy is done.
-- A copy can be asked for by hand: a row with only relid, filed_schema and
-- filed_table (filenode and end_block NULL: the task measures the relation
-- when it starts copying; a partitioned table is replaced by its leaves).
CREATE TABLE IF NOT EXISTS {{.Snapshot}} (
    relid        oid    PRIMARY KEY,
    filed_schema text   NOT NULL,
    filed_table  text   NOT NULL,
    filenode     oid,
    next_block   bigint NOT NULL DEFAULT 0,
    end_block    bigint
);
COMMENT ON TABLE {{.Snapshot}} IS {{.Marker}};
{{define "start"}}-- A table's incremental snapshot starts (or starts again): the table, or
-- the leaf partitions of a partitioned one (pg_partition_tree lists
-- nothing for a plain table), measured now, in the transaction that installed its
-- capture triggers (whose lock keeps writers off until it commits).
INSERT INTO {{.Snapshot}} (relid, filed_schema, filed_table, filenode, next_block, end_block)
SELECT p.relid, {{.CapturedSchemaLiteral}}, {{.CapturedNameLiteral}}, pg_catalog.pg_relation_filenode(p.relid), 0,
       pg_catalog.pg_relation_size(p.relid) OPERATOR(pg_catalog./) pg_catalog.current_setting('block_size')::pg_catalog.int8
FROM (SELECT pt.relid FROM pg_catalog.pg_partition_tree({{.CapturedLiteral}}::pg_catalog.regclass) pt WHERE pt.isleaf
      UNION SELECT {{.CapturedLiteral}}::pg_catalog.regclass::pg_catalog.oid) p
JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) p.relid
WHERE c.relkind OPERATOR(pg_catalog.=) 'r'
ON CONFLICT (relid) DO UPDATE SET filed_schema = excluded.filed_schema, filed_table = excluded.filed_table,
    filenode = excluded.filenode, next_block = 0, end_block = excluded.end_block{{end}}
