package pgaudit

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestCommitOrderDependencyMadeInsideCommit: under capture.order = commit
// a transaction's rows get their place as its deferred order trigger fires.
// A deferred trigger of the user's queued after it (by a later statement)
// runs later in the same COMMIT, and can overwrite a change of a
// transaction that became visible in between. The change it makes leaves
// after the one it overwrote (row locks keep per-row order), but the
// transaction's earlier change, placed before the other one became
// visible, leaves before it: the documented exception (docs/pgaudit.md,
// Order).
func TestCommitOrderDependencyMadeInsideCommit(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	events, counter, gate := qualified(s, "events"), qualified(s, "counter"), qualified(s, "gate")
	mustExec(t, db, `CREATE TABLE `+events+` (id int PRIMARY KEY)`)
	mustExec(t, db, `CREATE TABLE `+counter+` (id int PRIMARY KEY, n int NOT NULL)`)
	mustExec(t, db, `INSERT INTO `+counter+` VALUES (1, 0)`)
	mustExec(t, db, `CREATE TABLE `+gate+` (id int)`)
	mustExec(t, db, `CREATE FUNCTION `+qualified(s, "bump")+`() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN UPDATE `+counter+` SET n = n + 1 WHERE id = 1; RETURN NULL; END$$`)
	mustExec(t, db, `CREATE CONSTRAINT TRIGGER bump AFTER INSERT ON `+gate+` DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION `+qualified(s, "bump")+`()`)
	r := startCommitOrder(t, db, url, "inside-", s+".events", s+".counter")

	// A writes its events row, then B takes the counter's row lock (its
	// change is captured after A's row), then A commits: its events row
	// gets its place, then its gate trigger waits for B's row lock.
	a := begin(t, db)
	var aPID int32
	if err := a.QueryRow(testCtx(t), `SELECT pg_backend_pid()`).Scan(&aPID); err != nil {
		t.Fatal(err)
	}
	txExec(t, a, `INSERT INTO `+events+` VALUES (1)`)
	b := begin(t, db)
	txExec(t, b, `UPDATE `+counter+` SET n = n + 1 WHERE id = 1`) // n = 1
	txExec(t, a, `INSERT INTO `+gate+` VALUES (1)`)
	aDone := make(chan error, 1)
	go func() { aDone <- a.Commit(testCtx(t)) }()
	await(t, 30*time.Second, func() (bool, string, error) {
		var waiting bool
		err := db.QueryRow(testCtx(t), `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks WHERE pid = $1 AND NOT granted)`, aPID).Scan(&waiting)
		return waiting, fmt.Sprintf("backend %d does not wait for the counter's row lock", aPID), err
	})
	if err := b.Commit(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if err := <-aDone; err != nil {
		t.Fatalf("transaction A: %v", err)
	}
	var got []string
	for _, c := range r.collect(3, true) {
		got = append(got, fmt.Sprintf("%s %v", c.Source.Table, c.After["n"]))
	}
	// A overwrote B's change, so A depends on B; yet A's events row was
	// numbered before B committed.
	want := []string{"events <nil>", "counter 1", "counter 2"}
	if !slices.Equal(got, want) {
		t.Fatalf("changes left as %v, want %v", got, want)
	}
	r.quiet()
}

// TestCommitOrderLockOfTheEarlierFunctionDroppedAtStart: a connector whose
// order function still takes the shared advisory lock of sessions 5–9 gets
// the function without it at its next Start; until then its commits take
// the lock (writers of its tables wait for a holder), connectors already
// started do not, and a transaction writing the tables of both commits
// once the lock is free.
func TestCommitOrderLockOfTheEarlierFunctionDroppedAtStart(t *testing.T) {
	const earlierKey int64 = 0x7469_6479_6f72_6472 // "tidyordr", the earlier shared key
	db, url := admin(t)
	s := newSchema(t, db)
	oldT, newT := qualified(s, "old"), qualified(s, "new")
	mustExec(t, db, `CREATE TABLE `+oldT+` (id int PRIMARY KEY)`)
	mustExec(t, db, `CREATE TABLE `+newT+` (id int PRIMARY KEY)`)
	l := connect.NewMemoryLedger()
	oldCfg := commitOrder(baseConfig(testenv.Unique("earlier-"), url, auditSchemaFor(t, db), s+".old"))
	old := startConnector(t, oldCfg, l)
	t.Cleanup(func() { // the instance running then; after the transactions' rollbacks
		if err := old.stop(true); err != nil {
			t.Error(err)
		}
	})
	cur := startConnector(t, commitOrder(baseConfig(testenv.Unique("current-"), url, auditSchemaFor(t, db), s+".new")), connect.NewMemoryLedger())
	stopAtCleanup(t, cur)
	// What the earlier version installed: the same function, taking the
	// lock first.
	fn := qualified(oldCfg[KeyAuditSchema], objectNames(old.name).order)
	mustExec(t, db, fmt.Sprintf(`CREATE OR REPLACE FUNCTION %s() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pg_catalog.pg_advisory_xact_lock(%d);
    UPDATE %s SET id = DEFAULT WHERE id = NEW.id;
    RETURN NULL;
END$$`, fn, earlierKey, auditTable(old)))
	takesLock := func() bool {
		var src string
		if err := db.QueryRow(testCtx(t), `SELECT prosrc FROM pg_catalog.pg_proc WHERE oid = $1::regprocedure`, fn+"()").Scan(&src); err != nil {
			t.Fatal(err)
		}
		return strings.Contains(src, "pg_advisory_xact_lock")
	}

	holder := begin(t, db)
	txExec(t, holder, fmt.Sprintf(`SELECT pg_advisory_xact_lock(%d)`, earlierKey))
	execWithin(t, db, 10*time.Second, `INSERT INTO `+newT+` VALUES (1)`)
	bothPID, bothDone := inBackground(t, db, `INSERT INTO `+newT+` VALUES (2)`, `INSERT INTO `+oldT+` VALUES (2)`)
	awaitAdvisoryWait(t, db, bothPID, earlierKey)
	if err := holder.Rollback(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if err := <-bothDone; err != nil {
		t.Fatalf("the transaction writing both connectors' tables: %v", err)
	}
	if ids := keyIDs(t, cur.collect(2, true)); !slices.Equal(ids, []int64{1, 2}) {
		t.Errorf("the current connector delivered %v, want [1 2]", ids)
	}
	if ids := keyIDs(t, old.collect(1, true)); !slices.Equal(ids, []int64{2}) {
		t.Errorf("the earlier connector delivered %v, want [2]", ids)
	}

	if err := old.stop(false); err != nil {
		t.Fatal(err)
	}
	if !takesLock() {
		t.Fatal("the earlier function was replaced before the Start")
	}
	old = startConnector(t, oldCfg, l)
	if takesLock() {
		t.Fatal("Start kept the earlier function, which takes the shared lock")
	}
	holder = begin(t, db)
	txExec(t, holder, fmt.Sprintf(`SELECT pg_advisory_xact_lock(%d)`, earlierKey))
	execWithin(t, db, 10*time.Second, `INSERT INTO `+oldT+` VALUES (3)`)
	if ids := keyIDs(t, old.collect(1, true)); !slices.Equal(ids, []int64{3}) {
		t.Errorf("after the Start the connector delivered %v, want [3]", ids)
	}
	old.quiet()
	cur.quiet()
}
