package pgaudit

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// admin is a pool for the test's own setup and checks.
// The tasks check their tables' capture triggers at every Poll here, so
// that every test would notice a check that fails a healthy task.
func init() { captureCheckInterval = 0 }

func admin(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	url := testenv.PostgresURL(t)
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("%s: %v", testenv.PostgresEnv, err)
	}
	app := testenv.Unique("pgaudit-test-admin-")
	pc.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatalf("connecting to %s: %v", testenv.PostgresEnv, err)
	}
	t.Cleanup(func() {
		// Close waits for every acquired connection: a transaction that a
		// failed test left open would hang the test for good, and hold up
		// every logical slot the server creates meanwhile (other packages'
		// tests too). Its backend is ended instead.
		closed := make(chan struct{})
		go func() { pool.Close(); close(closed) }()
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Errorf("a connection of the test's admin pool was still in use 10 s after the test (a transaction left open?); ending its backend")
			if c, err := pgx.Connect(context.Background(), url); err == nil {
				_, _ = c.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, app)
				_ = c.Close(context.Background())
			}
		}
	})
	return pool, url
}

func mustExec(t testing.TB, db *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := db.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// newSchema creates a unique schema dropped at cleanup.
func newSchema(t testing.TB, db *pgxpool.Pool) string {
	t.Helper()
	s := testenv.Unique("pga_t_")
	mustExec(t, db, "CREATE SCHEMA "+pgx.Identifier{s}.Sanitize())
	t.Cleanup(func() { dropSchema(t, db, s) })
	return s
}

// dropSchema drops schema s, if it still exists, and what it holds,
// reporting a failure (for cleanups: a schema left behind is a failure).
func dropSchema(t testing.TB, db *pgxpool.Pool, s string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := db.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{s}.Sanitize()+" CASCADE"); err != nil {
		t.Errorf("dropping schema %s at cleanup: %v", s, err)
	}
}

// auditSchemaFor returns a unique audit schema name whose leftovers are
// dropped at cleanup (the test asserts what the connector dropped first).
func auditSchemaFor(t testing.TB, db *pgxpool.Pool) string {
	s := testenv.Unique("pga_audit_")
	t.Cleanup(func() { dropSchema(t, db, s) })
	return s
}

func baseConfig(name, url, auditSchema string, tables ...string) connect.Config {
	return connect.Config{
		"name":             name,
		"connector.class":  Class,
		KeyURL:             url,
		KeyTables:          strings.Join(tables, ","),
		KeyTopicPrefix:     "tc",
		KeyAuditSchema:     auditSchema,
		KeyPollIntervalMS:  "200",
		KeyPollMaxRecords:  "100",
		KeyCleanupOnDelete: "true",
	}
}

// testLogs is where the hosts made by testHost log (warnings and up);
// captureLogs points it at a buffer for one test.
var testLogs io.Writer = os.Stderr

// captureLogs collects what the hosts testHost makes from now on log,
// until the test ends (also copied to stderr).
func captureLogs(t testing.TB) *testenv.SyncBuffer {
	b := &testenv.SyncBuffer{}
	testLogs = io.MultiWriter(os.Stderr, b)
	t.Cleanup(func() { testLogs = os.Stderr })
	return b
}

