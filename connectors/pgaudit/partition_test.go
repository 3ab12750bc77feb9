package pgaudit

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// wantChange is an expected record: op, key and images as JSON ("null"
// for none).
type wantChange struct {
	op, key, before, after string
}

func checkChanges(t *testing.T, got []change, topic, schema, table string, want []wantChange) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d changes, want %d", len(got), len(want))
	}
	for i, w := range want {
		c := got[i]
		if c.Op != w.op {
			t.Errorf("change %d: op %q, want %q", i, c.Op, w.op)
		}
		if k := jsonOf(t, w.key); !reflect.DeepEqual(anyMap(c.Key), k) {
			t.Errorf("change %d (%s): key %v, want %v", i, w.op, c.Key, k)
		}
		if b := jsonOf(t, w.before); !reflect.DeepEqual(anyMap(c.Before), b) {
			t.Errorf("change %d (%s): before %v, want %v", i, w.op, c.Before, b)
		}
		if a := jsonOf(t, w.after); !reflect.DeepEqual(anyMap(c.After), a) {
			t.Errorf("change %d (%s): after %v, want %v", i, w.op, c.After, a)
		}
		if c.Topic != topic || c.Source.Schema != schema || c.Source.Table != table {
			t.Errorf("change %d (%s): topic %q, source %s.%s; want %q, %s.%s", i, w.op, c.Topic, c.Source.Schema, c.Source.Table, topic, schema, table)
		}
	}
}

