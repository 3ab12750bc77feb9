package pgaudit

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// pendingPages is how many pages the connector's incremental snapshots
// still have to copy, and how many tables (leaves) they concern.
func pendingPages(t *testing.T, db *pgxpool.Pool, r *running) (pages, tables int64) {
	t.Helper()
	if err := db.QueryRow(context.Background(), `SELECT coalesce(sum(end_block - next_block), 0), count(*) FROM `+qualified(r.cfg[KeyAuditSchema], objectNames(r.name).snapshot)).Scan(&pages, &tables); err != nil {
		t.Fatal(err)
	}
	return pages, tables
}

// collectAll polls until the incremental snapshots are done and a Poll
// finds nothing more.
func (r *running) collectAll(db *pgxpool.Pool) []change {
	r.t.Helper()
	var got []change
	deadline := time.Now().Add(60 * time.Second)
	for {
		// Pending before the drain: a Poll interrupted at its deadline may
		// have copied a chunk (it runs on) without reading it.
		_, left := pendingPages(r.t.(*testing.T), db, r)
		more := r.drain()
		got = append(got, more...)
		if len(more) == 0 && left == 0 {
			return got
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("the incremental snapshot did not finish within 60 s (%d records so far)", len(got))
		}
	}
}

// incrementalTable creates table t (id, n) holding rows rows (n = 0) in a
// fresh schema and starts a connector capturing it with
// snapshot.mode=incremental; set adds or replaces keys.
func incrementalTable(t *testing.T, prefix string, rows int, set connect.Config) (db *pgxpool.Pool, table string, r *running) {
	t.Helper()
	db, url := admin(t)
	s := newSchema(t, db)
	table = qualified(s, "t")
	mustExec(t, db, `CREATE TABLE `+table+` (id int PRIMARY KEY, n int NOT NULL)`)
	mustExec(t, db, `INSERT INTO `+table+` SELECT g, 0 FROM generate_series(1, $1) g`, rows)
	cfg := baseConfig(testenv.Unique(prefix), url, auditSchemaFor(t, db), s+".t")
	cfg[KeySnapshotMode] = snapshotIncremental
	maps.Copy(cfg, set)
	r = startConnector(t, cfg, connect.NewMemoryLedger())
	t.Cleanup(func() { _ = r.stop(true) })
	return db, table, r
}

// lockingWriter begins a transaction that runs sql (an UPDATE: it holds
// the rows' locks until the caller commits), rolled back at cleanup if
// still open.
func lockingWriter(t *testing.T, db *pgxpool.Pool, sql string) pgx.Tx {
	t.Helper()
	writer, err := db.Begin(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = writer.Rollback(context.Background()) })
	if _, err := writer.Exec(testCtx(t), sql); err != nil {
		t.Fatal(err)
	}
	return writer
}

// TestIncrementalSnapshotUnderWrites: with snapshot.mode=incremental the
// Start only installs the triggers and measures the table; the task copies
// it page by page while writers keep changing it. Replaying the records
// gives the table's final state, and no record of a row carries an older
// counter than one before it.
func TestIncrementalSnapshotUnderWrites(t *testing.T) {
	override(t, &snapshotChunkPages, 1)
	for _, level := range []string{levelStatement, levelRow} {
		t.Run(level, func(t *testing.T) {
			const rows = 4000
			db, table, r := incrementalTable(t, "incr-", rows, connect.Config{KeyCaptureLevel: level, KeyPollMaxRecords: "500"})

			// Nothing copied by the Start: the whole table is pending.
			pages, leaves := pendingPages(t, db, r)
			if leaves != 1 || pages < 10 {
				t.Fatalf("after Start: %d pages of %d tables pending, want the whole table (at least 10 pages) of 1", pages, leaves)
			}
			var copied int
			if err := db.QueryRow(testCtx(t), `SELECT count(*) FROM `+auditTable(r)).Scan(&copied); err != nil {
				t.Fatal(err)
			}
			if copied != 0 {
				t.Fatalf("%d audit rows after Start, want none (the tasks copy)", copied)
			}

			stopWriters := counterWriters(t, db, 3, 11, rows, table)
			deadline := time.Now().Add(2 * time.Second)
			var got []change
			for time.Now().Before(deadline) {
				got = append(got, r.drain()...)
			}
			stopWriters()
			got = append(got, r.collectAll(db)...)
			replayMatches(t, db, table, got)
			snapshot := map[string]bool{}
			for _, c := range got {
				if c.Op == "r" {
					snapshot[fmt.Sprint(c.Key["id"])] = true
				}
			}
			if len(snapshot) < rows/2 {
				t.Errorf("%d rows sent as 'r', want most of the %d", len(snapshot), rows)
			}
			t.Logf("%d records, %d rows as 'r'", len(got), len(snapshot))
		})
	}
}