func testHost(name string, task int, l connect.Ledger) *connect.Host {
	lg := slog.New(slog.NewTextHandler(testLogs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	return &connect.Host{Connector: name, Task: task, Logger: lg.With("connector", name, "task", task), Ledger: l, RequestTaskReconfiguration: func() {}}
}

// running is a connector and its tasks driven as the worker drives them.
type running struct {
	t      testing.TB
	name   string
	cfg    connect.Config
	ledger connect.Ledger
	conn   *Connector
	tasks  []*Task
}

func startConnector(t testing.TB, cfg connect.Config, l connect.Ledger) *running {
	t.Helper()
	r, err := tryStart(t, cfg, l)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func tryStart(t testing.TB, cfg connect.Config, l connect.Ledger) (*running, error) {
	t.Helper()
	r := &running{t: t, name: cfg["name"], cfg: cfg, ledger: l, conn: &Connector{}}
	ctx := connect.WithHost(testCtx(t), testHost(r.name, -1, l))
	if err := r.conn.Start(ctx, cfg); err != nil {
		r.conn.Stop(false)
		_ = r.conn.Stopped(ctx)
		return nil, fmt.Errorf("connector Start: %w", err)
	}
	maxTasks, _ := cfg.Int(KeyTasksMax, 1)
	tcs, err := r.conn.TaskConfigs(maxTasks)
	if err != nil {
		return nil, err
	}
	for i, tc := range tcs {
		task := &Task{}
		tctx := connect.WithHost(testCtx(t), testHost(r.name, i, l))
		if err := task.Start(tctx, tc); err != nil {
			task.Stop(false)
			_ = task.Stopped(tctx)
			r.stop(false)
			return nil, fmt.Errorf("task %d Start: %w", i, err)
		}
		r.tasks = append(r.tasks, task)
	}
	return r, nil
}

func (r *running) stop(deleted bool) error {
	var first error
	for i, task := range r.tasks {
		task.Stop(deleted)
		if err := task.Stopped(connect.WithHost(testCtx(r.t), testHost(r.name, i, r.ledger))); err != nil && first == nil {
			first = err
		}
	}
	r.tasks = nil
	r.conn.Stop(deleted)
	if err := r.conn.Stopped(connect.WithHost(testCtx(r.t), testHost(r.name, -1, r.ledger))); err != nil && first == nil {
		first = err
	}
	return first
}

// change is a decoded record.
type change struct {
	Topic  string
	Key    map[string]any
	Op     string         `json:"op"`
	Before map[string]any `json:"before"`
	After  map[string]any `json:"after"`
	Source struct {
		Connector string `json:"connector"`
		DB        string `json:"db"`
		Schema    string `json:"schema"`
		Table     string `json:"table"`
		TxID      uint64 `json:"txid"`
		Seq       int64  `json:"seq"`
	} `json:"source"`
	TsMS int64  `json:"ts_ms"`
	Raw  []byte `json:"-"` // the record value as sent
}

func decode(t testing.TB, rec connect.SourceRecord) change {
	t.Helper()
	var c change
	d := json.NewDecoder(strings.NewReader(string(rec.Value)))
	d.UseNumber()
	if err := d.Decode(&c); err != nil {
		t.Fatalf("record value %s is not the JSON envelope: %v", rec.Value, err)
	}
	c.Topic = rec.Topic
	c.Raw = rec.Value
	if rec.Key != nil {
		d := json.NewDecoder(strings.NewReader(string(rec.Key)))
		d.UseNumber()
		if err := d.Decode(&c.Key); err != nil {
			t.Fatalf("record key %s is not JSON: %v", rec.Key, err)
		}
	}
	return c
}

// collect polls every task and commits what it got (as if Kafka
// acknowledged at once) until done says it has enough, or fails at the
// deadline.
func (r *running) collect(want int, commit bool) []change {
	r.t.Helper()
	var out []change
	deadline := time.Now().Add(30 * time.Second)
	for len(out) < want {
		if time.Now().After(deadline) {
			r.t.Fatalf("collected %d of %d changes before the deadline", len(out), want)
		}
		out = append(out, r.pollAll(commit)...)
	}
	return out
}

// drain polls every task once, committing what it got.
func (r *running) drain() []change {
	r.t.Helper()
	return r.pollAll(true)
}

// pollAll polls every task once (for up to 300 ms each), committing what
// it got if commit says so.
func (r *running) pollAll(commit bool) []change {
	r.t.Helper()
	var out []change
	for _, task := range r.tasks {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		recs, err := task.Poll(ctx)
		ended := ctx.Err() != nil // not after cancel: that ends it always
		cancel()
		if err != nil && !ended {
			r.t.Fatalf("Poll: %v", err)
		}
		for _, rec := range recs {
			out = append(out, decode(r.t, rec))
		}
		if commit && len(recs) > 0 {
			if err := task.Commit(context.Background(), recs); err != nil {
				r.t.Fatalf("Commit: %v", err)
			}
		}
	}
	return out
}

// quiet asserts that no further change arrives for a while.
func (r *running) quiet() {
	r.t.Helper()
	for _, task := range r.tasks {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		recs, err := task.Poll(ctx)
		ended := ctx.Err() != nil
		cancel()
		if err != nil && !ended {
			r.t.Fatalf("Poll: %v", err)
		}
		if len(recs) > 0 {
			r.t.Fatalf("unexpected extra change(s): %s", recs[0].Value)
		}
	}
}

// connections counts the connector's backends in pg_stat_activity.
func connections(ctx context.Context, db *pgxpool.Pool, name string) (int, error) {
	var n int
	err := db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE starts_with(application_name, $1)`, ApplicationNamePrefix(name)).Scan(&n)
	return n, err
}

// relExists reports whether schema.name exists.
func relExists(t testing.TB, db *pgxpool.Pool, schema, name string) bool {
	t.Helper()
	var ok bool
	if err := db.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2)`, schema, name).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

func triggerCount(t testing.TB, db *pgxpool.Pool, schema, table string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2 AND NOT g.tgisinternal`, schema, table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func qualified(schema, table string) string { return pgx.Identifier{schema, table}.Sanitize() }

// await polls cond every 20 ms until it holds, failing the test with what
// at the deadline or on an error.
func await(t testing.TB, within time.Duration, cond func() (ok bool, what string, err error)) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ok, what, err := cond()
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// newRole creates a LOGIN role named prefix plus a unique suffix, dropped
// (with what it owns) when the test ends; it returns the name and the
// quoted name.
// urlAs is url with role as its user; a test that cannot derive one (a URL
// not naming the user postgres) skips, saying why.
func urlAs(t testing.TB, url, role string) string {
	t.Helper()
	u := strings.Replace(url, "postgres@", role+"@", 1)
	if u == url {
		testenv.Skip(t, "cannot derive a URL for role %s from %s", role, testenv.PostgresEnv)
	}
	return u
}

func newRole(t testing.TB, db *pgxpool.Pool, prefix string) (name, quoted string) {
	t.Helper()
	name = testenv.Unique(prefix)
	quoted = pgx.Identifier{name}.Sanitize()
	mustExec(t, db, `CREATE ROLE `+quoted+` LOGIN`)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// DROP OWNED BY fails for a role that no longer exists (a test may
		// have dropped it): only a role still there is cleaned up.
		var exists bool
		if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)`, name).Scan(&exists); err != nil {
			t.Errorf("looking up role %s at cleanup: %v", name, err)
			return
		}
		if !exists {
			return
		}
		if _, err := db.Exec(ctx, `DROP OWNED BY `+quoted); err != nil {
			t.Errorf("dropping what role %s owns at cleanup: %v", name, err)
		}
		if _, err := db.Exec(ctx, `DROP ROLE IF EXISTS `+quoted); err != nil {
			t.Errorf("dropping role %s at cleanup: %v", name, err)
		}
	})
	return name, quoted
}

