package pgaudit

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// recordLine is a record as "topic-suffix op key", "tombstone key" for a
// record with a null value.
func recordLine(t testing.TB, rec connect.SourceRecord) string {
	t.Helper()
	if rec.Value == nil {
		return fmt.Sprintf("tombstone %s", rec.Key)
	}
	c := decode(t, rec)
	return fmt.Sprintf("%s %s %s", c.Source.Table, c.Op, rec.Key)
}

// TestTombstonesOnDelete: with tombstones.on.delete=true every delete of a
// row with a primary key, single or in a grouped audit row, is followed by
// a record with its key and a null value (Debezium's tombstone); a delete
// without a key and a TRUNCATE are not. Batches of 3 records cut between
// deletes and their tombstones. Without the key, one record per change.
func TestTombstonesOnDelete(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("tombstones.on.delete=%v", on), func(t *testing.T) {
			db, url := admin(t)
			s := newSchema(t, db)
			keyed, keyless := qualified(s, "keyed"), qualified(s, "keyless")
			mustExec(t, db, `CREATE TABLE `+keyed+` (id int PRIMARY KEY, v text)`)
			mustExec(t, db, `CREATE TABLE `+keyless+` (v text)`)
			cfg := baseConfig(testenv.Unique("tomb-"), url, auditSchemaFor(t, db), s+".keyed", s+".keyless")
			cfg[KeyPollMaxRecords] = "3"
			if on {
				cfg[KeyTombstonesOnDelete] = "true"
			}
			r := startConnector(t, cfg, connect.NewMemoryLedger())
			defer func() { _ = r.stop(true) }()

			const bulk = singleChanges + 10 // past the single rows into a group
			mustExec(t, db, `INSERT INTO `+keyed+` VALUES (1, 'a')`)
			mustExec(t, db, `DELETE FROM `+keyed+` WHERE id = 1`)
			mustExec(t, db, fmt.Sprintf(`INSERT INTO %s SELECT g, 'b' FROM generate_series(100, %d) g`, keyed, 99+bulk))
			mustExec(t, db, `DELETE FROM `+keyed)
			mustExec(t, db, `INSERT INTO `+keyless+` VALUES ('x')`)
			mustExec(t, db, `DELETE FROM `+keyless)
			mustExec(t, db, `TRUNCATE `+keyed)

			want := []string{`keyed c {"id":1}`, `keyed d {"id":1}`}
			if on {
				want = append(want, `tombstone {"id":1}`)
			}
			for id := 100; id < 100+bulk; id++ {
				want = append(want, fmt.Sprintf(`keyed c {"id":%d}`, id))
			}
			for id := 100; id < 100+bulk; id++ {
				want = append(want, fmt.Sprintf(`keyed d {"id":%d}`, id))
				if on {
					want = append(want, fmt.Sprintf(`tombstone {"id":%d}`, id))
				}
			}
			want = append(want, `keyless c `, `keyless d `, `keyed t `)

			recs := r.collectRecords(len(want))
			r.quiet()
			if len(recs) != len(want) {
				t.Fatalf("%d records, want %d", len(recs), len(want))
			}
			for i, rec := range recs {
				if got := recordLine(t, rec); got != want[i] {
					t.Fatalf("record %d: %q, want %q", i, got, want[i])
				}
				if rec.Value == nil {
					// The delete's offset, which says that its tombstone
					// delivers the change.
					del := maps.Clone(recs[i-1].SourceOffset)
					_, part := del[offsetPart]
					delete(del, offsetPart)
					if rec.Topic != recs[i-1].Topic || fmt.Sprint(rec.SourceOffset) != fmt.Sprint(del) || !part {
						t.Fatalf("tombstone %d: topic %s, offset %v; want its delete's, %s and %v, and the delete's marked %q", i, rec.Topic, rec.SourceOffset, recs[i-1].Topic, recs[i-1].SourceOffset, offsetPart)
					}
				}
			}
		})
	}
}