// captureTriggersIn lists "<table> <trigger> <clone>" for every trigger
// in schema s whose name holds the connector's base.
func captureTriggersIn(t *testing.T, ctx context.Context, db *pgxpool.Pool, connector, s string) []string {
	t.Helper()
	base := objectNames(connector).base
	rows, err := db.Query(ctx, `
SELECT c.relname::text || ' ' || g.tgname::text || ' ' || (g.tgparentid <> 0)::text
FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND strpos(g.tgname::text, $2) > 0 ORDER BY 1`, s, base)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		out = append(out, strings.Replace(v, base, "<base>", 1))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPartitionedTable: a partitioned table is captured under its own name,
// whichever partition a row is in and whichever table the statement names:
// sub-partitions, a partition attached with another column order, and one
// created after the connector started. Deletion removes the triggers from
// the table and all partitions.
func TestPartitionedTable(t *testing.T) {
	db, url := admin(t)
	ctx := testCtx(t)
	s := newSchema(t, db)
	p := qualified(s, "p")
	mustExec(t, db, `CREATE TABLE `+p+` (id int, k int, v text, PRIMARY KEY (id, k)) PARTITION BY RANGE (k)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "p1")+` PARTITION OF `+p+` FOR VALUES FROM (0) TO (10)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "p2")+` PARTITION OF `+p+` FOR VALUES FROM (10) TO (20) PARTITION BY RANGE (k)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "p2a")+` PARTITION OF `+qualified(s, "p2")+` FOR VALUES FROM (10) TO (20)`)
	// Same columns, another order: its images have its own row type.
	mustExec(t, db, `CREATE TABLE `+qualified(s, "p3")+` (v text, k int NOT NULL, id int NOT NULL, PRIMARY KEY (id, k))`)
	mustExec(t, db, `ALTER TABLE `+p+` ATTACH PARTITION `+qualified(s, "p3")+` FOR VALUES FROM (20) TO (30)`)

	r := startConnector(t, baseConfig(testenv.Unique("parted-"), url, auditSchemaFor(t, db), s+".p"), connect.NewMemoryLedger())
	defer func() { _ = r.stop(false) }()
	// Created after Start: PostgreSQL clones the row trigger onto it.
	mustExec(t, db, `CREATE TABLE `+qualified(s, "p4")+` PARTITION OF `+p+` FOR VALUES FROM (30) TO (40)`)

	mustExec(t, db, `INSERT INTO `+p+` VALUES (1, 1, 'a')`)                  // routed into p1
	mustExec(t, db, `INSERT INTO `+qualified(s, "p1")+` VALUES (2, 2, 'b')`) // names the partition
	mustExec(t, db, `INSERT INTO `+qualified(s, "p2a")+` VALUES (5, 15, 'e')`)
	mustExec(t, db, `INSERT INTO `+qualified(s, "p3")+` VALUES ('c', 21, 3)`)
	mustExec(t, db, `INSERT INTO `+qualified(s, "p4")+` VALUES (4, 31, 'd')`)
	mustExec(t, db, `UPDATE `+p+` SET v = 'a2' WHERE id = 1`)
	mustExec(t, db, `UPDATE `+p+` SET k = 32 WHERE id = 1`) // moves the row from p1 to p4
	mustExec(t, db, `DELETE FROM `+qualified(s, "p3")+` WHERE id = 3`)
	mustExec(t, db, `TRUNCATE `+p)

	got := r.collect(10, true)
	r.quiet()
	checkChanges(t, got, "tc."+s+".p", s, "p", []wantChange{
		{"c", `{"id":1,"k":1}`, "null", `{"id":1,"k":1,"v":"a"}`},
		{"c", `{"id":2,"k":2}`, "null", `{"id":2,"k":2,"v":"b"}`},
		{"c", `{"id":5,"k":15}`, "null", `{"id":5,"k":15,"v":"e"}`},
		{"c", `{"id":3,"k":21}`, "null", `{"id":3,"k":21,"v":"c"}`},
		{"c", `{"id":4,"k":31}`, "null", `{"id":4,"k":31,"v":"d"}`},
		{"u", `{"id":1,"k":1}`, `{"id":1,"k":1,"v":"a"}`, `{"id":1,"k":1,"v":"a2"}`},
		// A move between partitions is a delete and an insert, as
		// PostgreSQL's logical replication reports it.
		{"d", `{"id":1,"k":1}`, `{"id":1,"k":1,"v":"a2"}`, "null"},
		{"c", `{"id":1,"k":32}`, "null", `{"id":1,"k":32,"v":"a2"}`},
		{"d", `{"id":3,"k":21}`, `{"id":3,"k":21,"v":"c"}`, "null"},
		{"t", "null", "null", "null"},
	})

	wantTriggers := []string{
		"p !<base>_row false", "p <base>_trunc false",
		"p1 !<base>_row true", "p2 !<base>_row true", "p2a !<base>_row true",
		"p3 !<base>_row true", "p4 !<base>_row true",
	}
	if tr := captureTriggersIn(t, ctx, db, r.name, s); !reflect.DeepEqual(tr, wantTriggers) {
		t.Errorf("triggers %v, want %v", tr, wantTriggers)
	}
	// A partition detached keeps nothing of the connector's.
	mustExec(t, db, `ALTER TABLE `+p+` DETACH PARTITION `+qualified(s, "p4"))
	if n := triggerCount(t, db, s, "p4"); n != 0 {
		t.Errorf("a detached partition keeps %d triggers", n)
	}

	if err := r.stop(true); err != nil {
		t.Fatal(err)
	}
	if tr := captureTriggersIn(t, ctx, db, r.name, s); len(tr) != 0 {
		t.Errorf("after deletion, triggers remain: %v", tr)
	}
	fns := functionsOf(t, db, r.name)
	if fns != 0 {
		t.Errorf("after deletion, %d functions remain", fns)
	}
}

// TestPartitionCapturedAlone: a partition configured on its own is captured
// under its own name, also for rows routed into it through its partitioned
// table; the other partitions are not captured.
func TestPartitionCapturedAlone(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	p := qualified(s, "p")
	mustExec(t, db, `CREATE TABLE `+p+` (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "low")+` PARTITION OF `+p+` FOR VALUES FROM (0) TO (100)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "high")+` PARTITION OF `+p+` FOR VALUES FROM (100) TO (200)`)
	r := startConnector(t, baseConfig(testenv.Unique("part-"), url, auditSchemaFor(t, db), s+".low"), connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()

	mustExec(t, db, `INSERT INTO `+p+` VALUES (1, 'through the parent'), (101, 'elsewhere')`)
	mustExec(t, db, `INSERT INTO `+qualified(s, "low")+` VALUES (2, 'direct')`)
	mustExec(t, db, `UPDATE `+p+` SET v = 'x'`)
	mustExec(t, db, `TRUNCATE `+p) // truncates low too
	got := r.collect(5, true)
	r.quiet()
	checkChanges(t, got, "tc."+s+".low", s, "low", []wantChange{
		{"c", `{"id":1}`, "null", `{"id":1,"v":"through the parent"}`},
		{"c", `{"id":2}`, "null", `{"id":2,"v":"direct"}`},
		{"u", `{"id":1}`, `{"id":1,"v":"through the parent"}`, `{"id":1,"v":"x"}`},
		{"u", `{"id":2}`, `{"id":2,"v":"direct"}`, `{"id":2,"v":"x"}`},
		{"t", "null", "null", "null"},
	})
}

// TestPartitionedTableReconfigured: triggers follow what a table is and
// what it is called. A renamed partitioned table's row trigger, which
// passes the old name, is re-created with the new one once the
// configuration follows. A captured plain table attached as a partition of
// a captured partitioned table is refused (its changes would come twice);
// captured on its own, its statement-level triggers give way to row-level
// capture, which sees rows routed through the partitioned table.
func TestPartitionedTableReconfigured(t *testing.T) {
	db, url := admin(t)
	ctx := testCtx(t)
	s := newSchema(t, db)
	p := qualified(s, "p")
	mustExec(t, db, `CREATE TABLE `+p+` (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "part")+` PARTITION OF `+p+` FOR VALUES FROM (0) TO (100)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "plain")+` (id int PRIMARY KEY, v text)`)
	name := testenv.Unique("reparted-")
	l := connect.NewMemoryLedger()
	audit := auditSchemaFor(t, db)
	r := startConnector(t, baseConfig(name, url, audit, s+".p", s+".plain"), l)
	if err := r.stop(false); err != nil {
		t.Fatal(err)
	}

	// Changes from before and after the rename, waiting when the
	// configuration follows it, come out under the new name.
	mustExec(t, db, `INSERT INTO `+qualified(s, "part")+` VALUES (10, 'before the rename')`)
	mustExec(t, db, `ALTER TABLE `+p+` RENAME TO q`)
	mustExec(t, db, `INSERT INTO `+qualified(s, "part")+` VALUES (11, 'after the rename')`)
	q := qualified(s, "q")
	r = startConnector(t, baseConfig(name, url, audit, s+".q", s+".plain"), l)
	wantTriggers := []string{
		"part !<base>_row true",
		"plain <base>_del false", "plain <base>_ins false", "plain <base>_trunc false", "plain <base>_upd false",
		"q !<base>_row false", "q <base>_trunc false",
	}
	if tr := captureTriggersIn(t, ctx, db, r.name, s); !reflect.DeepEqual(tr, wantTriggers) {
		t.Errorf("triggers %v, want %v", tr, wantTriggers)
	}
	mustExec(t, db, `INSERT INTO `+qualified(s, "part")+` VALUES (1, 'renamed')`)
	checkChanges(t, r.collect(3, true), "tc."+s+".q", s, "q", []wantChange{
		{"c", `{"id":10}`, "null", `{"id":10,"v":"before the rename"}`},
		{"c", `{"id":11}`, "null", `{"id":11,"v":"after the rename"}`},
		{"c", `{"id":1}`, "null", `{"id":1,"v":"renamed"}`},
	})
	r.quiet()
	if err := r.stop(false); err != nil {
		t.Fatal(err)
	}

	// plain becomes a partition of q: both configured is refused.
	mustExec(t, db, `ALTER TABLE `+q+` ATTACH PARTITION `+qualified(s, "plain")+` FOR VALUES FROM (100) TO (200)`)
	if _, err := tryStart(t, baseConfig(name, url, audit, s+".q", s+".plain"), l); err == nil || !strings.Contains(err.Error(), "which is also in tables") {
		t.Fatalf("Start with a table and its partition: %v", err)
	}

	// Only the partition: the row trigger replaces its statement-level
	// ones (and q's clone of the row trigger goes with q's trigger). One of
	// them disabled does not matter: it goes.
	mustExec(t, db, `ALTER TABLE `+qualified(s, "plain")+` DISABLE TRIGGER `+pgx.Identifier{objectNames(name).trigger("INSERT")}.Sanitize())
	r = startConnector(t, baseConfig(name, url, audit, s+".plain"), l)
	defer func() {
		if err := r.stop(true); err != nil {
			t.Error(err)
		}
		if tr := captureTriggersIn(t, ctx, db, name, s); len(tr) != 0 {
			t.Errorf("after deletion, triggers remain: %v", tr)
		}
	}()
	wantTriggers = []string{"plain !<base>_row false", "plain <base>_trunc false"}
	if tr := captureTriggersIn(t, ctx, db, r.name, s); !reflect.DeepEqual(tr, wantTriggers) {
		t.Errorf("triggers %v, want %v", tr, wantTriggers)
	}
	mustExec(t, db, `INSERT INTO `+q+` VALUES (2, 'other partition'), (101, 'routed')`)
	checkChanges(t, r.collect(1, true), "tc."+s+".plain", s, "plain", []wantChange{
		{"c", `{"id":101}`, "null", `{"id":101,"v":"routed"}`},
	})
	r.quiet()
	rs, err := l.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var trig []string
	for _, res := range rs {
		// The captured tables' triggers (not the order trigger on the audit
		// table).
		if res.Kind == KindTrigger && strings.Contains(res.Location, `"`+s+`".`) {
			trig = append(trig, fmt.Sprintf("%s %s", res.Location, strings.Replace(res.Name, objectNames(name).base, "<base>", 1)))
		}
	}
	slices.Sort(trig)
	wantLedger := []string{testDB(t, db) + `/"` + s + `"."plain" !<base>_row`, testDB(t, db) + `/"` + s + `"."plain" <base>_trunc`}
	if !slices.Equal(trig, wantLedger) {
		t.Errorf("ledger triggers %v, want %v", trig, wantLedger)
	}
}

// TestDisabledPartitionTriggerRefused: a clone of the row trigger disabled
// on one partition would capture nothing there; Start names it.
func TestDisabledPartitionTriggerRefused(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	p := qualified(s, "p")
	mustExec(t, db, `CREATE TABLE `+p+` (id int PRIMARY KEY) PARTITION BY RANGE (id)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "p1")+` PARTITION OF `+p+` FOR VALUES FROM (0) TO (10)`)
	name := testenv.Unique("disparted-")
	l := connect.NewMemoryLedger()
	audit := auditSchemaFor(t, db)
	r := startConnector(t, baseConfig(name, url, audit, s+".p"), l)
	if err := r.stop(false); err != nil {
		t.Fatal(err)
	}
	trig := objectNames(name).rowTrigger
	mustExec(t, db, `ALTER TABLE `+qualified(s, "p1")+` DISABLE TRIGGER `+pgx.Identifier{trig}.Sanitize())
	_, err := tryStart(t, baseConfig(name, url, audit, s+".p"), l)
	want := "ALTER TABLE " + qualified(s, "p1") + " ENABLE TRIGGER " + pgx.Identifier{trig}.Sanitize()
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Start with a disabled clone: %v; want an error naming %q", err, want)
	}
	mustExec(t, db, `ALTER TABLE `+qualified(s, "p1")+` ENABLE TRIGGER `+pgx.Identifier{trig}.Sanitize())
	r = startConnector(t, baseConfig(name, url, audit, s+".p"), l)
	if err := r.stop(true); err != nil {
		t.Fatal(err)
	}
}

