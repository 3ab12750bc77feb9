package pgaudit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestDeleteDropsExactlyOwned: deletion drops the connector's objects and
// nothing else: a user's table in the audit schema (and so the schema), a
// second connector's capture of the same table, the captured table and its
// rows all survive.
func TestDeleteDropsExactlyOwned(t *testing.T) {
	db, url := admin(t)
	ctx := testCtx(t)
	s := newSchema(t, db)
	tbl := qualified(s, "shared")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY, v text)`)
	audit := auditSchemaFor(t, db)

	la, lb := connect.NewMemoryLedger(), connect.NewMemoryLedger()
	a := startConnector(t, baseConfig(testenv.Unique("first-"), url, audit, s+".shared"), la)
	b := startConnector(t, baseConfig(testenv.Unique("second-"), url, audit, s+".shared"), lb)
	defer func() { _ = b.stop(true) }()
	// A person's table in the audit schema, created after the connector
	// created (and owns) the schema.
	mustExec(t, db, `CREATE TABLE `+qualified(audit, "users_own")+` (x int)`)
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (1, 'one')`)
	a.collect(1, true)
	b.collect(1, true)

	owned, _ := la.List(ctx)
	if err := a.stop(true); err != nil {
		t.Fatalf("deleting the first connector: %v", err)
	}
	for _, r := range owned {
		ok, err := resourceExists(ctx, db, r)
		if err != nil {
			t.Fatal(err)
		}
		if ok && r.Kind != KindSchema {
			t.Errorf("%v survived the deletion", r)
		}
	}
	if left, _ := la.List(ctx); len(left) != 0 {
		t.Errorf("ledger still lists %v", left)
	}
	if !relExists(t, db, audit, "users_own") {
		t.Error("the user's table in the audit schema was dropped")
	}
	if !relExists(t, db, audit, objectNames(b.name).table) {
		t.Error("the second connector's audit table was dropped")
	}
	if n := triggerCount(t, db, s, "shared"); n != 4 {
		t.Errorf("%d triggers left on the captured table, want the second connector's 4", n)
	}
	var rows int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM `+tbl).Scan(&rows); err != nil || rows != 1 {
		t.Errorf("captured table has %d rows (%v), want 1", rows, err)
	}
	mustExec(t, db, `UPDATE `+tbl+` SET v = 'two'`)
	got := b.collect(1, true)
	if got[0].Op != "u" || got[0].After["v"] != "two" {
		t.Errorf("second connector after the first's deletion: %+v", got[0])
	}
	if err := b.stop(true); err != nil {
		t.Fatalf("deleting the second connector: %v", err)
	}
	if n := triggerCount(t, db, s, "shared"); n != 0 {
		t.Errorf("%d triggers left after both deletions", n)
	}
	b.tasks = nil
}

// TestSharedAuditSchemaGoesWithTheLast: two connectors share an audit
// schema the first one made. Whichever is deleted first leaves it (the
// other's objects are in it); deleting the other one then drops it, the
// second connector owning it too.
func TestSharedAuditSchemaGoesWithTheLast(t *testing.T) {
	for _, firstDeleted := range []string{"creator", "sharer"} {
		t.Run(firstDeleted+" deleted first", func(t *testing.T) {
			db, url := admin(t)
			ctx := testCtx(t)
			s := newSchema(t, db)
			mustExec(t, db, `CREATE TABLE `+qualified(s, "a")+` (id int)`)
			mustExec(t, db, `CREATE TABLE `+qualified(s, "b")+` (id int)`)
			audit := auditSchemaFor(t, db)
			lc, ls := connect.NewMemoryLedger(), connect.NewMemoryLedger()
			creator := startConnector(t, baseConfig(testenv.Unique("creator-"), url, audit, s+".a"), lc)
			sharer := startConnector(t, baseConfig(testenv.Unique("sharer-"), url, audit, s+".b"), ls)
			if rs, _ := ls.List(ctx); !slices.ContainsFunc(rs, func(r connect.Resource) bool { return r.Kind == KindSchema && r.Name == audit }) {
				t.Errorf("the sharing connector's ledger does not list the schema: %v", rs)
			}
			first, last := creator, sharer
			if firstDeleted == "sharer" {
				first, last = sharer, creator
			}
			if err := first.stop(true); err != nil {
				t.Fatal(err)
			}
			var exists bool
			if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, audit).Scan(&exists); err != nil || !exists {
				t.Fatalf("the schema is gone while the other connector uses it (%v)", err)
			}
			if err := last.stop(true); err != nil {
				t.Fatal(err)
			}
			if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, audit).Scan(&exists); err != nil || exists {
				t.Errorf("the audit schema outlived both connectors (%v)", err)
			}
			for _, l := range []connect.Ledger{lc, ls} {
				if rs, _ := l.List(ctx); len(rs) != 0 {
					t.Errorf("ledger still lists %v", rs)
				}
			}
		})
	}
}

// TestCleanupOnDeleteFalse keeps everything on deletion.
func TestCleanupOnDeleteFalse(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "kept")+` (id int)`)
	audit := auditSchemaFor(t, db)
	cfg := baseConfig(testenv.Unique("keep-"), url, audit, s+".kept")
	cfg[KeyCleanupOnDelete] = "false"
	l := connect.NewMemoryLedger()
	r := startConnector(t, cfg, l)
	if err := r.stop(true); err != nil {
		t.Fatal(err)
	}
	n := objectNames(r.name)
	for _, rel := range []string{n.table, n.wakeup, n.waiters} {
		if !relExists(t, db, audit, rel) {
			t.Errorf("cleanup.on.delete=false dropped %s", rel)
		}
	}
	if triggerCount(t, db, s, "kept") != 4 {
		t.Error("cleanup.on.delete=false dropped triggers")
	}
	// Handed over to the database's users: nothing is owned any more.
	if left, err := l.List(testCtx(t)); err != nil || len(left) != 0 {
		t.Errorf("ledger after the deletion: %v (%v), want empty", left, err)
	}

	// A connector made again under the same name uses the objects again,
	// so it takes them back: its deletion with cleanup drops them all.
	again := cfg.Clone()
	again[KeyCleanupOnDelete] = "true"
	l2 := connect.NewMemoryLedger()
	if err := startConnector(t, again, l2).stop(true); err != nil {
		t.Fatal(err)
	}
	for _, rel := range []string{n.table, n.wakeup, n.waiters} {
		if relExists(t, db, audit, rel) {
			t.Errorf("%s is left after the re-created connector's deletion", rel)
		}
	}
	fns := functionsOf(t, db, cfg["name"])
	if n := triggerCount(t, db, s, "kept"); n != 0 || fns != 0 {
		t.Errorf("after the re-created connector's deletion: %d triggers, %d functions left", n, fns)
	}
	var schema bool
	if err := db.QueryRow(testCtx(t), `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, audit).Scan(&schema); err != nil || schema {
		t.Errorf("the audit schema it made is left (%v)", err)
	}
}

