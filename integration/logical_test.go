package integration

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestChainLogicalDecoding: pgaudit under capture.method=logical through
// the binary's REST API, Kafka and amqpsink. A configuration with a key of
// the trigger method answers 400 naming it; the connector owns exactly its
// publication and replication slot (GET .../resources), creates no audit
// objects, delivers a change into RabbitMQ, and its DELETE drops both.
func TestChainLogicalDecoding(t *testing.T) {
	c := newChain(t)
	var level string
	if err := c.pg.QueryRow(c.ctx, `SHOW wal_level`).Scan(&level); err != nil {
		t.Fatal(err)
	}
	if level != "logical" {
		t.Fatalf("the server runs with wal_level=%s: capture.method=logical needs wal_level=logical (.ci/run sets it)", level)
	}
	src := c.srcConfig()
	src["capture.method"] = "logical"
	code, body, err := c.api.do(c.ctx, http.MethodPost, "/connectors", map[string]any{"name": c.src, "config": src})
	if err != nil || code != http.StatusBadRequest || !strings.Contains(string(body), "audit.schema") || !strings.Contains(string(body), "capture.method") {
		t.Fatalf("POST with audit.schema under capture.method=logical = %d %s, %v; want 400 naming both keys", code, body, err)
	}
	delete(src, "audit.schema")
	c.api.create(c.src, src)
	c.api.create(c.sink, c.sinkConfig())
	c.api.awaitRunning(c.src)
	c.api.awaitRunning(c.sink)
	t.Cleanup(func() {
		// A failed test must not leave a slot keeping WAL.
		_, _ = c.pg.Exec(c.ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE 'tidyconnect_it_src_`+strings.ReplaceAll(c.id, "-", "_")+`%' AND NOT active`)
	})
	customers := c.collect(c.queue("customers"))

	var kinds []string
	var slot string
	for _, r := range c.api.resources(c.src) {
		kinds = append(kinds, r.Kind)
		if r.Kind == "postgres.replication_slot" {
			slot = r.Name
		}
	}
	slices.Sort(kinds)
	if fmt.Sprint(kinds) != "[postgres.publication postgres.replication_slot]" {
		t.Fatalf("resources of %s: %v, want its publication and slot", c.src, kinds)
	}
	if c.schemaExists(c.auditSchema) || len(c.triggersOn("customers")) > 0 {
		t.Fatalf("audit schema %v, triggers %v: logical decoding creates neither", c.schemaExists(c.auditSchema), c.triggersOn("customers"))
	}

	var id int64
	if err := c.pg.QueryRow(c.ctx, "INSERT INTO "+c.table("customers")+" (name, email) VALUES ('logical', $1) RETURNING id", "logical-"+c.id+"@example.com").Scan(&id); err != nil {
		t.Fatal(err)
	}
	if !eventually(60*time.Second, func() bool {
		msgs, _ := customers.snapshot()
		return slices.ContainsFunc(msgs, func(m change) bool { return m.id() == fmt.Sprint(id) && m.kind() == "insert" })
	}) {
		msgs, bad := customers.snapshot()
		t.Fatalf("row %d's insert did not reach the queue within 60s: %d messages, others %q", id, len(msgs), bad)
	}

	c.api.deleteEventually(c.src, 60*time.Second)
	var slots, pubs int
	if err := c.pg.QueryRow(c.ctx, `SELECT (SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1),
       (SELECT count(*) FROM pg_publication WHERE pubname = $1)`, slot).Scan(&slots, &pubs); err != nil {
		t.Fatal(err)
	}
	if slots != 0 || pubs != 0 {
		t.Fatalf("after DELETE: %d slot(s) and %d publication(s) named %s left", slots, pubs, slot)
	}
	if n := c.count("customers"); n == 0 {
		t.Fatal("the captured table lost its rows")
	}
}
