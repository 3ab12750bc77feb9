-- RESTRICT: a schema that still holds objects tidyconnect does not own is kept.
DROP SCHEMA IF EXISTS {{.Schema}} RESTRICT;
