package pgaudit

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestIncrementalSnapshotCopyPastStatementTimeoutPages: the error of a
// chunk whose copy outlasts statement_timeout comes from the copy and
// names the pages it copied, not the most a chunk may copy: a one-page
// chunk (here the whole table) said "64 pages", and the error came from
// measuring the table (pg_table_size waited for the held TOAST index under
// statement_timeout), not from the copy the timeout test meant.
func TestIncrementalSnapshotCopyPastStatementTimeoutPages(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	table := qualified(s, "t")
	mustExec(t, db, `CREATE TABLE `+table+` (id int PRIMARY KEY, v text)`)
	mustExec(t, db, `ALTER TABLE `+table+` ALTER v SET STORAGE EXTERNAL`)
	mustExec(t, db, `INSERT INTO `+table+` SELECT g, repeat('x', 10000) FROM generate_series(1, 10) g`)
	cfg := baseConfig(testenv.Unique("incr-stmtpages-"), withStatementTimeout(t, url, "300ms"), auditSchemaFor(t, db), s+".t")
	cfg[KeySnapshotMode] = snapshotIncremental
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	t.Cleanup(func() { _ = r.stop(true) })
	defer holdToastIndex(t, db, table)()
	pctx, cancel := context.WithTimeout(testCtx(t), 3*time.Second)
	defer cancel()
	_, err := r.tasks[0].Poll(pctx)
	if err == nil || !strings.Contains(err.Error(), "statement_timeout") {
		t.Fatalf("Poll whose chunk outlasts statement_timeout: %v; want it to say so", err)
	}
	if !strings.Contains(err.Error(), "copying pages 0 to 1 of") {
		t.Errorf("the error does not come from the chunk's copy: %v", err)
	}
	if wrong := fmt.Sprintf("(%d pages", snapshotChunkPages); strings.Contains(err.Error(), wrong) {
		t.Errorf("the error of a one-page chunk says %q: %v", wrong, err)
	}
}
