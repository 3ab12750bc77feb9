package pgaudit

import (
	"net/url"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestParseQualifiedDatabaseWithSlashQuote: a database name is written
// into ledger locations unquoted, and may hold `/"` itself.
func TestParseQualifiedDatabaseWithSlashQuote(t *testing.T) {
	for _, tc := range []struct {
		db    string
		parts []string
	}{
		{"test", []string{"s"}},
		{"test", []string{"s", "t"}},
		{`a/"b`, []string{"s"}},
		{`a/"b`, []string{`x/"y`, "t.u"}},
		{`a/"b"."c`, []string{"s", "t"}},
		{`a/"b"`, []string{`"`, `/"`}},
	} {
		loc := tc.db + "/" + pgx.Identifier(tc.parts).Sanitize()
		db, parts, err := parseQualified(loc)
		if err != nil || db != tc.db || !slices.Equal(parts, tc.parts) {
			t.Errorf("parseQualified(%q) = %q, %q, %v; want %q, %q", loc, db, parts, err, tc.db, tc.parts)
		}
		if got := resourceDB(connect.Resource{Kind: KindTable, Name: "x", Location: loc}); got != tc.db {
			t.Errorf("resourceDB(%q) = %q, want %q", loc, got, tc.db)
		}
	}
	for _, loc := range []string{"test", `test/s`, `test/"s`, `test/"s"x`, `test/"s"."t"."u"`, `test/"s".`} {
		if db, parts, err := parseQualified(loc); err == nil {
			t.Errorf("parseQualified(%q) = %q, %q, want an error", loc, db, parts)
		}
	}
}

// TestDatabaseNameWithSlashQuote: a connector on a database whose name
// holds `/"` restarts without garbling its ledger and is deleted without
// leftovers.
func TestDatabaseNameWithSlashQuote(t *testing.T) {
	db, u := admin(t)
	pu, err := url.Parse(u)
	if err != nil || pu.Scheme == "" {
		testenv.Skip(t, "cannot derive a URL for another database from %s", testenv.PostgresEnv)
	}
	name := testenv.Unique(`pga/"db_`)
	mustExec(t, db, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize())
	t.Cleanup(func() { mustExec(t, db, `DROP DATABASE IF EXISTS `+pgx.Identifier{name}.Sanitize()+` WITH (FORCE)`) })
	pu.Path, pu.RawPath = "/"+name, ""
	ctx := testCtx(t)
	other, err := pgx.Connect(ctx, pu.String())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	if _, err := other.Exec(ctx, `CREATE TABLE public.a (id int)`); err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig(testenv.Unique("slashdb-"), pu.String(), "pga_audit", "public.a")
	l := connect.NewMemoryLedger()
	if err := startConnector(t, cfg, l).stop(false); err != nil {
		t.Fatal(err)
	}
	owned, _ := l.List(ctx)
	r := startConnector(t, cfg, l)
	if again, _ := l.List(ctx); len(again) != len(owned) {
		t.Errorf("the ledger lists %d objects after a restart, %d before: %v", len(again), len(owned), again)
	}
	if err := r.stop(true); err != nil {
		t.Errorf("deletion: %v", err)
	}
	var triggers int
	var schema bool
	if err := other.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_trigger WHERE NOT tgisinternal), EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'pga_audit')`).Scan(&triggers, &schema); err != nil {
		t.Fatal(err)
	}
	if triggers != 0 || schema {
		t.Errorf("left after the deletion: %d triggers, audit schema %v", triggers, schema)
	}
	if left, _ := l.List(ctx); len(left) != 0 {
		t.Errorf("the ledger still lists %v", left)
	}
}