// TestAuditSchemaMoveRefused: a restart with another audit.schema fails
// naming the key and changes nothing (the capture triggers would go on
// filling the old audit table, which no task reads); the old value works
// again, with the change written meanwhile still delivered. The same holds
// for a connector re-created after a deletion that kept its objects.
func TestAuditSchemaMoveRefused(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "moved")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY)`)
	audit := auditSchemaFor(t, db)
	cfg := baseConfig(testenv.Unique("move-"), url, audit, s+".moved")
	refused := func(t *testing.T, l connect.Ledger) {
		t.Helper()
		other := auditSchemaFor(t, db)
		moved := cfg.Clone()
		moved[KeyAuditSchema] = other
		ownedBefore, _ := l.List(testCtx(t))
		// Validate (POST or PUT of the config) answers on the key first.
		if errs := (&Connector{}).Validate(testCtx(t), moved); !strings.Contains(strings.Join(errs[KeyAuditSchema], " "), `"`+audit+`"`) {
			t.Errorf("Validate()[%s] = %v, want the schema in use, %s", KeyAuditSchema, errs, audit)
		}
		r, err := tryStart(t, moved, l)
		if err == nil {
			defer func() { _ = r.stop(true) }()
		}
		if err == nil || !strings.Contains(err.Error(), KeyAuditSchema) || !strings.Contains(err.Error(), `"`+audit+`"`) {
			t.Fatalf("Start with another audit.schema = %v, want an error naming %s and %s", err, KeyAuditSchema, audit)
		}
		var exists bool
		if err := db.QueryRow(testCtx(t), `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, other).Scan(&exists); err != nil || exists {
			t.Errorf("the new audit schema was created (%v)", err)
		}
		if owned, _ := l.List(testCtx(t)); !slices.Equal(owned, ownedBefore) {
			t.Errorf("ledger changed by the refused start: %v, was %v", owned, ownedBefore)
		}
	}

	t.Run("restart", func(t *testing.T) {
		l := connect.NewMemoryLedger()
		r := startConnector(t, cfg, l)
		if err := r.stop(false); err != nil {
			t.Fatal(err)
		}
		mustExec(t, db, `INSERT INTO `+tbl+` VALUES (1)`)
		refused(t, l)
		r = startConnector(t, cfg, l)
		if got := r.collect(1, true); got[0].Op != "c" {
			t.Errorf("after going back: %+v", got[0])
		}
		r.quiet()
		if err := r.stop(false); err != nil {
			t.Fatal(err)
		}
		// For the next case: a deletion that leaves the objects behind.
		keep := cfg.Clone()
		keep[KeyCleanupOnDelete] = "false"
		if err := startConnector(t, keep, l).stop(true); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("re-created after a deletion that kept the objects", func(t *testing.T) {
		if triggerCount(t, db, s, "moved") != 4 {
			t.Fatal("the kept capture triggers are gone")
		}
		l := connect.NewMemoryLedger()
		refused(t, l)
		// What the error says to do: drop the kept function and with it
		// the capture triggers; then the move works.
		mustExec(t, db, `DROP FUNCTION `+qualified(audit, objectNames(cfg["name"]).function)+`() CASCADE`)
		moved := cfg.Clone()
		moved[KeyAuditSchema] = auditSchemaFor(t, db)
		moved[KeyCleanupOnDelete] = "true"
		r := startConnector(t, moved, l)
		defer func() { _ = r.stop(true) }()
		mustExec(t, db, `INSERT INTO `+tbl+` VALUES (2)`)
		if got := r.collect(1, true); got[0].Op != "c" || got[0].After["id"] != json.Number("2") {
			t.Errorf("after the move: %+v", got[0])
		}
	})
}

// TestDatabaseRenamedOrSwitched: a postgres.url pointing at another
// database than the one holding the connector's objects is refused naming
// the key, also when that database is a copy holding the same objects
// while the original still exists. After ALTER DATABASE ... RENAME the
// connector starts against the new name and its ledger names it; a
// deletion by a cleanup-only instance (which never provisions) after
// another rename drops everything too.
func TestDatabaseRenamedOrSwitched(t *testing.T) {
	db, adminURL := admin(t)
	ctx := testCtx(t)
	withDB := func(name string) string {
		u, err := url.Parse(adminURL)
		if err != nil || u.Scheme == "" {
			testenv.Skip(t, "%s is not a URL (%v): cannot point it at another database", testenv.PostgresEnv, err)
		}
		u.Path = "/" + name
		return u.String()
	}
	first, copied, renamed, again := testenv.Unique("pga_db_"), testenv.Unique("pga_db_"), testenv.Unique("pga_db_"), testenv.Unique("pga_db_")
	mustExec(t, db, `CREATE DATABASE `+pgx.Identifier{first}.Sanitize())
	t.Cleanup(func() {
		for _, d := range []string{first, copied, renamed, again} {
			_, _ = db.Exec(context.Background(), `DROP DATABASE IF EXISTS `+pgx.Identifier{d}.Sanitize()+` WITH (FORCE)`)
		}
	})
	other, err := pgxpool.New(ctx, withDB(first))
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, other, `CREATE TABLE public.t (id int PRIMARY KEY)`)
	other.Close()

	l := connect.NewMemoryLedger()
	cfg := baseConfig(testenv.Unique("rename-"), withDB(first), "tidyconnect", "public.t")
	if err := startConnector(t, cfg, l).stop(false); err != nil {
		t.Fatal(err)
	}
	refused := func(what, url string) {
		t.Helper()
		c := cfg.Clone()
		c[KeyURL] = url
		if r, err := tryStart(t, c, l); err == nil {
			_ = r.stop(true)
			t.Errorf("Start against %s succeeded", what)
		} else if !strings.Contains(err.Error(), KeyURL) || !strings.Contains(err.Error(), first) {
			t.Errorf("Start against %s = %v, want an error naming %s and %s", what, err, KeyURL, first)
		}
	}
	mustExec(t, db, `CREATE DATABASE `+pgx.Identifier{copied}.Sanitize()+` TEMPLATE `+pgx.Identifier{first}.Sanitize())
	refused("a copy while the original exists", withDB(copied))
	refused("another database", adminURL)

	mustExec(t, db, `ALTER DATABASE `+pgx.Identifier{first}.Sanitize()+` RENAME TO `+pgx.Identifier{renamed}.Sanitize())
	// As if an earlier Start had stopped halfway through recording the
	// entries under the new name.
	listed, _ := l.List(ctx)
	half := listed[0]
	half.Location = renamed + strings.TrimPrefix(half.Location, first)
	if err := l.Own(ctx, half); err != nil {
		t.Fatal(err)
	}
	cfg[KeyURL] = withDB(renamed)
	r := startConnector(t, cfg, l)
	owned, _ := l.List(ctx)
	if len(owned) == 0 {
		t.Fatal("ledger empty after the restart")
	}
	for _, res := range owned {
		if resourceDB(res) != renamed {
			t.Errorf("ledger entry %v does not name the renamed database", res)
		}
	}
	if err := r.stop(false); err != nil {
		t.Fatal(err)
	}

	// Renamed again, and only the audit table's entry recorded under the
	// new name (as if that Start had stopped after it); the deletion is
	// finished by a cleanup-only instance.
	mustExec(t, db, `ALTER DATABASE `+pgx.Identifier{renamed}.Sanitize()+` RENAME TO `+pgx.Identifier{again}.Sanitize())
	for _, res := range owned {
		if res.Kind == KindTable && res.Name == objectNames(cfg["name"]).table {
			moved := res
			moved.Location = again + strings.TrimPrefix(res.Location, renamed)
			if err := l.Own(ctx, moved); err != nil {
				t.Fatal(err)
			}
			if err := l.Release(ctx, res); err != nil {
				t.Fatal(err)
			}
		}
	}
	cfg[KeyURL] = withDB(again)
	host := testHost(cfg["name"], -1, l)
	host.CleanupOnly = true
	cctx := connect.WithHost(ctx, host)
	cleanup := &Connector{}
	if err := cleanup.Start(cctx, cfg); err != nil {
		t.Fatal(err)
	}
	cleanup.Stop(true)
	if err := cleanup.Stopped(cctx); err != nil {
		t.Fatalf("deleting after another rename: %v", err)
	}
	if left, _ := l.List(ctx); len(left) != 0 {
		t.Errorf("ledger after the deletion: %v", left)
	}
	check, err := pgxpool.New(ctx, withDB(again))
	if err != nil {
		t.Fatal(err)
	}
	defer check.Close()
	if n := triggerCount(t, check, "public", "t"); n != 0 || relExists(t, check, "tidyconnect", objectNames(cfg["name"]).table) {
		t.Errorf("objects left after deleting: %d triggers, audit table exists %v", n, relExists(t, check, "tidyconnect", objectNames(cfg["name"]).table))
	}
}

