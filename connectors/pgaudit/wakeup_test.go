package pgaudit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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

	notified := listenOn(t, ctx, url, n.channel)

	// A Poll blocks until the insert wakes it: the interval is 10 minutes,
	// and so is its first wait without a notification (the doubling idle
	// step starts high), so only the task's own LISTEN can end it early.
	type result struct {
		recs []connect.SourceRecord
		err  error
	}
	done := make(chan result, 1)
	r.tasks[0].idleStep = 10 * time.Minute
	go func() {
		recs, err := r.tasks[0].Poll(ctx)
		done <- result{recs, err}
	}()
	awaitWaiting(t, db, cfg[KeyAuditSchema], n, true)
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (1)`)
	if !notified(10 * time.Second) {
		t.Error("no NOTIFY while the task was waiting")
	}
	var res result
	select {
	case res = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the NOTIFY did not wake the task's Poll within 10s")
	}
	if res.err != nil || len(res.recs) != 1 {
		t.Fatalf("Poll: %d records, %v", len(res.recs), res.err)
	}
	if err := r.tasks[0].Commit(ctx, res.recs); err != nil {
		t.Fatal(err)
	}
	awaitWaiting(t, db, cfg[KeyAuditSchema], n, false)
	// Busy task: writers do not notify.
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (2)`)
	if notified(300 * time.Millisecond) {
		t.Error("a NOTIFY was sent although no task was waiting")
	}
}

// listenOn LISTENs on channel from a connection of its own and returns a
// function that reports whether a notification arrives within a duration.
// Any failure other than reaching that deadline (a broken connection) fails
// the test: "no notification" must mean none was sent.
func listenOn(t *testing.T, ctx context.Context, url, channel string) func(within time.Duration) bool {
	t.Helper()
	l, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(context.Background()); err != nil {
			t.Errorf("closing the LISTEN connection: %v", err)
		}
	})
	if _, err := l.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	return func(within time.Duration) bool {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, within)
		defer cancel()
		_, err := l.WaitForNotification(wctx)
		if err == nil {
			return true
		}
		if errors.Is(wctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil && !l.IsClosed() {
			return false // the deadline: no notification
		}
		t.Fatalf("waiting for a NOTIFY on %s: %v", channel, err)
		return false
	}
}

// awaitWaiting waits until some task is marked waiting (or none is) in the
// wakeup table, and checks that the waiters sequence writers read agrees.
func awaitWaiting(t *testing.T, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, auditSchema string, n names, want bool) {
	t.Helper()
	awaitWaiters(t, db, auditSchema, n, func(c int64) bool { return (c > 0) == want }, fmt.Sprintf("waiting %v", want))
}

