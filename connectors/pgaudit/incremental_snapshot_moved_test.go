package pgaudit

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestIncrementalSnapshotRowMovedToAnotherPartition: a row of a chunk
// moved to another partition (its partition key updated) by a writer that
// commits while the chunk reads its pages: PostgreSQL cannot lock it and
// says so with a serialization failure. That is a chunk giving way, tried
// again shortly, not a database failure (backoff and a warning that the
// database may be down).
func TestIncrementalSnapshotRowMovedToAnotherPartition(t *testing.T) {
	db, url := admin(t)
	ctx := testCtx(t)
	s := newSchema(t, db)
	table := qualified(s, "t")
	mustExec(t, db, `CREATE TABLE `+table+` (id int NOT NULL, n int NOT NULL, b text) PARTITION BY RANGE (id)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "t_low")+` PARTITION OF `+table+` FOR VALUES FROM (MINVALUE) TO (5000)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "t_high")+` PARTITION OF `+table+` FOR VALUES FROM (5000) TO (MAXVALUE)`)
	mustExec(t, db, `ALTER TABLE `+qualified(s, "t_low")+` ALTER COLUMN b SET STORAGE EXTERNAL`)
	// Rows with out-of-line values first, then row 1000 on the same page:
	// the chunk stalls making the first image while their TOAST index is
	// held (holdToastIndex), and reaches row 1000 only once it is released.
	mustExec(t, db, `INSERT INTO `+table+` SELECT g, 0, repeat('x', 10000) FROM generate_series(1, 5) g`)
	mustExec(t, db, `INSERT INTO `+table+` VALUES (1000, 0, 'x')`)
	cfg := baseConfig(testenv.Unique("incr-moved-"), url, auditSchemaFor(t, db), s+".t")
	cfg[KeySnapshotMode] = snapshotIncremental
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	t.Cleanup(func() { _ = r.stop(true) })

	release := holdToastIndex(t, db, qualified(s, "t_low"))
	defer release()
	done := make(chan error, 1)
	go func() {
		_, err := r.tasks[0].copyChunk(ctx)
		done <- err
	}()
	// The chunk's statement is under way (its snapshot taken), waiting for
	// the TOAST index.
	await(t, 10*time.Second, func() (bool, string, error) {
		var waiting bool
		err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE starts_with(application_name, $1) AND wait_event_type = 'Lock' AND query LIKE '%FOR SHARE OF c NOWAIT%')`, ApplicationNamePrefix(r.name)).Scan(&waiting)
		return waiting, "the chunk's copy never waited for the TOAST index", err
	})
	mustExec(t, db, `UPDATE `+table+` SET id = 6000 WHERE id = 1000`)
	release()
	err := <-done
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "40001" {
		t.Fatalf("copyChunk with a row moved to another partition meanwhile: %v; want the serialization failure (40001) that says so", err)
	}
	if !copyAgain(err) {
		t.Fatalf("copyChunk with a row moved to another partition meanwhile: %v; want it to give way", err)
	}
}
