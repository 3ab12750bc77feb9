package pgaudit

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestIncrementalSnapshotPartitionOfAnotherOwner: the role owns the
// partitioned table and has TRIGGER on a partition another role owns, all
// the documentation asks for. The chunks read each partition by name
// (FOR SHARE, which needs SELECT and UPDATE on it): validation says which
// GRANT is missing instead of a Start that succeeds and a task that fails
// on every chunk; with it granted, every row is copied.
func TestIncrementalSnapshotPartitionOfAnotherOwner(t *testing.T) {
	override(t, &snapshotRecheck, 0)
	db, url := admin(t)
	s := newSchema(t, db)
	role, rid := newRole(t, db, "pga_owner_")
	mustExec(t, db, `GRANT USAGE, CREATE ON SCHEMA `+pgx.Identifier{s}.Sanitize()+` TO `+rid)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "p")+` (id int PRIMARY KEY, n int NOT NULL) PARTITION BY RANGE (id)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "p1")+` PARTITION OF `+qualified(s, "p")+` FOR VALUES FROM (0) TO (1000)`)
	mustExec(t, db, `ALTER TABLE `+qualified(s, "p")+` OWNER TO `+rid)
	mustExec(t, db, `GRANT TRIGGER ON `+qualified(s, "p1")+` TO `+rid)
	mustExec(t, db, `INSERT INTO `+qualified(s, "p")+` SELECT g, 0 FROM generate_series(1, 500) g`)
	cfg := baseConfig(testenv.Unique("incr-priv-"), urlAs(t, url, role), s, s+".p")
	cfg[KeySnapshotMode] = snapshotIncremental

	errs := (&Connector{}).Validate(testCtx(t), cfg)
	if want := `no SELECT and UPDATE privileges on "` + s + `"."p1"`; !strings.Contains(strings.Join(errs[KeyTables], " | "), want) {
		t.Fatalf("Validate: %v, want %q", errs, want)
	}
	// Not needed by the other modes, which read through the partitioned
	// table.
	never := connect.Config{}
	for k, v := range cfg {
		never[k] = v
	}
	never[KeySnapshotMode] = snapshotInitial
	if errs := (&Connector{}).Validate(testCtx(t), never); len(errs) != 0 {
		t.Fatalf("Validate with %s=%s: %v", KeySnapshotMode, snapshotInitial, errs)
	}

	mustExec(t, db, `GRANT SELECT, UPDATE ON `+qualified(s, "p1")+` TO `+rid)
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	t.Cleanup(func() { _ = r.stop(true) })
	seen := map[string]bool{}
	for _, c := range r.collectAll(db) {
		if c.Op == "r" {
			seen[fmt.Sprint(c.Key["id"])] = true
		}
	}
	if len(seen) != 500 {
		t.Fatalf("%d rows sent as 'r', want 500", len(seen))
	}

	// A partition made later by its own owner, copied by hand: the task
	// fails saying what to grant, rather than with PostgreSQL's bare
	// error.
	mustExec(t, db, `CREATE TABLE `+qualified(s, "p2")+` PARTITION OF `+qualified(s, "p")+` FOR VALUES FROM (1000) TO (2000)`)
	mustExec(t, db, `INSERT INTO `+qualified(s, "p")+` VALUES (1500, 0)`)
	r.collectAll(db)
	mustExec(t, db, `INSERT INTO `+qualified(s, objectNames(r.name).snapshot)+` (relid, filed_schema, filed_table) VALUES ($1::regclass, $2, 'p')`, qualified(s, "p"), s)
	ctx, cancel := context.WithTimeout(testCtx(t), 30*time.Second)
	defer cancel()
	for {
		recs, err := r.tasks[0].Poll(ctx)
		if ctx.Err() != nil {
			t.Fatal("no Poll failed on the partition the role may not read")
		}
		if err != nil {
			if want := `locking "` + s + `"."p2": ERROR: permission denied`; !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "GRANT SELECT, UPDATE") {
				t.Fatalf("Poll: %v, want it to say %q", err, want)
			}
			break
		}
		if err := r.tasks[0].Commit(ctx, recs); err != nil {
			t.Fatal(err)
		}
	}
}
