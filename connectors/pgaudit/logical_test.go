package pgaudit

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// logicalConfig is a capture.method=logical configuration.
func logicalConfig(name, url string, tables ...string) connect.Config {
	cfg := baseConfig(name, url, "", tables...)
	delete(cfg, KeyAuditSchema)
	cfg[KeyCaptureMethod] = methodLogical
	return cfg
}

// logicalAdmin is admin for tests of capture.method=logical: the server
// must run with wal_level=logical.
func logicalAdmin(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	db, url := admin(t)
	var level string
	if err := db.QueryRow(testCtx(t), `SHOW wal_level`).Scan(&level); err != nil {
		t.Fatal(err)
	}
	if level != "logical" {
		testenv.Skip(t, "the server runs with wal_level=%s; capture.method=logical needs wal_level=logical (ALTER SYSTEM SET wal_level = logical, then restart PostgreSQL; .ci/run does)", level)
	}
	return db, url
}

// slotAndPublication reports whether the connector's slot and publication
// exist.
func slotAndPublication(t testing.TB, db *pgxpool.Pool, connector string) (slot, pub bool) {
	t.Helper()
	p, s := logicalNames(connector)
	if err := db.QueryRow(testCtx(t), `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1),
       EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $2)`, s, p).Scan(&slot, &pub); err != nil {
		t.Fatal(err)
	}
	return slot, pub
}

