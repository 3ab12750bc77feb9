package pgaudit

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// Two connectors (one audit schema) capture the same table, both with
// snapshot.mode=initial, started at the same time while writers change the
// table: each gets a complete snapshot consistent with its own stream, and
// deleting one leaves the other's triggers and stream alone.
func TestInitialSnapshotTwoConnectorsOneTable(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	table := qualified(s, "t")
	mustExec(t, db, `CREATE TABLE `+table+` (id int PRIMARY KEY, n int NOT NULL)`)
	const rows = 2000
	mustExec(t, db, `INSERT INTO `+table+` SELECT g, 0 FROM generate_series(1, $1) g`, rows)

	stopWriters := counterWriters(t, db, 3, 11, rows, table)
	audit := auditSchemaFor(t, db)
	var rs [2]*running
	var errs [2]error
	var starts sync.WaitGroup
	for i := range rs {
		cfg := baseConfig(testenv.Unique(fmt.Sprintf("snap2%c-", 'a'+i)), url, audit, s+".t")
		cfg[KeySnapshotMode] = snapshotInitial
		cfg[KeyPollMaxRecords] = "1000"
		starts.Add(1)
		go func() {
			defer starts.Done()
			rs[i], errs[i] = tryStart(t, cfg, connect.NewMemoryLedger())
		}()
	}
	starts.Wait()
	for i, r := range rs {
		if errs[i] != nil {
			stopWriters()
			t.Fatalf("connector %d: %v", i, errs[i])
		}
		t.Cleanup(func() { _ = r.stop(true) })
	}
	var got [2][]change
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		for i, r := range rs {
			got[i] = append(got[i], r.drain()...)
		}
	}
	stopWriters()
	for i, r := range rs {
		for more := r.drain(); len(more) > 0; more = r.drain() {
			got[i] = append(got[i], more...)
		}
		t.Run(fmt.Sprintf("connector %d", i), func(t *testing.T) { replayMatches(t, db, table, got[i]) })
	}

	// Deleting the second leaves the first capturing.
	if err := rs[1].stop(true); err != nil {
		t.Fatal(err)
	}
	if n := triggerCount(t, db, s, "t"); n != 4 {
		t.Errorf("%d triggers on the table after deleting one of two connectors, want 4", n)
	}
	mustExec(t, db, `INSERT INTO `+table+` VALUES (0, 42)`)
	if c := rs[0].collect(1, true)[0]; c.Op != "c" || fmt.Sprint(c.After["n"]) != "42" {
		t.Errorf("after deleting the other connector: %s %v", c.Op, c.After)
	}
}

// replayMatches replays got (records of table, snapshot first) and checks
// that no row's counter n goes back and that the result is the table's
// content.
func replayMatches(t *testing.T, db *pgxpool.Pool, table string, got []change) {
	t.Helper()
	state := map[string]int64{}
	snapshot := 0
	for i, c := range got {
		key := fmt.Sprint(c.Key["id"])
		switch c.Op {
		case "r", "c", "u":
			if c.Op == "r" {
				snapshot++
			}
			n, _ := c.After["n"].(json.Number).Int64()
			if old, ok := state[key]; ok && n < old {
				t.Fatalf("record %d (%s) of row %s says n=%d after n=%d", i, c.Op, key, n, old)
			}
			state[key] = n
		case "d":
			delete(state, key)
		default:
			t.Fatalf("record %d: op %s", i, c.Op)
		}
	}
	if snapshot == 0 {
		t.Fatal("no snapshot record")
	}
	want := map[string]int64{}
	rows, err := db.Query(context.Background(), `SELECT id::text, n FROM `+table)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var n int64
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		want[id] = n
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	if len(want) != len(state) {
		t.Errorf("replayed %d rows, the table holds %d", len(state), len(want))
	}
	for id, n := range want {
		if got, ok := state[id]; !ok || got != n {
			t.Errorf("row %s: replayed n=%d (present %v), table n=%d", id, got, ok, n)
		}
	}
}

