package pgaudit

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestIncrementalSnapshotNoWriterDeadlock: a writer that holds a row lock
// on a later row of a chunk and then updates an earlier row the chunk has
// already locked FOR SHARE must not be made a deadlock victim: the chunk,
// not the application's transaction, has to give way.
func TestIncrementalSnapshotNoWriterDeadlock(t *testing.T) {
	db, url := admin(t)
	ctx := testCtx(t)
	s := newSchema(t, db)
	table := qualified(s, "t")
	mustExec(t, db, `CREATE TABLE `+table+` (id int PRIMARY KEY, n int NOT NULL, b text)`)
	mustExec(t, db, `ALTER TABLE `+table+` ALTER COLUMN b SET STORAGE EXTERNAL`)
	// Row 1 first on page 0, then rows with out-of-line values, then row
	// 1000: the chunk locks row 1, then stalls making the next image while
	// their TOAST index is held (holdToastIndex), and reaches row 1000 only
	// once it is released.
	mustExec(t, db, `INSERT INTO `+table+` VALUES (1, 0, 'x')`)
	mustExec(t, db, `INSERT INTO `+table+` SELECT g, 0, repeat('x', 10000) FROM generate_series(2, 6) g`)
	mustExec(t, db, `INSERT INTO `+table+` VALUES (1000, 0, 'x')`)
	cfg := baseConfig(testenv.Unique("incr-dl-"), url, auditSchemaFor(t, db), s+".t")
	cfg[KeySnapshotMode] = snapshotIncremental
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	t.Cleanup(func() { _ = r.stop(true) })

	writer := lockingWriter(t, db, `UPDATE `+table+` SET n = 1 WHERE id = 1000`)
	var writerPID int
	if err := writer.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&writerPID); err != nil {
		t.Fatal(err)
	}
	release := holdToastIndex(t, db, table)
	defer release()
	done := make(chan error, 1)
	go func() {
		_, err := r.tasks[0].copyChunk(ctx)
		done <- err
	}()
	waiting := func(what, cond string, args ...any) {
		await(t, 10*time.Second, func() (bool, string, error) {
			var ok bool
			err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND `+cond+`)`, args...).Scan(&ok)
			return ok, what, err
		})
	}
	// The chunk holds row 1 and waits for the TOAST index; the writer now
	// wants row 1, and waits for the chunk.
	waiting("the chunk never waited for the TOAST index", `starts_with(application_name, $1) AND query LIKE '%FOR SHARE OF c%'`, ApplicationNamePrefix(r.name))
	wrote := make(chan error, 1)
	go func() {
		_, err := writer.Exec(ctx, `UPDATE `+table+` SET n = 1 WHERE id = 1`)
		wrote <- err
	}()
	waiting("the writer never waited for row 1", `pid = $1`, writerPID)
	release()
	werr := <-wrote
	cerr := <-done
	t.Logf("writer: %v; chunk: %v", werr, cerr)
	var pgErr *pgconn.PgError
	if errors.As(werr, &pgErr) && pgErr.Code == "40P01" {
		t.Fatalf("the writer was chosen as the deadlock victim of an incremental snapshot chunk: %v", werr)
	}
	if werr != nil {
		t.Fatalf("writer: %v", werr)
	}
	if err := writer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestIncrementalSnapshotDetachedPartition: a partition detached while
// its copy is pending is no longer part of the captured table; its rows,
// changed after the detach without any capture, must not be sent as 'r'
// records of the partitioned table.
func TestIncrementalSnapshotDetachedPartition(t *testing.T) {
	override(t, &snapshotChunkPages, 1)
	db, url := admin(t)
	s := newSchema(t, db)
	table := qualified(s, "t")
	mustExec(t, db, `CREATE TABLE `+table+` (id int PRIMARY KEY, n int NOT NULL) PARTITION BY RANGE (id)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "t_low")+` PARTITION OF `+table+` FOR VALUES FROM (MINVALUE) TO (1000)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "t_high")+` PARTITION OF `+table+` FOR VALUES FROM (1000) TO (MAXVALUE)`)
	mustExec(t, db, `INSERT INTO `+table+` SELECT g, 0 FROM generate_series(1, 2000) g`)
	cfg := baseConfig(testenv.Unique("incr-detach-"), url, auditSchemaFor(t, db), s+".t")
	cfg[KeySnapshotMode] = snapshotIncremental
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	t.Cleanup(func() { _ = r.stop(true) })

	mustExec(t, db, `ALTER TABLE `+table+` DETACH PARTITION `+qualified(s, "t_high"))
	// Not the captured table's rows any more: no trigger sees this.
	mustExec(t, db, `UPDATE `+qualified(s, "t_high")+` SET n = 999`)
	got := r.collectAll(db)
	for _, c := range got {
		if fmt.Sprint(c.After["n"]) == "999" {
			t.Fatalf("a row of the detached partition, in a state the partitioned table never held, was sent as %s of %s: %v", c.Op, c.Source.Table, c.After)
		}
	}
	replayMatches(t, db, table, got)
}

// TestIncrementalSnapshotIgnoresSearchPath: the chunk's SQL runs in the
// task's session; look-alike operators first in its search_path (here an
// oid = oid and a text = text that say false) must not change what it
// copies. Unqualified, the chunk took every relation for gone and dropped
// the copy without a word.
func TestIncrementalSnapshotIgnoresSearchPath(t *testing.T) {
	db, url := admin(t)
	ctx := testCtx(t)
	s := newSchema(t, db)
	e := newSchema(t, db)
	table := qualified(s, "t")
	mustExec(t, db, `CREATE TABLE `+table+` (id int PRIMARY KEY, n int NOT NULL)`)
	mustExec(t, db, `INSERT INTO `+table+` SELECT g, 0 FROM generate_series(1, 100) g`)
	es := pgx.Identifier{e}.Sanitize()
	for _, ty := range []string{"oid", "text"} {
		mustExec(t, db, fmt.Sprintf(`CREATE FUNCTION %s.eq(%s, %s) RETURNS bool LANGUAGE sql IMMUTABLE AS 'SELECT false'`, es, ty, ty))
		mustExec(t, db, fmt.Sprintf(`CREATE OPERATOR %s.= (LEFTARG = %s, RIGHTARG = %s, FUNCTION = %s.eq)`, es, ty, ty, es))
	}
	cfg := baseConfig(testenv.Unique("incr-sp-"), url, auditSchemaFor(t, db), s+".t")
	cfg[KeySnapshotMode] = snapshotIncremental
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	t.Cleanup(func() { _ = r.stop(true) })
	// The task's sessions get the hostile search_path.
	pool := r.tasks[0].pool
	var held []*pgxpool.Conn
	for range pool.Config().MaxConns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, `SET search_path = `+es+`, pg_catalog, public`); err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	for _, c := range held {
		c.Release()
	}
	for range 3 {
		if _, err := r.tasks[0].copyChunk(ctx); err != nil {
			t.Fatalf("copyChunk under a hostile search_path: %v", err)
		}
	}
	var audited int
	if err := db.QueryRow(ctx, `SELECT coalesce(sum(changes), 0) FROM `+auditTable(r)+` WHERE op = 'r'`).Scan(&audited); err != nil {
		t.Fatal(err)
	}
	if audited != 100 {
		t.Fatalf("%d rows copied as 'r' under a hostile search_path, want 100", audited)
	}
}

// TestIncrementalSnapshotProgressesUnderSteadyWrites: under a steady
// stream of changes (a few hundred a second to another table of the task)
// a read of the audit table may never find it empty; the task, keeping up,
// copies a chunk before each read, and the copy finishes while the
// writers go on.
func TestIncrementalSnapshotProgressesUnderSteadyWrites(t *testing.T) {
	override(t, &snapshotChunkPages, 1)
	db, url := admin(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "big")+` (id int PRIMARY KEY, n int NOT NULL)`)
	mustExec(t, db, `INSERT INTO `+qualified(s, "big")+` SELECT g, 0 FROM generate_series(1, 20000) g`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "hot")+` (id bigserial PRIMARY KEY, n int NOT NULL)`)
	cfg := baseConfig(testenv.Unique("incr-steady-"), url, auditSchemaFor(t, db), s+".big", s+".hot")
	cfg[KeySnapshotMode] = snapshotIncremental
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	t.Cleanup(func() { _ = r.stop(true) })
	total, _ := pendingPages(t, db, r)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	for range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for ctx.Err() == nil {
				_, _ = db.Exec(ctx, `INSERT INTO `+qualified(s, "hot")+` (n) VALUES (1)`)
				time.Sleep(steadyWriterPause)
			}
		}()
	}
	defer func() {
		cancel()
		for range 4 {
			<-done
		}
	}()
	start := time.Now()
	deadline := start.Add(60 * time.Second)
	records, rows := 0, map[string]bool{}
	for {
		for _, c := range r.drain() {
			records++
			if c.Op == "r" {
				rows[fmt.Sprint(c.Key["id"])] = true
			}
		}
		left, _ := pendingPages(t, db, r)
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d pages still to copy after 60 s under a steady stream (%d records delivered)", left, total, records)
		}
	}
	t.Logf("copied %d pages in %v under a steady stream (%d records delivered)", total, time.Since(start), records)
	for _, c := range r.drain() {
		if c.Op == "r" {
			rows[fmt.Sprint(c.Key["id"])] = true
		}
	}
	if len(rows) != 20000 {
		t.Fatalf("%d rows sent as 'r', want 20000", len(rows))
	}
}

var steadyWriterPause = 2 * time.Millisecond

// TestIncrementalSnapshotGiveWayNoBusyLoop: while a writer keeps a row of
// the next chunk locked, the task does not try the chunk again and again
// (each try writes row locks up to the writer's row): Polls return at the
// poll interval, as when idle, with at most a few tries each.
func TestIncrementalSnapshotGiveWayNoBusyLoop(t *testing.T) {
	db, table, r := incrementalTable(t, "incr-busy-", 100, connect.Config{KeyPollIntervalMS: "1000"})
	ctx := testCtx(t)
	lockingWriter(t, db, `UPDATE `+table+` SET n = 1 WHERE id = 50`)
	var before int64
	rollbacks := `SELECT xact_rollback FROM pg_catalog.pg_stat_database WHERE datname = pg_catalog.current_database()`
	mustExec(t, db, `SELECT pg_catalog.pg_stat_clear_snapshot()`)
	if err := db.QueryRow(ctx, rollbacks).Scan(&before); err != nil {
		t.Fatal(err)
	}
	polls := 0
	end := time.Now().Add(2 * time.Second)
	for time.Now().Before(end) {
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		recs, err := r.tasks[0].Poll(pctx)
		cancel()
		if err != nil || len(recs) != 0 {
			t.Fatalf("Poll: %d records, %v", len(recs), err)
		}
		polls++
	}
	time.Sleep(600 * time.Millisecond) // statistics are reported at most every 500 ms
	var after int64
	if err := db.QueryRow(ctx, rollbacks).Scan(&after); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d Polls, %d rolled back transactions in 2 s", polls, after-before)
	if polls > 4 {
		t.Fatalf("%d Polls returned in 2 s while a chunk could not copy: a busy loop", polls)
	}
}

// TestIncrementalSnapshotRenamedMidCopy: a captured table renamed while
// its copy is under way is still copied (its trigger files under the old
// name), and after a reconfiguration under its new name too: every row is
// sent as 'r'.
func TestIncrementalSnapshotRenamedMidCopy(t *testing.T) {
	override(t, &snapshotChunkPages, 2)
	db, url := admin(t)
	ctx := testCtx(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "t")+` (id int PRIMARY KEY, n int NOT NULL)`)
	mustExec(t, db, `INSERT INTO `+qualified(s, "t")+` SELECT g, 0 FROM generate_series(1, 3000) g`)
	l := connect.NewMemoryLedger()
	cfg := baseConfig(testenv.Unique("incr-ren-"), url, auditSchemaFor(t, db), s+".t")
	cfg[KeySnapshotMode] = snapshotIncremental
	r := startConnector(t, cfg, l)
	t.Cleanup(func() { _ = r.stop(true) })
	seen := map[string]bool{}
	note := func(got []change) {
		for _, c := range got {
			if c.Op == "r" {
				seen[fmt.Sprint(c.Key["id"])] = true
			}
		}
	}
	if ok, err := r.tasks[0].copyChunk(ctx); err != nil || !ok {
		t.Fatalf("copyChunk: %v, %v", ok, err)
	}
	mustExec(t, db, `ALTER TABLE `+qualified(s, "t")+` RENAME TO u`)
	for range 2 {
		if ok, err := r.tasks[0].copyChunk(ctx); err != nil || !ok {
			t.Fatalf("copyChunk after the rename: %v, %v", ok, err)
		}
	}
	note(r.drain())
	if err := r.stop(false); err != nil {
		t.Fatal(err)
	}
	cfg[KeyTables] = s + ".u"
	r = startConnector(t, cfg, l)
	note(r.collectAll(db))
	if len(seen) != 3000 {
		t.Fatalf("%d rows sent as 'r', want 3000", len(seen))
	}
}

// TestIncrementalSnapshotTwoTasks: two tasks, a table each, copied under
// concurrent writers (wide rows, so updates move rows between pages) under
// both capture orders and the row level: replaying each table's records
// gives its state, and no record of a row is older than one before it.
func TestIncrementalSnapshotTwoTasksUnderWrites(t *testing.T) {
	override(t, &snapshotChunkPages, 1)
	for _, mode := range []struct{ order, level string }{{orderCommit, levelStatement}, {orderStatement, levelStatement}, {orderStatement, levelRow}} {
		t.Run(mode.order+"_"+mode.level, func(t *testing.T) {
			db, url := admin(t)
			s := newSchema(t, db)
			var tables []string
			for _, n := range []string{"a", "b"} {
				tb := qualified(s, n)
				tables = append(tables, tb)
				mustExec(t, db, `CREATE TABLE `+tb+` (id int PRIMARY KEY, n int NOT NULL, pad text NOT NULL DEFAULT repeat('p', 600))`)
				mustExec(t, db, `INSERT INTO `+tb+` SELECT g, 0 FROM generate_series(1, 2000) g`)
			}
			cfg := baseConfig(testenv.Unique("incr-two-"), url, auditSchemaFor(t, db), s+".a", s+".b")
			cfg[KeySnapshotMode] = snapshotIncremental
			cfg[KeyTasksMax] = "2"
			cfg[KeyPollMaxRecords] = "300"
			cfg[KeyCaptureOrder] = mode.order
			cfg[KeyCaptureLevel] = mode.level
			r := startConnector(t, cfg, connect.NewMemoryLedger())
			t.Cleanup(func() { _ = r.stop(true) })
			if len(r.tasks) != 2 {
				t.Fatalf("%d tasks, want 2", len(r.tasks))
			}
			stop := counterWriters(t, db, 4, 7, 2000, tables...)
			var got []change
			end := time.Now().Add(3 * time.Second)
			for time.Now().Before(end) {
				got = append(got, r.drain()...)
			}
			stop()
			got = append(got, r.collectAll(db)...)
			for i, tb := range tables {
				var mine []change
				for _, c := range got {
					if c.Source.Table == []string{"a", "b"}[i] {
						mine = append(mine, c)
					}
				}
				replayMatches(t, db, tb, mine)
			}
		})
	}
}

// TestIncrementalSnapshotChunkBeforeRead: after a Poll that returned a
// batch that was not full, the next Poll copies a chunk before it reads,
// although changes are waiting; after a full batch it does not.
func TestIncrementalSnapshotChunkBeforeRead(t *testing.T) {
	override(t, &snapshotChunkPages, 1)
	db, url := admin(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "big")+` (id int PRIMARY KEY, n int NOT NULL)`)
	mustExec(t, db, `INSERT INTO `+qualified(s, "big")+` SELECT g, 0 FROM generate_series(1, 2000) g`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "hot")+` (id bigserial PRIMARY KEY, n int NOT NULL)`)
	cfg := baseConfig(testenv.Unique("incr-before-"), url, auditSchemaFor(t, db), s+".big", s+".hot")
	cfg[KeySnapshotMode] = snapshotIncremental
	cfg[KeyPollMaxRecords] = "5"
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	t.Cleanup(func() { _ = r.stop(true) })
	ctx := testCtx(t)
	task := r.tasks[0]
	poll := func() []connect.SourceRecord {
		t.Helper()
		recs, err := task.Poll(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := task.Commit(ctx, recs); err != nil {
			t.Fatal(err)
		}
		return recs
	}
	hot := func(n int) {
		mustExec(t, db, `INSERT INTO `+qualified(s, "hot")+` (n) SELECT 1 FROM generate_series(1, $1)`, n)
	}

	hot(1)
	if recs := poll(); len(recs) != 1 {
		t.Fatalf("first Poll: %d records, want the one change", len(recs))
	}
	before, _ := pendingPages(t, db, r)
	hot(1)
	poll()
	after, _ := pendingPages(t, db, r)
	if after != before-1 {
		t.Fatalf("after a batch that was not full, a Poll with a change waiting copied %d pages, want one chunk (1 page)", before-after)
	}

	// Behind (the chunk's rows and more changes wait): full batches, no
	// chunk.
	hot(20)
	if recs := poll(); len(recs) != 5 {
		t.Fatalf("%d records, want a full batch of 5", len(recs))
	}
	before, _ = pendingPages(t, db, r)
	if before == 0 {
		t.Fatal("the snapshot is done already: the check below would say nothing")
	}
	if recs := poll(); len(recs) != 5 {
		t.Fatalf("%d records, want a full batch of 5", len(recs))
	}
	if after, _ := pendingPages(t, db, r); after != before {
		t.Fatalf("after a full batch a Poll copied %d pages, want none", before-after)
	}
}
