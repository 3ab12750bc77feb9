package pgaudit

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestWakeupNotifyOff: with wakeup.notify=false a task opens no LISTEN
// connection, clears the wake-up marks an earlier run left (its own, and
// that of a task no longer configured), and finds changes by polling
// alone; no writer sends a NOTIFY, even while the task is idle.
func TestWakeupNotifyOff(t *testing.T) {
	db, url := admin(t)
	ctx := testCtx(t)
	s := newSchema(t, db)
	tbl := qualified(s, "w")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY)`)
	cfg := baseConfig(testenv.Unique("nonotify-"), url, auditSchemaFor(t, db), s+".w")
	cfg[KeyPollIntervalMS] = "100"
	ledger := connect.NewMemoryLedger()
	r := startConnector(t, cfg, ledger)
	defer func() { _ = r.stop(true) }()
	n := objectNames(r.name)
	notified := listenOn(t, ctx, url, n.channel)

	// An earlier run with wake-ups left task 0 waiting, and a task 3 of a
	// larger tasks.max too: writers notify.
	if err := r.stop(false); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `INSERT INTO `+qualified(cfg[KeyAuditSchema], n.wakeup)+` VALUES (0, true), (3, true) ON CONFLICT (task) DO UPDATE SET waiting = true`)
	mustExec(t, db, `SELECT setval($1::regclass, 2)`, qualified(cfg[KeyAuditSchema], n.waiters))
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (0)`)
	if !notified(10 * time.Second) {
		t.Fatal("no NOTIFY with two tasks marked waiting: the set-up does not show what the test is about")
	}

	cfg[KeyWakeupNotify] = "false"
	r = startConnector(t, cfg, ledger)
	awaitWaiting(t, db, cfg[KeyAuditSchema], n, false)
	var listeners int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, ApplicationName(r.name, "listen-0")).Scan(&listeners); err != nil {
		t.Fatal(err)
	}
	if listeners != 0 {
		t.Errorf("%d LISTEN connections of the task, want none", listeners)
	}
	if got := r.collect(1, true); len(got) != 1 || got[0].Op != "c" {
		t.Fatalf("changes made before the restart: %+v", got)
	}

	// Idle: Polls that found nothing (a task with wake-ups would now be
	// marked waiting); the next change is found by polling, and its
	// writer sent no NOTIFY.
	for range 3 {
		if got := r.pollAll(true); len(got) != 0 {
			t.Fatalf("unexpected changes: %+v", got)
		}
	}
	awaitWaiting(t, db, cfg[KeyAuditSchema], n, false)
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (1)`)
	if notified(time.Second) {
		t.Error("a writer sent a NOTIFY with wakeup.notify=false")
	}
	if got := r.collect(1, true); len(got) != 1 || got[0].Op != "c" {
		t.Fatalf("changes: %+v, want the insert", got)
	}

	// An older instance of task 0, still stopping when this one started,
	// marks itself waiting: the running task clears it again.
	override(t, &marksRecheck, 0)
	mustExec(t, db, `INSERT INTO `+qualified(cfg[KeyAuditSchema], n.wakeup)+` VALUES (0, true) ON CONFLICT (task) DO UPDATE SET waiting = true`)
	mustExec(t, db, `SELECT setval($1::regclass, 1)`, qualified(cfg[KeyAuditSchema], n.waiters))
	r.pollAll(true)
	awaitWaiting(t, db, cfg[KeyAuditSchema], n, false)
}

// TestTwoPhaseCommit: writers that PREPARE TRANSACTION. With
// wakeup.notify=false their changes are captured under every capture
// mode: a prepared transaction holds nobody back, its change is delivered
// after COMMIT PREPARED (after a change committed meanwhile, though its
// audit row was written first), and nothing after ROLLBACK PREPARED. With
// wake-ups (the default) the PREPARE fails while a task waits: the
// limitation the key exists for.
func TestTwoPhaseCommit(t *testing.T) {
	db, _ := admin(t)
	needPreparedTransactions(t, db)
	for _, tc := range []struct {
		name string
		set  connect.Config
	}{
		{"commit_order", nil},
		{"statement_order", connect.Config{KeyCaptureOrder: orderStatement}},
		{"row_level", connect.Config{KeyCaptureLevel: levelRow}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set := connect.Config{KeyWakeupNotify: "false", KeyPollIntervalMS: "50"}
			for k, v := range tc.set {
				set[k] = v
			}
			db, table, r := oneTable(t, "twopc-", `(id int PRIMARY KEY, v text)`, set)
			ctx := testCtx(t)
			gid := testenv.Unique("tidyconnect-test-")
			t.Cleanup(func() { rollbackPrepared(t, db, gid) })

			// Idle task; a transaction prepares, another commits.
			if got := r.pollAll(true); len(got) != 0 {
				t.Fatalf("unexpected changes: %+v", got)
			}
			conn, err := db.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, sql := range []string{`BEGIN`, `INSERT INTO ` + table + ` VALUES (1, 'prepared')`, `PREPARE TRANSACTION '` + gid + `'`} {
				if _, err := conn.Exec(ctx, sql); err != nil {
					conn.Release()
					t.Fatalf("%s: %v", sql, err)
				}
			}
			conn.Release()
			mustExec(t, db, `INSERT INTO `+table+` VALUES (2, 'committed')`)
			got := r.collect(1, true)
			if len(got) != 1 || got[0].After["v"] != "committed" {
				t.Fatalf("while a transaction is prepared: %+v, want only the committed insert", got)
			}
			mustExec(t, db, `COMMIT PREPARED '`+gid+`'`)
			got = r.collect(1, true)
			if len(got) != 1 || got[0].After["v"] != "prepared" {
				t.Fatalf("after COMMIT PREPARED: %+v, want the prepared insert", got)
			}

			// Rolled back: nothing.
			gid2 := gid + "-rb"
			t.Cleanup(func() { rollbackPrepared(t, db, gid2) })
			mustExec(t, db, `BEGIN; UPDATE `+table+` SET v = 'rolled back' WHERE id = 1; PREPARE TRANSACTION '`+gid2+`'`)
			mustExec(t, db, `ROLLBACK PREPARED '`+gid2+`'`)
			r.quiet()
			var left int
			if err := db.QueryRow(ctx, `SELECT count(*) FROM `+auditTable(r)).Scan(&left); err != nil {
				t.Fatal(err)
			}
			if left != 0 {
				t.Errorf("%d audit rows left after delivery", left)
			}
		})
	}

	t.Run("wakeups_default", func(t *testing.T) {
		db, table, r := oneTable(t, "twopc-notify-", `(id int PRIMARY KEY)`, connect.Config{KeyPollIntervalMS: "600000"})
		ctx := testCtx(t)
		gid := testenv.Unique("tidyconnect-test-")
		t.Cleanup(func() { rollbackPrepared(t, db, gid) })
		done := make(chan error, 1)
		pctx, cancel := context.WithCancel(ctx)
		defer func() { cancel(); <-done }()
		go func() {
			_, err := r.tasks[0].Poll(pctx)
			done <- err
		}()
		awaitWaiting(t, db, r.cfg[KeyAuditSchema], objectNames(r.name), true)
		_, err := db.Exec(ctx, `BEGIN; INSERT INTO `+table+` VALUES (1); PREPARE TRANSACTION '`+gid+`'`)
		if err == nil || !strings.Contains(err.Error(), "NOTIFY") {
			t.Fatalf("PREPARE TRANSACTION while a task waits for wake-ups: %v, want PostgreSQL's refusal of a transaction that sent a NOTIFY", err)
		}
	})
}

// rollbackPrepared rolls back the prepared transaction gid if it exists:
// left prepared, it would hold its locks after the test.
// needPreparedTransactions skips the test (fails it under
// TIDYCONNECT_TEST_REQUIRE_SERVICES) when the server allows no prepared
// transactions.
func needPreparedTransactions(t *testing.T, db *pgxpool.Pool) {
	t.Helper()
	var prepared int
	if err := db.QueryRow(testCtx(t), `SELECT current_setting('max_prepared_transactions')::int`).Scan(&prepared); err != nil {
		t.Fatal(err)
	}
	if prepared == 0 {
		testenv.Skip(t, "the server does not allow prepared transactions: set max_prepared_transactions > 0 (.ci/run does) and restart it")
	}
}

// prepareInsert prepares a transaction that inserts values into table and
// returns its gid; the end of the test rolls it back if it is still
// pending.
func prepareInsert(t *testing.T, db *pgxpool.Pool, table, values string) string {
	t.Helper()
	gid := testenv.Unique("tidyconnect-test-")
	t.Cleanup(func() { rollbackPrepared(t, db, gid) })
	mustExec(t, db, `BEGIN; INSERT INTO `+table+` VALUES `+values+`; PREPARE TRANSACTION '`+gid+`'`)
	return gid
}

func rollbackPrepared(t *testing.T, db *pgxpool.Pool, gid string) {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM pg_prepared_xacts WHERE gid = $1`, gid).Scan(&n); err != nil {
		t.Errorf("looking for prepared transaction %s: %v", gid, err)
		return
	}
	if n > 0 {
		if _, err := db.Exec(context.Background(), `ROLLBACK PREPARED '`+gid+`'`); err != nil {
			t.Errorf("rolling back prepared transaction %s: %v", gid, err)
		}
	}
}
