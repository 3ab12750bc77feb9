package pgaudit

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

func num(t testing.TB, v any) int64 {
	t.Helper()
	n, ok := v.(json.Number)
	if !ok {
		t.Fatalf("%v (%T) is not a number", v, v)
	}
	i, err := n.Int64()
	if err != nil {
		t.Fatalf("%v: %v", v, err)
	}
	return i
}

// TestBulkStatementsGrouped: statements of 2600 rows are stored as 64
// single-change audit rows plus groups of at most 1000, and come out as
// 2600 changes each, in statement order, UPDATE images paired, exactly
// once. Columns named n and o must not be mistaken for the transition
// tables' whole rows.
func TestBulkStatementsGrouped(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "bulk")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY, n numeric(10,2), o text, ts timestamptz)`)
	r := startConnector(t, baseConfig(testenv.Unique("bulk-"), url, auditSchemaFor(t, db), s+".bulk"), connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()

	const rows = 2600
	mustExec(t, db, fmt.Sprintf(`INSERT INTO %s SELECT g, g * 1.5, 'r' || g, '2026-01-02 03:04:05+00'::timestamptz + g * interval '1 second' FROM generate_series(1, %d) g`, tbl, rows))
	// A whole-table UPDATE or DELETE visits the rows in physical order:
	// that is the statement order the changes must keep.
	physical := func() []int64 { return int64s(t, db, `SELECT id FROM `+tbl+` ORDER BY ctid`) }
	order := [3][]int64{nil, physical()}
	mustExec(t, db, `UPDATE `+tbl+` SET n = n + 1, o = o || 'x'`)
	order[2] = physical()
	mustExec(t, db, `DELETE FROM `+tbl)

	var auditRows, changes, grouped int
	if err := db.QueryRow(testCtx(t), `SELECT count(*), sum(coalesce(changes, 1)), count(changes) FROM `+auditTable(r)).Scan(&auditRows, &changes, &grouped); err != nil {
		t.Fatal(err)
	}
	// Per statement: 64 single rows, then groups of 1000, 1000 and 536.
	if auditRows != 3*(64+3) || changes != 3*rows || grouped != 3*3 {
		t.Fatalf("audit table holds %d rows (%d grouped) with %d changes, want %d rows (%d grouped) with %d", auditRows, grouped, changes, 3*(64+3), 9, 3*rows)
	}

	got := r.collect(3*rows, true)
	r.quiet()
	if len(got) != 3*rows {
		t.Fatalf("%d changes, want %d", len(got), 3*rows)
	}
	var lastSeq int64
	for i, c := range got {
		phase, id := i/rows, int64(i%rows+1)
		if phase > 0 {
			id = order[phase][i%rows]
		}
		want := []string{"c", "u", "d"}[phase]
		if c.Op != want {
			t.Fatalf("change %d: op %q, want %q", i, c.Op, want)
		}
		if c.Source.Seq <= lastSeq {
			t.Fatalf("change %d: seq %d after %d", i, c.Source.Seq, lastSeq)
		}
		lastSeq = c.Source.Seq
		if got := num(t, c.Key["id"]); got != id {
			t.Fatalf("change %d (%s): key %v, want id %d (statement order)", i, c.Op, c.Key, id)
		}
		img := c.After
		if c.Op == "d" {
			img = c.Before
		}
		if num(t, img["id"]) != id {
			t.Fatalf("change %d: image %v, want id %d", i, img, id)
		}
		switch c.Op {
		case "c":
			if c.Before != nil || c.After["n"] != json.Number(fmt.Sprintf("%.2f", float64(id)*1.5)) || c.After["o"] != fmt.Sprintf("r%d", id) {
				t.Fatalf("insert %d: before %v after %v", id, c.Before, c.After)
			}
			if wantTS := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).Add(time.Duration(id) * time.Second).Format("2006-01-02T15:04:05-07:00"); c.After["ts"] != wantTS {
				t.Fatalf("insert %d: ts %v, want %s", id, c.After["ts"], wantTS)
			}
		case "u":
			if num(t, c.Before["id"]) != id || c.Before["o"] != fmt.Sprintf("r%d", id) || c.After["o"] != fmt.Sprintf("r%dx", id) {
				t.Fatalf("update %d mispaired: before %v after %v", id, c.Before, c.After)
			}
		case "d":
			if c.After != nil || c.Before["o"] != fmt.Sprintf("r%dx", id) {
				t.Fatalf("delete %d: before %v after %v", id, c.Before, c.After)
			}
		}
	}
	var left int
	if err := db.QueryRow(testCtx(t), `SELECT count(*) FROM `+auditTable(r)).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Fatalf("%d audit rows left after every change was acknowledged", left)
	}
}

// TestPartlyDeliveredGroupResumes: a restart in the middle of a grouped
// audit row resumes after its last acknowledged change: nothing is lost and
// nothing acknowledged is sent again.
func TestPartlyDeliveredGroupResumes(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "part")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY)`)
	ledger := connect.NewMemoryLedger()
	cfg := baseConfig(testenv.Unique("part-"), url, auditSchemaFor(t, db), s+".part")
	cfg[KeyPollMaxRecords] = "300"
	r := startConnector(t, cfg, ledger)
	mustExec(t, db, `INSERT INTO `+tbl+` SELECT g FROM generate_series(1, 1064) g`) // 64 single rows + one group of 1000

	acked := r.collect(600, true)
	if len(acked) != 600 {
		t.Fatalf("collected %d, want two batches of 300", len(acked))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5e9)
	unacked, err := r.tasks[0].Poll(ctx) // polled, never acknowledged
	cancel()
	if err != nil || len(unacked) != 300 {
		t.Fatalf("Poll: %d records, %v", len(unacked), err)
	}
	if err := r.stop(false); err != nil {
		t.Fatal(err)
	}
	var rows, delivered int
	if err := db.QueryRow(testCtx(t), `SELECT count(*), max(delivered) FROM `+auditTable(r)).Scan(&rows, &delivered); err != nil {
		t.Fatal(err)
	}
	if rows != 1 || delivered != 600-64 {
		t.Fatalf("after the stop the audit table holds %d rows, delivered %d; want the group with %d delivered", rows, delivered, 600-64)
	}

	r2 := startConnector(t, cfg, ledger)
	defer func() { _ = r2.stop(true) }()
	rest := r2.collect(1064-600, true)
	r2.quiet()
	seen := map[int64]int{}
	for _, c := range append(acked, rest...) {
		seen[num(t, c.After["id"])]++
	}
	for id := int64(1); id <= 1064; id++ {
		if seen[id] != 1 {
			t.Errorf("id %d delivered %d times", id, seen[id])
		}
	}
}

