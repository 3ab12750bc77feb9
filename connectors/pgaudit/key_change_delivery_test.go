package pgaudit

import (
	"fmt"
	"testing"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestKeyChangeCreateAloneDoesNotDeliver: the create of a key change has
// another key than its delete and tombstone, so Kafka may put it on
// another partition, and the worker's final commit passes records
// acknowledged on one partition past a record refused on another. The
// create's acknowledgement alone must not deliver the change (its audit
// row would go, and the delete and tombstone with it for good); the
// change is delivered once all three are acknowledged, in whatever order
// their acknowledgements arrive. Single and grouped audit rows.
func TestKeyChangeCreateAloneDoesNotDeliver(t *testing.T) {
	db, tbl, r := oneTable(t, "keychange-part-", `(id int PRIMARY KEY, v text)`, connect.Config{KeyTombstonesOnDelete: "true"})
	const bulk = singleChanges + 4
	mustExec(t, db, fmt.Sprintf(`INSERT INTO %s SELECT g, 'a' FROM generate_series(1, %d) g`, tbl, bulk))
	r.collectRecords(bulk)
	mustExec(t, db, `UPDATE `+tbl+` SET id = 100 WHERE id = 1`) // a single audit row
	mustExec(t, db, `UPDATE `+tbl+` SET id = id + 1000`)        // a group

	waiting := func() int64 {
		t.Helper()
		var n int64
		if err := db.QueryRow(testCtx(t), `SELECT count(*) FROM `+auditTable(r)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := waiting()
	if before < 2 {
		t.Fatalf("%d audit rows, want a single one and a group", before)
	}
	want := 3 + 3*bulk
	recs := r.pollUncommitted(want)
	var creates, rest []connect.SourceRecord
	for _, rec := range recs {
		if rec.Value != nil && decode(t, rec).Op == "c" {
			creates = append(creates, rec)
		} else {
			rest = append(rest, rec)
		}
	}
	if len(creates) != 1+bulk {
		t.Fatalf("%d creates among %d records, want %d", len(creates), len(recs), 1+bulk)
	}
	if err := r.tasks[0].Commit(testCtx(t), creates); err != nil {
		t.Fatal(err)
	}
	if n := waiting(); n != before {
		t.Fatalf("%d audit rows after only the creates of key changes were acknowledged, want %d (their deletes and tombstones were not)", n, before)
	}
	if err := r.tasks[0].Commit(testCtx(t), rest); err != nil {
		t.Fatal(err)
	}
	if n := waiting(); n != 0 {
		t.Fatalf("%d audit rows after every record was acknowledged, want 0", n)
	}
	r.quiet()
}

// TestKeyChangeResentNotAfterALaterChangeOfItsKey: the worker's final
// commit passes what Kafka acknowledged on one partition past a record
// refused on another. A key change 1->2 of which part was refused is sent
// again whole after a restart; a later change of one of its keys,
// acknowledged on that key's partition, must then be sent again too,
// after it, or the compacted topic ends with the older state of the key:
// the old row of key 2 (the delete refused, the create acknowledged, then
// an update of 2), or no row 1 (the create refused, the delete and
// tombstone of 1 acknowledged, then a new row 1). The task delivers rows
// in Poll order: nothing behind one that is not delivered.
func TestKeyChangeResentNotAfterALaterChangeOfItsKey(t *testing.T) {
	for _, tc := range []struct {
		name, later string
		want        string // the records polled
		acked       []int  // what the final commit passes
		key, last   string // the key and its last record Kafka must end with
	}{
		{"delete refused", `UPDATE %s SET v = 'new' WHERE id = 2`,
			`[t d {"id":1} tombstone {"id":1} t c {"id":2} t u {"id":2}]`, []int{2, 3}, `{"id":2}`, `t u {"id":2}`},
		{"create refused", `INSERT INTO %s VALUES (1, 'new')`,
			`[t d {"id":1} tombstone {"id":1} t c {"id":2} t c {"id":1}]`, []int{0, 1, 3}, `{"id":1}`, `t c {"id":1}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, tbl, r := oneTable(t, "keychange-order-", `(id int PRIMARY KEY, v text)`, connect.Config{KeyTombstonesOnDelete: "true"})
			mustExec(t, db, `INSERT INTO `+tbl+` VALUES (1, 'old')`)
			r.collectRecords(1)
			mustExec(t, db, `UPDATE `+tbl+` SET id = 2 WHERE id = 1`)
			mustExec(t, db, fmt.Sprintf(tc.later, tbl))
			poll := r.pollUncommitted
			lines := func(recs []connect.SourceRecord) []string {
				var out []string
				for _, rec := range recs {
					out = append(out, recordLine(t, rec))
				}
				return out
			}
			recs := poll(4)
			if got := fmt.Sprint(lines(recs)); got != tc.want {
				t.Fatalf("records %s, want %s", got, tc.want)
			}
			var acked []connect.SourceRecord
			for _, i := range tc.acked {
				acked = append(acked, recs[i])
			}
			if err := r.tasks[0].Commit(testCtx(t), acked); err != nil {
				t.Fatal(err)
			}

			r.restartTask()
			again := poll(3)
			r.quiet()
			var last string
			for _, rec := range append(acked, again...) {
				if string(rec.Key) == tc.key {
					last = recordLine(t, rec)
				}
			}
			if last != tc.last {
				t.Fatalf("after the restart %s: key %s ends with %q, want %q", lines(again), tc.key, last, tc.last)
			}
		})
	}
}

// TestKeyChangesWithTombstonesEverywhere: with tombstones.on.delete=true a
// key change under row-level capture and in a partitioned table (within a
// partition, and a move between partitions, captured as a delete and an
// insert) is a delete under the old key, its tombstone and a create under
// the new key; snapshot rows stay r records.
func TestKeyChangesWithTombstonesEverywhere(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	plain, parted := qualified(s, "plain"), qualified(s, "parted")
	mustExec(t, db, `CREATE TABLE `+plain+` (id int PRIMARY KEY, v text)`)
	mustExec(t, db, `CREATE TABLE `+parted+` (id int, k int, v text, PRIMARY KEY (id, k)) PARTITION BY RANGE (k)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "p1")+` PARTITION OF `+parted+` FOR VALUES FROM (0) TO (10)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "p2")+` PARTITION OF `+parted+` FOR VALUES FROM (10) TO (20)`)
	mustExec(t, db, `INSERT INTO `+plain+` VALUES (1, 'a')`)
	cfg := baseConfig("keychange-all-"+s, url, auditSchemaFor(t, db), s+".plain", s+".parted")
	cfg[KeyTombstonesOnDelete] = "true"
	cfg[KeyCaptureLevel] = levelRow
	cfg[KeySnapshotMode] = snapshotInitial
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()

	mustExec(t, db, `UPDATE `+plain+` SET id = 2`)
	mustExec(t, db, `INSERT INTO `+parted+` VALUES (1, 1, 'a')`)
	mustExec(t, db, `UPDATE `+parted+` SET id = 2`)  // within p1
	mustExec(t, db, `UPDATE `+parted+` SET k = 11`)  // a move to p2
	mustExec(t, db, `UPDATE `+parted+` SET v = 'b'`) // the key stays
	want := []string{
		`plain r {"id":1}`,
		`plain d {"id":1}`, `tombstone {"id":1}`, `plain c {"id":2}`,
		`parted c {"id":1,"k":1}`,
		`parted d {"id":1,"k":1}`, `tombstone {"id":1,"k":1}`, `parted c {"id":2,"k":1}`,
		`parted d {"id":2,"k":1}`, `tombstone {"id":2,"k":1}`, `parted c {"id":2,"k":11}`,
		`parted u {"id":2,"k":11}`,
	}
	recs := r.collectRecords(len(want))
	r.quiet()
	for i, rec := range recs {
		if got := recordLine(t, rec); got != want[i] {
			t.Fatalf("record %d: %q, want %q", i, got, want[i])
		}
	}
}

// TestKeyChangesOfAPartlyDeliveredGroupResume: a group of key changes
// acknowledged up to the middle of one change (its delete and tombstone,
// not its create) resumes after a restart with that change, whole: its
// three records and the rest, nothing delivered before it again.
func TestKeyChangesOfAPartlyDeliveredGroupResume(t *testing.T) {
	db, tbl, r := oneTable(t, "keychange-group-", `(id int PRIMARY KEY)`, connect.Config{KeyTombstonesOnDelete: "true", KeyPollMaxRecords: "50"})
	const bulk = singleChanges + 4
	mustExec(t, db, fmt.Sprintf(`INSERT INTO %s SELECT g FROM generate_series(1, %d) g`, tbl, bulk))
	r.collectRecords(bulk)
	mustExec(t, db, `UPDATE `+tbl+` SET id = id + 1000`)
	poll := r.pollUncommitted
	recs := poll(3 * bulk)
	// All but the create of the second-to-last change and the last change.
	if err := r.tasks[0].Commit(testCtx(t), recs[:len(recs)-4]); err != nil {
		t.Fatal(err)
	}
	r.restartTask()
	again := poll(6)
	r.quiet()
	var got []string
	for _, rec := range again {
		got = append(got, recordLine(t, rec))
	}
	want := fmt.Sprint([]string{
		fmt.Sprintf(`t d {"id":%d}`, bulk-1), fmt.Sprintf(`tombstone {"id":%d}`, bulk-1), fmt.Sprintf(`t c {"id":%d}`, bulk-1+1000),
		fmt.Sprintf(`t d {"id":%d}`, bulk), fmt.Sprintf(`tombstone {"id":%d}`, bulk), fmt.Sprintf(`t c {"id":%d}`, bulk+1000),
	})
	if fmt.Sprint(got) != want {
		t.Fatalf("after the restart %v, want %v", got, want)
	}
}
