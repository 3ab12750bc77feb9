-- Row-level capture, for partitioned tables and partitions
-- (docs/decisions/0048). Statement-level triggers fire only for the table a
-- statement names, so they would miss writes that name a partition, or go
-- through a parent into a captured partition. A row-level trigger on a
-- partitioned table is cloned onto each of its partitions, those attached
-- or created later included, and fires wherever the row lands, whichever
-- table an INSERT, UPDATE or DELETE names. TRUNCATE triggers are
-- statement-level and not cloned: a TRUNCATE that names one partition of a
-- captured partitioned table is not captured (as with DETACH or DROP of a
-- partition, and as in PostgreSQL's logical replication).
-- The trigger's arguments name the configured table the changes belong to;
-- TG_TABLE_* name the partition, whose row type the images have.
-- SECURITY DEFINER, so that writers need no privilege on the audit table.
-- Without a SET search_path clause: it runs once per changed row, and
-- saving and restoring the setting cost about 11% of a bulk statement's
-- capture (docs/decisions/0048). That is safe only because the body names
-- nothing through the search path: every function, operator and table is
-- schema-qualified, its one variable's type included.
-- TestCaptureIgnoresSearchPath plants look-alikes to prove it.
CREATE OR REPLACE FUNCTION {{.RowFunction}}() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
AS {{.Body}};
COMMENT ON FUNCTION {{.RowFunction}}() IS {{.Marker}};
-- Only triggers call it; a trigger fires whatever its writer's privileges,
-- but creating one needs EXECUTE, and so does creating or attaching a
-- partition of a captured partitioned table (PostgreSQL copies the trigger
-- then). Provisioning grants EXECUTE to the owners of the captured
-- partitioned tables and their partitioned partitions, and to nobody else
-- (docs/decisions/0048).
REVOKE EXECUTE ON FUNCTION {{.RowFunction}}() FROM PUBLIC;
{{define "trigger"}}CREATE OR REPLACE TRIGGER {{.Trigger}} AFTER INSERT OR UPDATE OR DELETE ON {{.Captured}}
    FOR EACH ROW EXECUTE FUNCTION {{.RowFunction}}({{.CapturedSchemaLiteral}}, {{.CapturedNameLiteral}});
COMMENT ON TRIGGER {{.Trigger}} ON {{.Captured}} IS {{.Marker}};{{end}}
