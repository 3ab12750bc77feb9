package pgaudit

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestCommitOrderRowWrittenAtCommitAfterRenumberedRows: transaction A
// inserts b row 1; another transaction inserts b row 2 and commits (it
// draws an id among A's, so A's rows are renumbered at COMMIT); A inserts
// a row 1, whose deferred constraint trigger will update c row 1 at
// COMMIT, and then inserts c row 1. The trigger's UPDATE of c row 1 is
// written during COMMIT, after A's INSERT of it, so it must leave after
// it (per-row order, and the transaction's own order). Before the fix its
// audit row, drawn while A's rows were being renumbered, found only A's
// renumbered rows above it, kept its id, and left before the INSERT of
// the same row (and before a row 1).
func TestCommitOrderRowWrittenAtCommitAfterRenumberedRows(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	ta, tb, tc := qualified(s, "a"), qualified(s, "b"), qualified(s, "c")
	fn := qualified(s, "touch")
	mustExec(t, db, `CREATE TABLE `+ta+` (id int PRIMARY KEY)`)
	mustExec(t, db, `CREATE TABLE `+tb+` (id int PRIMARY KEY)`)
	mustExec(t, db, `CREATE TABLE `+tc+` (id int PRIMARY KEY, v text)`)
	mustExec(t, db, `CREATE FUNCTION `+fn+`() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN UPDATE `+tc+` SET v = 'by trigger' WHERE id = NEW.id; RETURN NULL; END $$`)
	mustExec(t, db, `CREATE CONSTRAINT TRIGGER touch AFTER INSERT ON `+ta+` DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION `+fn+`()`)
	r := startCommitOrder(t, db, url, "committime-", s+".a", s+".b", s+".c")

	a := begin(t, db)
	txExec(t, a, `INSERT INTO `+tb+` VALUES (1)`)
	execWithin(t, db, 10*time.Second, `INSERT INTO `+tb+` VALUES (2)`)
	txExec(t, a, `INSERT INTO `+ta+` VALUES (1)`)
	txExec(t, a, `INSERT INTO `+tc+` VALUES (1, 'by A')`)
	if err := a.Commit(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	// The audit rows, for the failure message: id, table, op, txid.
	var audit []string
	rows, err := db.Query(testCtx(t), `SELECT id::text || ' ' || table_name || ' ' || op::text || ' ' || txid::text FROM `+auditTable(r)+` ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var l string
		if err := rows.Scan(&l); err != nil {
			t.Fatal(err)
		}
		audit = append(audit, l)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	cs := r.collect(5, true)
	var got []string
	for _, c := range cs {
		got = append(got, fmt.Sprintf("%s:%s:%v", c.Source.Table, c.Op, c.Key["id"]))
	}
	want := []string{"b:c:2", "b:c:1", "a:c:1", "c:c:1", "c:u:1"}
	if !slices.Equal(got, want) {
		t.Fatalf("changes left in order %v, want %v (audit rows %q)", got, want, audit)
	}
	r.quiet()
}
