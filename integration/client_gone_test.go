package integration

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// A client that stops waiting for POST /connectors does not cancel the
// connector's Start (decision 0025). Here pgaudit's Start, with an initial
// snapshot, waits for a lock a writer of a captured table holds; the
// client gives up meanwhile. Once the writer is done, the Start completes:
// the connector runs and the table's rows arrive as snapshot records.
// Before, the Start was cancelled with the request, its copy rolled back,
// and the connector left FAILED.
func TestStartOutlivesAClientThatGaveUp(t *testing.T) {
	c := newChain(t)
	c.loadDemoSchema()
	seeds := c.count("customers")
	if seeds == 0 {
		t.Fatal("the demo schema has no customers to snapshot")
	}
	writer, err := c.pg.Begin(c.ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = writer.Rollback(context.Background()) })
	if _, err := writer.Exec(c.ctx, `LOCK TABLE `+c.table("customers")+` IN ROW EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	src := c.srcConfig()
	src["snapshot.mode"] = "initial"
	clientCtx, clientGone := context.WithTimeout(c.ctx, 2*time.Second)
	status, body, err := c.api.do(clientCtx, http.MethodPost, "/connectors", map[string]any{"name": c.src, "config": src})
	clientGone()
	if err == nil {
		t.Fatalf("POST answered %d %s while the Start waited for the writer's lock", status, body)
	}
	if err := writer.Rollback(c.ctx); err != nil {
		t.Fatal(err)
	}
	c.api.awaitRunning(c.src)

	c.api.create(c.sink, c.sinkConfig())
	c.api.awaitRunning(c.sink)
	q := c.queue("customers")
	if !eventually(60*time.Second, func() bool { return c.queueExists(q) }) {
		t.Fatalf("queue %s was not declared within 60s", q)
	}
	col := c.collect(q)
	snapshotted := func() int {
		msgs, _ := col.snapshot()
		n := 0
		for _, m := range msgs {
			if m.Op == "r" {
				n++
			}
		}
		return n
	}
	if !eventually(60*time.Second, func() bool { return snapshotted() >= seeds }) {
		t.Fatalf("%d snapshot records of customers arrived, want %d", snapshotted(), seeds)
	}
	if got := snapshotted(); got != seeds {
		t.Errorf("%d snapshot records of customers, want %d", got, seeds)
	}
}
