package pgaudit

import (
	"context"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestLogicalInterruptedPollsLargeTx: a transaction larger than the
// reader's buffer and poll.max.records, with key changes and deletes
// (tombstones), polled by Polls interrupted at random points of their
// rendering, then a restart in its middle: every change arrives, and the
// slot is not confirmed past it before all its records are acknowledged.
func TestLogicalInterruptedPollsLargeTx(t *testing.T) {
	db, url := logicalAdmin(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "a")+` (id int PRIMARY KEY, v text, p point)`)
	name := testenv.Unique("logical-largetx-")
	dropSlotAfter(t, db, name)
	cfg := logicalConfig(name, url, s+".a")
	cfg[KeyTombstonesOnDelete] = "true"
	cfg[KeyPollMaxRecords] = "300"
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()
	const n = 5000
	tx, err := db.Begin(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`INSERT INTO ` + qualified(s, "a") + ` SELECT g, 'v' || g, point(g, g) FROM generate_series(1, 5000) g`,
		`UPDATE ` + qualified(s, "a") + ` SET id = id + 100000 WHERE id % 10 = 0`,
		`DELETE FROM ` + qualified(s, "a") + ` WHERE id % 10 = 1`,
	} {
		if _, err := tx.Exec(testCtx(t), q); err != nil {
			t.Fatal(err)
		}
	}
	var end string
	if err := tx.QueryRow(testCtx(t), `SELECT 1`).Scan(new(int)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(testCtx(t), `SELECT pg_current_wal_lsn()::text`).Scan(&end); err != nil {
		t.Fatal(err)
	}
	// 5000 creates, 500 key changes (3 records each), 500 deletes (2).
	want := n + 500*3 + 500*2
	task := r.tasks[0]
	var all []connect.SourceRecord
	deadline := time.Now().Add(120 * time.Second)
	interrupted := 0
	for i := 0; len(all) < want; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d records", len(all), want)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%5)*5*time.Millisecond)
		recs, err := task.Poll(ctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			t.Fatal(err)
		}
		if len(recs) == 0 {
			interrupted++
		}
		all = append(all, recs...)
		// Acknowledge all but the last batch as they come.
		if len(all) > 0 && len(all) < want {
			if c := task.lg.confirmed.Load(); len(task.lg.pending) > 0 && task.lg.pending[0].complete && task.lg.pending[0].remaining == 0 {
				t.Fatalf("a transaction fully acknowledged left pending (confirmed %d)", c)
			}
		}
	}
	if len(all) != want {
		t.Fatalf("%d records, want %d", len(all), want)
	}
	t.Logf("%d empty (interrupted or idle) Polls, %d new pool connections", interrupted, task.pool.Stat().NewConnsCount())
	before := task.lg.confirmed.Load()
	if err := task.Commit(context.Background(), all[:len(all)-1]); err != nil {
		t.Fatal(err)
	}
	if c := task.lg.confirmed.Load(); c != before {
		t.Fatalf("confirmed moved from %d to %d with one record of the transaction unacknowledged", before, c)
	}
	if err := task.Commit(context.Background(), all[len(all)-1:]); err != nil {
		t.Fatal(err)
	}
	for _, tx := range task.lg.pending {
		t.Logf("pending %+v", *tx)
	}
	// The transaction's commit may still wait in the reader's buffer.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	if recs, err := task.Poll(ctx); err != nil || len(recs) != 0 {
		t.Fatalf("Poll after: %d records, %v", len(recs), err)
	}
	cancel()
	if c := task.lg.confirmed.Load(); c <= before {
		t.Fatalf("confirmed stayed at %d with every record acknowledged (pending %d)", c, len(task.lg.pending))
	}
	if len(task.lg.byLSN) != 0 {
		t.Fatalf("byLSN holds %d", len(task.lg.byLSN))
	}
}

// TestLogicalLargeTxRestartMidway: a restart after part of a large
// transaction was acknowledged delivers all of it again.
func TestLogicalLargeTxRestartMidway(t *testing.T) {
	db, url := logicalAdmin(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "a")+` (id int PRIMARY KEY)`)
	name := testenv.Unique("logical-largetx2-")
	dropSlotAfter(t, db, name)
	cfg := logicalConfig(name, url, s+".a")
	cfg[KeyPollMaxRecords] = "500"
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()
	mustExec(t, db, `INSERT INTO `+qualified(s, "a")+` SELECT g FROM generate_series(1, 6000) g`)
	mustExec(t, db, `INSERT INTO `+qualified(s, "a")+` VALUES (-1)`)
	got := r.pollUncommitted(2000)
	if err := r.tasks[0].Commit(context.Background(), got); err != nil {
		t.Fatal(err)
	}
	r.restartTask()
	seen := map[any]bool{}
	for _, c := range r.collect(6001, true) {
		seen[c.After["id"]] = true
	}
	if len(seen) != 6001 {
		t.Fatalf("%d distinct rows after the restart, want 6001", len(seen))
	}
}