// TestCapturedTableRenamed: after ALTER TABLE ... RENAME of a captured
// table, a reconfiguration without it drops the capture triggers on the
// renamed table (they would keep filling the audit table), and a deletion
// drops them too instead of failing for good on the function they call.
func TestCapturedTableRenamed(t *testing.T) {
	db, url := admin(t)
	ctx := testCtx(t)
	s := newSchema(t, db)
	for _, n := range []string{"a", "b", "c"} {
		mustExec(t, db, `CREATE TABLE `+qualified(s, n)+` (id int PRIMARY KEY)`)
	}
	l := connect.NewMemoryLedger()
	cfg := baseConfig(testenv.Unique("renamed-"), url, auditSchemaFor(t, db), s+".a", s+".b", s+".c")
	if err := startConnector(t, cfg, l).stop(false); err != nil {
		t.Fatal(err)
	}
	// Changes from before and after the rename wait under the name the
	// triggers were made with.
	mustExec(t, db, `INSERT INTO `+qualified(s, "c")+` VALUES (1)`)
	mustExec(t, db, `INSERT INTO `+qualified(s, "b")+` VALUES (10)`)
	mustExec(t, db, `ALTER TABLE `+qualified(s, "b")+` RENAME TO b2`)
	mustExec(t, db, `ALTER TABLE `+qualified(s, "c")+` RENAME TO c2`)
	mustExec(t, db, `INSERT INTO `+qualified(s, "c2")+` VALUES (2)`)
	mustExec(t, db, `INSERT INTO `+qualified(s, "b2")+` VALUES (20)`)

	// Reconfigured without b (now b2): its triggers and changes go. c2's
	// triggers are made again with its new name, and its waiting changes
	// come out under it.
	cfg[KeyTables] = s + ".a," + s + ".c2"
	r := startConnector(t, cfg, l)
	if n := triggerCount(t, db, s, "b2"); n != 0 {
		t.Errorf("%d capture triggers left on the renamed, no longer configured table", n)
	}
	for i, c := range r.collect(2, true) {
		if c.Topic != "tc."+s+".c2" || c.Source.Table != "c2" || c.Op != "c" || c.After["id"] != json.Number(fmt.Sprint(i+1)) {
			t.Errorf("change %d of the renamed table: topic %s, table %s, %s %v", i, c.Topic, c.Source.Table, c.Op, c.After)
		}
	}
	r.quiet()
	mustExec(t, db, `INSERT INTO `+qualified(s, "b2")+` VALUES (1)`)
	var rows int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM `+auditTable(r)).Scan(&rows); err != nil || rows != 0 {
		t.Errorf("audit rows after writing the dropped table: %d (%v), want 0", rows, err)
	}
	if err := r.stop(false); err != nil {
		t.Fatal(err)
	}

	// c2 is configured under its new name: the ledger lists its triggers
	// again under it.
	listed, _ := l.List(ctx)
	for _, e := range triggerEvents {
		if res := triggerRes(testDB(t, db), tableName{s, "c2"}, objectNames(cfg["name"]).trigger(e)); !slices.ContainsFunc(listed, func(x connect.Resource) bool {
			return x.Kind == res.Kind && x.Name == res.Name && strings.HasSuffix(x.Location, res.Location[len(testDB(t, db)):])
		}) {
			t.Errorf("ledger %v does not list %v", listed, res)
		}
	}
	// Renamed once more, the ledger and the configuration both name it
	// wrongly: the next Start drops its triggers.
	mustExec(t, db, `ALTER TABLE `+qualified(s, "c2")+` RENAME TO c3`)
	cfg[KeyTables] = s + ".a"
	r = startConnector(t, cfg, l)
	if n := triggerCount(t, db, s, "c3"); n != 0 {
		t.Errorf("%d capture triggers left on c3 after the Start", n)
	}
	mustExec(t, db, `ALTER TABLE `+qualified(s, "a")+` RENAME TO a2`)
	if err := r.stop(true); err != nil {
		t.Fatalf("deleting after the captured table was renamed: %v", err)
	}
	for _, tb := range []string{"a2", "b2", "c3"} {
		if n := triggerCount(t, db, s, tb); n != 0 {
			t.Errorf("%d capture triggers left on %s after the deletion", n, tb)
		}
	}
	if left, _ := l.List(ctx); len(left) != 0 {
		t.Errorf("ledger after the deletion: %v", left)
	}
}

// TestDisabledCaptureTriggerRefused: a restart finds a capture trigger
// disabled (a forgotten ALTER TABLE ... DISABLE TRIGGER): Start fails naming
// tables and the statement that enables it, and changes nothing; once it
// is enabled, the restart works.
func TestDisabledCaptureTriggerRefused(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "bulk")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY)`)
	l := connect.NewMemoryLedger()
	cfg := baseConfig(testenv.Unique("disabled-"), url, auditSchemaFor(t, db), s+".bulk")
	if err := startConnector(t, cfg, l).stop(false); err != nil {
		t.Fatal(err)
	}
	trig := pgx.Identifier{objectNames(cfg["name"]).trigger("INSERT")}.Sanitize()
	mustExec(t, db, `ALTER TABLE `+tbl+` DISABLE TRIGGER `+trig)
	before, _ := l.List(testCtx(t))
	r, err := tryStart(t, cfg, l)
	if err == nil {
		defer func() { _ = r.stop(true) }()
	}
	want := "ALTER TABLE " + tbl + " ENABLE TRIGGER " + trig
	if err == nil || !strings.Contains(err.Error(), KeyTables) || !strings.Contains(err.Error(), want) {
		t.Fatalf("Start with a disabled capture trigger = %v, want an error naming %s and %q", err, KeyTables, want)
	}
	if after, _ := l.List(testCtx(t)); !slices.Equal(after, before) {
		t.Errorf("ledger changed by the refused start: %v, was %v", after, before)
	}
	// A trigger that fires only in replica sessions captures nothing
	// either.
	mustExec(t, db, `ALTER TABLE `+tbl+` ENABLE REPLICA TRIGGER `+trig)
	if r, err := tryStart(t, cfg, l); err == nil {
		_ = r.stop(true)
		t.Fatal("Start with a replica-only capture trigger succeeded")
	} else if !strings.Contains(err.Error(), KeyTables) || !strings.Contains(err.Error(), want) {
		t.Errorf("Start with a replica-only capture trigger = %v, want an error naming %s and %q", err, KeyTables, want)
	}
	mustExec(t, db, want)
	r = startConnector(t, cfg, l)
	defer func() { _ = r.stop(true) }()
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (1)`)
	if got := r.collect(1, true); got[0].Op != "c" {
		t.Errorf("after enabling: %+v", got[0])
	}
}

// TestHostileNames: a table named like an injection is captured and the
// table it names survives; connector names equal in their first 63 bytes
// get distinct objects.
func TestHostileNames(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	hostile := `x"; DROP TABLE y; --`
	mustExec(t, db, `CREATE TABLE `+qualified(s, "y")+` (id int)`)
	// The connector's sessions resolve a bare "y" to the test schema's y, so
	// an injected DROP TABLE y would hit it.
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	url += sep + "search_path=" + s
	mustExec(t, db, `CREATE TABLE `+qualified(s, hostile)+` (id int PRIMARY KEY, "we""ird col" text)`)
	audit := auditSchemaFor(t, db)

	long := strings.Repeat("a-very-long-connector-name-", 4) // > 63 bytes
	n1, n2 := long+testenv.Unique("1-"), long+testenv.Unique("2-")
	r1 := startConnector(t, baseConfig(n1, url, audit, s+"."+hostile), connect.NewMemoryLedger())
	r2 := startConnector(t, baseConfig(n2, url, audit, `"`+s+`"."`+strings.ReplaceAll(hostile, `"`, `""`)+`"`), connect.NewMemoryLedger())
	if objectNames(n1).table == objectNames(n2).table {
		t.Fatalf("names collide: %s", objectNames(n1).table)
	}
	mustExec(t, db, `INSERT INTO `+qualified(s, hostile)+` VALUES (7, 'it''s')`)
	for _, r := range []*running{r1, r2} {
		c := r.collect(1, true)[0]
		if c.Source.Table != hostile || c.After[`we"ird col`] != "it's" || c.Topic != "tc."+s+".x___DROP_TABLE_y__--" {
			t.Errorf("%s: got %+v", r.name, c)
		}
	}
	if err := r1.stop(true); err != nil {
		t.Fatal(err)
	}
	if n := triggerCount(t, db, s, hostile); n != 4 {
		t.Errorf("deleting one long-named connector left %d triggers, want the other's 4", n)
	}
	if err := r2.stop(true); err != nil {
		t.Fatal(err)
	}
	if !relExists(t, db, s, "y") {
		t.Error("table y was dropped")
	}
	if n := triggerCount(t, db, s, hostile); n != 0 {
		t.Errorf("%d triggers left", n)
	}
}

