package pgaudit

import (
	"strings"
	"testing"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestLogicalOwnSlotCountsAsFree: the free-slot check behind validation
// and Start counts the connector's own slot, once made, as free: a server
// whose every slot is taken, the connector's among them, must not keep it
// from restarting or being reconfigured (it needs no new slot). Filling
// the shared server's slots would fail other tests' slots meanwhile, so
// the test compares the count for the connector's slot with the count
// for a name no slot has, in one statement.
func TestLogicalOwnSlotCountsAsFree(t *testing.T) {
	db, url := logicalAdmin(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "t")+` (id int PRIMARY KEY)`)
	name := testenv.Unique("logical-full-")
	dropSlotAfter(t, db, name)
	r := startConnector(t, logicalConfig(name, url, s+".t"), connect.NewMemoryLedger())
	defer func() {
		if err := r.stop(true); err != nil {
			t.Error(err)
		}
	}()
	_, slot := logicalNames(name)
	var own, other int
	if err := db.QueryRow(testCtx(t), `SELECT `+freeSlotsSQL+`, `+strings.ReplaceAll(freeSlotsSQL, "$1", "$2"),
		slot, "tidyconnect_no_such_slot").Scan(&own, &other); err != nil {
		t.Fatal(err)
	}
	if own != other+1 {
		t.Errorf("free slots %d for the connector (whose slot exists), %d for another name: its own slot should count as free", own, other)
	}
}
