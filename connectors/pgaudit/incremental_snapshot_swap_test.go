package pgaudit

import (
	"context"
	"testing"
	"time"
)

// TestIncrementalSnapshotTableSwappedDuringChunk: a chunk reads its
// relation's name, then locks and reads the table by that name. A swap
// (the table renamed and a new one made under its name, in one
// transaction) that commits while the chunk waits for the table's lock
// makes the name another table's: LOCK TABLE looks the name up again once
// it has the lock. The chunk must not copy the new table's rows (which no
// trigger captures) as the captured table's: it gives way, and its next
// try reads the renamed table under its new name.
func TestIncrementalSnapshotTableSwappedDuringChunk(t *testing.T) {
	db, table, r := incrementalTable(t, "incr-swap-", 1000, nil)
	ctx := testCtx(t)
	var relid uint32
	if err := db.QueryRow(ctx, `SELECT $1::regclass::oid`, table).Scan(&relid); err != nil {
		t.Fatal(err)
	}
	swap, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = swap.Rollback(context.Background()) }()
	for _, sql := range []string{
		`ALTER TABLE ` + table + ` RENAME TO t_old`,
		`CREATE TABLE ` + table + ` (id int PRIMARY KEY, n int NOT NULL)`,
		`INSERT INTO ` + table + ` SELECT g, 999 FROM generate_series(1, 5) g`,
	} {
		if _, err := swap.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan error, 1)
	go func() {
		_, err := r.tasks[0].copyChunk(ctx)
		done <- err
	}()
	// The chunk waits for the renamed table's lock, under its old name.
	await(t, 10*time.Second, func() (bool, string, error) {
		var waiting bool
		err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE relation = $1 AND NOT granted)`, relid).Scan(&waiting)
		return waiting, "the chunk never waited for the table's lock", err
	})
	if err := swap.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil && !copyAgain(err) {
		t.Fatalf("copyChunk during the swap: %v", err)
	}
	for {
		ok, err := r.tasks[0].copyChunk(ctx)
		if err != nil && !copyAgain(err) {
			t.Fatalf("copyChunk after the swap: %v", err)
		}
		if err == nil && !ok {
			break
		}
	}
	// The renamed table's 1000 rows, not the new table's 5.
	var copied int64
	if err := db.QueryRow(ctx, `SELECT coalesce(sum(changes), 0) FROM `+auditTable(r)+` WHERE op = 'r'`).Scan(&copied); err != nil {
		t.Fatal(err)
	}
	if copied != 1000 {
		t.Fatalf("%d rows copied as 'r', want the renamed table's 1000 (5: the new table's, which no trigger captures)", copied)
	}
}
