package pgaudit

import (
	"reflect"
	"testing"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestLogicalKeyColumnRenamed: a change made after the key column was
// renamed is keyed by the column's new name at once, as under triggers,
// and never by the old name with a null value ({"id":null} would be one
// key shared by every such change, and a compacted topic keeps only the
// last of them).
func TestLogicalKeyColumnRenamed(t *testing.T) {
	db, url := logicalAdmin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "k")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY, v text)`)
	name := testenv.Unique("logical-keyren-")
	dropSlotAfter(t, db, name)
	r := startConnector(t, logicalConfig(name, url, s+".k"), connect.NewMemoryLedger())
	defer func() {
		if err := r.stop(true); err != nil {
			t.Error(err)
		}
	}()
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (1, 'a')`)
	if got := r.collect(1, true); !reflect.DeepEqual(anyMap(got[0].Key), jsonOf(t, `{"id":1}`)) {
		t.Fatalf("key %v", got[0].Key)
	}
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (2, 'before the rename')`)
	mustExec(t, db, `ALTER TABLE `+tbl+` RENAME COLUMN id TO ident`)
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (3, 'after the rename')`)
	mustExec(t, db, `DELETE FROM `+tbl+` WHERE ident = 1`)
	got := r.collect(3, true)
	for i, want := range []string{`{"id":2}`, `{"ident":3}`, `{"ident":1}`} {
		if !reflect.DeepEqual(anyMap(got[i].Key), jsonOf(t, want)) {
			t.Errorf("change %d (%s %v): key %v, want %s", i, got[i].Op, got[i].After, got[i].Key, want)
		}
	}
	// Decoded by a task started after the rename: the change's image
	// names the key column by its old name, and the change has no key.
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (4, 'before the second rename')`)
	r.pollUncommitted(1)
	mustExec(t, db, `ALTER TABLE `+tbl+` RENAME COLUMN ident TO pk`)
	r.restartTask()
	if got := r.collect(1, true); got[0].Key != nil {
		t.Errorf("change made before the rename, read after it: key %v, want none", got[0].Key)
	}
	r.quiet()
}
