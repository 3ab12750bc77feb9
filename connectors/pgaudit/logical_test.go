package pgaudit

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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
	db, url := admin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "typed")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY, t text, n numeric(12,3), ts timestamptz, j jsonb, b bytea, a int[], z text, f float8, iv interval)`)
	mustExec(t, db, `ALTER TABLE `+tbl+` REPLICA IDENTITY FULL`)
	name := testenv.Unique("logical-types-")
	dropSlotAfter(t, db, name)
	l := connect.NewMemoryLedger()
	r := startConnector(t, logicalConfig(name, url, s+".typed"), l)
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
}

// TestLogicalCommitOrderAndRestart: transactions leave in the order they
// committed, whatever their ids; a restart resumes after what Kafka
// acknowledged and sends again what it did not, also changes made while
// the connector was stopped; the slot then waits for nobody.
func TestLogicalCommitOrderAndRestart(t *testing.T) {
	db, url := admin(t)
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
	db, url := admin(t)
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
	db, url := admin(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "x")+` (id int PRIMARY KEY)`)

	name := testenv.Unique("logical-keys-")
	cfg := logicalConfig(name, url, s+".x")
	cfg[KeyCaptureOrder] = orderStatement
	cfg[KeyAuditSchema] = "tidyconnect"
	cfg[KeySnapshotMode] = snapshotInitial
	errs := (&Connector{}).Validate(testCtx(t), cfg)
	for _, k := range []string{KeyCaptureOrder, KeyAuditSchema, KeySnapshotMode} {
		if len(errs[k]) == 0 || !strings.Contains(strings.Join(errs[k], " "), KeyCaptureMethod) {
			t.Errorf("%s: %v, want a message naming %s", k, errs[k], KeyCaptureMethod)
		}
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
	if _, err := tryStart(t, cfg, connect.NewMemoryLedger()); err == nil || !strings.Contains(err.Error(), "REPLICATION") {
		t.Errorf("Start: %v, want the REPLICATION problem", err)
	}
	if slot, pub := slotAndPublication(t, db, name); slot || pub {
		t.Errorf("a refused Start left slot %v publication %v", slot, pub)
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
