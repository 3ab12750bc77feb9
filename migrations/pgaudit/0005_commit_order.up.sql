-- Commit order (capture.order = commit): a deferred constraint trigger on
-- the audit table renumbers each transaction's audit rows when it commits,
-- so tasks reading in id order read in the order transactions entered
-- COMMIT (docs/decisions/0046).
-- SECURITY DEFINER: writers of the captured tables need no privilege on the
-- audit table. No SET search_path: it runs at every capturing COMMIT, and
-- saving and restoring the setting was about a third of what commit order
-- adds to a single-row transaction (callgrind, docs/decisions/0046). Every
-- function, operator, type and table in the body is schema-qualified
-- instead (TestCommitOrderIgnoresSearchPath).
-- The body compares ids with the audit table's identity sequence, whose
-- name PostgreSQL chose when it made the table: it is looked up here and
-- written into the body as a literal (a regclass constant).
DO $tidyconnect_order$
DECLARE
    v_sequence pg_catalog.text := pg_catalog.pg_get_serial_sequence({{.TableLiteral}}, 'id');
BEGIN
    IF v_sequence IS NULL THEN
        RAISE EXCEPTION 'the audit table % has no identity sequence on its id column', {{.TableLiteral}};
    END IF;
    EXECUTE pg_catalog.format('CREATE OR REPLACE FUNCTION %s() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS %L',
        {{.OrderLiteral}}, pg_catalog.replace({{.Body}}, '@id_sequence@', pg_catalog.quote_literal(v_sequence)));
END
$tidyconnect_order$;
COMMENT ON FUNCTION {{.Order}}() IS {{.Marker}};
-- Only triggers call it; a trigger fires whatever its writer's privileges,
-- but creating one needs EXECUTE. Without this revoke any role could hang
-- the function on a table of its own and feed the connector changes.
REVOKE EXECUTE ON FUNCTION {{.Order}}() FROM PUBLIC;
{{define "trigger"}}CREATE CONSTRAINT TRIGGER {{.Trigger}} AFTER INSERT ON {{.Table}}
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION {{.Order}}();
COMMENT ON TRIGGER {{.Trigger}} ON {{.Table}} IS {{.Marker}};{{end}}
