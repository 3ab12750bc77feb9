package pgaudit

import (
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestLogicalKeyChangeReachesQuietTable: a primary key changed on a
// captured table reaches its records' keys within metaRefresh even when
// the refresh fell due in a batch of another table's changes only (a busy
// table beside a quiet one).
func TestLogicalKeyChangeReachesQuietTable(t *testing.T) {
	override(t, &metaRefresh, 300*time.Millisecond)
	db, url := logicalAdmin(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "busy")+` (id int PRIMARY KEY)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "quiet")+` (id int PRIMARY KEY, k int NOT NULL)`)
	name := testenv.Unique("logical-metarefresh-")
	dropSlotAfter(t, db, name)
	r := startConnector(t, logicalConfig(name, url, s+".busy", s+".quiet"), connect.NewMemoryLedger())
	defer func() {
		if err := r.stop(true); err != nil {
			t.Error(err)
		}
	}()
	mustExec(t, db, `ALTER TABLE `+qualified(s, "quiet")+` DROP CONSTRAINT quiet_pkey, ADD PRIMARY KEY (k)`)
	time.Sleep(2 * metaRefresh)
	// The refresh falls due in a batch of the busy table's changes only.
	mustExec(t, db, `INSERT INTO `+qualified(s, "busy")+` VALUES (1)`)
	r.collect(1, true)
	mustExec(t, db, `INSERT INTO `+qualified(s, "quiet")+` VALUES (1, 7)`)
	got := r.collect(1, true)
	if k := got[0].Key; len(k) != 1 || k["k"] == nil {
		t.Fatalf("the quiet table's change keyed %v, %v since its primary key became (k)", k, 2*metaRefresh)
	}
}