// awaitWaiters waits until the number of waiting rows satisfies ok and the
// waiters sequence holds that same number.
func awaitWaiters(t *testing.T, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, auditSchema string, n names, ok func(int64) bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var rows int64
		var seq *int64
		err := db.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM `+qualified(auditSchema, n.wakeup)+` WHERE waiting), pg_sequence_last_value($1::regclass)`,
			qualified(auditSchema, n.waiters)).Scan(&rows, &seq)
		if err != nil {
			t.Fatal(err)
		}
		if ok(rows) && seq != nil && *seq == rows {
			return
		}
		if time.Now().After(deadline) {
			got := "NULL"
			if seq != nil {
				got = fmt.Sprint(*seq)
			}
			t.Fatalf("want %s: %d waiting rows in the wakeup table, waiters sequence %s", what, rows, got)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestWakeupsTwoTasks: the waiters sequence counts the waiting tasks, so
// while one task is busy, writers still wake the other one, and none is
// sent once both are busy.
func TestWakeupsTwoTasks(t *testing.T) {
	db, url := admin(t)
	ctx := testCtx(t)
	s := newSchema(t, db)
	for _, tb := range []string{"a", "b"} {
		mustExec(t, db, `CREATE TABLE `+qualified(s, tb)+` (id int PRIMARY KEY)`)
	}
	cfg := baseConfig(testenv.Unique("wake2-"), url, auditSchemaFor(t, db), s+".a", s+".b")
	cfg[KeyTasksMax] = "2"
	cfg[KeyPollIntervalMS] = "600000"
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()
	if len(r.tasks) != 2 {
		t.Fatalf("%d tasks, want 2 (one per table)", len(r.tasks))
	}
	n := objectNames(r.name)

	notified := listenOn(t, ctx, url, n.channel)

	type result struct {
		recs []connect.SourceRecord
		err  error
	}
	polls := make([]chan result, len(r.tasks))
	for i, task := range r.tasks {
		polls[i] = make(chan result, 1)
		go func() {
			recs, err := task.Poll(ctx)
			polls[i] <- result{recs, err}
		}()
	}
	awaitWaiters(t, db, cfg[KeyAuditSchema], n, func(c int64) bool { return c == 2 }, "both tasks waiting")

	// The task of table a wakes; the other one keeps waiting.
	mustExec(t, db, `INSERT INTO `+qualified(s, "a")+` VALUES (1)`)
	if !notified(10 * time.Second) {
		t.Fatal("no NOTIFY while both tasks waited")
	}
	var woken int
	var res result
	select {
	case res = <-polls[0]:
		woken = 0
	case res = <-polls[1]:
		woken = 1
	case <-time.After(30 * time.Second):
		t.Fatal("no Poll returned the change of table a")
	}
	// commitChangeOf checks that a Poll returned the one change of table
	// and commits it, as Kafka's acknowledgement would.
	commitChangeOf := func(task int, res result, table string) {
		t.Helper()
		if res.err != nil || len(res.recs) != 1 || decode(t, res.recs[0]).Source.Table != table {
			t.Fatalf("Poll: %d records, %v; want the change of table %s", len(res.recs), res.err, table)
		}
		if err := r.tasks[task].Commit(ctx, res.recs); err != nil {
			t.Fatal(err)
		}
	}
	commitChangeOf(woken, res, "a")
	awaitWaiters(t, db, cfg[KeyAuditSchema], n, func(c int64) bool { return c == 1 }, "one task waiting")

	// Writers still notify for the task that waits.
	mustExec(t, db, `INSERT INTO `+qualified(s, "b")+` VALUES (1)`)
	if !notified(10 * time.Second) {
		t.Fatal("no NOTIFY while one task still waited")
	}
	other := 1 - woken
	select {
	case res = <-polls[other]:
	case <-time.After(30 * time.Second):
		t.Fatal("the waiting task's Poll did not return the change of table b")
	}
	commitChangeOf(other, res, "b")
	awaitWaiters(t, db, cfg[KeyAuditSchema], n, func(c int64) bool { return c == 0 }, "no task waiting")
	mustExec(t, db, `INSERT INTO `+qualified(s, "a")+` VALUES (2)`)
	if notified(300 * time.Millisecond) {
		t.Error("a NOTIFY was sent although both tasks were busy")
	}
}

// TestWaitersSequenceAddedOnStart: a wakeup table from before the waiters
// sequence existed gets one when the connector starts (the capture
// function it installs reads it), and deletion drops it with the table.
func TestWaitersSequenceAddedOnStart(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "w")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY)`)
	audit := auditSchemaFor(t, db)
	cfg := baseConfig(testenv.Unique("waiters-"), url, audit, s+".w")
	l := connect.NewMemoryLedger()
	n := objectNames(cfg["name"])

	r := startConnector(t, cfg, l)
	if err := r.stop(false); err != nil {
		t.Fatal(err)
	}
	if !relExists(t, db, audit, n.waiters) {
		t.Fatal("no waiters sequence after the first start")
	}
	mustExec(t, db, `DROP SEQUENCE `+qualified(audit, n.waiters))

	r = startConnector(t, cfg, l)
	if !relExists(t, db, audit, n.waiters) {
		t.Fatal("the start did not add the waiters sequence to the existing wakeup table")
	}
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (1)`)
	if got := r.collect(1, true); got[0].Op != "c" {
		t.Fatalf("captured %+v, want the insert", got[0])
	}
	if err := r.stop(true); err != nil {
		t.Fatal(err)
	}
	for _, rel := range []string{n.wakeup, n.waiters} {
		if relExists(t, db, audit, rel) {
			t.Errorf("%s survived the deletion", rel)
		}
	}
}

// TestWakeupAfterFailedClear: when a task, busy again, fails to clear its
// mark, the waiters count may already be 0 (setval is not transactional)
// while its row still says waiting. The task must mark itself again before
// it next waits, or writers would never wake it.
func TestWakeupAfterFailedClear(t *testing.T) {
	db, url := admin(t)
	ctx := testCtx(t)
	s := newSchema(t, db)
	tbl := qualified(s, "w")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY)`)
	cfg := baseConfig(testenv.Unique("wakefail-"), url, auditSchemaFor(t, db), s+".w")
	cfg[KeyPollIntervalMS] = "600000"
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()
	n := objectNames(r.name)
	wakeup := qualified(cfg[KeyAuditSchema], n.wakeup)

	notified := listenOn(t, ctx, url, n.channel)
	poll := func() <-chan []connect.SourceRecord {
		out := make(chan []connect.SourceRecord, 1)
		go func() {
			recs, err := r.tasks[0].Poll(ctx)
			if err != nil {
				t.Errorf("Poll: %v", err)
			}
			out <- recs
		}()
		return out
	}

	// Clearing the mark fails at COMMIT, after the count was set to 0.
	mustExec(t, db, `CREATE FUNCTION `+qualified(s, "refuse")+`() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'refused'; END$$`)
	mustExec(t, db, `CREATE CONSTRAINT TRIGGER refuse_clear AFTER UPDATE ON `+wakeup+` DEFERRABLE INITIALLY DEFERRED
		FOR EACH ROW WHEN (NOT NEW.waiting) EXECUTE FUNCTION `+qualified(s, "refuse")+`()`)
	first := poll()
	awaitWaiting(t, db, cfg[KeyAuditSchema], n, true)
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (1)`)
	recs := <-first
	if len(recs) != 1 {
		t.Fatalf("Poll returned %d records, want 1", len(recs))
	}
	var rows int64
	var seq *int64
	if err := db.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+wakeup+` WHERE waiting), pg_sequence_last_value($1::regclass)`, qualified(cfg[KeyAuditSchema], n.waiters)).Scan(&rows, &seq); err != nil {
		t.Fatal(err)
	}
	if rows != 1 || seq == nil || *seq != 0 {
		t.Fatalf("after the failed clear: %d waiting rows, count %v; want 1 row and count 0 (the case under test)", rows, seq)
	}
	mustExec(t, db, `DROP TRIGGER refuse_clear ON `+wakeup)
	if err := r.tasks[0].Commit(ctx, recs); err != nil {
		t.Fatal(err)
	}
	for notified(100 * time.Millisecond) { // the first insert's NOTIFY
	}

	// Idle again: the task marks itself again, so the next change is
	// announced.
	second := poll()
	awaitWaiters(t, db, cfg[KeyAuditSchema], n, func(c int64) bool { return c == 1 }, "the task marked again")
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (2)`)
	if !notified(10 * time.Second) {
		t.Error("no NOTIFY for the waiting task after its failed clear")
	}
	if recs := <-second; len(recs) != 1 {
		t.Fatalf("Poll returned %d records, want 1", len(recs))
	}
}

