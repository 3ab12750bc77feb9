package pgaudit

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestCommitOrderConcurrentCommitsInterleave: under capture.order = commit
// a transaction's audit rows are renumbered one by one as it commits, and
// a transaction that commits meanwhile draws its ids in between: the
// changes of two independent transactions committing at the same moment
// can interleave (the documented exception; each keeps its own order).
// Here B's statement drew its id between A's two rows, and A's COMMIT
// stalls between them (a deferred trigger of the user's, queued by a
// statement between them, waits for a lock the test holds) while B
// commits.
func TestCommitOrderConcurrentCommitsInterleave(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "events")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY)`)
	gate, key := commitGate(t, db, s)
	r := startCommitOrder(t, db, url, "interleave-", s+".events")

	holder := begin(t, db)
	txExec(t, holder, fmt.Sprintf(`SELECT pg_advisory_xact_lock(%d)`, key))
	// B's statement draws its id between A's two rows, so A's rows are not
	// one run of its own and are renumbered, one by one.
	a := begin(t, db)
	var aPID int32
	if err := a.QueryRow(testCtx(t), `SELECT pg_backend_pid()`).Scan(&aPID); err != nil {
		t.Fatal(err)
	}
	txExec(t, a, `INSERT INTO `+tbl+` VALUES (1)`)
	b := begin(t, db)
	txExec(t, b, `INSERT INTO `+tbl+` VALUES (3)`)
	txExec(t, a, `INSERT INTO `+gate+` VALUES (1)`)
	txExec(t, a, `INSERT INTO `+tbl+` VALUES (2)`)
	aDone := make(chan error, 1)
	go func() { aDone <- a.Commit(testCtx(t)) }()
	awaitAdvisoryWait(t, db, aPID, key)
	if err := b.Commit(testCtx(t)); err != nil { // B commits while A's COMMIT stalls
		t.Fatal(err)
	}
	if err := holder.Rollback(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if err := <-aDone; err != nil {
		t.Fatalf("transaction A: %v", err)
	}
	// Read once both are visible: A's first change, B's, A's second.
	if ids := keyIDs(t, r.collect(3, true)); !slices.Equal(ids, []int64{1, 3, 2}) {
		t.Fatalf("changes left in order %v, want [1 3 2]", ids)
	}
	r.quiet()
}

// TestCommitOrderLateCommitBetweenRowsInFlight: a transaction draws its id
// at COMMIT and then stalls; a transaction that committed before and one
// that commits meanwhile are polled and stay unacknowledged, so the stalled
// one's id lies between ids in flight. Once it commits, the task reads it
// (between the ids it excludes), exactly once, and nothing is left behind.
func TestCommitOrderLateCommitBetweenRowsInFlight(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "events")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY)`)
	gate, key := commitGate(t, db, s)
	r := startCommitOrder(t, db, url, "gap-", s+".events")
	task := r.tasks[0]
	var inFlight []connect.SourceRecord
	poll := func(want int64) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			recs, err := task.Poll(ctx)
			ended := ctx.Err() != nil
			cancel()
			if err != nil && !ended {
				t.Fatalf("Poll: %v", err)
			}
			if len(recs) > 0 {
				var got []change
				for _, rec := range recs {
					got = append(got, decode(t, rec))
				}
				if ids := keyIDs(t, got); !slices.Equal(ids, []int64{want}) {
					t.Fatalf("polled %v, want [%d]", ids, want)
				}
				inFlight = append(inFlight, recs...)
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("change %d did not arrive", want)
			}
		}
	}
	auditIDs := func() []int64 { return int64s(t, db, `SELECT id FROM `+auditTable(r)+` ORDER BY id`) }

	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (2)`)
	poll(2)
	holder := begin(t, db)
	txExec(t, holder, fmt.Sprintf(`SELECT pg_advisory_xact_lock(%d)`, key))
	aPID, aDone := inBackground(t, db, `INSERT INTO `+tbl+` VALUES (1)`, `INSERT INTO `+gate+` VALUES (1)`)
	awaitAdvisoryWait(t, db, aPID, key) // its id is drawn
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (3)`)
	poll(3)
	if err := holder.Rollback(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if err := <-aDone; err != nil {
		t.Fatalf("the stalled transaction: %v", err)
	}
	ids := auditIDs()
	if len(ids) != 3 || inFlight[0].SourceOffset["id"] != ids[0] || inFlight[1].SourceOffset["id"] != ids[2] {
		t.Fatalf("audit ids %v; in flight %v and %v: the stalled commit's id is not between them", ids, inFlight[0].SourceOffset["id"], inFlight[1].SourceOffset["id"])
	}
	poll(1)
	r.quiet()
	if err := task.Commit(context.Background(), inFlight); err != nil {
		t.Fatal(err)
	}
	r.quiet()
	if ids := auditIDs(); len(ids) != 0 {
		t.Fatalf("audit rows %v left after acknowledging every change", ids)
	}
}