// TestReconfigure: removing a table drops its triggers; adding one installs
// them; the audit table and function stay.
func TestReconfigure(t *testing.T) {
	db, url := admin(t)
	ctx := testCtx(t)
	s := newSchema(t, db)
	for _, n := range []string{"a", "b", "c"} {
		mustExec(t, db, `CREATE TABLE `+qualified(s, n)+` (id int)`)
	}
	audit := auditSchemaFor(t, db)
	l := connect.NewMemoryLedger()
	cfg := baseConfig(testenv.Unique("reconf-"), url, audit, s+".a", s+".b")
	r := startConnector(t, cfg, l)
	mustExec(t, db, `INSERT INTO `+qualified(s, "b")+` VALUES (10)`) // undelivered when b is removed
	if err := r.stop(false); err != nil {
		t.Fatal(err)
	}
	cfg2 := cfg.Clone()
	cfg2[KeyTables] = s + ".a," + s + ".c"
	r = startConnector(t, cfg2, l)
	defer func() { _ = r.stop(true) }()
	if got := []int{triggerCount(t, db, s, "a"), triggerCount(t, db, s, "b"), triggerCount(t, db, s, "c")}; got[0] != 4 || got[1] != 0 || got[2] != 4 {
		t.Errorf("triggers on a, b, c: %v, want [4 0 4]", got)
	}
	rs, _ := l.List(ctx)
	for _, res := range rs {
		if strings.Contains(res.Location, `"b"`) {
			t.Errorf("ledger still lists %v", res)
		}
	}
	var leftB int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM `+auditTable(r)+` WHERE table_name = 'b'`).Scan(&leftB); err != nil {
		t.Fatal(err)
	}
	if leftB != 0 {
		t.Errorf("%d undelivered changes of b left in the audit table after b was removed", leftB)
	}
	mustExec(t, db, `INSERT INTO `+qualified(s, "c")+` VALUES (3)`)
	c := r.collect(1, true)
	if c[0].Source.Table != "c" {
		t.Errorf("got a change of %s, want c (b's undelivered change is purged)", c[0].Source.Table)
	}
	r.quiet()
}

// TestReconfigureKeepsAReplacedTrigger: removing a table drops those of its
// triggers that are still the connector's; one that someone replaced under
// the same name with a trigger of their own is left alone, and the ledger
// lets go of all of them. A trigger that still calls the connector's
// function is the connector's whatever its comment says: keeping it would
// keep capturing and make the function impossible to drop at deletion.
func TestReconfigureKeepsAReplacedTrigger(t *testing.T) {
	tests := []struct {
		name     string
		replace  func(t *testing.T, db *pgxpool.Pool, s, trigger string)
		wantKept bool
	}{
		{"replaced by the DBA's own trigger", func(t *testing.T, db *pgxpool.Pool, s, trigger string) {
			mustExec(t, db, `CREATE FUNCTION `+qualified(s, "own")+`() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NULL; END$$`)
			mustExec(t, db, `DROP TRIGGER `+pgx.Identifier{trigger}.Sanitize()+` ON `+qualified(s, "b"))
			mustExec(t, db, `CREATE TRIGGER `+pgx.Identifier{trigger}.Sanitize()+` AFTER INSERT ON `+qualified(s, "b")+` FOR EACH STATEMENT EXECUTE FUNCTION `+qualified(s, "own")+`()`)
		}, true},
		{"re-commented but still calling the connector's function", func(t *testing.T, db *pgxpool.Pool, s, trigger string) {
			mustExec(t, db, `COMMENT ON TRIGGER `+pgx.Identifier{trigger}.Sanitize()+` ON `+qualified(s, "b")+` IS 'the DBA''s now'`)
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			db, url := admin(t)
			ctx := testCtx(t)
			s := newSchema(t, db)
			for _, n := range []string{"a", "b"} {
				mustExec(t, db, `CREATE TABLE `+qualified(s, n)+` (id int)`)
			}
			l := connect.NewMemoryLedger()
			cfg := baseConfig(testenv.Unique("reconf-keep-"), url, auditSchemaFor(t, db), s+".a", s+".b")
			r := startConnector(t, cfg, l)
			if err := r.stop(false); err != nil {
				t.Fatal(err)
			}
			trigger := objectNames(cfg["name"]).trigger("INSERT")
			tt.replace(t, db, s, trigger)
			cfg2 := cfg.Clone()
			cfg2[KeyTables] = s + ".a"
			r = startConnector(t, cfg2, l)
			want := 0
			if tt.wantKept {
				want = 1
			}
			if got := triggerCount(t, db, s, "b"); got != want {
				t.Errorf("%d triggers on b after the reconfiguration, want %d", got, want)
			}
			rs, _ := l.List(ctx)
			for _, res := range rs {
				if strings.Contains(res.Location, `"b"`) {
					t.Errorf("ledger still lists %v", res)
				}
			}
			if err := r.stop(true); err != nil {
				t.Fatalf("deletion after the reconfiguration: %v", err)
			}
			if got := triggerCount(t, db, s, "b"); got != want {
				t.Errorf("%d triggers on b after the deletion, want %d", got, want)
			}
		})
	}
}

// TestStoppedReleasesConnections: after Stopped, pg_stat_activity shows no
// connection of the connector, for a plain stop and a deletion.
func TestStoppedReleasesConnections(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "a")+` (id int)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "b")+` (id int)`)
	for _, deleted := range []bool{false, true} {
		cfg := baseConfig(testenv.Unique("conns-"), url, auditSchemaFor(t, db), s+".a", s+".b")
		cfg[KeyTasksMax] = "2"
		r := startConnector(t, cfg, connect.NewMemoryLedger())
		if n, _ := connections(testCtx(t), db, r.name); n < 4 {
			t.Errorf("%d connections while running, want 2 tasks x (pool + listener)", n)
		}
		if err := r.stop(deleted); err != nil {
			t.Fatal(err)
		}
		awaitNoConnections(t, db, r.name)
	}
}

