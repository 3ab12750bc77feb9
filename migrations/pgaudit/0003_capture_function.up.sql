-- The trigger function, shared by every captured table of the connector.
-- Statement-level: the changed rows come from the transition tables
-- tidyconnect_old / tidyconnect_new (see docs/decisions/0040). UPDATE pairs
-- old and new images by their position in the transition tables, which
-- PostgreSQL fills in step (one old and one new tuple per updated row).
-- Images are binary (record_send / array_send) and bulk statements are
-- grouped into few audit rows (docs/decisions/0044).
-- SECURITY DEFINER so that writers of the captured tables need no privilege
-- on the audit table. Without a SET search_path clause, which every
-- captured statement paid for (2-5 us a statement, about a fifth of the
-- trigger's cost for a single-row UPDATE): that is safe only because the
-- body names nothing through the search path. Every function, operator,
-- type and table is schema-qualified; the transition tables' names are
-- resolved before any schema. TestCaptureIgnoresSearchPath plants
-- look-alikes in the writer's search_path to prove it.
CREATE OR REPLACE FUNCTION {{.Function}}() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
AS {{.Body}};
COMMENT ON FUNCTION {{.Function}}() IS {{.Marker}};
-- Only triggers call it; a trigger fires whatever its writer's privileges,
-- but creating one needs EXECUTE. Without this revoke any role could hang
-- the function on a table of its own and feed the connector changes.
REVOKE EXECUTE ON FUNCTION {{.Function}}() FROM PUBLIC;