// TestUpgradeFromEarlierLayout: objects made by an earlier version — an
// audit table without image_schema and image_table, capture triggers that
// pass no arguments — are brought up to date at Start, and the changes
// waiting in the audit table are delivered.
func TestUpgradeFromEarlierLayout(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	plain := qualified(s, "plain")
	mustExec(t, db, `CREATE TABLE `+plain+` (id int PRIMARY KEY)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "p")+` (id int PRIMARY KEY) PARTITION BY RANGE (id)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "p1")+` PARTITION OF `+qualified(s, "p")+` FOR VALUES FROM (0) TO (10)`)
	name := testenv.Unique("upgrade-")
	l := connect.NewMemoryLedger()
	audit := auditSchemaFor(t, db)
	r := startConnector(t, baseConfig(name, url, audit, s+".plain"), l)
	if err := r.stop(false); err != nil {
		t.Fatal(err)
	}
	n := objectNames(name)
	// Triggers as an earlier version made them: no arguments.
	fn := qualified(audit, n.function) + `()`
	for _, e := range triggerEvents {
		trig := pgx.Identifier{n.trigger(e)}.Sanitize()
		mustExec(t, db, `DROP TRIGGER `+trig+` ON `+plain)
		ref := map[string]string{"INSERT": `REFERENCING NEW TABLE AS tidyconnect_new`, "UPDATE": `REFERENCING OLD TABLE AS tidyconnect_old NEW TABLE AS tidyconnect_new`, "DELETE": `REFERENCING OLD TABLE AS tidyconnect_old`}[e]
		mustExec(t, db, `CREATE TRIGGER `+trig+` AFTER `+e+` ON `+plain+` `+ref+` FOR EACH STATEMENT EXECUTE FUNCTION `+fn)
	}
	mustExec(t, db, `INSERT INTO `+plain+` VALUES (1)`)
	// An audit table as an earlier version made it.
	at := qualified(audit, n.table)
	mustExec(t, db, `ALTER TABLE `+at+` DROP COLUMN image_schema, DROP COLUMN image_table, DROP COLUMN image_relid`)

	r = startConnector(t, baseConfig(name, url, audit, s+".plain", s+".p"), l)
	defer func() { _ = r.stop(true) }()
	var stale int
	if err := db.QueryRow(testCtx(t), `SELECT count(*) FROM pg_trigger WHERE tgrelid = $1::regclass AND tgnargs <> 2`, plain).Scan(&stale); err != nil {
		t.Fatal(err)
	}
	if stale != 0 {
		t.Errorf("%d capture triggers still pass no arguments", stale)
	}
	mustExec(t, db, `INSERT INTO `+qualified(s, "p")+` VALUES (2)`)
	mustExec(t, db, `INSERT INTO `+plain+` VALUES (3)`)
	got := r.collect(3, true)
	r.quiet()
	checkChanges(t, got[:1], "tc."+s+".plain", s, "plain", []wantChange{{"c", `{"id":1}`, "null", `{"id":1}`}})
	checkChanges(t, got[1:2], "tc."+s+".p", s, "p", []wantChange{{"c", `{"id":2}`, "null", `{"id":2}`}})
	checkChanges(t, got[2:], "tc."+s+".plain", s, "plain", []wantChange{{"c", `{"id":3}`, "null", `{"id":3}`}})
}

