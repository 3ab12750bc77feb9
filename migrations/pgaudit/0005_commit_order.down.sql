-- Switching to capture.order = statement: each part is applied only while
-- it carries the connector's marker.
{{define "trigger"}}DROP TRIGGER IF EXISTS {{.Trigger}} ON {{.Table}};{{end}}
{{define "function"}}DROP FUNCTION IF EXISTS {{.Order}}();{{end}}
