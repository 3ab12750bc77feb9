package pgaudit

import (
	"context"
	"fmt"
	"math/rand/v2"
	neturl "net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// snapshotRows is more than one audit row's worth (chunkChanges), so the
// snapshot is grouped.
const snapshotRows = 2500

// With snapshot.mode=initial the rows a table holds when its triggers are
// installed go out first, as 'r' records, once: a restart does not send
// them again, and a table added later by a reconfiguration is snapshotted
// alone. Statement-level, row-level and partitioned capture alike.
func TestInitialSnapshot(t *testing.T) {
	for _, tc := range []struct {
		name        string
		level       string
		partitioned bool
	}{
		{"statement level", levelStatement, false},
		{"row level", levelRow, false},
		{"partitioned", levelStatement, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, url := admin(t)
			s := newSchema(t, db)
			table := qualified(s, "t")
			if tc.partitioned {
				mustExec(t, db, `CREATE TABLE `+table+` (id int PRIMARY KEY, v text) PARTITION BY HASH (id)`)
				for i := range 2 {
					mustExec(t, db, fmt.Sprintf(`CREATE TABLE %s PARTITION OF %s FOR VALUES WITH (MODULUS 2, REMAINDER %d)`, qualified(s, fmt.Sprintf("t_%d", i)), table, i))
				}
			} else {
				mustExec(t, db, `CREATE TABLE `+table+` (id int PRIMARY KEY, v text)`)
			}
			mustExec(t, db, `INSERT INTO `+table+` SELECT g, CASE WHEN g % 7 = 0 THEN NULL ELSE 'v' || g END FROM generate_series(1, $1) g`, snapshotRows)
			cfg := baseConfig(testenv.Unique("snap-"), url, auditSchemaFor(t, db), s+".t")
			cfg[KeySnapshotMode] = snapshotInitial
			cfg[KeyCaptureLevel] = tc.level
			cfg[KeyPollMaxRecords] = "1000"
			l := connect.NewMemoryLedger()
			r := startConnector(t, cfg, l)
			t.Cleanup(func() { _ = r.stop(true) })

			seen := map[int]bool{}
			for _, c := range r.collect(snapshotRows, true) {
				id, _ := strconv.Atoi(fmt.Sprint(c.After["id"]))
				want := any("v" + strconv.Itoa(id))
				if id%7 == 0 {
					want = nil
				}
				if c.Op != "r" || c.Before != nil || c.After["v"] != want || fmt.Sprint(c.Key["id"]) != strconv.Itoa(id) || c.Source.Table != "t" {
					t.Fatalf("snapshot record: op %s key %v before %v after %v table %s", c.Op, c.Key, c.Before, c.After, c.Source.Table)
				}
				if seen[id] {
					t.Fatalf("row %d sent twice", id)
				}
				seen[id] = true
			}
			if len(seen) != snapshotRows {
				t.Fatalf("%d distinct rows in the snapshot, want %d", len(seen), snapshotRows)
			}
			mustExec(t, db, `UPDATE `+table+` SET v = 'changed' WHERE id = 1`)
			if c := r.collect(1, true)[0]; c.Op != "u" || c.After["v"] != "changed" {
				t.Errorf("after the snapshot: %s %v", c.Op, c.After)
			}
			r.quiet()

			// A restart finds the triggers: no second snapshot.
			if err := r.stop(false); err != nil {
				t.Fatal(err)
			}
			r = startConnector(t, cfg, l)
			r.quiet()

			// A table added later: its rows alone.
			mustExec(t, db, `CREATE TABLE `+qualified(s, "t2")+` (id int PRIMARY KEY)`)
			mustExec(t, db, `INSERT INTO `+qualified(s, "t2")+` VALUES (1), (2), (3)`)
			if err := r.stop(false); err != nil {
				t.Fatal(err)
			}
			cfg[KeyTables] = s + ".t," + s + ".t2"
			r = startConnector(t, cfg, l)
			for _, c := range r.collect(3, true) {
				if c.Op != "r" || c.Source.Table != "t2" {
					t.Errorf("after adding t2: %s of %s %v", c.Op, c.Source.Table, c.After)
				}
			}
			r.quiet()
		})
	}
}

