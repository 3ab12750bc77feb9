-- Commit order (capture.order = commit): a deferred constraint trigger on
-- the audit table renumbers each transaction's audit rows when it commits,
-- so tasks reading in id order read in the order transactions entered
-- COMMIT (docs/decisions/0046).
-- SECURITY DEFINER: writers of the captured tables need no privilege on the
-- audit table.
CREATE OR REPLACE FUNCTION {{.Order}}() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS {{.Body}};
COMMENT ON FUNCTION {{.Order}}() IS {{.Marker}};
-- Only triggers call it; a trigger fires whatever its writer's privileges,
-- but creating one needs EXECUTE. Without this revoke any role could hang
-- the function on a table of its own and feed the connector changes.
REVOKE EXECUTE ON FUNCTION {{.Order}}() FROM PUBLIC;
{{define "trigger"}}CREATE CONSTRAINT TRIGGER {{.Trigger}} AFTER INSERT ON {{.Table}}
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION {{.Order}}();
COMMENT ON TRIGGER {{.Trigger}} ON {{.Table}} IS {{.Marker}};{{end}}