// TestNoWakeupsBeforeATaskWaits: a connector whose tasks have not asked for
// NOTIFYs yet (or are not running) costs writers no NOTIFY.
func TestNoWakeupsBeforeATaskWaits(t *testing.T) {
	db, url := admin(t)
	ctx := testCtx(t)
	s := newSchema(t, db)
	tbl := qualified(s, "w")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY)`)
	cfg := baseConfig(testenv.Unique("nowake-"), url, auditSchemaFor(t, db), s+".w")
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()
	notified := listenOn(t, ctx, url, objectNames(r.name).channel)
	writeUnnotified(t, db, notified, `INSERT INTO `+tbl+` VALUES (1)`)
	if got := r.collect(1, true); got[0].Op != "c" {
		t.Fatalf("captured %+v, want the insert", got[0])
	}
}

// TestStaleWakeupRowsPruned: a row left by a task that no longer exists
// (killed while waiting, then the connector ran fewer tasks) is removed at
// the next mark, so writers stop paying for NOTIFYs nobody waits for.
func TestStaleWakeupRowsPruned(t *testing.T) {
	db, url := admin(t)
	ctx := testCtx(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "w")+` (id int PRIMARY KEY)`)
	cfg := baseConfig(testenv.Unique("stale-"), url, auditSchemaFor(t, db), s+".w")
	cfg[KeyPollIntervalMS] = "600000"
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()
	n := objectNames(r.name)
	mustExec(t, db, `INSERT INTO `+qualified(cfg[KeyAuditSchema], n.wakeup)+` VALUES (3, true)`) // task 3 of an earlier tasks.max

	done := make(chan error, 1)
	go func() {
		_, err := r.tasks[0].Poll(ctx)
		done <- err
	}()
	// The committed rows become exactly task 0's (setval is not
	// transactional, so the count alone can run ahead of the commit).
	deadline := time.Now().Add(10 * time.Second)
	for {
		var tasks []int32
		if err := db.QueryRow(ctx, `SELECT coalesce(array_agg(task ORDER BY task), '{}') FROM `+qualified(cfg[KeyAuditSchema], n.wakeup)).Scan(&tasks); err != nil {
			t.Fatal(err)
		}
		if len(tasks) == 1 && tasks[0] == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("wakeup rows of tasks %v, want only task 0's (the stale row of task 3 pruned)", tasks)
		}
		time.Sleep(10 * time.Millisecond)
	}
	awaitWaiters(t, db, cfg[KeyAuditSchema], n, func(c int64) bool { return c == 1 }, "only the running task waiting")
	r.tasks[0].Stop(false)
	<-done
}

// TestStoppingTaskPrunesNothing: a task that stops may be of an older
// generation (an instance that returned late, when the connector already
// runs more tasks): removing its own row must leave the others' alone.
func TestStoppingTaskPrunesNothing(t *testing.T) {
	db, url := admin(t)
	ctx := testCtx(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "w")+` (id int PRIMARY KEY)`)
	cfg := baseConfig(testenv.Unique("stopprune-"), url, auditSchemaFor(t, db), s+".w")
	l := connect.NewMemoryLedger()
	r := startConnector(t, cfg, l)
	n := objectNames(r.name)
	wakeup := qualified(cfg[KeyAuditSchema], n.wakeup)
	mustExec(t, db, `INSERT INTO `+wakeup+` VALUES (4, true)`) // task 4 of a newer generation, waiting
	if err := r.stop(false); err != nil {
		t.Fatal(err)
	}
	var rows []int32
	if err := db.QueryRow(ctx, `SELECT coalesce(array_agg(task ORDER BY task), '{}') FROM `+wakeup).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0] != 4 {
		t.Errorf("wakeup rows after task 0 stopped: %v, want only task 4's", rows)
	}
	var count int64 = -1
	if err := db.QueryRow(ctx, `SELECT coalesce(pg_sequence_last_value($1::regclass), -1)`, qualified(cfg[KeyAuditSchema], n.waiters)).Scan(&count); err != nil || count != 1 {
		t.Errorf("waiters count after task 0 stopped: %d (%v), want 1", count, err)
	}
	r = startConnector(t, cfg, l)
	if err := r.stop(true); err != nil {
		t.Fatal(err)
	}
}

// TestListenReconnectsWhenConnectingIsSlow: a LISTEN connection lost while
// poll.interval.ms is shorter than connecting takes still comes back (the
// reconnect used to get only the wait's few milliseconds, and failed for
// good, leaving the task polling).
func TestListenReconnectsWhenConnectingIsSlow(t *testing.T) {
	db, url := admin(t)
	ctx := testCtx(t)
	if !strings.Contains(url, "127.0.0.1:5432") {
		testenv.Skip(t, "the test proxies 127.0.0.1:5432; %s points elsewhere", testenv.PostgresEnv)
	}
	px := newProxy(t, "127.0.0.1:5432")
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "w")+` (id int PRIMARY KEY)`)
	cfg := baseConfig(testenv.Unique("slowlisten-"), strings.Replace(url, "127.0.0.1:5432", px.addr, 1), auditSchemaFor(t, db), s+".w")
	cfg[KeyPollIntervalMS] = "20"
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()
	app := ApplicationName(r.name, "listen-0")
	listening := func() (bool, string, error) {
		var n int
		err := db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n)
		return n == 1, "the LISTEN connection " + app, err
	}
	await(t, 10*time.Second, listening)

	px.slow(200 * time.Millisecond)
	mustExec(t, db, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, app)
	stop := make(chan struct{})
	polled := make(chan struct{})
	task := r.tasks[0]
	go func() {
		defer close(polled)
		for {
			select {
			case <-stop:
				return
			default:
			}
			pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			_, _ = task.Poll(pctx)
			cancel()
		}
	}()
	// Before the connector stops (deferred earlier, so run later).
	defer func() { close(stop); <-polled }()
	await(t, 15*time.Second, listening)
}

// TestInterruptedWaitClearsTheMark: a Poll interrupted while it waits for a
// NOTIFY (a pause) clears its waiting mark, so writers stop sending
// NOTIFYs (whose lock makes them take turns) until it polls again.
func TestInterruptedWaitClearsTheMark(t *testing.T) {
	ctx := testCtx(t)
	db, tbl, r := oneTable(t, "pausemark-", `(id int PRIMARY KEY)`, connect.Config{KeyPollIntervalMS: "600000"})
	cfg, n := r.cfg, objectNames(r.name)
	notified := listenOn(t, ctx, cfg[KeyURL], n.channel)

	pctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	r.tasks[0].idleStep = 10 * time.Minute
	go func() {
		_, err := r.tasks[0].Poll(pctx)
		done <- err
	}()
	awaitWaiting(t, db, cfg[KeyAuditSchema], n, true)
	cancel() // as the worker does to pause the task
	if err := <-done; err == nil {
		t.Fatal("an interrupted Poll returned no error")
	}
	awaitWaiting(t, db, cfg[KeyAuditSchema], n, false)
	writeUnnotified(t, db, notified, `INSERT INTO `+tbl+` VALUES (1)`)
	// Polling again (resumed) picks the change up.
	if got := r.collect(1, true); got[0].Op != "c" {
		t.Errorf("after resuming: %+v", got[0])
	}
}

// TestPauseDuringAReadClearsTheMark: a Poll woken by a NOTIFY and then
// interrupted (a pause) while it reads still returns what it read, and
// clears the task's waiting mark, so writers send no NOTIFYs while the
// task is not polled.
func TestPauseDuringAReadClearsTheMark(t *testing.T) {
	ctx := testCtx(t)
	db, tbl, r := oneTable(t, "pauseread-", `(id int PRIMARY KEY)`, connect.Config{KeyPollIntervalMS: "300"})
	cfg, n, task := r.cfg, objectNames(r.name), r.tasks[0]
	if recs, err := task.Poll(ctx); err != nil || len(recs) != 0 {
		t.Fatalf("a Poll of an empty table: %d records, %v", len(recs), err)
	}
	awaitWaiting(t, db, cfg[KeyAuditSchema], n, true)
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (1)`)

	// The audit table locked: the next read waits.
	lock := begin(t, db)
	txExec(t, lock, `LOCK TABLE `+qualified(cfg[KeyAuditSchema], n.table)+` IN ACCESS EXCLUSIVE MODE`)
	pctx, cancel := context.WithCancel(ctx)
	type result struct {
		recs []connect.SourceRecord
		err  error
	}
	done := make(chan result, 1)
	go func() {
		recs, err := task.Poll(pctx)
		done <- result{recs, err}
	}()
	await(t, 10*time.Second, func() (bool, string, error) {
		var n int
		err := db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`,
			ApplicationName(r.name, "task-0")).Scan(&n)
		return n > 0, "the task's read waiting for the lock", err
	})
	cancel() // a pause
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.err != nil || len(res.recs) != 1 {
		t.Fatalf("the interrupted Poll: %d records, %v", len(res.recs), res.err)
	}
	awaitWaiting(t, db, cfg[KeyAuditSchema], n, false)
	writeUnnotified(t, db, listenOn(t, ctx, cfg[KeyURL], n.channel), `INSERT INTO `+tbl+` VALUES (2)`)
}

// TestCommitInterruptsDoNotChurnTheMark: the runtime interrupts a waiting
// Poll to commit and polls again at once; the waiting mark is cleared
// only when no Poll follows (a pause), not at every interruption (each
// clear and re-mark is a transaction taking the wake-up table's lock).
func TestCommitInterruptsDoNotChurnTheMark(t *testing.T) {
	ctx := testCtx(t)
	// This test's own schema, created first so that it is dropped (with
	// the trigger it puts on the wake-up table) after the connector stops.
	db0, _ := admin(t)
	s := newSchema(t, db0)
	// Interrupted Polls follow each other within milliseconds; a delay
	// this long keeps a slow machine from turning a gap into a pause.
	override(t, &unmarkDelay, time.Minute)
	db, _, r := oneTable(t, "churn-", `(id int PRIMARY KEY)`, connect.Config{KeyPollIntervalMS: "5000"})
	n, task := objectNames(r.name), r.tasks[0]
	// Count the writes to the wake-up table.
	mustExec(t, db, `CREATE TABLE `+qualified(s, "writes")+` (n int)`)
	mustExec(t, db, `CREATE FUNCTION `+qualified(s, "count")+`() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN INSERT INTO `+qualified(s, "writes")+` VALUES (1); RETURN NULL; END$$`)
	mustExec(t, db, `CREATE TRIGGER count AFTER INSERT OR UPDATE OR DELETE ON `+qualified(r.cfg[KeyAuditSchema], n.wakeup)+` FOR EACH ROW EXECUTE FUNCTION `+qualified(s, "count")+`()`)
	const interruptions = 20
	// The first interruption comes once the Poll has marked the task
	// waiting: that write is certain, and the later ones must not repeat it.
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := task.Poll(pctx)
		done <- err
	}()
	awaitWaiting(t, db, r.cfg[KeyAuditSchema], n, true)
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the interrupted Poll returned no error")
	}
	for i := range interruptions {
		if err := task.Commit(ctx, nil); err != nil {
			t.Fatal(err)
		}
		if i == interruptions-1 {
			break
		}
		pctx, cancel := context.WithTimeout(ctx, 60*time.Millisecond)
		_, err := task.Poll(pctx)
		ended := pctx.Err() != nil
		cancel()
		if err != nil && !ended {
			t.Fatalf("Poll: %v", err)
		}
	}
	var writes int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM `+qualified(s, "writes")).Scan(&writes); err != nil {
		t.Fatal(err)
	}
	if writes < 1 || writes > 2 {
		t.Errorf("%d interrupted Polls wrote the wake-up table %d times, want 1 or 2 (the first marks the task waiting, the others leave the mark)", interruptions, writes)
	}
}