// dropSlotAfter drops the connector's slot at the end of the test if a
// failed test left it (a slot retains WAL for good).
func dropSlotAfter(t testing.TB, db *pgxpool.Pool, connector string) {
	_, slot := logicalNames(connector)
	t.Cleanup(func() {
		_, _ = db.Exec(context.Background(), `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, slot)
		for range 50 {
			if _, err := db.Exec(context.Background(), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		p, _ := logicalNames(connector)
		_, _ = db.Exec(context.Background(), `DROP PUBLICATION IF EXISTS `+pgx.Identifier{p}.Sanitize())
	})
}

// TestLogicalCaptureColumnTypes: under logical decoding every change comes
// out as the trigger method sends it (the same values for every type,
// the same envelope), with the full before image of a table with
// REPLICA IDENTITY FULL.
func TestLogicalCaptureColumnTypes(t *testing.T) {
	db, url := logicalAdmin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "typed")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY, t text, n numeric(12,3), ts timestamptz, j jsonb, b bytea, a int[], z text, f float8, iv interval)`)
	mustExec(t, db, `ALTER TABLE `+tbl+` REPLICA IDENTITY FULL`)
	// inet is rendered by the server (the task renders only types it
	// knows), with the rest of the image.
	mustExec(t, db, `CREATE TABLE `+qualified(s, "net")+` (id int PRIMARY KEY, ip inet, tags text[])`)
	name := testenv.Unique("logical-types-")
	dropSlotAfter(t, db, name)
	l := connect.NewMemoryLedger()
	r := startConnector(t, logicalConfig(name, url, s+".typed", s+".net"), l)
	defer func() {
		if err := r.stop(true); err != nil {
			t.Error(err)
		}
	}()
	if len(r.tasks) != 1 {
		t.Fatalf("%d tasks, want 1", len(r.tasks))
	}
	owned, err := l.List(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, res := range owned {
		kinds = append(kinds, res.Kind)
	}
	slices.Sort(kinds)
	if want := []string{KindPublication, KindReplicationSlot}; !reflect.DeepEqual(kinds, want) {
		t.Errorf("ledger kinds %v, want %v", kinds, want)
	}

	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (1, 'héllo "q"', 1234.5, '2026-01-02 03:04:05+00', '{"k":[1,true,null]}', '\xdeadbeef', '{1,2,NULL}', NULL, 0.1, '1 day 02:03:04')`)
	mustExec(t, db, `UPDATE `+tbl+` SET t = NULL, n = -0.001, a = '{}' WHERE id = 1`)
	mustExec(t, db, `DELETE FROM `+tbl+` WHERE id = 1`)
	mustExec(t, db, `INSERT INTO `+tbl+` (id) VALUES (2)`)
	mustExec(t, db, `TRUNCATE `+tbl)

	got := r.collect(5, true)
	r.quiet()

	full := `{"id":1,"t":"héllo \"q\"","n":1234.500,"ts":"2026-01-02T03:04:05+00:00","j":{"k":[1,true,null]},"b":"\\xdeadbeef","a":[1,2,null],"z":null,"f":0.1,"iv":"1 day 02:03:04"}`
	updated := `{"id":1,"t":null,"n":-0.001,"ts":"2026-01-02T03:04:05+00:00","j":{"k":[1,true,null]},"b":"\\xdeadbeef","a":[],"z":null,"f":0.1,"iv":"1 day 02:03:04"}`
	tests := []struct {
		op            string
		key           string
		before, after string
	}{
		{"c", `{"id":1}`, "null", full},
		{"u", `{"id":1}`, full, updated},
		{"d", `{"id":1}`, updated, "null"},
		{"c", `{"id":2}`, "null", `{"id":2,"t":null,"n":null,"ts":null,"j":null,"b":null,"a":null,"z":null,"f":null,"iv":null}`},
		{"t", "null", "null", "null"},
	}
	var txids []uint64
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
		if c.Source.TxID == 0 || c.TsMS == 0 || c.Source.Seq != 0 {
			t.Errorf("change %d: txid %d ts_ms %d seq %d (one change per transaction: seq 0)", i, c.Source.TxID, c.TsMS, c.Source.Seq)
		}
		if slices.Contains(txids, c.Source.TxID) {
			t.Errorf("change %d: txid %d repeats", i, c.Source.TxID)
		}
		txids = append(txids, c.Source.TxID)
	}
	// The txid is pg_current_xact_id's (64 bits), as under triggers.
	var next uint64
	if err := db.QueryRow(testCtx(t), `SELECT pg_snapshot_xmax(pg_current_snapshot())::text::int8`).Scan(&next); err != nil {
		t.Fatal(err)
	}
	if last := txids[len(txids)-1]; last >= next || next-last > 1000 {
		t.Errorf("last txid %d, next transaction id %d", last, next)
	}
	if slot, pub := slotAndPublication(t, db, r.name); !slot || !pub {
		t.Errorf("slot %v publication %v while running", slot, pub)
	}

	mustExec(t, db, `INSERT INTO `+qualified(s, "net")+` VALUES (7, '10.0.0.1', '{a,"b c"}')`)
	got = r.collect(1, true)
	if want := jsonOf(t, `{"id":7,"ip":"10.0.0.1","tags":["a","b c"]}`); !reflect.DeepEqual(anyMap(got[0].After), want) || got[0].Topic != "tc."+s+".net" {
		t.Errorf("server-rendered change on %s: %v, want %v", got[0].Topic, got[0].After, want)
	}
}

// TestLogicalCommitOrderAndRestart: transactions leave in the order they
// committed, whatever their ids; a restart resumes after what Kafka
// acknowledged and sends again what it did not, also changes made while
// the connector was stopped; the slot then waits for nobody.
func TestLogicalCommitOrderAndRestart(t *testing.T) {
	db, url := logicalAdmin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "o")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY, v text)`)
	name := testenv.Unique("logical-order-")
	dropSlotAfter(t, db, name)
	l := connect.NewMemoryLedger()
	cfg := logicalConfig(name, url, s+".o")
	r := startConnector(t, cfg, l)

	ctx := testCtx(t)
	early, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := early.Exec(ctx, `INSERT INTO `+tbl+` VALUES (1, 'lower id, commits last')`); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (2, 'higher id, commits first')`)
	if err := early.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got := r.collect(2, true)
	if got[0].After["id"] != jsonOf(t, "2") || got[1].After["id"] != jsonOf(t, "1") || got[1].Source.TxID >= got[0].Source.TxID {
		t.Fatalf("commit order: got %v (txid %d) then %v (txid %d)", got[0].After, got[0].Source.TxID, got[1].After, got[1].Source.TxID)
	}

	// Polled, not acknowledged: sent again after the restart.
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (3, 'not acknowledged')`)
	if got := r.collect(1, false); got[0].After["id"] != jsonOf(t, "3") {
		t.Fatalf("got %v", got[0].After)
	}
	r.quiet() // reads its COMMIT too
	if err := r.stop(false); err != nil {
		t.Fatal(err)
	}
	if slot, pub := slotAndPublication(t, db, name); !slot || !pub {
		t.Fatalf("a stop (not a deletion) dropped something: slot %v publication %v", slot, pub)
	}
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (4, 'while stopped')`)
	r = startConnector(t, cfg, l)
	got = r.collect(2, true)
	if got[0].After["id"] != jsonOf(t, "3") || got[1].After["id"] != jsonOf(t, "4") {
		t.Fatalf("after the restart: %v, %v; want ids 3 and 4", got[0].After, got[1].After)
	}
	r.quiet()
	if err := r.stop(false); err != nil {
		t.Fatal(err)
	}
	// Everything acknowledged: the slot's confirmed position passed the
	// last change, so a new start sends nothing.
	r = startConnector(t, cfg, l)
	r.quiet()
	if err := r.stop(true); err != nil {
		t.Fatal(err)
	}
	if slot, pub := slotAndPublication(t, db, name); slot || pub {
		t.Errorf("after deletion: slot %v publication %v", slot, pub)
	}
	if left, _ := l.List(ctx); len(left) != 0 {
		t.Errorf("ledger still lists %v", left)
	}
	await(t, 10*time.Second, func() (bool, string, error) {
		n, err := connections(ctx, db, name)
		return n == 0, "the connector's connections to end", err
	})
}

// TestLogicalDeletionDropsOnlyOwn: deleting a connector drops its slot and
// publication and nothing else: another connector on the same table goes
// on capturing, and the table and its rows stay.
func TestLogicalDeletionDropsOnlyOwn(t *testing.T) {
	db, url := logicalAdmin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "shared")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY)`)
	first, second := testenv.Unique("logical-first-"), testenv.Unique("logical-second-")
	dropSlotAfter(t, db, first)
	dropSlotAfter(t, db, second)
	r1 := startConnector(t, logicalConfig(first, url, s+".shared"), connect.NewMemoryLedger())
	r2 := startConnector(t, logicalConfig(second, url, s+".shared"), connect.NewMemoryLedger())
	defer func() { _ = r2.stop(true) }()
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (1)`)
	r1.collect(1, true)
	r2.collect(1, true)
	if err := r1.stop(true); err != nil {
		t.Fatal(err)
	}
	if slot, pub := slotAndPublication(t, db, first); slot || pub {
		t.Errorf("deleted connector: slot %v publication %v", slot, pub)
	}
	if slot, pub := slotAndPublication(t, db, second); !slot || !pub {
		t.Errorf("other connector: slot %v publication %v", slot, pub)
	}
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (2)`)
	if got := r2.collect(1, true); got[0].After["id"] != jsonOf(t, "2") {
		t.Errorf("other connector got %v", got[0].After)
	}
	if n := int64s(t, db, `SELECT count(*) FROM `+tbl); n[0] != 2 {
		t.Errorf("table holds %d rows, want 2", n[0])
	}
}

