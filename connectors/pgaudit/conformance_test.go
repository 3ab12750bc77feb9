package pgaudit

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/connecttest"
)

func TestConformance(t *testing.T) {
	db, url := admin(t)
	connecttest.Run(t, connecttest.Subject{
		Plugin: Plugin(),
		Config: func(t testing.TB) connect.Config {
			s := newSchema(t, db)
			mustExec(t, db, "CREATE TABLE "+qualified(s, "items")+" (id int PRIMARY KEY, v text)")
			mustExec(t, db, "CREATE TABLE "+qualified(s, "notes")+" (v text)")
			cfg := baseConfig(testenv.Unique("conf-"), url, auditSchemaFor(t, db), s+".items", s+".notes")
			cfg[KeyTasksMax] = "2"
			return cfg
		},
		Exists: func(ctx context.Context, r connect.Resource) (bool, error) { return resourceExists(ctx, db, r) },
		PreExisting: func(t testing.TB, cfg connect.Config) connect.Resource {
			// The audit schema made by a person: used, never owned.
			mustExec(t, db, "CREATE SCHEMA "+pgx.Identifier{cfg[KeyAuditSchema]}.Sanitize())
			var dbName string
			if err := db.QueryRow(context.Background(), "SELECT current_database()").Scan(&dbName); err != nil {
				t.Fatal(err)
			}
			return schemaRes(dbName, cfg[KeyAuditSchema])
		},
		BrokenConfig: func(t testing.TB) connect.Config {
			return baseConfig(testenv.Unique("broken-"), "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=2", "tidyconnect", "public.nothing")
		},
		Connections: func(ctx context.Context, name string) (int, error) { return connections(ctx, db, name) },
		SourceChanges: func(t testing.TB, cfg connect.Config, n int) {
			ts, err := parseTables(cfg[KeyTables])
			if err != nil {
				t.Fatal(err)
			}
			mustExec(t, db, `INSERT INTO `+ts[0].quoted()+` SELECT g, 'v' FROM generate_series(1, $1::int) g`, n)
		},
	})
}

// TestConformanceLogical runs the kit under capture.method=logical: its
// publication and slot are the owned resources; it uses nothing that
// exists before it, so the kit's pre-existing check has nothing to run.
func TestConformanceLogical(t *testing.T) {
	db, url := logicalAdmin(t)
	connecttest.Run(t, connecttest.Subject{
		Plugin: Plugin(),
		Config: func(t testing.TB) connect.Config {
			s := newSchema(t, db)
			mustExec(t, db, "CREATE TABLE "+qualified(s, "items")+" (id int PRIMARY KEY, v text)")
			mustExec(t, db, "CREATE TABLE "+qualified(s, "notes")+" (id int PRIMARY KEY, v text)")
			name := testenv.Unique("conf-logical-")
			dropSlotAfter(t, db, name)
			return logicalConfig(name, url, s+".items", s+".notes")
		},
		Exists: func(ctx context.Context, r connect.Resource) (bool, error) { return resourceExists(ctx, db, r) },
		BrokenConfig: func(t testing.TB) connect.Config {
			return logicalConfig(testenv.Unique("broken-"), "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=2", "public.nothing")
		},
		Connections: func(ctx context.Context, name string) (int, error) { return connections(ctx, db, name) },
		SourceChanges: func(t testing.TB, cfg connect.Config, n int) {
			ts, err := parseTables(cfg[KeyTables])
			if err != nil {
				t.Fatal(err)
			}
			mustExec(t, db, `INSERT INTO `+ts[0].quoted()+` SELECT g, 'v' FROM generate_series(1, $1::int) g`, n)
		},
	})
}
