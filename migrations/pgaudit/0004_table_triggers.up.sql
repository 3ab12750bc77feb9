-- Capture on one table: one statement-level trigger per event (PostgreSQL
-- allows transition tables only on single-event triggers) plus TRUNCATE.
-- Each block is applied only for a trigger that does not exist yet. The
-- arguments name the configured table: changes are filed under the name
-- the table had when the trigger was made, so a rename loses nothing
-- (docs/decisions/0049).
{{define "INSERT"}}CREATE OR REPLACE TRIGGER {{.Trigger}} AFTER INSERT ON {{.Captured}}
    REFERENCING NEW TABLE AS tidyconnect_new
    FOR EACH STATEMENT EXECUTE FUNCTION {{.Function}}({{.CapturedSchemaLiteral}}, {{.CapturedNameLiteral}});
COMMENT ON TRIGGER {{.Trigger}} ON {{.Captured}} IS {{.Marker}};{{end}}
{{define "UPDATE"}}CREATE OR REPLACE TRIGGER {{.Trigger}} AFTER UPDATE ON {{.Captured}}
    REFERENCING OLD TABLE AS tidyconnect_old NEW TABLE AS tidyconnect_new
    FOR EACH STATEMENT EXECUTE FUNCTION {{.Function}}({{.CapturedSchemaLiteral}}, {{.CapturedNameLiteral}});
COMMENT ON TRIGGER {{.Trigger}} ON {{.Captured}} IS {{.Marker}};{{end}}
{{define "DELETE"}}CREATE OR REPLACE TRIGGER {{.Trigger}} AFTER DELETE ON {{.Captured}}
    REFERENCING OLD TABLE AS tidyconnect_old
    FOR EACH STATEMENT EXECUTE FUNCTION {{.Function}}({{.CapturedSchemaLiteral}}, {{.CapturedNameLiteral}});
COMMENT ON TRIGGER {{.Trigger}} ON {{.Captured}} IS {{.Marker}};{{end}}
{{define "TRUNCATE"}}CREATE OR REPLACE TRIGGER {{.Trigger}} AFTER TRUNCATE ON {{.Captured}}
    FOR EACH STATEMENT EXECUTE FUNCTION {{.Function}}({{.CapturedSchemaLiteral}}, {{.CapturedNameLiteral}});
COMMENT ON TRIGGER {{.Trigger}} ON {{.Captured}} IS {{.Marker}};{{end}}
