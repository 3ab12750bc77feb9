package pgaudit

import (
	"context"
	neturl "net/url"
	"strings"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestIncrementalSnapshotStatementTimeoutShorterThanLockWait: a chunk
// waits up to 2 s (lock_timeout) for the table's lock, then gives way. A
// role whose statement_timeout is shorter must not turn that wait into a
// failed task: the chunk gives way, and copies once the lock is free.
func TestIncrementalSnapshotStatementTimeoutShorterThanLockWait(t *testing.T) {
	db, url := admin(t)
	ctx := testCtx(t)
	s := newSchema(t, db)
	table := qualified(s, "t")
	mustExec(t, db, `CREATE TABLE `+table+` (id int PRIMARY KEY, n int NOT NULL)`)
	mustExec(t, db, `INSERT INTO `+table+` SELECT g, 0 FROM generate_series(1, 100) g`)
	cfg := baseConfig(testenv.Unique("incr-stmt-"), withStatementTimeout(t, url, "300ms"), auditSchemaFor(t, db), s+".t")
	cfg[KeySnapshotMode] = snapshotIncremental
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	t.Cleanup(func() { _ = r.stop(true) })

	// A rewrite, say, holds the table for longer than statement_timeout.
	holder := lockingWriter(t, db, `LOCK TABLE `+table+` IN ACCESS EXCLUSIVE MODE`)
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	_, err := r.tasks[0].Poll(pctx)
	ended := pctx.Err() != nil
	cancel()
	if err != nil && !ended {
		t.Fatalf("Poll while the table's lock is held past statement_timeout: %v; want the chunk to give way", err)
	}
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := r.collectAll(db); len(got) != 100 {
		t.Fatalf("%d records, want the table's 100 rows", len(got))
	}
}

// TestIncrementalSnapshotCopyPastStatementTimeout: a chunk's copy that
// takes longer than the role's statement_timeout (here held up on the
// table's TOAST index) fails the task saying what to do, as the initial
// snapshot's does.
func TestIncrementalSnapshotCopyPastStatementTimeout(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	table := qualified(s, "t")
	mustExec(t, db, `CREATE TABLE `+table+` (id int PRIMARY KEY, v text)`)
	mustExec(t, db, `ALTER TABLE `+table+` ALTER v SET STORAGE EXTERNAL`)
	mustExec(t, db, `INSERT INTO `+table+` SELECT g, repeat('x', 10000) FROM generate_series(1, 10) g`)
	cfg := baseConfig(testenv.Unique("incr-stmtcopy-"), withStatementTimeout(t, url, "300ms"), auditSchemaFor(t, db), s+".t")
	cfg[KeySnapshotMode] = snapshotIncremental
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	t.Cleanup(func() { _ = r.stop(true) })
	defer holdToastIndex(t, db, table)()
	pctx, cancel := context.WithTimeout(testCtx(t), 3*time.Second)
	defer cancel()
	_, err := r.tasks[0].Poll(pctx)
	for _, want := range []string{"statement_timeout", KeySnapshotMode} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Poll whose chunk outlasts statement_timeout: %v; want an error saying %q", err, want)
		}
	}
}

// withStatementTimeout is url with the session's statement_timeout set.
func withStatementTimeout(t *testing.T, url, timeout string) string {
	t.Helper()
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("options", "-c statement_timeout="+timeout)
	u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20")
	return u.String()
}