// TestLogicalConfigRefused: keys of the trigger method, a role without
// REPLICATION and a publication of the same name that is not the
// connector's are refused, by key, and leave nothing behind.
func TestLogicalConfigRefused(t *testing.T) {
	db, url := logicalAdmin(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "x")+` (id int PRIMARY KEY)`)

	name := testenv.Unique("logical-keys-")
	cfg := logicalConfig(name, url, s+".x")
	cfg[KeyCaptureOrder] = orderStatement
	cfg[KeyAuditSchema] = "mine"
	cfg[KeyCaptureLevel] = levelStatement // the default: harmless, accepted
	cfg[KeySnapshotMode] = snapshotInitial
	errs := (&Connector{}).Validate(testCtx(t), cfg)
	for _, k := range []string{KeyCaptureOrder, KeyAuditSchema, KeySnapshotMode} {
		if len(errs[k]) == 0 || !strings.Contains(strings.Join(errs[k], " "), KeyCaptureMethod) {
			t.Errorf("%s: %v, want a message naming %s", k, errs[k], KeyCaptureMethod)
		}
	}
	if len(errs[KeyCaptureLevel]) > 0 {
		t.Errorf("%s set to its default: %v", KeyCaptureLevel, errs[KeyCaptureLevel])
	}

	role, quoted := newRole(t, db, "norepl")
	mustExec(t, db, `GRANT USAGE ON SCHEMA `+pgx.Identifier{s}.Sanitize()+` TO `+quoted)
	mustExec(t, db, `ALTER TABLE `+qualified(s, "x")+` OWNER TO `+quoted)
	name = testenv.Unique("logical-role-")
	dropSlotAfter(t, db, name)
	cfg = logicalConfig(name, urlAs(t, url, role), s+".x")
	errs = (&Connector{}).Validate(testCtx(t), cfg)
	if msg := strings.Join(errs[KeyURL], " "); !strings.Contains(msg, "REPLICATION") {
		t.Errorf("%s: %v, want REPLICATION named", KeyURL, errs[KeyURL])
	}
	grant := "GRANT CREATE ON DATABASE " + pgx.Identifier{testDB(t, db)}.Sanitize() + " TO " + quoted
	if msg := strings.Join(errs[KeyURL], " "); !strings.Contains(msg, grant) {
		t.Errorf("%s: %v, want the statement %q", KeyURL, errs[KeyURL], grant)
	}
	if _, err := tryStart(t, cfg, connect.NewMemoryLedger()); err == nil || !strings.Contains(err.Error(), "REPLICATION") {
		t.Errorf("Start: %v, want the REPLICATION problem", err)
	}
	if slot, pub := slotAndPublication(t, db, name); slot || pub {
		t.Errorf("a refused Start left slot %v publication %v", slot, pub)
	}

	// A role that may replicate but does not own the table.
	repl, replQuoted := newRole(t, db, "repl")
	mustExec(t, db, `ALTER ROLE `+replQuoted+` REPLICATION`)
	mustExec(t, db, `GRANT CREATE ON DATABASE `+pgx.Identifier{testDB(t, db)}.Sanitize()+` TO `+replQuoted)
	t.Cleanup(func() {
		_, _ = db.Exec(context.Background(), `REVOKE CREATE ON DATABASE `+pgx.Identifier{testDB(t, db)}.Sanitize()+` FROM `+replQuoted)
	})
	mustExec(t, db, `CREATE TABLE `+qualified(s, "notmine")+` (id int PRIMARY KEY)`)
	mustExec(t, db, `GRANT SELECT ON `+qualified(s, "notmine")+` TO `+replQuoted)
	errs = (&Connector{}).Validate(testCtx(t), logicalConfig(testenv.Unique("logical-owner-"), urlAs(t, url, repl), s+".notmine"))
	if msg := strings.Join(errs[KeyTables], " "); !strings.Contains(msg, "does not own") || !strings.Contains(msg, "publication") || len(errs[KeyURL]) > 0 {
		t.Errorf("a table the role does not own: %v", errs)
	}

	// A publication of the connector's name that is not its own.
	name = testenv.Unique("logical-taken-")
	dropSlotAfter(t, db, name)
	pub, _ := logicalNames(name)
	mustExec(t, db, `CREATE PUBLICATION `+pgx.Identifier{pub}.Sanitize()+` FOR TABLE `+qualified(s, "x"))
	l := connect.NewMemoryLedger()
	if _, err := tryStart(t, logicalConfig(name, url, s+".x"), l); err == nil || !strings.Contains(err.Error(), "is not this connector's") {
		t.Errorf("Start over a foreign publication: %v", err)
	}
	if slot, pub := slotAndPublication(t, db, name); slot || !pub {
		t.Errorf("slot %v publication %v: want no slot and the foreign publication kept", slot, pub)
	}
}