// TestColumnChangesWithUndeliveredChanges: changes written before the
// table's columns changed are still delivered. After ADD COLUMN they carry
// exactly the columns they were written with; after DROP COLUMN every value
// is delivered, columns that no longer line up named by position.
func TestColumnChangesWithUndeliveredChanges(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "evolving")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY, label text, qty int)`)
	r := startConnector(t, baseConfig(testenv.Unique("ddl-"), url, auditSchemaFor(t, db), s+".evolving"), connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()

	mustExec(t, db, `INSERT INTO `+tbl+` SELECT g, 'l' || g, g FROM generate_series(1, 100) g`) // single and grouped rows
	mustExec(t, db, `ALTER TABLE `+tbl+` ADD COLUMN extra text DEFAULT 'z'`)
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (101, 'l101', 101, 'new')`)
	got := r.collect(101, true)
	for i, c := range got {
		id := num(t, c.After["id"])
		if id != int64(i+1) || c.After["label"] != fmt.Sprintf("l%d", id) || num(t, c.After["qty"]) != id {
			t.Fatalf("change %d after ADD COLUMN: %v", i, c.After)
		}
		if _, has := c.After["extra"]; has != (id == 101) {
			t.Fatalf("change %d: %v; only the change written after ADD COLUMN has extra", i, c.After)
		}
	}

	mustExec(t, db, `UPDATE `+tbl+` SET qty = qty + 1000 WHERE id <= 70`) // 64 single + a group of 6
	mustExec(t, db, `ALTER TABLE `+tbl+` DROP COLUMN label`)
	got = r.collect(70, true)
	r.quiet()
	for i, c := range got {
		id := int64(i + 1)
		// Written as (id int, label text, qty int, extra text), read as
		// (id int, qty int, extra text): id still lines up; label's value
		// lands in _column_2, qty's in _column_3, extra's in _column_4.
		want := map[string]any{"id": json.Number(fmt.Sprint(id)), "_column_2": fmt.Sprintf("l%d", id), "_column_3": json.Number(fmt.Sprint(id + 1000)), "_column_4": "z"}
		if fmt.Sprint(c.After) != fmt.Sprint(want) {
			t.Fatalf("change %d after DROP COLUMN: %v, want %v", i, c.After, want)
		}
	}
}