// TestIncrementalSnapshotRestartAndRewrite: a restart in the middle of an
// incremental snapshot resumes it where it was; a rewrite of the table
// (VACUUM FULL moves rows into pages already copied) starts it again from
// the first page. Every row still in the table is sent as 'r'.
func TestIncrementalSnapshotRestartAndRewrite(t *testing.T) {
	override(t, &snapshotChunkPages, 2)
	const rows = 6000
	db, table, r := incrementalTable(t, "incr-rw-", rows, nil)
	ctx := testCtx(t)
	total, _ := pendingPages(t, db, r)

	copyChunks := func(n int) {
		t.Helper()
		for range n {
			if ok, err := r.tasks[0].copyChunk(ctx); err != nil || !ok {
				t.Fatalf("copyChunk: %v, %v", ok, err)
			}
		}
	}
	copyChunks(3)
	if left, _ := pendingPages(t, db, r); left != total-6 {
		t.Fatalf("after 3 chunks of 2 pages: %d of %d pages pending", left, total)
	}
	r.restartTask()
	if left, _ := pendingPages(t, db, r); left != total-6 {
		t.Fatalf("after a restart: %d of %d pages pending, want the progress kept", left, total)
	}
	copyChunks(2)
	// Rows from the end of the table move to its first pages.
	mustExec(t, db, `DELETE FROM `+table+` WHERE id <= 3000`)
	mustExec(t, db, `VACUUM FULL `+table)
	got := r.collectAll(db)
	seen := map[int]bool{}
	for _, c := range got {
		id, _ := strconv.Atoi(fmt.Sprint(c.Key["id"]))
		if c.Op == "r" {
			seen[id] = true
		}
	}
	for id := 3001; id <= rows; id++ {
		if !seen[id] {
			t.Fatalf("row %d never sent as 'r' (%d rows were)", id, len(seen))
		}
	}
	replayMatches(t, db, table, got)
}