// TestStopDuringPollIsNoFailure: Stop may come at any moment, also before
// the runtime cancels Poll's context; Poll then returns its cancellation,
// never a failure to read or mark.
func TestStopDuringPollIsNoFailure(t *testing.T) {
	_, _, r := oneTable(t, "stoppoll-", `(id int PRIMARY KEY)`, connect.Config{KeyPollIntervalMS: "1"})
	l := r.ledger
	tcs, err := r.conn.TaskConfigs(1)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 60 {
		task := &Task{}
		tctx := connect.WithHost(testCtx(t), testHost(r.name, 0, l))
		if err := task.Start(tctx, tcs[0]); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			for {
				if _, err := task.Poll(context.Background()); err != nil {
					done <- err
					return
				}
			}
		}()
		time.Sleep(time.Duration(i%6) * 500 * time.Microsecond)
		task.Stop(false)
		// Exactly the cancellation: a failure to read wraps it too.
		if err := <-done; err != context.Canceled {
			t.Errorf("stop %d: Poll returned %v, want its cancellation", i, err)
		}
		if err := task.Stopped(tctx); err != nil {
			t.Fatal(err)
		}
	}
}

// writeUnnotified runs a captured write and checks that it sent no NOTIFY
// (no task waits for one).
func writeUnnotified(t *testing.T, db *pgxpool.Pool, notified func(time.Duration) bool, sql string) {
	t.Helper()
	mustExec(t, db, sql)
	if notified(500 * time.Millisecond) {
		t.Errorf("%s sent a NOTIFY although no task waited for one", sql)
	}
}
