package pgaudit

import (
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestIssueDefaults: the defaults issue 3 names for the public keys, in the
// configuration definition and in what a configuration without them runs
// with.
func TestIssueDefaults(t *testing.T) {
	want := map[string]string{
		KeyAuditSchema:     "tidyconnect",
		KeyTasksMax:        "1",
		KeyPollMaxRecords:  "1000",
		KeyPollIntervalMS:  "1000",
		KeyCleanupOnDelete: "true",
	}
	def := ConfigDef()
	for k, v := range want {
		key, ok := def.Key(k)
		if !ok || key.Default != v {
			t.Errorf("%s: default %q (defined %v), want %q", k, key.Default, ok, v)
		}
	}
	for _, k := range []string{KeyURL, KeyTables, KeyTopicPrefix} {
		if key, ok := def.Key(k); !ok || !key.Required {
			t.Errorf("%s is not required", k)
		}
	}
	s, errs := parseSettings("n", connect.Config{KeyURL: "postgres://u:pw@h/db", KeyTables: "orders", KeyTopicPrefix: "p"})
	if len(errs) != 0 {
		t.Fatalf("errors: %v", errs)
	}
	if s.auditSchema != "tidyconnect" || s.tasksMax != 1 || s.pollMax != 1000 || s.pollInterval != 1000 || !s.cleanup {
		t.Errorf("settings without the optional keys: %+v", s)
	}
	if len(s.tables) != 1 || s.tables[0] != (tableName{"public", "orders"}) {
		t.Errorf("a bare table: %v, want public.orders", s.tables)
	}
}

// TestEveryOwnedObjectMarked: every object the ledger lists carries the
// comment tidyconnect:<connector>, the marker deletion checks.
func TestEveryOwnedObjectMarked(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "a")+` (id int PRIMARY KEY)`)
	l := connect.NewMemoryLedger()
	r := startConnector(t, baseConfig(testenv.Unique("mark-"), url, auditSchemaFor(t, db), s+".a"), l)
	defer func() { _ = r.stop(true) }()
	ctx := testCtx(t)
	rs, _ := l.List(ctx)
	if len(rs) != 12 {
		t.Errorf("ledger lists %d objects, want 12: %v", len(rs), rs)
	}
	want := markerPrefix + r.name
	for _, res := range rs {
		var c *string
		var err error
		if res.Kind == KindSchema {
			err = db.QueryRow(ctx, `SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = $1`, res.Name).Scan(&c)
		} else {
			_, parts, perr := parseQualified(res.Location)
			if perr != nil {
				t.Fatal(perr)
			}
			switch res.Kind {
			case KindTable, KindSequence:
				err = db.QueryRow(ctx, `SELECT obj_description(to_regclass($1), 'pg_class')`, pgx.Identifier{parts[0], res.Name}.Sanitize()).Scan(&c)
			case KindFunction:
				err = db.QueryRow(ctx, `SELECT obj_description(to_regprocedure($1), 'pg_proc')`, pgx.Identifier{parts[0], res.Name[:len(res.Name)-2]}.Sanitize()+"()").Scan(&c)
			case KindTrigger:
				err = db.QueryRow(ctx, `SELECT obj_description(oid, 'pg_trigger') FROM pg_trigger WHERE tgrelid = to_regclass($1) AND tgname = $2`, pgx.Identifier(parts).Sanitize(), res.Name).Scan(&c)
			default:
				t.Fatalf("unexpected kind %v", res)
			}
		}
		if err != nil {
			t.Fatalf("%v: %v", res, err)
		}
		if c == nil || *c != want {
			t.Errorf("%v carries %v, want %q", res, c, want)
		}
	}
}