// TestLogicalRenderMatchesToJSON: every value the task renders itself
// comes out byte for byte as the server's to_json in the task's session
// renders it, from the text the walsender sends (its session's settings);
// the values it leaves to the server are the ones it cannot be sure of.
func TestLogicalRenderMatchesToJSON(t *testing.T) {
	db, _ := admin(t)
	ctx := testCtx(t)
	conn, err := db.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	tests := []struct {
		expr string
		here bool // rendered by the task
	}{
		{`true`, true}, {`false`, true},
		{`'\xdeadbeef'::bytea`, true}, {`'a'::"char"`, true}, {`'nm'::name`, true},
		{`9223372036854775807::int8`, true}, {`(-32768)::int2`, true}, {`42::int4`, true},
		{`E'h\u00e9llo "q" \\ \n\t\x01\x1f/<>&\u2028'::text`, true},
		{`'{"a": [1, 2.50],  "b" : "x"}'::json`, true}, {`'{"b":1,"a":[true,null]}'::jsonb`, true},
		{`'NaN'::float4`, true}, {`1.5e-7::float8`, true}, {`'Infinity'::float8`, true}, {`'-Infinity'::float4`, true},
		{`0.1::float8`, true}, {`1e300::float8`, true}, {`(-0.0)::float8`, true}, {`3.4028235e38::float4`, true},
		{`'x '::bpchar(3)`, true}, {`'v'::varchar`, true},
		{`'2026-01-02'::date`, true}, {`'infinity'::date`, false}, {`'0044-03-15 BC'::date`, false},
		{`'12:34:56.789'::time`, true}, {`'2026-01-02 03:04:05.123456'::timestamp`, true},
		{`'2026-01-02 03:04:05.5+05:30'::timestamptz`, true}, {`'2026-01-02 03:04:05+00'::timestamptz`, true},
		{`'infinity'::timestamptz`, false}, {`'10000-01-01 00:00:00+00'::timestamptz`, false},
		{`'0001-01-01 00:00:00+00'::timestamptz - interval '1 day'`, false},
		{`'1 year 2 mons 3 days 04:05:06.5'::interval`, true}, {`'-1 day'::interval`, true},
		{`'12:00+05'::timetz`, true},
		{`1234.500::numeric`, true}, {`'NaN'::numeric`, true}, {`'-Infinity'::numeric`, true}, {`0.000001::numeric`, true},
		{`'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid`, true},
		{`'{1,NULL,3}'::int4[]`, true}, {`'{"a b","c\"d",NULL,"NULL","x,y","{}"}'::text[]`, true}, {`'{}'::int[]`, true},
		{`'{{1,2},{3,4}}'::int[]`, false}, {`'[0:1]={1,2}'::int[]`, false},
		{`ARRAY['2026-01-02 03:04:05+00'::timestamptz, NULL]`, true}, {`ARRAY[1.5::numeric, 'NaN']`, true},
		{`ARRAY['{"k": [1]}'::jsonb]`, true}, {`ARRAY[true, false]`, true}, {`ARRAY['\x00ff'::bytea]`, true},
		{`'10.0.0.1'::inet`, false}, {`'(1,2)'::point`, false},
	}
	here := 0
	for _, tt := range tests {
		var oid uint32
		var text, want string
		// The walsender's settings for the text, the task session's for
		// to_json.
		if _, err := conn.Exec(ctx, `SET TimeZone = 'UTC'; SET DateStyle = 'ISO'; SET IntervalStyle = 'postgres'; SET bytea_output = 'hex'; SET extra_float_digits = 3`); err != nil {
			t.Fatal(err)
		}
		if err := conn.QueryRow(ctx, `SELECT pg_typeof(v)::oid, format($$%s$$, v) FROM (SELECT `+tt.expr+` AS v) AS x`).Scan(&oid, &text); err != nil {
			t.Fatalf("%s: %v", tt.expr, err)
		}
		if _, err := conn.Exec(ctx, `SET extra_float_digits = 1`); err != nil {
			t.Fatal(err)
		}
		if err := conn.QueryRow(ctx, `SELECT to_json(`+tt.expr+`)::text`).Scan(&want); err != nil {
			t.Fatalf("%s: %v", tt.expr, err)
		}
		got, ok := appendValue(nil, oid, text)
		if ok != tt.here {
			t.Errorf("%s (text %q): rendered by the task %v, want %v", tt.expr, text, ok, tt.here)
		}
		if ok {
			here++
			if string(got) != want {
				t.Errorf("%s (text %q):\n task %s\n to_json %s", tt.expr, text, got, want)
			}
		}
	}
	if here < 40 {
		t.Errorf("only %d values rendered by the task", here)
	}
	if _, err := conn.Exec(ctx, `RESET ALL`); err != nil {
		t.Fatal(err)
	}
}

// TestFullXid: a 32-bit id becomes the 64-bit id nearest the next one,
// across epochs.
func TestFullXid(t *testing.T) {
	for _, tt := range []struct {
		xid  uint32
		next uint64
		want uint64
	}{
		{100, 200, 100},
		{100, 5<<32 | 200, 5<<32 | 100},
		{0xfffffff0, 5<<32 | 10, 4<<32 | 0xfffffff0}, // before the wrap
		{20, 4<<32 | 0xfffffff0, 5<<32 | 20},         // after it: assigned since next was read
		{0xfffffff0, 20, 0xfffffff0},                 // epoch 0 has no earlier one
	} {
		if got := fullXid(tt.xid, tt.next); got != tt.want {
			t.Errorf("fullXid(%d, %#x) = %#x, want %#x", tt.xid, tt.next, got, tt.want)
		}
	}
}

// TestLogicalDefaultReplicaIdentity: under REPLICA IDENTITY DEFAULT the
// WAL holds no old row but the key: an update that keeps the key has no
// before image, one that changes it and a delete have the key columns
// only (not nulls for the rest), and an update that leaves a TOASTed value
// alone leaves it out of after, not null.
func TestLogicalDefaultReplicaIdentity(t *testing.T) {
	db, url := logicalAdmin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "d")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY, v text, big text)`)
	mustExec(t, db, `ALTER TABLE `+tbl+` ALTER COLUMN big SET STORAGE EXTERNAL`)
	name := testenv.Unique("logical-default-")
	dropSlotAfter(t, db, name)
	r := startConnector(t, logicalConfig(name, url, s+".d"), connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (1, 'a', repeat('x', 10000))`)
	mustExec(t, db, `UPDATE `+tbl+` SET v = 'b' WHERE id = 1`)
	mustExec(t, db, `UPDATE `+tbl+` SET id = 2 WHERE id = 1`)
	mustExec(t, db, `DELETE FROM `+tbl+` WHERE id = 2`)
	got := r.collect(4, true)
	for i, want := range []struct{ before, after string }{
		{"null", `{"id":1,"v":"a","big":"` + strings.Repeat("x", 10000) + `"}`},
		{"null", `{"id":1,"v":"b"}`},
		{`{"id":1}`, `{"id":2,"v":"b"}`},
		{`{"id":2}`, "null"},
	} {
		if b := jsonOf(t, want.before); !reflect.DeepEqual(anyMap(got[i].Before), b) {
			t.Errorf("change %d (%s): before %v, want %v", i, got[i].Op, got[i].Before, b)
		}
		if a := jsonOf(t, want.after); !reflect.DeepEqual(anyMap(got[i].After), a) {
			t.Errorf("change %d (%s): after %.80v, want %.80v", i, got[i].Op, got[i].After, a)
		}
	}
	if k := anyMap(got[2].Key); !reflect.DeepEqual(k, jsonOf(t, `{"id":2}`)) {
		t.Errorf("key change: key %v, want the new key", k)
	}
}