// A captured table renamed with changes undelivered, and a new table made
// under its old name: the next Start snapshots the new table (its triggers
// are new) without mixing it with the renamed table's changes, whether the
// renamed table stays configured under its new name or not.
func TestInitialSnapshotRenamedAndRecreated(t *testing.T) {
	for _, keepOld := range []bool{false, true} {
		t.Run(fmt.Sprintf("old configured %v", keepOld), func(t *testing.T) {
			db, url := admin(t)
			s := newSchema(t, db)
			mustExec(t, db, `CREATE TABLE `+qualified(s, "orders")+` (id int PRIMARY KEY, v text)`)
			mustExec(t, db, `INSERT INTO `+qualified(s, "orders")+` VALUES (1, 'old')`)
			cfg := baseConfig(testenv.Unique("snapren-"), url, auditSchemaFor(t, db), s+".orders")
			cfg[KeySnapshotMode] = snapshotInitial
			l := connect.NewMemoryLedger()
			r := startConnector(t, cfg, l)
			if c := r.collect(1, true)[0]; c.Op != "r" || fmt.Sprint(c.Key["id"]) != "1" {
				t.Fatalf("first snapshot: %s %v", c.Op, c.Key)
			}
			r.quiet()
			if err := r.stop(false); err != nil {
				t.Fatal(err)
			}
			// Undelivered: made while the connector is stopped.
			mustExec(t, db, `INSERT INTO `+qualified(s, "orders")+` VALUES (2, 'pending')`)
			mustExec(t, db, `ALTER TABLE `+qualified(s, "orders")+` RENAME TO orders_old`)
			mustExec(t, db, `CREATE TABLE `+qualified(s, "orders")+` (id int PRIMARY KEY, w int)`)
			mustExec(t, db, `INSERT INTO `+qualified(s, "orders")+` VALUES (10, 100), (11, 110)`)
			if keepOld {
				cfg[KeyTables] = s + ".orders," + s + ".orders_old"
			}
			r = startConnector(t, cfg, l)
			t.Cleanup(func() { _ = r.stop(true) })
			got := r.collect(3, true)
			var snap []string
			for _, c := range got {
				switch {
				case c.Op == "c":
					wantTable := "orders"
					if keepOld {
						wantTable = "orders_old"
					}
					if fmt.Sprint(c.Key["id"]) != "2" || c.After["v"] != "pending" || c.Source.Table != wantTable {
						t.Errorf("pending change: %s of %s %v", c.Op, c.Source.Table, c.After)
					}
				case c.Op == "r":
					if c.Source.Table != "orders" || c.After["w"] == nil || c.After["v"] != nil {
						t.Errorf("snapshot record: of %s %v", c.Source.Table, c.After)
					}
					snap = append(snap, fmt.Sprint(c.Key["id"]))
				default:
					t.Errorf("unexpected %s of %s %v", c.Op, c.Source.Table, c.After)
				}
			}
			if fmt.Sprint(snap) != "[10 11]" {
				t.Errorf("snapshot of the new table: %v, want [10 11]", snap)
			}
			r.quiet()
			mustExec(t, db, `UPDATE `+qualified(s, "orders")+` SET w = 101 WHERE id = 10`)
			if c := r.collect(1, true)[0]; c.Op != "u" || c.Source.Table != "orders" || fmt.Sprint(c.After["w"]) != "101" {
				t.Errorf("change of the new table: %s of %s %v", c.Op, c.Source.Table, c.After)
			}
		})
	}
}