// The snapshot and the changes around it are consistent while writers keep
// changing the table through the Start that installs the triggers: replayed
// in order, the records give the table's final content, and no key's
// counter ever goes back (a row sent both in the snapshot and as an earlier
// change, or neither, would show).
//
// Also when the connector's sessions default to REPEATABLE READ: a
// provisioning transaction under it would read the table with a snapshot
// from before the triggers' lock, and the writes committed in between
// would be neither captured nor in the snapshot.
func TestInitialSnapshotUnderWrites(t *testing.T) {
	for _, isolation := range []string{"", "repeatable read", "serializable"} {
		t.Run("default "+isolation, func(t *testing.T) {
			snapshotUnderWrites(t, isolation)
		})
	}
}

func snapshotUnderWrites(t *testing.T, isolation string) {
	db, url := admin(t)
	if isolation != "" {
		u, err := neturl.Parse(url)
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		q.Set("options", "-c default_transaction_isolation="+strings.ReplaceAll(isolation, " ", `\ `))
		u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20") // pgx reads + as itself
		url = u.String()
	}
	s := newSchema(t, db)
	table := qualified(s, "t")
	mustExec(t, db, `CREATE TABLE `+table+` (id int PRIMARY KEY, n int NOT NULL)`)
	const rows = 2000
	mustExec(t, db, `INSERT INTO `+table+` SELECT g, 0 FROM generate_series(1, $1) g`, rows)

	stopWriters := counterWriters(t, db, 3, 7, rows, table)
	cfg := baseConfig(testenv.Unique("snapw-"), url, auditSchemaFor(t, db), s+".t")
	cfg[KeySnapshotMode] = snapshotInitial
	cfg[KeyPollMaxRecords] = "1000"
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	t.Cleanup(func() { _ = r.stop(true) })
	// Keep writing after the Start, then stop.
	deadline := time.Now().Add(2 * time.Second)
	var got []change
	for time.Now().Before(deadline) {
		got = append(got, r.drain()...)
	}
	stopWriters()
	for {
		more := r.drain()
		if len(more) == 0 {
			break
		}
		got = append(got, more...)
	}

	replayMatches(t, db, table, got)
	t.Logf("%d records", len(got))
}

// counterWriters starts n writers that, until the returned stop, update
// the counter n of random rows 1..rows (+1), insert rows with new ids and
// delete random rows, in the given tables. stop waits for them and fails
// the test on a writer's error.
func counterWriters(t *testing.T, db *pgxpool.Pool, n int, seed uint64, rows int, tables ...string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var mu sync.Mutex
	var writeErr error
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), seed))
			next := rows + 1 + w*1_000_000
			for ctx.Err() == nil {
				table := tables[rng.IntN(len(tables))]
				var err error
				switch k := rng.IntN(10); {
				case k < 7:
					_, err = db.Exec(context.Background(), `UPDATE `+table+` SET n = n + 1 WHERE id = $1`, 1+rng.IntN(rows))
				case k < 9:
					_, err = db.Exec(context.Background(), `INSERT INTO `+table+` VALUES ($1, 0)`, next)
					next++
				default:
					_, err = db.Exec(context.Background(), `DELETE FROM `+table+` WHERE id = $1`, 1+rng.IntN(rows))
				}
				if err != nil {
					mu.Lock()
					writeErr = err
					mu.Unlock()
					return
				}
			}
		}()
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			wg.Wait()
		})
		mu.Lock()
		defer mu.Unlock()
		if writeErr != nil {
			t.Fatalf("writer: %v", writeErr)
		}
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	return stop
}

func TestSnapshotModeValidation(t *testing.T) {
	for _, tc := range []struct {
		value string
		bad   bool
	}{{"never", false}, {"initial", false}, {"incremental", false}, {"always", true}, {" ", true}} {
		cfg := connect.Config{KeyURL: "postgres://h/db", KeyTables: "t", KeyTopicPrefix: "p", KeySnapshotMode: tc.value}
		_, errs := parseSettings("c", cfg)
		if got := len(errs[KeySnapshotMode]) > 0; got != tc.bad {
			t.Errorf("snapshot.mode=%q: errors %v, want an error %v", tc.value, errs[KeySnapshotMode], tc.bad)
		}
	}
}