// functionsOf counts the functions whose names start with the connector's
// base name.
func functionsOf(t testing.TB, db *pgxpool.Pool, connector string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM pg_proc WHERE starts_with(proname::text, $1)`, objectNames(connector).base).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// override sets *p to v for the test (a package variable tests shrink).
func override[T any](t testing.TB, p *T, v T) {
	old := *p
	*p = v
	t.Cleanup(func() { *p = old })
}

// oneTable creates table t with the given columns in a fresh schema and
// starts a connector capturing it, deleted at the end of the test; set
// adds or replaces configuration keys.
func oneTable(t testing.TB, prefix, columns string, set ...connect.Config) (db *pgxpool.Pool, table string, r *running) {
	t.Helper()
	db, url := admin(t)
	s := newSchema(t, db)
	table = qualified(s, "t")
	mustExec(t, db, `CREATE TABLE `+table+` `+columns)
	cfg := baseConfig(testenv.Unique(prefix), url, auditSchemaFor(t, db), s+".t")
	for _, c := range set {
		maps.Copy(cfg, c)
	}
	r = startConnector(t, cfg, connect.NewMemoryLedger())
	t.Cleanup(func() { _ = r.stop(true) })
	return db, table, r
}

// testDB is the name of the database the tests run in (the one
// TIDYCONNECT_TEST_POSTGRES_URL names).
func testDB(t testing.TB, db *pgxpool.Pool) string {
	t.Helper()
	var name string
	if err := db.QueryRow(testCtx(t), `SELECT current_database()`).Scan(&name); err != nil {
		t.Fatal(err)
	}
	return name
}

// int64s runs a query of one bigint column and returns its values.
func int64s(t testing.TB, db *pgxpool.Pool, sql string, args ...any) []int64 {
	t.Helper()
	rows, err := db.Query(testCtx(t), sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// restartTask stops the connector's only task as a restart does
// (Stop(false), Stopped) and starts a new one with the connector's task
// config: what the old one polled and did not commit is read again.
func (r *running) restartTask() {
	r.t.Helper()
	old := r.tasks[0]
	old.Stop(false)
	if err := old.Stopped(connect.WithHost(testCtx(r.t), testHost(r.name, 0, r.ledger))); err != nil {
		r.t.Fatal(err)
	}
	tcs, err := r.conn.TaskConfigs(1)
	if err != nil {
		r.t.Fatal(err)
	}
	r.tasks[0] = &Task{}
	if err := r.tasks[0].Start(connect.WithHost(testCtx(r.t), testHost(r.name, 0, r.ledger)), tcs[0]); err != nil {
		r.t.Fatal(err)
	}
}

// pollUncommitted polls the connector's only task until it returned at
// least want records (failing after 10 s), and commits none of them.
func (r *running) pollUncommitted(want int) []connect.SourceRecord {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(testCtx(r.t), 10*time.Second)
	defer cancel()
	var recs []connect.SourceRecord
	for len(recs) < want {
		got, err := r.tasks[0].Poll(ctx)
		if err != nil {
			r.t.Fatalf("Poll: %v (after %d records)", err, len(recs))
		}
		recs = append(recs, got...)
	}
	return recs
}

// connectorWithoutTasks starts a connector on a new one-column table and
// stops its tasks, so that only task instances a test starts itself (from
// the returned task configs) hold connections.
func connectorWithoutTasks(t *testing.T, prefix string) (*pgxpool.Pool, *running, []connect.Config) {
	t.Helper()
	db, url := admin(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "t")+` (id int PRIMARY KEY)`)
	r := startConnector(t, baseConfig(testenv.Unique(prefix), url, auditSchemaFor(t, db), s+".t"), connect.NewMemoryLedger())
	t.Cleanup(func() { _ = r.stop(true) })
	tcs, err := r.conn.TaskConfigs(1)
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range r.tasks {
		task.Stop(false)
		if err := task.Stopped(testCtx(t)); err != nil {
			t.Fatal(err)
		}
	}
	r.tasks = nil
	return db, r, tcs
}
