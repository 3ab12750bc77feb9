package pgaudit

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// jsonOf normalizes a Go value to what json.Decoder with UseNumber yields.
func jsonOf(t testing.TB, v string) any {
	t.Helper()
	var out any
	d := json.NewDecoder(strings.NewReader(v))
	d.UseNumber()
	if err := d.Decode(&out); err != nil {
		t.Fatalf("%s: %v", v, err)
	}
	return out
}

// TestCaptureColumnTypes: every change of a plain table comes out with its
// values, under both capture levels (statement- and row-level triggers).
func TestCaptureColumnTypes(t *testing.T) {
	for _, level := range []string{levelStatement, levelRow} {
		t.Run(level, func(t *testing.T) { captureColumnTypes(t, level) })
	}
}

func captureColumnTypes(t *testing.T, level string) {
	db, url := admin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "typed")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY, t text, n numeric(12,3), ts timestamptz, j jsonb, b bytea, a int[], z text)`)
	cfg := baseConfig(testenv.Unique("types-"), url, auditSchemaFor(t, db), s+".typed")
	cfg[KeyCaptureLevel] = level
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	wantTriggers := map[string][]string{
		levelStatement: {"typed <base>_del false", "typed <base>_ins false", "typed <base>_trunc false", "typed <base>_upd false"},
		levelRow:       {"typed !<base>_row false", "typed <base>_trunc false"},
	}[level]
	if tr := captureTriggersIn(t, testCtx(t), db, r.name, s); !reflect.DeepEqual(tr, wantTriggers) {
		t.Errorf("triggers %v, want %v", tr, wantTriggers)
	}
	defer func() {
		if err := r.stop(true); err != nil {
			t.Error(err)
		}
	}()

	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (1, 'héllo "q"', 1234.5, '2026-01-02 03:04:05+00', '{"k":[1,true,null]}', '\xdeadbeef', '{1,2,NULL}', NULL)`)
	mustExec(t, db, `UPDATE `+tbl+` SET t = NULL, n = -0.001, a = '{}' WHERE id = 1`)
	mustExec(t, db, `DELETE FROM `+tbl+` WHERE id = 1`)
	mustExec(t, db, `INSERT INTO `+tbl+` (id) VALUES (2)`)
	mustExec(t, db, `TRUNCATE `+tbl)

	got := r.collect(5, true)
	r.quiet()

	full := `{"id":1,"t":"héllo \"q\"","n":1234.500,"ts":"2026-01-02T03:04:05+00:00","j":{"k":[1,true,null]},"b":"\\xdeadbeef","a":[1,2,null],"z":null}`
	updated := `{"id":1,"t":null,"n":-0.001,"ts":"2026-01-02T03:04:05+00:00","j":{"k":[1,true,null]},"b":"\\xdeadbeef","a":[],"z":null}`
	tests := []struct {
		op            string
		key           string
		before, after string
	}{
		{"c", `{"id":1}`, "null", full},
		{"u", `{"id":1}`, full, updated},
		{"d", `{"id":1}`, updated, "null"},
		{"c", `{"id":2}`, "null", `{"id":2,"t":null,"n":null,"ts":null,"j":null,"b":null,"a":null,"z":null}`},
		{"t", "null", "null", "null"},
	}
	var lastSeq int64
	for i, tt := range tests {
		c := got[i]
		if c.Op != tt.op {
			t.Errorf("change %d: op %q, want %q", i, c.Op, tt.op)
		}
		if k := jsonOf(t, tt.key); !reflect.DeepEqual(anyMap(c.Key), k) {
			t.Errorf("change %d: key %v, want %v", i, c.Key, k)
		}
		if b := jsonOf(t, tt.before); !reflect.DeepEqual(anyMap(c.Before), b) {
			t.Errorf("change %d (%s): before\n got %v\nwant %v", i, tt.op, c.Before, b)
		}
		if a := jsonOf(t, tt.after); !reflect.DeepEqual(anyMap(c.After), a) {
			t.Errorf("change %d (%s): after\n got %v\nwant %v", i, tt.op, c.After, a)
		}
		if c.Topic != "tc."+s+".typed" || c.Source.Schema != s || c.Source.Table != "typed" || c.Source.Connector != r.name || c.Source.DB != testDB(t, db) {
			t.Errorf("change %d: topic %q source %+v", i, c.Topic, c.Source)
		}
		if c.Source.TxID == 0 || c.TsMS == 0 || c.Source.Seq <= lastSeq {
			t.Errorf("change %d: txid %d ts_ms %d seq %d (previous seq %d)", i, c.Source.TxID, c.TsMS, c.Source.Seq, lastSeq)
		}
		lastSeq = c.Source.Seq
	}
	// Delivered rows are purged.
	var left int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM `+qualified(r.cfg[KeyAuditSchema], objectNames(r.name).table)).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d delivered rows left in the audit table", left)
	}
}

// anyMap returns m as any, with a nil map as nil (JSON null).
func anyMap(m map[string]any) any {
	if m == nil {
		return nil
	}
	return any(m)
}

// TestUpdatePairing: a bulk UPDATE that shifts primary keys pairs every
// before image with its own after image, and a table without a primary key
// gets null keys.
func TestUpdatePairing(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "k")+` (id int PRIMARY KEY DEFERRABLE INITIALLY DEFERRED, v int)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "nokey")+` (v int, w text)`)
	mustExec(t, db, `INSERT INTO `+qualified(s, "k")+` SELECT g, g * 10 FROM generate_series(1, 50) g`)
	mustExec(t, db, `INSERT INTO `+qualified(s, "nokey")+` SELECT g, 'x' || g FROM generate_series(1, 50) g`)
	r := startConnector(t, baseConfig(testenv.Unique("pair-"), url, auditSchemaFor(t, db), s+".k", s+".nokey"), connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()

	mustExec(t, db, `UPDATE `+qualified(s, "k")+` SET id = id + 1`) // the classic trap for pairing by key
	mustExec(t, db, `UPDATE `+qualified(s, "nokey")+` SET v = v * 2`)
	got := r.collect(100, true)
	for _, c := range got {
		if c.Op != "u" {
			t.Fatalf("op %q", c.Op)
		}
		b, _ := c.Before["v"].(json.Number).Int64()
		a, _ := c.After["v"].(json.Number).Int64()
		switch c.Source.Table {
		case "k":
			bid, _ := c.Before["id"].(json.Number).Int64()
			aid, _ := c.After["id"].(json.Number).Int64()
			if aid != bid+1 || a != b || b != bid*10 {
				t.Errorf("mispaired update: before %v after %v", c.Before, c.After)
			}
			if kid, _ := c.Key["id"].(json.Number).Int64(); kid != aid {
				t.Errorf("key %v, want the new primary key %d", c.Key, aid)
			}
		case "nokey":
			if a != 2*b || c.Before["w"] != c.After["w"] || c.Key != nil {
				t.Errorf("mispaired update without a key: before %v after %v key %v", c.Before, c.After, c.Key)
			}
		}
	}
}