func awaitNoConnections(t *testing.T, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, name string) {
	t.Helper()
	await(t, 10*time.Second, func() (bool, string, error) {
		var n int
		err := db.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE starts_with(application_name, $1)`, ApplicationNamePrefix(name)).Scan(&n)
		return n == 0, fmt.Sprintf("%d connection(s) of %s still open after Stopped", n, name), err
	})
}

// TestDatabaseGoesAway: the connector's backends are terminated mid-stream
// (as a server restart would); the task retries, reconnects and loses
// nothing.
func TestDatabaseGoesAway(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "flow")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY)`)
	cfg := baseConfig(testenv.Unique("outage-"), url, auditSchemaFor(t, db), s+".flow")
	cfg[KeyPollMaxRecords] = "25"
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()
	mustExec(t, db, `INSERT INTO `+tbl+` SELECT g FROM generate_series(1, 100) g`)
	got := r.collect(25, true)

	terminate := func() {
		var n int
		if err := db.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE starts_with(application_name, $1)`, ApplicationNamePrefix(r.name)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Fatal("no backend of the connector to terminate")
		}
	}
	terminate()
	mustExec(t, db, `INSERT INTO `+tbl+` SELECT g FROM generate_series(101, 150) g`)
	got = append(got, r.collect(50, true)...)
	terminate()
	mustExec(t, db, `INSERT INTO `+tbl+` SELECT g FROM generate_series(151, 200) g`)
	got = append(got, r.collect(125-len(got)+75, true)...)
	seen := map[int64]bool{}
	for _, c := range got {
		id, _ := c.After["id"].(json.Number).Int64()
		seen[id] = true
	}
	for id := int64(1); id <= 200; id++ {
		if !seen[id] {
			t.Errorf("id %d lost across the outage", id)
		}
	}
}

// TestDeleteWhileUnreachable: deletion with the database unreachable fails
// naming what remains and keeps the ledger; a retry (a fresh CleanupOnly
// instance, as the runtime does) with a working URL completes it.
func TestDeleteWhileUnreachable(t *testing.T) {
	db, url := admin(t)
	ctx := testCtx(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "t")+` (id int)`)
	audit := auditSchemaFor(t, db)
	l := connect.NewMemoryLedger()
	cfg := baseConfig(testenv.Unique("unreach-"), url, audit, s+".t")
	r := startConnector(t, cfg, l)
	if err := r.stop(false); err != nil {
		t.Fatal(err)
	}
	owned, _ := l.List(ctx)

	deleteWith := func(u string) error {
		c := cfg.Clone()
		c[KeyURL] = u
		inst := &Connector{}
		h := testHost(cfg["name"], -1, l)
		h.CleanupOnly = true
		hctx := connect.WithHost(ctx, h)
		startErr := inst.Start(hctx, c)
		inst.Stop(true)
		err := inst.Stopped(hctx)
		if startErr != nil && err == nil {
			t.Errorf("Start failed (%v) but Stopped succeeded", startErr)
		}
		return err
	}
	err := deleteWith("postgres://postgres:s3cret@127.0.0.1:1/test?sslmode=disable&connect_timeout=2")
	if err == nil {
		t.Fatal("deletion with the database unreachable succeeded")
	}
	for _, want := range []string{"still owned", objectNames(cfg["name"]).table, "postgres.trigger"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Errorf("error leaks the password: %v", err)
	}
	if left, _ := l.List(ctx); len(left) != len(owned) {
		t.Errorf("ledger lists %d entries after the failed deletion, want %d", len(left), len(owned))
	}
	if !relExists(t, db, audit, objectNames(cfg["name"]).table) {
		t.Fatal("audit table vanished")
	}
	if err := deleteWith(url); err != nil {
		t.Fatalf("retried deletion: %v", err)
	}
	if left, _ := l.List(ctx); len(left) != 0 {
		t.Errorf("ledger lists %v after the retried deletion", left)
	}
	if relExists(t, db, audit, objectNames(cfg["name"]).table) || triggerCount(t, db, s, "t") != 0 {
		t.Error("objects survived the retried deletion")
	}
}

// TestStopCutsShortACommitThatWaits: Kafka acknowledged a batch and the
// task's DELETE of it waits for the database (here for row locks someone
// holds on the audit rows; likewise a server that stopped answering).
// Commit's context is not cancelled by a stop (the runtime's outlasts its
// graceful timeout, which then abandons the task), so Stop must cut the
// DELETE short; the rows stay and are delivered again after a restart.
func TestStopCutsShortACommitThatWaits(t *testing.T) {
	override(t, &commitAfterStop, 300*time.Millisecond)
	db, table, r := oneTable(t, "commitstop-", `(id int PRIMARY KEY)`)
	mustExec(t, db, `INSERT INTO `+table+` SELECT g FROM generate_series(1, 5) g`)
	task := r.tasks[0]
	var recs []connect.SourceRecord
	pollUntil := time.Now().Add(30 * time.Second)
	for len(recs) < 5 {
		if time.Now().After(pollUntil) {
			t.Fatalf("polled %d of 5 changes within 30 s", len(recs))
		}
		// A Poll whose own short deadline ends (a loaded machine) is
		// retried; only another error fails the test.
		ctx, cancel := context.WithTimeout(testCtx(t), 2*time.Second)
		batch, err := task.Poll(ctx)
		ended := ctx.Err() != nil
		cancel()
		if err != nil && !ended {
			t.Fatal(err)
		}
		recs = append(recs, batch...)
	}
	locker := begin(t, db)
	txExec(t, locker, `SELECT id FROM `+auditTable(r)+` FOR UPDATE`)
	done := make(chan error, 1)
	go func() { done <- task.Commit(context.Background(), recs) }()
	await(t, 10*time.Second, func() (bool, string, error) {
		var n int
		err := db.QueryRow(testCtx(t), `SELECT count(*) FROM pg_stat_activity WHERE starts_with(application_name, $1) AND wait_event_type = 'Lock'`, ApplicationNamePrefix(r.name)).Scan(&n)
		return n > 0, "the task's DELETE never waited for the row locks", err
	})
	task.Stop(false)
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Commit cut short by Stop: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Commit still waits for the database 5 s after Stop")
	}
	if err := task.Stopped(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if err := locker.Rollback(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	// Not deleted: the next instance delivers them again (at-least-once).
	r2 := startConnector(t, r.cfg, r.ledger)
	t.Cleanup(func() { _ = r2.stop(false) })
	if again := r2.collect(5, true); len(again) != 5 {
		t.Fatalf("%d changes delivered again, want 5", len(again))
	}
	r2.quiet()
}

// TestStopAloneInterruptsPoll: Stop interrupts a Poll blocked in its LISTEN
// wait even when the runtime did not cancel the Poll's context.
func TestStopAloneInterruptsPoll(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "idle")+` (id int)`)
	cfg := baseConfig(testenv.Unique("stop-"), url, auditSchemaFor(t, db), s+".idle")
	cfg[KeyPollIntervalMS] = "600000"
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()
	done := make(chan error, 1)
	// The first wait without a notification lasts the whole 10-minute
	// interval: only Stop can end it.
	r.tasks[0].idleStep = 10 * time.Minute
	go func() {
		_, err := r.tasks[0].Poll(context.Background()) // never cancelled by the caller
		done <- err
	}()
	awaitWaiting(t, db, cfg[KeyAuditSchema], objectNames(r.name), true)
	time.Sleep(50 * time.Millisecond) // let the Poll enter its LISTEN wait; Stop must work either way
	r.tasks[0].Stop(false)
	select {
	case err := <-done:
		if err == nil {
			t.Error("Poll returned no error after Stop; want the cancellation")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Poll still blocked in its LISTEN wait 5s after Stop")
	}
}

// TestStopDuringStart: the runtime may call Stop while Start runs, or
// (from another goroutine) before Start got far. Start must return
// promptly, and Stopped must release every connection it opened.
func TestStopDuringStart(t *testing.T) {
	db, r, tcs := connectorWithoutTasks(t, "stopstart-")
	awaitNoConnections(t, db, r.name)
	// Delays spread where Stop lands: before Start, during the connect,
	// the catalog reads, the LISTEN, or after Start returned.
	for _, tc := range []struct {
		name        string
		stopFirst   bool
		delay       time.Duration
		wantStopped bool // Start must fail: Stop came before it
	}{
		{name: "stop before start", stopFirst: true, wantStopped: true},
		{name: "concurrent, no delay"},
		{name: "concurrent, 1ms", delay: time.Millisecond},
		{name: "concurrent, 3ms", delay: 3 * time.Millisecond},
		{name: "concurrent, 10ms", delay: 10 * time.Millisecond},
		{name: "concurrent, 30ms", delay: 30 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			task := &Task{}
			ctx := connect.WithHost(testCtx(t), testHost(r.name, 0, r.ledger))
			if tc.stopFirst {
				task.Stop(false)
			}
			stopped := make(chan struct{})
			go func() {
				defer close(stopped)
				if !tc.stopFirst {
					time.Sleep(tc.delay) // where Stop lands, not a wait for a condition
					task.Stop(false)
				}
			}()
			started := make(chan error, 1)
			go func() { started <- task.Start(ctx, tcs[0]) }()
			var startErr error
			select {
			case startErr = <-started:
			case <-time.After(20 * time.Second):
				t.Fatal("Start still running 20s after Stop")
			}
			<-stopped
			if tc.wantStopped && !errors.Is(startErr, context.Canceled) {
				t.Errorf("Start after Stop returned %v, want a context.Canceled error", startErr)
			}
			if startErr == nil {
				// Start won the race: a Poll must still see the Stop.
				if _, err := task.Poll(context.Background()); err == nil {
					t.Error("Poll after Stop returned no error; want the cancellation")
				}
			}
			if err := task.Stopped(ctx); err != nil {
				t.Fatal(err)
			}
			awaitNoConnections(t, db, r.name)
		})
	}
}

// TestRenamesThatReuseNames: renames that hand a captured table's name to
// another captured table (a swap, a chain, a rename onto a name the
// configuration keeps) deliver every waiting change under the table that
// made it, with that table's columns, once the configuration follows; the
// changes of a table the configuration dropped go with it. The tables
// differ in shape, so a change decoded as another table's comes out with
// wrong columns.
func TestRenamesThatReuseNames(t *testing.T) {
	type row = renameRow
	tests := []renameCase{
		{
			name:    "swap",
			before:  []string{"a", "b"},
			writes1: []string{`INSERT INTO %[1]s.a VALUES (1, 'a1')`, `INSERT INTO %[1]s.b VALUES (1, 11)`},
			renames: []string{"a tmp", "b a", "tmp b"},
			writes2: []string{`INSERT INTO %[1]s.a VALUES (2, 22)`, `INSERT INTO %[1]s.b VALUES (2, 'a2')`},
			after:   []string{"a", "b"},
			want: []row{
				{"a", `{"id":1,"yb":11}`}, {"a", `{"id":2,"yb":22}`},
				{"b", `{"id":1,"ya":"a1"}`}, {"b", `{"id":2,"ya":"a2"}`},
			},
		},
		{
			name:    "chain",
			before:  []string{"a", "c"},
			writes1: []string{`INSERT INTO %[1]s.a VALUES (1, 'a1')`, `INSERT INTO %[1]s.c VALUES (1, true)`},
			renames: []string{"a b", "c a"},
			writes2: []string{`INSERT INTO %[1]s.b VALUES (2, 'a2')`, `INSERT INTO %[1]s.a VALUES (2, false)`},
			after:   []string{"a", "b"},
			want: []row{
				{"a", `{"id":1,"yc":true}`}, {"a", `{"id":2,"yc":false}`},
				{"b", `{"id":1,"ya":"a1"}`}, {"b", `{"id":2,"ya":"a2"}`},
			},
		},
		{
			name:    "onto a kept name",
			before:  []string{"a", "b"},
			writes1: []string{`INSERT INTO %[1]s.a VALUES (1, 'a1')`, `INSERT INTO %[1]s.b VALUES (1, 11)`},
			renames: []string{"b b_old", "a b"},
			writes2: []string{`INSERT INTO %[1]s.b_old VALUES (3, 33)`, `INSERT INTO %[1]s.b VALUES (2, 'a2')`},
			after:   []string{"b"},
			// b's change from before the renames stays b's, read with the
			// columns of the table that made it (now b_old); b_old's own
			// change since goes with it.
			want: []row{{"b", `{"id":1,"ya":"a1"}`}, {"b", `{"id":1,"yb":11}`}, {"b", `{"id":2,"ya":"a2"}`}},
		},
		{
			// What online schema-change tools do: the new table takes the
			// old one's name.
			name:    "a new table swapped in",
			before:  []string{"a"},
			writes1: []string{`INSERT INTO %[1]s.a VALUES (1, 'a1')`},
			renames: []string{"a a_old"},
			creates: []string{"a c"},
			// The old table's changes since the rename go with it, its
			// TRUNCATE too (it is not the new table's).
			writes2:  []string{`INSERT INTO %[1]s.a_old VALUES (2, 'gone')`, `TRUNCATE %[1]s.a_old`},
			after:    []string{"a"},
			writeNew: `INSERT INTO %[1]s.a VALUES (3, true)`,
			want:     []row{{"a", `{"id":1,"ya":"a1"}`}, {"a", `{"id":3,"yc":true}`}},
		},
		{
			name:    "renamed twice, then a new table swapped in",
			before:  []string{"a"},
			writes1: []string{`INSERT INTO %[1]s.a VALUES (1, 'a1')`},
			renames: []string{"a a_tmp", "!INSERT INTO %[1]s.a_tmp VALUES (2, 'gone')", "a_tmp a_old"},
			creates: []string{"a c"},
			writes2: []string{`INSERT INTO %[1]s.a_old VALUES (3, 'gone too')`},
			after:   []string{"a"},
			// a new table of another shape: a change decoded with its
			// columns would show
			writeNew: `INSERT INTO %[1]s.a VALUES (4, true)`,
			want:     []renameRow{{"a", `{"id":1,"ya":"a1"}`}, {"a", `{"id":4,"yc":true}`}},
		},
		{
			// Written by a version whose audit rows had no image_relid.
			name:     "a new table swapped in, before image_relid",
			before:   []string{"a"},
			writes1:  []string{`INSERT INTO %[1]s.a VALUES (1, 'a1')`},
			renames:  []string{"a a_old", "!CREATE TABLE %[1]s.a (id int PRIMARY KEY, yc bool)", "!INSERT INTO %[1]s.a_old VALUES (2, 'a2')", "%drop-relid"},
			after:    []string{"a"},
			writeNew: `INSERT INTO %[1]s.a VALUES (3, true)`,
			want:     []renameRow{{"a", `{"id":1,"ya":"a1"}`}, {"a", `{"id":3,"yc":true}`}},
		},
		{
			// A Start between two swaps: what the first settled stays.
			name:    "two swaps, a Start between",
			before:  []string{"a"},
			writes1: []string{`INSERT INTO %[1]s.a VALUES (1, 'a1')`},
			renames: []string{"a a_old", "!CREATE TABLE %[1]s.a (id int PRIMARY KEY, yc bool)", "@a",
				"!INSERT INTO %[1]s.a VALUES (2, true)", "a a_old2", "!CREATE TABLE %[1]s.a (id int PRIMARY KEY, yb int)"},
			after:    []string{"a"},
			writeNew: `INSERT INTO %[1]s.a VALUES (3, 33)`,
			want:     []renameRow{{"a", `{"id":1,"ya":"a1"}`}, {"a", `{"id":2,"yc":true}`}, {"a", `{"id":3,"yb":33}`}},
		},
		{
			// A change made under an intermediate name and moved at one
			// Start is its table's: a later swap keeps it.
			name:     "moved, then swapped out",
			before:   []string{"b"},
			renames:  []string{"b x", "!INSERT INTO %[1]s.x VALUES (1, 11)", "x a", "@a", "a a_old", "!CREATE TABLE %[1]s.a (id int PRIMARY KEY, yc bool)"},
			after:    []string{"a"},
			writeNew: `INSERT INTO %[1]s.a VALUES (2, true)`,
			want:     []renameRow{{"a", `{"id":1,"yb":11}`}, {"a", `{"id":2,"yc":true}`}},
		},
	}
	for _, level := range []string{levelStatement, levelRow} {
		for _, tt := range tests {
			t.Run(level+"/"+tt.name, func(t *testing.T) { renamesThatReuseNames(t, level, tt) })
		}
	}
}

// renameCase is a case of TestRenamesThatReuseNames.
type renameCase struct {
	name     string
	before   []string // configured tables before the renames
	writes1  []string // before the renames
	renames  []string // ALTER TABLE ... RENAME TO, in order: "from to"; "!SQL" runs SQL; "@t1 t2" starts and stops the connector on those tables (nothing delivered); "%drop-relid" drops the audit table's image_relid
	creates  []string // tables created after the renames: "name shape-of"
	writes2  []string // after the renames
	after    []string // configured tables after
	writeNew string   // written after the second Start
	want     []renameRow
}

// renameRow is a delivered change: its topic's table and its after image.
type renameRow struct{ topic, after string }

func renamesThatReuseNames(t *testing.T, level string, tt renameCase) {
	db, url := admin(t)
	s := newSchema(t, db)
	shapes := map[string]string{"a": "ya text", "b": "yb int", "c": "yc bool"}
	for _, tb := range tt.before {
		mustExec(t, db, `CREATE TABLE `+qualified(s, tb)+` (id int PRIMARY KEY, `+shapes[tb]+`)`)
	}
	name := testenv.Unique("reuse-")
	l := connect.NewMemoryLedger()
	audit := auditSchemaFor(t, db)
	qualify := func(ts []string) []string {
		var out []string
		for _, x := range ts {
			out = append(out, s+"."+x)
		}
		return out
	}
	cfg := func(tables []string) connect.Config {
		c := baseConfig(name, url, audit, qualify(tables)...)
		c[KeyCaptureLevel] = level
		return c
	}
	if err := startConnector(t, cfg(tt.before), l).stop(false); err != nil {
		t.Fatal(err)
	}
	sq := pgx.Identifier{s}.Sanitize()
	for _, w := range tt.writes1 {
		mustExec(t, db, fmt.Sprintf(w, sq))
	}
	for _, rn := range tt.renames {
		if sql, ok := strings.CutPrefix(rn, "!"); ok {
			mustExec(t, db, fmt.Sprintf(sql, sq))
			continue
		}
		if rn == "%drop-relid" {
			// The audit table as a version before image_relid left it.
			mustExec(t, db, `ALTER TABLE `+qualified(audit, objectNames(name).table)+` DROP COLUMN image_relid`)
			continue
		}
		if tables, ok := strings.CutPrefix(rn, "@"); ok {
			if err := startConnector(t, cfg(strings.Fields(tables)), l).stop(false); err != nil {
				t.Fatal(err)
			}
			continue
		}
		from, to, _ := strings.Cut(rn, " ")
		mustExec(t, db, `ALTER TABLE `+qualified(s, from)+` RENAME TO `+pgx.Identifier{to}.Sanitize())
	}
	for _, c := range tt.creates {
		tb, like, _ := strings.Cut(c, " ")
		mustExec(t, db, `CREATE TABLE `+qualified(s, tb)+` (id int PRIMARY KEY, `+shapes[like]+`)`)
	}
	for _, w := range tt.writes2 {
		mustExec(t, db, fmt.Sprintf(w, sq))
	}
	r := startConnector(t, cfg(tt.after), l)
	defer func() { _ = r.stop(true) }()
	if tt.writeNew != "" {
		mustExec(t, db, fmt.Sprintf(tt.writeNew, sq))
	}
	got := r.collect(len(tt.want), true)
	r.quiet()
	byTopic := map[string][]string{}
	for _, c := range got {
		if c.Source.Table != strings.TrimPrefix(c.Topic, "tc."+s+".") {
			t.Errorf("topic %s carries source.table %s", c.Topic, c.Source.Table)
		}
		b, _ := json.Marshal(c.After)
		byTopic[strings.TrimPrefix(c.Topic, "tc."+s+".")] = append(byTopic[strings.TrimPrefix(c.Topic, "tc."+s+".")], string(b))
	}
	wantBy := map[string][]string{}
	for _, w := range tt.want {
		b, _ := json.Marshal(jsonOf(t, w.after))
		wantBy[w.topic] = append(wantBy[w.topic], string(b))
	}
	if !reflect.DeepEqual(byTopic, wantBy) {
		t.Errorf("delivered\n got %v\nwant %v", byTopic, wantBy)
	}
}

// lockWatchingLedger fails Own for functions and notes, at each Release,
// whether the provisioning session still holds pgaudit's advisory lock.
type lockWatchingLedger struct {
	connect.Ledger
	db            *pgxpool.Pool
	app           string // the provisioning session's application_name
	heldAtRelease []bool
}

func (l *lockWatchingLedger) Own(ctx context.Context, r connect.Resource) error {
	if r.Kind == KindFunction {
		return errors.New("injected ledger failure")
	}
	return l.Ledger.Own(ctx, r)
}

func (l *lockWatchingLedger) Release(ctx context.Context, r connect.Resource) error {
	var held bool
	key := uint64(lockKey)
	err := l.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted
  AND classid = $1::int8::oid AND objid = $2::int8::oid AND objsubid = 1
  AND pid IN (SELECT pid FROM pg_stat_activity WHERE application_name = $3))`, int64(key>>32), int64(key&0xffffffff), l.app).Scan(&held)
	if err != nil {
		return err
	}
	l.heldAtRelease = append(l.heldAtRelease, held)
	return l.Ledger.Release(ctx, r)
}

// TestFailedProvisioningReleasesUnderTheLock: a provisioning attempt that
// fails releases the ledger entries it recorded while it still holds the
// advisory lock. Released after the rollback, another instance of the
// connector provisioning meanwhile could find them, not record them again,
// create the objects, and lose them from the ledger.
func TestFailedProvisioningReleasesUnderTheLock(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "a")+` (id int)`)
	cfg := baseConfig(testenv.Unique("lockrel-"), url, auditSchemaFor(t, db), s+".a")
	l := &lockWatchingLedger{Ledger: connect.NewMemoryLedger(), db: db, app: ApplicationName(cfg["name"], "connector")}
	if _, err := tryStart(t, cfg, l); err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("Start: %v, want the injected failure", err)
	}
	if len(l.heldAtRelease) == 0 {
		t.Fatal("nothing was released")
	}
	for i, held := range l.heldAtRelease {
		if !held {
			t.Errorf("release %d happened after the advisory lock was given up", i)
		}
	}
	if rs, _ := l.List(testCtx(t)); len(rs) != 0 {
		t.Errorf("ledger lists %v after a failed Start", rs)
	}
	// One transaction: what the attempt created before failing is gone.
	var schema bool
	if err := db.QueryRow(testCtx(t), `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, cfg[KeyAuditSchema]).Scan(&schema); err != nil || schema {
		t.Errorf("the audit schema is left after a failed Start (%v)", err)
	}
	if n := triggerCount(t, db, s, "a"); n != 0 {
		t.Errorf("%d triggers left after a failed Start", n)
	}
}

// TestStoppedRecordsDeliveredChanges: acknowledged changes whose DELETE
// failed in Commit (the connection was lost) are deleted by Stopped, so the
// next instance does not send them again.
func TestStoppedRecordsDeliveredChanges(t *testing.T) {
	db, tbl, r := oneTable(t, "flushstop-", `(id int PRIMARY KEY)`)
	ctx := testCtx(t)
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (1)`)
	var recs []connect.SourceRecord
	await(t, 10*time.Second, func() (bool, string, error) {
		pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		got, err := r.tasks[0].Poll(pctx)
		if pctx.Err() != nil {
			err = nil
		}
		recs = got
		return len(got) > 0, "the change polled", err
	})
	// The task's pooled connections are lost before its Commit.
	mustExec(t, db, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, ApplicationName(r.name, "task-0"))
	if err := r.tasks[0].Commit(ctx, recs); err != nil {
		t.Fatalf("Commit with the connection lost: %v", err)
	}
	audit := auditTable(r)
	count := func() int {
		var n int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM `+audit).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count(); n != 1 {
		t.Fatalf("%d audit rows after the failed DELETE, want the row still there", n)
	}
	task := r.tasks[0]
	task.Stop(false)
	if err := task.Stopped(connect.WithHost(ctx, testHost(r.name, 0, r.ledger))); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 0 {
		t.Errorf("%d audit rows after Stopped: the acknowledged change would be sent again", n)
	}
}
