package pgaudit

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestCapturedTableDroppedWhileRunning: the changes still waiting when a
// captured table is dropped are delivered with its columns' names and its
// key, as the task knew them: they used to come out as _column_<n> with a
// null key. A table of that name made again has no capture trigger (its
// triggers went with the dropped table): the task fails, saying so and
// what to do, instead of silently capturing nothing; the restart it asks
// for captures the new table.
func TestCapturedTableDroppedWhileRunning(t *testing.T) {
	for _, level := range []string{"statement", "row"} {
		t.Run(level, func(t *testing.T) {
			db, s, r := capturingT(t, "dropped-running-", level)
			mustExec(t, db, `INSERT INTO `+qualified(s, "t")+` VALUES (1, 'a')`)
			r.collect(1, true)
			mustExec(t, db, `INSERT INTO `+qualified(s, "t")+` VALUES (2, 'b')`)
			mustExec(t, db, `UPDATE `+qualified(s, "t")+` SET v = 'c' WHERE id = 2`)
			mustExec(t, db, `DROP TABLE `+qualified(s, "t"))
			checkChanges(t, r.collect(2, true), "tc."+s+".t", s, "t", []wantChange{
				{"c", `{"id":2}`, "null", `{"id":2,"v":"b"}`},
				{"u", `{"id":2}`, `{"id":2,"v":"b"}`, `{"id":2,"v":"c"}`},
			})
			mustExec(t, db, `CREATE TABLE `+qualified(s, "t")+` (id int PRIMARY KEY, v text)`)
			mustExec(t, db, `INSERT INTO `+qualified(s, "t")+` VALUES (3, 'x')`)
			_, err := r.tasks[0].Poll(testCtx(t))
			if err == nil || !strings.Contains(err.Error(), qualified(s, "t")) || !strings.Contains(err.Error(), "dropped and made again") || !strings.Contains(err.Error(), "restart") {
				t.Fatalf("Poll after the table was made again: %v, want an error naming the table and the restart", err)
			}
			if err := r.stop(false); err != nil {
				t.Fatal(err)
			}
			again := startConnector(t, r.cfg, r.ledger)
			t.Cleanup(func() { _ = again.stop(true) })
			mustExec(t, db, `INSERT INTO `+qualified(s, "t")+` VALUES (4, 'y')`)
			checkChanges(t, again.collect(1, true), "tc."+s+".t", s, "t", []wantChange{
				{"c", `{"id":4}`, "null", `{"id":4,"v":"y"}`},
			})
		})
	}
}

// TestRenamedWhileRunningThenAltered: a captured table renamed while the
// task runs, and then given a column, keeps its changes' column names and
// keys: those written before the rename and after, and those written after
// the column was added. Decoding the older ones used to forget the table
// (its configured name is gone), naming their columns _column_<n> and
// nulling the key of every later change until a restart.
func TestRenamedWhileRunningThenAltered(t *testing.T) {
	for _, level := range []string{"statement", "row"} {
		t.Run(level, func(t *testing.T) {
			db, s, r := capturingT(t, "renamed-altered-", level)
			mustExec(t, db, `INSERT INTO `+qualified(s, "t")+` VALUES (1, 'a')`)
			r.collect(1, true)
			mustExec(t, db, `INSERT INTO `+qualified(s, "t")+` VALUES (2, 'b')`)
			mustExec(t, db, `ALTER TABLE `+qualified(s, "t")+` RENAME TO t2`)
			mustExec(t, db, `ALTER TABLE `+qualified(s, "t2")+` ADD COLUMN w int`)
			mustExec(t, db, `INSERT INTO `+qualified(s, "t2")+` VALUES (3, 'c', 7)`)
			got := r.collect(2, true)
			checkChanges(t, got, "tc."+s+".t", s, "t", []wantChange{
				{"c", `{"id":2}`, "null", `{"id":2,"v":"b"}`},
				{"c", `{"id":3}`, "null", `{"id":3,"v":"c","w":7}`},
			})
			mustExec(t, db, `INSERT INTO `+qualified(s, "t2")+` VALUES (4, 'd', 8)`)
			got = r.collect(1, true)
			checkChanges(t, got, "tc."+s+".t", s, "t", []wantChange{
				{"c", `{"id":4}`, "null", `{"id":4,"v":"d","w":8}`},
			})
		})
	}
}