// TestIncrementalSnapshotPartitioned: each partition is copied on its own
// (a page range is per relation); the records are filed under the
// partitioned table, as its changes are.
func TestIncrementalSnapshotPartitioned(t *testing.T) {
	override(t, &snapshotChunkPages, 1)
	db, url := admin(t)
	s := newSchema(t, db)
	table := qualified(s, "t")
	mustExec(t, db, `CREATE TABLE `+table+` (id int PRIMARY KEY, n int NOT NULL) PARTITION BY RANGE (id)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "t_low")+` PARTITION OF `+table+` FOR VALUES FROM (MINVALUE) TO (1000)`)
	// A partition with its columns in another physical order.
	mustExec(t, db, `CREATE TABLE `+qualified(s, "t_high")+` (n int NOT NULL, id int NOT NULL)`)
	mustExec(t, db, `ALTER TABLE `+table+` ATTACH PARTITION `+qualified(s, "t_high")+` FOR VALUES FROM (1000) TO (MAXVALUE)`)
	mustExec(t, db, `INSERT INTO `+table+` SELECT g, g FROM generate_series(1, 2000) g`)
	cfg := baseConfig(testenv.Unique("incr-part-"), url, auditSchemaFor(t, db), s+".t")
	cfg[KeySnapshotMode] = snapshotIncremental
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	t.Cleanup(func() { _ = r.stop(true) })
	if _, leaves := pendingPages(t, db, r); leaves != 2 {
		t.Fatalf("%d relations pending, want the 2 partitions", leaves)
	}
	got := r.collectAll(db)
	seen := map[string]bool{}
	for _, c := range got {
		if c.Op != "r" || c.Source.Table != "t" || fmt.Sprint(c.After["id"]) != fmt.Sprint(c.After["n"]) || fmt.Sprint(c.Key["id"]) != fmt.Sprint(c.After["id"]) {
			t.Fatalf("record %s of %s: key %v after %v", c.Op, c.Source.Table, c.Key, c.After)
		}
		seen[fmt.Sprint(c.Key["id"])] = true
	}
	if len(seen) != 2000 {
		t.Fatalf("%d rows sent, want 2000", len(seen))
	}
}

// TestIncrementalSnapshotLifecycle: the progress table is the connector's
// (listed, dropped on deletion); a table taken out of tables loses its
// pending copy, one added later gets its own; a Start with another mode
// leaves the pending copies alone and copies nothing.
func TestIncrementalSnapshotLifecycle(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	for _, n := range []string{"a", "b"} {
		mustExec(t, db, `CREATE TABLE `+qualified(s, n)+` (id int PRIMARY KEY, n int NOT NULL)`)
		mustExec(t, db, `INSERT INTO `+qualified(s, n)+` SELECT g, 0 FROM generate_series(1, 500) g`)
	}
	audit := auditSchemaFor(t, db)
	cfg := baseConfig(testenv.Unique("incr-life-"), url, audit, s+".a")
	cfg[KeySnapshotMode] = snapshotIncremental
	l := connect.NewMemoryLedger()
	r := startConnector(t, cfg, l)
	n := objectNames(r.name)
	owned, _ := l.List(testCtx(t))
	if !containsResource(owned, connect.Resource{Kind: KindTable, Name: n.snapshot}) {
		t.Fatalf("the ledger does not list the progress table %s: %v", n.snapshot, owned)
	}
	if _, leaves := pendingPages(t, db, r); leaves != 1 {
		t.Fatalf("%d tables pending, want 1", leaves)
	}

	// Reconfigured: a out, b in.
	if err := r.stop(false); err != nil {
		t.Fatal(err)
	}
	cfg[KeyTables] = s + ".b"
	r = startConnector(t, cfg, l)
	var filed []string
	rows, err := db.Query(testCtx(t), `SELECT filed_table FROM `+qualified(audit, n.snapshot))
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var f string
		if err := rows.Scan(&f); err != nil {
			t.Fatal(err)
		}
		filed = append(filed, f)
	}
	if len(filed) != 1 || filed[0] != "b" {
		t.Fatalf("pending copies after the reconfiguration: %v, want only b's", filed)
	}

	// Another mode: the pending copy stays, the task does not copy.
	if err := r.stop(false); err != nil {
		t.Fatal(err)
	}
	cfg[KeySnapshotMode] = snapshotNever
	r = startConnector(t, cfg, l)
	r.quiet()
	if _, leaves := pendingPages(t, db, r); leaves != 1 {
		t.Fatalf("%d tables pending under snapshot.mode=never, want b's kept", leaves)
	}

	// The table swapped for a new one under its name (b renamed away, a
	// new b made): the renamed table's pending copy goes, the new one's
	// rows are copied.
	if err := r.stop(false); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `ALTER TABLE `+qualified(s, "b")+` RENAME TO b_old`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "b")+` (id int PRIMARY KEY, n int NOT NULL)`)
	mustExec(t, db, `INSERT INTO `+qualified(s, "b")+` SELECT g, 7 FROM generate_series(1001, 1100) g`)
	cfg[KeySnapshotMode] = snapshotIncremental
	r = startConnector(t, cfg, l)
	for _, c := range r.collectAll(db) {
		if id, _ := strconv.Atoi(fmt.Sprint(c.Key["id"])); c.Op == "r" && id <= 1000 {
			t.Fatalf("row %d of the renamed table was copied as the new table's", id)
		}
	}

	if err := r.stop(true); err != nil {
		t.Fatal(err)
	}
	if relExists(t, db, audit, n.snapshot) {
		t.Error("the progress table survived the deletion")
	}
}

// TestIncrementalSnapshotWaitsForWriters: a chunk one of whose rows a
// writer changed and has not committed does not copy that row's older
// state, nor wait holding its other rows' locks (a writer waiting for one
// of them would be a deadlock victim, TestIncrementalSnapshotNoWriterDeadlock):
// it gives way (NOWAIT, retried at the next Poll) and copies what the
// writer committed once it has. Copying the older state would, under
// capture.order=statement, send it after the writer's change (drawn at its
// statement).
func TestIncrementalSnapshotWaitsForWriters(t *testing.T) {
	db, table, r2 := incrementalTable(t, "incr-wait-", 1000, connect.Config{KeyCaptureOrder: orderStatement})
	ctx := testCtx(t)

	writer, err := db.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Release()
	if _, err := writer.Exec(ctx, `BEGIN`); err != nil {
		t.Fatal(err)
	}
	if _, err := writer.Exec(ctx, `UPDATE `+table+` SET n = 1 WHERE id = 500`); err != nil {
		t.Fatal(err)
	}
	before, _ := pendingPages(t, db, r2)
	if ok, err := r2.tasks[0].copyChunk(ctx); err == nil || !copyAgain(err) {
		t.Fatalf("copyChunk while a writer holds a row of the chunk: %v, %v; want it to give way", ok, err)
	}
	if after, _ := pendingPages(t, db, r2); after != before {
		t.Fatalf("%d pages pending after the chunk gave way, %d before", after, before)
	}
	if _, err := writer.Exec(ctx, `COMMIT`); err != nil {
		t.Fatal(err)
	}
	got := r2.collectAll(db)
	replayMatches(t, db, table, got)
}

// TestIncrementalSnapshotGivesWay: a chunk whose row a writer keeps locked
// gives way (NOWAIT): the Poll returns without error and without progress,
// and the copy goes on once the writer committed.
func TestIncrementalSnapshotGivesWay(t *testing.T) {
	override(t, &snapshotLockTimeout, 100*time.Millisecond)
	db, table, r := incrementalTable(t, "incr-way-", 100, nil)
	ctx := testCtx(t)

	writer := lockingWriter(t, db, `UPDATE `+table+` SET n = 1 WHERE id = 50`)
	before, _ := pendingPages(t, db, r)
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	recs, err := r.tasks[0].Poll(pctx)
	cancel()
	if err != nil {
		t.Fatalf("Poll while a writer holds a row of the chunk: %v", err)
	}
	if len(recs) != 0 {
		t.Fatalf("Poll returned %d records; want none (the chunk gave way)", len(recs))
	}
	if after, _ := pendingPages(t, db, r); after != before {
		t.Fatalf("%d pages pending after the Poll, %d before: want no progress", after, before)
	}
	if err := writer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got := r.collectAll(db)
	replayMatches(t, db, table, got)
}

// TestIncrementalSnapshotTwoTasks: each task copies its own tables only.
func TestIncrementalSnapshotTwoTasks(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	for _, n := range []string{"a", "b"} {
		mustExec(t, db, `CREATE TABLE `+qualified(s, n)+` (id int PRIMARY KEY, n int NOT NULL)`)
		mustExec(t, db, `INSERT INTO `+qualified(s, n)+` SELECT g, 0 FROM generate_series(1, 300) g`)
	}
	cfg := baseConfig(testenv.Unique("incr-two-"), url, auditSchemaFor(t, db), s+".a", s+".b")
	cfg[KeySnapshotMode] = snapshotIncremental
	cfg[KeyTasksMax] = "2"
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	t.Cleanup(func() { _ = r.stop(true) })
	if len(r.tasks) != 2 {
		t.Fatalf("%d tasks, want 2", len(r.tasks))
	}
	ctx := testCtx(t)
	for i, task := range r.tasks {
		mine := task.tables[0].Name
		if ok, err := task.copyChunk(ctx); err != nil || !ok {
			t.Fatalf("task %d copyChunk: %v, %v", i, ok, err)
		}
		var tables []string
		rows, err := db.Query(ctx, `SELECT DISTINCT table_name FROM `+auditTable(r))
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var n string
			if err := rows.Scan(&n); err != nil {
				t.Fatal(err)
			}
			tables = append(tables, n)
		}
		if i == 0 && (len(tables) != 1 || tables[0] != mine) {
			t.Fatalf("after task 0's chunk the audit table holds rows of %v, want only its table %s", tables, mine)
		}
	}
	per := map[string]map[string]bool{}
	for _, c := range r.collectAll(db) {
		if per[c.Source.Table] == nil {
			per[c.Source.Table] = map[string]bool{}
		}
		per[c.Source.Table][fmt.Sprint(c.Key["id"])] = true
	}
	if len(per["a"]) != 300 || len(per["b"]) != 300 {
		t.Fatalf("rows sent: %d of a, %d of b, want 300 each", len(per["a"]), len(per["b"]))
	}
}

// TestIncrementalSnapshotByHand: a copy asked for by hand (a row naming
// the table in the progress table) is picked up by the running task and
// sends the table's rows again; a partitioned table is copied partition by
// partition; a partition detached before its copy, and a relation that is
// not part of the table named, are not copied.
func TestIncrementalSnapshotByHand(t *testing.T) {
	override(t, &snapshotRecheck, 0)
	override(t, &snapshotChunkPages, 1)
	db, url := admin(t)
	s := newSchema(t, db)
	plain, parted := qualified(s, "plain"), qualified(s, "parted")
	mustExec(t, db, `CREATE TABLE `+plain+` (id int PRIMARY KEY, n int NOT NULL)`)
	mustExec(t, db, `CREATE TABLE `+parted+` (id int PRIMARY KEY, n int NOT NULL) PARTITION BY RANGE (id)`)
	for i, bounds := range []string{"FROM (1) TO (1000)", "FROM (1000) TO (2000)", "FROM (2000) TO (3000)"} {
		mustExec(t, db, fmt.Sprintf(`CREATE TABLE %s PARTITION OF %s FOR VALUES %s`, qualified(s, fmt.Sprintf("p%d", i)), parted, bounds))
	}
	mustExec(t, db, `CREATE TABLE `+qualified(s, "other")+` (id int PRIMARY KEY, n int NOT NULL)`)
	mustExec(t, db, `INSERT INTO `+qualified(s, "other")+` VALUES (99999, 9)`)
	cfg := baseConfig(testenv.Unique("incr-hand-"), url, auditSchemaFor(t, db), s+".plain", s+".parted")
	cfg[KeySnapshotMode] = snapshotIncremental
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	t.Cleanup(func() { _ = r.stop(true) })
	if got := r.collectAll(db); len(got) != 0 {
		t.Fatalf("%d records from empty tables", len(got))
	}
	mustExec(t, db, `INSERT INTO `+plain+` SELECT g, 0 FROM generate_series(1, 500) g`)
	mustExec(t, db, `INSERT INTO `+parted+` SELECT g, 0 FROM generate_series(1, 2999) g`)
	if got := r.collectAll(db); len(got) != 3499 {
		t.Fatalf("%d records of the inserts, want 3499", len(got))
	}

	progress := qualified(r.cfg[KeyAuditSchema], objectNames(r.name).snapshot)
	mustExec(t, db, `INSERT INTO `+progress+` (relid, filed_schema, filed_table) VALUES ($1::regclass, $2, 'plain'), ($3::regclass, $2, 'parted'), ($4::regclass, $2, 'plain')`,
		plain, s, parted, qualified(s, "other"))
	// The first step replaces parted by its partitions; then p2 is
	// detached, with its copy pending.
	if ok, err := r.tasks[0].copyChunk(testCtx(t)); err != nil || !ok {
		t.Fatalf("copyChunk: %v, %v", ok, err)
	}
	var leaves int
	if err := db.QueryRow(testCtx(t), `SELECT count(*) FROM `+progress+` WHERE filed_table = 'parted'`).Scan(&leaves); err != nil || leaves != 3 {
		t.Fatalf("pending copies of parted's partitions: %d, %v; want 3", leaves, err)
	}
	mustExec(t, db, `ALTER TABLE `+parted+` DETACH PARTITION `+qualified(s, "p2"))
	got := r.collectAll(db)
	byTable := map[string]map[int]bool{}
	for _, c := range got {
		if c.Op != "r" {
			t.Fatalf("record %s of %s, want only 'r'", c.Op, c.Source.Table)
		}
		id, _ := strconv.Atoi(fmt.Sprint(c.Key["id"]))
		if byTable[c.Source.Table] == nil {
			byTable[c.Source.Table] = map[int]bool{}
		}
		byTable[c.Source.Table][id] = true
	}
	if len(byTable["plain"]) != 500 || byTable["plain"][99999] {
		t.Fatalf("plain: %d rows copied (the other table's row among them: %v), want its 500", len(byTable["plain"]), byTable["plain"][99999])
	}
	for id := 1; id < 2000; id++ {
		if !byTable["parted"][id] {
			t.Fatalf("parted: row %d not copied (%d rows were)", id, len(byTable["parted"]))
		}
	}
	for id := range byTable["parted"] {
		if id >= 2000 {
			t.Fatalf("parted: row %d of the detached partition was copied", id)
		}
	}
}
