package pgaudit

import (
	"context"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestLogicalDroppedChangesInterruptedPoll: a Poll interrupted (the worker
// cancels it when acknowledgements wait) after it left out the changes of
// a table a reconfiguration removed keeps the events it took whole for the
// next Poll, which delivers the rest (it did not panic on events the
// leaving out had zeroed).
func TestLogicalDroppedChangesInterruptedPoll(t *testing.T) {
	db, url := logicalAdmin(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "a")+` (id int PRIMARY KEY)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "b")+` (id int PRIMARY KEY, v text)`)
	name := testenv.Unique("logical-dropheld-")
	dropSlotAfter(t, db, name)
	l := connect.NewMemoryLedger()
	r := startConnector(t, logicalConfig(name, url, s+".a", s+".b"), l)
	mustExec(t, db, `INSERT INTO `+qualified(s, "a")+` VALUES (1), (2)`)
	mustExec(t, db, `INSERT INTO `+qualified(s, "b")+` VALUES (1, 'b1')`)
	mustExec(t, db, `INSERT INTO `+qualified(s, "b")+` VALUES (2, 'b2')`)
	if err := r.stop(false); err != nil {
		t.Fatal(err)
	}

	r2 := startConnector(t, logicalConfig(name, url, s+".b"), l)
	defer func() {
		if err := r2.stop(true); err != nil {
			t.Error(err)
		}
	}()
	task := r2.tasks[0]
	// 2 changes and a commit of a, a change and a commit of b, twice.
	await(t, 10*time.Second, func() (bool, string, error) {
		return len(task.lg.events) >= 6, "the events in the reader's buffer", nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if recs, err := task.Poll(ctx); err != nil || len(recs) > 0 {
		t.Fatalf("interrupted Poll: %d records, %v", len(recs), err)
	}
	got := r2.collect(2, true)
	for _, c := range got {
		if c.Topic != "tc."+s+".b" {
			t.Errorf("a change on %s: %s", c.Topic, c.Raw)
		}
	}
	r2.quiet()
}