// TestSchemaRenamedWhileRunning: the same for a captured table whose schema
// is renamed, and then a column dropped: every change keeps its key, and
// the columns are named as for a table that kept its name.
func TestSchemaRenamedWhileRunning(t *testing.T) {
	for _, level := range []string{"statement", "row"} {
		t.Run(level, func(t *testing.T) {
			db, url := admin(t)
			s := newSchema(t, db)
			s2 := s + "_r"
			t.Cleanup(func() { dropSchema(t, db, s2) })
			mustExec(t, db, `CREATE TABLE `+qualified(s, "t")+` (id int PRIMARY KEY, v text)`)
			cfg := baseConfig(testenv.Unique("schema-renamed-"), url, auditSchemaFor(t, db), s+".t")
			cfg[KeyCaptureLevel] = level
			r := startConnector(t, cfg, connect.NewMemoryLedger())
			defer func() { _ = r.stop(true) }()
			mustExec(t, db, `INSERT INTO `+qualified(s, "t")+` VALUES (1, 'a')`)
			r.collect(1, true)
			mustExec(t, db, `INSERT INTO `+qualified(s, "t")+` VALUES (2, 'b')`)
			mustExec(t, db, `ALTER SCHEMA `+s+` RENAME TO `+s2)
			mustExec(t, db, `INSERT INTO `+qualified(s2, "t")+` VALUES (3, 'c')`)
			mustExec(t, db, `ALTER TABLE `+qualified(s2, "t")+` DROP COLUMN v`)
			mustExec(t, db, `INSERT INTO `+qualified(s2, "t")+` VALUES (4)`)
			got := r.collect(3, true)
			checkChanges(t, got, "tc."+s+".t", s, "t", []wantChange{
				// Both written before the DROP COLUMN: named as documented for
				// a table that kept its name.
				{"c", `{"id":2}`, "null", `{"id":2,"_column_2":"b"}`},
				{"c", `{"id":3}`, "null", `{"id":3,"_column_2":"c"}`},
				{"c", `{"id":4}`, "null", `{"id":4}`},
			})
		})
	}
}

// TestTruncateCascadeRestartIdentity: a TRUNCATE ... RESTART IDENTITY
// CASCADE of a table that is not captured truncates a captured table that
// references it: that is captured (t) at both levels, under commit order.
func TestTruncateCascadeRestartIdentity(t *testing.T) {
	for _, level := range []string{"statement", "row"} {
		t.Run(level, func(t *testing.T) {
			db, url := admin(t)
			s := newSchema(t, db)
			mustExec(t, db, `CREATE TABLE `+qualified(s, "par")+` (id serial PRIMARY KEY, v text)`)
			mustExec(t, db, `CREATE TABLE `+qualified(s, "ch")+` (id serial PRIMARY KEY, pid int REFERENCES `+qualified(s, "par")+`)`)
			cfg := baseConfig(testenv.Unique("truncate-cascade-"), url, auditSchemaFor(t, db), s+".ch")
			cfg[KeyCaptureLevel] = level
			cfg[KeyCaptureOrder] = "commit"
			r := startConnector(t, cfg, connect.NewMemoryLedger())
			defer func() { _ = r.stop(true) }()
			mustExec(t, db, `INSERT INTO `+qualified(s, "par")+` (v) VALUES ('a')`)
			mustExec(t, db, `INSERT INTO `+qualified(s, "ch")+` (pid) VALUES (1)`)
			mustExec(t, db, `TRUNCATE `+qualified(s, "par")+` RESTART IDENTITY CASCADE`)
			mustExec(t, db, `INSERT INTO `+qualified(s, "par")+` (v) VALUES ('a')`)
			mustExec(t, db, `INSERT INTO `+qualified(s, "ch")+` (pid) VALUES (1)`)
			got := r.collect(3, true)
			checkChanges(t, got, "tc."+s+".ch", s, "ch", []wantChange{
				{"c", `{"id":1}`, "null", `{"id":1,"pid":1}`},
				{"t", "null", "null", "null"},
				{"c", `{"id":1}`, "null", `{"id":1,"pid":1}`},
			})
			r.quiet()
		})
	}
}

