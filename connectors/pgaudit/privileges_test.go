package pgaudit

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestDeleteKeepsAnAuditSchemaTheRoleMayNotDrop: a connector whose role
// does not own the audit schema it lists in its ledger (one it shares with
// a connector of another role, or one it made and that was handed to
// another owner since) still drops its own objects on deletion, and keeps
// the schema, instead of failing the whole deletion on DROP SCHEMA for
// good.
func TestDeleteKeepsAnAuditSchemaTheRoleMayNotDrop(t *testing.T) {
	for _, tc := range []string{"shared with another role", "handed to another owner"} {
		t.Run(tc, func(t *testing.T) {
			db, url := admin(t)
			ctx := testCtx(t)
			s := newSchema(t, db)
			role, rid := newRole(t, db, "pga_rv_")
			mustExec(t, db, `CREATE TABLE `+qualified(s, "a")+` (id int)`)
			mustExec(t, db, `CREATE TABLE `+qualified(s, "b")+` (id int)`)
			mustExec(t, db, `GRANT USAGE ON SCHEMA `+pgx.Identifier{s}.Sanitize()+` TO `+rid)
			mustExec(t, db, `ALTER TABLE `+qualified(s, "b")+` OWNER TO `+rid)
			roleURL := urlAs(t, url, role)
			audit := auditSchemaFor(t, db)
			cfg := baseConfig(testenv.Unique("rvb-"), roleURL, audit, s+".b")
			if tc == "shared with another role" {
				// The superuser's connector makes the schema, the role's
				// shares it.
				a := startConnector(t, baseConfig(testenv.Unique("rva-"), url, audit, s+".a"), connect.NewMemoryLedger())
				defer func() { _ = a.stop(true) }()
				mustExec(t, db, `GRANT USAGE, CREATE ON SCHEMA `+pgx.Identifier{audit}.Sanitize()+` TO `+rid)
			} else {
				var dbName string
				if err := db.QueryRow(ctx, `SELECT current_database()`).Scan(&dbName); err != nil {
					t.Fatal(err)
				}
				mustExec(t, db, `GRANT CREATE ON DATABASE `+pgx.Identifier{dbName}.Sanitize()+` TO `+rid)
				t.Cleanup(func() { mustExec(t, db, `REVOKE CREATE ON DATABASE `+pgx.Identifier{dbName}.Sanitize()+` FROM `+rid) })
			}
			l := connect.NewMemoryLedger()
			b := startConnector(t, cfg, l)
			if rs, _ := l.List(ctx); !strings.Contains(describe(rs), "postgres.schema "+audit) {
				t.Fatalf("the ledger does not list the audit schema: %v", rs)
			}
			if tc == "handed to another owner" {
				mustExec(t, db, `ALTER SCHEMA `+pgx.Identifier{audit}.Sanitize()+` OWNER TO CURRENT_USER`)
				mustExec(t, db, `GRANT USAGE, CREATE ON SCHEMA `+pgx.Identifier{audit}.Sanitize()+` TO `+rid)
			}
			if err := b.stop(true); err != nil {
				t.Errorf("deletion: %v", err)
			}
			if n := triggerCount(t, db, s, "b"); n != 0 {
				t.Errorf("%d capture triggers left on the captured table", n)
			}
			n := objectNames(b.name)
			for _, rel := range []string{n.table, n.wakeup, n.waiters} {
				if relExists(t, db, audit, rel) {
					t.Errorf("%s left", rel)
				}
			}
			if fns := functionsOf(t, db, b.name); fns != 0 {
				t.Errorf("%d functions left", fns)
			}
			if left, _ := l.List(ctx); len(left) != 0 {
				t.Errorf("the ledger still lists %v", left)
			}
			var exists bool
			if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, audit).Scan(&exists); err != nil || !exists {
				t.Errorf("the audit schema the role may not drop is gone (%v)", err)
			}
		})
	}
}

// TestValidateAuditSchemaPrivilegesAtEveryStart: every Start replaces the
// capture functions, which needs CREATE on the audit schema also once the
// audit table exists: a role that lost it is told so by validation, on
// audit.schema, not by a bare "permission denied" from Start.
func TestValidateAuditSchemaPrivilegesAtEveryStart(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	role, rid := newRole(t, db, "pga_rv_")
	mustExec(t, db, `CREATE TABLE `+qualified(s, "a")+` (id int)`)
	mustExec(t, db, `ALTER TABLE `+qualified(s, "a")+` OWNER TO `+rid)
	mustExec(t, db, `GRANT USAGE ON SCHEMA `+pgx.Identifier{s}.Sanitize()+` TO `+rid)
	audit, qa := auditSchemaOf(t, db, rid)
	roleURL := urlAs(t, url, role)
	cfg := baseConfig(testenv.Unique("rvc-"), roleURL, audit, s+".a")
	l := connect.NewMemoryLedger()
	if err := startConnector(t, cfg, l).stop(false); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `REVOKE CREATE ON SCHEMA `+qa+` FROM `+rid)
	want := `has no CREATE privilege on schema ` + qa + `: GRANT CREATE ON SCHEMA ` + qa + ` TO ` + rid
	errs := (&Connector{}).Validate(testCtx(t), cfg)
	if msgs := strings.Join(errs[KeyAuditSchema], " | "); !strings.Contains(msgs, want) {
		t.Errorf("Validate()[%s] = %q, want %q (all: %v)", KeyAuditSchema, msgs, want, errs)
	}
	if _, err := tryStart(t, cfg, l); err == nil || !strings.Contains(err.Error(), KeyAuditSchema+": ") || !strings.Contains(err.Error(), want) {
		t.Errorf("Start: %v, want it to name %s and %q", err, KeyAuditSchema, want)
	}
	mustExec(t, db, `GRANT CREATE ON SCHEMA `+qa+` TO `+rid)
	if err := startConnector(t, cfg, l).stop(true); err != nil {
		t.Fatal(err)
	}
}

