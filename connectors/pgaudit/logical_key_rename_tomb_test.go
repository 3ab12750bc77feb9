package pgaudit

import (
	"context"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestLogicalKeyChangeTombstoneAcrossKeyRename: with
// tombstones.on.delete=true, an UPDATE that changed the key before the key
// column was renamed still gets the delete and the tombstone of its old
// key when it is decoded in one Poll with a change made after the rename
// (which makes the task read the key again).
func TestLogicalKeyChangeTombstoneAcrossKeyRename(t *testing.T) {
	db, url := logicalAdmin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "k")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY, v text)`)
	name := testenv.Unique("logical-keyrentomb-")
	dropSlotAfter(t, db, name)
	cfg := logicalConfig(name, url, s+".k")
	cfg[KeyTombstonesOnDelete] = "true"
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	defer func() {
		if err := r.stop(true); err != nil {
			t.Error(err)
		}
	}()
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (1, 'a')`)
	r.collect(1, true)
	mustExec(t, db, `UPDATE `+tbl+` SET id = 10 WHERE id = 1`)
	mustExec(t, db, `ALTER TABLE `+tbl+` RENAME COLUMN id TO ident`)
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (3, 'after the rename')`)
	time.Sleep(time.Second) // the reader has both changes: one Poll takes them
	var recs []connect.SourceRecord
	for deadline := time.Now().Add(5 * time.Second); len(recs) < 3; {
		if time.Now().After(deadline) {
			break
		}
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		got, err := r.tasks[0].Poll(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, got...)
		if len(got) > 0 {
			if err := r.tasks[0].Commit(context.Background(), got); err != nil {
				t.Fatal(err)
			}
		}
	}
	tomb := false
	for _, rec := range recs {
		t.Logf("key %s value %.80s", rec.Key, rec.Value)
		if rec.Value == nil && string(rec.Key) == `{"id":1}` {
			tomb = true
		}
	}
	if !tomb {
		t.Errorf("no tombstone of the old key {\"id\":1} of the UPDATE that changed it (%d records)", len(recs))
	}
}
