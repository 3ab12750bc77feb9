package pgaudit

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestLockTimeoutNamesPreparedTransactions: a prepared transaction that
// changed a captured table holds its lock until COMMIT PREPARED or
// ROLLBACK PREPARED, however often a deletion or a Start is retried, and
// no session in pg_stat_activity shows it; a session left idle in its
// transaction holds it as long. The error of a deletion, and of a Start
// that must create a capture trigger, names what holds the lock and what
// to do; once it is gone, the retry succeeds.
func TestLockTimeoutNamesPreparedTransactions(t *testing.T) {
	db, url := admin(t)
	want := func(t *testing.T, err error, what string, words ...string) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s succeeded while a transaction holds a lock on the captured table", what)
		}
		for _, w := range words {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s error does not name %q: %v", what, w, err)
			}
		}
	}

	t.Run("deletion", func(t *testing.T) {
		needPreparedTransactions(t, db)
		db, table, r := oneTable(t, "delprep-", `(id int PRIMARY KEY)`, connect.Config{KeyWakeupNotify: "false"})
		gid := prepareInsert(t, db, table, "(1)")

		err := r.stop(true)
		want(t, err, "deletion", gid, "ROLLBACK PREPARED")
		if err != nil && !strings.Contains(err.Error(), "still owned") {
			t.Errorf("deletion error does not say what is still owned: %v", err)
		}

		mustExec(t, db, `ROLLBACK PREPARED '`+gid+`'`)
		inst := &Connector{}
		h := testHost(r.name, -1, r.ledger)
		h.CleanupOnly = true
		hctx := connect.WithHost(testCtx(t), h)
		if err := inst.Start(hctx, r.cfg); err != nil {
			t.Fatal(err)
		}
		inst.Stop(true)
		if err := inst.Stopped(hctx); err != nil {
			t.Fatalf("retried deletion: %v", err)
		}
		if left, _ := r.ledger.List(context.Background()); len(left) != 0 {
			t.Errorf("ledger lists %v after the retried deletion", left)
		}
	})

	// A session left idle in its transaction, as a forgotten psql is.
	t.Run("deletion_idle_in_transaction", func(t *testing.T) {
		db, table, r := oneTable(t, "delidle-", `(id int PRIMARY KEY)`)
		idle := begin(t, db)
		txExec(t, idle, `INSERT INTO `+table+` VALUES (1)`)
		var pid int
		if err := idle.QueryRow(testCtx(t), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			t.Fatal(err)
		}
		err := r.stop(true)
		want(t, err, "deletion", fmt.Sprintf("session %d (idle in transaction", pid), "pg_terminate_backend")
		if err := idle.Rollback(testCtx(t)); err != nil {
			t.Fatal(err)
		}
		inst := &Connector{}
		h := testHost(r.name, -1, r.ledger)
		h.CleanupOnly = true
		hctx := connect.WithHost(testCtx(t), h)
		if err := inst.Start(hctx, r.cfg); err != nil {
			t.Fatal(err)
		}
		inst.Stop(true)
		if err := inst.Stopped(hctx); err != nil {
			t.Fatalf("retried deletion: %v", err)
		}
	})

	t.Run("start", func(t *testing.T) {
		needPreparedTransactions(t, db)
		s := newSchema(t, db)
		table := qualified(s, "t")
		mustExec(t, db, `CREATE TABLE `+table+` (id int PRIMARY KEY)`)
		gid := prepareInsert(t, db, table, "(1)")

		cfg := baseConfig(testenv.Unique("startprep-"), url, auditSchemaFor(t, db), s+".t")
		cfg[KeyWakeupNotify] = "false"
		l := connect.NewMemoryLedger()
		_, err := tryStart(t, cfg, l)
		want(t, err, "Start", gid, "ROLLBACK PREPARED")

		mustExec(t, db, `ROLLBACK PREPARED '`+gid+`'`)
		r := startConnector(t, cfg, l)
		if err := r.stop(true); err != nil {
			t.Fatal(err)
		}
	})
}