// TestLogicalStartWithPendingWork: creating the slot waits for the
// transactions running at that moment; a prepared one is named instead of
// waited for, and an open one ends the wait after slotCreateWait with
// advice; neither Start leaves a slot, and once they end Start succeeds.
func TestLogicalStartWithPendingWork(t *testing.T) {
	db, url := logicalAdmin(t)
	needPreparedTransactions(t, db)
	s := newSchema(t, db)
	tbl := qualified(s, "p")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY)`)
	ctx := testCtx(t)
	gid := prepareInsert(t, db, tbl, "(1)")
	name := testenv.Unique("logical-pending-")
	dropSlotAfter(t, db, name)
	cfg := logicalConfig(name, url, s+".p")
	l := connect.NewMemoryLedger()
	// The half-made slot goes with the cancelled creation's error
	// cleanup, which the backend may finish after the Start returned.
	awaitNoSlot := func() {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if slot, _ := slotAndPublication(t, db, name); !slot {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("a Start that gave up left a slot")
			}
		}
	}
	override(t, &slotCreateWait, 500*time.Millisecond)
	if _, err := tryStart(t, cfg, l); err == nil || !strings.Contains(err.Error(), gid) || !strings.Contains(err.Error(), "COMMIT PREPARED") {
		t.Fatalf("Start with a prepared transaction: %v; want it named", err)
	}
	awaitNoSlot()
	mustExec(t, db, `ROLLBACK PREPARED '`+gid+`'`)

	open, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = open.Rollback(context.Background()) }() // also when the test fails
	if _, err := open.Exec(ctx, `INSERT INTO `+tbl+` VALUES (2)`); err != nil {
		t.Fatal(err)
	}
	if _, err := tryStart(t, cfg, l); err == nil || !strings.Contains(err.Error(), "pg_stat_activity") {
		t.Fatalf("Start with an open transaction: %v; want the advice", err)
	}
	awaitNoSlot()
	if err := open.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// The usual wait again: other packages' tests may have transactions
	// running, which the slot waits for.
	slotCreateWait = time.Minute
	r := startConnector(t, cfg, l)
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (3)`)
	if got := r.collect(1, true); got[0].After["id"] != jsonOf(t, "3") {
		t.Errorf("got %v", got[0].After)
	}
	if err := r.stop(true); err != nil {
		t.Error(err)
	}
}

// TestLogicalSchemaChanges: each change comes with the columns its table
// had when it was made, across ADD COLUMN, DROP COLUMN and a type change
// made while earlier changes wait; a renamed table's changes keep its
// topic.
func TestLogicalSchemaChanges(t *testing.T) {
	db, url := logicalAdmin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "sc")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY, a text, b int)`)
	name := testenv.Unique("logical-ddl-")
	dropSlotAfter(t, db, name)
	r := startConnector(t, logicalConfig(name, url, s+".sc"), connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (1, 'one', 1)`)
	mustExec(t, db, `ALTER TABLE `+tbl+` ADD COLUMN c numeric`)
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (2, 'two', 2, 2.5)`)
	mustExec(t, db, `ALTER TABLE `+tbl+` DROP COLUMN a`)
	mustExec(t, db, `ALTER TABLE `+tbl+` ALTER COLUMN b TYPE text`)
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (3, 'three', 3.5)`)
	mustExec(t, db, `ALTER TABLE `+tbl+` RENAME TO sc_renamed`)
	mustExec(t, db, `INSERT INTO `+qualified(s, "sc_renamed")+` VALUES (4, 'four', 4)`)
	got := r.collect(4, true)
	for i, want := range []string{
		`{"id":1,"a":"one","b":1}`,
		`{"id":2,"a":"two","b":2,"c":2.5}`,
		`{"id":3,"b":"three","c":3.5}`,
		`{"id":4,"b":"four","c":4}`,
	} {
		if a := jsonOf(t, want); !reflect.DeepEqual(anyMap(got[i].After), a) || got[i].Topic != "tc."+s+".sc" {
			t.Errorf("change %d on %s: %v, want %v on tc.%s.sc", i, got[i].Topic, got[i].After, a, s)
		}
	}
}

