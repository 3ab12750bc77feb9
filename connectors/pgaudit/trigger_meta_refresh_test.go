package pgaudit

import (
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestTriggerKeyChangeReachesQuietTable: as
// TestLogicalKeyChangeReachesQuietTable, under the trigger method: a
// primary key changed on a quiet table reaches its keys although the
// refresh fell due in a batch of another table's changes only.
// TestTriggerKeyChangeReachesQuietTable: a primary key changed on a table
// with few changes reaches its keys within metaRefresh, also when the
// refreshes fall due while only another table's changes are read (they
// used to reload only the tables in the batch, and reset the timer).
func TestTriggerKeyChangeReachesQuietTable(t *testing.T) {
	override(t, &metaRefresh, 300*time.Millisecond)
	db, url := admin(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "busy")+` (id int PRIMARY KEY)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "quiet")+` (id int PRIMARY KEY, k int NOT NULL)`)
	r := startConnector(t, baseConfig(testenv.Unique("trigger-metarefresh-"), url, auditSchemaFor(t, db), s+".busy", s+".quiet"), connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()
	mustExec(t, db, `INSERT INTO `+qualified(s, "quiet")+` VALUES (0, 0)`)
	r.collect(1, true)
	mustExec(t, db, `ALTER TABLE `+qualified(s, "quiet")+` DROP CONSTRAINT quiet_pkey, ADD PRIMARY KEY (k)`)
	time.Sleep(2 * metaRefresh)
	mustExec(t, db, `INSERT INTO `+qualified(s, "busy")+` VALUES (1)`)
	r.collect(1, true)
	mustExec(t, db, `INSERT INTO `+qualified(s, "quiet")+` VALUES (1, 7)`)
	got := r.collect(1, true)
	if k := got[0].Key; len(k) != 1 || k["k"] == nil {
		t.Fatalf("the quiet table's change keyed %v", k)
	}
}