// TestTimestamptzInUTC: row images are rendered by the task's session, so a
// writer's TimeZone does not show in the record.
func TestTimestamptzInUTC(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "zoned")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY, at timestamptz)`)
	r := startConnector(t, baseConfig(testenv.Unique("tz-"), url, auditSchemaFor(t, db), s+".zoned"), connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()
	ctx := testCtx(t)
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, q := range []string{`SET LOCAL TimeZone = 'America/New_York'`, `INSERT INTO ` + tbl + ` VALUES (1, '2026-07-01 12:00:00-04')`} {
		if _, err := tx.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got := r.collect(1, true)
	if at := got[0].After["at"]; at != "2026-07-01T16:00:00+00:00" {
		t.Fatalf("timestamptz rendered as %v, want 2026-07-01T16:00:00+00:00", at)
	}
}

func TestImageFormats(t *testing.T) {
	rec := func(cols ...[]byte) []byte {
		b := []byte{0, 0, 0, byte(len(cols))}
		for _, c := range cols {
			b = append(b, 0, 0, 0, 23) // int4
			if c == nil {
				b = append(b, 0xff, 0xff, 0xff, 0xff)
				continue
			}
			b = append(b, 0, 0, 0, byte(len(c)))
			b = append(b, c...)
		}
		return b
	}
	one, two := rec([]byte{0, 0, 0, 1}, nil), rec([]byte{0, 0, 0, 2}, []byte{0, 0, 0, 3})
	arr := appendArray(nil, 12345, [][]byte{one, two})
	elems, err := arrayElements(arr)
	if err != nil || len(elems) != 2 || string(elems[0]) != string(one) || string(elems[1]) != string(two) {
		t.Fatalf("arrayElements(appendArray) = %x, %v", elems, err)
	}
	if e, err := arrayElements([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 17}); err != nil || len(e) != 0 {
		t.Fatalf("empty array: %v, %v", e, err)
	}
	cols, err := recordColumns(one)
	if err != nil || len(cols) != 2 || cols[0].oid != 23 || string(cols[0].value) != "\x00\x00\x00\x01" || cols[1].value != nil {
		t.Fatalf("recordColumns = %+v, %v", cols, err)
	}
	for name, bad := range map[string][]byte{
		"truncated array":    arr[:len(arr)-1],
		"short array":        arr[:10],
		"two dimensions":     append([]byte{0, 0, 0, 2}, arr[4:]...),
		"truncated elements": arr[:28],
	} {
		if _, err := arrayElements(bad); err == nil || !strings.Contains(err.Error(), "array image") {
			t.Errorf("%s: err %v, want an array image error", name, err)
		}
	}
	for name, bad := range map[string][]byte{"truncated record": one[:len(one)-5], "short record": one[:2]} {
		if _, err := recordColumns(bad); err == nil || !strings.Contains(err.Error(), "record image") {
			t.Errorf("%s: err %v, want a record image error", name, err)
		}
	}
}

// TestOldAuditTableLayoutRefused: an audit table left by a build that
// stored JSON images is not written with binary images: Start fails saying
// what to do, and installs neither the new function nor triggers, so the
// captured table's writes keep working.
func TestOldAuditTableLayoutRefused(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "legacy")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY)`)
	audit := newSchema(t, db) // exists already: not the connector's
	cfg := baseConfig(testenv.Unique("legacy-"), url, audit, s+".legacy")
	n := objectNames(cfg["name"])
	mustExec(t, db, `CREATE TABLE `+qualified(audit, n.table)+` (id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, txid xid8 NOT NULL, ts timestamptz NOT NULL DEFAULT now(), schema_name text NOT NULL, table_name text NOT NULL, op "char" NOT NULL, before json, after json)`)
	_, err := tryStart(t, cfg, connect.NewMemoryLedger())
	if err == nil || !strings.Contains(err.Error(), "earlier tidyconnect version") {
		t.Fatalf("Start on an old audit table: %v, want an error about the earlier layout", err)
	}
	var functions int
	if err := db.QueryRow(testCtx(t), `SELECT count(*) FROM pg_proc p JOIN pg_namespace ns ON ns.oid = p.pronamespace WHERE ns.nspname = $1 AND p.proname = $2`, audit, n.function).Scan(&functions); err != nil {
		t.Fatal(err)
	}
	if functions != 0 || triggerCount(t, db, s, "legacy") != 0 {
		t.Fatalf("%d functions and %d triggers installed, want none", functions, triggerCount(t, db, s, "legacy"))
	}
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (1)`)
}

// TestColumnChangesWideTableAndDroppedType: the column-by-column decoding
// of changes written before a column change works for tables wider than
// one function call's 100 arguments, and a value whose type was dropped
// since is delivered as the hex of its binary form instead of blocking the
// stream.
func TestColumnChangesWideTableAndDroppedType(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	wide := qualified(s, "wide")
	var cols, vals []string
	for i := 1; i <= 60; i++ {
		cols = append(cols, fmt.Sprintf("c%d int", i))
		vals = append(vals, fmt.Sprint(i*10))
	}
	mustExec(t, db, `CREATE TABLE `+wide+` (id int PRIMARY KEY, `+strings.Join(cols, ", ")+`)`)
	mood := qualified(s, "mood")
	mustExec(t, db, `CREATE TYPE `+mood+` AS ENUM ('happy', 'sad')`)
	feel := qualified(s, "feel")
	mustExec(t, db, `CREATE TABLE `+feel+` (id int PRIMARY KEY, m `+mood+`, v int)`)
	r := startConnector(t, baseConfig(testenv.Unique("wide-"), url, auditSchemaFor(t, db), s+".wide", s+".feel"), connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()

	mustExec(t, db, `INSERT INTO `+wide+` VALUES (1, `+strings.Join(vals, ", ")+`)`)
	mustExec(t, db, `INSERT INTO `+feel+` VALUES (1, 'happy', 7)`)
	mustExec(t, db, `ALTER TABLE `+wide+` ADD COLUMN extra int`)
	mustExec(t, db, `ALTER TABLE `+feel+` DROP COLUMN m`)
	mustExec(t, db, `DROP TYPE `+mood)

	got := r.collect(2, true)
	for _, c := range got {
		switch c.Source.Table {
		case "wide":
			if len(c.After) != 61 {
				t.Fatalf("wide change has %d columns, want 61: %v", len(c.After), c.After)
			}
			for i := 1; i <= 60; i++ {
				if v := num(t, c.After[fmt.Sprintf("c%d", i)]); v != int64(i*10) {
					t.Fatalf("wide change: c%d = %d, want %d", i, v, i*10)
				}
			}
		case "feel":
			want := map[string]any{"id": json.Number("1"), "_column_2": `\x` + fmt.Sprintf("%x", "happy"), "_column_3": json.Number("7")}
			if fmt.Sprint(c.After) != fmt.Sprint(want) {
				t.Fatalf("change with a dropped type: %v, want %v", c.After, want)
			}
		default:
			t.Fatalf("change of %s", c.Source.Table)
		}
	}
}

// TestUndeliveredChangesAcrossHarderColumnChanges: changes written before
// a column of the same type as the next one was dropped are not labelled
// with the next column's name; changes written before an ADD COLUMN keep
// every name (and their key) although the table dropped a column long
// before; changes whose values the narrowed column type would refuse are
// delivered as written instead of failing the task on every restart.
func TestUndeliveredChangesAcrossHarderColumnChanges(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	dropped, narrowed, added := qualified(s, "dropped"), qualified(s, "narrowed"), qualified(s, "added")
	mustExec(t, db, `CREATE TABLE `+dropped+` (id int PRIMARY KEY, a text, b text)`)
	mustExec(t, db, `CREATE TABLE `+narrowed+` (id int PRIMARY KEY, name varchar(10))`)
	mustExec(t, db, `CREATE TABLE `+added+` (x int, id int PRIMARY KEY, v text)`)
	mustExec(t, db, `ALTER TABLE `+added+` DROP COLUMN x`) // long before the changes
	retyped := qualified(s, "retyped")
	mustExec(t, db, `CREATE TABLE `+retyped+` (a int, id int PRIMARY KEY, v text)`)
	r := startConnector(t, baseConfig(testenv.Unique("ddl2-"), url, auditSchemaFor(t, db), s+".dropped", s+".narrowed", s+".added", s+".retyped"), connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()

	mustExec(t, db, `INSERT INTO `+dropped+` VALUES (1, 'A', 'B')`)
	mustExec(t, db, `ALTER TABLE `+dropped+` DROP COLUMN a`)
	mustExec(t, db, `INSERT INTO `+narrowed+` VALUES (1, 'abcdefghij')`)
	mustExec(t, db, `DELETE FROM `+narrowed)
	mustExec(t, db, `ALTER TABLE `+narrowed+` ALTER COLUMN name TYPE varchar(5)`)
	mustExec(t, db, `INSERT INTO `+added+` VALUES (1, 'v')`)
	mustExec(t, db, `ALTER TABLE `+added+` ADD COLUMN w text`)
	mustExec(t, db, `INSERT INTO `+retyped+` VALUES (7, 1, 'v')`)
	mustExec(t, db, `ALTER TABLE `+retyped+` ALTER COLUMN a TYPE bigint`) // before the key

	got := r.collect(5, true)
	r.quiet()
	want := []string{
		`dropped c map[_column_2:A _column_3:B id:1]`, // not b:A
		`narrowed c map[id:1 name:abcdefghij]`,
		`narrowed d map[id:1 name:abcdefghij]`,
		`added c map[id:1 v:v] key map[id:1]`,
		`retyped c map[a:7 id:1 v:v] key map[id:1]`, // a's type changed: still attribute 1, read as the int it was written as
	}
	for i, c := range got {
		img := c.After
		if c.Op == "d" {
			img = c.Before
		}
		g := fmt.Sprintf("%s %s %v", c.Source.Table, c.Op, img)
		if c.Source.Table == "added" || c.Source.Table == "retyped" {
			g += fmt.Sprintf(" key %v", c.Key)
		}
		if g != want[i] {
			t.Errorf("change %d: %s, want %s", i, g, want[i])
		}
	}
}

// TestGroupsCutByBytes: grouped audit rows are also cut where their images
// pass groupBytes (an array, and an audit row, cannot exceed 1 GB), and an
// UPDATE whose old or new images pass sideBytes is grouped by pairing its
// rows instead; every change still comes out once, in statement order,
// UPDATE images paired. The bounds are shrunk to a few hundred bytes.
func TestGroupsCutByBytes(t *testing.T) {
	for _, tc := range []struct {
		name       string
		side       int
		byPairing  bool // the UPDATE past sideBytes
		wantGroups string
		// immediate: capture.order=commit, and the UPDATE's transaction
		// fires the renumbering at once (SET CONSTRAINTS ALL IMMEDIATE).
		immediate bool
	}{
		{"update within the side bound", 1 << 20, false, "c>1 u=1 d>1", false},
		// Images past sideBytes / chunkChanges (here 20 bytes) are left out
		// of the first grouping; the sides being within the bound, the
		// statement is grouped again with nothing left out.
		{"update within the side bound, images past the per-image limit", 20000, false, "c>1 u=1 d>1", false},
		{"update past the side bound", 1000, true, "c>1 u>1 d>1", false},
		{"update past the side bound, renumbered at once", 1000, true, "c>1 u>1 d>1", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			override(t, &groupBytes, 300)
			override(t, &sideBytes, tc.side)
			db, url := admin(t)
			s := newSchema(t, db)
			tbl := qualified(s, "t")
			mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY, o text)`)
			cfg := baseConfig(testenv.Unique("bytes-"), url, auditSchemaFor(t, db), s+".t")
			if tc.immediate {
				cfg[KeyCaptureOrder] = orderCommit
			}
			r := startConnector(t, cfg, connect.NewMemoryLedger())
			defer func() { _ = r.stop(true) }()

			const rows = 200
			mustExec(t, db, fmt.Sprintf(`INSERT INTO %s SELECT g, 'r' || g FROM generate_series(1, %d) g`, tbl, rows))
			if tc.immediate {
				tx := begin(t, db)
				txExec(t, tx, `SET CONSTRAINTS ALL IMMEDIATE`)
				txExec(t, tx, `UPDATE `+tbl+` SET o = o || 'x'`)
				if err := tx.Commit(testCtx(t)); err != nil {
					t.Fatal(err)
				}
			} else {
				mustExec(t, db, `UPDATE `+tbl+` SET o = o || 'x'`)
			}
			mustExec(t, db, `DELETE FROM `+tbl)

			// The groups: how many per statement, none marked, none past
			// the bound by more than one row's images.
			q, err := db.Query(testCtx(t), `SELECT op::text, changes, coalesce(octet_length(before), 0) + coalesce(octet_length(after), 0) FROM `+auditTable(r)+` WHERE changes IS NOT NULL ORDER BY id`)
			if err != nil {
				t.Fatal(err)
			}
			groups, inGroups := map[string]int{}, map[string]int{}
			var changes int
			for q.Next() {
				var op string
				var n, size int
				if err := q.Scan(&op, &n, &size); err != nil {
					t.Fatal(err)
				}
				if n < 1 || size > groupBytes+200 && (op != "u" || tc.byPairing) {
					t.Errorf("%s group of %d changes, %d bytes of images (bound %d)", op, n, size, groupBytes)
				}
				groups[op]++
				inGroups[op] += n
				changes += n
			}
			q.Close()
			if changes != 3*(rows-singleChanges) {
				t.Errorf("the groups hold %d changes, want %d", changes, 3*(rows-singleChanges))
			}
			var desc []string
			for _, op := range []string{"c", "u", "d"} {
				if groups[op] == 1 {
					desc = append(desc, op+"=1")
				} else if groups[op] > 1 {
					desc = append(desc, op+">1")
				}
			}
			for op, n := range groups {
				// Cut by bytes, not row by row: a group holds several.
				if inGroups[op] < 2*n {
					t.Errorf("%d %s groups hold %d changes", n, op, inGroups[op])
				}
			}
			if got := strings.Join(desc, " "); got != tc.wantGroups {
				t.Errorf("groups per statement: %s (%v), want %s", got, groups, tc.wantGroups)
			}

			got := r.collect(3*rows, true)
			if len(got) != 3*rows {
				t.Fatalf("%d changes, want %d", len(got), 3*rows)
			}
			for i, c := range got {
				op, id := []string{"c", "u", "d"}[i/rows], int64(i%rows+1)
				img := c.After
				if op == "d" {
					img = c.Before
				}
				if c.Op != op || num(t, img["id"]) != id {
					t.Fatalf("change %d: %s of %v, want %s of id %d (statement order)", i, c.Op, img, op, id)
				}
				if op == "u" && (c.Before["o"] != fmt.Sprintf("r%d", id) || c.After["o"] != fmt.Sprintf("r%dx", id)) {
					t.Fatalf("update %d mispaired: before %v after %v", id, c.Before, c.After)
				}
			}
		})
	}
}

