package pgaudit

import (
	"testing"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// A row lock held for long on one table (a session idle in its
// transaction) makes that table's chunks give way, but the task's other
// tables are copied meanwhile: the chunk that gave way goes last. Before,
// the task picked the same table first every time and copied nothing else.
func TestIncrementalSnapshotOtherTablesGoOnWhileOneGivesWay(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	for _, name := range []string{"a", "b"} {
		mustExec(t, db, `CREATE TABLE `+qualified(s, name)+` (id int PRIMARY KEY, n int NOT NULL)`)
		mustExec(t, db, `INSERT INTO `+qualified(s, name)+` SELECT g, 0 FROM generate_series(1, 500) g`)
	}
	cfg := baseConfig(testenv.Unique("incrot-"), url, auditSchemaFor(t, db), s+".a", s+".b")
	cfg[KeySnapshotMode] = snapshotIncremental
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	t.Cleanup(func() { _ = r.stop(true) })
	// a sorts first; its first page holds row 1.
	writer := lockingWriter(t, db, `UPDATE `+qualified(s, "a")+` SET n = 1 WHERE id = 1`)
	ctx := testCtx(t)
	progress := qualified(r.cfg[KeyAuditSchema], objectNames(r.name).snapshot)
	left := func(table string) int {
		var n int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM `+progress+` WHERE filed_table = $1`, table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for i := 0; left("b") > 0; i++ {
		if i > 20 {
			t.Fatal("table b was not copied while a row of table a stayed locked")
		}
		if _, err := r.tasks[0].copyChunk(ctx); err != nil && !copyAgain(err) {
			t.Fatal(err)
		}
	}
	if left("a") != 1 {
		t.Fatal("table a's copy ended although a row of its first chunk is still locked")
	}
	if err := writer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 0; left("a") > 0; i++ {
		if i > 20 {
			t.Fatal("table a was not copied after the writer committed")
		}
		if _, err := r.tasks[0].copyChunk(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