// A reconfiguration under writes that adds two tables to two captured ones
// with tasks.max=2, moving a captured table to the other task: the added
// tables are snapshotted consistently with their changes, the captured
// ones are not snapshotted again and lose no change; replayed per table,
// the records give every table's final content.
func TestInitialSnapshotReconfigureTasks(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	names := []string{"a", "b", "c", "d"}
	const rows = 500
	for _, n := range names {
		mustExec(t, db, `CREATE TABLE `+qualified(s, n)+` (id int PRIMARY KEY, n int NOT NULL)`)
		mustExec(t, db, `INSERT INTO `+qualified(s, n)+` SELECT g, 0 FROM generate_series(1, $1) g`, rows)
	}
	qualifiedNames := make([]string, len(names))
	for i, n := range names {
		qualifiedNames[i] = qualified(s, n)
	}
	stopWriters := counterWriters(t, db, 4, 13, rows, qualifiedNames...)
	cfg := baseConfig(testenv.Unique("snaprecfg-"), url, auditSchemaFor(t, db), s+".a", s+".b")
	cfg[KeySnapshotMode] = snapshotInitial
	cfg[KeyTasksMax] = "2"
	cfg[KeyPollMaxRecords] = "1000"
	l := connect.NewMemoryLedger()
	r := startConnector(t, cfg, l)
	var got []change
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
		got = append(got, r.drain()...)
	}
	if err := r.stop(false); err != nil {
		t.Fatal(err)
	}
	// Round robin: c and d on task 0, a and b (a was task 0's) on task 1.
	cfg[KeyTables] = s + ".c," + s + ".a," + s + ".d," + s + ".b"
	r = startConnector(t, cfg, l)
	t.Cleanup(func() { _ = r.stop(true) })
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
		got = append(got, r.drain()...)
	}
	stopWriters()
	for more := r.drain(); len(more) > 0; more = r.drain() {
		got = append(got, more...)
	}
	byTable := map[string][]change{}
	for _, c := range got {
		byTable[c.Source.Table] = append(byTable[c.Source.Table], c)
	}
	for _, n := range names {
		t.Run(n, func(t *testing.T) {
			// Snapshotted once: by one transaction, before every change.
			txids := map[uint64]bool{}
			changed := false
			for i, c := range byTable[n] {
				if c.Op != "r" {
					changed = true
					continue
				}
				txids[c.Source.TxID] = true
				if changed {
					t.Errorf("record %d of %s: a snapshot record after a change", i, n)
				}
			}
			if len(txids) != 1 {
				t.Errorf("snapshot records of %s from %d transactions, want 1", n, len(txids))
			}
			replayMatches(t, db, qualified(s, n), byTable[n])
		})
	}
}

// A Start waiting for the advisory lock that all pgaudit connectors share
// (held here by hand, as another connector's long initial snapshot holds
// it) is not cut short by the role's statement_timeout: the wait is bounded
// by the Start's context only.
func TestProvisioningWaitsForTheSharedLockPastStatementTimeout(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "t")+` (id int PRIMARY KEY)`)
	ctx := testCtx(t)
	holder, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, lockKey); err != nil {
		_ = holder.Rollback(context.Background())
		t.Fatal(err)
	}
	cfg := baseConfig(testenv.Unique("lockwait-"), withStatementTimeout(t, url, "500ms"), auditSchemaFor(t, db), s+".t")
	// Released once the Start waits for it (pg_locks shows the wait), or
	// when the test ends; the goroutine alone ends the holder.
	watch, stopWatch := context.WithCancel(ctx)
	released := make(chan struct{})
	go func() {
		defer close(released)
		defer func() { _ = holder.Rollback(context.Background()) }()
		for watch.Err() == nil {
			var waiting bool
			_ = db.QueryRow(context.Background(), `SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND classid = $1 AND objid = $2 AND objsubid = 1)`, int64(lockKey>>32), lockKey&0xffffffff).Scan(&waiting)
			if waiting {
				time.Sleep(time.Second) // past the statement_timeout
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	defer func() { stopWatch(); <-released }()
	r, err := tryStart(t, cfg, connect.NewMemoryLedger())
	if err != nil {
		t.Fatalf("Start behind the shared lock: %v", err)
	}
	if err := r.stop(true); err != nil {
		t.Fatal(err)
	}
}
