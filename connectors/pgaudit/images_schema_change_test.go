package pgaudit

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// collectRecords polls every task, committing what it got, until want
// records arrived, and returns them as sent (keys included).
func (r *running) collectRecords(want int) []connect.SourceRecord {
	r.t.Helper()
	var out []connect.SourceRecord
	deadline := time.Now().Add(30 * time.Second)
	for len(out) < want {
		if time.Now().After(deadline) {
			r.t.Fatalf("collected %d of %d records before the deadline", len(out), want)
		}
		for _, task := range r.tasks {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			recs, err := task.Poll(ctx)
			ended := ctx.Err() != nil
			cancel()
			if err != nil && !ended {
				r.t.Fatalf("Poll: %v", err)
			}
			out = append(out, recs...)
			if len(recs) > 0 {
				if err := task.Commit(context.Background(), recs); err != nil {
					r.t.Fatalf("Commit: %v", err)
				}
			}
		}
	}
	return out
}

// TestKeyOfAChangeWhoseKeyColumnLostItsName: a change written before a
// column ahead of its key column was dropped is delivered with the key
// column named _column_<n> (its name cannot be told from a dropped
// neighbour's); its key is then null, as documented, and not {"id":null}:
// every such change would share that one key (one partition, and a
// compacted topic would keep only the last of them). A change written
// before its key column's type changed (int to bigint, the usual
// migration) keeps the column's name and its key: the column is still the
// same attribute, and its value is read as the int it was written as.
func TestKeyOfAChangeWhoseKeyColumnLostItsName(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	retyped, dropped := qualified(s, "retyped"), qualified(s, "dropped")
	mustExec(t, db, `CREATE TABLE `+retyped+` (id int PRIMARY KEY, v text)`)
	mustExec(t, db, `CREATE TABLE `+dropped+` (a text, id int PRIMARY KEY, v text)`)
	r := startConnector(t, baseConfig(testenv.Unique("nullkey-"), url, auditSchemaFor(t, db), s+".retyped", s+".dropped"), connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()

	// 70 rows: 64 single-change audit rows and a group.
	mustExec(t, db, `INSERT INTO `+retyped+` SELECT g, 'v' || g FROM generate_series(1, 70) g`)
	mustExec(t, db, `INSERT INTO `+dropped+` SELECT 'a', g, 'v' || g FROM generate_series(1, 70) g`)
	mustExec(t, db, `ALTER TABLE `+retyped+` ALTER COLUMN id TYPE bigint`)
	mustExec(t, db, `ALTER TABLE `+dropped+` DROP COLUMN a`)

	recs := r.collectRecords(140)
	r.quiet()
	var retypedSeen, droppedSeen int
	for _, rec := range recs {
		var v struct {
			After  map[string]any `json:"after"`
			Source struct {
				Table string `json:"table"`
			} `json:"source"`
		}
		d := json.NewDecoder(bytes.NewReader(rec.Value))
		d.UseNumber()
		if err := d.Decode(&v); err != nil {
			t.Fatal(err)
		}
		id, named := v.After["id"]
		switch v.Source.Table {
		case "retyped":
			retypedSeen++
			if want := fmt.Sprintf(`{"id":%s}`, id); !named || string(rec.Key) != want {
				t.Fatalf("record %s has key %s, want the id column named and key %s", rec.Value, rec.Key, want)
			}
		case "dropped":
			droppedSeen++
			if named {
				t.Fatalf("record %s: id kept its name; this test expects it positional", rec.Value)
			}
			if rec.Key != nil {
				t.Fatalf("record %s has key %s, want null (its key column is unnamed)", rec.Value, rec.Key)
			}
		default:
			t.Fatalf("record of an unexpected table: %s", rec.Value)
		}
	}
	if retypedSeen != 70 || droppedSeen != 70 {
		t.Fatalf("%d records of retyped and %d of dropped, want 70 each", retypedSeen, droppedSeen)
	}
}

// TestUnreadableNullStaysNull: a NULL whose type can no longer read it (a
// domain made NOT NULL since, a dropped type) is delivered as null, not as
// the hex string of an empty value ("\\x").
func TestUnreadableNullStaysNull(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	mood, dom := qualified(s, "mood"), qualified(s, "dom")
	mustExec(t, db, `CREATE TYPE `+mood+` AS ENUM ('happy', 'sad')`)
	mustExec(t, db, `CREATE DOMAIN `+dom+` AS int`)
	withDomain, withEnum := qualified(s, "withdomain"), qualified(s, "withenum")
	mustExec(t, db, `CREATE TABLE `+withDomain+` (id int PRIMARY KEY, d `+dom+`, v int)`)
	mustExec(t, db, `CREATE TABLE `+withEnum+` (id int PRIMARY KEY, m `+mood+`, v int)`)
	r := startConnector(t, baseConfig(testenv.Unique("nullhex-"), url, auditSchemaFor(t, db), s+".withdomain", s+".withenum"), connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()

	mustExec(t, db, `INSERT INTO `+withDomain+` VALUES (1, NULL, 7)`)
	mustExec(t, db, `DELETE FROM `+withDomain)
	mustExec(t, db, `ALTER DOMAIN `+dom+` SET NOT NULL`)
	mustExec(t, db, `INSERT INTO `+withEnum+` VALUES (1, NULL, 7)`)
	mustExec(t, db, `ALTER TABLE `+withEnum+` DROP COLUMN m`)
	mustExec(t, db, `DROP TYPE `+mood)

	got := r.collect(3, true)
	r.quiet()
	want := []string{
		`withdomain c map[d:<nil> id:1 v:7]`,
		`withdomain d map[d:<nil> id:1 v:7]`,
		`withenum c map[_column_2:<nil> _column_3:7 id:1]`,
	}
	for i, c := range got {
		img := c.After
		if c.Op == "d" {
			img = c.Before
		}
		if g := fmt.Sprintf("%s %s %v", c.Source.Table, c.Op, img); g != want[i] {
			t.Errorf("change %d: %s, want %s", i, g, want[i])
		}
	}
}

// TestDecodingErrorIsNotDeliveredAsHex: when reading a value column by
// column fails for a reason that is not the value's type refusing it (here
// a statement cancelled, as by statement_timeout), the Poll fails and the
// change stays in the audit table: it is not delivered (and deleted) with
// the value replaced by its hex form. A domain CHECK that raises for the
// value still delivers it as hex, as documented.
func TestDecodingErrorIsNotDeliveredAsHex(t *testing.T) {
	for _, tc := range []struct{ errcode, want string }{
		{"query_canceled", "57014"},
		{"raise_exception", `"d":"\\x00000005"`},
	} {
		t.Run(tc.errcode, func(t *testing.T) {
			db, tbl, r := oneTable(t, "hexerr-", `(id int PRIMARY KEY, v text)`)
			s := tbl[:strings.LastIndex(tbl, ".")]
			// The CHECK passes for writers and fails in the task's
			// sessions, which read the value back through the domain.
			mustExec(t, db, `CREATE FUNCTION `+s+`.checkit(int) RETURNS bool LANGUAGE plpgsql AS $$
BEGIN
  IF current_setting('application_name') LIKE 'tidyconnect:%:task-%' THEN
    RAISE EXCEPTION 'canceling statement due to statement timeout' USING ERRCODE = '`+tc.errcode+`';
  END IF;
  RETURN true;
END $$`)
			mustExec(t, db, `CREATE DOMAIN `+s+`.checked AS int CHECK (`+s+`.checkit(VALUE))`)
			mustExec(t, db, `ALTER TABLE `+tbl+` ADD COLUMN d `+s+`.checked`)
			mustExec(t, db, `INSERT INTO `+tbl+` VALUES (1, 'v', 5)`)
			mustExec(t, db, `ALTER TABLE `+tbl+` ADD COLUMN extra int`) // the change is read column by column

			task := r.tasks[0]
			var (
				err  error
				recs []connect.SourceRecord
			)
			for deadline := time.Now().Add(10 * time.Second); err == nil && len(recs) == 0 && time.Now().Before(deadline); {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				recs, err = task.Poll(ctx)
				cancel()
			}
			got := fmt.Sprint(err)
			if len(recs) > 0 {
				got = string(recs[0].Value)
			}
			if !strings.Contains(got, tc.want) {
				t.Fatalf("Poll: %s, want %s", got, tc.want)
			}
			if err != nil {
				n := objectNames(r.name)
				if left := int64s(t, db, `SELECT count(*) FROM `+qualified(r.cfg[KeyAuditSchema], n.table)); left[0] != 1 {
					t.Fatalf("%d audit rows left, want the change kept", left[0])
				}
			}
		})
	}
}

// TestKeyColumnRenamedAndItsNameReused: after the key column is renamed
// and a new column takes its old name, changes are keyed by the renamed
// key column at once: a primary key column is never null, so a null under
// the key's old name shows the key the task knew is stale.
func TestKeyColumnRenamedAndItsNameReused(t *testing.T) {
	db, tbl, r := oneTable(t, "pkreuse-", `(id int PRIMARY KEY, v text)`)
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (1, 'a')`)
	if got := r.collectRecords(1); string(got[0].Key) != `{"id":1}` {
		t.Fatalf("key %s, want {\"id\":1}", got[0].Key)
	}
	mustExec(t, db, `ALTER TABLE `+tbl+` RENAME COLUMN id TO old_id`)
	mustExec(t, db, `ALTER TABLE `+tbl+` ADD COLUMN id int`)
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (2, 'b', NULL)`)
	got := r.collectRecords(1)
	if string(got[0].Key) != `{"old_id":2}` {
		t.Fatalf("record %s has key %s, want {\"old_id\":2}", got[0].Value, got[0].Key)
	}
}

// TestDomainCheckThatRaisesDoesNotStopTheStream: a domain CHECK that now
// refuses a waiting value by raising (a CHECK calling a validation
// function) rather than by returning false is a domain's new CHECK too:
// the change is read column by column and the value comes out as hex, as
// documented, instead of failing the task on every restart.
func TestDomainCheckThatRaisesDoesNotStopTheStream(t *testing.T) {
	db, tbl, r := oneTable(t, "raise-", `(id int PRIMARY KEY, v text)`)
	s := tbl[:strings.LastIndex(tbl, ".")]
	mustExec(t, db, `CREATE FUNCTION `+s+`.checkit(int) RETURNS bool LANGUAGE plpgsql AS $$ BEGIN RETURN true; END $$`)
	mustExec(t, db, `CREATE DOMAIN `+s+`.checked AS int CHECK (`+s+`.checkit(VALUE))`)
	mustExec(t, db, `ALTER TABLE `+tbl+` ADD COLUMN d `+s+`.checked`)
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (1, 'v', 5), (2, 'w', 6)`)
	// The validation gets stricter while the changes wait.
	mustExec(t, db, `CREATE OR REPLACE FUNCTION `+s+`.checkit(int) RETURNS bool LANGUAGE plpgsql AS $$
BEGIN
  IF $1 = 5 THEN
    RAISE EXCEPTION 'invalid value %', $1;
  END IF;
  RETURN true;
END $$`)
	got := r.collect(2, true)
	r.quiet()
	want := []string{`c map[d:\x00000005 id:1 v:v] key map[id:1]`, `c map[d:6 id:2 v:w] key map[id:2]`}
	for i, c := range got {
		if g := fmt.Sprintf("%s %v key %v", c.Op, c.After, c.Key); g != want[i] {
			t.Errorf("change %d: %s, want %s", i, g, want[i])
		}
	}
}

// TestPositionalNameOfAColumnCalledLikeOne: a value named by its position
// does not take the name of a column called _column_<n>: the object would
// hold that name twice, and JSON readers keep one of the two values.
func TestPositionalNameOfAColumnCalledLikeOne(t *testing.T) {
	db, tbl, r := oneTable(t, "collide-", `(id int PRIMARY KEY, d int, "_column_3" int, x int)`)
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (1, 2, 3, 4)`)
	// Every position after the dropped column is named by its position.
	mustExec(t, db, `ALTER TABLE `+tbl+` DROP COLUMN d`)
	got := r.collectRecords(1)
	const want = `"after":{"id":1,"_column_2":2,"__column_3":3,"_column_4":4}`
	if !strings.Contains(string(got[0].Value), want) {
		t.Fatalf("record %s, want it to contain %s", got[0].Value, want)
	}
}