// A table under FORCE ROW LEVEL SECURITY shows its owner only the rows its
// policies let through: the snapshot must not leave the others out without
// a word. Start fails (nothing provisioned) unless the role bypasses row
// security, and reads every row.
// Under snapshot.mode=incremental the Start installs the triggers, and the
// task's first chunk fails the Poll with the same advice.
func TestInitialSnapshotForcedRowSecurity(t *testing.T) {
	for _, tc := range []struct {
		name      string
		force     bool // FORCE ROW LEVEL SECURITY: the policies apply to the owner
		bypassRLS bool
		fails     bool
		mode      string
	}{
		{"policies apply to the owner", true, false, true, snapshotInitial},
		{"role with BYPASSRLS", true, true, false, snapshotInitial},
		{"policies the owner bypasses", false, false, false, snapshotInitial},
		{"incremental, policies apply to the owner", true, false, true, snapshotIncremental},
		{"incremental, role with BYPASSRLS", true, true, false, snapshotIncremental},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, url := admin(t)
			ctx := testCtx(t)
			s := newSchema(t, db)
			role, rid := newRole(t, db, "pga_rls_")
			table := qualified(s, "t")
			mustExec(t, db, `CREATE TABLE `+table+` (id int PRIMARY KEY)`)
			mustExec(t, db, `INSERT INTO `+table+` SELECT generate_series(1, 10)`)
			mustExec(t, db, `GRANT USAGE ON SCHEMA `+pgx.Identifier{s}.Sanitize()+` TO `+rid)
			mustExec(t, db, `ALTER TABLE `+table+` OWNER TO `+rid)
			mustExec(t, db, `ALTER TABLE `+table+` ENABLE ROW LEVEL SECURITY`)
			if tc.force {
				mustExec(t, db, `ALTER TABLE `+table+` FORCE ROW LEVEL SECURITY`)
			}
			mustExec(t, db, `CREATE POLICY even ON `+table+` USING (id % 2 = 0)`)
			if tc.bypassRLS {
				mustExec(t, db, `ALTER ROLE `+rid+` BYPASSRLS`)
			}
			var dbName string
			if err := db.QueryRow(ctx, `SELECT current_database()`).Scan(&dbName); err != nil {
				t.Fatal(err)
			}
			mustExec(t, db, `GRANT CREATE ON DATABASE `+pgx.Identifier{dbName}.Sanitize()+` TO `+rid)
			t.Cleanup(func() { mustExec(t, db, `REVOKE CREATE ON DATABASE `+pgx.Identifier{dbName}.Sanitize()+` FROM `+rid) })
			cfg := baseConfig(testenv.Unique("snaprls-"), urlAs(t, url, role), auditSchemaFor(t, db), s+".t")
			cfg[KeySnapshotMode] = tc.mode
			r, err := tryStart(t, cfg, connect.NewMemoryLedger())
			if tc.fails && tc.mode == snapshotIncremental {
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = r.stop(true) })
				_, err := r.tasks[0].Poll(ctx)
				if err == nil || !strings.Contains(err.Error(), "row-level security") || !strings.Contains(err.Error(), "BYPASSRLS") {
					t.Fatalf("Poll: %v; want the copy to fail naming row-level security and what to do", err)
				}
				return
			}
			if tc.fails {
				if err == nil {
					_ = r.stop(true)
					t.Fatal("Start succeeded although the policies hide rows from the snapshot")
				}
				if !strings.Contains(err.Error(), "row-level security") {
					t.Errorf("Start: %v; want it to name row-level security", err)
				}
				if n := triggerCount(t, db, s, "t"); n != 0 {
					t.Errorf("%d capture triggers left by the failed Start", n)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = r.stop(true) })
			if got := r.collect(10, true); len(got) != 10 {
				t.Errorf("%d snapshot records, want 10", len(got))
			}
			r.quiet()
		})
	}
}