// TestPartitionedTableCommitOrderDefaultPartitions: under capture.order
// commit, a partitioned table whose DEFAULT partition is itself partitioned
// delivers a row's move into the default sub-partition as d then c, with
// growing seq; a DEFAULT sub-partition detached and replaced by one with
// another column order captures what it routes, and the detached table
// no longer.
func TestPartitionedTableCommitOrderDefaultPartitions(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	p := qualified(s, "p")
	mustExec(t, db, `CREATE TABLE `+p+` (id int, k int, v text, PRIMARY KEY (id, k)) PARTITION BY LIST (k)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "p1")+` PARTITION OF `+p+` FOR VALUES IN (1)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "pd")+` PARTITION OF `+p+` DEFAULT PARTITION BY LIST (id)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "pdx")+` PARTITION OF `+qualified(s, "pd")+` DEFAULT`)
	cfg := baseConfig(testenv.Unique("partition-commit-"), url, auditSchemaFor(t, db), s+".p")
	cfg[KeyCaptureOrder] = "commit"
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()
	mustExec(t, db, `INSERT INTO `+p+` VALUES (1, 1, 'a'), (2, 5, 'b')`)
	mustExec(t, db, `UPDATE `+p+` SET k = 7 WHERE id = 1`) // p1 -> default sub
	mustExec(t, db, `CREATE TABLE `+qualified(s, "p7")+` (v text, id int NOT NULL, k int NOT NULL)`)
	mustExec(t, db, `ALTER TABLE `+qualified(s, "pd")+` DETACH PARTITION `+qualified(s, "pdx"))
	mustExec(t, db, `ALTER TABLE `+qualified(s, "pd")+` ATTACH PARTITION `+qualified(s, "p7")+` DEFAULT`)
	mustExec(t, db, `INSERT INTO `+p+` VALUES (3, 9, 'c')`)
	mustExec(t, db, `INSERT INTO `+qualified(s, "pdx")+` VALUES (4, 9, 'detached')`)
	got := r.collect(5, true)
	checkChanges(t, got, "tc."+s+".p", s, "p", []wantChange{
		{"c", `{"id":1,"k":1}`, "null", `{"id":1,"k":1,"v":"a"}`},
		{"c", `{"id":2,"k":5}`, "null", `{"id":2,"k":5,"v":"b"}`},
		{"d", `{"id":1,"k":1}`, `{"id":1,"k":1,"v":"a"}`, "null"},
		{"c", `{"id":1,"k":7}`, "null", `{"id":1,"k":7,"v":"a"}`},
		{"c", `{"id":3,"k":9}`, "null", `{"id":3,"k":9,"v":"c"}`},
	})
	for i := 1; i < len(got); i++ {
		if got[i].Source.Seq <= got[i-1].Source.Seq {
			t.Errorf("seq not increasing at %d", i)
		}
	}
	r.quiet()
}

// TestTaskStartedAfterARename: a task (re)started while a captured table
// has a name the configuration does not follow yet (renamed while the
// connector runs) still keys its changes and names the columns of the
// changes written before the rename: it finds the table through the
// capture trigger that files its changes under the configured name. It
// used to deliver every change with a null key, and the older ones with
// their columns named _column_<n>, until the configuration followed.
func TestTaskStartedAfterARename(t *testing.T) {
	for _, level := range []string{"statement", "row"} {
		t.Run(level, func(t *testing.T) {
			db, url := admin(t)
			s := newSchema(t, db)
			mustExec(t, db, `CREATE TABLE `+qualified(s, "t")+` (id int PRIMARY KEY, v text)`)
			cfg := baseConfig(testenv.Unique("taskrename-"), url, auditSchemaFor(t, db), s+".t")
			cfg[KeyCaptureLevel] = level
			l := connect.NewMemoryLedger()
			r := startConnector(t, cfg, l)
			defer func() { _ = r.stop(true) }()
			mustExec(t, db, `INSERT INTO `+qualified(s, "t")+` VALUES (1, 'a')`)
			mustExec(t, db, `ALTER TABLE `+qualified(s, "t")+` RENAME TO t2`)
			mustExec(t, db, `INSERT INTO `+qualified(s, "t2")+` VALUES (2, 'b')`)
			// The task alone restarts (POST /connectors/{name}/tasks/0/restart).
			tcs, err := r.conn.TaskConfigs(1)
			if err != nil {
				t.Fatal(err)
			}
			r.tasks[0].Stop(false)
			if err := r.tasks[0].Stopped(connect.WithHost(testCtx(t), testHost(r.name, 0, l))); err != nil {
				t.Fatal(err)
			}
			task := &Task{}
			if err := task.Start(connect.WithHost(testCtx(t), testHost(r.name, 0, l)), tcs[0]); err != nil {
				t.Fatal(err)
			}
			r.tasks[0] = task
			mustExec(t, db, `ALTER TABLE `+qualified(s, "t2")+` ADD COLUMN g int GENERATED ALWAYS AS (id * 2) STORED`)
			mustExec(t, db, `INSERT INTO `+qualified(s, "t2")+` VALUES (3, 'c')`)
			checkChanges(t, r.collect(3, true), "tc."+s+".t", s, "t", []wantChange{
				{"c", `{"id":1}`, "null", `{"id":1,"v":"a"}`},
				{"c", `{"id":2}`, "null", `{"id":2,"v":"b"}`},
				{"c", `{"id":3}`, "null", `{"id":3,"v":"c","g":6}`},
			})
		})
	}
}

// TestStartAfterARenameNamesTheNewName: a Start (a worker restart, say)
// after a captured table was renamed, before the configuration follows,
// fails, and its message names the new name to put in tables. It used to
// say only "create it or remove it from tables", and removing the old name
// deletes the changes waiting under it (decision 0049). Validation says
// the same. Following the advice keeps every change.
func TestStartAfterARenameNamesTheNewName(t *testing.T) {
	for _, level := range []string{"statement", "row"} {
		t.Run(level, func(t *testing.T) {
			db, url := admin(t)
			s := newSchema(t, db)
			s2 := s + "_moved"
			t.Cleanup(func() { dropSchema(t, db, s2) })
			mustExec(t, db, `CREATE SCHEMA `+pgx.Identifier{s2}.Sanitize())
			mustExec(t, db, `CREATE TABLE `+qualified(s, "t")+` (id int PRIMARY KEY, v text)`)
			cfg := baseConfig(testenv.Unique("restart-renamed-"), url, auditSchemaFor(t, db), s+".t")
			cfg[KeyCaptureLevel] = level
			l := connect.NewMemoryLedger()
			if err := startConnector(t, cfg, l).stop(false); err != nil {
				t.Fatal(err)
			}
			mustExec(t, db, `INSERT INTO `+qualified(s, "t")+` VALUES (1, 'a')`)
			mustExec(t, db, `ALTER TABLE `+qualified(s, "t")+` RENAME TO t2`)
			mustExec(t, db, `ALTER TABLE `+qualified(s, "t2")+` SET SCHEMA `+pgx.Identifier{s2}.Sanitize())
			mustExec(t, db, `INSERT INTO `+qualified(s2, "t2")+` VALUES (2, 'b')`)
			want := `it was renamed to ` + qualified(s2, "t2")
			_, err := tryStart(t, cfg, l)
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("Start after the rename: %v; want an error saying %q", err, want)
			}
			if errs := (&Connector{}).Validate(testCtx(t), cfg); !slices.ContainsFunc(errs[KeyTables], func(e string) bool { return strings.Contains(e, want) }) {
				t.Errorf("validation after the rename: %v; want %q", errs, want)
			}
			cfg[KeyTables] = s2 + ".t2"
			r := startConnector(t, cfg, l)
			defer func() { _ = r.stop(true) }()
			checkChanges(t, r.collect(2, true), "tc."+s2+".t2", s2, "t2", []wantChange{
				{"c", `{"id":1}`, "null", `{"id":1,"v":"a"}`},
				{"c", `{"id":2}`, "null", `{"id":2,"v":"b"}`},
			})
		})
	}
}

// TestRenamedAndAlteredWhileItsNameIsReused: a captured table renamed and
// altered while the task runs, with a new table made under its old name:
// the renamed table's changes (its trigger still files them under the old
// name) keep its columns and key. The task used to read the new table's
// instead (named _column_<n>, key null, for every later change too).
func TestRenamedAndAlteredWhileItsNameIsReused(t *testing.T) {
	// The task's check of its tables' triggers would fail it once the new
	// table (without them) is seen, as TestCapturedTableDroppedWhileRunning
	// shows; this is about the changes decoded until then.
	defer func(was time.Duration) { captureCheckInterval = was }(captureCheckInterval)
	captureCheckInterval = time.Hour
	for _, level := range []string{"statement", "row"} {
		t.Run(level, func(t *testing.T) {
			db, s, r := capturingT(t, "renamed-reused-", level)
			mustExec(t, db, `INSERT INTO `+qualified(s, "t")+` VALUES (1, 'a')`)
			r.collect(1, true)
			mustExec(t, db, `INSERT INTO `+qualified(s, "t")+` VALUES (2, 'b')`)
			mustExec(t, db, `ALTER TABLE `+qualified(s, "t")+` RENAME TO t2`)
			mustExec(t, db, `ALTER TABLE `+qualified(s, "t2")+` ADD COLUMN w int`)
			mustExec(t, db, `CREATE TABLE `+qualified(s, "t")+` (k text PRIMARY KEY, x int, y int)`)
			mustExec(t, db, `INSERT INTO `+qualified(s, "t2")+` VALUES (3, 'c', 7)`)
			got := r.collect(2, true)
			checkChanges(t, got, "tc."+s+".t", s, "t", []wantChange{
				{"c", `{"id":2}`, "null", `{"id":2,"v":"b"}`},
				{"c", `{"id":3}`, "null", `{"id":3,"v":"c","w":7}`},
			})
		})
	}
}

// capturingT creates table t (id int PRIMARY KEY, v text) in a new schema
// and starts a connector named from prefix capturing it at level; the
// connector is deleted at the end of the test.
func capturingT(t *testing.T, prefix, level string) (*pgxpool.Pool, string, *running) {
	t.Helper()
	db, url := admin(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "t")+` (id int PRIMARY KEY, v text)`)
	cfg := baseConfig(testenv.Unique(prefix), url, auditSchemaFor(t, db), s+".t")
	cfg[KeyCaptureLevel] = level
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	t.Cleanup(func() { _ = r.stop(true) })
	return db, s, r
}
