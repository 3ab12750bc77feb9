package pgaudit

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// keyIDs returns the "id" of each change's key, in order.
func keyIDs(t testing.TB, cs []change) []int64 {
	t.Helper()
	ids := make([]int64, len(cs))
	for i, c := range cs {
		n, ok := c.Key["id"].(json.Number)
		if !ok {
			t.Fatalf("change %d has key %v, want an id", i, c.Key)
		}
		ids[i], _ = n.Int64()
	}
	return ids
}

func seqRange(from, to int64) []int64 {
	var out []int64
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

func commitOrder(cfg connect.Config) connect.Config {
	cfg[KeyCaptureOrder] = orderCommit
	return cfg
}

// startCommitOrder starts a connector named prefix plus a unique suffix,
// under capture.order = commit, capturing tables, with an audit schema of
// its own; it is deleted at cleanup (stopAtCleanup).
func startCommitOrder(t testing.TB, db *pgxpool.Pool, url, prefix string, tables ...string) *running {
	t.Helper()
	r := startConnector(t, commitOrder(baseConfig(testenv.Unique(prefix), url, auditSchemaFor(t, db), tables...)), connect.NewMemoryLedger())
	stopAtCleanup(t, r)
	return r
}

// stopAtCleanup deletes the connector at cleanup, after the transactions
// the test opened later have rolled back (cleanups run last first): a test
// that fails with one open must not make the deletion wait for it.
func stopAtCleanup(t testing.TB, r *running) {
	t.Cleanup(func() {
		if err := r.stop(true); err != nil {
			t.Error(err)
		}
	})
}

func begin(t testing.TB, db *pgxpool.Pool) pgx.Tx {
	t.Helper()
	tx, err := db.Begin(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

func txExec(t testing.TB, tx pgx.Tx, sql string, args ...any) {
	t.Helper()
	if _, err := tx.Exec(testCtx(t), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// TestCaptureOrder: transaction A writes rows 1 and then 100..299 (single
// audit rows and a group), B writes row 2 and commits, then A commits. Under
// capture.order = commit the changes leave in commit order, B's first, and
// source.seq grows with them; under statement they leave in the order the
// statements ran. Each transaction's own changes keep their order in both.
func TestCaptureOrder(t *testing.T) {
	tests := []struct {
		order string
		want  []int64
	}{
		{orderCommit, append([]int64{2, 1}, seqRange(100, 299)...)},
		{orderStatement, append(append([]int64{1}, seqRange(100, 299)...), 2)},
	}
	for _, tt := range tests {
		t.Run(tt.order, func(t *testing.T) {
			db, url := admin(t)
			s := newSchema(t, db)
			tbl := qualified(s, "events")
			mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY)`)
			cfg := baseConfig(testenv.Unique("order-"), url, auditSchemaFor(t, db), s+".events")
			cfg[KeyCaptureOrder] = tt.order
			cfg[KeyPollMaxRecords] = "1000"
			r := startConnector(t, cfg, connect.NewMemoryLedger())
			stopAtCleanup(t, r)

			a := begin(t, db)
			txExec(t, a, `INSERT INTO `+tbl+` VALUES (1)`)
			txExec(t, a, `INSERT INTO `+tbl+` SELECT g FROM generate_series(100, 299) g`)
			mustExec(t, db, `INSERT INTO `+tbl+` VALUES (2)`) // B: commits first
			if err := a.Commit(testCtx(t)); err != nil {
				t.Fatal(err)
			}
			got := r.collect(len(tt.want), true)
			if ids := keyIDs(t, got); !slices.Equal(ids, tt.want) {
				t.Fatalf("changes left in order %v, want %v", ids, tt.want)
			}
			if tt.order == orderCommit {
				for i := 1; i < len(got); i++ {
					if got[i].Source.Seq <= got[i-1].Source.Seq {
						t.Fatalf("source.seq %d after %d: not increasing in commit order", got[i].Source.Seq, got[i-1].Source.Seq)
					}
				}
			}
			r.quiet()
		})
	}
}

// inBackground runs statements in one transaction on a connection of its
// own and returns that backend's pid and a channel with the outcome.
func inBackground(t testing.TB, db *pgxpool.Pool, sqls ...string) (int32, <-chan error) {
	t.Helper()
	conn, err := db.Acquire(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	var pid int32
	if err := conn.QueryRow(testCtx(t), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		conn.Release()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		defer conn.Release()
		done <- pgx.BeginFunc(context.Background(), conn, func(tx pgx.Tx) error {
			for _, sql := range sqls {
				if _, err := tx.Exec(context.Background(), sql); err != nil {
					return err
				}
			}
			return nil
		})
	}()
	return pid, done
}

// commitGate makes table s.gate whose deferred constraint trigger waits,
// at COMMIT, for advisory lock key: a transaction that inserts into it
// after a captured statement stalls inside its COMMIT, after its order
// trigger ran, for as long as the test holds the lock.
func commitGate(t testing.TB, db *pgxpool.Pool, s string) (gate string, key int64) {
	t.Helper()
	gate, key = qualified(s, "gate"), time.Now().UnixNano()
	mustExec(t, db, `CREATE TABLE `+gate+` (id int)`)
	mustExec(t, db, fmt.Sprintf(`CREATE FUNCTION %s() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN PERFORM pg_advisory_xact_lock(%d); RETURN NULL; END$$`, qualified(s, "gate_wait"), key))
	mustExec(t, db, `CREATE CONSTRAINT TRIGGER gate_wait AFTER INSERT ON `+gate+` DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION `+qualified(s, "gate_wait")+`()`)
	return gate, key
}

// awaitAdvisoryWait waits until backend pid waits for the advisory lock
// key.
func awaitAdvisoryWait(t testing.TB, db *pgxpool.Pool, pid int32, key int64) {
	t.Helper()
	await(t, 30*time.Second, func() (bool, string, error) {
		var waiting bool
		err := db.QueryRow(testCtx(t), `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks
WHERE pid = $1 AND locktype = 'advisory' AND NOT granted AND ((classid::int8 << 32) | objid::int8) = $2)`, pid, key).Scan(&waiting)
		return waiting, fmt.Sprintf("backend %d does not wait for advisory lock %d", pid, key), err
	})
}

// execWithin runs sql in a transaction of its own and fails the test if
// it has not committed within d: a writer that waits for another's commit.
func execWithin(t testing.TB, db *pgxpool.Pool, d time.Duration, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(testCtx(t), d)
	defer cancel()
	if _, err := db.Exec(ctx, sql); err != nil {
		t.Fatalf("%s did not commit within %v (does it wait for another writer's commit?): %v", sql, d, err)
	}
}

// TestCommitOrderStalledCommitHoldsNoOneBack: under capture.order = commit
// a transaction whose COMMIT stalls after its audit rows were renumbered
// (here in a deferred trigger of the user's that waits for a lock the test
// holds) makes no other capturing writer wait; the other one's change
// leaves first, and the stalled one's when it has committed, although its
// commit-time id is the smaller one. Nothing is lost or left behind.
func TestCommitOrderStalledCommitHoldsNoOneBack(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "events")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY)`)
	gate, key := commitGate(t, db, s)
	r := startCommitOrder(t, db, url, "stalled-", s+".events")

	holder := begin(t, db)
	txExec(t, holder, fmt.Sprintf(`SELECT pg_advisory_xact_lock(%d)`, key))
	// Deferred events fire in the order they were queued: the order
	// trigger of the events row, then the gate's.
	stalledPID, stalledDone := inBackground(t, db, `INSERT INTO `+tbl+` VALUES (1)`, `INSERT INTO `+gate+` VALUES (1)`)
	awaitAdvisoryWait(t, db, stalledPID, key)
	execWithin(t, db, 10*time.Second, `INSERT INTO `+tbl+` VALUES (2)`)
	if ids := keyIDs(t, r.collect(1, true)); !slices.Equal(ids, []int64{2}) {
		t.Fatalf("while the first commit stalls, changes %v left, want [2]", ids)
	}
	if err := holder.Rollback(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if err := <-stalledDone; err != nil {
		t.Fatalf("the stalled transaction: %v", err)
	}
	if ids := keyIDs(t, r.collect(1, true)); !slices.Equal(ids, []int64{1}) {
		t.Fatalf("after the stalled commit, changes %v left, want [1]", ids)
	}
	r.quiet()
	var left int
	if err := db.QueryRow(testCtx(t), `SELECT count(*) FROM `+auditTable(r)).Scan(&left); err != nil || left != 0 {
		t.Fatalf("audit rows left after acknowledgement: %d (%v), want 0", left, err)
	}
}

// TestCommitOrderSetConstraintsImmediate: SET CONSTRAINTS ALL IMMEDIATE
// makes the order trigger run at the end of each statement, so that
// transaction's changes get their ids as its statements end (statement
// order, as documented), and no other writer waits for it.
func TestCommitOrderSetConstraintsImmediate(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "events")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY)`)
	r := startCommitOrder(t, db, url, "immediate-", s+".events")

	a := begin(t, db)
	txExec(t, a, `SET CONSTRAINTS ALL IMMEDIATE`)
	txExec(t, a, `INSERT INTO `+tbl+` VALUES (1)`)
	execWithin(t, db, 10*time.Second, `INSERT INTO `+tbl+` VALUES (2)`)
	txExec(t, a, `INSERT INTO `+tbl+` VALUES (3)`)
	if err := a.Commit(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if ids := keyIDs(t, r.collect(3, true)); !slices.Equal(ids, []int64{1, 2, 3}) {
		t.Fatalf("changes left in order %v, want [1 2 3]", ids)
	}
	r.quiet()
}

// TestCaptureOrderReconfigure: commit (the default) installs the order
// objects and changes leave in commit order; switching to statement drops
// them and releases their ledger entries; switching back installs them
// again. Capture goes on throughout.
func TestCaptureOrderReconfigure(t *testing.T) {
	db, url := admin(t)
	ctx := testCtx(t)
	s := newSchema(t, db)
	tbl := qualified(s, "events")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY)`)
	audit := auditSchemaFor(t, db)
	l := connect.NewMemoryLedger()
	cfg := baseConfig(testenv.Unique("reorder-"), url, audit, s+".events")
	n := objectNames(cfg["name"])
	var dbName string
	if err := db.QueryRow(ctx, `SELECT current_database()`).Scan(&dbName); err != nil {
		t.Fatal(err)
	}
	orderObjects := []connect.Resource{functionRes(dbName, audit, n.order), triggerRes(dbName, tableName{audit, n.table}, n.order)}
	check := func(step string, want bool) {
		t.Helper()
		listed, _ := l.List(ctx)
		for _, res := range orderObjects {
			ok, err := resourceExists(ctx, db, res)
			if err != nil {
				t.Fatal(err)
			}
			if ok != want || slices.Contains(listed, res) != want {
				t.Errorf("%s: %v exists %v, in the ledger %v; want %v", step, res, ok, slices.Contains(listed, res), want)
			}
		}
	}

	next := int64(0)
	for _, step := range []struct {
		order string // "": the default
		want  bool
	}{{"", true}, {orderStatement, false}, {orderCommit, true}} {
		if step.order != "" {
			cfg[KeyCaptureOrder] = step.order
		}
		r := startConnector(t, cfg, l)
		check("capture.order="+step.order, step.want)
		// A writes first and commits last.
		a := begin(t, db)
		txExec(t, a, `INSERT INTO `+tbl+` VALUES ($1)`, next+1)
		mustExec(t, db, `INSERT INTO `+tbl+` VALUES ($1)`, next+2)
		if err := a.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		want := []int64{next + 1, next + 2}
		if step.want {
			want = []int64{next + 2, next + 1}
		}
		if ids := keyIDs(t, r.collect(2, true)); !slices.Equal(ids, want) {
			t.Errorf("capture.order=%s: changes left in order %v, want %v", step.order, ids, want)
		}
		next += 2
		if err := r.stop(false); err != nil {
			t.Fatal(err)
		}
	}
	cfg[KeyCaptureOrder] = orderCommit
	r := startConnector(t, cfg, l)
	if err := r.stop(true); err != nil {
		t.Fatal(err)
	}
	check("deleted", false)
}

// TestCommitOrderRefusesForeignObjects: under commit, a function or a
// trigger of the order objects' names that is not the connector's makes
// Start fail naming capture.order, with nothing provisioned and the ledger
// unchanged; statement leaves them alone.
func TestCommitOrderRefusesForeignObjects(t *testing.T) {
	db, url := admin(t)
	ctx := testCtx(t)
	refused := func(t *testing.T, cfg connect.Config, l connect.Ledger, what string) {
		t.Helper()
		before, _ := l.List(ctx)
		r, err := tryStart(t, cfg, l)
		if err == nil {
			stopAtCleanup(t, r)
		}
		if err == nil || !strings.Contains(err.Error(), KeyCaptureOrder) || !strings.Contains(err.Error(), what) {
			t.Fatalf("Start = %v, want an error naming %s and %s", err, KeyCaptureOrder, what)
		}
		if after, _ := l.List(ctx); !slices.Equal(after, before) {
			t.Errorf("ledger changed by the refusal: %v, was %v", after, before)
		}
	}

	t.Run("function", func(t *testing.T) {
		s := newSchema(t, db)
		mustExec(t, db, `CREATE TABLE `+qualified(s, "events")+` (id int PRIMARY KEY)`)
		// The audit schema is the test schema: someone else's function
		// lives where the connector's would.
		cfg := commitOrder(baseConfig(testenv.Unique("foreign-"), url, s, s+".events"))
		n := objectNames(cfg["name"])
		mustExec(t, db, `CREATE FUNCTION `+qualified(s, n.order)+`() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NULL; END$$`)
		l := connect.NewMemoryLedger()
		refused(t, cfg, l, "function "+qualified(s, n.order))
		if relExists(t, db, s, n.table) || triggerCount(t, db, s, "events") != 0 {
			t.Error("objects were provisioned for a refused start")
		}

		cfg[KeyCaptureOrder] = orderStatement
		r := startConnector(t, cfg, l)
		if err := r.stop(true); err != nil {
			t.Fatal(err)
		}
		var kept bool
		if err := db.QueryRow(ctx, `SELECT to_regprocedure($1) IS NOT NULL`, qualified(s, n.order)+"()").Scan(&kept); err != nil || !kept {
			t.Errorf("someone else's function was dropped (%v)", err)
		}
	})

	t.Run("trigger", func(t *testing.T) {
		s := newSchema(t, db)
		mustExec(t, db, `CREATE TABLE `+qualified(s, "events")+` (id int PRIMARY KEY)`)
		audit := auditSchemaFor(t, db)
		cfg := baseConfig(testenv.Unique("foreign-"), url, audit, s+".events")
		n := objectNames(cfg["name"])
		l := connect.NewMemoryLedger()
		cfg[KeyCaptureOrder] = orderStatement
		r := startConnector(t, cfg, l) // no order objects yet
		if err := r.stop(false); err != nil {
			t.Fatal(err)
		}
		// Someone's own trigger, under the name the order trigger takes.
		mustExec(t, db, `CREATE FUNCTION `+qualified(s, "mine")+`() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NULL; END$$`)
		mustExec(t, db, `CREATE TRIGGER `+pgx.Identifier{n.order}.Sanitize()+` AFTER INSERT ON `+qualified(audit, n.table)+` FOR EACH ROW EXECUTE FUNCTION `+qualified(s, "mine")+`()`)
		refused(t, commitOrder(cfg.Clone()), l, "trigger "+pgx.Identifier{n.order}.Sanitize())
		var fn bool
		if err := db.QueryRow(ctx, `SELECT to_regprocedure($1) IS NOT NULL`, qualified(audit, n.order)+"()").Scan(&fn); err != nil || fn {
			t.Errorf("the order function was created for a refused start (%v)", err)
		}
		r = startConnector(t, cfg, l)
		if err := r.stop(true); err != nil {
			t.Fatal(err)
		}
	})
}

// TestDDLLocksCapturedTablesBeforeTheAuditTable: a capturing writer locks
// its table, then the audit table. Deletion and a reconfiguration that
// removes tables and leaves commit order must lock in the same order: while
// they wait for a reader of one captured table, a writer of another one
// goes through. Taking the audit table first (the commit-order trigger's
// DROP) held every writer back, and the first to need a captured table the
// DDL waited for became a deadlock victim.
func TestDDLLocksCapturedTablesBeforeTheAuditTable(t *testing.T) {
	for _, tc := range []struct {
		name     string
		order    string
		deletion bool
	}{
		{"deletion, commit order", orderCommit, true},
		{"deletion, statement order", orderStatement, true},
		{"leaving commit order and two tables", orderCommit, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, url := admin(t)
			ctx := testCtx(t)
			s := newSchema(t, db)
			for _, tb := range []string{"keep", "a", "b"} {
				mustExec(t, db, `CREATE TABLE `+qualified(s, tb)+` (id int PRIMARY KEY)`)
			}
			audit := auditSchemaFor(t, db)
			cfg := baseConfig(testenv.Unique("lockorder-"), url, audit, s+".keep", s+".a", s+".b")
			cfg[KeyCaptureOrder] = tc.order
			l := connect.NewMemoryLedger()
			r := startConnector(t, cfg, l)

			// A reader of a: the DDL waits for it at a's triggers.
			reader := begin(t, db)
			txExec(t, reader, `SELECT count(*) FROM `+qualified(s, "a"))
			ddl := make(chan error, 1)
			var restarted *running
			if tc.deletion {
				go func() { ddl <- r.stop(true) }()
			} else {
				if err := r.stop(false); err != nil {
					t.Fatal(err)
				}
				cfg2 := baseConfig(cfg["name"], url, audit, s+".keep")
				go func() {
					var err error
					restarted, err = tryStart(t, cfg2, l)
					ddl <- err
				}()
			}
			await(t, 10*time.Second, func() (bool, string, error) {
				var n int
				err := db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`,
					ApplicationName(cfg["name"], "connector")).Scan(&n)
				return n > 0, "the DDL waiting for the reader of a", err
			})

			// A writer of b goes through while the DDL still waits.
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := db.Exec(wctx, `INSERT INTO `+qualified(s, "b")+` VALUES (1)`)
			cancel()
			if err != nil {
				t.Errorf("a writer of another captured table, while the DDL waits: %v", err)
			}
			select {
			case err := <-ddl:
				t.Fatalf("the DDL finished before the reader of a did: %v", err)
			default:
			}
			if err := reader.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-ddl; err != nil {
				t.Fatalf("the DDL after the reader: %v", err)
			}
			if restarted != nil {
				if err := restarted.stop(true); err != nil {
					t.Fatal(err)
				}
			}
			if rs, _ := l.List(ctx); len(rs) != 0 && tc.deletion {
				t.Errorf("ledger after deletion: %v", rs)
			}
		})
	}
}

// TestRowCaptureBeforeTheTablesOwnTriggers: under row-level capture a
// table's own AFTER trigger that writes the row again, whatever its name,
// fires after the capture trigger has recorded the change, so the row's
// changes leave in the order they happened. (A trigger named a_... fired
// first while the capture trigger was named <base>_row.)
func TestRowCaptureBeforeTheTablesOwnTriggers(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "t")
	q := pgx.Identifier{s}.Sanitize()
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY, v text, ver int NOT NULL DEFAULT 0)`)
	mustExec(t, db, `CREATE FUNCTION `+q+`.bump() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN UPDATE `+tbl+` SET ver = ver + 1 WHERE id = NEW.id; RETURN NULL; END $$`)
	for _, name := range []string{"a_bump", "Z_bump", "0_bump", "_bump"} {
		mustExec(t, db, `CREATE TRIGGER `+pgx.Identifier{name}.Sanitize()+` AFTER INSERT OR UPDATE OF v ON `+tbl+` FOR EACH ROW EXECUTE FUNCTION `+q+`.bump()`)
	}
	cfg := baseConfig(testenv.Unique("nested-"), url, auditSchemaFor(t, db), s+".t")
	cfg[KeyCaptureLevel] = levelRow
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()

	mustExec(t, db, `INSERT INTO `+tbl+` (id, v) VALUES (1, 'a')`)
	var got []string
	for _, c := range r.collect(5, true) {
		got = append(got, fmt.Sprintf("%s %v->%v", c.Op, c.Before["ver"], c.After["ver"]))
	}
	// The insert, then the four triggers' bumps, each after the change
	// it follows. (Only a name sorting before '!', such as one with a
	// leading space, would fire first: docs/pgaudit.md, "Order".)
	want := []string{"c <nil>->0", "u 0->1", "u 1->2", "u 2->3", "u 3->4"}
	if !slices.Equal(got, want) {
		t.Errorf("changes %v, want %v", got, want)
	}
}

// TestRowTriggerOfTheEarlierNameReplaced: a row trigger made under the
// earlier name (<base>_row, which could fire after a table's own triggers)
// is replaced at Start by the current one, on partitions too, and the
// ledger follows.
func TestRowTriggerOfTheEarlierNameReplaced(t *testing.T) {
	db, url := admin(t)
	ctx := testCtx(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "plain")+` (id int PRIMARY KEY)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "p")+` (id int PRIMARY KEY) PARTITION BY RANGE (id)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "p1")+` PARTITION OF `+qualified(s, "p")+` FOR VALUES FROM (0) TO (10)`)
	cfg := baseConfig(testenv.Unique("rowname-"), url, auditSchemaFor(t, db), s+".plain", s+".p")
	cfg[KeyCaptureLevel] = levelRow
	l := connect.NewMemoryLedger()
	if err := startConnector(t, cfg, l).stop(false); err != nil {
		t.Fatal(err)
	}
	// What the earlier version left: the trigger, and its ledger entry,
	// under the earlier name.
	n := objectNames(cfg["name"])
	earlier := n.base + "_row"
	for _, tb := range []string{"plain", "p"} {
		mustExec(t, db, `ALTER TRIGGER `+pgx.Identifier{n.rowTrigger}.Sanitize()+` ON `+qualified(s, tb)+` RENAME TO `+pgx.Identifier{earlier}.Sanitize())
		if err := l.Release(ctx, triggerRes(testDB(t, db), tableName{s, tb}, n.rowTrigger)); err != nil {
			t.Fatal(err)
		}
		if err := l.Own(ctx, triggerRes(testDB(t, db), tableName{s, tb}, earlier)); err != nil {
			t.Fatal(err)
		}
	}
	if tr := captureTriggersIn(t, ctx, db, cfg["name"], s); !slices.Contains(tr, "p1 <base>_row true") {
		t.Fatalf("the earlier name was not set up: %v", tr)
	}

	r := startConnector(t, cfg, l)
	defer func() { _ = r.stop(true) }()
	want := []string{"p !<base>_row false", "p <base>_trunc false", "p1 !<base>_row true", "plain !<base>_row false", "plain <base>_trunc false"}
	if tr := captureTriggersIn(t, ctx, db, cfg["name"], s); !slices.Equal(tr, want) {
		t.Errorf("triggers %v, want %v", tr, want)
	}
	rs, _ := l.List(ctx)
	for _, r := range rs {
		if r.Kind == KindTrigger && r.Name == earlier {
			t.Errorf("the ledger still lists %v", r)
		}
	}
	mustExec(t, db, `INSERT INTO `+qualified(s, "plain")+` VALUES (1)`)
	mustExec(t, db, `INSERT INTO `+qualified(s, "p")+` VALUES (2)`)
	if got := r.collect(2, true); len(got) != 2 || got[0].Op != "c" || got[1].Op != "c" {
		t.Errorf("captured %+v", got)
	}
}

// TestWarnsOfTheTablesOwnAfterTriggers: Start warns, under statement-level
// capture, of a captured table's own AFTER triggers (which could write the
// table again, out of the capture's order), and not of BEFORE triggers,
// of another pgaudit connector's capture triggers, or under row-level
// capture.
func TestWarnsOfTheTablesOwnAfterTriggers(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	q := pgx.Identifier{s}.Sanitize()
	for _, tb := range []string{"own", "before_only"} {
		mustExec(t, db, `CREATE TABLE `+qualified(s, tb)+` (id int PRIMARY KEY, ver int)`)
	}
	mustExec(t, db, `CREATE FUNCTION `+q+`.noop() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NEW; END$$`)
	mustExec(t, db, `CREATE TRIGGER bump AFTER UPDATE ON `+qualified(s, "own")+` FOR EACH ROW EXECUTE FUNCTION `+q+`.noop()`)
	mustExec(t, db, `CREATE TRIGGER stamp BEFORE UPDATE ON `+qualified(s, "before_only")+` FOR EACH ROW EXECUTE FUNCTION `+q+`.noop()`)
	// Another connector's capture triggers on both tables.
	other := startConnector(t, baseConfig(testenv.Unique("other-"), url, auditSchemaFor(t, db), s+".own", s+".before_only"), connect.NewMemoryLedger())
	defer func() { _ = other.stop(true) }()

	for _, level := range []string{levelStatement, levelRow} {
		t.Run(level, func(t *testing.T) {
			cfg := baseConfig(testenv.Unique("warn-"), url, auditSchemaFor(t, db), s+".own", s+".before_only")
			cfg[KeyCaptureLevel] = level
			var logs bytes.Buffer
			h := testHost(cfg["name"], -1, connect.NewMemoryLedger())
			h.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
			ctx := connect.WithHost(testCtx(t), h)
			c := &Connector{}
			if err := c.Start(ctx, cfg); err != nil {
				t.Fatal(err)
			}
			c.Stop(true)
			if err := c.Stopped(ctx); err != nil {
				t.Fatal(err)
			}
			warned := strings.Count(logs.String(), "AFTER triggers of its own")
			switch {
			case level == levelStatement && (warned != 1 || !strings.Contains(logs.String(), "table="+s+".own triggers=[bump]")):
				t.Errorf("want one warning naming %s.own and bump; logs:\n%s", s, logs.String())
			case level == levelRow && warned != 0:
				t.Errorf("warned under row-level capture:\n%s", logs.String())
			}
		})
	}
}

// TestRowTriggerRenamedWithoutTriggerOnPartitions: the row trigger of a
// partitioned table under its earlier name is renamed, not made anew, so a
// partition the connector's role has no TRIGGER privilege on (attached
// later, by another role) does not stop the upgrade (PostgreSQL 15 renames
// the partitions' copies with it).
func TestRowTriggerRenamedWithoutTriggerOnPartitions(t *testing.T) {
	db, url := admin(t)
	ctx := testCtx(t)
	var version int
	if err := db.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	if version < 150000 {
		testenv.Skip(t, "PostgreSQL %d renames no partition copies of a trigger; the trigger is made anew there", version)
	}
	s := newSchema(t, db)
	owner, ownerID := newRole(t, db, "pga_owner_")
	_, otherID := newRole(t, db, "pga_other_")
	mustExec(t, db, `DO $$BEGIN EXECUTE format('GRANT CREATE ON DATABASE %I TO %I', current_database(), `+quoteLiteral(owner)+`); END$$`)
	mustExec(t, db, `GRANT USAGE ON SCHEMA `+pgx.Identifier{s}.Sanitize()+` TO `+ownerID)
	p := qualified(s, "p")
	mustExec(t, db, `CREATE TABLE `+p+` (id int PRIMARY KEY) PARTITION BY RANGE (id)`)
	mustExec(t, db, `ALTER TABLE `+p+` OWNER TO `+ownerID)
	cfg := baseConfig(testenv.Unique("renameup-"), strings.Replace(url, "postgres://postgres@", "postgres://"+owner+"@", 1), auditSchemaFor(t, db), s+".p")
	l := connect.NewMemoryLedger()
	if err := startConnector(t, cfg, l).stop(false); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `CREATE TABLE `+qualified(s, "p1")+` PARTITION OF `+p+` FOR VALUES FROM (0) TO (10)`)
	mustExec(t, db, `ALTER TABLE `+qualified(s, "p1")+` OWNER TO `+otherID)
	// What the earlier version left: the trigger and its entry under the
	// earlier name.
	n := objectNames(cfg["name"])
	earlier := n.base + "_row"
	mustExec(t, db, `ALTER TRIGGER `+pgx.Identifier{n.rowTrigger}.Sanitize()+` ON `+p+` RENAME TO `+pgx.Identifier{earlier}.Sanitize())
	if err := l.Release(ctx, triggerRes(testDB(t, db), tableName{s, "p"}, n.rowTrigger)); err != nil {
		t.Fatal(err)
	}
	if err := l.Own(ctx, triggerRes(testDB(t, db), tableName{s, "p"}, earlier)); err != nil {
		t.Fatal(err)
	}

	r := startConnector(t, cfg, l)
	defer func() { _ = r.stop(true) }()
	want := []string{"p !<base>_row false", "p <base>_trunc false", "p1 !<base>_row true"}
	if tr := captureTriggersIn(t, ctx, db, cfg["name"], s); !slices.Equal(tr, want) {
		t.Errorf("triggers %v, want %v", tr, want)
	}
	rs, err := l.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(rs, triggerRes(testDB(t, db), tableName{s, "p"}, n.rowTrigger)) || slices.Contains(rs, triggerRes(testDB(t, db), tableName{s, "p"}, earlier)) {
		t.Errorf("ledger %v", rs)
	}
	mustExec(t, db, `INSERT INTO `+p+` VALUES (1)`)
	if got := r.collect(1, true); got[0].Op != "c" {
		t.Errorf("captured %+v", got[0])
	}
}

// TestDisabledTriggerOfTheEarlierName: a disabled row trigger under the
// earlier name is refused when Start would rename it (it would stay
// disabled), and simply replaced when the current one exists too.
func TestDisabledTriggerOfTheEarlierName(t *testing.T) {
	for _, both := range []bool{false, true} {
		t.Run(fmt.Sprintf("current one too: %v", both), func(t *testing.T) {
			db, url := admin(t)
			ctx := testCtx(t)
			var version int
			if err := db.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
				t.Fatal(err)
			}
			if version < 150000 && !both {
				testenv.Skip(t, "PostgreSQL %d: the earlier-named trigger is made anew, not renamed", version)
			}
			s := newSchema(t, db)
			plain := qualified(s, "plain")
			mustExec(t, db, `CREATE TABLE `+plain+` (id int PRIMARY KEY)`)
			cfg := baseConfig(testenv.Unique("disearlier-"), url, auditSchemaFor(t, db), s+".plain")
			cfg[KeyCaptureLevel] = levelRow
			l := connect.NewMemoryLedger()
			if err := startConnector(t, cfg, l).stop(false); err != nil {
				t.Fatal(err)
			}
			n := objectNames(cfg["name"])
			earlier := pgx.Identifier{n.base + "_row"}.Sanitize()
			if both {
				mustExec(t, db, `CREATE TRIGGER `+earlier+` AFTER INSERT OR UPDATE OR DELETE ON `+plain+` FOR EACH ROW EXECUTE FUNCTION `+
					qualified(cfg[KeyAuditSchema], n.rowFunction)+`(`+quoteLiteral(s)+`, 'plain')`)
			} else {
				mustExec(t, db, `ALTER TRIGGER `+pgx.Identifier{n.rowTrigger}.Sanitize()+` ON `+plain+` RENAME TO `+earlier)
			}
			mustExec(t, db, `ALTER TABLE `+plain+` DISABLE TRIGGER `+earlier)
			r, err := tryStart(t, cfg, l)
			if !both {
				if err == nil || !strings.Contains(err.Error(), "disabled") || !strings.Contains(err.Error(), n.base+"_row") {
					t.Errorf("Start with the earlier-named trigger disabled: %v", err)
				}
				if err == nil {
					_ = r.stop(true)
				}
				return
			}
			if err != nil {
				t.Fatalf("Start with both names, the earlier disabled: %v", err)
			}
			defer func() { _ = r.stop(true) }()
			want := []string{"plain !<base>_row false", "plain <base>_trunc false"}
			if tr := captureTriggersIn(t, ctx, db, cfg["name"], s); !slices.Equal(tr, want) {
				t.Errorf("triggers %v, want %v", tr, want)
			}
		})
	}
}

// TestCommitOrderKeepsIdsNobodyOvertook: under capture.order = commit a
// transaction's audit row whose id is still the last one drawn when it
// commits keeps it (a new one would stand in the same place), so
// sequential writers cost no renumbering; a row someone drew past is
// renumbered behind it, and the changes still leave in commit order.
func TestCommitOrderKeepsIdsNobodyOvertook(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "events")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY)`)
	r := startCommitOrder(t, db, url, "keep-", s+".events")
	audit := auditTable(r)
	lastDrawn := func() int64 {
		t.Helper()
		var n int64
		if err := db.QueryRow(testCtx(t), `SELECT pg_sequence_last_value(pg_get_serial_sequence($1, 'id')::regclass)`, audit).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	ids := func() []int64 { return int64s(t, db, `SELECT id FROM `+audit+` ORDER BY id`) }

	for i := 1; i <= 5; i++ {
		mustExec(t, db, fmt.Sprintf(`INSERT INTO %s VALUES (%d)`, tbl, i))
	}
	got := ids()
	if len(got) != 5 || lastDrawn() != got[4] || got[4]-got[0] != 4 {
		t.Fatalf("after 5 sequential transactions: audit ids %v, last drawn %d; want 5 consecutive ids, none drawn again", got, lastDrawn())
	}
	if keys := keyIDs(t, r.collect(5, true)); !slices.Equal(keys, []int64{1, 2, 3, 4, 5}) {
		t.Fatalf("changes left in order %v, want [1 2 3 4 5]", keys)
	}
	// A transaction of several rows, all the last ids drawn, keeps them too
	// (a run of its own: row-level capture of a bulk statement).
	before5 := lastDrawn()
	run := begin(t, db)
	for i := 20; i < 23; i++ {
		txExec(t, run, fmt.Sprintf(`INSERT INTO %s VALUES (%d)`, tbl, i))
	}
	if err := run.Commit(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if got := ids(); !slices.Equal(got, []int64{before5 + 1, before5 + 2, before5 + 3}) || lastDrawn() != before5+3 {
		t.Fatalf("a run of 3 rows: audit ids %v, last drawn %d (%d before); want its ids kept", got, lastDrawn(), before5)
	}
	if keys := keyIDs(t, r.collect(3, true)); !slices.Equal(keys, []int64{20, 21, 22}) {
		t.Fatalf("changes left in order %v, want [20 21 22]", keys)
	}

	// A writes first and commits last: B drew past A's row, so A's row is
	// renumbered behind B's, which keeps its id.
	a := begin(t, db)
	txExec(t, a, `INSERT INTO `+tbl+` VALUES (6)`)
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (7)`)
	before := lastDrawn()
	if err := a.Commit(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if got := ids(); len(got) != 2 || got[0] != before || got[1] != before+1 || lastDrawn() != before+1 {
		t.Fatalf("audit ids %v (last drawn %d, %d before A's commit), want B's %d kept and A's renumbered to %d", got, lastDrawn(), before, before, before+1)
	}
	if keys := keyIDs(t, r.collect(2, true)); !slices.Equal(keys, []int64{7, 6}) {
		t.Fatalf("changes left in order %v, want [7 6]", keys)
	}
	r.quiet()
}