// TestLogicalReplicaIdentityChecked: a table without a replica identity
// (no primary key under REPLICA IDENTITY DEFAULT, a partition without
// one) is refused, as its publication would make every UPDATE and DELETE
// of the writers fail; so are message.key.columns outside the replica
// identity, which a delete's old row lacks. REPLICA IDENTITY FULL is
// accepted, and then a delete keeps its message.key.columns key.
func TestLogicalReplicaIdentityChecked(t *testing.T) {
	db, url := logicalAdmin(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "nopk")+` (id int, v text)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "k")+` (id int PRIMARY KEY, code text NOT NULL)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "p")+` (id int, v text) PARTITION BY RANGE (id)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "p1")+` PARTITION OF `+qualified(s, "p")+` FOR VALUES FROM (0) TO (100)`)
	// FULL, with a partition that logs only its own key
	mustExec(t, db, `CREATE TABLE `+qualified(s, "pf")+` (id int, v text) PARTITION BY RANGE (id)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "pf1")+` PARTITION OF `+qualified(s, "pf")+` FOR VALUES FROM (0) TO (100)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "pf2")+` PARTITION OF `+qualified(s, "pf")+` (PRIMARY KEY (id)) FOR VALUES FROM (100) TO (200)`)
	mustExec(t, db, `ALTER TABLE `+qualified(s, "pf")+` REPLICA IDENTITY FULL`)
	mustExec(t, db, `ALTER TABLE `+qualified(s, "pf1")+` REPLICA IDENTITY FULL`)
	// keyed, with a partition that logs every column
	mustExec(t, db, `CREATE TABLE `+qualified(s, "pk")+` (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "pk1")+` PARTITION OF `+qualified(s, "pk")+` FOR VALUES FROM (0) TO (100)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "pk2")+` PARTITION OF `+qualified(s, "pk")+` FOR VALUES FROM (100) TO (200)`)
	mustExec(t, db, `ALTER TABLE `+qualified(s, "pk2")+` REPLICA IDENTITY FULL`)
	mustExec(t, db, `INSERT INTO `+qualified(s, "nopk")+` VALUES (1, 'a')`)
	mustExec(t, db, `INSERT INTO `+qualified(s, "k")+` VALUES (1, 'x')`)
	mustExec(t, db, `INSERT INTO `+qualified(s, "pf")+` VALUES (1, 'a'), (101, 'b')`)
	mustExec(t, db, `INSERT INTO `+qualified(s, "pk")+` VALUES (1, 'a'), (101, 'b')`)

	for _, tt := range []struct {
		table, key, keyColumns, want string
	}{
		{"nopk", KeyTables, "", `"nopk" has no replica identity`},
		{"p", KeyTables, "", `partition`},
		{"p", KeyTables, "", `partitioned table "` + s + `"."p" has no replica identity of its own`},
		{"pf", KeyTables, "", `partition ` + s + `.pf2 of "` + s + `"."pf" is not REPLICA IDENTITY FULL while`},
		{"k", KeyMessageKeyColumns, s + ".k:code", `without the message.key.columns column(s) "code"`},
	} {
		name := testenv.Unique("logical-ident-")
		dropSlotAfter(t, db, name)
		cfg := logicalConfig(name, url, s+"."+tt.table)
		if tt.keyColumns != "" {
			cfg[KeyMessageKeyColumns] = tt.keyColumns
		}
		errs := (&Connector{}).Validate(testCtx(t), cfg)
		if msg := strings.Join(errs[tt.key], " "); !strings.Contains(msg, tt.want) || !strings.Contains(msg, "REPLICA IDENTITY FULL") {
			t.Errorf("%s: Validate %s: %v, want %q and the remedy", tt.table, tt.key, errs, tt.want)
		}
		if _, err := tryStart(t, cfg, connect.NewMemoryLedger()); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Start: %v, want %q", tt.table, err, tt.want)
		}
		if slot, pub := slotAndPublication(t, db, name); slot || pub {
			t.Errorf("%s: a refused Start left slot %v publication %v", tt.table, slot, pub)
		}
	}
	// The writers were not hurt.
	mustExec(t, db, `UPDATE `+qualified(s, "nopk")+` SET v = 'b'`)

	mustExec(t, db, `ALTER TABLE `+qualified(s, "nopk")+` REPLICA IDENTITY FULL`)
	mustExec(t, db, `ALTER TABLE `+qualified(s, "k")+` REPLICA IDENTITY FULL`)
	name := testenv.Unique("logical-ident-")
	dropSlotAfter(t, db, name)
	mustExec(t, db, `ALTER TABLE `+qualified(s, "pf2")+` REPLICA IDENTITY FULL`)
	cfg := logicalConfig(name, url, s+".nopk", s+".k", s+".pf", s+".pk")
	cfg[KeyMessageKeyColumns] = s + ".k:code"
	if errs := (&Connector{}).Validate(testCtx(t), cfg); len(errs) > 0 {
		t.Fatalf("REPLICA IDENTITY FULL: %v", errs)
	}
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	defer func() {
		if err := r.stop(true); err != nil {
			t.Error(err)
		}
	}()
	mustExec(t, db, `UPDATE `+qualified(s, "nopk")+` SET v = 'c'`)
	mustExec(t, db, `DELETE FROM `+qualified(s, "k"))
	got := r.collect(2, true)
	if got[0].Op != "u" || got[0].Before["v"] != jsonOf(t, `"b"`) {
		t.Errorf("update of the table without a key: %+v", got[0])
	}
	if got[1].Op != "d" || !reflect.DeepEqual(anyMap(got[1].Key), jsonOf(t, `{"code":"x"}`)) {
		t.Errorf("delete: op %s key %v, want the message.key.columns key", got[1].Op, got[1].Key)
	}
	// Partitioned: whole old rows under FULL, in both partitions; the key
	// columns under a primary key, also from the partition that logs more.
	mustExec(t, db, `UPDATE `+qualified(s, "pf")+` SET v = v || '2'`)
	mustExec(t, db, `DELETE FROM `+qualified(s, "pk"))
	got = r.collect(4, true)
	slices.SortStableFunc(got, func(a, b change) int { return strings.Compare(a.Topic, b.Topic) })
	for i, want := range []struct{ op, before string }{
		{"u", `{"id":1,"v":"a"}`}, {"u", `{"id":101,"v":"b"}`},
		{"d", `{"id":1}`}, {"d", `{"id":101}`},
	} {
		if got[i].Op != want.op || !reflect.DeepEqual(anyMap(got[i].Before), jsonOf(t, want.before)) {
			t.Errorf("partitioned change %d: op %s before %v, want %s %s", i, got[i].Op, got[i].Before, want.op, want.before)
		}
	}
}

// TestLogicalRenamedAndRecreatedTable: a captured table renamed while the
// connector runs goes on being captured under its configured name, with
// its key; a table made under the configured name meanwhile is not in the
// publication, so the task fails telling to restart rather than let its
// changes go uncaptured.
func TestLogicalRenamedAndRecreatedTable(t *testing.T) {
	db, url := logicalAdmin(t)
	defer func(was time.Duration) { metaRefresh = was }(metaRefresh)
	metaRefresh = 0
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "x")+` (id int PRIMARY KEY, v text)`)
	name := testenv.Unique("logical-rename-")
	dropSlotAfter(t, db, name)
	r := startConnector(t, logicalConfig(name, url, s+".x"), connect.NewMemoryLedger())
	defer func() {
		if err := r.stop(true); err != nil {
			t.Error(err)
		}
	}()
	mustExec(t, db, `INSERT INTO `+qualified(s, "x")+` VALUES (1, 'a')`)
	r.collect(1, true)
	mustExec(t, db, `ALTER TABLE `+qualified(s, "x")+` RENAME TO y`)
	mustExec(t, db, `INSERT INTO `+qualified(s, "y")+` VALUES (2, 'b')`)
	got := r.collect(1, true)
	if got[0].Topic != "tc."+s+".x" || !reflect.DeepEqual(anyMap(got[0].Key), jsonOf(t, `{"id":2}`)) {
		t.Errorf("after the rename: topic %s key %v", got[0].Topic, got[0].Key)
	}

	mustExec(t, db, `CREATE TABLE `+qualified(s, "x")+` (id int PRIMARY KEY, v text)`)
	mustExec(t, db, `INSERT INTO `+qualified(s, "x")+` VALUES (3, 'lost')`)
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(testCtx(t), 300*time.Millisecond)
		recs, err := r.tasks[0].Poll(ctx)
		cancel()
		if err != nil {
			if !strings.Contains(err.Error(), "not in this connector's publication") {
				t.Errorf("Poll: %v, want the table named as not in the publication", err)
			}
			break
		}
		if len(recs) > 0 {
			t.Fatalf("records %v of a table not in the publication", recs)
		}
		if time.Now().After(deadline) {
			t.Fatal("the task went on polling while a table under its configured name is not captured")
		}
	}
}

// TestLogicalServerRenderKeepsTypmods: an image the server renders (it
// holds a type the task does not render) casts each text value to its
// column's type without a type modifier: char(3) and bit(3) values come
// out whole, not cut to one character (character and bit mean
// character(1) and bit(1)).
func TestLogicalServerRenderKeepsTypmods(t *testing.T) {
	db, url := logicalAdmin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "m")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY, c char(3), ca char(2)[], b bit(3), ba bit(2)[], ip inet)`)
	name := testenv.Unique("logical-typmod-")
	dropSlotAfter(t, db, name)
	r := startConnector(t, logicalConfig(name, url, s+".m"), connect.NewMemoryLedger())
	defer func() {
		if err := r.stop(true); err != nil {
			t.Error(err)
		}
	}()
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (1, 'abc', '{ab,cd}', B'101', '{10,01}', '10.0.0.1')`)
	var want string
	if err := db.QueryRow(testCtx(t), `SELECT to_json(m)::text FROM `+tbl+` AS m`).Scan(&want); err != nil {
		t.Fatal(err)
	}
	got := r.collect(1, true)
	if !reflect.DeepEqual(anyMap(got[0].After), jsonOf(t, want)) {
		t.Errorf("after %v, want %s", got[0].After, want)
	}
}

// TestLogicalReconnectRetriesFailedAttempts: a lost stream whose
// reconnection fails (here: another client took the slot meanwhile) is
// tried again with backoff, the task staying up, not failed by the first
// attempt that fails; it resumes once the slot is free.
func TestLogicalReconnectRetriesFailedAttempts(t *testing.T) {
	db, url := logicalAdmin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "r")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY)`)
	name := testenv.Unique("logical-retry-")
	dropSlotAfter(t, db, name)
	r := startConnector(t, logicalConfig(name, url, s+".r"), connect.NewMemoryLedger())
	defer func() {
		if err := r.stop(true); err != nil {
			t.Error(err)
		}
	}()
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (1)`)
	r.collect(1, true)

	// The stream is lost, and another client takes the slot before the
	// task reconnects: its reconnections fail (the slot is active).
	pub, slot := logicalNames(name)
	cc, err := pgconn.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cc.RuntimeParams["replication"] = "database"
	ctx := testCtx(t)
	var holder *pgconn.PgConn
	for attempt := 0; holder == nil && attempt < 20; attempt++ {
		mustExec(t, db, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, ApplicationName(name, "stream-0"))
		for end := time.Now().Add(90 * time.Millisecond); holder == nil && time.Now().Before(end); {
			c, err := pgconn.ConnectConfig(ctx, cc)
			if err != nil {
				t.Fatal(err)
			}
			if err := pglogrepl.StartReplication(ctx, c, slot, 0, pglogrepl.StartReplicationOptions{
				Mode: pglogrepl.LogicalReplication, PluginArgs: []string{"proto_version '1'", "publication_names '" + pub + "'"}}); err == nil {
				holder = c
			} else {
				_ = c.Close(ctx)
			}
		}
	}
	if holder == nil {
		t.Fatal("could not take the slot while the task reconnects")
	}
	defer func() { _ = holder.Close(context.Background()) }() // before the deletion
	for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); {
		r.pollAll(true) // fails the test on a Poll error
	}
	_ = holder.Close(ctx)
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (2)`)
	if got := r.collect(1, true); got[0].After["id"] != jsonOf(t, "2") {
		t.Errorf("after reconnecting: %v", got[0].After)
	}
}