// TestTombstoneDeliversItsDelete: a delete is delivered when its tombstone
// is acknowledged, not before: a restart after Kafka acknowledged the
// delete alone sends both again (at-least-once), instead of losing the
// tombstone, and the audit row goes only with the tombstone's
// acknowledgement.
func TestTombstoneDeliversItsDelete(t *testing.T) {
	db, tbl, r := oneTable(t, "tombdel-", `(id int PRIMARY KEY)`, connect.Config{KeyTombstonesOnDelete: "true", KeyPollMaxRecords: "1"})
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (7)`)
	r.collectRecords(1)
	mustExec(t, db, `DELETE FROM `+tbl)
	waiting := func() int64 {
		t.Helper()
		var n int64
		if err := db.QueryRow(testCtx(t), `SELECT count(*) FROM `+auditTable(r)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	poll := func() connect.SourceRecord {
		t.Helper()
		ctx, cancel := context.WithTimeout(testCtx(t), 10*time.Second)
		defer cancel()
		for {
			recs, err := r.tasks[0].Poll(ctx)
			if err != nil {
				t.Fatalf("Poll: %v", err)
			}
			if len(recs) == 1 {
				return recs[0]
			}
			if len(recs) > 1 {
				t.Fatalf("Poll returned %d records with poll.max.records=1", len(recs))
			}
		}
	}
	del := poll()
	if got := recordLine(t, del); got != `t d {"id":7}` {
		t.Fatalf("first record %q, want the delete", got)
	}
	if err := r.tasks[0].Commit(testCtx(t), []connect.SourceRecord{del}); err != nil {
		t.Fatal(err)
	}
	if n := waiting(); n != 1 {
		t.Fatalf("%d audit rows after the delete alone was acknowledged, want 1 (it waits for its tombstone)", n)
	}

	// A restart before the tombstone was acknowledged: both again.
	r.restartTask()
	del, tomb := poll(), poll()
	if got := recordLine(t, del) + " / " + recordLine(t, tomb); got != `t d {"id":7} / tombstone {"id":7}` {
		t.Fatalf("after the restart: %s, want the delete and its tombstone", got)
	}
	if err := r.tasks[0].Commit(testCtx(t), []connect.SourceRecord{del, tomb}); err != nil {
		t.Fatal(err)
	}
	if n := waiting(); n != 0 {
		t.Fatalf("%d audit rows after the tombstone was acknowledged, want 0", n)
	}
	r.quiet()
}

// TestKeyChangeWithTombstones: with tombstones.on.delete=true an UPDATE
// that changes the key is, as in Debezium, a delete under the old key, its
// tombstone and a create under the new key (single and grouped changes);
// an UPDATE that keeps the key stays one record. Without the setting a key
// change is one u record under the new key. The change is delivered with
// its last record: Kafka acknowledging the delete and tombstone alone
// keeps its audit row.
func TestKeyChangeWithTombstones(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("tombstones.on.delete=%v", on), func(t *testing.T) {
			set := connect.Config{}
			if on {
				set[KeyTombstonesOnDelete] = "true"
			}
			db, tbl, r := oneTable(t, "keychange-", `(id int PRIMARY KEY, v text)`, set)
			const bulk = singleChanges + 6
			mustExec(t, db, fmt.Sprintf(`INSERT INTO %s SELECT g, 'a' FROM generate_series(1, %d) g`, tbl, bulk))
			r.collectRecords(bulk)
			// Rows in the order they were written (no update before this
			// one moved them): the statement changes them in id order.
			mustExec(t, db, `UPDATE `+tbl+` SET id = id + 1000`)
			mustExec(t, db, `UPDATE `+tbl+` SET v = 'b' WHERE id = 1001`)

			var want []string
			for id := 1; id <= bulk; id++ {
				if on {
					want = append(want, fmt.Sprintf(`t d {"id":%d}`, id), fmt.Sprintf(`tombstone {"id":%d}`, id), fmt.Sprintf(`t c {"id":%d}`, id+1000))
				} else {
					want = append(want, fmt.Sprintf(`t u {"id":%d}`, id+1000))
				}
			}
			want = append(want, `t u {"id":1001}`)
			recs := r.collectRecords(len(want))
			r.quiet()
			for i, rec := range recs {
				if got := recordLine(t, rec); got != want[i] {
					t.Fatalf("record %d: %q, want %q", i, got, want[i])
				}
			}
			if !on {
				return
			}
			// The images: the delete has the old row as before, the
			// create the new row as after.
			del, create := decode(t, recs[0]), decode(t, recs[2])
			if fmt.Sprint(del.Before) != "map[id:1 v:a]" || del.After != nil || create.Before != nil || fmt.Sprint(create.After) != "map[id:1001 v:a]" {
				t.Fatalf("delete %s, create %s; want the old row before and the new row after", del.Raw, create.Raw)
			}

			// Delivered with the create, not before.
			mustExec(t, db, `UPDATE `+tbl+` SET id = 5000 WHERE id = 1001`)
			split := r.pollUncommitted(3)
			if err := r.tasks[0].Commit(testCtx(t), split[:2]); err != nil {
				t.Fatal(err)
			}
			var n int64
			if err := db.QueryRow(testCtx(t), `SELECT count(*) FROM `+auditTable(r)).Scan(&n); err != nil || n != 1 {
				t.Fatalf("%d audit rows (%v) after the delete and tombstone of a key change were acknowledged, want 1", n, err)
			}
			if err := r.tasks[0].Commit(testCtx(t), split[2:]); err != nil {
				t.Fatal(err)
			}
			if err := db.QueryRow(testCtx(t), `SELECT count(*) FROM `+auditTable(r)).Scan(&n); err != nil || n != 0 {
				t.Fatalf("%d audit rows (%v) after the create was acknowledged, want 0", n, err)
			}
		})
	}
}
