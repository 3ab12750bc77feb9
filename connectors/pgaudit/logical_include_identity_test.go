package pgaudit

import (
	"strings"
	"testing"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
)

// TestLogicalIdentityIncludeColumns: an index's INCLUDE columns are not
// part of a replica identity (PostgreSQL logs only its key columns of an
// old row), so a table whose record key holds a column that only an
// INCLUDE clause puts in its identity index is refused under
// capture.method=logical: its DELETEs' records would have no key.
func TestLogicalIdentityIncludeColumns(t *testing.T) {
	db, url := logicalAdmin(t)
	s := newSchema(t, db)
	// the primary key only in the identity index's INCLUDE
	mustExec(t, db, `CREATE TABLE `+qualified(s, "u")+` (id int PRIMARY KEY, code text NOT NULL, v text)`)
	mustExec(t, db, `CREATE UNIQUE INDEX u_code ON `+qualified(s, "u")+` (code) INCLUDE (id)`)
	mustExec(t, db, `ALTER TABLE `+qualified(s, "u")+` REPLICA IDENTITY USING INDEX u_code`)
	// a partition whose identity has the partitioned table's key only in INCLUDE
	mustExec(t, db, `CREATE TABLE `+qualified(s, "p")+` (id int PRIMARY KEY, code text NOT NULL) PARTITION BY RANGE (id)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "p1")+` PARTITION OF `+qualified(s, "p")+` FOR VALUES FROM (0) TO (100)`)
	mustExec(t, db, `CREATE UNIQUE INDEX p1_code ON `+qualified(s, "p1")+` (code) INCLUDE (id)`)
	mustExec(t, db, `ALTER TABLE `+qualified(s, "p1")+` REPLICA IDENTITY USING INDEX p1_code`)
	for table, want := range map[string]string{
		"u": `"` + s + `"."u" has a replica identity without its primary key's column(s) "id"`,
		"p": `partition ` + s + `.p1 of "` + s + `"."p" has a replica identity without column(s) "id"`,
	} {
		name := testenv.Unique("logical-incl-")
		dropSlotAfter(t, db, name)
		errs := (&Connector{}).Validate(testCtx(t), logicalConfig(name, url, s+"."+table))
		if msg := strings.Join(errs[KeyTables], " "); !strings.Contains(msg, want) {
			t.Errorf("%s: Validate: %v, want %q", table, errs, want)
		}
	}
	// Accepted: an identity index with key columns beyond the record key
	// (and an INCLUDE column besides), and a primary key with an INCLUDE
	// column, which is not part of the record key either.
	mustExec(t, db, `CREATE TABLE `+qualified(s, "ok")+` (id int PRIMARY KEY, code text NOT NULL, v text)`)
	mustExec(t, db, `CREATE UNIQUE INDEX ok_code ON `+qualified(s, "ok")+` (id, code) INCLUDE (v)`)
	mustExec(t, db, `ALTER TABLE `+qualified(s, "ok")+` REPLICA IDENTITY USING INDEX ok_code`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "i")+` (id int, v text, PRIMARY KEY (id) INCLUDE (v))`)
	for _, table := range []string{"ok", "i"} {
		name := testenv.Unique("logical-incl-")
		dropSlotAfter(t, db, name)
		if errs := (&Connector{}).Validate(testCtx(t), logicalConfig(name, url, s+"."+table)); len(errs) > 0 {
			t.Errorf("%s: Validate: %v", table, errs)
		}
	}
}