// Images decoded column by column (a column was dropped since they were
// written) are rendered as to_json renders a row, byte for byte: no spaces
// around colons or after commas, json values as they were written.
func TestImagesAfterDDLAreCompactLikeToJSON(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "evolving")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY, label text, doc json, qty int)`)
	r := startConnector(t, baseConfig(testenv.Unique("ddljson-"), url, auditSchemaFor(t, db), s+".evolving"), connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (1, 'a "b"', '{"k" :  [1, 2]}', NULL)`)
	mustExec(t, db, `ALTER TABLE `+tbl+` DROP COLUMN label`)
	got := r.collect(1, true)
	const want = `"after":{"id":1,"_column_2":"a \"b\"","_column_3":{"k" :  [1, 2]},"_column_4":null}`
	if !strings.Contains(string(got[0].Raw), want) {
		t.Errorf("record %s, want it to contain %s", got[0].Raw, want)
	}
}

// TestGroupingWithHashAggregationOff: a writer whose session turned hash
// aggregation off still gets its bulk statements grouped in statement
// order (the function switches it on for its grouping: a sort need not keep
// a group's rows in order), and finds its setting as it left it.
func TestGroupingWithHashAggregationOff(t *testing.T) {
	db, tbl, r := oneTable(t, "hashagg-", `(id int PRIMARY KEY, v text)`)
	ctx := testCtx(t)
	tx := begin(t, db)
	txExec(t, tx, `SET LOCAL enable_hashagg = off`)
	txExec(t, tx, `INSERT INTO `+tbl+` SELECT g, 'v' || g FROM generate_series(1, 2500) g`)
	txExec(t, tx, `UPDATE `+tbl+` SET v = v || 'x'`)
	var setting string
	if err := tx.QueryRow(ctx, `SHOW enable_hashagg`).Scan(&setting); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if setting != "off" {
		t.Errorf("enable_hashagg = %s after the captured statements, want the writer's off", setting)
	}
	got := r.collect(5000, true)
	for i, c := range got {
		want := i%2500 + 1
		id, _ := strconv.Atoi(fmt.Sprint(c.Key["id"]))
		if id != want {
			t.Fatalf("record %d (%s) is row %d, want row %d: statement order lost", i, c.Op, id, want)
		}
		if c.Op == "u" && (c.Before["v"] != fmt.Sprintf("v%d", id) || c.After["v"] != fmt.Sprintf("v%dx", id)) {
			t.Fatalf("update of row %d: before %v after %v", id, c.Before["v"], c.After["v"])
		}
	}
}
