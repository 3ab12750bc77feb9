package pgaudit

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestLogicalReconfigurationRemovesTable: a reconfiguration that removes a
// table while changes of it wait in the slot does not deliver them (as
// under triggers, whose reconfiguration deletes them): the new task no
// longer applies the table's column.exclude.list or message.key.columns,
// so they would go out with the columns the configuration kept out. A
// table added by the reconfiguration is captured from the connector's
// Start on, also changes made before its task starts.
func TestLogicalReconfigurationRemovesTable(t *testing.T) {
	db, url := logicalAdmin(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "a")+` (id int PRIMARY KEY, secret text)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "b")+` (id int PRIMARY KEY, v text)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "c")+` (id int PRIMARY KEY, v text)`)
	name := testenv.Unique("logical-reconf-")
	dropSlotAfter(t, db, name)
	l := connect.NewMemoryLedger()
	cfg := logicalConfig(name, url, s+".a", s+".b")
	cfg[KeyColumnExcludeList] = s + ".a.secret"
	r := startConnector(t, cfg, l)
	mustExec(t, db, `INSERT INTO `+qualified(s, "a")+` VALUES (1, 'visible before')`)
	got := r.collect(1, true)
	if _, leaked := got[0].After["secret"]; leaked || got[0].Topic != "tc."+s+".a" {
		t.Fatalf("first change %s: %s", got[0].Topic, got[0].Raw)
	}
	// Waiting, undelivered: the task is stopped before it reads them.
	mustExec(t, db, `INSERT INTO `+qualified(s, "a")+` VALUES (2, 'pending')`)
	mustExec(t, db, `UPDATE `+qualified(s, "a")+` SET secret = 'pending too' WHERE id = 1`)
	mustExec(t, db, `INSERT INTO `+qualified(s, "b")+` VALUES (1, 'pending b')`)
	if err := r.stop(false); err != nil {
		t.Fatal(err)
	}

	// a is removed (and with it its column.exclude.list entry, which
	// validation requires), c is added.
	cfg2 := logicalConfig(name, url, s+".b", s+".c")
	// The connector's Start sets the publication's tables; the changes
	// made before its task starts are captured.
	r2 := &running{t: t, name: name, cfg: cfg2, ledger: l, conn: &Connector{}}
	defer func() {
		if err := r2.stop(true); err != nil {
			t.Error(err)
		}
	}()
	if err := r2.conn.Start(connect.WithHost(testCtx(t), testHost(name, -1, l)), cfg2); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `INSERT INTO `+qualified(s, "c")+` VALUES (1, 'added')`)
	mustExec(t, db, `INSERT INTO `+qualified(s, "b")+` VALUES (2, 'after')`)
	tcs, err := r2.conn.TaskConfigs(1)
	if err != nil {
		t.Fatal(err)
	}
	task := &Task{}
	if err := task.Start(connect.WithHost(testCtx(t), testHost(name, 0, l)), tcs[0]); err != nil {
		t.Fatal(err)
	}
	r2.tasks = []*Task{task}
	want := map[string]int{"tc." + s + ".b": 2, "tc." + s + ".c": 1}
	counts := map[string]int{}
	deadline := time.Now().Add(30 * time.Second)
	for counts["tc."+s+".b"] < 2 || counts["tc."+s+".c"] < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("changes by topic %v before the deadline, want %v", counts, want)
		}
		batch := r2.drain()
		for _, c := range batch {
			counts[c.Topic]++
			if c.Topic == "tc."+s+".a" {
				t.Errorf("a change of the removed table was delivered: %s (key %v)", c.Raw, c.Key)
			}
		}
	}
	for tp, n := range counts {
		if n != want[tp] {
			t.Errorf("%d change(s) on %s, want %d", n, tp, want[tp])
		}
	}
	r2.quiet()
}

