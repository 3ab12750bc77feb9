-- Applied only when the audit schema does not exist yet; the connector then
-- owns it (and drops it on deletion if it is empty).
CREATE SCHEMA {{.Schema}};
COMMENT ON SCHEMA {{.Schema}} IS {{.Marker}};
