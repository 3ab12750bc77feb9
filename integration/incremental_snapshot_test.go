package integration

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"
)

// TestChainIncrementalSnapshot: pgaudit with snapshot.mode=incremental
// through the worker and Kafka into amqpsink: the customers the table held
// before the connector existed arrive as 'r' messages, copied by the task
// after the Start, and a change made meanwhile arrives too; deleting the
// connector drops its progress table with the rest.
func TestChainIncrementalSnapshot(t *testing.T) {
	c := newChain(t)
	var seeded []string
	rows, err := c.pg.Query(c.ctx, "SELECT name FROM "+c.table("customers"))
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		seeded = append(seeded, n)
	}
	if rows.Err() != nil || len(seeded) == 0 {
		t.Fatalf("seeded customers: %v, %v", seeded, rows.Err())
	}
	sort.Strings(seeded)
	c.deploy("snapshot.mode", "incremental")
	customers := c.collect(c.queue("customers"))
	c.exec("INSERT INTO "+c.table("customers")+" (name, email) VALUES ('incr', $1)", "incr-"+c.id+"@example.com")

	ok := eventually(60*time.Second, func() bool {
		msgs, _ := customers.snapshot()
		return len(msgs) >= len(seeded)+1
	})
	msgs, bad := customers.snapshot()
	if !ok || len(bad) > 0 {
		t.Fatalf("after 60s: %d messages (%d other: %q), want the %d seeded customers and the insert", len(msgs), len(bad), bad, len(seeded))
	}
	var reads []string
	inserted := false
	for _, m := range msgs {
		switch {
		case m.Op == "r":
			reads = append(reads, m.name())
		case m.kind() == "insert" && m.name() == "incr":
			inserted = true
		default:
			t.Errorf("unexpected message %s %s", m.Op, m.name())
		}
	}
	sort.Strings(reads)
	if fmt.Sprint(reads) != fmt.Sprint(seeded) || !inserted {
		t.Fatalf("snapshot reads %v (want %v), insert seen %v", reads, seeded, inserted)
	}
	owned := fmt.Sprint(c.ownedObjects(c.src))
	if !strings.Contains(owned, "_snapshot") {
		t.Errorf("the progress table is not among the connector's objects: %s", owned)
	}
	c.api.delete(c.src)
	for _, obj := range c.ownedObjects(c.src) {
		t.Errorf("still owned after deletion: %s (owned before: %s)", obj, owned)
	}
}