// TestOutOfOrderCommit: a transaction that wrote first (lower audit ids
// when it wrote) commits after a later one, which was already delivered;
// nothing is skipped, in either capture order.
func TestOutOfOrderCommit(t *testing.T) {
	for _, order := range []string{orderCommit, orderStatement} {
		t.Run(order, func(t *testing.T) { outOfOrderCommit(t, order) })
	}
}

func outOfOrderCommit(t *testing.T, order string) {
	db, url := admin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "events")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY, who text)`)
	cfg := baseConfig(testenv.Unique("ooo-"), url, auditSchemaFor(t, db), s+".events")
	cfg[KeyCaptureOrder] = order
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()
	ctx := testCtx(t)

	early, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = early.Rollback(ctx) }()
	if _, err := early.Exec(ctx, `INSERT INTO `+tbl+` SELECT g, 'early' FROM generate_series(1, 5) g`); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `INSERT INTO `+tbl+` SELECT g, 'late' FROM generate_series(6, 10) g`) // commits first
	first := r.collect(5, true)
	for _, c := range first {
		if c.After["who"] != "late" {
			t.Fatalf("got %v before the early transaction committed", c.After)
		}
	}
	if err := early.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	second := r.collect(5, true)
	ids := []int64{}
	for _, c := range append(first, second...) {
		id, _ := c.After["id"].(json.Number).Int64()
		ids = append(ids, id)
	}
	slices.Sort(ids)
	if want := []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}; !slices.Equal(ids, want) {
		t.Fatalf("captured ids %v, want %v", ids, want)
	}
	r.quiet()
}

// TestRestartResumes: Stop(false) in the middle of a stream keeps the
// triggers and the undelivered rows; the next instance delivers them.
func TestRestartResumes(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "stream")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY)`)
	ledger := connect.NewMemoryLedger()
	cfg := baseConfig(testenv.Unique("restart-"), url, auditSchemaFor(t, db), s+".stream")
	cfg[KeyPollMaxRecords] = "30"
	r := startConnector(t, cfg, ledger)
	mustExec(t, db, `INSERT INTO `+tbl+` SELECT g FROM generate_series(1, 100) g`)
	acked := r.collect(30, true)
	// One more batch is polled but never acknowledged: Kafka did not ack it.
	ctx, cancel := context.WithTimeout(context.Background(), 5e9)
	unacked, err := r.tasks[0].Poll(ctx)
	cancel()
	if err != nil || len(unacked) == 0 {
		t.Fatalf("Poll: %d records, %v", len(unacked), err)
	}
	if err := r.stop(false); err != nil {
		t.Fatal(err)
	}
	if n := triggerCount(t, db, s, "stream"); n != 4 {
		t.Fatalf("%d triggers after a plain stop, want 4", n)
	}
	mustExec(t, db, `INSERT INTO `+tbl+` SELECT g FROM generate_series(101, 120) g`) // while stopped
	r2 := startConnector(t, cfg, ledger)
	defer func() { _ = r2.stop(true) }()
	rest := r2.collect(90, true)
	r2.quiet()
	seen := map[int64]int{}
	for _, c := range append(acked, rest...) {
		id, _ := c.After["id"].(json.Number).Int64()
		seen[id]++
	}
	for id := int64(1); id <= 120; id++ {
		if seen[id] != 1 {
			t.Errorf("id %d delivered %d times", id, seen[id])
		}
	}
}