// TestValidateUsageOnTheTablesSchema: owning a table is not enough to
// create its triggers: naming it needs USAGE on its schema. Validation says
// so on tables, and Start provisions nothing and names tables too.
func TestValidateUsageOnTheTablesSchema(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	role, rid := newRole(t, db, "pga_rv_")
	mustExec(t, db, `CREATE TABLE `+qualified(s, "a")+` (id int)`)
	mustExec(t, db, `ALTER TABLE `+qualified(s, "a")+` OWNER TO `+rid)
	audit, _ := auditSchemaOf(t, db, rid)
	roleURL := urlAs(t, url, role)
	cfg := baseConfig(testenv.Unique("rvu-"), roleURL, audit, s+".a")
	qs := pgx.Identifier{s}.Sanitize()
	want := `has no USAGE privilege on schema ` + qs + ` of table ` + qualified(s, "a") + `: GRANT USAGE ON SCHEMA ` + qs + ` TO ` + rid
	errs := (&Connector{}).Validate(testCtx(t), cfg)
	if msgs := strings.Join(errs[KeyTables], " | "); !strings.Contains(msgs, want) {
		t.Errorf("Validate()[%s] = %q, want %q (all: %v)", KeyTables, msgs, want, errs)
	}
	l := connect.NewMemoryLedger()
	r, err := tryStart(t, cfg, l)
	if err == nil {
		_ = r.stop(true)
		t.Fatal("Start succeeded")
	}
	if want := KeyTables + `: role ` + rid + ` ` + want; !strings.Contains(err.Error(), "nothing was provisioned") || !strings.Contains(err.Error(), want) {
		t.Errorf("Start: %v, want %q", err, want)
	}
	if rs, _ := l.List(testCtx(t)); len(rs) != 0 {
		t.Errorf("the ledger lists %v after a refused Start", rs)
	}
}

// A deletion PostgreSQL refuses because a user's object depends on the
// audit table drops nothing (one transaction), and its error names the
// dependent object and what to do; once that is gone the retried deletion
// completes.
func TestDeletionBlockedByADependentObjectSaysWhatToDo(t *testing.T) {
	db, url := admin(t)
	ctx := testCtx(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "a")+` (id int PRIMARY KEY)`)
	audit := auditSchemaFor(t, db)
	cfg := baseConfig(testenv.Unique("dep-"), url, audit, s+".a")
	l := connect.NewMemoryLedger()
	r := startConnector(t, cfg, l)
	view := qualified(s, "audit_view")
	mustExec(t, db, `CREATE VIEW `+view+` AS SELECT id FROM `+auditTable(r))
	err := r.stop(true)
	if err == nil {
		t.Fatal("the deletion succeeded although a view depends on the audit table")
	}
	for _, want := range []string{"nothing was dropped", "audit_view", "retry the deletion"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("deletion error %q does not say %q", err, want)
		}
	}
	if rs, _ := l.List(ctx); len(rs) == 0 {
		t.Error("the ledger was emptied although nothing was dropped")
	}
	mustExec(t, db, `DROP VIEW `+view)
	if err := startConnector(t, cfg, l).stop(true); err != nil {
		t.Fatalf("the retried deletion: %v", err)
	}
	if rs, _ := l.List(ctx); len(rs) != 0 {
		t.Errorf("after the retried deletion the ledger lists %v", rs)
	}
	var triggers int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM pg_trigger WHERE tgrelid = $1::regclass`, qualified(s, "a")).Scan(&triggers); err != nil {
		t.Fatal(err)
	}
	if triggers != 0 {
		t.Errorf("%d triggers left on the captured table", triggers)
	}
}

// auditSchemaOf creates an audit schema (dropped at the end of the test)
// on which role rid (quoted) has USAGE and CREATE, and returns its name,
// plain and quoted.
func auditSchemaOf(t *testing.T, db *pgxpool.Pool, rid string) (audit, quoted string) {
	t.Helper()
	audit = auditSchemaFor(t, db)
	quoted = pgx.Identifier{audit}.Sanitize()
	mustExec(t, db, `CREATE SCHEMA `+quoted)
	mustExec(t, db, `GRANT USAGE, CREATE ON SCHEMA `+quoted+` TO `+rid)
	return audit, quoted
}
