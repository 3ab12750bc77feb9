package pgaudit

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestWakeups: the trigger sends a NOTIFY while a task waits for one and
// none while the task is busy; a Poll blocked with a long poll interval is
// woken by the change.
func TestWakeups(t *testing.T) {
	db, url := admin(t)
	ctx := testCtx(t)
	s := newSchema(t, db)
	tbl := qualified(s, "w")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY)`)
	cfg := baseConfig(testenv.Unique("wake-"), url, auditSchemaFor(t, db), s+".w")
	cfg[KeyPollIntervalMS] = "600000"
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()
	n := objectNames(r.name)

	l, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	if _, err := l.Exec(ctx, "LISTEN "+pgx.Identifier{n.channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	notified := func(within time.Duration) bool {
		wctx, cancel := context.WithTimeout(ctx, within)
		defer cancel()
		_, err := l.WaitForNotification(wctx)
		return err == nil
	}

	// A Poll blocks (the interval is 10 minutes) until the insert wakes it.
	type result struct {
		recs []connect.SourceRecord
		err  error
	}
	done := make(chan result, 1)
	go func() {
		recs, err := r.tasks[0].Poll(ctx)
		done <- result{recs, err}
	}()
	awaitWaiting(t, db, qualified(cfg[KeyAuditSchema], n.wakeup), true)
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (1)`)
	if !notified(10 * time.Second) {
		t.Error("no NOTIFY while the task was waiting")
	}
	res := <-done
	if res.err != nil || len(res.recs) != 1 {
		t.Fatalf("Poll: %d records, %v", len(res.recs), res.err)
	}
	if err := r.tasks[0].Commit(ctx, res.recs); err != nil {
		t.Fatal(err)
	}
	awaitWaiting(t, db, qualified(cfg[KeyAuditSchema], n.wakeup), false)
	// Busy task: writers do not notify.
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (2)`)
	if notified(300 * time.Millisecond) {
		t.Error("a NOTIFY was sent although no task was waiting")
	}
}

func awaitWaiting(t *testing.T, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, table string, want bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting bool
		err := db.QueryRow(context.Background(), `SELECT coalesce(bool_or(waiting), false) FROM `+table).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		if waiting == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("wakeup table: waiting is %v, want %v", waiting, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