// TestTwoTasks: with tasks.max=2 each task reads only its own tables.
func TestTwoTasks(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "one")+` (id int PRIMARY KEY)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "two")+` (id int PRIMARY KEY)`)
	cfg := baseConfig(testenv.Unique("two-"), url, auditSchemaFor(t, db), s+".one", s+".two")
	cfg[KeyTasksMax] = "2"
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()
	if len(r.tasks) != 2 {
		t.Fatalf("%d tasks, want 2", len(r.tasks))
	}
	mustExec(t, db, `INSERT INTO `+qualified(s, "one")+` SELECT g FROM generate_series(1, 30) g`)
	mustExec(t, db, `INSERT INTO `+qualified(s, "two")+` SELECT g FROM generate_series(1, 20) g`)
	for i, want := range []struct {
		table string
		n     int
	}{{"one", 30}, {"two", 20}} {
		single := &running{t: t, name: r.name, tasks: []*Task{r.tasks[i]}}
		for _, c := range single.collect(want.n, true) {
			if c.Source.Table != want.table {
				t.Errorf("task %d got a change of %s, want only %s", i, c.Source.Table, want.table)
			}
		}
		single.quiet()
	}
}

// TestLateCommitsWhileInFlight: changes committed late, with ids below and
// between the ids of batches still waiting for Kafka, are read while those
// batches are in flight, and nothing in flight is read twice.
func TestLateCommitsWhileInFlight(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "late")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY)`)
	// Under statement order late commits keep their low ids, which is what
	// the reads around in-flight ids exist for; under commit order they
	// get ids above everything committed before.
	cfg := baseConfig(testenv.Unique("late-"), url, auditSchemaFor(t, db), s+".late")
	cfg[KeyCaptureOrder] = orderStatement
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()
	ctx := testCtx(t)
	open := func(id int) pgx.Tx {
		tx, err := db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		if _, err := tx.Exec(ctx, `INSERT INTO `+tbl+` VALUES ($1)`, id); err != nil {
			t.Fatal(err)
		}
		return tx
	}
	a := open(1) // lowest audit id, commits last
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (2)`)
	c := open(3) // an id between two in-flight ones
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (4)`)

	task := r.tasks[0]
	poll := func(want ...int64) []connect.SourceRecord {
		t.Helper()
		var got []int64
		var recs []connect.SourceRecord
		deadline := time.Now().Add(30 * time.Second)
		for len(got) < len(want) && time.Now().Before(deadline) {
			pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			batch, _ := task.Poll(pctx)
			cancel()
			for _, rec := range batch {
				var k struct{ ID int64 }
				if err := json.Unmarshal(rec.Key, &k); err != nil {
					t.Fatal(err)
				}
				got = append(got, k.ID)
			}
			recs = append(recs, batch...)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("polled rows %v, want %v", got, want)
		}
		return recs
	}
	inflight := poll(2, 4) // not committed: stays in flight, with a gap at 3
	if err := c.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	inflight = append(inflight, poll(3)...) // between in-flight ids
	if err := a.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	inflight = append(inflight, poll(1)...) // below them
	if err := task.Commit(ctx, inflight); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (5)`)
	poll(5)
	r.quiet()
}

// TestColumnNamedLikeTheDecoder: a table with a column called x (the
// alias the task's decoding query gives each row) still comes out whole,
// not as that column's value.
func TestColumnNamedLikeTheDecoder(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "xs")+` (id int PRIMARY KEY, x text)`)
	r := startConnector(t, baseConfig(testenv.Unique("xcol-"), url, auditSchemaFor(t, db), s+".xs"), connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()
	mustExec(t, db, `INSERT INTO `+qualified(s, "xs")+` VALUES (1, 'pre')`)
	checkChanges(t, r.collect(1, true), "tc."+s+".xs", s, "xs", []wantChange{
		{"c", `{"id":1}`, "null", `{"id":1,"x":"pre"}`},
	})
}

// TestDecodeInBatches: a table's images are decoded in statements of
// bounded size (a protocol message cannot exceed 1 GB); with a bound of a
// few images, single and grouped changes still come out whole and in order.
func TestDecodeInBatches(t *testing.T) {
	override(t, &decodeBatchBytes, 100)
	db, tbl, r := oneTable(t, "batches-", `(id int PRIMARY KEY, v text)`)
	const n = singleChanges + 40
	mustExec(t, db, fmt.Sprintf(`INSERT INTO %s SELECT g, pg_catalog.repeat('v', g) FROM generate_series(1, %d) g`, tbl, n))
	mustExec(t, db, `UPDATE `+tbl+` SET v = 'w' WHERE id = 7`)
	got := r.collect(n+1, true)
	if len(got) != n+1 {
		t.Fatalf("%d changes, want %d", len(got), n+1)
	}
	for i, c := range got[:n] {
		if c.Op != "c" || c.After["id"] != json.Number(fmt.Sprint(i+1)) || c.After["v"] != strings.Repeat("v", i+1) {
			t.Fatalf("change %d: %+v", i, c)
		}
	}
	if u := got[n]; u.Op != "u" || u.Before["v"] != "vvvvvvv" || u.After["v"] != "w" {
		t.Errorf("update: %+v", u)
	}
}

// TestPollReadsBoundedBytes: one Poll reads about readBatchBytes of images
// however many changes poll.max.records allows, and at least one row.
func TestPollReadsBoundedBytes(t *testing.T) {
	override(t, &readBatchBytes, 150)
	db, tbl, r := oneTable(t, "bytes-", `(id int PRIMARY KEY, v text)`)
	mustExec(t, db, `INSERT INTO `+tbl+` SELECT g, pg_catalog.repeat('v', 200) FROM generate_series(1, 3) g`)
	var first []connect.SourceRecord
	await(t, 10*time.Second, func() (bool, string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		recs, err := r.tasks[0].Poll(ctx)
		if ctx.Err() != nil {
			err = nil
		}
		first = recs
		return len(recs) > 0, "a poll with records", err
	})
	if len(first) != 1 {
		t.Fatalf("the first poll read %d changes of 200-byte rows, want 1 with a 150-byte budget", len(first))
	}
	if err := r.tasks[0].Commit(context.Background(), first); err != nil {
		t.Fatal(err)
	}
	rest := r.collect(2, true)
	if ids := append(keyIDs(t, []change{decode(t, first[0])}), keyIDs(t, rest)...); !slices.Equal(ids, []int64{1, 2, 3}) {
		t.Errorf("delivered ids %v", ids)
	}
}

// TestPrimaryKeyChangesReachTheKeys: the key follows the table's primary
// key as it changes while the task runs. A renamed key column is noticed
// at once (the images lack the column the key names); a key added to a
// table without one within metaRefresh.
func TestPrimaryKeyChangesReachTheKeys(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "renamed")+` (id int PRIMARY KEY, v text)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "keyless")+` (id int NOT NULL, v text)`)
	r := startConnector(t, baseConfig(testenv.Unique("pk-"), url, auditSchemaFor(t, db), s+".renamed", s+".keyless"), connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()

	mustExec(t, db, `INSERT INTO `+qualified(s, "renamed")+` VALUES (1, 'a')`)
	mustExec(t, db, `INSERT INTO `+qualified(s, "keyless")+` VALUES (1, 'a')`)
	got := r.collect(2, true)
	if string(mustJSON(t, got[0].Key)) != `{"id":1}` || got[1].Key != nil {
		t.Fatalf("keys before the changes: %v, %v", got[0].Key, got[1].Key)
	}

	mustExec(t, db, `ALTER TABLE `+qualified(s, "renamed")+` RENAME COLUMN id TO pid`)
	mustExec(t, db, `INSERT INTO `+qualified(s, "renamed")+` VALUES (2, 'b')`)
	if got := r.collect(1, true); string(mustJSON(t, got[0].Key)) != `{"pid":2}` {
		t.Errorf("key after the key column's rename: %s", mustJSON(t, got[0].Key))
	}

	override(t, &metaRefresh, 0)
	mustExec(t, db, `ALTER TABLE `+qualified(s, "keyless")+` ADD PRIMARY KEY (id)`)
	mustExec(t, db, `INSERT INTO `+qualified(s, "keyless")+` VALUES (2, 'b')`)
	if got := r.collect(1, true); string(mustJSON(t, got[0].Key)) != `{"id":2}` {
		t.Errorf("key after a primary key was added: %s", mustJSON(t, got[0].Key))
	}
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestKeysOfATableRenamedWhileRunning: a captured table renamed while the
// task runs keeps sending its changes, keyed as before, also after the
// task reads its tables' keys again (the configured name is then gone).
func TestKeysOfATableRenamedWhileRunning(t *testing.T) {
	override(t, &metaRefresh, 0)
	db, url := admin(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "a")+` (id int PRIMARY KEY, v text)`)
	r := startConnector(t, baseConfig(testenv.Unique("renamedkeys-"), url, auditSchemaFor(t, db), s+".a"), connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()
	mustExec(t, db, `INSERT INTO `+qualified(s, "a")+` VALUES (1, 'a')`)
	r.collect(1, true)
	mustExec(t, db, `ALTER TABLE `+qualified(s, "a")+` RENAME TO a2`)
	for id := 2; id <= 3; id++ {
		mustExec(t, db, `INSERT INTO `+qualified(s, "a2")+` VALUES ($1, 'b')`, id)
		got := r.collect(1, true)
		if want := fmt.Sprintf(`{"id":%d}`, id); string(mustJSON(t, got[0].Key)) != want || got[0].Topic != "tc."+s+".a" {
			t.Errorf("after the rename: topic %s key %s, want %s", got[0].Topic, mustJSON(t, got[0].Key), want)
		}
	}
}

// TestPollInterruptedWhileDecodingDelivers: a Poll whose context is
// cancelled while it decodes a batch (the worker interrupts a Poll once an
// ack arrives) still returns the batch rather than dropping the work, which
// a batch of large rows could otherwise never finish.
func TestPollInterruptedWhileDecodingDelivers(t *testing.T) {
	override(t, &decodeBatchBytes, 1) // one statement per image: a slow decode
	const rows = 3000
	db, url := admin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "t")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY, v text)`)
	cfg := baseConfig(testenv.Unique("interrupted-"), url, auditSchemaFor(t, db), s+".t")
	cfg[KeyPollMaxRecords] = fmt.Sprint(rows)
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()
	mustExec(t, db, fmt.Sprintf(`INSERT INTO %s SELECT g, 'v' FROM generate_series(1, %d) g`, tbl, rows))
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	type result struct {
		recs []connect.SourceRecord
		err  error
	}
	done := make(chan result, 1)
	go func() {
		recs, err := r.tasks[0].Poll(ctx)
		done <- result{recs, err}
	}()
	// Cancel once the task is decoding: its session's latest statement is
	// a decoding one (active or between two of them).
	await(t, 10*time.Second, func() (bool, string, error) {
		var n int
		err := db.QueryRow(testCtx(t), `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query LIKE '%to_json%'`,
			ApplicationName(r.name, "task-0")).Scan(&n)
		return n > 0, "the task decoding images", err
	})
	cancel()
	res := <-done
	if res.err != nil || len(res.recs) == 0 {
		t.Fatalf("Poll interrupted while decoding: %d records, %v", len(res.recs), res.err)
	}
	if err := r.tasks[0].Commit(context.Background(), res.recs); err != nil {
		t.Fatal(err)
	}
	if len(res.recs) < rows {
		if rest := r.collect(rows-len(res.recs), true); len(rest)+len(res.recs) != rows {
			t.Errorf("%d + %d changes, want %d", len(res.recs), len(rest), rows)
		}
	}
}
