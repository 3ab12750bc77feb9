package pgaudit

import (
	"reflect"
	"testing"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestLogicalColumnTypeDroppedSince: a change decoded after its column
// and the column's type were dropped (an enum, here) comes out with the
// value the walsender rendered by the type of then, as to_json renders an
// enum: the task does not fail on it (every restart would decode it again
// and fail the same way, keeping the slot's WAL for good).
func TestLogicalColumnTypeDroppedSince(t *testing.T) {
	db, url := logicalAdmin(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TYPE `+qualified(s, "mood")+` AS ENUM ('happy', 'sad')`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "e")+` (id int PRIMARY KEY, m `+qualified(s, "mood")+`)`)
	name := testenv.Unique("logical-droptype-")
	dropSlotAfter(t, db, name)
	r := startConnector(t, logicalConfig(name, url, s+".e"), connect.NewMemoryLedger())
	defer func() {
		if err := r.stop(true); err != nil {
			t.Error(err)
		}
	}()
	mustExec(t, db, `INSERT INTO `+qualified(s, "e")+` VALUES (1, 'happy')`)
	mustExec(t, db, `ALTER TABLE `+qualified(s, "e")+` DROP COLUMN m`)
	mustExec(t, db, `DROP TYPE `+qualified(s, "mood"))
	mustExec(t, db, `INSERT INTO `+qualified(s, "e")+` VALUES (2)`)
	got := r.collect(2, true)
	if !reflect.DeepEqual(got[0].After, jsonOf(t, `{"id":1,"m":"happy"}`)) || !reflect.DeepEqual(got[1].After, jsonOf(t, `{"id":2}`)) {
		t.Errorf("after: %v, %v", got[0].After, got[1].After)
	}
	r.quiet()
}
