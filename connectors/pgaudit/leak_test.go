package pgaudit

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// awaitNoNewGoroutines waits until no goroutine started since before runs
// code of pgx, puddle or the connector.
func awaitNoNewGoroutines(t *testing.T, before map[string]bool) {
	t.Helper()
	testenv.AwaitNoNewGoroutines(t, before, "Stopped", 15*time.Second, func(g string) bool {
		return strings.Contains(g, "jackc/pgx") || strings.Contains(g, "jackc/puddle") || strings.Contains(g, "connectors/pgaudit.")
	})
}

// A connector and task that ran, were interrupted (a pause: the unmark
// timer), stopped during a blocked Poll and after their database connections
// were terminated leave no goroutine behind once Stopped returned.
func TestLeakTaskLifecycle(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "lk")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY)`)
	cfg := baseConfig(testenv.Unique("leak-"), url, auditSchemaFor(t, db), s+".lk")
	// Warm the admin pool: its own connections are not the connector's.
	mustExec(t, db, `SELECT 1`)
	before := testenv.GoroutineIDs()
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	stopped := false
	defer func() {
		if !stopped {
			_ = r.stop(true)
		}
	}()
	mustExec(t, db, `INSERT INTO `+tbl+` SELECT g FROM generate_series(1, 10) g`)
	r.collect(10, true)

	// The database goes away under a waiting task.
	var n int
	if err := db.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE starts_with(application_name, $1)`, ApplicationNamePrefix(r.name)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `INSERT INTO `+tbl+` SELECT g FROM generate_series(11, 20) g`)
	r.collect(10, true)

	// A pause: an interrupted Poll schedules the unmark.
	task := r.tasks[0]
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := task.Poll(ctx)
		done <- err
	}()
	await(t, 10*time.Second, func() (bool, string, error) {
		var waiting int
		err := db.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE starts_with(application_name, $1) AND query LIKE 'LISTEN%'`, ApplicationNamePrefix(r.name)).Scan(&waiting)
		return waiting > 0 || err != nil, "the task's LISTEN connection", err
	})
	cancel()
	<-done
	// Stopped during a blocked Poll.
	go func() {
		_, err := task.Poll(context.Background())
		done <- err
	}()
	task.Stop(false)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop did not end a blocked Poll")
	}
	stopped = true
	if err := r.stop(true); err != nil {
		t.Fatal(err)
	}
	awaitNoConnections(t, db, r.name)
	awaitNoNewGoroutines(t, before)
}

// A task stopped while it starts leaves nothing behind once Stopped
// returned, wherever the Stop lands.
func TestLeakStopDuringStart(t *testing.T) {
	db, r, tcs := connectorWithoutTasks(t, "leakstart-")
	mustExec(t, db, `SELECT 1`)
	for _, delay := range []time.Duration{0, time.Millisecond, 3 * time.Millisecond, 10 * time.Millisecond, 30 * time.Millisecond} {
		before := testenv.GoroutineIDs()
		task := &Task{}
		ctx := connect.WithHost(testCtx(t), testHost(r.name, 0, r.ledger))
		started := make(chan error, 1)
		go func() { started <- task.Start(ctx, tcs[0]) }()
		time.Sleep(delay) // where Stop lands, not a wait for a condition
		task.Stop(false)
		select {
		case <-started:
		case <-time.After(20 * time.Second):
			t.Fatal("Start still running 20s after Stop")
		}
		if err := task.Stopped(ctx); err != nil {
			t.Fatal(err)
		}
		awaitNoNewGoroutines(t, before)
	}
}