// TestCommitOrderIgnoresSearchPath: the order function is SECURITY DEFINER
// without a fixed search_path (the SET clause cost a third of what commit
// order adds to a single-row transaction), so it must name nothing through
// the committing writer's search_path. With look-alikes first in it, each
// of the function's paths runs and none of the look-alikes: a row still
// the last drawn, a run of a transaction's own rows, and rows renumbered
// behind a transaction that drew past them (the first decides, the second
// follows the decision).
func TestCommitOrderIgnoresSearchPath(t *testing.T) {
	db, url := admin(t)
	e := plantLookAlikes(t, db)
	s := newSchema(t, db)
	tbl := qualified(s, "events")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY)`)
	r := startCommitOrder(t, db, url, "order-searchpath-", s+".events")

	ctx := testCtx(t)
	// A session of its own: PL/pgSQL compiles a function once per session,
	// under the search_path of its first call.
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	exec := func(sql string) {
		t.Helper()
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s with a hostile search_path: %v", sql, err)
		}
	}
	exec(`SET search_path = ` + e + `, pg_catalog, public`)
	if _, err := conn.Exec(ctx, `SELECT 1::pg_catalog.int8 = 2::pg_catalog.int8`); err == nil || !strings.Contains(err.Error(), "hijacked") {
		t.Fatalf("the look-alike = is not in effect: %v", err)
	}

	exec(`INSERT INTO ` + tbl + ` VALUES (1)`)
	exec(`BEGIN`)
	exec(`INSERT INTO ` + tbl + ` VALUES (2)`)
	exec(`INSERT INTO ` + tbl + ` VALUES (3)`)
	exec(`COMMIT`)
	exec(`BEGIN`)
	exec(`INSERT INTO ` + tbl + ` VALUES (4)`)
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (5)`)
	exec(`INSERT INTO ` + tbl + ` VALUES (6)`)
	exec(`COMMIT`)

	if keys := keyIDs(t, r.collect(6, true)); !slices.Equal(keys, []int64{1, 2, 3, 5, 4, 6}) {
		t.Fatalf("changes left in order %v, want [1 2 3 5 4 6]", keys)
	}
	r.quiet()
}
