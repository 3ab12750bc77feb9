package integration

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestChainDeliversEveryChangeInOrder: deploy both connectors, write rows
// (multi-row statements, per-row updates, deletes), and every change
// arrives once, with the right content, in commit order per row.
func TestChainDeliversEveryChangeInOrder(t *testing.T) {
	c := newChain(t)
	seedCustomers, seedOrders := c.count("customers"), c.count("orders")
	c.deploy()
	customers := c.collect(c.queue("customers"))
	orders := c.collect(c.queue("orders"))

	const n = 30
	// One statement inserting n rows: a statement-level trigger must still
	// produce one change per row.
	rows, err := c.pg.Query(c.ctx, "INSERT INTO "+c.table("customers")+" (name, email) SELECT 'c-' || i, 'c-' || i || '-"+c.id+"@example.com' FROM generate_series(1, $1) AS i RETURNING id, name", n)
	if err != nil {
		t.Fatal(err)
	}
	expected := map[string][]string{}
	var ids []string
	for rows.Next() {
		var id int64
		var name string
		if err := rows.Scan(&id, &name); err != nil {
			t.Fatal(err)
		}
		sid := fmt.Sprint(id)
		ids = append(ids, sid)
		expected[sid] = []string{"insert|" + name}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// One statement renaming all of them.
	c.exec("UPDATE "+c.table("customers")+" SET name = name || '-v1' WHERE email LIKE $1", "%-"+c.id+"@example.com")
	for _, id := range ids {
		expected[id] = append(expected[id], "update|"+strings.TrimPrefix(expected[id][0], "insert|")+"-v1")
	}
	// Per-row transactions: a second rename of every third row, then
	// deletion of every even row.
	for i, id := range ids {
		base := strings.TrimPrefix(expected[id][0], "insert|")
		name := base + "-v1"
		if i%3 == 0 {
			c.exec("UPDATE "+c.table("customers")+" SET name = $1 WHERE id = $2", base+"-v2", id)
			name = base + "-v2"
			expected[id] = append(expected[id], "update|"+name)
		}
		if i%2 == 0 {
			c.exec("DELETE FROM "+c.table("customers")+" WHERE id = $1", id)
			expected[id] = append(expected[id], "delete|"+name)
		}
	}
	// Orders for the customers that remain, in one transaction.
	tx, err := c.pg.Begin(c.ctx)
	if err != nil {
		t.Fatal(err)
	}
	var orderIDs []string
	for i, id := range ids {
		if i%2 == 1 {
			var oid int64
			if err := tx.QueryRow(c.ctx, "INSERT INTO "+c.table("orders")+" (customer_id, amount, status) VALUES ($1, $2, 'new') RETURNING id", id, float64(i)+0.5).Scan(&oid); err != nil {
				t.Fatal(err)
			}
			orderIDs = append(orderIDs, fmt.Sprint(oid))
		}
	}
	if err := tx.Commit(c.ctx); err != nil {
		t.Fatal(err)
	}

	v := awaitDelivery(customers, expected, 60*time.Second)
	c.report(v, false)

	// Content: the images carry the row, the envelope names the source.
	for id, msgs := range customers.byRow() {
		if _, ours := expected[id]; !ours {
			t.Errorf("a message for customer %s, which this test never changed (the seed rows must not be captured): %s", id, msgs[0].raw)
			continue
		}
		for _, m := range msgs {
			switch m.kind() {
			case "insert":
				if m.Before != nil || m.After == nil || !strings.HasSuffix(fmt.Sprint(m.After["email"]), c.id+"@example.com") {
					t.Errorf("insert of %s: want after with the email and no before: %s", id, m.raw)
				}
			case "update":
				if m.Before == nil || m.After == nil || m.Before["name"] == m.After["name"] || fmt.Sprint(m.Before["id"]) != id {
					t.Errorf("update of %s: want before and after images with different names: %s", id, m.raw)
				}
			case "delete":
				if m.Before == nil || m.After != nil {
					t.Errorf("delete of %s: want before and no after: %s", id, m.raw)
				}
			}
			if !strings.Contains(fmt.Sprint(m.Source), c.schema) || !strings.Contains(fmt.Sprint(m.Source), "customers") {
				t.Errorf("source %v does not name %s.customers", m.Source, c.schema)
			}
			if ts, err := m.TsMs.Int64(); err != nil || ts <= 0 {
				t.Errorf("ts_ms = %q, want epoch milliseconds", m.TsMs)
			}
		}
	}
	if _, bad := customers.snapshot(); len(bad) > 0 {
		t.Errorf("%d message(s) are not JSON envelopes, e.g. %q", len(bad), bad[0])
	}

	if !eventually(60*time.Second, func() bool {
		msgs, _ := orders.snapshot()
		return len(msgs) >= len(orderIDs)
	}) {
		msgs, _ := orders.snapshot()
		t.Fatalf("%d order messages arrived, want %d", len(msgs), len(orderIDs))
	}
	var gotOrders []string
	msgs, _ := orders.snapshot()
	for _, m := range msgs {
		if m.kind() != "insert" || fmt.Sprint(m.After["status"]) != "new" {
			t.Errorf("order message: want an insert with status new: %s", m.raw)
		}
		gotOrders = append(gotOrders, m.id())
	}
	// One transaction, one table: the order of the inserts is kept.
	if !slices.Equal(gotOrders, orderIDs) {
		t.Errorf("orders arrived as %v, want %v", gotOrders, orderIDs)
	}

	// The user's data is the user's: seed rows untouched.
	if got := c.count("customers"); got != seedCustomers+n/2 {
		t.Errorf("customers has %d rows, want %d", got, seedCustomers+n/2)
	}
	if got := c.count("orders"); got != seedOrders+len(orderIDs) {
		t.Errorf("orders has %d rows, want %d", got, seedOrders+len(orderIDs))
	}
}

// TestChainSurvivesPauseStopRestartAndWorkerRestart: in the middle of a
// stream, pause/resume, PUT stop/resume, REST restarts and a SIGTERM worker
// restart keep every owned resource and lose nothing.
func TestChainSurvivesPauseStopRestartAndWorkerRestart(t *testing.T) {
	c := newChain(t)
	c.deploy()
	col := c.collect(c.queue("customers"))
	srcRes, sinkRes := c.api.resources(c.src), c.api.resources(c.sink)
	pgObjs := c.ownedObjects(c.src)
	if len(srcRes) == 0 || len(sinkRes) == 0 || len(pgObjs) == 0 {
		t.Fatalf("nothing owned after deploy: source %v, sink %v, catalogs %v", srcRes, sinkRes, pgObjs)
	}
	// kept checks the ledgers (when the worker runs) and the objects
	// themselves.
	kept := func(when string, workerUp bool) {
		t.Helper()
		if workerUp {
			if got := c.api.resources(c.src); !sameResources(got, srcRes) {
				t.Errorf("%s: %s resources = %v, want %v", when, c.src, got, srcRes)
			}
			if got := c.api.resources(c.sink); !sameResources(got, sinkRes) {
				t.Errorf("%s: %s resources = %v, want %v", when, c.sink, got, sinkRes)
			}
		}
		if got := c.ownedObjects(c.src); !slices.Equal(got, pgObjs) {
			t.Errorf("%s: owned PostgreSQL objects = %v, want %v", when, got, pgObjs)
		}
		for _, q := range []string{c.queue("customers"), c.queue("orders")} {
			if !c.queueExists(q) {
				t.Errorf("%s: queue %s is gone", when, q)
			}
		}
		if !c.exchangeExists(c.exchange) {
			t.Errorf("%s: exchange %s is gone", when, c.exchange)
		}
	}

	s := c.startStream(10 * time.Millisecond)
	var marks []phaseMark
	mark := func(label string) { marks = append(marks, phaseMark{label, s.count(), time.Now()}) }
	mark("running")
	s.awaitMore(20)

	mark("source paused")
	c.api.must(http.MethodPut, "/connectors/"+c.src+"/pause", nil, http.StatusAccepted, http.StatusNoContent, http.StatusOK)
	c.api.awaitState(c.src, "PAUSED", "PAUSED")
	s.awaitMore(20)
	kept("source paused", true)
	mark("source resumed")
	c.api.must(http.MethodPut, "/connectors/"+c.src+"/resume", nil, http.StatusAccepted, http.StatusNoContent, http.StatusOK)
	c.api.awaitRunning(c.src)

	mark("sink stopped")
	c.api.must(http.MethodPut, "/connectors/"+c.sink+"/stop", nil, http.StatusAccepted, http.StatusNoContent, http.StatusOK)
	c.api.awaitState(c.sink, "STOPPED", "")
	s.awaitMore(20)
	kept("sink stopped", true)
	mark("sink resumed")
	c.api.must(http.MethodPut, "/connectors/"+c.sink+"/resume", nil, http.StatusAccepted, http.StatusNoContent, http.StatusOK)
	c.api.awaitRunning(c.sink)

	t.Logf("audit rows not yet deleted before the REST restarts: %d", c.auditBacklog())
	// One at a time, so a re-delivery can be attributed.
	for _, name := range []string{c.src, c.sink} {
		mark("REST restart of " + name)
		c.api.must(http.MethodPost, "/connectors/"+name+"/restart?includeTasks=true&onlyFailed=false", nil, http.StatusAccepted, http.StatusNoContent, http.StatusOK)
		c.api.awaitRunning(name)
		s.awaitMore(10)
	}
	s.awaitMore(20)
	kept("after REST restarts", true)

	mark("SIGTERM")
	c.w.terminate()
	mark("worker down")
	s.awaitMore(30) // written while no worker runs
	kept("worker stopped with SIGTERM", false)
	mark("worker restarted")
	c.w.restart()
	c.api.awaitRunning(c.src)
	c.api.awaitRunning(c.sink)
	s.awaitMore(20)
	kept("worker restarted", true)

	expected := s.end()
	v := awaitDelivery(col, expected, 90*time.Second)
	// No crash anywhere in this scenario: every stop commits what was
	// acknowledged and confirmed, so a duplicate is a bug (0 in 10 runs
	// after the final-Flush fix).
	c.report(v, false)
	if v.duplicates > 0 {
		// No crash here, so these are worth a look; by the phase in which
		// their rows were written:
		t.Logf("duplicates by the phase that wrote their rows: %s; by the phase they arrived in: %s",
			duplicatesByPhase(v, expected, marks), duplicatesByArrival(col, marks))
		t.Logf("worker warnings and errors:\n%s", c.w.logLevels("WARN", "ERROR"))
	}
	t.Logf("%d rows written across pause, stop, restarts and a SIGTERM restart", len(expected))
}

// TestChainSIGKILLLosesNothing: a worker killed with SIGKILL in the middle of
// a stream loses nothing after a restart; duplicates are allowed and counted.
func TestChainSIGKILLLosesNothing(t *testing.T) { sigkillLosesNothing(t, false) }

// TestEmbeddedBrokerSIGKILLLosesNothing: the same crash with Kafka inside
// the worker (standalone without --bootstrap-servers, i.e. `make run`): the
// broker dies with the worker, and what it acknowledged must survive.
func TestEmbeddedBrokerSIGKILLLosesNothing(t *testing.T) { sigkillLosesNothing(t, true) }

func sigkillLosesNothing(t *testing.T, embedded bool) {
	c := newChain(t, embedded)
	c.deploy()
	col := c.collect(c.queue("customers"))
	s := c.startStream(5 * time.Millisecond)
	s.awaitMore(50)
	// Kill once messages are flowing, so batches are in flight.
	if !eventually(60*time.Second, func() bool { msgs, _ := col.snapshot(); return len(msgs) >= 20 }) {
		t.Fatal("no messages arrived before the kill")
	}
	c.w.kill()
	s.awaitMore(50)
	c.w.restart()
	c.api.awaitRunning(c.src)
	c.api.awaitRunning(c.sink)
	s.awaitMore(50)
	expected := s.end()
	v := awaitDelivery(col, expected, 90*time.Second)
	c.report(v, true)
}

// TestDeleteDropsExactlyOwnedObjects: deleting each connector drops what it
// created, checked in the catalogs and in RabbitMQ, and nothing else: the
// demo tables and rows, a trigger of the user's, a queue made by hand that
// the sink used, and an unrelated queue all survive.
func TestDeleteDropsExactlyOwnedObjects(t *testing.T) {
	c := newChain(t)

	// Things that exist before any connector: the user's.
	c.exec(`CREATE FUNCTION ` + c.table("keep_email_lower") + `() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN NEW.email := lower(NEW.email); RETURN NEW; END$$`)
	c.exec(`CREATE TRIGGER user_email_lower BEFORE INSERT OR UPDATE ON ` + c.table("customers") + ` FOR EACH ROW EXECUTE FUNCTION ` + c.table("keep_email_lower") + `()`)
	usersQueue := c.queue("orders") // the sink will deliver into it, but did not create it
	c.declareQueue(usersQueue)
	unrelated := c.prefix + ".mine"
	c.declareQueue(unrelated)
	userTriggers := c.triggersOn("customers")

	c.deploy()
	col := c.collect(c.queue("customers"))
	c.exec("INSERT INTO "+c.table("customers")+" (name, email) VALUES ('Del Test', $1)", "DEL-"+c.id+"@EXAMPLE.com")
	c.exec("INSERT INTO " + c.table("orders") + " (customer_id, amount) SELECT min(id), 3.5 FROM " + c.table("customers"))
	if !eventually(60*time.Second, func() bool { msgs, _ := col.snapshot(); return len(msgs) >= 1 }) {
		t.Fatal("the insert did not arrive in RabbitMQ")
	}
	if !eventually(60*time.Second, func() bool { return c.queueDepth(usersQueue) >= 1 }) {
		t.Fatal("the order did not arrive in the hand-made queue")
	}
	customers, orders := c.count("customers"), c.count("orders")

	// What the ledgers say must match what exists.
	srcRes := c.api.resources(c.src)
	sinkRes := c.api.resources(c.sink)
	owned := c.ownedObjects(c.src)
	t.Logf("%s owns %v; catalogs show %v", c.src, srcRes, owned)
	t.Logf("%s owns %v", c.sink, sinkRes)
	if len(owned) == 0 || len(srcRes) == 0 {
		t.Fatalf("pgaudit owns nothing after deploy: ledger %v, catalogs %v", srcRes, owned)
	}
	if !c.schemaExists(c.auditSchema) {
		t.Fatalf("audit schema %s was not created", c.auditSchema)
	}
	if !containsResource(sinkRes, "rabbitmq.queue", c.queue("customers")) || !containsResource(sinkRes, "rabbitmq.exchange", c.exchange) {
		t.Errorf("sink ledger %v lacks the queue %s or the exchange %s it created", sinkRes, c.queue("customers"), c.exchange)
	}
	if containsResource(sinkRes, "rabbitmq.queue", usersQueue) || containsResource(sinkRes, "rabbitmq.queue", unrelated) {
		t.Errorf("sink ledger %v owns a queue it did not create", sinkRes)
	}
	capture := c.triggersOn("customers")
	if len(capture) <= len(userTriggers) {
		t.Fatalf("no capture triggers on customers: %v", capture)
	}

	c.api.delete(c.sink)
	c.api.awaitGone(c.sink, 30*time.Second)
	if c.queueExists(c.queue("customers")) {
		t.Errorf("queue %s, created by %s, survived its deletion", c.queue("customers"), c.sink)
	}
	if c.exchangeExists(c.exchange) {
		t.Errorf("exchange %s, created by %s, survived its deletion", c.exchange, c.sink)
	}
	if !c.queueExists(usersQueue) {
		t.Errorf("the hand-made queue %s was deleted with the sink", usersQueue)
	} else if d := c.queueDepth(usersQueue); d < 1 {
		t.Errorf("the hand-made queue %s lost its messages (depth %d)", usersQueue, d)
	}
	if !c.queueExists(unrelated) {
		t.Errorf("the unrelated queue %s was deleted", unrelated)
	}

	c.api.delete(c.src)
	c.api.awaitGone(c.src, 30*time.Second)
	if left := c.ownedObjects(c.src); len(left) > 0 {
		t.Errorf("after deleting %s these objects it owned remain: %v", c.src, left)
	}
	if c.schemaExists(c.auditSchema) {
		t.Errorf("audit schema %s, created by %s, survived its deletion", c.auditSchema, c.src)
	}
	if got := c.triggersOn("customers"); !slices.Equal(got, userTriggers) {
		t.Errorf("triggers on customers after deletion = %v, want exactly the user's %v", got, userTriggers)
	}
	if got := c.triggersOn("orders"); len(got) != 0 {
		t.Errorf("triggers on orders after deletion = %v, want none", got)
	}
	var fnExists bool
	if err := c.pg.QueryRow(c.ctx, "SELECT to_regprocedure($1) IS NOT NULL", c.schema+".keep_email_lower()").Scan(&fnExists); err != nil || !fnExists {
		t.Errorf("the user's trigger function was dropped (err %v)", err)
	}
	if got := c.count("customers"); got != customers {
		t.Errorf("customers has %d rows after deletion, want %d", got, customers)
	}
	if got := c.count("orders"); got != orders {
		t.Errorf("orders has %d rows after deletion, want %d", got, orders)
	}
	// Writes still work without the capture triggers.
	c.exec("INSERT INTO "+c.table("customers")+" (name, email) VALUES ('After', $1)", "after-"+c.id+"@example.com")
	code, _, err := c.api.do(context.Background(), http.MethodGet, "/connectors/"+c.src+"/resources", nil)
	if err != nil || code != http.StatusNotFound {
		t.Errorf("GET resources of a deleted connector = %d, %v; want 404", code, err)
	}
}

// TestSIGKILLDuringDeletionCompletesAfterRestart: the worker dies while
// pgaudit's cleanup is blocked on a lock; after a restart the connector is
// still visible as being deleted, and the deletion completes.
func TestSIGKILLDuringDeletionCompletesAfterRestart(t *testing.T) {
	c := newChain(t)
	c.deploy()
	col := c.collect(c.queue("customers"))
	c.exec("INSERT INTO "+c.table("customers")+" (name, email) VALUES ('Kill Test', $1)", "kill-"+c.id+"@example.com")
	if !eventually(60*time.Second, func() bool { msgs, _ := col.snapshot(); return len(msgs) >= 1 }) {
		t.Fatal("the insert did not arrive in RabbitMQ")
	}
	if len(c.ownedObjects(c.src)) == 0 {
		t.Fatal("pgaudit owns nothing after deploy")
	}

	// Hold a lock that DROP TRIGGER on customers must wait for.
	blocker, err := c.pg.Begin(c.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(context.Background()) //nolint:errcheck // released below on the normal path
	if _, err := blocker.Exec(c.ctx, "LOCK TABLE "+c.table("customers")+" IN ACCESS SHARE MODE"); err != nil {
		t.Fatal(err)
	}

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		// Fails when the worker is killed: that is the point.
		_, _, _ = c.api.do(ctx, http.MethodDelete, "/connectors/"+c.src, nil)
	}()
	defer wg.Wait()

	// Wait until the cleanup is really stuck on the lock (or has failed on a
	// lock timeout and reported it).
	var st connectorStatus
	blocked := eventually(60*time.Second, func() bool {
		var waiting int
		_ = c.pg.QueryRow(c.ctx, "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = $1::regclass", c.table("customers")).Scan(&waiting)
		s, found, _ := c.api.status(c.src)
		st = s
		return found && s.Deletion != nil && (waiting > 0 || s.Deletion.Phase == "cleanup-failed")
	})
	if !blocked {
		t.Fatalf("the deletion never reached pgaudit's cleanup; last status %+v", st)
	}
	t.Logf("killing the worker during deletion, phase %q", st.Deletion.Phase)
	c.w.kill()
	if err := blocker.Rollback(c.ctx); err != nil {
		t.Fatal(err)
	}

	c.w.restart()
	// The deletion was recorded before anything stopped: after the crash the
	// connector is either still being deleted or gone, never running again.
	if s, found, err := c.api.status(c.src); err != nil {
		t.Fatal(err)
	} else if found && s.Deletion == nil {
		t.Errorf("after the restart %s is back without a pending deletion: %+v", c.src, s)
	}
	c.api.awaitGone(c.src, 90*time.Second)
	if left := c.ownedObjects(c.src); len(left) > 0 {
		t.Errorf("after the deletion completed these owned objects remain: %v", left)
	}
	if c.schemaExists(c.auditSchema) {
		t.Errorf("audit schema %s survived", c.auditSchema)
	}
	if got := c.triggersOn("customers"); len(got) != 0 {
		t.Errorf("capture triggers left on customers: %v", got)
	}

	// The sink is untouched by its neighbour's deletion, then goes cleanly.
	c.api.awaitRunning(c.sink)
	if !c.queueExists(c.queue("customers")) {
		t.Errorf("the sink's queue vanished with the source's deletion")
	}
	// Right after a crash the sink's consumer group still waits out the dead
	// member's session, which can hold a stop past DELETE's own timeout; the
	// deletion then carries on in the background, as the API documents.
	c.api.deleteEventually(c.sink, 2*time.Minute)
	if c.queueExists(c.queue("customers")) || c.exchangeExists(c.exchange) {
		t.Errorf("the sink's queue or exchange survived its deletion")
	}
}

func sameResources(a, b []resource) bool {
	key := func(r resource) string { return r.Kind + "\x00" + r.Location + "\x00" + r.Name }
	ka, kb := make([]string, len(a)), make([]string, len(b))
	for i, r := range a {
		ka[i] = key(r)
	}
	for i, r := range b {
		kb[i] = key(r)
	}
	slices.Sort(ka)
	slices.Sort(kb)
	return slices.Equal(ka, kb)
}

func containsResource(rs []resource, kind, name string) bool {
	return slices.ContainsFunc(rs, func(r resource) bool { return r.Kind == kind && r.Name == name })
}