// TestLogicalStartWaitsForHeldSlot: a task that starts while its slot is
// still held (by the walsender of an earlier instance not gone yet) waits
// for it rather than failing, and captures once the slot is free.
func TestLogicalStartWaitsForHeldSlot(t *testing.T) {
	db, url := logicalAdmin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "h")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY)`)
	name := testenv.Unique("logical-held-")
	dropSlotAfter(t, db, name)
	l := connect.NewMemoryLedger()
	cfg := logicalConfig(name, url, s+".h")
	r := startConnector(t, cfg, l)
	if err := r.stop(false); err != nil {
		t.Fatal(err)
	}

	pub, slot := logicalNames(name)
	cc, err := pgconn.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cc.RuntimeParams["replication"] = "database"
	ctx := testCtx(t)
	holder, err := pgconn.ConnectConfig(ctx, cc)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Close(context.Background()) }()
	if err := pglogrepl.StartReplication(ctx, holder, slot, 0, pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication, PluginArgs: []string{"proto_version '1'", "publication_names '" + pub + "'"}}); err != nil {
		t.Fatal(err)
	}
	r, err = tryStart(t, cfg, l)
	if err != nil {
		t.Fatalf("Start while the slot is held: %v", err)
	}
	defer func() {
		if err := r.stop(true); err != nil {
			t.Error(err)
		}
	}()
	for end := time.Now().Add(500 * time.Millisecond); time.Now().Before(end); {
		r.pollAll(true)
	}
	_ = holder.Close(ctx)
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (1)`)
	if got := r.collect(1, true); got[0].After["id"] != jsonOf(t, "1") {
		t.Errorf("after the slot was freed: %v", got[0].After)
	}
}

