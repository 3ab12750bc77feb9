package pgaudit

import (
	"testing"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestRenamedAndAlteredWhileItsNameIsReused: a captured table renamed and
// altered while the task runs, with a new table made under its old name:
// the renamed table's changes (its trigger still files them under the old
// name) keep its columns and key. The task used to read the new table's
// instead (named _column_<n>, key null, for every later change too).
func TestRenamedAndAlteredWhileItsNameIsReused(t *testing.T) {
	for _, level := range []string{"statement", "row"} {
		t.Run(level, func(t *testing.T) {
			db, url := admin(t)
			s := newSchema(t, db)
			mustExec(t, db, `CREATE TABLE `+qualified(s, "t")+` (id int PRIMARY KEY, v text)`)
			cfg := baseConfig(testenv.Unique("renamed-reused-"), url, auditSchemaFor(t, db), s+".t")
			cfg[KeyCaptureLevel] = level
			r := startConnector(t, cfg, connect.NewMemoryLedger())
			defer func() { _ = r.stop(true) }()
			mustExec(t, db, `INSERT INTO `+qualified(s, "t")+` VALUES (1, 'a')`)
			r.collect(1, true)
			mustExec(t, db, `INSERT INTO `+qualified(s, "t")+` VALUES (2, 'b')`)
			mustExec(t, db, `ALTER TABLE `+qualified(s, "t")+` RENAME TO t2`)
			mustExec(t, db, `ALTER TABLE `+qualified(s, "t2")+` ADD COLUMN w int`)
			mustExec(t, db, `CREATE TABLE `+qualified(s, "t")+` (k text PRIMARY KEY, x int, y int)`)
			mustExec(t, db, `INSERT INTO `+qualified(s, "t2")+` VALUES (3, 'c', 7)`)
			got := r.collect(2, true)
			checkChanges(t, got, "tc."+s+".t", s, "t", []wantChange{
				{"c", `{"id":2}`, "null", `{"id":2,"v":"b"}`},
				{"c", `{"id":3}`, "null", `{"id":3,"v":"c","w":7}`},
			})
		})
	}
}
