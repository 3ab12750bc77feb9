DROP TRIGGER IF EXISTS {{.Trigger}} ON {{.Captured}};
