package pgaudit

import (
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestMethodObjectsOtherDatabase: validation of a trigger-method
// connector is not refused because a connector of the same name (another
// deployment's) streams another database of the server: replication
// slots are the server's, and that one is not this connector's.
func TestMethodObjectsOtherDatabase(t *testing.T) {
	db, u := logicalAdmin(t)
	pu, err := url.Parse(u)
	if err != nil || pu.Scheme == "" {
		testenv.Skip(t, "cannot derive a URL for another database from %s", testenv.PostgresEnv)
	}
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "t")+` (id int PRIMARY KEY)`)
	name := testenv.Unique("method-otherdb-")
	other := testenv.Unique("method_otherdb_")
	mustExec(t, db, `CREATE DATABASE `+pgx.Identifier{other}.Sanitize())
	t.Cleanup(func() { mustExec(t, db, `DROP DATABASE IF EXISTS `+pgx.Identifier{other}.Sanitize()+` WITH (FORCE)`) })
	dropSlotAfter(t, db, name)
	_, slot := logicalNames(name)
	pu.Path, pu.RawPath = "/"+other, ""
	ctx := testCtx(t)
	oc, err := pgx.Connect(ctx, pu.String())
	if err != nil {
		t.Fatal(err)
	}
	defer oc.Close(ctx)
	if _, err := oc.Exec(ctx, `SELECT pg_catalog.pg_create_logical_replication_slot($1, 'pgoutput')`, slot); err != nil {
		t.Fatal(err)
	}

	cfg := baseConfig(name, u, auditSchemaFor(t, db), s+".t")
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	defer func() {
		if err := r.stop(true); err != nil {
			t.Error(err)
		}
	}()
	if errs := (&Connector{}).Validate(ctx, cfg); len(errs) > 0 {
		t.Errorf("Validate of the running trigger connector's own config: %v (%s)", errs, strings.Join(errs[KeyCaptureMethod], " "))
	}
}