// A copy longer than the role's statement_timeout fails the Start, naming
// the snapshot and what to do; nothing stays installed.
//
// The copy is held up however fast the machine (holdToastIndex).
func TestInitialSnapshotStatementTimeout(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	table := qualified(s, "t")
	mustExec(t, db, `CREATE TABLE `+table+` (id int PRIMARY KEY, v text)`)
	mustExec(t, db, `ALTER TABLE `+table+` ALTER v SET STORAGE EXTERNAL`)
	mustExec(t, db, `INSERT INTO `+table+` SELECT g, repeat('x', 10000) FROM generate_series(1, 10) g`)
	defer holdToastIndex(t, db, table)()
	cfg := baseConfig(testenv.Unique("snapto-"), withStatementTimeout(t, url, "1s"), auditSchemaFor(t, db), s+".t")
	cfg[KeySnapshotMode] = snapshotInitial
	r, err := tryStart(t, cfg, connect.NewMemoryLedger())
	if err == nil {
		_ = r.stop(true)
		t.Fatal("Start succeeded although the copy takes longer than statement_timeout")
	}
	for _, want := range []string{"statement_timeout", KeySnapshotMode} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Start error lacks %q: %v", want, err)
		}
	}
	if n := triggerCount(t, db, s, "t"); n != 0 {
		t.Errorf("%d capture triggers left after the failed Start", n)
	}
}

// holdToastIndex holds the TOAST index of table (REINDEX in an open
// transaction) until release is called: a read of the table's out-of-line
// values waits for it, and nothing else does, so a snapshot copy stalls
// however fast the machine.
func holdToastIndex(t *testing.T, db *pgxpool.Pool, table string) (release func()) {
	t.Helper()
	ctx := testCtx(t)
	var toastIndex string
	if err := db.QueryRow(ctx, `SELECT i.indexrelid::regclass::text FROM pg_class c JOIN pg_index i ON i.indrelid = c.reltoastrelid WHERE c.oid = $1::regclass`, table).Scan(&toastIndex); err != nil {
		t.Fatal(err)
	}
	holder, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, `REINDEX INDEX `+toastIndex); err != nil {
		_ = holder.Rollback(context.Background())
		t.Fatal(err)
	}
	return func() { _ = holder.Rollback(context.Background()) }
}