// TestCaptureFunctionsOnlyForTriggers: writers need no privilege on the
// audit objects (their triggers fire regardless); a role that owns a
// captured partitioned table adds and attaches partitions (PostgreSQL
// copies the row trigger, which needs EXECUTE on its function); and a role
// that may create tables and triggers of its own cannot hang the capture
// functions on its tables to feed the connector changes under a captured
// table's name.
func TestCaptureFunctionsOnlyForTriggers(t *testing.T) {
	db, url := admin(t)
	ctx := testCtx(t)
	s := newSchema(t, db)
	role, rid := newRole(t, db, "pga_writer_")
	mustExec(t, db, `CREATE TABLE `+qualified(s, "plain")+` (id int PRIMARY KEY)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "p")+` (id int PRIMARY KEY) PARTITION BY RANGE (id)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "p1")+` PARTITION OF `+qualified(s, "p")+` FOR VALUES FROM (0) TO (10)`)
	mustExec(t, db, `ALTER TABLE `+qualified(s, "p")+` OWNER TO `+rid)
	mustExec(t, db, `ALTER TABLE `+qualified(s, "p1")+` OWNER TO `+rid)
	mustExec(t, db, `GRANT USAGE, CREATE ON SCHEMA `+pgx.Identifier{s}.Sanitize()+` TO `+rid)
	mustExec(t, db, `GRANT INSERT ON `+qualified(s, "plain")+` TO `+rid)
	audit := auditSchemaFor(t, db)
	r := startConnector(t, baseConfig(testenv.Unique("nofeed-"), url, audit, s+".plain", s+".p"), connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()

	roleURL := urlAs(t, url, role)
	w, err := pgx.Connect(ctx, roleURL)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(context.Background())
	exec := func(sql string) {
		t.Helper()
		if _, err := w.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	// Partition upkeep by the table's owner.
	exec(`CREATE TABLE ` + qualified(s, "p2") + ` PARTITION OF ` + qualified(s, "p") + ` FOR VALUES FROM (10) TO (20)`)
	exec(`CREATE TABLE ` + qualified(s, "p3") + ` (id int PRIMARY KEY)`)
	exec(`ALTER TABLE ` + qualified(s, "p") + ` ATTACH PARTITION ` + qualified(s, "p3") + ` FOR VALUES FROM (20) TO (30)`)

	// Another role, which owns nothing captured, may create tables and
	// even use the audit schema: it still cannot attach either capture
	// function to a table of its own.
	other, oid := newRole(t, db, "pga_other_")
	mustExec(t, db, `GRANT USAGE, CREATE ON SCHEMA `+pgx.Identifier{s}.Sanitize()+` TO `+oid)
	o, err := pgx.Connect(ctx, strings.Replace(url, "postgres@", other+"@", 1))
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close(context.Background())
	if _, err := o.Exec(ctx, `CREATE TABLE `+qualified(s, "mine")+` (id int PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	n := objectNames(r.name)
	feed := func(fn string) error {
		_, err := o.Exec(ctx, `CREATE TRIGGER feed AFTER INSERT ON `+qualified(s, "mine")+` FOR EACH ROW EXECUTE FUNCTION `+fn)
		return err
	}
	statementFn := qualified(audit, n.function) + `()`
	rowFn := qualified(audit, n.rowFunction) + `(` + quoteLiteral(s) + `, 'plain')`
	for _, fn := range []string{statementFn, rowFn} {
		if err := feed(fn); err == nil || !strings.Contains(err.Error(), "permission denied for schema") {
			t.Errorf("a role without USAGE on the audit schema hung %s on a table of its own: %v", fn, err)
		}
	}
	mustExec(t, db, `GRANT USAGE ON SCHEMA `+pgx.Identifier{audit}.Sanitize()+` TO `+oid)
	for _, fn := range []string{statementFn, rowFn} {
		if err := feed(fn); err == nil || !strings.Contains(err.Error(), "permission denied for function") {
			t.Errorf("a role with USAGE on the audit schema hung %s on a table of its own: %v", fn, err)
		}
	}
	mustExec(t, db, `REVOKE USAGE ON SCHEMA `+pgx.Identifier{audit}.Sanitize()+` FROM `+oid)

	exec(`INSERT INTO ` + qualified(s, "plain") + ` VALUES (1)`)
	exec(`INSERT INTO ` + qualified(s, "p") + ` VALUES (2), (12), (22)`)
	got := r.collect(4, true)
	r.quiet()
	checkChanges(t, got[:1], "tc."+s+".plain", s, "plain", []wantChange{{"c", `{"id":1}`, "null", `{"id":1}`}})
	checkChanges(t, got[1:], "tc."+s+".p", s, "p", []wantChange{
		{"c", `{"id":2}`, "null", `{"id":2}`},
		{"c", `{"id":12}`, "null", `{"id":12}`},
		{"c", `{"id":22}`, "null", `{"id":22}`},
	})
}

// TestDroppedPartitionChangesDelivered: changes of a partition dropped
// before they were delivered come out, read with the partitioned table's
// columns, also when the task had read that partition's row type before.
func TestDroppedPartitionChangesDelivered(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	p := qualified(s, "p")
	mustExec(t, db, `CREATE TABLE `+p+` (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "old")+` PARTITION OF `+p+` FOR VALUES FROM (0) TO (10)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "new")+` PARTITION OF `+p+` FOR VALUES FROM (10) TO (20)`)
	r := startConnector(t, baseConfig(testenv.Unique("dropped-"), url, auditSchemaFor(t, db), s+".p"), connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()

	mustExec(t, db, `INSERT INTO `+p+` VALUES (1, 'a')`)
	r.collect(1, true) // the task now knows old's row type
	mustExec(t, db, `DELETE FROM `+p+` WHERE id = 1`)
	mustExec(t, db, `INSERT INTO `+p+` VALUES (2, 'b'), (11, 'c')`)
	mustExec(t, db, `DROP TABLE `+qualified(s, "old"))
	got := r.collect(3, true)
	r.quiet()
	checkChanges(t, got, "tc."+s+".p", s, "p", []wantChange{
		{"d", `{"id":1}`, `{"id":1,"v":"a"}`, "null"},
		{"c", `{"id":2}`, "null", `{"id":2,"v":"b"}`},
		{"c", `{"id":11}`, "null", `{"id":11,"v":"c"}`},
	})
}

// plantLookAlikes makes a schema of look-alikes of what the capture and
// order functions use: operators on text, bigint and integer, functions,
// unnest and domains named like pg_catalog's types, each raising
// "hijacked" when it runs. A session whose search_path puts the returned
// (quoted) schema first runs them wherever a name is not qualified.
func plantLookAlikes(t *testing.T, db *pgxpool.Pool) string {
	t.Helper()
	evil := newSchema(t, db)
	e := pgx.Identifier{evil}.Sanitize()
	const raise = `LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'hijacked by a look-alike in the search_path'; END$$`
	mustExec(t, db, `CREATE FUNCTION `+e+`.boom(a text, b text) RETURNS bool `+raise)
	mustExec(t, db, `CREATE FUNCTION `+e+`.boom2(a bigint, b integer) RETURNS bool `+raise)
	mustExec(t, db, `CREATE FUNCTION `+e+`.boom3(a bigint, b bigint) RETURNS bool `+raise)
	mustExec(t, db, `CREATE FUNCTION `+e+`.boom5(a integer, b integer) RETURNS bool `+raise)
	mustExec(t, db, `CREATE FUNCTION `+e+`.boom4(v anyelement) RETURNS bool `+raise)
	mustExec(t, db, `CREATE FUNCTION `+e+`.unnest(v anyarray) RETURNS SETOF anyelement `+raise)
	for _, op := range []string{"=", "<>", ">", "<", "<=", "-", "/", "+"} {
		mustExec(t, db, `CREATE OPERATOR `+e+`.`+op+` (LEFTARG = text, RIGHTARG = text, FUNCTION = `+e+`.boom)`)
		mustExec(t, db, `CREATE OPERATOR `+e+`.`+op+` (LEFTARG = bigint, RIGHTARG = integer, FUNCTION = `+e+`.boom2)`)
		mustExec(t, db, `CREATE OPERATOR `+e+`.`+op+` (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = `+e+`.boom3)`)
		mustExec(t, db, `CREATE OPERATOR `+e+`.`+op+` (LEFTARG = integer, RIGHTARG = integer, FUNCTION = `+e+`.boom5)`)
	}
	for _, typ := range []string{"text", "oid", "xid8", "int8"} {
		mustExec(t, db, `CREATE DOMAIN `+e+`.`+typ+` AS pg_catalog.`+typ+` CHECK (`+e+`.boom4(VALUE))`)
	}
	return e
}

// TestCaptureIgnoresSearchPath: the capture functions are SECURITY DEFINER
// without a fixed search_path (the SET clause costs every captured
// statement, and every row under row-level capture), so they must name
// nothing through the writer's search_path. A writer whose search_path puts
// look-alike operators, functions and types first still gets every change
// captured, single-row and grouped (more than singleChanges rows, cut by
// bytes, an UPDATE's rows paired) alike, and none of the look-alikes runs.
func TestCaptureIgnoresSearchPath(t *testing.T) {
	db, url := admin(t)
	e := plantLookAlikes(t, db)
	// Bounds small enough that the grouped statements are cut by bytes,
	// and the bulk UPDATE is grouped by pairing its rows.
	override(t, &groupBytes, 100)
	override(t, &sideBytes, 200)

	for _, tc := range []struct {
		name        string
		level       string
		partitioned bool
	}{
		{"statement level", levelStatement, false},
		{"row level", levelRow, false},
		{"partitioned table", levelStatement, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			s := newSchema(t, db)
			table, written := qualified(s, "p"), qualified(s, "p")
			if tc.partitioned {
				mustExec(t, db, `CREATE TABLE `+table+` (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)`)
				mustExec(t, db, `CREATE TABLE `+qualified(s, "p1")+` PARTITION OF `+table+` FOR VALUES FROM (0) TO (1000)`)
				written = qualified(s, "p1") // a write that names the partition
			} else {
				mustExec(t, db, `CREATE TABLE `+table+` (id int PRIMARY KEY, v text)`)
			}
			cfg := baseConfig(testenv.Unique("searchpath-"), url, auditSchemaFor(t, db), s+".p")
			cfg[KeyCaptureLevel] = tc.level
			r := startConnector(t, cfg, connect.NewMemoryLedger())
			defer func() { _ = r.stop(true) }()

			// A session of its own: PL/pgSQL compiles a function once per
			// session, under the search_path of its first call.
			conn, err := pgx.Connect(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = conn.Close(context.Background()) }()
			if _, err := conn.Exec(ctx, `SET search_path = `+e+`, pg_catalog, public`); err != nil {
				t.Fatal(err)
			}
			// The look-alikes work: an unqualified = in this session is theirs.
			if _, err := conn.Exec(ctx, `SELECT 'a'::pg_catalog.text = 'b'::pg_catalog.text`); err == nil || !strings.Contains(err.Error(), "hijacked") {
				t.Fatalf("the look-alike = is not in effect: %v", err)
			}
			const bulk = singleChanges + 6 // past the single rows into a group
			for _, sql := range []string{
				`INSERT INTO ` + table + ` VALUES (1, 'a')`,
				fmt.Sprintf(`INSERT INTO %s SELECT g, 'a' FROM pg_catalog.generate_series(100, %d) g`, table, 99+bulk),
				`UPDATE ` + table + ` SET v = 'b' WHERE id OPERATOR(pg_catalog.=) 1`,
				`UPDATE ` + table + ` SET v = 'b' WHERE id OPERATOR(pg_catalog.>=) 100`,
				`DELETE FROM ` + written + ` WHERE id OPERATOR(pg_catalog.=) 1`,
				`DELETE FROM ` + written,
				`INSERT INTO ` + table + ` VALUES (2, 'c')`,
				`TRUNCATE ` + table,
			} {
				if _, err := conn.Exec(ctx, sql); err != nil {
					t.Fatalf("%s with a hostile search_path: %v", sql, err)
				}
			}

			got := r.collect(3*bulk+5, true)
			want := []wantChange{{"c", `{"id":1}`, "null", `{"id":1,"v":"a"}`}}
			for id := 100; id < 100+bulk; id++ {
				want = append(want, wantChange{"c", fmt.Sprintf(`{"id":%d}`, id), "null", fmt.Sprintf(`{"id":%d,"v":"a"}`, id)})
			}
			want = append(want, wantChange{"u", `{"id":1}`, `{"id":1,"v":"a"}`, `{"id":1,"v":"b"}`})
			for id := 100; id < 100+bulk; id++ {
				want = append(want, wantChange{"u", fmt.Sprintf(`{"id":%d}`, id), fmt.Sprintf(`{"id":%d,"v":"a"}`, id), fmt.Sprintf(`{"id":%d,"v":"b"}`, id)})
			}
			want = append(want, wantChange{"d", `{"id":1}`, `{"id":1,"v":"b"}`, "null"})
			for id := 100; id < 100+bulk; id++ {
				want = append(want, wantChange{"d", fmt.Sprintf(`{"id":%d}`, id), fmt.Sprintf(`{"id":%d,"v":"b"}`, id), "null"})
			}
			want = append(want, wantChange{"c", `{"id":2}`, "null", `{"id":2,"v":"c"}`}, wantChange{"t", "null", "null", "null"})
			checkChanges(t, got, "tc."+s+".p", s, "p", want)
		})
	}
}

// TestRenamedWhileSwitchingCaptureLevel: a table captured row by row,
// renamed, then configured under its new name with capture.level back at
// statement: the changes waiting under the old name (from before and after
// the rename) come out under the new one, and the row trigger that filed
// them is gone before they move.
func TestRenamedWhileSwitchingCaptureLevel(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "a")+` (id int PRIMARY KEY)`)
	name := testenv.Unique("relevel-")
	l := connect.NewMemoryLedger()
	audit := auditSchemaFor(t, db)
	cfg := baseConfig(name, url, audit, s+".a")
	cfg[KeyCaptureLevel] = levelRow
	if err := startConnector(t, cfg, l).stop(false); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `INSERT INTO `+qualified(s, "a")+` VALUES (1)`)
	mustExec(t, db, `ALTER TABLE `+qualified(s, "a")+` RENAME TO b`)
	mustExec(t, db, `INSERT INTO `+qualified(s, "b")+` VALUES (2)`)

	cfg = baseConfig(name, url, audit, s+".b")
	r := startConnector(t, cfg, l)
	defer func() { _ = r.stop(true) }()
	want := []string{"b <base>_del false", "b <base>_ins false", "b <base>_trunc false", "b <base>_upd false"}
	if tr := captureTriggersIn(t, testCtx(t), db, name, s); !reflect.DeepEqual(tr, want) {
		t.Errorf("triggers %v, want %v", tr, want)
	}
	mustExec(t, db, `INSERT INTO `+qualified(s, "b")+` VALUES (3)`)
	checkChanges(t, r.collect(3, true), "tc."+s+".b", s, "b", []wantChange{
		{"c", `{"id":1}`, "null", `{"id":1}`},
		{"c", `{"id":2}`, "null", `{"id":2}`},
		{"c", `{"id":3}`, "null", `{"id":3}`},
	})
	r.quiet()
}

// TestFunctionsExecutableOnlyAsIntended: EXECUTE granted by default
// privileges of the audit schema is taken back from the connector's
// functions as they are made, and a grant made by hand later goes at the
// next Start; the owner of a captured partitioned table keeps EXECUTE on
// the row-level function.
func TestFunctionsExecutableOnlyAsIntended(t *testing.T) {
	db, url := admin(t)
	ctx := testCtx(t)
	s := newSchema(t, db)
	audit := newSchema(t, db) // exists already, with default privileges
	otherRole, other := newRole(t, db, "pga_dflt_")
	ownerRole, owner := newRole(t, db, "pga_owns_")
	roles := []string{otherRole, ownerRole}
	mustExec(t, db, `ALTER DEFAULT PRIVILEGES IN SCHEMA `+pgx.Identifier{audit}.Sanitize()+` GRANT EXECUTE ON FUNCTIONS TO `+other)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "p")+` (id int PRIMARY KEY) PARTITION BY RANGE (id)`)
	mustExec(t, db, `ALTER TABLE `+qualified(s, "p")+` OWNER TO `+owner)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "plain")+` (id int PRIMARY KEY)`)
	name := testenv.Unique("acl-")
	cfg := baseConfig(name, url, audit, s+".p", s+".plain")
	cfg[KeyCaptureOrder] = orderCommit
	l := connect.NewMemoryLedger()
	n := objectNames(name)
	fns := []string{qualified(audit, n.function) + "()", qualified(audit, n.rowFunction) + "()", qualified(audit, n.order) + "()"}
	check := func(when string) {
		t.Helper()
		for i, fn := range fns {
			var otherMay, ownerMay bool
			if err := db.QueryRow(ctx, `SELECT has_function_privilege($1, $3::regprocedure, 'EXECUTE'), has_function_privilege($2, $3::regprocedure, 'EXECUTE')`, roles[0], roles[1], fn).Scan(&otherMay, &ownerMay); err != nil {
				t.Fatal(err)
			}
			if otherMay {
				t.Errorf("%s: %s may execute %s", when, roles[0], fn)
			}
			if wantOwner := i == 1; ownerMay != wantOwner {
				t.Errorf("%s: the partitioned table's owner may execute %s: %v, want %v", when, fn, ownerMay, wantOwner)
			}
		}
	}
	if err := startConnector(t, cfg, l).stop(false); err != nil {
		t.Fatal(err)
	}
	check("after the first Start")
	for _, fn := range fns {
		mustExec(t, db, `GRANT EXECUTE ON FUNCTION `+fn+` TO `+other+` WITH GRANT OPTION`)
	}
	if err := startConnector(t, cfg, l).stop(false); err != nil {
		t.Fatal(err)
	}
	check("after grants by hand and a later Start")

	// Grant chains. The owner's EXECUTE coming only through a role that
	// should not have it survives that role's revocation; a grant option
	// of the owner's is taken back with what it granted.
	rowFn := fns[1]
	middleRole, middle := newRole(t, db, "pga_mid_")
	as := func(role, sql string) {
		t.Helper()
		c, err := pgx.Connect(ctx, strings.Replace(url, "postgres@", role+"@", 1))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(ctx, sql); err != nil {
			t.Fatalf("as %s: %s: %v", role, sql, err)
		}
	}
	mustExec(t, db, `REVOKE EXECUTE ON FUNCTION `+rowFn+` FROM `+owner)
	mustExec(t, db, `GRANT USAGE ON SCHEMA `+pgx.Identifier{audit}.Sanitize()+` TO `+middle+`, `+owner)
	mustExec(t, db, `GRANT EXECUTE ON FUNCTION `+rowFn+` TO `+middle+` WITH GRANT OPTION`)
	as(middleRole, `GRANT EXECUTE ON FUNCTION `+rowFn+` TO `+owner)
	if err := startConnector(t, cfg, l).stop(false); err != nil {
		t.Fatal(err)
	}
	check("after a grant through another role")
	var middleMay bool
	if err := db.QueryRow(ctx, `SELECT has_function_privilege($1, $2::regprocedure, 'EXECUTE')`, middleRole, rowFn).Scan(&middleMay); err != nil || middleMay {
		t.Errorf("%s keeps EXECUTE on %s (%v)", middleRole, rowFn, err)
	}
	mustExec(t, db, `GRANT EXECUTE ON FUNCTION `+rowFn+` TO `+owner+` WITH GRANT OPTION`)
	as(ownerRole, `GRANT EXECUTE ON FUNCTION `+rowFn+` TO `+other)
	r := startConnector(t, cfg, l)
	check("after the owner passed EXECUTE on")
	var grantOption bool
	if err := db.QueryRow(ctx, `SELECT has_function_privilege($1, $2::regprocedure, 'EXECUTE WITH GRANT OPTION')`, ownerRole, rowFn).Scan(&grantOption); err != nil || grantOption {
		t.Errorf("the owner keeps the grant option (%v)", err)
	}
	if err := r.stop(true); err != nil {
		t.Fatal(err)
	}
}