// TestLogicalReconnectMidLargeTx: the walsender ends while a transaction
// larger than the reader's buffer is half sent: the records polled before
// and after the reconnection are each the transaction's once, and
// acknowledging all of them confirms it.
func TestLogicalReconnectMidLargeTx(t *testing.T) {
	db, url := logicalAdmin(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "a")+` (id int PRIMARY KEY)`)
	name := testenv.Unique("logical-largetx3-")
	dropSlotAfter(t, db, name)
	cfg := logicalConfig(name, url, s+".a")
	cfg[KeyPollMaxRecords] = "500"
	cfg[KeyTombstonesOnDelete] = "true"
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()
	tx, err := db.Begin(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`INSERT INTO ` + qualified(s, "a") + ` SELECT g FROM generate_series(1, 6000) g`,
		`DELETE FROM ` + qualified(s, "a") + ` WHERE id <= 1000`,
	} {
		if _, err := tx.Exec(testCtx(t), q); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	task := r.tasks[0]
	const want = 6000 + 2*1000
	got := r.pollUncommitted(1500)
	// Acknowledge some before the reconnection.
	if err := task.Commit(context.Background(), got[:700]); err != nil {
		t.Fatal(err)
	}
	_, slot := logicalNames(name)
	var pid int
	if err := db.QueryRow(testCtx(t), `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `SELECT pg_terminate_backend($1)`, pid)
	deadline := time.Now().Add(60 * time.Second)
	reconnected := false
	for len(got) < want || !reconnected {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d records, reconnected %v", len(got), want, reconnected)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		recs, err := task.Poll(ctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			t.Fatal(err)
		}
		got = append(got, recs...)
		var now *int
		_ = db.QueryRow(testCtx(t), `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&now)
		reconnected = now != nil && *now != pid
	}
	if len(got) != want {
		t.Fatalf("%d records, want %d", len(got), want)
	}
	before := task.lg.confirmed.Load()
	if err := task.Commit(context.Background(), got[700:len(got)-1]); err != nil {
		t.Fatal(err)
	}
	if c := task.lg.confirmed.Load(); c != before {
		t.Fatalf("confirmed moved with a record unacknowledged")
	}
	if err := task.Commit(context.Background(), got[len(got)-1:]); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if recs, err := task.Poll(ctx); err != nil || len(recs) != 0 {
		t.Fatalf("after: %d records, %v", len(recs), err)
	}
	if c := task.lg.confirmed.Load(); c <= before || len(task.lg.byLSN) != 0 {
		t.Fatalf("confirmed %d (was %d), byLSN %d", c, before, len(task.lg.byLSN))
	}
}

// TestLogicalReaderErrorFailsPoll: a slot dropped by hand ends the reader
// with an error; Poll returns it (after the records read before), also
// after an interrupted Poll, rather than nothing for ever.
func TestLogicalReaderErrorFailsPoll(t *testing.T) {
	db, url := logicalAdmin(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "a")+` (id int PRIMARY KEY)`)
	name := testenv.Unique("logical-largetx4-")
	dropSlotAfter(t, db, name)
	r := startConnector(t, logicalConfig(name, url, s+".a"), connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()
	mustExec(t, db, `INSERT INTO `+qualified(s, "a")+` VALUES (1)`)
	task := r.tasks[0]
	await(t, 10*time.Second, func() (bool, string, error) {
		return len(task.lg.events) >= 2, "the insert in the reader's buffer", nil
	})
	_, slot := logicalNames(name)
	await(t, 10*time.Second, func() (bool, string, error) {
		_, _ = db.Exec(testCtx(t), `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, slot)
		_, err := db.Exec(testCtx(t), `SELECT pg_drop_replication_slot($1)`, slot)
		return err == nil, "the slot dropped", nil
	})
	select {
	case <-task.lg.readerDone:
	case <-time.After(10 * time.Second):
		t.Fatal("the reader goes on without its slot")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := task.Poll(ctx); err != nil {
		t.Fatalf("interrupted Poll: %v", err)
	}
	var n int
	var failed error
	for i := 0; i < 20 && failed == nil; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		recs, err := task.Poll(ctx)
		cancel()
		n += len(recs)
		failed = err
	}
	if n != 1 || failed == nil {
		t.Fatalf("%d records, then %v", n, failed)
	}
	t.Log(failed)
}