// TestLogicalSlowPollShortSenderTimeout: while Poll is slow (the reader
// waits with a full buffer in the middle of a large transaction) the
// reader reports often enough for the server's wal_sender_timeout, here
// 2 s, below the 10 s default interval: the stream is not ended. Every
// change comes once.
func TestLogicalSlowPollShortSenderTimeout(t *testing.T) {
	db, url := logicalAdmin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "w")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY)`)
	name := testenv.Unique("logical-wst-")
	dropSlotAfter(t, db, name)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	cfg := logicalConfig(name, url+sep+"options=-c%20wal_sender_timeout%3D2000", s+".w")
	cfg[KeyPollMaxRecords] = "1000"
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	defer func() {
		if err := r.stop(true); err != nil {
			t.Error(err)
		}
	}()
	streamPID := func() int64 { // 0: none
		pids := int64s(t, db, `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, ApplicationName(name, "stream-0"))
		if len(pids) > 1 {
			t.Fatalf("stream connections %v, want one", pids)
		}
		return append(pids, 0)[0]
	}
	before := streamPID()
	if before == 0 {
		t.Fatal("no stream connection")
	}
	const rows = 2 * logicalEventBuffer
	mustExec(t, db, `INSERT INTO `+tbl+` SELECT g FROM generate_series(1, $1) AS g`, rows)
	time.Sleep(5 * time.Second) // no Poll: the reader's buffer is full
	during := streamPID()
	got := r.collect(rows, true)
	seen := map[any]bool{}
	for _, c := range got {
		if seen[c.After["id"]] {
			t.Fatalf("id %v twice", c.After["id"])
		}
		seen[c.After["id"]] = true
	}
	if len(got) != rows {
		t.Errorf("%d changes, want %d", len(got), rows)
	}
	if after := streamPID(); during != before || after != before {
		t.Errorf("the stream was ended (walsender %d, then %d, now %d; 0: none): the reader did not report within wal_sender_timeout", before, during, after)
	}
}

// TestLogicalTaskStartedAfterARename: a task that starts after a captured
// table was renamed (a task restart, the connector's configuration still
// naming the old name) goes on capturing it under its configured name,
// with its key: both the changes made before the rename that it sends
// again and the ones made after.
func TestLogicalTaskStartedAfterARename(t *testing.T) {
	db, url := logicalAdmin(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "x")+` (id int PRIMARY KEY, v text)`)
	name := testenv.Unique("logical-renrestart-")
	dropSlotAfter(t, db, name)
	r := startConnector(t, logicalConfig(name, url, s+".x"), connect.NewMemoryLedger())
	defer func() {
		if err := r.stop(true); err != nil {
			t.Error(err)
		}
	}()
	mustExec(t, db, `INSERT INTO `+qualified(s, "x")+` VALUES (1, 'before the rename, not acknowledged')`)
	r.pollUncommitted(1)
	mustExec(t, db, `ALTER TABLE `+qualified(s, "x")+` RENAME TO y`)
	mustExec(t, db, `INSERT INTO `+qualified(s, "y")+` VALUES (2, 'after the rename')`)
	r.restartTask()
	got := r.collect(2, true)
	for i, c := range got {
		if want := jsonOf(t, fmt.Sprintf(`{"id":%d}`, i+1)); c.Topic != "tc."+s+".x" || !reflect.DeepEqual(anyMap(c.Key), want) {
			t.Errorf("change %d: topic %s key %v, want topic tc.%s.x and key %v", i+1, c.Topic, c.Key, s, want)
		}
	}
	r.quiet()
}