// TestMethodChangeRefusedByValidation: a configuration that changes
// capture.method of a connector whose objects exist is refused by
// validation (a PUT answers 400 naming capture.method) rather than stored
// and failing at Start; after the deletion the other method is accepted.
func TestMethodChangeRefusedByValidation(t *testing.T) {
	db, url := logicalAdmin(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "m")+` (id int PRIMARY KEY)`)
	for _, from := range []string{methodTrigger, methodLogical} {
		t.Run("from_"+from, func(t *testing.T) {
			name := testenv.Unique("method-change-")
			dropSlotAfter(t, db, name)
			trigger := baseConfig(name, url, auditSchemaFor(t, db), s+".m")
			logical := logicalConfig(name, url, s+".m")
			cfg, other, want := trigger, logical, "function "
			if from == methodLogical {
				cfg, other, want = logical, trigger, "publication "
			}
			r := startConnector(t, cfg, connect.NewMemoryLedger())
			errs := (&Connector{}).Validate(testCtx(t), other)
			if msg := strings.Join(errs[KeyCaptureMethod], " "); !strings.Contains(msg, "cannot change on an existing connector") || !strings.Contains(msg, want) {
				t.Errorf("Validate of the other method: %v, want capture.method refused naming its %sobjects", errs, want)
			}
			if errs := (&Connector{}).Validate(testCtx(t), cfg); len(errs) > 0 {
				t.Errorf("Validate of the same method: %v", errs)
			}
			if err := r.stop(true); err != nil {
				t.Fatal(err)
			}
			if errs := (&Connector{}).Validate(testCtx(t), other); len(errs) > 0 {
				t.Errorf("after the deletion, Validate of the other method: %v", errs)
			}
		})
	}
}

// TestLogicalKeptSlotTakenBack: a connector deleted with
// cleanup.on.delete=false keeps its publication and slot; one created
// again under the name takes both back (as the trigger method takes back
// its marked objects), delivers the changes made in between, and its
// deletion drops them.
func TestLogicalKeptSlotTakenBack(t *testing.T) {
	db, url := logicalAdmin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "k")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY)`)
	name := testenv.Unique("logical-kept-")
	dropSlotAfter(t, db, name)
	cfg := logicalConfig(name, url, s+".k")
	cfg[KeyCleanupOnDelete] = "false"
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (1)`)
	r.collect(1, true)
	if err := r.stop(true); err != nil {
		t.Fatal(err)
	}
	if slot, pub := slotAndPublication(t, db, name); !slot || !pub {
		t.Fatalf("cleanup.on.delete=false kept slot %v publication %v", slot, pub)
	}
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (2)`) // while no connector exists

	cfg[KeyCleanupOnDelete] = "true"
	l := connect.NewMemoryLedger()
	again := startConnector(t, cfg, l)
	owned, _ := l.List(testCtx(t))
	kinds := map[string]bool{}
	for _, res := range owned {
		kinds[res.Kind] = true
	}
	if !kinds[KindReplicationSlot] || !kinds[KindPublication] {
		t.Errorf("taken back: %v, want the slot and the publication", owned)
	}
	if got := again.collect(1, true); got[0].After["id"] != json.Number("2") {
		t.Errorf("first change after taking the slot back: %v, want id 2", got[0].After)
	}
	if err := again.stop(true); err != nil {
		t.Fatal(err)
	}
	if slot, pub := slotAndPublication(t, db, name); slot || pub {
		t.Errorf("after the deletion: slot %v publication %v", slot, pub)
	}
}

// TestLogicalStartWaitsForShortPreparedTransaction: a prepared
// transaction pending when the slot is created (another application's
// two-phase commit, anywhere on the server) is waited for like any running
// transaction, not refused at once: one that commits soon lets the Start
// succeed.
func TestLogicalStartWaitsForShortPreparedTransaction(t *testing.T) {
	db, url := logicalAdmin(t)
	needPreparedTransactions(t, db)
	s := newSchema(t, db)
	tbl := qualified(s, "p")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY)`)
	gid := prepareInsert(t, db, tbl, "(1)")
	committed := make(chan error, 1)
	go func() {
		// Once the Start waits for it (its connection is in
		// pg_create_logical_replication_slot).
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			var waiting bool
			if err := db.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE query LIKE '%pg_create_logical_replication_slot%' AND pid <> pg_backend_pid())`).Scan(&waiting); err == nil && waiting {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		_, err := db.Exec(context.Background(), `COMMIT PREPARED '`+gid+`'`)
		committed <- err
	}()
	name := testenv.Unique("logical-shortprep-")
	dropSlotAfter(t, db, name)
	r := startConnector(t, logicalConfig(name, url, s+".p"), connect.NewMemoryLedger())
	defer func() {
		if err := r.stop(true); err != nil {
			t.Error(err)
		}
	}()
	if err := <-committed; err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (2)`)
	if got := r.collect(1, true); got[0].After["id"] != json.Number("2") {
		t.Errorf("first change after the Start: %v, want id 2", got[0].After)
	}
}
