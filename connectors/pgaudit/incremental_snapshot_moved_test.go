package pgaudit

import (
	"testing"
	"time"

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
	// As in TestIncrementalSnapshotNoWriterDeadlock: rows whose images
	// take a while to make (1 MB out of line each), then row 1000, which
	// the chunk reaches a few hundred ms after it began.
	mustExec(t, db, `INSERT INTO `+table+` SELECT g, 0, repeat('x', 1000000) FROM generate_series(1, 150) g`)
	mustExec(t, db, `INSERT INTO `+table+` VALUES (1000, 0, 'x')`)
	cfg := baseConfig(testenv.Unique("incr-moved-"), url, auditSchemaFor(t, db), s+".t")
	cfg[KeySnapshotMode] = snapshotIncremental
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	t.Cleanup(func() { _ = r.stop(true) })

	done := make(chan error, 1)
	go func() {
		_, err := r.tasks[0].copyChunk(ctx)
		done <- err
	}()
	// The chunk's statement is under way (its snapshot taken).
	await(t, 10*time.Second, func() (bool, string, error) {
		var running bool
		err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE starts_with(application_name, $1) AND state = 'active' AND query LIKE '%FOR SHARE OF c NOWAIT%')`, ApplicationNamePrefix(r.name)).Scan(&running)
		return running, "the chunk's copy never started", err
	})
	mustExec(t, db, `UPDATE `+table+` SET id = 6000 WHERE id = 1000`)
	if err := <-done; err != nil && !copyAgain(err) {
		t.Fatalf("copyChunk with a row moved to another partition meanwhile: %v; want it to give way", err)
	}
}
