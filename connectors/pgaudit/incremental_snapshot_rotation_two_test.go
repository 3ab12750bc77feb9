package pgaudit

import (
	"testing"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// Two tables whose rows stay locked (one session idle in a transaction
// that changed both) hold back neither each other's copy once their locks
// go nor the task's third table: the chunks that gave way go last, the one
// that gave way longest ago first. Before, only the last table to give way
// went last, so the two took turns giving way and the third was never
// copied.
func TestIncrementalSnapshotOtherTablesGoOnWhileTwoGiveWay(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	for _, name := range []string{"a", "b", "c"} {
		mustExec(t, db, `CREATE TABLE `+qualified(s, name)+` (id int PRIMARY KEY, n int NOT NULL)`)
		mustExec(t, db, `INSERT INTO `+qualified(s, name)+` SELECT g, 0 FROM generate_series(1, 500) g`)
	}
	cfg := baseConfig(testenv.Unique("incrot2-"), url, auditSchemaFor(t, db), s+".a", s+".b", s+".c")
	cfg[KeySnapshotMode] = snapshotIncremental
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	t.Cleanup(func() { _ = r.stop(true) })
	// a and b sort first; their first pages hold row 1.
	writer := lockingWriter(t, db, `UPDATE `+qualified(s, "a")+` SET n = 1 WHERE id = 1`)
	if _, err := writer.Exec(testCtx(t), `UPDATE `+qualified(s, "b")+` SET n = 1 WHERE id = 1`); err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	progress := qualified(r.cfg[KeyAuditSchema], objectNames(r.name).snapshot)
	left := func(table string) int {
		var n int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM `+progress+` WHERE filed_table = $1`, table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	copyUntil := func(table string, want string) {
		t.Helper()
		for i := 0; left(table) > 0; i++ {
			if i > 20 {
				t.Fatal(want)
			}
			if _, err := r.tasks[0].copyChunk(ctx); err != nil && !copyAgain(err) {
				t.Fatal(err)
			}
		}
	}
	copyUntil("c", "table c was not copied while rows of tables a and b stayed locked")
	if left("a") != 1 || left("b") != 1 {
		t.Fatal("a copy ended although a row of its first chunk is still locked")
	}
	if err := writer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	copyUntil("a", "table a was not copied after the writer committed")
	copyUntil("b", "table b was not copied after the writer committed")
}