// TestUndecodableChangeNamesItsAuditRow: an image nothing can read (here
// cut short: damaged by hand) fails the Poll, is never skipped, and the
// error names its audit row, the id an operator needs to remove it (the
// only way past it, docs/pgaudit.md "Delivery").
func TestUndecodableChangeNamesItsAuditRow(t *testing.T) {
	db, tbl, r := oneTable(t, "undecodable-", `(id int PRIMARY KEY, v text)`)
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (1, 'a'), (2, 'b'), (3, 'c')`)
	var bad int64
	if err := db.QueryRow(testCtx(t), `UPDATE `+auditTable(r)+` SET after = '\x00000005'::bytea
		WHERE id = (SELECT id FROM `+auditTable(r)+` ORDER BY id OFFSET 1 LIMIT 1) RETURNING id`).Scan(&bad); err != nil {
		t.Fatal(err)
	}
	for range 2 { // and again: nothing was skipped
		ctx, cancel := context.WithTimeout(testCtx(t), 10*time.Second)
		recs, err := r.tasks[0].Poll(ctx)
		cancel()
		if want := fmt.Sprintf("audit row %d:", bad); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Poll: %d records, error %v; want an error naming %q", len(recs), err, want)
		}
	}
	mustExec(t, db, `DELETE FROM `+auditTable(r)+` WHERE id = $1`, bad)
	got := r.collect(2, true)
	if keys := keyIDs(t, got); !slices.Equal(keys, []int64{1, 3}) {
		t.Fatalf("after removing audit row %d: changes %v, want [1 3]", bad, keys)
	}
	r.quiet()
}