// A Start cancelled while the snapshot copies (a REST client that stopped
// waiting) says so, instead of a bare "context canceled", and leaves
// nothing installed.
func TestInitialSnapshotCancelledStart(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	table := qualified(s, "t")
	mustExec(t, db, `CREATE TABLE `+table+` (id int PRIMARY KEY, v text)`)
	mustExec(t, db, `ALTER TABLE `+table+` ALTER v SET STORAGE EXTERNAL`)
	mustExec(t, db, `INSERT INTO `+table+` SELECT g, repeat('x', 10000) FROM generate_series(1, 1000) g`)
	release := holdToastIndex(t, db, table)
	defer release()
	cfg := baseConfig(testenv.Unique("snapcancel-"), url, auditSchemaFor(t, db), s+".t")
	cfg[KeySnapshotMode] = snapshotInitial
	name := cfg["name"]
	l := connect.NewMemoryLedger()
	ctx, cancel := context.WithCancel(connect.WithHost(testCtx(t), testHost(name, -1, l)))
	defer cancel()
	// Cancelled once the triggers' lock is granted: the copy follows it in
	// the same script, and waits for the TOAST index.
	go func() {
		for ctx.Err() == nil {
			var n int
			_ = db.QueryRow(context.Background(), `SELECT count(*) FROM pg_locks WHERE relation = $1::regclass AND mode = 'ShareRowExclusiveLock' AND granted`, table).Scan(&n)
			if n > 0 {
				cancel()
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	c := &Connector{}
	err := c.Start(ctx, cfg)
	c.Stop(false)
	_ = c.Stopped(connect.WithHost(testCtx(t), testHost(name, -1, l)))
	if err == nil {
		t.Fatal("Start succeeded although it was cancelled during the copy")
	}
	for _, want := range []string{"cancelled", KeySnapshotMode, "rolled back", "copies again"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Start error lacks %q: %v", want, err)
		}
	}
	if n := triggerCount(t, db, s, "t"); n != 0 {
		t.Errorf("%d capture triggers left after the cancelled Start", n)
	}
	if rs, err := l.List(testCtx(t)); err != nil || len(rs) != 0 {
		t.Errorf("ledger lists %v (%v) after the cancelled Start", rs, err)
	}
	// The next Start copies again, every row.
	release()
	r := startConnector(t, cfg, l)
	t.Cleanup(func() { _ = r.stop(true) })
	var copied int64
	if err := db.QueryRow(testCtx(t), `SELECT coalesce(sum(changes), 0) FROM `+qualified(cfg[KeyAuditSchema], objectNames(name).table)+` WHERE op = 'r'`).Scan(&copied); err != nil {
		t.Fatal(err)
	}
	if copied != 1000 {
		t.Errorf("the Start after the cancelled one copied %d rows, want 1000", copied)
	}
}

// A connector whose initial snapshot copies for longer than provisioning's
// 10 s lock_timeout holds pgaudit's advisory lock all that time: another
// pgaudit connector of the database started meanwhile (here one capturing a
// small table, snapshot.mode=never) waits for it and then starts, rather
// than fail on the advisory lock with "lock timeout".
//
// A's copy of two tables stalls on their held TOAST indexes
// (holdToastIndex), released one after the other: A copies for 11 s in all
// however fast the machine, while neither of its own lock waits comes near
// its lock_timeout.
func TestInitialSnapshotLongCopyOtherStart(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	var releases []func()
	for _, name := range []string{"big1", "big2"} {
		big := qualified(s, name)
		mustExec(t, db, `CREATE TABLE `+big+` (id int PRIMARY KEY, v text)`)
		mustExec(t, db, `ALTER TABLE `+big+` ALTER v SET STORAGE EXTERNAL`)
		mustExec(t, db, `INSERT INTO `+big+` SELECT g, repeat('x', 10000) FROM generate_series(1, 5) g`)
		release := holdToastIndex(t, db, big)
		defer release()
		releases = append(releases, release)
	}
	mustExec(t, db, `CREATE TABLE `+qualified(s, "small")+` (id int PRIMARY KEY)`)
	audit := auditSchemaFor(t, db)

	cfgA := baseConfig(testenv.Unique("snaplongA-"), url, audit, s+".big1", s+".big2")
	cfgA[KeySnapshotMode] = snapshotInitial
	la := connect.NewMemoryLedger()
	type result struct {
		r   *running
		err error
	}
	doneA := make(chan result, 1)
	go func() {
		r, err := tryStart(t, cfgA, la)
		doneA <- result{r, err}
	}()
	// A is in its provisioning script, holding the advisory lock, once a
	// trigger's lock is granted.
	await(t, 30*time.Second, func() (bool, string, error) {
		var n int
		err := db.QueryRow(testCtx(t), `SELECT count(*) FROM pg_locks WHERE relation = $1::regclass AND mode = 'ShareRowExclusiveLock' AND granted`, qualified(s, "big1")).Scan(&n)
		return n > 0, "connector A never locked big1", err
	})

	cfgB := baseConfig(testenv.Unique("snaplongB-"), url, audit, s+".small")
	startB := time.Now()
	doneB := make(chan result, 1)
	go func() {
		r, err := tryStart(t, cfgB, connect.NewMemoryLedger())
		doneB <- result{r, err}
	}()
	for i, after := range []time.Duration{6 * time.Second, 11 * time.Second} {
		select {
		case res := <-doneB:
			t.Fatalf("connector B's Start returned after %v, while A still copied: %v", time.Since(startB).Round(time.Millisecond), res.err)
		case res := <-doneA:
			t.Fatalf("connector A's Start returned while its copy was held: %v", res.err)
		case <-time.After(time.Until(startB.Add(after))):
		}
		releases[i]()
	}
	resA := <-doneA
	if resA.err != nil {
		t.Fatalf("connector A: %v", resA.err)
	}
	t.Cleanup(func() { _ = resA.r.stop(true) })
	resB := <-doneB
	if resB.err != nil {
		t.Fatalf("connector B, started while A copied: %v", resB.err)
	}
	rb := resB.r
	t.Cleanup(func() { _ = rb.stop(true) })
	if got := len(resA.r.collect(10, true)); got != 10 {
		t.Errorf("connector A delivered %d snapshot records, want 10", got)
	}
	mustExec(t, db, `INSERT INTO `+qualified(s, "small")+` VALUES (1)`)
	if c := rb.collect(1, true)[0]; c.Op != "c" || c.Source.Table != "small" {
		t.Errorf("connector B: %s of %s", c.Op, c.Source.Table)
	}
}
